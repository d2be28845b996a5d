"""The command line: the documented commands work, and bad input gives one line and a non-zero exit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, TOPOLOGIES
from tests.runtime.training.launch import TOPOLOGY
from topocc.planner.cli import main
from topocc.planner.testbed.emulation import emulation_available
from topocc.runtime.bundle import load_bundle
from topocc.runtime.calls import Call, CallLog

DATA = REPO / "tests" / "data"
DGX1_SCHEDULE = str(REPO / "schedules" / "dgx1-v100-allreduce.json")


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
    assert doc["bounds"]["allgather"]["max_algbw_GBps"] == pytest.approx(25.0, rel=1e-3)
    code, text, err = run(capsys, "algorithms", "--json")
    names = {row["algorithm"] for row in json.loads(text)}
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
        (["run", DGX1_SCHEDULE, "--dtype", "nosuch"], "'nosuch' is not one of 'float32'"),
        (["run", DGX1_SCHEDULE, "--size", "2"], "2 bytes holds no float32 element"),
        (["bench", DGX1_SCHEDULE, "--sizes", "1:1K"], "1 bytes holds no float32 element"),
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
    result = subprocess.run([sys.executable, "-m", "topocc.planner.cli", "compile", "mesh-4x4", "-a", "nosuch"],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.startswith("topocc: error: unknown algorithm") and "Traceback" not in result.stderr


def test_compile_reports_progress_per_candidate() -> None:
    """Every candidate is announced and settled once; the winner is verified last."""
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.compiler.options import Options
    from topocc.planner.compiler.race import Progress
    from topocc.planner.topology.catalogue import resolve_topology

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


@pytest.mark.parametrize("command", ["simulate", "inspect"])
def test_another_topology_is_refused_unless_what_if(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An 8-rank DGX-1 schedule is not silently timed on another 8-rank cluster."""
    code, out, err = run(capsys, command, DGX1_SCHEDULE, "--topology", "emu-uniform", "--size", "1MiB")
    assert code == 4 and out == ""
    assert err.count("\n") == 1 and err.startswith("topocc: error: ")
    assert "compiled for dgx1-v100, not emu-uniform" in err and "pass --what-if" in err
    code, out, err = run(capsys, command, DGX1_SCHEDULE, "--topology", "emu-uniform", "--size", "1MiB", "--what-if")
    assert code == 0, err
    assert out.splitlines()[0] == "what-if: a schedule compiled for dgx1-v100, timed on emu-uniform (--what-if)"


def test_what_if_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", DGX1_SCHEDULE, "-t", "emu-uniform", "-s", "1MiB", "--what-if", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["what_if"] is True and doc["compiled_for"] == "dgx1-v100" and doc["topology"] == "emu-uniform"
    code, out, err = run(capsys, "simulate", DGX1_SCHEDULE, "-t", "dgx1-v100", "-s", "1MiB", "--what-if", "--json")
    assert code == 0, err
    assert json.loads(out)["what_if"] is False  # its own topology: not a what-if, whatever the flag says
    code, out, err = run(capsys, "simulate", DGX1_SCHEDULE, "-s", "1MiB")
    assert code == 0 and "what-if" not in out


def test_an_explicit_topology_that_does_not_exist_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", DGX1_SCHEDULE, "--topology", "nosuch")
    assert code == 2 and out == ""
    assert err.startswith("topocc: error: no topology file or shipped topology named 'nosuch' (fix: pass a YAML "
                          "path or one of: ") and "dgx1-v100" in err and "compiled for" not in err


def _broken(path: Path, tmp_path: Path, how: str) -> Path:
    """The schedule with every reduction a plain receive (``wrong``), or rank 0's sends on a channel nobody reads."""
    from dataclasses import replace

    from topocc.runtime.schedule import Op, Recv, load_schedule, save_schedule

    good = load_schedule(path)
    if how == "wrong":
        programs: tuple[tuple[Op, ...], ...] = tuple(
            tuple(Recv(op.peer, op.dst, deps=op.deps, step=op.step, channel=op.channel)
                  if op.kind == "recv_reduce" else op for op in p) for p in good.programs)
    else:
        programs = (tuple(replace(op, channel=7) if op.kind == "send" else op for op in good.programs[0]),
                    *good.programs[1:])
    out = tmp_path / f"{how}.json"
    save_schedule(replace(good, programs=programs), out)
    return out


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("np_", ["4", "16"])
def test_a_wrong_rank_count_is_refused_before_launching(command: str, np_: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, command, DGX1_SCHEDULE, "--np", np_)
    assert code == 2 and out == ""
    assert err == (f"topocc: error: {DGX1_SCHEDULE}: the schedule is for 8 ranks, not --np {np_} "
                   "(fix: pass --np 8, or leave --np out to use the schedule's)\n")


def test_bench_refuses_another_topology_before_launching(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "bench", DGX1_SCHEDULE, "--topology", "emu-uniform")
    assert code == 4 and out == "" and err.count("\n") == 1 and "pass --what-if" in err


@pytest.mark.mpi
def test_run_passes_with_time_and_bandwidth(two_rank_schedule: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "run", str(two_rank_schedule), "--size", "4K", "--iters", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "allreduce of 4KiB (1024 x float32, sum) with ring on 2 ranks: PASS"
    assert re.fullmatch(r"  wrong elements: 0 \(beyond float32's rounding tolerance; max error [-+.e\d]+\)", lines[1])
    assert re.fullmatch(r"  time: +[\d.]+ (ns|us|ms|s) \(slowest rank's mean of 2 calls after 1 warm-up\)",
                        lines[2])
    assert re.fullmatch(r"  algbw / busbw: +[\d.]+ [KMGT]?B/s / [\d.]+ [KMGT]?B/s", lines[3])
    code, out, err = run(capsys, "run", str(two_rank_schedule), "--size", "4K", "--iters", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["result"] == "PASS" and doc["wrong"] == 0 and doc["size_bytes"] == 4096
    assert doc["busbw_GBps"] == pytest.approx(doc["algbw_GBps"])  # 2 ranks: busbw factor 2(n-1)/n = 1


@pytest.mark.mpi
def test_run_says_what_it_does_and_when_it_rounds_the_size(two_rank_schedule: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--progress names each step on stderr as it happens; a size of no whole elements is rounded, visibly."""
    code, out, err = run(capsys, "run", str(two_rank_schedule), "--size", "4098", "--iters", "1", "--progress")
    assert code == 0, err
    assert out.splitlines()[1] == "  size:           4096 bytes, the 4098 asked rounded down to whole float32 elements"
    steps = err.splitlines()
    assert steps[0] == ("launching 2 ranks for 1 warm-up and 1 timed calls of 4096 bytes "
                        "(asked 4098: rounded down to whole elements)")
    assert re.fullmatch(r"\[ *[\d.]+ s\] 2 ranks up, schedule loaded and agreed", steps[1])
    assert re.fullmatch(r"\[ *[\d.]+ s\] 1024 x float32 sum: inputs and expected result ready in [\d.]+ s", steps[2])
    assert [re.sub(r"took [\d.]+ s", "took T s", line.split("] ")[1]) for line in steps[3:]] == [
        "call 1/2 (warm-up) took T s on rank 0", "call 2/2 (timed) took T s on rank 0"]
    code, out, err = run(capsys, "run", str(two_rank_schedule), "--size", "4098", "--iters", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and err == "" and (doc["size_bytes"], doc["requested_size_bytes"]) == (4096, 4098)


@pytest.mark.mpi
def test_run_fails_on_a_wrong_result(two_rank_schedule: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    wrong = _broken(two_rank_schedule, tmp_path, "wrong")
    code, out, err = run(capsys, "run", str(wrong), "--size", "4KiB", "--iters", "1")
    assert code == 7
    assert out.splitlines()[0].endswith(": FAIL")
    assert err.count("\n") == 1 and err.startswith(f"topocc: error: {wrong}: FAIL: ")
    assert "elements differ from numpy's result by more than the dtype's tolerance at 4KiB" in err
    assert f"(fix: prove the schedule with topocc verify {wrong};" in err


@pytest.mark.mpi
def test_failing_ranks_are_one_line(two_rank_schedule: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    stuck = _broken(two_rank_schedule, tmp_path, "stuck")
    code, out, err = run(capsys, "run", str(stuck), "--size", "4KiB", "--timeout", "5")
    assert code == 5 and out == ""
    assert err.count("\n") == 1 and err.count("topocc:") == 1, err
    assert err.startswith(f"topocc: error: {stuck}: replay failed: 2 ranks, exit ")
    assert ": ranks 0 and 1: " in err and "(fix: " in err


@pytest.mark.mpi
def test_bench_table_and_json_share_names(two_rank_schedule: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from topocc.planner.report.runs import BENCH_COLUMNS

    argv = ["bench", str(two_rank_schedule), "--sizes", "4KiB:16KiB", "--iters", "2", "--warmup", "1"]
    code, out, err = run(capsys, *argv, "--progress")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == "# model: datasheet (the file's figures; topocc calibrate measures them)"
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in lines[2:-1] if not line.startswith("-")]
    assert header == [h for h, _ in BENCH_COLUMNS]  # nccl-tests' columns first: size count type redop time ...
    assert [r[0] for r in rows] == ["4KiB", "16KiB"] and all(r[7] == "0" for r in rows)  # #wrong: a count
    assert all(r[-3] not in ("n/a", "-", "") for r in rows)  # predicted from the topology beside the schedule
    assert all(re.fullmatch(r"[+-]\d+\.\d%", r[-2]) for r in rows)  # and its error
    assert lines[-1] == "# PASS: no wrong element at 2 sizes"
    assert err.splitlines() == ["bench: 2 sizes on 2 ranks", *(
        line for line in err.splitlines()[1:] if re.fullmatch(r"bench: (4|16)KiB done \([12]/2\): .* 0 wrong", line))]
    assert len(err.splitlines()) == 3
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0 and err == ""  # no progress when stderr is not a terminal
    doc = json.loads(out)
    assert [set(r) >= {name for _, name in BENCH_COLUMNS} for r in doc] == [True, True]
    assert all(r["what_if"] is False and r["predicted_time_s"] > 0 and r["wrong"] == 0 for r in doc)


def test_compile_plan_reports_progress_per_bucket(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compile", "emu-uniform", "-a", "ring", "-s", "1MiB:4MiB", "--json", "--progress")
    assert code == 0, err
    assert len(json.loads(out)["buckets"]) >= 1
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["bucket 1/2 (1MiB)"] * 2 + ["bucket 2/2 (4MiB)"] * 2
    assert lines[0].startswith("bucket 1/2 (1MiB): compile with ring (")
    assert re.fullmatch(r"bucket 2/2 \(4MiB\): ring, [\d.]+ (us|ms), [\d,]+ operations \([\d.]+ s\)", lines[3])
    code, _, err = run(capsys, "compile", "emu-uniform", "-a", "ring", "-s", "1MiB:4MiB", "--no-progress")
    assert code == 0 and err == ""


@pytest.mark.root
@pytest.mark.mpi
@pytest.mark.skipif(emulation_available() is not None, reason=str(emulation_available()))
def test_emulate_reports_setting_up_running_and_tearing_down(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "emulate", "emu-uniform", "--progress", "--", sys.executable, "-c", "print('hi')")
    assert code == 0, err
    assert out.count("hi") == 8
    progress = [line for line in err.splitlines() if line.startswith("emulate: ")]
    assert progress[0].startswith("emulate: setting up emu-uniform (4 hosts, 8 ranks")
    assert progress[1].startswith("emulate: running ") and progress[1].endswith(" on 8 ranks")
    assert progress[2:] == ["emulate: tearing down the emulated cluster"]


def _t2x2(tmp_path: Path) -> str:
    """2 hosts x 2 GPUs on one switch, as a topology file."""
    path = tmp_path / "t2x2.yaml"
    path.write_text(TOPOLOGY.format(hosts=2, gpus=2))
    return str(path)


def test_bundle_writes_a_folder_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "bundle"
    code, out, err = run(capsys, "bundle", _t2x2(tmp_path), "-o", str(folder), "-s", "1KiB:16KiB", "--group", "3,1",
                         "--root", "1", "--no-progress")
    assert code == 0 and err == "", err
    bundle = load_bundle(folder)
    keys = [(c, g, 1 if c == "broadcast" else None) for g in ((0, 1, 2, 3), (3, 1))
            for c in ("allreduce", "reducescatter", "allgather", "broadcast")]
    assert [e.key() for e in bundle.plans] == keys and bundle.world == 4 and bundle.topology == "t2x2"
    lines = out.splitlines()
    assert lines[0] == "bundle for t2x2 (4 ranks): 8 plans"
    assert lines[1].split() == ["collective", "group", "root", "buckets", "algorithms", "native", "below",
                                 "predicted"]
    assert lines[3].split()[:3] == ["allreduce", "world", "-"] and lines[10].split()[:3] == ["broadcast", "3,1", "1"]
    assert lines[-2:] == [f"  wrote {folder / 'bundle.json'}",
                          f'next: TOPOCC_PLAN={folder} torchrun ... train.py (with init_process_group("topocc"))']
    code, out, err = run(capsys, "bundle", _t2x2(tmp_path), "-o", str(folder), "-s", "4KiB", "-c", "all-gather",
                         "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(p["collective"], p["group"], p["root"], p["ranks"]) for p in doc["plans"]] == [
        ("allgather", [0, 1, 2, 3], None, 4)]
    assert doc["plans"][0]["native_below_bytes"] == load_bundle(folder).plans[0].native_below
    assert doc["output"] == str(folder / "bundle.json") and doc["ranks"] == 4
    assert [e.key() for e in load_bundle(folder).plans] == [("allgather", (0, 1, 2, 3), None)]


def test_bundle_compiles_what_a_job_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "calls.jsonl"
    log = CallLog(record)
    for call in (Call("allreduce", (0, 1, 2, 3), 4096, "float32", "sum"),
                 Call("allreduce", (0, 1, 2, 3), 1024, "float32", "sum"),
                 Call("reduce", (2, 3), 64, "float32", "max", root=1),
                 Call("allgather", (1,), 64, "float32")):
        log.add(call)
    code, out, err = run(capsys, "bundle", _t2x2(tmp_path), "-o", str(tmp_path / "b"), "--calls", str(record))
    assert code == 0 and "bundle for t2x2 (4 ranks): 2 plans" in out, err
    bundle = load_bundle(tmp_path / "b")
    assert [e.key() for e in bundle.plans] == [("allreduce", (0, 1, 2, 3), None), ("reduce", (2, 3), 1)]
    buckets = bundle.plans[0].plan.schedules
    assert buckets[0].metadata.size_bytes == 1024 and buckets[-1].metadata.max_bytes is None


@pytest.mark.parametrize("argv, says", [
    (["--group", "0-x"], "Invalid value for '--group': cannot read ranks '0-x' (fix: write ranks as 0-3, "),
    (["--group", "3-1"], "Invalid value for '--group': rank range '3-1' runs backwards (fix: write 1-3)"),
    (["--calls", "calls.jsonl", "-c", "allreduce"], "--calls compiles what the record lists; leave out -c, -s, "),
    (["--calls", "calls.jsonl", "--group", "0,1"], "--calls compiles what the record lists; "),
    (["-c", "gossip"], "Invalid value for '-c' / '--collective': 'gossip' is not one of "),
])
def test_bundle_refuses_bad_arguments_in_one_line(argv: list[str], says: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "bundle", "emu-racks", "-o", str(tmp_path / "b"), *argv)
    assert code == 2 and out == "" and not (tmp_path / "b").exists()
    assert err.startswith(f"topocc: error: {says}") and err.count("\n") == 1, err


def test_bundle_refuses_a_group_the_topology_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "bundle", "emu-racks", "-o", str(tmp_path / "b"), "--group", "8-12")
    assert code == 2 and out == "" and not (tmp_path / "b").exists()
    assert "rank 12 is not a rank of emu-racks (0-11)" in err and err.count("\n") == 1


@pytest.mark.parametrize(("spelling", "name"), [("all_reduce", "allreduce"), ("reduce_scatter", "reducescatter"),
                                                ("All-Gather", "allgather"), ("all_to_all", "alltoall")])
def test_every_collective_takes_torchs_spelling(spelling: str, name: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compile", _t2x2(tmp_path), "-c", spelling, "-a", "direct", "-s", "4KiB", "--json")
    assert code == 0, err
    assert json.loads(out)["collective"] == name


def test_a_misspelt_collective_is_refused_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compile", "emu-uniform", "-c", "all_reduse")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("topocc: error: Invalid value for '-c' / '--collective': 'all_reduse' is not one of "
                          "allreduce, reducescatter, allgather, broadcast, reduce, alltoall (did you mean allreduce?)")


def test_topo_show_says_the_bandwidth_is_per_direction_and_lists_classes_narrowest_first(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "topo", "show", "dgx-a100-4node")
    assert code == 0, err
    assert "  link bandwidth: 25 GB/s .. 300 GB/s per direction (a full-duplex link carries its figure each way" in out
    rows = out.split("links by class, narrowest first (bandwidth per direction):\n")[1].splitlines()
    assert [r.split()[:3] for r in rows[2:6]] == [["host-switch", "64", "25"], ["host:pcie", "64", "32"],
                                                  ["switch-1", "32", "50"], ["host:nvlink", "64", "300"]]
    code, out, err = run(capsys, "topo", "show", "dgx-a100-4node", "--json")
    classes = json.loads(out)["link_classes"]
    assert list(classes) == ["host-switch", "host:pcie", "switch-1", "host:nvlink"]
    assert classes["host:nvlink"] == {"links": 64, "min_link_bandwidth_GBps": 300.0, "max_link_bandwidth_GBps": 300.0,
                                      "link": "h0.gpu0 -> h0.nvsw0", "latency_s": 0.35e-6}


def test_files_written_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page, trace = tmp_path / "t.html", tmp_path / "trace.json"
    code, out, err = run(capsys, "topo", "show", "emu-uniform", "--html", str(page))
    assert code == 0 and page.is_file() and out.splitlines()[-1] == f"  wrote {page}", err
    code, out, err = run(capsys, "simulate", str(REPO / "schedules" / "emu-uniform-allreduce.json"), "--trace",
                         str(trace))
    assert code == 0 and trace.is_file() and out.splitlines()[-1] == f"  wrote {trace}", err


def test_bundle_shows_the_prediction_at_the_largest_recorded_size(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A recorded 4.77 MB all-reduce is served by the last bucket, which may have been merged with the one tuned
    at 1 MiB: the summary shows the time at 4.77MB, the size recorded, in its own unit."""
    record = tmp_path / "calls.jsonl"
    log = CallLog(record)
    for size in (4096, 4_770_000):
        log.add(Call("allreduce", (0, 1, 2, 3), size, "float32", "sum"))
    code, out, err = run(capsys, "bundle", _t2x2(tmp_path), "-o", str(tmp_path / "b"), "--calls", str(record),
                         "--json")
    assert code == 0, err
    (plan,) = json.loads(out)["plans"]
    assert plan["size_bytes"] == 4_770_000 and plan["buckets"][-1]["size_bytes"] <= 4_770_000
    slowest = max(b["predicted_time_s"] for b in plan["buckets"])
    assert plan["predicted_time_s"] >= slowest
    code, out, err = run(capsys, "bundle", _t2x2(tmp_path), "-o", str(tmp_path / "b"), "--calls", str(record))
    assert code == 0, err
    assert out.splitlines()[3].endswith(" at 4.77MB") and "at 1MiB" not in out
