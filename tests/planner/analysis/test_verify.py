"""The verifier: correct schedules pass for every collective and size; each failure mode has a precise message."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.planner.compiler.test_builder import (
    CONSTRUCTIONS,
    chain_broadcast_schedule,
    direct_allreduce_schedule,
    ring_allreduce_schedule,
)
from topocc.planner.analysis.collectives import spec
from topocc.planner.analysis.verify import VerifyReport, _check_structure, _merged, _Runs, verify
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.errors import TopoccError, VerificationError
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.schedule import OP_RULES, Chunk, Op, Schedule, _parse_op, _Reader, build_schedule, operation

# --------------------------------------------------------------------------- helpers


def send(peer: int, buf: str, index: int, count: int = 1, *, deps: Sequence[int] = (), ch: int = 0) -> Op:
    return operation("send", peer, Chunk(buf, index, count), None, tuple(deps), 0, ch)


def recv(peer: int, buf: str, index: int, count: int = 1, *, deps: Sequence[int] = (), ch: int = 0,
         reduce: bool = False, src: Chunk | None = None) -> Op:
    kind = "recv_reduce" if reduce else "recv"
    return operation(kind, peer, src, Chunk(buf, index, count), tuple(deps), 0, ch)


def copy(src: Chunk, dst: Chunk, *, deps: Sequence[int] = ()) -> Op:
    return operation("copy", None, src, dst, tuple(deps))


def reduce(src: Chunk, dst: Chunk, *, deps: Sequence[int] = ()) -> Op:
    return operation("reduce", None, src, dst, tuple(deps))


def schedule(collective: str, ranks: int, n_in: int, n_out: int, programs: Sequence[Sequence[Op]],
             **kw: object) -> Schedule:
    return build_schedule(collective, ranks, n_in, n_out, programs, **kw)  # type: ignore[arg-type]


def fails(s: Schedule, *fragments: str) -> str:
    """Assert that ``s`` fails verification with a one-line message containing every fragment."""
    with pytest.raises(VerificationError) as info:
        verify(s)
    text = str(info.value)
    assert "\n" not in text
    assert text == info.value.one_line()
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    return text


def two_rank_allreduce(rank1: Sequence[Op] | None = None, rank0: Sequence[Op] | None = None, **kw: object
                       ) -> Schedule:
    """A correct 2-rank, 1-chunk allreduce (exchange and reduce), with either program replaceable."""
    good = [
        copy(Chunk("i", 0), Chunk("o", 0)),
        send(1 - 0, "i", 0),
        recv(1, "o", 0, reduce=True, deps=[0]),
    ]
    good1 = [
        copy(Chunk("i", 0), Chunk("o", 0)),
        send(0, "i", 0),
        recv(0, "o", 0, reduce=True, deps=[0]),
    ]
    return schedule("allreduce", 2, 1, 1, [rank0 if rank0 is not None else good,
                                            rank1 if rank1 is not None else good1], **kw)


# --------------------------------------------------------------------------- correct schedules


@pytest.mark.parametrize("name", sorted(CONSTRUCTIONS))
def test_every_collective_verifies_for_2_to_9_ranks(name: str) -> None:
    for p in range(2, 10):
        s = CONSTRUCTIONS[name](p, 1)
        report = verify(s)
        assert isinstance(report, VerifyReport)
        assert (report.collective, report.ranks, report.operations) == (s.collective, p, s.op_count)


def test_handwritten_two_rank_allreduce_verifies() -> None:
    report = verify(two_rank_allreduce())
    assert (report.messages, report.chunks_sent, report.operations) == (2, 2, 6)


def test_report_counts_messages_and_chunks_with_counted_references() -> None:
    p, k = 4, 3
    report = verify(ring_allreduce_schedule(p, k))
    assert report.messages == 2 * p * (p - 1)
    assert report.chunks_sent == 2 * p * (p - 1) * k


def test_single_rank_schedule_verifies() -> None:
    s = schedule("allreduce", 1, 2, 2, [[copy(Chunk("i", 0, 2), Chunk("o", 0, 2))]])
    assert verify(s).messages == 0


def test_reduce_to_root_leaves_other_outputs_unspecified() -> None:
    # rank 0 writes garbage (its own input) to its output: allowed, only the root's output counts
    s = schedule("reduce", 2, 1, 1, [[copy(Chunk("i", 0), Chunk("o", 0)), send(1, "i", 0)],
                                     [recv(0, "o", 0, reduce=True, src=Chunk("i", 0))]], root=1)
    verify(s)


# --------------------------------------------------------------------------- matching


def test_unmatched_send_names_pair_counts_and_first_unpartnered_op() -> None:
    s = two_rank_allreduce(rank1=[copy(Chunk("i", 0), Chunk("o", 0)), send(0, "i", 0)])
    fails(s, "unmatched message: rank 0 sends 1 message(s) to rank 1 but rank 1 receives 0 from rank 0",
          "the first without a partner is rank 0 op 1 (send to rank 1 i[0])")


def test_extra_receive_is_unmatched() -> None:
    s = two_rank_allreduce(rank1=[copy(Chunk("i", 0), Chunk("o", 0)), send(0, "i", 0),
                                  recv(0, "o", 0, reduce=True, deps=[0]), recv(0, "s", 0)], scratch_chunks=1)
    fails(s, "rank 0 sends 1 message(s) to rank 1 but rank 1 receives 2 from rank 0",
          "first without a partner is rank 1 op 3 (recv from rank 0 s[0])")


def test_send_and_receive_on_different_channels_do_not_match() -> None:
    s = two_rank_allreduce(rank0=[copy(Chunk("i", 0), Chunk("o", 0)), send(1, "i", 0, ch=1),
                                  recv(1, "o", 0, reduce=True, deps=[0])])
    fails(s, "rank 0 sends 0 message(s) to rank 1 but rank 1 receives 1 from rank 0",
          "per channel, rank 0 sends/rank 1 receives: ch 0: 0/1, ch 1: 1/0")


def test_chunk_count_mismatch_between_send_and_its_receive() -> None:
    s = schedule("allreduce", 2, 2, 2, [
        [copy(Chunk("i", 0, 2), Chunk("o", 0, 2)), send(1, "o", 0, 2, deps=[0])],
        [recv(0, "o", 0)],
    ])
    fails(s, "rank 0 op 1 (send to rank 1 o[0:2]) sends 2 chunk(s) but its matching receive "
             "rank 1 op 0 (recv from rank 0 o[0]) receives 1")


def test_fifo_matching_per_channel() -> None:
    """Two messages on separate channels may be received in either order; on one channel they may not."""

    def build(ch_a: int, ch_b: int) -> Schedule:
        return schedule("broadcast", 2, 2, 2, [
            [copy(Chunk("i", 0, 2), Chunk("o", 0, 2)), send(1, "o", 0, deps=[0], ch=ch_a),
             send(1, "o", 1, deps=[0], ch=ch_b)],
            [recv(0, "o", 1, ch=ch_b), recv(0, "o", 0, ch=ch_a)],
        ], root=0)

    verify(build(0, 1))
    verify(build(3, 7))
    fails(build(0, 0), "rank 1 output chunk 0: holds logical chunk 1 instead of logical chunk 0")


def test_two_channel_ring_and_counted_chunks_verify() -> None:
    verify(ring_allreduce_schedule(5, 2, channels=2))
    verify(ring_allreduce_schedule(4, 3, channels=3))


# --------------------------------------------------------------------------- deadlock


def test_deadlock_two_ranks_receive_first() -> None:
    progs = [[copy(Chunk("i", 0), Chunk("s", 0)), recv(1 - r, "o", 0), send(1 - r, "s", 0, deps=[0, 1])]
             for r in range(2)]
    text = fails(schedule("allreduce", 2, 1, 1, progs, scratch_chunks=1), "deadlock: cycle of 4 waits")
    assert "rank 0 op 1 (recv from rank 1 o[0]) waits for its partner rank 1 op 2 (send to rank 0 s[0])" in text
    assert "rank 1 op 2 (send to rank 0 s[0]) waits for its dependency rank 1 op 1" in text


def test_deadlock_cycle_over_three_ranks() -> None:
    progs = []
    for r in range(3):
        progs.append([recv((r - 1) % 3, "o", 0), send((r + 1) % 3, "o", 0, deps=[0])])
    text = fails(schedule("broadcast", 3, 1, 1, progs, root=0), "deadlock: cycle of 6 waits")
    for r in range(3):
        assert f"rank {r} op 0 (recv from rank {(r - 1) % 3} o[0]) waits for its partner" in text


def test_rendezvous_deadlock_when_both_send_first() -> None:
    """Under rendezvous semantics a send completes only with its receive: both ranks block in send."""
    progs = [[send(1 - r, "i", 0), recv(1 - r, "o", 0, deps=[0])] for r in range(2)]
    fails(schedule("allgather", 2, 1, 2, progs), "deadlock")
    # without the dependency the receive is posted concurrently, and it is no deadlock (only a wrong result)
    progs = [[send(1 - r, "i", 0), recv(1 - r, "o", 1 - r)] for r in range(2)]
    fails(schedule("allgather", 2, 1, 2, progs), "output chunk", "never written")


def test_fifo_queue_posting_order_can_deadlock() -> None:
    """A later send on a (peer, channel) queue cannot overtake an earlier one that is still waiting."""
    progs = [
        [recv(1, "s", 0, ch=1), send(1, "s", 0, deps=[0]), send(1, "i", 0)],
        [recv(0, "o", 0), recv(0, "o", 1), send(0, "i", 0, deps=[1], ch=1)],
    ]
    text = fails(schedule("allgather", 2, 1, 2, progs, scratch_chunks=1), "deadlock: cycle of")
    assert "waits for the earlier one of its FIFO queue to be posted rank 0 op 1" in text


# --------------------------------------------------------------------------- values


def test_double_counted_contribution_in_recv_reduce() -> None:
    s = schedule("allreduce", 2, 1, 1, [
        [copy(Chunk("i", 0), Chunk("o", 0)), send(1, "i", 0), send(1, "i", 0),
         recv(1, "o", 0, reduce=True, deps=[0])],
        [copy(Chunk("i", 0), Chunk("o", 0)), send(0, "i", 0),
         recv(0, "o", 0, reduce=True, deps=[0]), recv(0, "o", 0, reduce=True, deps=[2])],
    ])
    fails(s, "rank 1 op 3 (recv_reduce from rank 0 o[0]) counts the contribution of rank(s) 0 twice (at o[0])")


def test_double_counted_contribution_in_local_reduce() -> None:
    s = two_rank_allreduce(rank1=[copy(Chunk("i", 0), Chunk("o", 0)), send(0, "i", 0),
                                  recv(0, "o", 0, reduce=True, deps=[0]),
                                  reduce(Chunk("i", 0), Chunk("o", 0), deps=[2])])
    fails(s, "rank 1 op 3 (reduce i[0] o[0]) counts the contribution of rank(s) 1 twice")


def test_missing_contribution() -> None:
    # 3 ranks: rank 2 receives the sum of 0 and 1 and forwards it back, but never adds its own data
    s = schedule("allreduce", 3, 1, 1, [
        [send(1, "i", 0), recv(2, "o", 0)],
        [recv(0, "o", 0, reduce=True, src=Chunk("i", 0)), send(2, "o", 0, deps=[0])],
        [recv(1, "o", 0), send(0, "o", 0, deps=[0])],
    ])
    fails(s, "rank 0 output chunk 0: lacks the contribution of rank(s) 2")


def test_missing_and_extra_contributions_in_one_message() -> None:
    s = schedule("reduce", 2, 1, 1, [
        [copy(Chunk("i", 0), Chunk("o", 0))],
        [copy(Chunk("i", 0), Chunk("o", 0))],
    ], root=0)
    fails(s, "rank 0 output chunk 0: lacks the contribution of rank(s) 1")


def test_reducing_different_logical_chunks() -> None:
    s = schedule("allreduce", 2, 2, 2, [
        [copy(Chunk("i", 0, 2), Chunk("o", 0, 2)), send(1, "i", 1)],
        [recv(0, "o", 0, reduce=True, src=Chunk("i", 0))],
    ])
    fails(s, "rank 1 op 0 (recv_reduce from rank 0 i[0] o[0]) reduces logical chunk 1 into logical chunk 0")


def test_reduction_error_inside_a_message_of_several_runs_names_its_chunk() -> None:
    # rank 1 holds o[0:2] from rank 0 (mask {0}) and o[2:4] as its own copy (mask {1}); adding rank 1's
    # input over all four counts rank 1 twice from chunk 2 on, the first chunk of the second run
    s = schedule("allreduce", 2, 4, 4, [
        [send(1, "i", 0, 2)],
        [recv(0, "o", 0, 2), copy(Chunk("i", 2, 2), Chunk("o", 2, 2)),
         reduce(Chunk("i", 0, 4), Chunk("o", 0, 4), deps=[0, 1])],
    ])
    fails(s, "rank 1 op 2 (reduce i[0:4] o[0:4]) counts the contribution of rank(s) 1 twice (at o[2])")


def test_reduce_into_unwritten_chunk() -> None:
    s = two_rank_allreduce(rank1=[send(0, "i", 0), recv(0, "o", 0, reduce=True)])
    fails(s, "rank 1 op 1 (recv_reduce from rank 0 o[0]) reduces into o[0], which holds no data yet")


def test_reading_uninitialised_scratch() -> None:
    s = schedule("allreduce", 2, 1, 1, [
        [copy(Chunk("i", 0), Chunk("o", 0)), send(1, "s", 0), recv(1, "o", 0, reduce=True, deps=[0])],
        [copy(Chunk("i", 0), Chunk("o", 0)), send(0, "i", 0), recv(0, "o", 0, reduce=True, deps=[0])],
    ], scratch_chunks=1)
    fails(s, "rank 0 op 1 (send to rank 1 s[0]) reads s[0], which holds no data yet")


def test_uninitialised_read_names_the_chunk_inside_a_counted_reference() -> None:
    s = schedule("allreduce", 1, 3, 3, [[
        copy(Chunk("i", 0, 2), Chunk("s", 0, 2)),
        copy(Chunk("s", 0, 3), Chunk("o", 0, 3), deps=[0]),
    ]], scratch_chunks=3)
    fails(s, "rank 0 op 1 (copy s[0:3] o[0:3]) reads s[2], which holds no data yet")


def test_allgather_chunk_from_the_wrong_rank() -> None:
    # rank 1 swaps the blocks: its own chunk into block 0, rank 0's into block 1
    s = schedule("allgather", 2, 1, 2, [
        [copy(Chunk("i", 0), Chunk("o", 0)), send(1, "i", 0), recv(1, "o", 1)],
        [copy(Chunk("i", 0), Chunk("o", 0)), send(0, "i", 0), recv(0, "o", 1)],
    ])
    fails(s, "rank 1 output chunk 0: holds input chunk 0 of rank 1 instead of input chunk 0 of rank 0")


def test_broadcast_output_not_from_root() -> None:
    s = chain_broadcast_schedule(3, root=2)
    # rank 0 overwrites what it received with its own input
    prog = [*s.programs[0], copy(Chunk("i", 0), Chunk("o", 0), deps=range(len(s.programs[0])))]
    bad = schedule("broadcast", 3, 2, 2, [prog, s.programs[1], s.programs[2]], root=2)
    fails(bad, "rank 0 output chunk 0: holds data from rank(s) 0 instead of the root's (rank 2)")


def test_alltoall_block_in_the_wrong_place() -> None:
    s = schedule("alltoall", 2, 2, 2, [
        [copy(Chunk("i", 0), Chunk("o", 0)), send(1, "i", 1), recv(1, "o", 1)],
        [copy(Chunk("i", 1), Chunk("o", 1)), send(0, "i", 1), recv(0, "o", 0)],
    ])
    fails(s, "rank 0 output chunk 1: holds input chunk 1 of rank 1 instead of input chunk 0 of rank 1")


def test_output_never_written() -> None:
    s = two_rank_allreduce(rank1=[send(0, "i", 0), recv(0, "s", 0, reduce=False)], scratch_chunks=1)
    fails(s, "rank 1 output chunk 0: never written")


# --------------------------------------------------------------------------- races and buffers


def test_race_write_without_dependency_on_earlier_read() -> None:
    s = two_rank_allreduce(rank0=[copy(Chunk("i", 0), Chunk("o", 0)), send(1, "o", 0, deps=[0]),
                                  recv(1, "o", 0, reduce=True, deps=[0])])
    fails(s, "data race on o[0]: rank 0 op 2 (recv_reduce from rank 1 o[0]) overwrites a chunk that "
             "rank 0 op 1 (send to rank 1 o[0]) reads, without depending on it", "fix: add 1 to the deps of op 2")


def test_race_read_without_dependency_on_earlier_write() -> None:
    s = two_rank_allreduce(rank0=[copy(Chunk("i", 0), Chunk("o", 0)), send(1, "o", 0),
                                  recv(1, "o", 0, reduce=True, deps=[0, 1])])
    fails(s, "data race on o[0]: rank 0 op 1 (send to rank 1 o[0]) reads a chunk that rank 0 op 0")


def test_race_write_after_write() -> None:
    s = two_rank_allreduce(rank0=[copy(Chunk("i", 0), Chunk("o", 0)), send(1, "i", 0),
                                  recv(1, "o", 0, reduce=False)])
    fails(s, "data race on o[0]: rank 0 op 2 (recv from rank 1 o[0]) writes a chunk that rank 0 op 0")


def test_transitive_dependencies_order_accesses() -> None:
    s = schedule("allreduce", 1, 1, 1, [[
        copy(Chunk("i", 0), Chunk("s", 0)),
        copy(Chunk("s", 0), Chunk("s", 1), deps=[0]),
        copy(Chunk("s", 1), Chunk("o", 0), deps=[1]),
        copy(Chunk("i", 0), Chunk("s", 0), deps=[2]),  # rewrites s[0]: ordered after op 1's read via op 2
    ]], scratch_chunks=2)
    verify(s)


def test_race_inside_counted_reference_names_the_chunk() -> None:
    s = schedule("allreduce", 1, 3, 3, [[
        copy(Chunk("i", 0, 3), Chunk("o", 0, 3)),
        copy(Chunk("i", 0), Chunk("o", 2)),
    ]])
    fails(s, "data race on o[2]")


def test_writing_the_input_of_an_out_of_place_schedule() -> None:
    s = two_rank_allreduce(rank1=[copy(Chunk("i", 0), Chunk("o", 0)), send(0, "i", 0),
                                  recv(0, "i", 0, reduce=True, deps=[1])])
    fails(s, "rank 1 op 2 (recv_reduce from rank 0 i[0]) writes the input buffer of an out-of-place collective",
          "mark the schedule inplace")


# --------------------------------------------------------------------------- in-place aliasing (NCCL conventions)


def _inplace_allgather(p: int, k: int, *, own: str) -> Schedule:
    """Rank r sends its block to every other rank, reading it as ``own`` ("i": i[j]; "o": o[r*k+j])."""
    progs = []
    for r in range(p):
        prog = []
        for q in range(p):
            if q != r:
                ref = Chunk("i", 0, k) if own == "i" else Chunk("o", r * k, k)
                prog.append(send(q, ref.buffer, ref.index, k))
                prog.append(recv(q, "o", q * k, k))
        progs.append(prog)
    return schedule("allgather", p, k, p * k, progs, inplace=True)


def test_inplace_allgather_input_chunk_j_is_output_chunk_rank_k_plus_j() -> None:
    verify(_inplace_allgather(3, 2, own="i"))
    verify(_inplace_allgather(3, 2, own="o"))
    # out of place, the output block of the rank itself is never written
    s = _inplace_allgather(3, 2, own="o")
    fails(Schedule(s.collective, s.ranks, s.input_chunks, s.output_chunks, s.programs),
          "reads o[", "which holds no data yet")


def test_inplace_allgather_wrong_alias_convention_fails() -> None:
    # rank 1 believes its input sits at o[0:k] (it sits at o[k:2k]): o[0] is what it receives from rank 0
    progs = [[send(1, "i", 0), recv(1, "o", 1)], [send(0, "o", 0), recv(0, "o", 0)]]
    fails(schedule("allgather", 2, 1, 2, progs, inplace=True), "data race")
    progs = [[send(1, "i", 0), recv(1, "o", 1)], [recv(0, "o", 0), send(0, "o", 0, deps=[0])]]
    fails(schedule("allgather", 2, 1, 2, progs, inplace=True),
          "rank 0 output chunk 1: holds input chunk 0 of rank 0 instead of input chunk 0 of rank 1")


def test_inplace_race_detected_through_alias() -> None:
    # on rank 1, i[0] and o[1] are one chunk: receiving into o[1] while sending i[0] is a race
    progs = [[send(1, "i", 0), recv(1, "o", 1)], [send(0, "i", 0), recv(0, "o", 0), recv(0, "o", 1)]]
    s = schedule("allgather", 2, 1, 2, [progs[0] + [send(1, "i", 0)], progs[1]], inplace=True)
    fails(s, "data race on o[1]: rank 1 op 2 (recv from rank 0 o[1]) overwrites a chunk that rank 1 op 0 "
             "(send to rank 0 i[0]) reads")


def test_inplace_reducescatter_output_chunk_j_is_input_chunk_rank_k_plus_j() -> None:
    # 2 ranks, 1 chunk each: rank r sends i[1-r]; the receiver reduces into its own block
    for dst in ("o0", "ir"):
        progs = []
        for r in range(2):
            target = Chunk("o", 0) if dst == "o0" else Chunk("i", r)
            progs.append([send(1 - r, "i", 1 - r), recv(1 - r, target.buffer, target.index, reduce=True)])
        verify(schedule("reducescatter", 2, 2, 1, progs, inplace=True))
    # the wrong convention (output chunk j is input chunk j on every rank) reduces rank 1's data into chunk 0
    progs = [[send(1, "i", 1), recv(1, "i", 0, reduce=True)], [send(0, "i", 0), recv(0, "i", 0, reduce=True, deps=[0])]]
    fails(schedule("reducescatter", 2, 2, 1, progs, inplace=True),
          "rank 1 op 1 (recv_reduce from rank 0 i[0]) reduces logical chunk 1 into logical chunk 0")


def test_inplace_allreduce_input_is_output() -> None:
    verify(ring_allreduce_schedule(4, inplace=True))
    progs = [[send(1 - r, "o", 0), recv(1 - r, "s", 0), reduce(Chunk("s", 0), Chunk("i", 0), deps=[0, 1])]
             for r in range(2)]
    verify(schedule("allreduce", 2, 1, 1, progs, inplace=True, scratch_chunks=1))
    # the same program out of place writes the input buffer
    fails(schedule("allreduce", 2, 1, 1, progs, scratch_chunks=1),
          "rank 0 op 2 (reduce s[0] i[0]) writes the input buffer of an out-of-place collective")


# --------------------------------------------------------------------------- structure of in-memory schedules


@pytest.mark.parametrize(("programs", "fragment"), [
    ([[send(0, "i", 0)], []], "rank 0 op 0: invalid peer 0 for a send"),
    ([[send(5, "i", 0)], []], "invalid peer 5"),
    ([[copy(Chunk("i", 0), Chunk("o", 1))], []], "chunk reference o[1] out of range (buffer 'o' has 1 chunks)"),
    ([[copy(Chunk("i", -1), Chunk("o", 0))], []], "out of range"),
    ([[copy(Chunk("x", 0), Chunk("o", 0))], []], "chunk reference x[0] out of range"),
    ([[copy(Chunk("i", 0), Chunk("s", 0))], []], "buffer 's' has 0 chunks"),
    ([[operation("copy", None, Chunk("i", 0, 1), Chunk("o", 0, 2))], []], "out of range"),
    ([[copy(Chunk("i", 0), Chunk("o", 0), deps=[0])], []], "rank 0 op 0: dependency 0 does not name an earlier"),
    ([[copy(Chunk("i", 0), Chunk("o", 0), deps=[-1])], []], "dependency -1"),
    ([[]], "1 programs for 2 ranks"),
])
def test_structure_checks_for_in_memory_schedules(programs: list[list[Op]], fragment: str) -> None:
    fails(schedule("allreduce", 2, 1, 1, programs), fragment)


@pytest.mark.parametrize(("kind", "peer", "src", "dst"), [
    ("jump", None, None, None),
    ("send", None, Chunk("i", 0), None),
    ("copy", 1, Chunk("i", 0), Chunk("o", 0)),
    ("copy", None, Chunk("i", 0), None),
    ("send", 1, Chunk("i", 0), Chunk("o", 0)),
    ("recv", 1, Chunk("i", 0), Chunk("o", 0)),
])
def test_an_operation_holds_only_what_its_kind_has(kind: str, peer: int | None, src: Chunk | None,
                                                   dst: Chunk | None) -> None:
    """No operation of a schedule lacks a field its kind needs or holds one it does not take."""
    with pytest.raises(ValueError, match=f"no '{kind}' operation has"):
        operation(kind, peer, src, dst)


def test_the_loader_and_the_verifier_refuse_the_same_operations() -> None:
    """Both check an operation by its kind's rule (OP_RULES): every kind with every peer (none, itself, another
    rank, out of range) and every pair of chunk references (none, one chunk, two) is refused by both or by
    neither; what no operation can hold (a field its kind lacks or does not take) the loader refuses too."""
    refs = (None, Chunk("i", 0), Chunk("i", 0, 2))
    outs = (None, Chunk("o", 0), Chunk("o", 0, 2))
    accepted = 0
    for kind, peer, src, dst in itertools.product(OP_RULES, (None, 0, 1, 2), refs, outs):
        doc: dict[str, object] = {"op": kind, "step": 0}
        for key, value in (("peer", peer), ("src", src), ("dst", dst)):
            if isinstance(value, Chunk):
                doc[key] = [value.buffer, value.index, value.count]
            elif value is not None:
                doc[key] = value
        try:
            loaded = _parse_op(_Reader("ops.json"), doc, "op", 0, 0, 2, {"i": 2, "o": 2, "s": 0})
        except ScheduleFormatError:
            loaded = None
        try:
            op = operation(kind, peer, src, dst)
        except ValueError:
            assert loaded is None, loaded
            continue
        s = schedule("allreduce", 2, 2, 2, [[op], []], inplace=True)
        try:
            _check_structure(s, spec("allreduce", 2, 2, 2, None))
            proved = True
        except VerificationError:
            proved = False
        assert (loaded == op) == proved, (op, loaded)
        accepted += proved
    # two of each kind (one chunk or two), and recv_reduce's two more with a src: the checks can accept
    assert accepted == 2 * len(OP_RULES) + 2


def test_op_reads_and_writes_follow_the_rules() -> None:
    a, b = Chunk("i", 0), Chunk("o", 1)
    assert (operation("send", 1, a).reads, operation("send", 1, a).dst) == ((a,), None)
    assert (operation("recv", 1, None, b).reads, operation("recv", 1, None, b).dst) == ((), b)
    assert operation("recv_reduce", 1, None, b).reads == (b,)
    assert operation("recv_reduce", 1, a, b).reads == (a, b)
    assert (operation("copy", None, a, b).reads, operation("copy", None, a, b).dst) == ((a,), b)
    assert operation("reduce", None, a, b).reads == (a, b)


def test_src_and_dst_lengths_must_agree() -> None:
    s = schedule("allreduce", 1, 2, 2, [[operation("copy", None, Chunk("i", 0, 1), Chunk("o", 0, 2))]])
    fails(s, "src and dst lengths differ")


def test_chunking_and_root_rechecked() -> None:
    fails(schedule("allgather", 2, 1, 3, [[], []]), "allgather needs output chunks = ranks x input chunks")
    fails(schedule("broadcast", 2, 1, 1, [[], []], root=2), "root 2 is not a rank of a 2-rank schedule")
    fails(schedule("allreduce", 0, 1, 1, []), "at least one rank")


def test_error_names_collective_and_algorithm_and_is_a_topocc_error() -> None:
    s = two_rank_allreduce(rank1=[]).with_metadata(algorithm="my-algo")
    with pytest.raises(TopoccError) as info:
        verify(s)
    assert str(info.value).startswith("allreduce schedule (my-algo): unmatched message")
    assert info.value.exit_code == 4


# --------------------------------------------------------------------------- scale


_SIZE = 24
_write = st.tuples(st.integers(0, _SIZE - 1), st.lists(
    st.tuples(st.integers(1, 5), st.one_of(st.none(), st.integers(0, 30)), st.sampled_from([1, 2, 3])),
    min_size=1, max_size=4))


@settings(max_examples=200, deadline=None)
@given(st.lists(_write, max_size=30))
def test_runs_hold_what_was_written_as_maximal_runs(writes: list[tuple[int, list[tuple[int, int | None, int]]]],
                                                    ) -> None:
    """The proof's run-length buffer against a list of one value per chunk, after any sequence of writes."""
    runs = _Runs(_SIZE)
    model: list[tuple[int, int] | None] = [None] * _SIZE
    for lo, segments in writes:
        clipped, room = [], _SIZE - lo
        for n, key, mask in segments:
            if min(n, room) > 0:
                clipped.append((min(n, room), key, 0 if key is None else mask))
                room -= min(n, room)
        fit = _merged(clipped)  # maximal, as the verifier's writers give them
        runs.write(lo, fit)
        a = lo
        for n, key, mask in fit:
            model[a:a + n] = [None if key is None else (key + j, mask) for j in range(n)]
            a += n
        whole = runs.read(0, _SIZE)
        assert [None if key is None else (key + j, mask) for n, key, mask in whole for j in range(n)] == model
        assert all(not ((a[1] is None and b[1] is None) or (a[1] is not None and b[1] == a[1] + a[0]
                                                            and a[2] == b[2])) for a, b in itertools.pairwise(whole))
        for lo2 in range(0, _SIZE, 5):
            part = runs.read(lo2, min(_SIZE, lo2 + 7))
            assert [None if k is None else (k + j, m) for n, k, m in part for j in range(n)] == model[lo2:lo2 + 7]


def test_builder_schedule_at_scale_verifies() -> None:
    p = 32
    s = ring_allreduce_schedule(p)
    assert s.op_count == 4 * p * (p - 1)
    assert verify(s).messages == 2 * p * (p - 1)
    verify(direct_allreduce_schedule(12, 2))


def test_many_ops_on_one_rank_race_check() -> None:
    """A long single-rank program (bit-mask ancestry) still verifies, and still finds a late race."""
    n = 3000
    b = ScheduleBuilder("allreduce", 1, 1, 1, scratch_chunks=2)
    b.copy(0, Chunk("i", 0), Chunk("s", 0))
    for j in range(n):
        b.copy(0, Chunk("s", j % 2), Chunk("s", (j + 1) % 2))
    b.copy(0, Chunk("s", n % 2), Chunk("o", 0))
    good = b.build("chain")
    verify(good)
    prog = list(good.programs[0])
    prog[-1] = copy(Chunk("s", n % 2), Chunk("o", 0))  # drops its dependency on the last write of s
    fails(schedule("allreduce", 1, 1, 1, [prog], scratch_chunks=2), f"rank 0 op {n + 1} (copy s[")


def test_verify_restores_garbage_collection_state() -> None:
    s = two_rank_allreduce()
    assert gc.isenabled()
    verify(s)
    assert gc.isenabled()
    with pytest.raises(VerificationError):
        verify(two_rank_allreduce(rank1=[]))
    assert gc.isenabled()
    gc.disable()
    try:
        verify(s)
        assert not gc.isenabled()
    finally:
        gc.enable()
