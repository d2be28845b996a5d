"""Direct: one step, every pair, every collective; rooted variants need only the root's routes."""

from __future__ import annotations

import pytest

from planner.algorithms import Options
from planner.algorithms.direct import direct
from planner.errors import NotApplicableError
from planner.topology import parse_topology_text
from tests.planner.algorithms.test_baselines import check_schedule, switch_cluster

STAR = "\n".join([
    "name: star", "devices:", "  - {name: g, type: gpu, count: 4}", "links:",
    "  - {ends: [g0, g1], bandwidth: 10 GB/s, latency: 1 us}",
    "  - {ends: [g0, g2], bandwidth: 10 GB/s, latency: 1 us}",
    "  - {ends: [g0, g3], bandwidth: 10 GB/s, latency: 1 us}",
])


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather", "alltoall"])
def test_every_rank_talks_to_every_other(collective: str) -> None:
    topology = switch_cluster(5)
    schedule = direct(topology, collective, Options(pipeline=2))
    for rank, program in enumerate(schedule.programs):
        assert {op.peer for op in program if op.kind == "send"} == set(range(5)) - {rank}
    check_schedule(topology, schedule, collective, "direct")


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_rooted_on_a_star_needs_only_the_hub(collective: str) -> None:
    topology = parse_topology_text(STAR)
    check_schedule(topology, direct(topology, collective, Options(root=0)), collective, "direct")
    with pytest.raises(NotApplicableError, match="direct needs a direct route"):
        direct(topology, collective, Options(root=1))


def test_all_pairs_collective_on_a_star_declines() -> None:
    with pytest.raises(NotApplicableError, match="direct needs a direct route from rank 1 to rank 2"):
        direct(parse_topology_text(STAR), "alltoall", Options())
