"""The lowered replay on real MPI ranks with NCCL's semantics (order-matched pairs, whole groups, synchronous sends).

This is the CPU evidence for the lowering: every collective, dtype and op, odd sizes, 2-4 ranks, the
planner's algorithms, groups as small as one piece, checked exactly against numpy; a killed peer and a
lowering that deadlocks fail with one line naming the peer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_mpi import (
    ALL_DTYPES,
    ALL_OPS,
    MORE_RANKS,
    S,
    assert_exact,
    check_all,
    expected,
    save_verified,
)
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.harness.launch import find_mpiexec, run_schedule

pytestmark = pytest.mark.mpi

SCRIPTS = Path(__file__).parent / "mpi_scripts"
#: one chunk per stream and group (the smallest groups), and the default (4 MiB: whole steps at these sizes)
LOWERED = ["--lowered", "--group-bytes", "1"]


@pytest.mark.parametrize("group_bytes", ["1", str(512 << 10)])
def test_every_collective_dtype_and_op_on_2_ranks(tmp_path: Path, group_bytes: str) -> None:
    schedules = S.every_collective(2)
    counts = [1, 7, 1001]
    rows = check_all(save_verified(schedules, tmp_path), 2, ALL_DTYPES, ALL_OPS, counts,
                     extra=["--lowered", "--group-bytes", group_bytes])
    assert_exact(rows, expected(schedules, ALL_DTYPES, ALL_OPS, counts))


@pytest.mark.parametrize(("ranks", "dtypes", "ops", "counts"), MORE_RANKS)
def test_every_collective_on_more_ranks(tmp_path: Path, ranks: int, dtypes: list[str], ops: list[str],
                                        counts: list[int]) -> None:
    schedules = S.every_collective(ranks)
    rows = check_all(save_verified(schedules, tmp_path), ranks, dtypes, ops, counts, extra=LOWERED)
    assert_exact(rows, expected(schedules, dtypes, ops, counts))


def test_planner_algorithms_lowered(tmp_path: Path) -> None:
    schedules = {**S.planner_schedules(("ring", "tree", "halving-doubling", "direct", "hierarchical", "multitree",
                                      "treepack")), **S.grid_schedules()}
    assert {"multitree-allreduce", "treepack-broadcast", "hierarchical-reducescatter"} <= set(schedules)
    rows = check_all(save_verified(schedules, tmp_path), 4, ["float32", "int32"], ["sum", "max"], [1, 7, 1001],
                     limit=150, extra=LOWERED)
    assert_exact(rows, expected(schedules, ["float32", "int32"], ["sum", "max"], [1, 7, 1001]))


def test_killed_peer_gives_one_line_on_every_survivor(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    from topocc.runtime.schedule import save_schedule

    save_schedule(S.ring_allreduce(4, 2, channels=2), path)
    result = run_schedule(path, 4, 4004, timeout=3.0, repeat=3,
                          worker_args=[*LOWERED, "--die-rank", "2", "--die-after", "1", "--die-how", "kill"])
    assert result.returncode != 0
    survivors = {int(line.split("rank ")[1].split(":")[0]) for line in result.errors}
    assert survivors == {0, 1, 3}, result.stderr[-2000:]
    for line in result.errors:
        assert "\n" not in line and "waiting for rank(s)" in line
    # rank 3 receives from rank 2 in this ring: whatever group it is stuck in, it names rank 2
    assert any(line.startswith("topocc: rank 3:") and "rank(s) 2" in line for line in result.errors)


def test_a_deadlocking_lowering_times_out_naming_the_peer() -> None:
    """Synchronous sends make MPI as strict as NCCL: two sends posted before their receives wait forever."""
    proc = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, str(SCRIPTS / "lowered_deadlock.py"), "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == CommunicatorError.exit_code, proc.stderr[-2000:]
    assert "completed" not in proc.stdout
    lines = sorted(line for line in proc.stderr.splitlines() if line.startswith("topocc:"))
    assert len(lines) == 2, proc.stderr[-2000:]
    for rank, line in enumerate(lines):
        assert f"rank {rank}: allgather (bad lowering): timed out after 2 s waiting for rank(s) {1 - rank} " \
               f"(op 0: send to rank {1 - rank})" in line


def test_work_future_on_the_host_is_completed_after_the_collective() -> None:
    """``Work.get_future`` (what the DDP hook returns): on the host, the collective is waited for first."""
    torch = pytest.importorskip("torch")
    from topocc.runtime.group_executor import Work

    waited: list[float] = []

    class Transport:
        def wait(self, fence: object, deadline: float) -> None:
            waited.append(deadline)

    value = torch.ones(3)
    future = Work(Transport(), object(), 5.0, lambda exc: CommunicatorError(str(exc))).get_future(value)  # type: ignore[arg-type]
    assert len(waited) == 1 and future.done() and future.wait() is value
