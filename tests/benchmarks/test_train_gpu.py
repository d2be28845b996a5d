"""benchmarks/train_gpu.py without a GPU: its arguments, its table and plot, and a whole run over gloo on CPU.

The run trains the benchmark's transformer with plain DDP, DDP with topocc's hook, Prophet's blocks (profile and
block plan from the run itself) and DASO (communicators over all ranks and per node), the same code the GPU run
uses with NCCL; here the hook and Prophet must follow DDP's losses exactly and DASO must stop at DDP's eval loss.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import xml.dom.minidom
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

_spec = importlib.util.spec_from_file_location("train_gpu", REPO / "benchmarks" / "train_gpu.py")
assert _spec is not None and _spec.loader is not None
T = importlib.util.module_from_spec(_spec)
sys.modules["train_gpu"] = T
_spec.loader.exec_module(T)

TINY = ["--width", "32", "--layers", "1", "--vocab", "64", "--batch", "4", "--seq", "16"]


def test_arguments() -> None:
    args = T.parse_args([])
    assert args.configs == ["ddp", "hook", "prophet", "daso"] and args.topologies == ["emu-racks", "emu-uniform"]
    for bad in (["--steps", "4", "--warmup", "3"], ["--width", "30"], ["--configs", "zero"]):
        with pytest.raises(SystemExit):
            T.parse_args(bad)


def report(name: str = "emu-racks") -> dict:
    run = {"iter_s": 0.5, "losses": [3.0, 2.0], "times": [0.5, 1.0], "evals": [(0.5, 2.5), (1.0, 1.9)],
           "eval_loss": 1.9}
    slow = {**run, "iter_s": 1.0, "times": [1.0, 2.0], "evals": [(1.0, 2.5), (2.0, 1.9)]}
    prophet = {**run, "iter_s": 0.8, "evals": []}
    return {"topology": name, "ranks": 12, "node": 2, "params": 1_000_000, "compute_s": 0.1,
            "native_s": 0.9, "replay_s": 0.45,
            "runs": {"ddp": slow, "hook": run, "prophet": prophet}, "predicted": {"hook": 0.55, "prophet": 0.45},
            "block_plan": {"blocks": 3, "strategy": "prophet", "cost": [[262144, 0.01]]}}


def test_table_and_plot() -> None:
    text = T.format_report(report(), T.parse_args(["--steps", "2", "--warmup", "0"]))
    lines = text.splitlines()
    assert "compute 100.0 ms, all gradients in one all-reduce 900.0 ms (NCCL), 450.0 ms (topocc)" in lines[0]
    ddp, hook, prophet = lines[2], lines[3], lines[4]
    assert "1000.0" in ddp and "1.00" in ddp and "90%" in ddp and "2.00s" in ddp
    assert "500.0" in hook and "2.00" in hook and "550.0" in hook and "80%" in hook and "1.00s" in hook
    assert "450.0" in prophet and prophet.rstrip().endswith("1.00s")  # evaluated at its end only
    assert lines[5].startswith("# block plan: 3 blocks (prophet)") and "256 KiB 10.0 ms" in lines[5]
    svg = T.svg_plot([report(), report("emu-uniform")])
    dom = xml.dom.minidom.parseString(svg)
    assert len(dom.getElementsByTagName("polyline")) == 4 and len(dom.getElementsByTagName("circle")) == 6
    assert "emu-uniform (12 ranks)" in svg and "prophet: 800 ms/iter" in svg


def test_a_run_over_gloo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "train.json"
    status = T.main(["--backend", "gloo", "--ranks", "4", "--steps", "6", "--warmup", "2", *TINY,
                     "--plot", str(tmp_path / "loss.svg"), "--json", str(out)])
    assert status == 0, capsys.readouterr().out
    (rep,) = json.loads(out.read_text())
    runs = rep["runs"]
    assert list(runs) == ["ddp", "hook", "prophet", "daso"] and rep["node"] == 2 and rep["ranks"] == 4
    for name in ("hook", "prophet"):  # the same averages as DDP's, so the same losses
        assert runs[name]["losses"] == pytest.approx(runs["ddp"]["losses"], rel=1e-4)
        assert runs[name]["eval_loss"] == pytest.approx(runs["ddp"]["eval_loss"], rel=1e-4)
    assert rep["native_s"] > 0 and rep["replay_s"] > 0
    assert rep["predicted"]["hook"] > 0 and rep["predicted"]["prophet"] > 0 and rep["block_plan"]["blocks"] >= 1
    daso = runs["daso"]
    assert len(daso["losses"]) == rep["daso_steps"] <= 6 * 4 and rep["daso_syncs"][:2] == [1, 2]
    reached = daso["evals"][-1][1] <= runs["ddp"]["eval_loss"] * 1.001
    assert reached or rep["daso_steps"] == 24  # it stops once its evaluation reaches DDP's final one
    assert "ms/iter" in (tmp_path / "loss.svg").read_text()
    assert "hook" in capsys.readouterr().out


def test_a_run_past_its_time_limit_says_how_far_it_got(capsys: pytest.CaptureFixture[str]) -> None:
    # the limit is twice what a 4-step run takes on this machine now (start-up included), 20 s at least: the
    # ranks start and print progress within it however loaded the machine, and 20000 steps outlast it
    start = time.monotonic()
    assert T.main(["--backend", "gloo", "--ranks", "2", "--steps", "4", "--warmup", "2", *TINY,
                   "--configs", "ddp"]) == 0
    limit = max(20.0, 2 * (time.monotonic() - start))
    capsys.readouterr()
    status = T.main(["--backend", "gloo", "--ranks", "2", "--steps", "20000", "--warmup", "2", *TINY,
                     "--configs", "ddp", "--time-limit", f"{limit:.0f}"])
    out = capsys.readouterr().out
    assert status == 1 and "# plain: FAILED: rank 0 exit -9: train_gpu: " in out, out
    assert "topocc: killed after" in out
