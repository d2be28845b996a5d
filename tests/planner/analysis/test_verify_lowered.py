"""The lowering's proof: every shipped and generated schedule lowers into groups NCCL runs; bad lowerings fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fabrics import grid
from tests.conftest import REPO
from tests.planner.compiler.algorithms.test_baselines import switch_cluster
from tests.runtime.test_mpi import S
from tests.strategies import topologies
from topocc.planner.analysis.verify import verify
from topocc.planner.analysis.verify_lowered import verify_lowering
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError, VerificationError
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology
from topocc.runtime.lowering import Group, Lowering, RankLowering, chunks_per_round_for, lower
from topocc.runtime.schedule import Chunk, Op, Recv, Schedule, Send, build_schedule, load_schedule, operation

SHIPPED = sorted((REPO / "schedules").glob("*.json*"))
ROOTED = ("broadcast", "reduce")


def check(schedule: Schedule, chunks_per_round: int) -> Lowering:
    lowering = lower(schedule, chunks_per_round)
    report = verify_lowering(schedule, lowering)
    assert report.messages == sum(op.kind == "send" for p in schedule.programs for op in p)
    assert report.max_groups == lowering.max_groups
    return lowering


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_schedules_lower_into_groups_nccl_can_run(path: Path) -> None:
    schedule = load_schedule(path)
    size = schedule.metadata.size_bytes or 64 << 20  # the size it was compiled for, and 16x smaller
    caps = {chunks_per_round_for(size / schedule.input_chunks), chunks_per_round_for(size / 16 / schedule.input_chunks)}
    for cap in sorted(caps) if schedule.op_count < 100_000 else [min(caps)]:
        check(schedule, cap)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_the_runtime_test_schedules(ranks: int) -> None:
    """What the MPI and NCCL replays run (tests/runtime/mpi_scripts/schedules.py), at every stream capacity used."""
    for schedule in S.every_collective(ranks).values():
        for cap in (1, 2, 3, 1 << 20):
            check(schedule, cap)


def small_topologies() -> list[Topology]:
    return [switch_cluster(3), switch_cluster(2, hosts=2), grid("torus", (3, 2)).topology()]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_and_collective_on_small_topologies(algorithm: str) -> None:
    entry = ALGORITHMS[algorithm]
    built = 0
    for topology in small_topologies():
        net = Network(topology)
        for collective in entry.collectives:
            for root in (0, topology.size - 1) if collective in ROOTED else (0,):
                try:
                    schedule = entry.load()(net, collective, Options(size_bytes=1 << 20, root=root, pipeline=3))
                except NotApplicableError:
                    continue
                verify(schedule)
                for cap in (1, 2, 1 << 20):
                    check(schedule, cap)
                built += 1
    assert built >= len(entry.collectives)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=topologies(max_hosts=3, max_gpus=3), data=st.data())
def test_random_topologies_and_algorithms(topology: Topology, data: st.DataObject) -> None:
    net = Network(topology)
    algorithm = data.draw(st.sampled_from(("ring", "tree", "halving-doubling", "direct", "hierarchical")))
    entry = ALGORITHMS[algorithm]
    collective = data.draw(st.sampled_from(entry.collectives))
    root = data.draw(st.integers(0, topology.size - 1)) if collective in ROOTED else 0
    options = Options(size_bytes=data.draw(st.sampled_from((1 << 10, 8 << 20))), root=root,
                      pipeline=data.draw(st.sampled_from((None, 1, 3))))
    try:
        schedule = entry.load()(net, collective, options)
    except NotApplicableError:
        return
    check(schedule, data.draw(st.integers(1, 8)))


@st.composite
def transfer_schedules(draw: st.DrawFn) -> Schedule:
    """Random traffic: transfers between random ranks on random channels, dependencies from data hazards.

    Not a collective (the verifier would reject its result), but matched and free of cycles, which is all
    a lowering needs; the builder's global order is one execution, so the schedule cannot deadlock.
    """
    ranks = draw(st.integers(2, 5))
    chunks = draw(st.integers(1, 4))
    b = ScheduleBuilder("allreduce", ranks, chunks, chunks, scratch_chunks=chunks)
    for r in range(ranks):
        b.copy(r, Chunk("i", 0, chunks), Chunk("o", 0, chunks))
    for _ in range(draw(st.integers(1, 25))):
        a = draw(st.integers(0, ranks - 1))
        z = draw(st.integers(0, ranks - 2))
        z += z >= a
        first = draw(st.integers(0, chunks - 1))
        count = draw(st.integers(1, chunks - first))
        src = Chunk(draw(st.sampled_from("os")), first, count)
        dst = Chunk(draw(st.sampled_from("os")), first, count)
        b.transfer(a, z, src, dst, reduce=draw(st.booleans()), channel=draw(st.integers(0, 2)))
        if draw(st.booleans()):
            b.reduce(z, Chunk("s", first, count), Chunk("o", first, count))
    return b.build("random")


@settings(max_examples=150, deadline=None)
@given(schedule=transfer_schedules(), cap=st.integers(1, 6))
def test_random_transfer_schedules(schedule: Schedule, cap: int) -> None:
    check(schedule, cap)


# --------------------------------------------------------------------------- bad lowerings


def exchange() -> Schedule:
    """Two ranks swap one chunk: each sends its input and receives into its output (no dependencies)."""
    programs: list[list[Op]] = [[Send(1 - r, Chunk("i", 0)), Recv(1 - r, Chunk("o", 1 - r))] for r in range(2)]
    return build_schedule("allgather", 2, 1, 2, programs)


def lowering(*ranks: list[Group], cap: int = 1) -> Lowering:
    return Lowering(tuple(RankLowering(tuple(groups)) for groups in ranks), cap)


def fails(schedule: Schedule, lowered: Lowering, *fragments: str, split_safe: bool = True) -> str:
    with pytest.raises(VerificationError) as info:
        verify_lowering(schedule, lowered, split_safe=split_safe)
    text = str(info.value)
    assert "\n" not in text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    return text


def test_send_first_on_both_ranks_deadlocks() -> None:
    """Each rank posts its send alone, then its receive: under rendezvous both wait forever."""
    bad = lowering([Group(1, (0,), ()), Group(2, (1,), ())], [Group(1, (0,), ()), Group(2, (1,), ())])
    text = fails(exchange(), bad, "deadlock under NCCL's group semantics: cycle of 2 waits", split_safe=False)
    assert "rank 0 in group 0 waits for rank 1: rank 0 op 0 (send to rank 1) meets rank 1 op 1 (recv from rank 0) " \
           "in its group 1, but rank 1 is in group 0" in text
    # the same messages in one group each: fine
    verify_lowering(exchange(), lowering([Group(1, (0, 1), ())], [Group(1, (0, 1), ())]))


def test_a_ring_posting_sends_before_receives_deadlocks() -> None:
    """Three ranks each post their send to the next in a group before their receive: a cycle of three waits."""
    programs: list[list[Op]] = [[Send((r + 1) % 3, Chunk("i", 0)), Recv((r - 1) % 3, Chunk("o", (r - 1) % 3))]
                                for r in range(3)]
    schedule = build_schedule("allgather", 3, 1, 3, programs)
    bad = lowering(*[[Group(1, (0,), ()), Group(2, (1,), ())] for _ in range(3)])
    text = fails(schedule, bad, "deadlock", "cycle of 3 waits", split_safe=False)
    for r in range(3):
        assert f"rank {r} in group 0 waits for rank {(r + 1) % 3}" in text
    # receiving first on one rank breaks the cycle
    verify_lowering(schedule, lowering([Group(1, (1,), ()), Group(2, (0,), ())],
                                       *[[Group(1, (0,), ()), Group(2, (1,), ())] for _ in range(2)]),
                    split_safe=False)
    check(schedule, 1)


def test_dependency_order_is_checked() -> None:
    schedule = build_schedule("broadcast", 3, 1, 1, [
        [operation("copy", None, Chunk("i", 0), Chunk("o", 0)), operation("send", 1, Chunk("o", 0), deps=(0,))],
        [operation("recv", 0, None, Chunk("o", 0)), operation("send", 2, Chunk("o", 0), deps=(0,))],
        [operation("recv", 1, None, Chunk("o", 0))],
    ], root=0)
    verify(schedule)
    good = lower(schedule)
    verify_lowering(schedule, good)
    # rank 1 forwards in the group that receives: the send would read o[0] before it arrives
    bad = lowering(list(good.ranks[0].groups), [Group(1, (0, 1), ())], list(good.ranks[2].groups))
    fails(schedule, bad, "rank 1 op 1 (send to rank 2) in group 0 runs before its dependency rank 1 op 0 "
                         "(recv from rank 0) in group 0 has completed")
    # rank 0 sends in the group before the copy that fills o[0]
    bad = lowering([Group(1, (1,), (0,))], list(good.ranks[1].groups), list(good.ranks[2].groups))
    fails(schedule, bad, "rank 0 op 1 (send to rank 1) in group 0 runs before its dependency rank 0 op 0 (copy)")


def test_pair_order_must_mirror_the_schedules_matching() -> None:
    """Two messages on two channels: NCCL has one queue per pair, so both ends must issue them in one order."""
    programs = [
        [operation("send", 1, Chunk("i", 0), channel=0), operation("send", 1, Chunk("i", 1), channel=1)],
        [operation("recv", 0, None, Chunk("o", 1), channel=1), operation("recv", 0, None, Chunk("o", 0), channel=0)],
    ]
    schedule = build_schedule("broadcast", 2, 2, 2, programs, root=0)
    fails(schedule, lowering([Group(1, (0, 1), ())], [Group(1, (0, 1), ())]),
          "rank 0's send number 0 to rank 1, rank 0 op 0 (send to rank 1), meets rank 1 op 0 (recv from rank 0 ch 1)")
    verify_lowering(schedule, lowering([Group(1, (0, 1), ())], [Group(1, (1, 0), ())]))
    check(schedule, 1)


def test_unaligned_groups_are_refused_where_nccl_may_split_them() -> None:
    """Whole groups would run, but NCCL may cut rank 1's group of two and deadlock: refused unless told otherwise."""
    programs = [
        [operation("send", 1, Chunk("i", 0)), operation("send", 1, Chunk("i", 1))],
        [operation("recv", 0, None, Chunk("o", 0)), operation("recv", 0, None, Chunk("o", 1))],
    ]
    schedule = build_schedule("broadcast", 2, 2, 2, programs, root=0)
    unaligned = lowering([Group(1, (0,), ()), Group(2, (1,), ())], [Group(1, (0, 1), ())])
    verify_lowering(schedule, unaligned, split_safe=False)
    fails(schedule, unaligned, "rank 0 op 1 (send to rank 1) is in round 2 but its receive rank 1 op 1 "
                               "(recv from rank 0) in round 1")


def test_coverage_is_checked() -> None:
    s = exchange()
    fails(s, lowering([Group(1, (0,), ())], [Group(1, (0, 1), ())]), "rank 0 op 1 (recv from rank 1) is in no group")
    fails(s, lowering([Group(1, (0, 1), ()), Group(2, (1,), ())], [Group(1, (0, 1), ())]),
          "rank 0 op 1 (recv from rank 1) appears twice (groups 0 and 1)")
    fails(s, lowering([Group(1, (0,), (1,))], [Group(1, (0, 1), ())]), "is among group 0's local operations")
    fails(s, lowering([Group(2, (0, 1), ()), Group(1, (), ())], [Group(1, (0, 1), ())]),
          "rank 0 group 1 has round 1 after round 2")
    fails(s, lowering([Group(1, (0, 1), ())]), "the lowering has 1 ranks, the schedule 2")
