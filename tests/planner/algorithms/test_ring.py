"""Ring: topology-aware order, channels on DGX-1, directed links, pipelining."""

from __future__ import annotations

import itertools

import pytest

from planner.algorithms import Options
from planner.algorithms._order import find_rings, ring_order
from planner.algorithms.ring import ring
from planner.errors import NotApplicableError
from planner.topology import Topology, parse_topology_text
from tests.planner.algorithms.test_baselines import check_schedule, switch_cluster

#: DGX-1 hybrid cube-mesh: NVLink lanes per GPU pair (``nvidia-smi topo -m`` NV1/NV2).
DGX1_LANES = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}


def dgx1() -> Topology:
    """The DGX-1 NVLink graph plus a slow PCIe tree (so every pair has some route)."""
    lines = ["name: dgx1", "devices:", "  - {name: gpu, type: gpu, host: h0, count: 8}",
             "  - {name: plx0, type: pcie}", "  - {name: plx1, type: pcie}", "  - {name: cpu, type: cpu}", "links:"]
    for (a, b), lanes in DGX1_LANES.items():
        lines.append(f"  - {{ends: [gpu{a}, gpu{b}], bandwidth: 25 GB/s, latency: 0.7 us, count: {lanes}}}")
    for g in range(8):
        lines.append(f"  - {{ends: [gpu{g}, plx{g // 4}], bandwidth: 16 GB/s, latency: 1 us}}")
    lines += ["  - {ends: [plx0, cpu], bandwidth: 16 GB/s, latency: 1 us}",
              "  - {ends: [plx1, cpu], bandwidth: 16 GB/s, latency: 1 us}"]
    return parse_topology_text("\n".join(lines))


def hops(cycle: list[int]) -> list[tuple[int, int]]:
    return list(itertools.pairwise([*cycle, cycle[0]]))


def test_two_hosts_crossed_twice() -> None:
    topology = switch_cluster(4, hosts=2)
    order = ring_order(topology)
    assert order is not None and sorted(order) == list(range(8))
    host = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    assert sum(host[a] != host[b] for a, b in hops(order)) == 2


def test_hosts_visited_contiguously_on_four_hosts() -> None:
    topology = switch_cluster(3, hosts=4)
    for rg in find_rings(topology, None):
        host = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
        assert sum(host[a] != host[b] for a, b in hops(rg)) == 4


def test_dgx1_rings_are_nvlink_and_lane_disjoint() -> None:
    topology = dgx1()
    rings = find_rings(topology, None)
    assert len(rings) >= 2
    used: dict[tuple[int, int], int] = {}
    for rg in rings:
        assert sorted(rg) == list(range(8))
        for a, b in hops(rg):
            used[(a, b)] = used.get((a, b), 0) + 1
    for (a, b), n in used.items():
        lanes = DGX1_LANES.get((min(a, b), max(a, b)), 0)
        assert n <= lanes, f"{n} rings use the {lanes}-lane NVLink {a}->{b}"
    schedule = ring(topology, "allreduce", Options())
    assert schedule.metadata.options["channels"] == len(rings)
    assert {op.channel for p in schedule.programs for op in p if op.kind == "send"} == set(range(len(rings)))
    check_schedule(topology, schedule, "allreduce", "ring")


def test_dgx1_first_ring_uses_double_links() -> None:
    # 0-3-2-1-5-6-7-4 runs over 2-lane NVLinks only: the best single ring has 50 GB/s hops
    order = ring_order(dgx1())
    assert order is not None
    assert all(DGX1_LANES.get((min(a, b), max(a, b))) == 2 for a, b in hops(order))


def directed_ring(n: int, perm: list[int]) -> Topology:
    """GPUs joined only by one-way links along ``perm`` (a directed cycle in a scrambled order)."""
    lines = ["name: directed", "devices:", f"  - {{name: g, type: gpu, count: {n}}}", "links:"]
    for a, b in hops(perm):
        lines.append(f"  - {{ends: [g{a}, g{b}], bandwidth: 10 GB/s, latency: 1 us, direction: forward}}")
    return parse_topology_text("\n".join(lines))


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather", "broadcast", "reduce"])
def test_directed_links_are_followed(collective: str) -> None:
    perm = [0, 3, 1, 4, 2]
    topology = directed_ring(5, perm)
    order = ring_order(topology)
    assert order is not None
    assert set(hops(order)) == set(hops(perm))
    for root in range(5):
        check_schedule(topology, ring(topology, collective, Options(root=root)), collective, "ring")


def test_explicit_channels_and_pipeline() -> None:
    topology = switch_cluster(4)
    schedule = ring(topology, "allreduce", Options(channels=3, pipeline=2))
    assert schedule.metadata.options["channels"] == 3
    assert schedule.input_chunks == 3 * 4 * 2
    # each rank sends 2 (p-1) segments of 2 pieces on each of 3 channels
    assert sum(op.kind == "send" for op in schedule.programs[0]) == 3 * 2 * 3 * 2
    check_schedule(topology, schedule, "allreduce", "ring")


def test_pipeline_default_follows_size() -> None:
    topology = switch_cluster(4)
    small = ring(topology, "broadcast", Options(size_bytes=4 << 10))
    large = ring(topology, "broadcast", Options(size_bytes=256 << 20))
    assert small.metadata.options["pipeline"] == 1
    assert large.metadata.options["pipeline"] > 8


def test_no_hamiltonian_cycle_declines() -> None:
    # a star of one-way links into rank 0 and out of rank 0: 1 -> 0 -> 2 -> ... never closes over 3 ranks
    text = "\n".join([
        "name: star", "devices:", "  - {name: g, type: gpu, count: 3}", "links:",
        "  - {ends: [g0, g1], bandwidth: 10 GB/s, latency: 1 us}",
        "  - {ends: [g0, g2], bandwidth: 10 GB/s, latency: 1 us}",
    ])
    with pytest.raises(NotApplicableError, match="found none"):
        ring(parse_topology_text(text), "allreduce", Options())
