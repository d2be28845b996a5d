"""Direct: one step, every pair, every collective; pairs without a route relay through other GPUs."""

from __future__ import annotations

import pytest

from tests.planner.compiler.algorithms.test_baselines import check_schedule, switch_cluster
from topocc.planner.compiler.algorithms.direct import direct
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.parse import parse_topology_text

STAR = "\n".join([
    "name: star", "devices:", "  - {name: g, type: gpu, count: 4}", "links:",
    "  - {ends: [g0, g1], bandwidth: 10 GB/s, latency: 1 us}",
    "  - {ends: [g0, g2], bandwidth: 10 GB/s, latency: 1 us}",
    "  - {ends: [g0, g3], bandwidth: 10 GB/s, latency: 1 us}",
])


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather", "alltoall"])
def test_every_rank_talks_to_every_other(collective: str) -> None:
    topology = switch_cluster(5)
    net = Network(topology)
    schedule = direct(net, collective, Options(pipeline=2))
    for rank, program in enumerate(schedule.programs):
        assert {op.peer for op in program if op.kind == "send"} == set(range(5)) - {rank}
    check_schedule(topology, schedule, collective, "direct")


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_rooted_on_a_star_relays_through_the_hub(collective: str) -> None:
    topology = parse_topology_text(STAR)
    net = Network(topology)
    at_hub = direct(net, collective, Options(root=0))
    check_schedule(topology, at_hub, collective, "direct")
    assert at_hub.scratch_chunks == 0  # the hub reaches every rank: nothing to relay
    off_hub = direct(net, collective, Options(root=1))
    check_schedule(topology, off_hub, collective, "direct")
    # ranks 2 and 3 have no route to or from rank 1: the hub receives into scratch and sends on, unreduced
    relayed = [op for op in off_hub.programs[0] if op.kind == "send" and op.src.buffer == "s"]
    assert len(relayed) == 2
    assert all(op.kind == "recv" for op in off_hub.programs[0] if op.dst is not None and op.dst.buffer == "s")


def test_all_pairs_collective_on_a_star_relays_through_the_hub() -> None:
    topology = parse_topology_text(STAR)
    net = Network(topology)
    schedule = direct(net, "alltoall", Options())
    check_schedule(topology, schedule, "alltoall", "direct")
    for rank in (1, 2, 3):
        assert {op.peer for op in schedule.programs[rank] if op.kind == "send"} == {0}
