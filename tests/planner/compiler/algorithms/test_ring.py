"""Ring: topology-aware order, channels on DGX-1, directed links, multi-chassis boxes, relayed hops, pipelining."""

from __future__ import annotations

import importlib
import itertools

import pytest

from tests.planner.analysis.test_automorphisms import small_fattree
from tests.planner.compiler.algorithms.test_baselines import check_link_floor, check_schedule, switch_cluster
from tests.strategies import chassis_yaml
from topocc.planner.analysis.automorphisms import pair_key
from topocc.planner.compiler.algorithms._order import LinkLoads, find_rings, ring_order
from topocc.planner.compiler.algorithms.hierarchical.levels import stages
from topocc.planner.compiler.algorithms.ring import ring
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text

order_module = importlib.import_module("topocc.planner.compiler.algorithms._order")

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
    net = Network(topology)
    order = ring_order(net)
    assert order is not None and sorted(order) == list(range(8))
    host = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    assert sum(host[a] != host[b] for a, b in hops(order)) == 2


def test_hosts_visited_contiguously_on_four_hosts() -> None:
    topology = switch_cluster(3, hosts=4)
    net = Network(topology)
    for rg in find_rings(net, None):
        host = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
        assert sum(host[a] != host[b] for a, b in hops(rg)) == 4


def test_dgx1_rings_are_nvlink_and_lane_disjoint() -> None:
    topology = dgx1()
    net = Network(topology)
    rings = find_rings(net, None)
    assert len(rings) >= 2
    used: dict[tuple[int, int], int] = {}
    for rg in rings:
        assert sorted(rg) == list(range(8))
        for a, b in hops(rg):
            used[(a, b)] = used.get((a, b), 0) + 1
    for (a, b), n in used.items():
        lanes = DGX1_LANES.get((min(a, b), max(a, b)), 0)
        assert n <= lanes, f"{n} rings use the {lanes}-lane NVLink {a}->{b}"
    schedule = ring(net, "allreduce", Options())
    assert schedule.metadata.options["channels"] == len(rings)
    assert {op.channel for p in schedule.programs for op in p if op.kind == "send"} == set(range(len(rings)))
    check_schedule(topology, schedule, "allreduce", "ring")


def test_dgx1_first_ring_uses_double_links() -> None:
    # 0-3-2-1-5-6-7-4 runs over 2-lane NVLinks only: the best single ring has 50 GB/s hops
    order = ring_order(Network(dgx1()))
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
    net = Network(topology)
    order = ring_order(net)
    assert order is not None
    assert set(hops(order)) == set(hops(perm))
    for root in range(5):
        check_schedule(topology, ring(net, collective, Options(root=root)), collective, "ring")


def test_explicit_channels_and_pipeline() -> None:
    topology = switch_cluster(4)
    net = Network(topology)
    schedule = ring(net, "allreduce", Options(channels=3, pipeline=2))
    assert schedule.metadata.options["channels"] == 3
    assert schedule.input_chunks == 3 * 4 * 2
    # each rank sends 2 (p-1) segments of 2 pieces on each of 3 channels
    assert sum(op.kind == "send" for op in schedule.programs[0]) == 3 * 2 * 3 * 2
    check_schedule(topology, schedule, "allreduce", "ring")


def test_pipeline_default_follows_size() -> None:
    topology = switch_cluster(4)
    net = Network(topology)
    small = ring(net, "broadcast", Options(size_bytes=4 << 10))
    large = ring(net, "broadcast", Options(size_bytes=256 << 20))
    assert small.metadata.options["pipeline"] == 1
    assert large.metadata.options["pipeline"] > 8


def test_without_a_cycle_of_routes_the_ring_relays() -> None:
    # rank 0 is the hub of a star: 1 -> 0 -> 2 -> ... never closes, so the ring relays 2 -> 1 through 0
    topology = parse_topology_text("\n".join([
        "name: star", "devices:", "  - {name: g, type: gpu, count: 3}", "links:",
        "  - {ends: [g0, g1], bandwidth: 10 GB/s, latency: 1 us}",
        "  - {ends: [g0, g2], bandwidth: 10 GB/s, latency: 1 us}",
    ]))
    net = Network(topology)
    order = ring_order(net)
    assert sorted(order) == [0, 1, 2]
    assert sum(not net.has_route(a, b) for a, b in hops(order)) == 1
    for collective in ("allreduce", "reducescatter", "allgather", "broadcast", "reduce"):
        schedule = ring(net, collective, Options(root=2))
        check_schedule(topology, schedule, collective, "ring")
        if collective not in ("broadcast", "reduce"):  # a chain from the root may leave the relayed hop out
            assert schedule.scratch_chunks > (schedule.input_chunks if collective == "reducescatter" else 0)


@pytest.mark.parametrize("shape", [(2, 4, "nvswitch"), (2, 16, "nvswitch"), (4, 16, "nvswitch"), (2, 8, "cube-mesh"),
                                   (4, 8, "cube-mesh")])
def test_multi_chassis_rings_use_only_direct_hops(shape: tuple[int, int, str]) -> None:
    """A multi-chassis ring: in at a chassis' receiving GPU, around the chassis, out at its sending GPU, no
    relays."""
    chassis, gpus, inside = shape
    for one_way in (True, False):
        topology = parse_topology_text(chassis_yaml(chassis, gpus, inside, one_way))
        net = Network(topology)
        rings = find_rings(net, None)
        assert len(rings) == (1 if one_way else 2)  # two-way: one ring each way round the chassis
        host = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
        for rg in rings:
            assert sorted(rg) == list(range(topology.size))
            assert all(net.has_route(a, b) for a, b in hops(rg))
            assert sum(host[a] != host[b] for a, b in hops(rg)) == chassis


def test_a_relayed_hop_weighs_the_relay_links() -> None:
    """Hosts whose NIC only GPU 0 reaches: hops into or out of a host relay through its GPU 0, whose links they load."""
    text = "\n".join([
        "name: nic-first", "devices:",
        "  - {name: h0g, type: gpu, count: 2, host: h0}", "  - {name: h1g, type: gpu, count: 2, host: h1}",
        "  - {name: h0nic, type: nic, host: h0}", "  - {name: h1nic, type: nic, host: h1}", "links:",
        "  - {ends: [h0g0, h0g1], bandwidth: 50 GB/s, latency: 1 us}",
        "  - {ends: [h1g0, h1g1], bandwidth: 50 GB/s, latency: 1 us}",
        "  - {ends: [h0g0, h0nic], bandwidth: 20 GB/s, latency: 1 us}",
        "  - {ends: [h1g0, h1nic], bandwidth: 20 GB/s, latency: 1 us}",
        "  - {ends: [h0nic, h1nic], bandwidth: 10 GB/s, latency: 1 us}",
    ])
    topology = parse_topology_text(text)
    net = Network(topology)
    loads = LinkLoads(net)
    assert loads.weight(1, 2) == pytest.approx(10e9)  # h0g1 -> h0g0 -> h1g0: the NICs' 10 GB/s bind
    loads.add_ring([0, 1, 2, 3])  # 1 -> 2 relays through 0, 3 -> 0 through 2
    assert loads.load.get(("h0g1", "h0g0")) == 1.0 and loads.load.get(("h0g0", "h0g1")) == 1.0
    assert loads.load.get(("h0nic", "h1nic")) == 1.0 and loads.load.get(("h1nic", "h0nic")) == 1.0
    assert loads.weight(1, 2) == pytest.approx(5e9)  # its links now carry one ring already
    order = ring_order(net)
    assert sum(not net.has_route(a, b) for a, b in hops(order)) == 2
    for collective in ("allreduce", "allgather"):
        check_schedule(topology, ring(net, collective, Options()), collective, "ring")


@pytest.mark.parametrize("name", ["torus-4x4", "mesh-4x4", "dgx-a100-4node", "ndv2-2chassis", "pcie-4x4-10gbe"])
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather", "broadcast", "reduce"])
def test_link_floor_bounds_the_schedule(name: str, collective: str) -> None:
    """The floor ``auto`` checks before building bounds the schedule (:func:`check_link_floor`)."""
    from topocc.planner.compiler.algorithms.ring import ring_link_floor
    from topocc.planner.topology.catalogue import resolve_topology

    topology = resolve_topology(name)
    net = Network(topology)
    options = Options(size_bytes=256 << 20, root=1)
    floor = ring_link_floor(net, collective, options)
    check_link_floor(topology, floor, ring(net, collective, options), options.size_bytes)


@pytest.mark.parametrize("name", ["small-fattree", "ibm-s822lc-48x4", "emu-racks", "dgx-a100-4node"])
def test_the_ring_search_weighs_a_pair_as_its_orbits_representative(name: str) -> None:
    """On a fabric with symmetries the ring search asks routes and bandwidths once per orbit of rank pairs
    (:func:`~topocc.planner.analysis.automorphisms.pair_key`): the rings it finds, over all ranks and over
    each hierarchy level's groups, are those it finds asking every pair."""
    topo = small_fattree() if name == "small-fattree" else resolve_topology(name)
    keyed = Network(topo)
    assert pair_key(keyed) is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(order_module, "pair_key", lambda net: None)
        plain = Network(topo)
        want = (ring_order(plain), stages(plain))
    assert (ring_order(keyed), stages(keyed)) == want
