"""The executor's set-up (chunk layout, sizes, pairing, tags) and the refusals made before any data moves."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from topocc.runtime import Communicator, CommunicatorError
from topocc.runtime.executor import COPY, Binding, Layout, Program, block_elements, pair_pieces
from topocc.runtime.schedule import Metadata

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("runtime_test_schedules", HERE / "mpi_scripts" / "schedules.py")
assert _spec is not None and _spec.loader is not None
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)


class NoDataTransport:
    """Agrees to every handshake and fails the test if any message is set up (or anything else is asked of it)."""

    name = "none"
    tag_ub = 32767

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def allgather_ints(self, values: Any, timeout: float) -> list[tuple[int, ...]]:
        return [tuple(values)] * self.size

    def send_init(self, *a: Any) -> Any:
        raise AssertionError("data moved")

    recv_init = start = test_some = free = barrier = max_float = send_init


def test_layout_uneven_tails() -> None:
    lay = Layout(block=7, k=3)
    assert [lay.size(x) for x in range(6)] == [3, 2, 2, 3, 2, 2]
    assert [lay.offset(x) for x in range(6)] == [0, 3, 5, 7, 10, 12]
    assert lay.cap == 3
    assert [Layout(2, 4).size(x) for x in range(4)] == [1, 1, 0, 0]


def test_block_elements_checks_sizes() -> None:
    assert block_elements(S.ring_allgather(3, 2), 5, 15) == 5
    assert block_elements(S.ring_reducescatter(3, 1), 12, 4) == 4
    with pytest.raises(CommunicatorError, match="needs 5 input and 15 output"):
        block_elements(S.ring_allgather(3, 2), 5, 14)
    with pytest.raises(CommunicatorError, match="divisible by 3"):
        block_elements(S.direct_alltoall(3), 7, 7)


def test_pair_splits_at_every_boundary() -> None:
    a = [("s", 0, 3), ("s", 10, 2)]
    b = [("o", 100, 5)]
    assert pair_pieces(a, b) == [(("s", 0, 3), ("o", 100, 3)), (("s", 10, 2), ("o", 103, 2))]


def test_scratch_sizes_follow_the_data() -> None:
    """7 elements in 3 chunks: scratch slots are 3 wide but hold 3, 2, 2 elements; messages span two pieces."""
    schedule = S.direct_allreduce_scratch(3, chunks=3)
    program = Program(schedule, 0, np.dtype("float32"), 7, tag_ub=32767, channels=1)
    sends = [k for k, kind in enumerate(program.kinds) if kind == 2]
    recvs = [k for k, kind in enumerate(program.kinds) if kind == 3]
    assert all(program.msg_len[k] == 7 for k in sends + recvs)
    for k in recvs:  # slots 3 wide holding 3, 2, 2: the first two are adjacent, the third is not
        start = program.dst_pieces[k][0][1]
        assert program.dst_pieces[k] == [("s", start, 5), ("s", start + 6, 2)]
    assert all(k in program.staging for k in recvs)


def test_tags_are_distinct_per_stream() -> None:
    schedule = S.ring_allreduce(4, 2, channels=2)
    program = Program(schedule, 1, np.dtype("float32"), 100, tag_ub=32767, channels=2)
    seen = {}
    for k, peer in enumerate(program.peers):
        if peer is not None:
            key = (program.kinds[k] == 2, peer, program.tags[k])
            assert key not in seen
            seen[key] = k


def test_refusals_before_data_moves() -> None:
    comm = Communicator(S.ring_allgather(3, 1), transport=NoDataTransport(0, 3))
    with pytest.raises(CommunicatorError, match="allreduce called on a communicator whose schedule computes allgather"):
        comm.allreduce(np.ones(3))
    with pytest.raises(CommunicatorError, match="needs 4 input and 12 output"):
        comm.allgather(np.ones(4, np.float32), np.ones(11, np.float32))
    with pytest.raises(CommunicatorError, match="send buffer is float32 but receive buffer is float64"):
        comm.allgather(np.ones(4, np.float32), np.ones(12, np.float64))
    with pytest.raises(CommunicatorError, match="unsupported dtype complex128"):
        comm.allgather(np.ones(4, np.complex128))
    with pytest.raises(CommunicatorError, match="not contiguous"):
        comm.allgather(np.ones(8, np.float32)[::2])
    ar = Communicator(S.ring_allreduce(3), transport=NoDataTransport(0, 3))
    with pytest.raises(CommunicatorError, match="avg on int32 is refused"):
        ar.allreduce(np.ones(5, np.int32), op="avg")
    with pytest.raises(CommunicatorError, match="unknown reduction op 'mean'"):
        ar.allreduce(np.ones(5, np.float32), op="mean")


def test_size_and_fingerprint_refused() -> None:
    with pytest.raises(CommunicatorError, match="is for 3 ranks but the communicator has 4"):
        Communicator(S.ring_allreduce(3), transport=NoDataTransport(0, 4))
    tagged = S.ring_allreduce(2).with_metadata(fingerprint="abc")
    with pytest.raises(CommunicatorError, match="fingerprint mismatch"):
        Communicator(tagged, fingerprint="xyz", transport=NoDataTransport(0, 2))
    Communicator(tagged, fingerprint="abc", transport=NoDataTransport(0, 2))


def test_plan_picks_by_size() -> None:
    small = S.ring_allreduce(2).with_metadata(min_bytes=0, max_bytes=1024)
    big = S.ring_allreduce(2, 4).with_metadata(min_bytes=1024, max_bytes=None)
    comm = Communicator([small, big], transport=NoDataTransport(0, 2))
    from topocc.runtime import select_schedule

    assert select_schedule(comm.plan, 100).metadata.options == {"pipeline": 1}
    assert select_schedule(comm.plan, 4096).metadata.options == {"pipeline": 4}
    assert isinstance(small.metadata, Metadata)


def test_runtime_imports_no_planner() -> None:
    code = ("import sys, topocc.runtime, topocc.runtime.harness.launch, topocc.runtime.harness.worker, "
            "topocc.runtime.executor; "
            "bad = [m for m in sys.modules if m.startswith('topocc.planner') "
            "or m.split('.')[0] in ('networkx', 'ortools', 'pulp')]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_an_input_only_copied_in_place_may_share_the_outputs_memory() -> None:
    """A ring all-reduce reads its input once, copying it onto the output first: bound to the output's
    memory, those copies are no work.  A program that sends from its input (direct with scratch) may not."""
    cases = S.every_collective(3)
    ring = Program(cases["allreduce-ring"], 0, np.dtype(np.float32), 7, tag_ub=1 << 20, channels=4)
    assert ring.input_copied_in_place
    assert not Program(cases["allreduce-direct-scratch"], 0, np.dtype(np.float32), 7, tag_ub=1 << 20,
                       channels=4).input_copied_in_place
    assert not Program(cases["allreduce-ring-inplace"], 0, np.dtype(np.float32), 7, tag_ub=1 << 20,
                       channels=4).input_copied_in_place  # no input at all
    out = np.zeros(ring.elements("o"), np.float32)
    copies = [k for k, kind in enumerate(ring.kinds) if kind == COPY]
    shared = Binding(ring, NoDataTransport(0, 3), {"i": out, "o": out}, requests=False)
    own = Binding(ring, NoDataTransport(0, 3), {"i": out.copy(), "o": out}, requests=False)
    assert copies and all(shared.local[k] == [] for k in copies) and all(own.local[k] for k in copies)
