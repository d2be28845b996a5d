"""The command line: the documented commands work, and bad input gives one line and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from tests.conftest import REPO, TOPOLOGIES

DATA = REPO / "tests" / "data"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_compile_verify_simulate_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dgx1.json"
    code, text, err = run(capsys, "compile", str(TOPOLOGIES / "dgx1-v100.yaml"), "--algorithm", "ring",
                          "--size", "64MiB", "-o", str(out))
    assert code == 0, err
    assert "predicted time" in text and out.exists()
    code, text, err = run(capsys, "verify", str(out))
    assert code == 0 and "verified" in text, err
    code, text, err = run(capsys, "simulate", str(out), "--size", "1GiB", "--json")
    assert code == 0, err
    doc = json.loads(text)
    for key in ("predicted_time_s", "lower_bound_s", "algbw_GBps", "busbw_GBps"):
        assert isinstance(doc[key], float) and doc[key] > 0
    assert doc["size_bytes"] == 1 << 30
    assert doc["predicted_time_s"] >= doc["lower_bound_s"]


@pytest.mark.parametrize("size, expected", [("64MiB", 64 << 20), ("1GB", 10**9), ("4096", 4096)])
def test_sizes(size: str, expected: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, text, err = run(capsys, "compile", "dgx2", "-a", "ring", "-s", size, "--json")
    assert code == 0, err
    assert json.loads(text)["size_bytes"] == expected


def test_auto_lists_candidates_and_wins(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, err = run(capsys, "compile", "dgx1-v100", "--json")
    assert code == 0, err
    doc = json.loads(text)
    times = [c["predicted_time_s"] for c in doc["candidates"] if c["predicted_time_s"] is not None]
    assert doc["predicted_time_s"] == pytest.approx(min(times))


def test_topo_show_and_algorithms(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, err = run(capsys, "topo", "show", "ndv2-2chassis", "--json")
    assert code == 0, err
    doc = json.loads(text)
    assert doc["ranks"] == 16 and doc["routing"] == "ecmp"
    assert doc["cut_bound"]["allgather"]["max_algbw_GBps"] == pytest.approx(25.0, rel=1e-3)
    code, text, err = run(capsys, "algorithms", "--json")
    names = {row["name"] for row in json.loads(text)}
    assert {"ring", "tree", "halving-doubling", "direct", "hierarchical"} <= names


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["compile", "dgx1-v100", "-a", "nosuch"], "unknown algorithm"),
        (["compile", "dgx1-v100", "-s", "lots"], "not a size"),
        (["compile", "dgx1-v100", "-s", "0"], "positive"),
        (["compile", "no/such/file.yaml"], "no such file"),
        (["compile", "not-a-shipped-name"], "no topology file or shipped topology"),
        (["compile", "dgx1-v100", "-c", "alltoall", "-a", "ring"], "does not implement alltoall"),
        (["verify", "no/such/schedule.json"], "cannot read"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_arguments_one_line(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code != 0
    assert err.count("\n") == 1 and err.startswith("topocc: error:"), err
    assert fragment in err


def _corpus(folder: str) -> list[tuple[Path, dict]]:
    manifest = DATA / folder / "expected.yaml"
    if not manifest.exists():
        return []
    expected = yaml.safe_load(manifest.read_text())
    return [(DATA / folder / name, spec if isinstance(spec, dict) else {"contains": spec})
            for name, spec in sorted(expected.items())]


@pytest.mark.parametrize("path, spec", _corpus("bad_topologies"), ids=lambda v: getattr(v, "name", ""))
def test_malformed_topologies_cli(path: Path, spec: dict, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "topo", "show", str(path))
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert path.name in err and spec["contains"] in err


@pytest.mark.parametrize("path, spec", _corpus("bad_schedules"), ids=lambda v: getattr(v, "name", ""))
def test_malformed_schedules_cli(path: Path, spec: dict, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "verify", str(path))
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert spec["contains"] in err


def test_corpus_is_large_enough() -> None:
    assert len(_corpus("bad_topologies")) + len(_corpus("bad_schedules")) >= 30


def test_console_script_installed() -> None:
    result = subprocess.run([sys.executable, "-m", "planner.cli", "compile", "mesh-4x4", "-a", "nosuch"],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.startswith("topocc: error: unknown algorithm") and "Traceback" not in result.stderr


def test_compile_reports_progress_per_candidate() -> None:
    """Every candidate is announced and settled once; the winner is verified last."""
    from planner.algorithms import ALGORITHMS, Options
    from planner.compile import Progress, compile_schedule, resolve_topology

    events: list[Progress] = []
    compiled = compile_schedule(resolve_topology("emu-uniform"), "allreduce", "auto", Options(size_bytes=1 << 20),
                                progress=events.append)
    names = [a.name for a in ALGORITHMS.values() if "allreduce" in a.collectives]
    done = [e for e in events if e.phase == "done"]
    assert sorted(e.algorithm for e in done) == sorted(names)
    assert all(e.candidate is not None and e.total == len(names) for e in done)
    assert events[-1].phase == "verify" and events[-1].algorithm == compiled.schedule.metadata.algorithm
    assert [e.elapsed_s for e in events] == sorted(e.elapsed_s for e in events)
    assert all(e.describe().startswith(f"[{e.index}/{e.total}] {e.algorithm}") for e in events)
    skipped = [c for c in compiled.candidates if c.reason and c.reason.startswith("cannot win")]
    assert all(c.time_s is None for c in skipped)


def test_compile_progress_goes_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, err = run(capsys, "compile", "emu-uniform", "--size", "1MiB", "--json", "--progress")
    assert code == 0, err
    json.loads(text)  # stdout stays one JSON document
    assert "hierarchical:" in err and "verify the winner" in err
    code, text, err = run(capsys, "compile", "emu-uniform", "--size", "1MiB", "--json")
    assert code == 0 and err == ""  # not a terminal: no progress unless asked
