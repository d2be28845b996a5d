"""The lowering into NCCL groups: pipelining kept, groups counted, schedules it cannot lower refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.lowering import Lowering, chunks_per_round_for, lower, message_keys
from topocc.runtime.schedule import Chunk, build_schedule, operation

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("runtime_test_schedules", HERE / "mpi_scripts" / "schedules.py")
assert _spec is not None and _spec.loader is not None
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)

UNBOUNDED = 1 << 30  # chunks per round: plain as-soon-as-possible rounds (lock-step)


def steps_per_group(lowering: Lowering, schedule: object, rank: int) -> list[set[int]]:
    program = schedule.programs[rank]  # type: ignore[attr-defined]
    return [{program[k].step for k in g.p2p} for g in lowering.ranks[rank].groups if g.p2p]


@pytest.mark.parametrize(("p", "q"), [(4, 1), (4, 8), (8, 16)])
def test_ring_moves_one_piece_per_round_instead_of_one_step(p: int, q: int) -> None:
    """A pipelined ring of p ranks and q pieces: 2(p-1) steps of q messages each way on one stream."""
    schedule = S.ring_allreduce(p, q)
    steps = 2 * (p - 1)
    piecewise = lower(schedule, 1)
    lockstep = lower(schedule, UNBOUNDED)
    assert lockstep.max_groups == steps and lockstep.rounds == steps
    assert piecewise.max_groups == steps * q  # every group: one piece out, one piece in
    for rank in range(p):
        groups = [g for g in piecewise.ranks[rank].groups if g.p2p]
        assert all(len(g.p2p) == 2 for g in groups)
        assert 2 * len(groups) + 1 == len(schedule.programs[rank])  # the ops: 2 per group and the first copy
    # four pieces per round: a quarter of the groups, still no step waiting for the whole of the previous one
    assert lower(schedule, 4).max_groups == steps * -(-q // 4)


def test_two_channels_share_a_round() -> None:
    schedule = S.ring_allreduce(4, 8, channels=2)
    assert lower(schedule, 1).max_groups == 6 * 4  # two messages (one per channel) per direction and round


def test_chain_broadcast_becomes_a_wavefront() -> None:
    """Piece j crosses hop h in round h + j: every link busy at once, where lock-step sends the buffer hop by hop."""
    p, q = 5, 8
    schedule = S.chain_broadcast(p, q)
    wave = lower(schedule, 1)
    assert wave.rounds == (p - 1) + (q - 1)
    middle = steps_per_group(wave, schedule, 2)
    assert max(len(s) for s in middle) == 2  # a group holds pieces of two different steps
    lockstep = lower(schedule, UNBOUNDED)
    assert lockstep.rounds == p - 1
    assert all(len(g.p2p) == q for g in lockstep.ranks[0].groups if g.p2p)  # the whole buffer per group
    # in rounds of one piece-time, the wavefront finishes after p + q - 2, lock-step after (p - 1) q
    assert wave.rounds < (p - 1) * q


def test_groups_respect_dependencies_and_pair_order() -> None:
    schedule = S.ring_allreduce(3, 2, channels=2)
    lowering = lower(schedule, 1)
    keys = message_keys(schedule)
    for program, mine in zip(schedule.programs, lowering.ranks):
        position = {}
        for g, group in enumerate(mine.groups):
            for k in group.p2p:
                position[k] = (g, 0)
            for i, k in enumerate(group.local):
                position[k] = (g, 2 + i)
        assert sorted(position) == list(range(len(program)))
        for k, op in enumerate(program):
            for d in op.deps:
                assert (position[d][0], position[d][1] or 1) < position[k]
    for a in range(3):  # NCCL pairs the k-th send with the k-th receive: both ends issue in one order
        b = (a + 1) % 3
        sent = [keys[a][k] for g in lowering.ranks[a].groups for k in g.p2p
                if schedule.programs[a][k].kind == "send" and schedule.programs[a][k].peer == b]
        got = [keys[b][k] for g in lowering.ranks[b].groups for k in g.p2p
               if schedule.programs[b][k].kind != "send" and schedule.programs[b][k].peer == a]
        assert sent == got and len(set(sent)) == len(sent) == 8


def test_chunks_per_round_from_bytes() -> None:
    assert chunks_per_round_for(128 << 10, 512 << 10) == 4
    assert chunks_per_round_for(1 << 20, 512 << 10) == 1  # a message larger than the target goes alone
    assert chunks_per_round_for(0, 512 << 10) == 1


def test_refusals_are_one_line() -> None:
    with pytest.raises(CommunicatorError, match="chunks_per_round must be at least 1"):
        lower(S.ring_allreduce(2), 0)
    unmatched = build_schedule("broadcast", 2, 1, 1, [[operation("send", 1, Chunk("i", 0))], []], root=0)
    with pytest.raises(CommunicatorError, match="message 0 from rank 0 to rank 1 on channel 0 has no partner"):
        lower(unmatched)
    # each rank receives before it sends what the other waits for: a cycle through messages
    cyclic = build_schedule("allgather", 2, 1, 2, [
        [operation("recv", 1 - r, None, Chunk("o", 1 - r)), operation("send", 1 - r, Chunk("o", 1 - r), deps=(0,))]
        for r in range(2)])
    with pytest.raises(CommunicatorError, match="wait on themselves through messages") as info:
        lower(cyclic)
    assert "\n" not in str(info.value)


def test_single_rank_has_only_local_work() -> None:
    schedule = build_schedule("allreduce", 1, 2, 2, [[operation("copy", None, Chunk("i", 0, 2), Chunk("o", 0, 2))]])
    lowering = lower(schedule)
    assert lowering.max_groups == 0 and lowering.ranks[0].groups[0].local == (0,)
