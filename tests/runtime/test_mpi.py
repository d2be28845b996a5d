"""Replays under mpiexec compared with numpy: every collective, dtype and op, odd sizes, 2-8 ranks."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from topocc.planner.analysis.verify import verify
from topocc.runtime.harness.launch import (
    RANK_WRAPPER,
    BenchRequest,
    BenchRow,
    bench_schedule,
    find_mpiexec,
    run_schedule,
)
from topocc.runtime.schedule import Recv, save_schedule

pytestmark = pytest.mark.mpi

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("runtime_test_schedules", HERE / "mpi_scripts" / "schedules.py")
assert _spec is not None and _spec.loader is not None
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)

ALL_DTYPES = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"]
ALL_OPS = ["sum", "prod", "max", "min", "avg"]


def check_all(files: list[Path], np_: int, dtypes: list[str], ops: list[str], counts: list[int],
              limit: float = 90, extra: Sequence[str] = ()) -> list[dict]:
    """Run the worker on every file (``extra``: more worker arguments) and return rank 0's rows."""
    cmd = [find_mpiexec(), "-disable-auto-cleanup", "-n", str(np_), *RANK_WRAPPER, sys.executable, "-m",
           "topocc.runtime.harness.worker", "check", "--each", *map(str, files), "--data", "exact", "--timeout", "20",
           "--repeat", "2", "--dtypes", *dtypes, "--ops", *ops, "--counts", *map(str, counts), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return rows


def save_verified(schedules: dict, tmp_path: Path) -> list[Path]:
    files = []
    for name, schedule in schedules.items():
        verify(schedule)
        files.append(tmp_path / f"{name}.json")
        save_schedule(schedule, files[-1])
    return files


def assert_exact(rows: list[dict], expected_cases: int) -> None:
    assert len(rows) == expected_cases
    wrong = [r for r in rows if r["max_error"] != 0.0]
    assert not wrong, wrong[:5]


def expected(schedules: dict, dtypes: list[str], ops: list[str], counts: list[int]) -> int:
    total = 0
    for s in schedules.values():
        reducing = s.collective in ("allreduce", "reduce", "reducescatter")
        for d in dtypes:
            used = ops if reducing else ops[:1]
            total += sum(1 for o in used if not (o == "avg" and d.startswith(("int", "uint")))) * len(counts)
    return total


def test_every_collective_dtype_and_op_on_2_ranks(tmp_path: Path) -> None:
    schedules = S.every_collective(2)
    files = save_verified(schedules, tmp_path)
    counts = [1, 7, 1001]
    rows = check_all(files, 2, ALL_DTYPES, ALL_OPS, counts)
    assert_exact(rows, expected(schedules, ALL_DTYPES, ALL_OPS, counts))
    assert {r["algorithm"] for r in rows} >= {"ring", "direct", "chain", "direct-scratch", "pairwise-src"}


#: (ranks, dtypes, ops, elements per rank block) of the 3- and 4-rank checks
MORE_RANKS = [
    (3, ["float64", "int32", "int8"], ["sum", "min", "prod"], [1, 7, 1001]),
    (4, ["float32", "float16", "int64", "uint8"], ["sum", "max", "avg"], [1, 7, 65537]),
]


@pytest.mark.parametrize(("ranks", "dtypes", "ops", "counts"), MORE_RANKS)
def test_every_collective_on_more_ranks(tmp_path: Path, ranks: int, dtypes: list[str], ops: list[str],
                                        counts: list[int]) -> None:
    schedules = S.every_collective(ranks)
    rows = check_all(save_verified(schedules, tmp_path), ranks, dtypes, ops, counts)
    assert_exact(rows, expected(schedules, dtypes, ops, counts))


def test_eight_ranks(tmp_path: Path) -> None:
    schedules = {"ring": S.ring_allreduce(8, 2, channels=2), "a2a": S.direct_alltoall(8, 1),
                 "rs": S.ring_reducescatter(8, 1)}
    rows = check_all(save_verified(schedules, tmp_path), 8, ["float32", "int8"], ["sum"], [1, 7, 1001])
    assert_exact(rows, expected(schedules, ["float32", "int8"], ["sum"], [1, 7, 1001]))


def test_planner_algorithms_replay(tmp_path: Path) -> None:
    """Schedules from topocc.planner.compiler.algorithms (ring, tree, halving-doubling, direct, hierarchical;
    bucket on grids) on 4 ranks."""
    schedules = {**S.planner_schedules(), **S.grid_schedules()}
    assert "ring-allreduce" in schedules and "direct-alltoall" in schedules and "bucket-allreduce-torus-4" in schedules
    ranks = next(iter(schedules.values())).ranks
    rows = check_all(save_verified(schedules, tmp_path), ranks, ["float32", "int32"], ["sum", "max"], [1, 7, 1001])
    assert_exact(rows, expected(schedules, ["float32", "int32"], ["sum", "max"], [1, 7, 1001]))


def test_run_and_bench_library_functions(tmp_path: Path) -> None:
    schedule = S.ring_allreduce(3, 2)
    result = run_schedule(schedule, None, 4000, dtype="float32", timeout=20, repeat=2, warmup=1)
    assert result.ok and result.passed, result.stderr
    row = result.rows[0]
    assert (row.count, row.size, row.wrong, row.iters) == (1000, 4000, 0, 2)
    assert 0 < result.max_error < 1e-4 and row.time_s > 0  # random floats: rounding differs, within tolerance
    assert abs(row.busbw - row.algbw * 4 / 3) < 1e-9 and abs(row.algbw - 4000 / row.time_s / 1e9) < 1e-12
    seen: list[BenchRow] = []
    rows = bench_schedule(schedule, 3, BenchRequest((4096, 1 << 16), iters=3, warmup=1, timeout=20),
                          progress=seen.append)
    assert [r.size for r in rows] == [4096, 1 << 16] and seen == rows  # progress saw each row as its size ended
    assert all(r.time_s > 0 and r.native_time_s and r.wrong == 0 and r.max_error < 1e-4 for r in rows)
    assert abs(rows[0].busbw - rows[0].algbw * 4 / 3) < 1e-9
    assert set(rows[0].to_json()) >= {"size_bytes", "type", "redop", "time_s", "algbw_GBps", "wrong", "ratio"}


def test_a_wrong_result_is_counted(tmp_path: Path) -> None:
    """A schedule that receives where it must reduce runs to the end, but its elements are counted wrong."""
    good = S.ring_allreduce(2)
    programs = [tuple(Recv(op.peer, op.dst, deps=op.deps, step=op.step, channel=op.channel)
                      if op.kind == "recv_reduce" else op for op in program) for program in good.programs]
    path = tmp_path / "wrong.json"
    save_schedule(replace(good, programs=tuple(programs)), path)
    result = run_schedule(path, 2, 4000, dtype="int32", timeout=20)
    assert result.ok and not result.passed
    assert result.rows[0].wrong > 0 and result.max_error > 0
