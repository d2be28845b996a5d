"""ScheduleBuilder: dependency inference, and small correct constructions of every collective.

The ``*_schedule`` functions below are the reference constructions the schedule
format and verifier tests reuse (they load this module by path, see
``constructions()``): each builds a correct schedule with the builder, for any
rank count ``p >= 2`` and ``k`` chunks per piece (``k > 1`` exercises chunk
references with a count).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.builder import RELAY_SLOTS, ScheduleBuilder
from topocc.runtime.schedule import Chunk, Schedule

# --------------------------------------------------------------------------- constructions


def ring_allreduce_schedule(p: int, k: int = 1, *, inplace: bool = False, channels: int = 1) -> Schedule:
    """Ring reduce-scatter then ring allgather; piece ``c`` (k chunks) travels on channel ``c % channels``."""
    b = ScheduleBuilder("allreduce", p, p * k, p * k, inplace=inplace)

    def piece(buf: str, c: int) -> Chunk:
        return Chunk(buf, c * k, k)

    for s in range(p - 1):  # reduce-scatter: rank r sends piece r - s
        for r in range(p):
            c, nxt = (r - s) % p, (r + 1) % p
            b.send(r, nxt, piece("i" if s == 0 else "o", c), step=s, channel=c % channels)
            # the left operand is the receiver's own input piece
            b.recv(nxt, r, piece("o", c), reduce=True, src=piece("i", c), step=s, channel=c % channels)
    for s in range(p - 1):  # allgather: rank r owns piece r + 1 and passes pieces on
        for r in range(p):
            c, nxt = (r + 1 - s) % p, (r + 1) % p
            b.transfer(r, nxt, piece("o", c), piece("o", c), step=p - 1 + s, channel=c % channels)
    return b.build("test-ring", {"channels": channels})


def direct_allreduce_schedule(p: int, k: int = 1) -> Schedule:
    """Every rank reduces its own piece from everyone (direct reduce-scatter), then sends it to everyone."""
    b = ScheduleBuilder("allreduce", p, p * k, p * k)
    for r in range(p):
        b.copy(r, Chunk("i", r * k, k), Chunk("o", r * k, k))
    for r in range(p):
        for q in range(p):
            if q != r:
                b.transfer(q, r, Chunk("i", r * k, k), Chunk("o", r * k, k), reduce=True, step=0)
    for r in range(p):
        for q in range(p):
            if q != r:
                b.transfer(r, q, Chunk("o", r * k, k), Chunk("o", r * k, k), step=1)
    return b.build("test-direct")


def ring_allgather_schedule(p: int, k: int = 1, *, inplace: bool = False) -> Schedule:
    """Rank r's block travels around the ring; in place, the input already sits in output block r."""
    b = ScheduleBuilder("allgather", p, k, p * k, inplace=inplace)
    if not inplace:
        for r in range(p):
            b.copy(r, Chunk("i", 0, k), Chunk("o", r * k, k))
    for s in range(p - 1):
        for r in range(p):
            c = (r - s) % p
            src = Chunk("i", 0, k) if (inplace and s == 0) else Chunk("o", c * k, k)
            b.transfer(r, (r + 1) % p, src, Chunk("o", c * k, k), step=s)
    return b.build("test-ring")


def ring_reducescatter_schedule(p: int, k: int = 1, *, inplace: bool = False) -> Schedule:
    """Rank r sends block r - s - 1 at step s; partial sums live in scratch (or in the input, in place)."""
    b = ScheduleBuilder("reducescatter", p, p * k, k, scratch_chunks=0 if inplace else p * k, inplace=inplace)
    acc = "i" if inplace else "s"
    for s in range(p - 1):
        for r in range(p):
            c, nxt = (r - s - 1) % p, (r + 1) % p
            src = Chunk("i" if s == 0 else acc, c * k, k)
            b.send(r, nxt, src, step=s)
            # the last step lands in the receiver's output block (in place: its own input block)
            dst = Chunk("o", 0, k) if s == p - 2 else Chunk(acc, c * k, k)
            b.recv(nxt, r, dst, reduce=True, src=None if inplace else Chunk("i", c * k, k), step=s)
    return b.build("test-ring")


def chain_broadcast_schedule(p: int, k: int = 1, *, root: int = 2, inplace: bool = False) -> Schedule:
    """Pipelined chain root -> root+1 -> ...: each chunk is forwarded as soon as it arrives."""
    root %= p
    n = 2 * k
    b = ScheduleBuilder("broadcast", p, n, n, root=root, inplace=inplace)
    order = [(root + j) % p for j in range(p)]
    for c in range(n):
        if not inplace:
            b.copy(root, Chunk("i", c), Chunk("o", c))
        for a, z in itertools.pairwise(order):
            b.transfer(a, z, Chunk("o", c), Chunk("o", c), step=c)
    return b.build("test-chain")


def chain_reduce_schedule(p: int, k: int = 1, *, root: int = 1) -> Schedule:
    """Chain root+1 -> root+2 -> ... -> root, each hop reducing its own input into the travelling sum."""
    root %= p
    b = ScheduleBuilder("reduce", p, k, k, root=root)
    order = [(root + 1 + j) % p for j in range(p)]
    b.send(order[0], order[1], Chunk("i", 0, k))
    for j in range(1, p):
        b.recv(order[j], order[j - 1], Chunk("o", 0, k), reduce=True, src=Chunk("i", 0, k))
        if j + 1 < p:
            b.send(order[j], order[j + 1], Chunk("o", 0, k), step=j)
    return b.build("test-chain")


def direct_alltoall_schedule(p: int, k: int = 1) -> Schedule:
    """Every rank sends input block q to rank q, which stores it as output block r."""
    b = ScheduleBuilder("alltoall", p, p * k, p * k)
    for r in range(p):
        b.copy(r, Chunk("i", r * k, k), Chunk("o", r * k, k))
        for q in range(p):
            if q != r:
                b.transfer(r, q, Chunk("i", q * k, k), Chunk("o", r * k, k))
    return b.build("test-direct")


#: name -> (p, k) -> Schedule; every entry verifies for every p >= 2, k >= 1.
CONSTRUCTIONS: dict[str, Callable[[int, int], Schedule]] = {
    "allreduce-ring": lambda p, k: ring_allreduce_schedule(p, k),
    "allreduce-ring-2ch": lambda p, k: ring_allreduce_schedule(p, k, channels=2),
    "allreduce-ring-inplace": lambda p, k: ring_allreduce_schedule(p, k, inplace=True),
    "allreduce-direct": direct_allreduce_schedule,
    "allgather-ring": lambda p, k: ring_allgather_schedule(p, k),
    "allgather-ring-inplace": lambda p, k: ring_allgather_schedule(p, k, inplace=True),
    "reducescatter-ring": lambda p, k: ring_reducescatter_schedule(p, k),
    "reducescatter-ring-inplace": lambda p, k: ring_reducescatter_schedule(p, k, inplace=True),
    "broadcast-chain-root2": lambda p, k: chain_broadcast_schedule(p, k, root=2),
    "broadcast-chain-root2-inplace": lambda p, k: chain_broadcast_schedule(p, k, root=2, inplace=True),
    "reduce-chain-root1": lambda p, k: chain_reduce_schedule(p, k, root=1),
    "alltoall-direct": direct_alltoall_schedule,
}


# --------------------------------------------------------------------------- builder tests


def test_docstring_example_counts_operations() -> None:
    b = ScheduleBuilder("allgather", ranks=2, input_chunks=1, output_chunks=2)
    for r in range(2):
        b.copy(r, Chunk("i", 0), Chunk("o", r))
    b.transfer(0, 1, Chunk("o", 0), Chunk("o", 0))
    b.transfer(1, 0, Chunk("o", 1), Chunk("o", 1))
    schedule = b.build("example")
    assert schedule.op_count == 6
    verify(schedule)


def test_read_after_write_depends_on_the_write() -> None:
    b = ScheduleBuilder("allreduce", 2, 2, 2)
    w = b.copy(0, Chunk("i", 0), Chunk("o", 0))
    s = b.send(0, 1, Chunk("o", 0))
    assert b.programs[0][s].deps == (w,)


def test_write_after_read_depends_on_every_reader_and_last_write() -> None:
    b = ScheduleBuilder("allreduce", 3, 2, 2)
    w = b.copy(0, Chunk("i", 0), Chunk("o", 0))
    r1 = b.send(0, 1, Chunk("o", 0))
    r2 = b.send(0, 2, Chunk("o", 0))
    k = b.recv(0, 1, Chunk("o", 0))
    assert b.programs[0][k].deps == (w, r1, r2)
    # a later reader depends only on the new write
    r3 = b.send(0, 2, Chunk("o", 0))
    assert b.programs[0][r3].deps == (k,)


def test_independent_chunks_get_no_dependencies() -> None:
    b = ScheduleBuilder("allreduce", 2, 2, 2)
    b.copy(0, Chunk("i", 0), Chunk("o", 0))
    k = b.copy(0, Chunk("i", 1), Chunk("o", 1))
    assert b.programs[0][k].deps == ()


def test_counted_references_overlap_by_chunk() -> None:
    b = ScheduleBuilder("allreduce", 2, 4, 4)
    w = b.copy(0, Chunk("i", 0, 3), Chunk("o", 0, 3))
    untouched = b.send(0, 1, Chunk("o", 3))
    touched = b.send(0, 1, Chunk("o", 2, 2))
    assert b.programs[0][untouched].deps == ()
    assert b.programs[0][touched].deps == (w,)


def test_recv_reduce_reads_its_destination() -> None:
    b = ScheduleBuilder("allreduce", 2, 1, 1)
    w = b.copy(1, Chunk("i", 0), Chunk("o", 0))
    k = b.recv(1, 0, Chunk("o", 0), reduce=True)
    plain = b.recv(1, 0, Chunk("o", 0))
    assert b.programs[1][k].deps == (w,)
    assert b.programs[1][plain].deps == (k,)


def test_recv_reduce_with_src_reads_src() -> None:
    b = ScheduleBuilder("allreduce", 2, 2, 2)
    w = b.copy(1, Chunk("i", 1), Chunk("o", 1))
    k = b.recv(1, 0, Chunk("o", 0), reduce=True, src=Chunk("o", 1))
    op = b.programs[1][k]
    assert (op.kind, op.src, op.dst, op.deps) == ("recv_reduce", Chunk("o", 1), Chunk("o", 0), (w,))


def test_plain_recv_rejects_src() -> None:
    b = ScheduleBuilder("allreduce", 2, 1, 1)
    with pytest.raises(ValueError, match="reducing receive"):
        b.recv(1, 0, Chunk("o", 0), src=Chunk("i", 0))


def test_after_adds_explicit_dependencies() -> None:
    b = ScheduleBuilder("allreduce", 2, 2, 2)
    a = b.copy(0, Chunk("i", 0), Chunk("o", 0))
    k = b.copy(0, Chunk("i", 1), Chunk("o", 1), after=[a])
    assert b.programs[0][k].deps == (a,)


def test_a_receive_waits_for_recv_after() -> None:
    b = ScheduleBuilder("allreduce", 2, 2, 2)
    a = b.copy(1, Chunk("i", 1), Chunk("o", 1))
    _, recv = b.transfer(0, 1, Chunk("i", 0), Chunk("o", 0), recv_after=[a])
    assert b.programs[1][recv].deps == (a,)


def test_inplace_aliasing_creates_dependencies_across_buffer_names() -> None:
    # in-place allgather on rank 1 with 2 chunks per rank: i[j] is o[2 + j]
    b = ScheduleBuilder("allgather", 2, 2, 4, inplace=True)
    s = b.send(1, 0, Chunk("i", 1))
    k = b.recv(1, 0, Chunk("o", 3))
    assert b.programs[1][k].deps == (s,)
    other = b.recv(1, 0, Chunk("o", 0))
    assert b.programs[1][other].deps == ()


def test_inplace_reducescatter_output_aliases_own_input_block() -> None:
    b = ScheduleBuilder("reducescatter", 3, 3, 1, inplace=True)
    w = b.recv(2, 1, Chunk("i", 2), reduce=True)
    r = b.send(2, 0, Chunk("o", 0))
    assert b.programs[2][r].deps == (w,)


def test_transfer_returns_both_indices_and_carries_step_and_channel() -> None:
    b = ScheduleBuilder("allreduce", 2, 1, 1)
    s, r = b.transfer(0, 1, Chunk("i", 0), Chunk("o", 0), step=3, channel=2)
    send, recv = b.programs[0][s], b.programs[1][r]
    assert (send.kind, send.peer, send.step, send.channel) == ("send", 1, 3, 2)
    assert (recv.kind, recv.peer, recv.step, recv.channel) == ("recv", 0, 3, 2)


# --------------------------------------------------------------------------- relays


def line_relay(a: int, b: int) -> tuple[int, ...]:
    """Ranks on a line: a message passes every rank between its ends."""
    step = 1 if b > a else -1
    return tuple(range(a + step, b, step))


def test_relayed_transfer_lowers_into_receives_and_sends_reducing_only_at_the_end() -> None:
    b = ScheduleBuilder("reduce", 3, 1, 1, root=2, relay=line_relay)
    for r in range(3):
        b.copy(r, Chunk("i", 0), Chunk("o", 0))
    first, last = b.transfer(0, 2, Chunk("o", 0), Chunk("o", 0), reduce=True, step=4, channel=1)
    b.transfer(1, 2, Chunk("o", 0), Chunk("o", 0), reduce=True, step=4, channel=1)
    assert (b.programs[0][first].kind, b.programs[0][first].peer) == ("send", 1)
    assert (b.programs[2][last].kind, b.programs[2][last].peer) == ("recv_reduce", 1)
    relay = b.programs[1][1:3]
    assert [(op.kind, op.peer) for op in relay] == [("recv", 0), ("send", 2)]
    assert relay[0].dst == relay[1].src == Chunk("s", 0)  # rank 1 forwards without reducing into its own data
    assert {(op.step, op.channel) for p in b.programs for op in p if op.peer is not None} == {(4, 1)}
    schedule = b.build("test")
    assert schedule.scratch_chunks == RELAY_SLOTS
    verify(schedule)


def test_relay_slots_are_reused_and_pieces_overlap() -> None:
    pieces = 3 * RELAY_SLOTS
    b = ScheduleBuilder("broadcast", 3, pieces, pieces, scratch_chunks=5, relay=line_relay)
    b.copy(0, Chunk("i", 0, pieces), Chunk("o", 0, pieces))
    for j in range(pieces):
        b.transfer(0, 2, Chunk("o", j), Chunk("o", j))
    for j in range(pieces):
        b.transfer(0, 1, Chunk("o", j), Chunk("o", j))
    relay = b.programs[1]
    recvs = [k for k, op in enumerate(relay) if op.kind == "recv" and op.dst.buffer == "s"]
    assert [relay[k].dst.index for k in recvs] == [5 + j % RELAY_SLOTS for j in range(pieces)]  # type: ignore[union-attr]
    for j, k in enumerate(recvs):
        # a slot is refilled once its previous message has gone on, and waits for nothing else
        before = recvs[j - RELAY_SLOTS] if j >= RELAY_SLOTS else None
        assert relay[k].deps == (() if before is None else (before, before + 1))
        assert relay[k + 1].deps == (k,)
    schedule = b.build("test")
    assert schedule.scratch_chunks == 5 + RELAY_SLOTS
    verify(schedule)


def test_relay_buffers_grow_for_larger_messages_and_are_kept_per_channel() -> None:
    b = ScheduleBuilder("allgather", 3, 4, 12, relay=line_relay)
    for r in range(3):
        b.copy(r, Chunk("i", 0, 4), Chunk("o", 4 * r, 4))
    b.transfer(0, 2, Chunk("o", 0), Chunk("o", 0), channel=0)
    b.transfer(0, 2, Chunk("o", 1, 3), Chunk("o", 1, 3), channel=0)  # three chunks: a new, larger buffer
    b.transfer(2, 0, Chunk("o", 8, 4), Chunk("o", 8, 4), channel=1)  # a buffer of its own
    slots = [op.dst for op in b.programs[1] if op.kind == "recv"]
    assert slots == [Chunk("s", 0), Chunk("s", RELAY_SLOTS, 3), Chunk("s", 4 * RELAY_SLOTS, 4)]
    for r, j in ((0, 1), (1, 0), (1, 2), (2, 1)):
        b.transfer(r, j, Chunk("o", 4 * r, 4), Chunk("o", 4 * r, 4))
    schedule = b.build("test")
    assert schedule.scratch_chunks == 8 * RELAY_SLOTS
    verify(schedule)


def test_relay_buffers_are_kept_per_onward_rank() -> None:
    # rank 1 relays rank 0's pieces to ranks 2 and 3: a piece for 3 never waits for a slot a piece for 2 holds
    def hub(a: int, b: int) -> tuple[int, ...]:
        return () if 1 in (a, b) else (1,)

    pieces = RELAY_SLOTS + 2
    b = ScheduleBuilder("broadcast", 4, pieces, pieces, relay=hub)
    b.copy(0, Chunk("i", 0, pieces), Chunk("o", 0, pieces))
    for j in range(pieces):
        for dst in (2, 3):
            b.transfer(0, dst, Chunk("o", j), Chunk("o", j))
    b.transfer(0, 1, Chunk("o", 0, pieces), Chunk("o", 0, pieces))
    relay = b.programs[1]
    recvs = {dst: [k for k, op in enumerate(relay) if op.kind == "recv" and op.dst.buffer == "s"
                  and relay[k + 1].peer == dst]
             for dst in (2, 3)}
    slots = {dst: [relay[k].dst.index for k in ks] for dst, ks in recvs.items()}  # type: ignore[union-attr]
    assert set(slots[2]) == set(range(RELAY_SLOTS))
    assert set(slots[3]) == set(range(RELAY_SLOTS, 2 * RELAY_SLOTS))
    for ks in recvs.values():
        for j, k in enumerate(ks):
            before = ks[j - RELAY_SLOTS] if j >= RELAY_SLOTS else None
            assert relay[k].deps == (() if before is None else (before, before + 1))
    verify(b.build("test"))


def test_build_records_metadata_and_defaults_root() -> None:
    b = ScheduleBuilder("Broadcast", 3, 1, 1)
    schedule = b.build("chain", {"pipeline": 2}, topology="t.yaml", size_bytes=64)
    assert schedule.collective == "broadcast"
    assert schedule.root == 0
    assert schedule.metadata.algorithm == "chain"
    assert dict(schedule.metadata.options) == {"pipeline": 2}
    assert (schedule.metadata.topology, schedule.metadata.size_bytes) == ("t.yaml", 64)
    assert isinstance(schedule.programs, tuple) and all(isinstance(p, tuple) for p in schedule.programs)


@pytest.mark.parametrize("name", sorted(CONSTRUCTIONS))
@pytest.mark.parametrize("k", [1, 2])
def test_constructions_verify(name: str, k: int) -> None:
    for p in (2, 3, 5):
        schedule = CONSTRUCTIONS[name](p, k)
        report = verify(schedule)
        assert report.operations == schedule.op_count
        assert report.ranks == p
