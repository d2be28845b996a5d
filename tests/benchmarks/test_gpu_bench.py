"""benchmarks/gpu_bench.py without a GPU: its arguments, its tables, and a whole run on CPU tensors over gloo.

The run is the GPU benchmark with the transport swapped (``--backend gloo``): the same proof of the schedule
and its lowering, launch through a FileStore, per-rank timing, rank 0's report and the table; as root, also
inside an emulated cluster (a namespace per host, shaped links), as the GPU run does.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from topocc.planner.testbed.emulation import emulation_available

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

_spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "benchmarks" / "gpu_bench.py")
assert _spec is not None and _spec.loader is not None
B = importlib.util.module_from_spec(_spec)
sys.modules["gpu_bench"] = B  # its dataclasses look their module up there
_spec.loader.exec_module(B)


def test_arguments() -> None:
    args = B.parse_args([])
    assert args.configs == ["plain", "emu-uniform", "emu-racks"] and args.sizes == [1, 16, 64, 256]
    assert args.backend == "nccl" and args.scale == B.DEFAULT_SCALE
    for bad in (["--ranks", "1"], ["--sizes", "0"], ["--scale", "0"], ["--configs", "dgx1"]):
        with pytest.raises(SystemExit):
            B.parse_args(bad)


def test_table() -> None:
    rows = [B.Row("plain", 1 << 20, "ring", 6, 0.012, 0.010, None, 2.4e-7, 5),
            B.Row("emu-racks", 256 << 20, "hierarchical", 71, 6.0, 9.0, 5.8, 1e-6, 1)]
    text = B.format_table(rows, "title")
    lines = text.splitlines()
    assert lines[0] == "# title" and "native(ms)" in lines[1] and "predicted(ms)" in lines[1]
    assert "1 MiB" in lines[2] and "12.0" in lines[2] and "1.20" in lines[2] and "n/a" in lines[2]
    assert "256 MiB" in lines[3] and "0.67" in lines[3] and "5800.0" in lines[3] and "1.03x" in lines[3]
    assert B.format_probe([{"bytes": 65536, "cupy_us": 40.0, "torch_us": None}]).endswith("n/a")


def run(tmp_path: Path, config: str, ranks: int) -> list[dict]:
    out = tmp_path / "rows.json"
    status = B.main(["--backend", "gloo", "--configs", config, "--ranks", str(ranks), "--sizes", "1",
                     "--budget", "0.2", "--max-iters", "2", "--json", str(out)])
    assert status == 0
    return json.loads(out.read_text())


def test_a_plain_run_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = run(tmp_path, "plain", 3)
    assert len(rows) == 1
    row = rows[0]
    assert row["size"] == 1 << 20 and row["algorithm"] == "ring" and row["groups"] >= 4
    assert row["time_s"] > 0 and row["native_s"] > 0 and row["predicted_s"] is None
    assert row["max_error"] < 1e-5 and 1 <= row["iters"] <= 2
    assert "3 ranks on one GPU over loopback sockets" in capsys.readouterr().out


@pytest.mark.root
@pytest.mark.skipif(emulation_available() is not None, reason=str(emulation_available()))
def test_an_emulated_run_on_cpu(tmp_path: Path) -> None:
    rows = run(tmp_path, "emu-uniform", 2)
    assert rows[0]["algorithm"] == "hierarchical" and rows[0]["predicted_s"] > 0 and rows[0]["max_error"] < 1e-5


def test_profile_splits_a_call_into_its_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """--profile's arithmetic on stand-in events: time in groups, between them, and the slowest named."""
    import torch

    class Event:
        def __init__(self, t: float) -> None:
            self.t = t

        def elapsed_time(self, other: Event) -> float:
            return other.t - self.t

    class Message:
        def __init__(self, peer: int, nbytes: int) -> None:
            self.peer, self.nbytes = peer, nbytes

    class Transport:
        group_events: list | None = None

        def barrier(self, timeout: float) -> bool:
            return True

        def max_float(self, value: float) -> float:
            return value

    transport = Transport()

    class Comm:
        def allreduce(self, buf: object) -> None:  # three groups: 1 ms, 5 ms, 2 ms, with 0.5 ms between
            at = 0.0
            for ms, peer in ((1.0, 1), (5.0, 2), (2.0, 1)):
                assert transport.group_events is not None
                transport.group_events.append((Event(at), Event(at + ms), (Message(peer, 1 << 20),)))
                at += ms + 0.5

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    p = B._profile(Comm(), transport, None)
    assert transport.group_events is None  # profiling is off again
    assert p["groups"] == 3 and p["in_groups_ms"] == pytest.approx(8.0) and p["between_ms"] == pytest.approx(1.0)
    assert p["gpu_ms"] == pytest.approx(9.0) and p["slowest"][0] == (1, 5.0, [2], 1 << 20)
    row = B.Row("emu-racks", 1 << 20, "hierarchical", 3, 0.01, 0.02, None, 0.0, 1, p)
    line = B.format_table([row], "t").splitlines()[-1]
    assert line.startswith("#   profile 1 MiB") and "3 groups 8.0 ms" in line
    assert "#1 5.0 ms (peers [2], 1024 KiB)" in line
