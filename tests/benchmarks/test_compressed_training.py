"""benchmarks/compressed_training.py without emulation: arguments, batches, time to target, table, targets, plot."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import compressed_training as T


def run(name: str, step_s: float, losses: list[float], *, equal: bool = True) -> dict[str, Any]:
    """A run's row as rank 0 reports it: an evaluation every 5 steps, ``step_s`` seconds per step."""
    encoding, feedback = T.RUNS[name]
    evals = [[5 * i, 5 * i * step_s, loss] for i, loss in enumerate(losses)]
    return {"run": name, "policy": f"{encoding}@inter-host" if encoding else "-", "feedback": feedback,
            "steps": 5 * (len(losses) - 1), "step_s": step_s, "evals": evals, "planned": 40,
            "encoded": 40 if encoding else 0, "native": 0, "equal": equal}


def report(**runs: dict[str, Any]) -> dict[str, Any]:
    base = {"exact": run("exact", 1.0, [2.3, 1.0, 0.5, 0.2, 0.1]),
            "bf16": run("bf16", 0.5, [2.3, 1.0, 0.5, 0.2, 0.1005]),
            "int8+ef": run("int8+ef", 0.25, [2.3, 1.0, 0.5, 0.2, 0.1]),
            "topk+ef": run("topk+ef", 0.2, [2.3, 1.5, 0.6, 0.1, 0.099]),
            "topk": run("topk", 0.2, [2.3, 1.9, 1.5, 1.2, 1.0])}
    return {"topology": "emu-racks", "ranks": 12, "scale": 2.5e-4, "batch": 16, "lr": 0.05, "margin": 0.01,
            "compute_s": 0.2, "params": T.PARAMS, "runs": list({**base, **runs}.values())}


def test_arguments() -> None:
    args = T.parse_args([])
    assert args.runs == ["exact", "bf16", "int8+ef", "topk+ef", "topk"] and args.topology == "emu-racks"
    assert args.compressed_steps == args.steps == 100
    assert T.parse_args(["--runs", "topk,exact,topk"]).runs == ["exact", "topk"]
    assert T.parse_args(["--compressed-steps", "150"]).compressed_steps == 150
    for bad in (["--runs", "bf16"], ["--runs", "exact,zip"], ["--steps", "0"], ["--scale", "-1"]):
        with pytest.raises(SystemExit):
            T.parse_args(bad)
    assert T.policy(None, args) is None and T.policy("topk", args) == "topk:1%@inter-host"
    assert T.policy("int8", T.parse_args(["--where", "inter-rack"])) == "int8@inter-rack"


def test_batches_are_a_fixed_shuffle_of_each_ranks_shard() -> None:
    draws = [T.batches(rank, 3, 16, seed=0) for rank in range(3)]
    epoch = [[next(d) for _ in range(500 // 16)] for d in draws]  # one epoch each: 500 images, 31 batches
    for rank, got in enumerate(epoch):
        seen = np.concatenate(got)
        assert len(set(seen.tolist())) == len(seen) == 31 * 16 and all(seen % 3 == rank)
    again = T.batches(0, 3, 16, seed=0)
    assert all((next(again) == b).all() for b in epoch[0])
    assert not (next(T.batches(0, 3, 16, seed=1)) == epoch[0][0]).all()


def test_time_to_target_is_the_first_evaluation_at_or_below_it() -> None:
    evals = [[0, 0.0, 2.0], [5, 1.5, 0.5], [10, 3.0, 0.3], [15, 4.5, 0.4]]
    assert T.time_to_target(evals, 0.5) == 1.5 and T.time_to_target(evals, 0.35) == 3.0
    assert T.time_to_target(evals, 0.2) is None
    assert T.target_loss({"evals": evals}, 0.01) == pytest.approx(0.404)


def test_table_and_targets() -> None:
    rows = {r["run"]: r for r in T.summarize(report())}
    assert rows["exact"]["target"] == pytest.approx(0.101) and rows["exact"]["time_to_target"] == 20.0
    assert rows["bf16"]["speedup"] == pytest.approx(2.0) and rows["topk+ef"]["speedup"] == pytest.approx(20 / 3)
    assert rows["topk"]["time_to_target"] is None and rows["topk+ef"]["ratio"] == pytest.approx(0.99)
    text = T.format_report(report())
    assert "communication is 80% of the exact run's step" in text and "= 0.1010" in text
    topk = next(line for line in text.splitlines() if line.startswith("topk "))
    assert "never" in topk and "10.000" in topk and "40 of 40" in topk
    lines = T.targets(report())
    assert all(line.startswith("met ") for line in lines[:-1]) and len(lines) == 8
    assert lines[-1].startswith("info top-k without error feedback: final loss 1.0000 (10.10x")


def test_targets_miss() -> None:
    exact = run("exact", 0.21, [2.3, 1.0, 0.5, 0.2, 0.1])  # at the target after 4.2 s; compute is 95% of a step
    slow = run("topk+ef", 0.6, [2.3, 1.5, 0.6, 0.1, 0.099])  # after 9 s
    late = run("int8+ef", 0.25, [2.3, 1.0, 0.5, 0.3, 0.103], equal=False)  # never
    lines = T.targets(report(exact=exact, **{"topk+ef": slow, "int8+ef": late}))
    assert lines[0].startswith("MISS communication is 5%") and lines[1].startswith("MISS bf16 reaches the target")
    assert lines[3].startswith("MISS int8+ef reaches the target: never (")
    assert lines[4].startswith("MISS int8+ef final loss / exact 1.030")
    assert lines[5].startswith("MISS topk+ef reaches the target: 0.47x sooner than exact (target: >= 2.00x")
    assert lines[6].startswith("met  topk+ef final loss / exact 0.990")
    assert lines[-1] == "MISS int8+ef: the ranks' parameters differ at the end"


def test_missing_extras_say_how_to_install(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    missing = ("sklearn", "matplotlib")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    assert T.main(["--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert err == "compressed_training: needs scikit-learn and matplotlib: pip install -e '.[bench]'\n"


def test_digits_and_model() -> None:
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e '.[bench]')")
    pytest.importorskip("torch", reason="torch is not installed")
    x, y, vx, vy = T.digits(0)
    assert x.shape == (1500, 64) and vx.shape == (297, 64) and set(y.tolist()) == set(range(10))
    assert abs(float(x.mean())) < 1e-5 and int(vy.numel()) == 297
    assert T.PARAMS == sum(p.numel() for p in T.mlp(0).parameters()) > 1_000_000


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[bench]')")
    T.plot(report(), tmp_path / "plots" / "loss.png")
    assert (tmp_path / "plots" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
