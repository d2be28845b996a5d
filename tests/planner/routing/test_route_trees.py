"""Shared route searches: a rank's DAG read off its own search and the hubs' equals a search of its own."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fabrics import fat_tree, small_suite, suite
from topocc.planner.routing import network as network_module
from topocc.planner.routing.network import Network
from topocc.planner.routing.route_trees import HubSearches, hubs, route_tree, search
from topocc.planner.topology.model import Device, Link, Topology
from topocc.planner.topology.parse import load_topology, parse_topology_text

ROOT = Path(__file__).resolve().parents[3]


def _fabrics() -> list[tuple[str, Topology]]:
    out = [(f.name, f.topology()) for f in (*small_suite(), *suite()) if f.ranks <= 64]
    for name in ("dgx1-v100", "ndv2-2chassis", "dgx2", "dgx-a100-4node", "pcie-4x4-10gbe", "torus-4x4",
                 "emu-racks"):
        out.append((name, load_topology(ROOT / "topologies" / f"{name}.yaml")))
    return out


FABRICS = _fabrics()


def check_shared_trees(name: str, topo: Topology) -> None:
    """Every rank's shared tree answers each device's cost and parent links as its own search does."""
    net = Network(topo)
    adjacency, is_rank, rank_device = net._graph
    shared = HubSearches(adjacency, is_rank, hubs(adjacency, is_rank))
    for src in range(topo.size):
        own = route_tree(search(adjacency, is_rank, rank_device[src]), rank_device)
        tree = shared.tree(rank_device[src], rank_device)
        for r in range(topo.size):
            assert tree.cost[r] == pytest.approx(own.cost[r], rel=1e-12) or own.cost[r] == tree.cost[r] == math.inf
        for node in range(len(adjacency)):
            expected = {own.first[node], *own.extra.get(node, ())} - {-1}
            assert {tree.first[node], *(tree.extra.get(node) or ())} - {-1} == expected, (name, src, node)
            assert (node in tree.extra) == (node in own.extra)


@pytest.mark.parametrize(("name", "topo"), FABRICS, ids=[name for name, _ in FABRICS])
def test_a_shared_tree_has_the_costs_and_parent_links_of_a_search_of_its_own(name: str, topo: Topology) -> None:
    check_shared_trees(name, topo)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(1, 7), st.data())
def test_shared_trees_on_random_graphs(gpus: int, others: int, data: st.DataObject) -> None:
    """Any wiring: GPUs on several switches and NICs, one-way links, unreachable devices, equal-cost ties."""
    names = [f"g{i}" for i in range(gpus)] + [f"s{i}" for i in range(others)]
    devices = [Device(n, "gpu" if n[0] == "g" else "switch") for n in names]
    pairs = data.draw(st.sets(st.tuples(st.sampled_from(names), st.sampled_from(names))
                              .filter(lambda ab: ab[0] != ab[1]), max_size=24))
    links = [Link(a, b, data.draw(st.sampled_from((10e9, 20e9))), data.draw(st.sampled_from((5e-7, 1e-6))))
             for a, b in sorted(pairs)]
    check_shared_trees("random", Topology("random", tuple(devices), tuple(links), tuple(names[:gpus])))


def test_hubs_are_the_devices_with_two_ways_on_into_the_fabric() -> None:
    topo = parse_topology_text(fat_tree(4, 2, 2, 1).yaml, "fat-tree")
    net = Network(topo)
    adjacency, is_rank, _ = net._graph
    flags = hubs(adjacency, is_rank)
    named = {d.name for d, flag in zip(topo.devices, flags, strict=True) if flag}
    # a NIC leads on to its leaf only (and back to its GPU), an NVSwitch only to GPUs: neither is a hub
    assert named == {"leaf0", "leaf1", "spine0", "spine1"}


def test_a_large_fabric_reads_its_routes_off_shared_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    text = fat_tree(4, 2, 2, 1).yaml
    alone = Network(parse_topology_text(text, "fat-tree"))
    assert alone._hub_searches is None  # 32 ranks: a search per rank
    monkeypatch.setattr(network_module, "SHARED_ROUTES_RANKS", 4)
    shared = Network(parse_topology_text(text, "fat-tree"))
    assert shared._hub_searches is not None
    for src in range(alone.topology.size):
        for dst in range(alone.topology.size):
            assert set(shared.routes(src, dst)) == set(alone.routes(src, dst))
            assert shared.route_bandwidth(src, dst) == pytest.approx(alone.route_bandwidth(src, dst))
            assert set(shared.common_links(src, dst)) == set(alone.common_links(src, dst))
            assert shared.connection_paths(src, dst, 3) == alone.connection_paths(src, dst, 3)


def test_the_16384_gpu_fat_tree_reads_its_routes_off_its_leaves_and_spines() -> None:
    """The shipped fattree-16384 shares its switches' searches (one search per rank: 14 minutes), and a rank's
    DAG equals a search of its own, on every device."""
    path = ROOT / "topologies" / "fattree-16384.yaml"
    topo = load_topology(path)
    net = Network(topo)
    shared = net._hub_searches
    assert shared is not None
    adjacency, is_rank, rank_device = net._graph
    for src in (0, 9, 16383):
        own = route_tree(search(adjacency, is_rank, rank_device[src]), rank_device)
        tree = net._shortest_from(src)
        assert list(tree.cost[r] for r in range(topo.size)) == pytest.approx(list(own.cost))
        for node in range(len(adjacency)):
            assert {tree.first[node], *(tree.extra.get(node) or ())} == {own.first[node], *own.extra.get(node, ())}
