"""The lowered replay's batched pieces: one multi-tensor call per phase equals one call per piece, in order.

A group's packs, unpacks and in-place folds run as ``torch._foreach_*`` calls where no destination overlaps
another or a source (on CUDA that is one kernel instead of hundreds per call).  Here each rank of a schedule
replays on CPU tensors against a stand-in transport that fills every received message with the same
deterministic data, once with the batched calls and once piece by piece: the results must be identical.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from topocc.runtime.arrays import ArrayOps
from topocc.runtime.communicator import Communicator
from topocc.runtime.harness.worker import call
from topocc.runtime.schedule import load_schedule

torch = pytest.importorskip("torch")

from topocc.runtime.transports.torch_ops import TorchOps  # noqa: E402

_spec = importlib.util.spec_from_file_location("schedules", Path(__file__).parent / "mpi_scripts" / "schedules.py")
assert _spec is not None and _spec.loader is not None
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)


class PieceByPiece(TorchOps):
    """Torch operations with the batched calls undone: one copy or reduction per piece, in order."""

    copy_many = ArrayOps.copy_many
    reduce_many = ArrayOps.reduce_many


class Delivering:
    """A group transport on the host whose receives get data made from the message's tag; sends go nowhere."""

    name = "stand-in"

    def __init__(self, rank: int, size: int, ops: TorchOps) -> None:
        self.rank, self.size, self.array_ops = rank, size, ops
        self.batched = 0

    def send_init(self, buf: Any, peer: int, tag: int) -> Any:
        return (buf, peer, tag, True)

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any:
        return (buf, peer, tag, False)

    def group(self, messages: Any, deadline: float) -> None:
        for buf, peer, tag, send in messages:
            if not send:
                values = torch.arange(buf.numel(), dtype=torch.float64) % 7 + tag % 5 + peer
                buf.copy_(values.to(buf.dtype))

    @contextlib.contextmanager
    def ordered(self, join: bool = True) -> Iterator[None]:
        yield

    def fence(self) -> None:
        return None

    def query(self, fence: Any) -> bool:
        return True

    def join(self, fence: Any) -> None:
        return None

    def wait(self, fence: Any, deadline: float) -> None:
        return None

    def watch(self, fence: Any, on_failure: Any) -> None:
        return None

    def free(self, messages: Any) -> None:
        return None

    def allgather_ints(self, values: Any, timeout: float) -> list[tuple[int, ...]]:
        return [tuple(values)] * self.size

    def barrier(self, timeout: float) -> bool:
        return True

    def max_float(self, value: float) -> float:
        return value


def replay(schedule: Any, rank: int, ops: TorchOps, collective: str, dtype: Any, count: int, op: str,
           group_bytes: int) -> Any:
    comm = Communicator(schedule, transport=Delivering(rank, schedule.ranks, ops), timeout=5.0,
                        group_bytes=group_bytes)
    data = (torch.arange(count, dtype=torch.float64) % 11 + rank).to(dtype)
    out = call(comm, collective, data, op)
    return out.clone()


SHIPPED = ["emu-uniform", "emu-racks", "dgx1-v100"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_allreduce_batched_equals_piece_by_piece(name: str) -> None:
    schedule = load_schedule(REPO / "schedules" / f"{name}-allreduce.json")
    cpu = torch.device("cpu")
    for rank in range(schedule.ranks):
        for op, dtype in (("sum", torch.float32), ("max", torch.int32)):
            for group_bytes in (1, 4 << 20):
                a = replay(schedule, rank, TorchOps(cpu), "allreduce", dtype, 65537, op, group_bytes)
                b = replay(schedule, rank, PieceByPiece(cpu), "allreduce", dtype, 65537, op, group_bytes)
                assert torch.equal(a, b), (name, rank, op, group_bytes)


def test_every_collective_batched_equals_piece_by_piece() -> None:
    cpu = torch.device("cpu")
    schedules = {**S.every_collective(4), **S.planner_schedules(size_bytes=1 << 16)}
    for name, schedule in schedules.items():
        for rank in range(schedule.ranks):
            for op in ("sum", "prod", "min"):
                a = replay(schedule, rank, TorchOps(cpu), schedule.collective, torch.float32, 1036, op, 1)
                b = replay(schedule, rank, PieceByPiece(cpu), schedule.collective, torch.float32, 1036, op, 1)
                assert torch.equal(a, b), (name, rank, op)


def test_only_independent_pieces_are_batched() -> None:
    """A multi-tensor call runs its pieces at once (on CUDA): overlapping destinations, or a destination
    that is another piece's source, must stay one call per piece, in order."""
    from topocc.runtime.group_executor import _in_place_folds, _lists

    ops = TorchOps(torch.device("cpu"))
    a, b = torch.zeros(100), torch.zeros(100)
    disjoint = [(a[0:10], b[0:10]), (a[10:30], b[0:20]), (a[50:60], b[90:100])]
    lists = _lists(ops, disjoint)
    assert lists is not None and [t.data_ptr() for t in lists[0]] == [a[0:10].data_ptr(), a[10:30].data_ptr(),
                                                                     a[50:60].data_ptr()]
    assert _lists(ops, disjoint[:1]) is None                                    # one piece: nothing to batch
    assert _lists(ops, [(a[0:10], b[0:10]), (a[5:15], b[20:30])]) is None      # destinations overlap
    assert _lists(ops, [(a[0:10], b[0:10]), (b[5:8], a[40:43])]) is None       # a destination is a source
    assert _lists(ops, [(a[0:10], a[20:30]), (a[40:50], a[9:19])]) is None     # ... of another piece
    assert _lists(ops, [(a[0:10], a[20:30]), (a[40:50], a[10:20])]) is not None  # touching, not overlapping
    assert _lists(ops, [(a[0:0], a[0:10]), (a[20:30], a[40:50])]) is not None  # an empty piece overlaps nothing
    assert _in_place_folds(ops, [(a[0:10], a[0:10], b[0:10]), (a[10:20], a[10:20], b[10:20])]) is not None
    assert _in_place_folds(ops, [(a[0:10], b[30:40], b[0:10]), (a[10:20], a[10:20], b[10:20])]) is None
