"""The hosted packing: shallow spanning trees where hosts are joined rank to rank, none elsewhere, and the
tree-packing schedules built on them verify and reach TE-CCL's DGX-2 pair's bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fabrics import grid
from tests.conftest import TOPOLOGIES
from tests.planner.compiler.algorithms.test_baselines import check_link_floor, check_schedule
from tests.planner.compiler.algorithms.test_treepack import torus
from tests.strategies import chassis_yaml, topologies
from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.algorithms._arborescence import Packing, pack, rank_graph
from topocc.planner.compiler.algorithms._hosted import hosted_packing
from topocc.planner.compiler.algorithms.treepack import _plan, treepack, treepack_link_floor
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import load_topology, parse_topology_text

DGX2_PAIR = TOPOLOGIES / "dgx2-2chassis.yaml"


def mesh(dims: list[int]) -> Topology:
    """A mesh of routers with one GPU each (the benchmark suite's grid fabric)."""
    return grid("mesh", tuple(dims)).topology()


def check_trees(net: Network, packing: Packing, units: int) -> None:
    """Every unit tree spans the ranks from its root over the packing's arcs, each rank entered once, at most
    one hop (the star) plus three per host beyond the root's (across, to the forwarder, to the rest); the load
    is that of the trees."""
    topology = net.topology
    p = topology.size
    hosts = len(topology.hosts)
    total = np.zeros(len(packing.graph.links))
    for r in packing.roots:
        assert len(packing.trees[r]) == units
        for j in range(units):
            parent = packing.parents(r, j)
            assert sorted(parent) == [v for v in range(p) if v != r]
            for v in parent:
                hops, u = 0, v
                while u != r:
                    u, hops = parent[u], hops + 1
                    assert hops < p, "a cycle"
                assert hops <= 1 + 3 * (hosts - 1)
            total += packing.graph.arc_loads(packing.trees[r][j])
    assert packing.load == pytest.approx(total.max() / units)


@pytest.mark.parametrize(("chassis", "gpus", "one_way"),
                         [(2, 2, True), (2, 4, False), (3, 3, True), (3, 4, False), (4, 2, True), (4, 3, True)])
@pytest.mark.parametrize("reverse", [False, True])
def test_hosted_trees_span_shallow(chassis: int, gpus: int, one_way: bool, reverse: bool) -> None:
    net = Network(parse_topology_text(chassis_yaml(chassis, gpus, one_way=one_way), "chassis"))
    packing = hosted_packing(net, list(range(net.topology.size)), gpus, reverse)
    assert packing is not None and packing.oracle == "hosted"
    check_trees(net, packing, gpus)


@pytest.mark.parametrize("reverse", [False, True])
def test_hosted_meets_the_optimum_on_two_dgx2(reverse: bool) -> None:
    """TE-CCL's DGX-2 pair: the busiest link carries what the general packing's optimum does (31 blocks through
    an odd GPU's NVSwitch port), in trees at most four hops deep."""
    net = Network(load_topology(DGX2_PAIR))
    roots = list(range(net.topology.size))
    packing = hosted_packing(net, roots, 16, reverse)
    assert packing is not None
    check_trees(net, packing, 16)
    general = pack(rank_graph(net, reverse=reverse), roots, 4)
    assert packing.load == pytest.approx(general.load) == pytest.approx(31.0)


@pytest.mark.parametrize("topology", [
    *(torus(d) for d in ([4, 4], [3, 3], [2, 3, 2], [4, 2, 2])),
    *(mesh(d) for d in ([4, 4], [3, 5], [2, 2, 2], [3, 2, 2], [4, 4, 4])),
], ids=lambda t: t.name)
def test_no_hosted_trees_on_grids(topology: Topology) -> None:
    """A torus or mesh has hosts of one rank joined through routers: not this packing's fabric."""
    assert hosted_packing(Network(topology), list(range(topology.size)), 1) is None


@pytest.mark.parametrize("name", ["dgx2", "ndv2-2chassis", "emu-uniform", "dgx-a100-4node"])
def test_no_hosted_trees_elsewhere(name: str) -> None:
    """One host, hosts whose GPUs do not all reach each other (cube meshes), hosts joined through NICs."""
    net = Network(load_topology(TOPOLOGIES / f"{name}.yaml"))
    assert hosted_packing(net, list(range(net.topology.size)), 4) is None


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_two_dgx2_schedule(collective: str) -> None:
    """At 1 GB the hosted trees win on TE-CCL's DGX-2 pair (all-gather at >= 99% of the bound, 129 GB/s there);
    the schedule verifies and its link floor holds."""
    net = Network(load_topology(DGX2_PAIR))
    options = Options(size_bytes=10**9)
    schedule = treepack(net, collective, options)
    check_schedule(net, schedule, collective, "treepack")
    assert schedule.metadata.options["oracle"] == "hosted"
    assert schedule.metadata.options["trees_per_root"] == 16
    check_link_floor(net, treepack_link_floor(net, collective, options), schedule, options.size_bytes)
    share = lower_bound(net, collective, options.size_bytes).time_s / simulate(net, schedule, options.size_bytes).time_s
    assert share >= (0.99 if collective == "allgather" else 0.97)


def test_small_messages_keep_the_general_trees() -> None:
    """Below a piece of MIN_PIECE_BYTES per unit tree there are no hosted trees to race."""
    net = Network(load_topology(DGX2_PAIR))
    assert _plan(net, "allgather", Options(size_bytes=1 << 20)).hosted is None
    assert _plan(net, "allgather", Options(size_bytes=1 << 30)).hosted is not None
    assert _plan(net, "allgather", Options(size_bytes=1 << 30, channels=2)).hosted is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(), st.sampled_from(["allgather", "reducescatter"]))
def test_random_fabrics(topology: Topology, collective: str) -> None:
    """Wherever hosted trees exist they span shallowly, and the schedule treepack builds verifies."""
    net = Network(topology)
    p = topology.size
    units = max(len(ranks) for ranks in topology.hosts.values())
    for reverse in (False, True):
        packing = hosted_packing(net, list(range(p)), units, reverse) if p > 1 else None
        if packing is not None:
            check_trees(net, packing, units)
    if p > 1:
        check_schedule(net, treepack(net, collective, Options(size_bytes=64 << 20)), collective, "treepack")
