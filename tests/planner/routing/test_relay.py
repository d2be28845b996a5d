"""Relay paths: the cheapest chain of routed hops, the links it loads, and what the simulator charges for it."""

from __future__ import annotations

import pytest

from benchmarks.fabrics import multi_chassis
from tests.strategies import chassis_yaml
from topocc.planner.analysis.simulate import simulate
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import hops, path_latency, path_shares, relay_path, relays
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.schedule import Chunk


def chain(n: int) -> Topology:
    """GPUs 0 - 1 - ... - n-1 joined by full-duplex links: only neighbours have routes."""
    lines = ["name: chain", "devices:", f"  - {{name: g, type: gpu, count: {n}}}", "links:"]
    lines += [f"  - {{ends: [g{i}, g{i + 1}], bandwidth: 10 GB/s, latency: 1 us}}" for i in range(n - 1)]
    return parse_topology_text("\n".join(lines))


def test_a_routed_pair_needs_no_relay() -> None:
    topology = chain(4)
    net = Network(topology)
    assert relay_path(net, 1, 2) == ()
    assert relay_path(net, 2, 2) == ()
    assert hops(net, 1, 2) == [(1, 2)]
    assert path_shares(net, 1, 2) == net.route_shares(1, 2)


def test_a_chain_relays_through_every_rank_between() -> None:
    topology = chain(5)
    net = Network(topology)
    assert relay_path(net, 0, 4) == (1, 2, 3)
    assert relay_path(net, 4, 1) == (3, 2)
    assert hops(net, 0, 3) == [(0, 1), (1, 2), (2, 3)]
    assert path_latency(net, 0, 3) == pytest.approx(3e-6)


def test_the_cheapest_relay_wins() -> None:
    # g0 reaches g3 through g1 (fast links) or g2 (slow ones); no GPU-free route joins g0 and g3
    topology = parse_topology_text("\n".join([
        "name: two-relays", "devices:", "  - {name: g, type: gpu, count: 4}", "links:",
        "  - {ends: [g0, g2], bandwidth: 10 GB/s, latency: 1 us}",
        "  - {ends: [g2, g3], bandwidth: 10 GB/s, latency: 1 us}",
        "  - {ends: [g0, g1], bandwidth: 100 GB/s, latency: 1 us}",
        "  - {ends: [g1, g3], bandwidth: 100 GB/s, latency: 1 us}",
    ]))
    net = Network(topology)
    assert relay_path(net, 0, 3) == (1,)
    assert relay_path(net, 3, 0) == (1,)


def test_one_way_chassis_relay_at_the_ends_of_their_links() -> None:
    # chassis 0's GPU 0 sends to chassis 1's GPU 1, and chassis 1's GPU 0 back to chassis 0's GPU 1
    topology = parse_topology_text(chassis_yaml(2, 4))
    net = Network(topology)
    assert relay_path(net, 2, 7) == (0, 5)  # c0g2 -> c0g0 -> c1g1 -> c1g3
    assert relay_path(net, 0, 6) == (5,)
    assert relay_path(net, 6, 1) == (4,)
    assert relay_path(net, 0, 5) == ()


def test_equally_cheap_relays_share_the_pairs() -> None:
    # two chassis joined both ways at two GPUs each: c0g0 <-> c1g1 and c1g0 <-> c0g1, equally cheap
    topology = parse_topology_text(chassis_yaml(2, 8, one_way=False))
    net = Network(topology)
    crossings = [relay_path(net, a, b)[0] for a in range(2, 8) for b in range(10, 16)]
    assert set(crossings) == {0, 1}
    assert min(crossings.count(0), crossings.count(1)) >= len(crossings) // 3
    assert relay_path(net, 3, 12) == relay_path(net, 3, 12)  # the same every time


def test_gateways_share_their_hosts_ranks_evenly() -> None:
    # 2 chassis of 16 GPUs, NICs on GPUs 0, 4, 8 and 12 of each: the 12 others of a chassis use each NIC alike
    topology = multi_chassis(2, 16, "subset").topology()
    net = Network(topology)
    nics = {0, 4, 8, 12}
    others = [g for g in range(16) if g not in nics]
    for a_host, b_host in ((0, 1), (1, 0)):
        pairs = [(16 * a_host + a, 16 * b_host + b) for a in others for b in others]
        first = [relay_path(net, a, b)[0] for a, b in pairs]
        last = [relay_path(net, a, b)[-1] for a, b in pairs]
        assert sorted(first.count(16 * a_host + n) for n in nics) == [len(pairs) // 4] * 4
        assert sorted(last.count(16 * b_host + n) for n in nics) == [len(pairs) // 4] * 4
        # one rank to its counterpart in the other chassis (a hierarchical level): one pair per NIC link each way
        same = [relay_path(net, 16 * a_host + g, 16 * b_host + g) for g in others]
        assert sorted(path[0] for path in same) == sorted(16 * a_host + n for n in nics for _ in range(3))
        assert sorted(path[-1] for path in same) == sorted(16 * b_host + n for n in nics for _ in range(3))


def test_a_ranks_messages_to_different_hosts_leave_by_different_gateways() -> None:
    # 4 chassis: rank 1 of chassis 0 reaches rank 1 of each other chassis through a NIC of its own
    topology = multi_chassis(4, 16, "subset").topology()
    net = Network(topology)
    assert len({relay_path(net, 1, 16 * c + 1)[0] for c in (1, 2, 3)}) == 3
    assert len({relay_path(net, 16 * c + 1, 1)[-1] for c in (1, 2, 3)}) == 3


def test_path_shares_load_every_hop() -> None:
    topology = chain(3)
    net = Network(topology)
    assert path_shares(net, 0, 2) == {("g0", "g1"): 1.0, ("g1", "g2"): 1.0}  # into the relay and out of it
    box = parse_topology_text(chassis_yaml(2, 4))
    box_net = Network(box)
    crossing = path_shares(box_net, 2, 7)  # c0g2 -> c0g0 -> c1g1 -> c1g3
    assert crossing == {("c0g2", "c0sw"): 1.0, ("c0sw", "c0g0"): 1.0, ("c0g0", "c1g1"): 1.0,
                        ("c1g1", "c1sw"): 1.0, ("c1sw", "c1g3"): 1.0}


def test_the_simulator_charges_the_relays_links() -> None:
    """A relayed message is two messages: the relay's links carry it in and out, and it takes both hops' time."""
    topology = chain(3)
    net = Network(topology)
    size = 1 << 30
    b = ScheduleBuilder("broadcast", 3, 1, 1, root=0, relay=relays(net))
    b.copy(0, Chunk("i", 0), Chunk("o", 0))
    b.transfer(0, 2, Chunk("i", 0), Chunk("o", 0))  # through rank 1, which keeps no copy
    b.transfer(0, 1, Chunk("i", 0), Chunk("o", 0))
    schedule = b.build("test")
    verify(schedule)
    sim = simulate(topology, schedule, size)
    assert sim.link_bytes[("g0", "g1")] == pytest.approx(2 * size)
    assert sim.link_bytes[("g1", "g2")] == pytest.approx(size)
    assert sim.time_s >= 2 * size / 10e9
