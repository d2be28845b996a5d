"""Double binary tree: tree shape, complementarity, routes, rooted variants."""

from __future__ import annotations

import pytest

from tests.planner.compiler.algorithms.test_baselines import check_schedule, switch_cluster
from tests.planner.routing.test_relay import chain
from topocc.planner.compiler.algorithms.tree import binary_tree, double_binary_tree, tree_link_floor
from topocc.planner.compiler.evaluate import link_time
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.routed import routed_schedule
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology


@pytest.mark.parametrize("n", range(1, 17))
def test_binary_tree_is_balanced_and_spanning(n: int) -> None:
    nodes = list(range(100, 100 + n))
    root, parent = binary_tree(nodes)
    assert set(parent) | {root} == set(nodes) and root not in parent
    children: dict[int, int] = {}
    depth = {root: 0}
    for v in nodes:
        chain = [v]
        while chain[-1] != root:
            chain.append(parent[chain[-1]])
        depth[v] = len(chain) - 1
    for c in parent.values():
        children[c] = children.get(c, 0) + 1
    assert max(children.values(), default=0) <= 2
    assert max(depth.values()) == (n).bit_length() - 1  # ceil(log2(n+1)) - 1 levels below the root


def test_trees_are_complementary() -> None:
    # NCCL's double binary tree: few ranks are interior in both trees, so the load spreads
    topology = switch_cluster(16)
    net = Network(topology)
    schedule = double_binary_tree(net, "allreduce", Options())
    trees = schedule.metadata.options["trees"]
    interior = [{par for _, par in edges} for edges in trees]
    assert len(interior[0] & interior[1]) <= 2
    check_schedule(topology, schedule, "allreduce", "tree")


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
@pytest.mark.parametrize("root", [0, 3, 6])
def test_rooted_trees_hang_from_the_root(collective: str, root: int) -> None:
    topology = switch_cluster(7)
    net = Network(topology)
    schedule = double_binary_tree(net, collective, Options(root=root, pipeline=3))
    for edges in schedule.metadata.options["trees"]:
        parents = dict(edges)
        assert root not in parents and len(parents) == 6
        assert sum(par == root for par in parents.values()) == 1
    check_schedule(topology, schedule, collective, "tree")


def test_tree_edges_without_a_route_are_relayed() -> None:
    topology = chain(4)
    net = Network(topology)
    schedule = double_binary_tree(net, "allreduce", Options())
    edges = {(child, par) for tree in schedule.metadata.options["trees"] for child, par in tree}
    assert any(abs(child - par) > 1 for child, par in edges)  # a tree edge between ranks with no route
    check_schedule(topology, schedule, "allreduce", "tree")  # every message goes to a neighbour


@pytest.mark.parametrize("name", ["dgx1-v100", "torus-4x4", "pcie-4x4-10gbe", "dgx-a100-4node"])
@pytest.mark.parametrize("routing", ["spray", "ecmp", "source"])
@pytest.mark.parametrize(("collective", "root"), [("allreduce", 0), ("broadcast", 5), ("reduce", 2)])
def test_link_floor_bounds_the_built_tree(name: str, routing: str, collective: str, root: int) -> None:
    # auto skips the tree unbuilt when this floor loses, so it must never exceed the built schedule's link time
    topology = resolve_topology(name)
    net = Network(topology)
    if routing != topology.routing:
        if name == "torus-4x4" and routing == "source":
            pytest.skip("one routing per torus suffices")
        topology = topology.with_routing(routing)
        net = Network(topology)
    options = Options(size_bytes=64 << 20, root=root)
    floor = tree_link_floor(net, collective, options)
    built = link_time(net, routed_schedule(net, collective, "tree", options), options.size_bytes)
    assert 0 < floor <= built * (1 + 1e-9)


def test_link_floor_meets_the_link_time_where_each_pair_has_one_path() -> None:
    topology = chain(5)  # relayed edges included
    net = Network(topology)
    options = Options(size_bytes=1 << 20)
    built = double_binary_tree(net, "allreduce", options)
    assert tree_link_floor(net, "allreduce", options) == pytest.approx(link_time(net, built, 1 << 20))
    with pytest.raises(NotApplicableError):
        tree_link_floor(net, "allgather", options)
