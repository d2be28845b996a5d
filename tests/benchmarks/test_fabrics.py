"""The generated suite of fabrics: every fabric loads as the YAML says, and on the small variant every algorithm
builds a schedule that verifies and is no faster than the lower bound, or declines in one line."""

from __future__ import annotations

import functools

import networkx as nx
import pytest

from benchmarks.fabrics import (
    FAMILIES,
    SHIPPED_SWITCH_BASED,
    Fabric,
    fat_tree,
    grid,
    heterogeneous_nics,
    multi_chassis,
    shipped_fabrics,
    small_suite,
    suite,
)
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError, UsageError
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import shipped_topologies
from topocc.planner.topology.model import Topology

FULL = {f.name: f for f in suite()}
SMALL = {f.name: f for f in small_suite()}
#: The collectives of the planner's targets.
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


@functools.cache
def small(name: str) -> Topology:
    """One parsed topology per small fabric, so its routes are computed once for all its cases."""
    return SMALL[name].topology()


def test_suites_cover_every_family_with_unique_names() -> None:
    for fabrics in (suite(), small_suite()):
        assert {f.family for f in fabrics} == set(FAMILIES)
        assert len({f.name for f in fabrics}) == len(fabrics)
    assert max(f.ranks for f in suite()) == 512 and max(f.ranks for f in small_suite()) <= 16


@pytest.mark.parametrize("fabric", [*suite(), *small_suite()], ids=lambda f: f.name)
def test_fabric_loads_and_is_connected(fabric: Fabric) -> None:
    topology = fabric.topology()
    assert topology.name == fabric.name and topology.size == fabric.ranks
    assert fabric.yaml.startswith("#"), "every fabric says what real system it resembles"
    ranks = set(topology.ranks)
    components = [c for c in nx.strongly_connected_components(topology.graph) if c & ranks]
    assert len(components) == 1 and ranks <= components[0]


@pytest.mark.parametrize("fabric", [f for f in (*suite(), *small_suite()) if f.switch_based and f.ranks <= 64],
                         ids=lambda f: f.name)
def test_switch_based_fabrics_route_every_pair(fabric: Fabric) -> None:
    topology = fabric.topology()
    net = Network(topology)
    assert all(net.has_route(a, b) for a in range(topology.size) for b in range(topology.size) if a != b)


@pytest.mark.parametrize("fabric", [FULL["chassis-4x8-one-way"], FULL["chassis-4x16-subset"], FULL["rail-only-4x8"]],
                         ids=lambda f: f.name)
def test_relay_fabrics_leave_some_pair_without_a_route(fabric: Fabric) -> None:
    """The multi-chassis and rail-only fabrics exist to need GPU relays: some pair has no GPU-free route."""
    topology = fabric.topology()
    net = Network(topology)
    assert not fabric.switch_based
    assert not all(net.has_route(a, b) for a in range(topology.size) for b in range(topology.size) if a != b)


@pytest.mark.parametrize(("chassis", "gpus"), [(2, 8), (4, 16)])
def test_one_way_chassis_links_close_a_loop(chassis: int, gpus: int) -> None:
    topology = multi_chassis(chassis, gpus, "one-way").topology()
    between = [ln for ln in topology.links if ln.kind == "ib"]
    assert len(between) == chassis * gpus // 8
    for ln in between:
        (c, a), (d, b) = (tuple(int(x) for x in n[1:].split(".gpu")) for n in (ln.src, ln.dst))
        assert d == (c + 1) % chassis and b == a + 1 and topology.link(ln.dst, ln.src) is None


def test_subset_chassis_attach_every_fourth_gpu_both_ways() -> None:
    topology = multi_chassis(4, 16, "subset").topology()
    attached = {ln.src for ln in topology.links if ln.dst == "ib"}
    assert attached == {f"c{c}.gpu{k}" for c in range(4) for k in (0, 4, 8, 12)}
    assert {ln.dst for ln in topology.links if ln.src == "ib"} == attached


@pytest.mark.parametrize(("kind", "degrees"), [("torus", {6}), ("mesh", {3, 4, 5, 6})])
def test_3d_grids_wire_each_router_to_its_neighbours(kind: str, degrees: set[int]) -> None:
    topology = grid(kind, (4, 4, 4)).topology()
    neighbours = {d.name: 0 for d in topology.devices if d.name.startswith("r")}
    for ln in topology.links:
        if ln.src in neighbours and ln.dst in neighbours:
            neighbours[ln.src] += 1
    assert len(neighbours) == 64 and set(neighbours.values()) == degrees


def test_heterogeneous_hosts_have_their_own_nics() -> None:
    topology = heterogeneous_nics(((4, 200), (2, 100))).topology()
    ports = {h: sorted(ln.bandwidth for ln in topology.links if ln.dst == "sw" and ln.src.startswith(f"h{h}."))
             for h in (0, 1)}
    assert ports == {0: [25e9] * 4, 1: [12.5e9] * 2}


def test_fat_tree_uplinks_are_oversubscribed() -> None:
    topology = fat_tree(8, 2, 4, 4).topology()
    down = sum(ln.bandwidth for ln in topology.links if ln.dst == "leaf0" and ln.src.startswith("h"))
    up = sum(ln.bandwidth for ln in topology.links if ln.src == "leaf0" and ln.dst.startswith("spine"))
    assert down == pytest.approx(4 * up)


def test_bad_generator_arguments_say_how_to_fix_them() -> None:
    with pytest.raises(UsageError, match="one-way or subset"):
        multi_chassis(2, 8, "two-way")
    with pytest.raises(UsageError, match="divides"):
        heterogeneous_nics(((3, 200),))


def test_every_shipped_topology_is_classified() -> None:
    assert set(SHIPPED_SWITCH_BASED) == set(shipped_topologies())
    assert {f.name: f.switch_based for f in shipped_fabrics()} == SHIPPED_SWITCH_BASED


def _cases() -> list[object]:
    """(small fabric, algorithm, collective), skipping an algorithm where ``auto`` does (above its rank limit)."""
    return [
        pytest.param(f.name, a.name, c, id=f"{f.name}-{a.name}-{c}")
        for f in small_suite()
        for a in ALGORITHMS.values()
        if a.auto_max_ranks is None or f.ranks <= a.auto_max_ranks
        for c in COLLECTIVES
        if c in a.collectives
    ]


@pytest.mark.parametrize(("name", "algorithm", "collective"), _cases())
def test_algorithm_applies_or_says_why_not(name: str, algorithm: str, collective: str) -> None:
    """The invariant, not today's list: a verified schedule no faster than the bound, or a one-line refusal."""
    topology = small(name)
    try:
        compiled = compile_schedule(topology, collective, algorithm, Options(size_bytes=1 << 20))
    except NotApplicableError as exc:
        assert exc.message.strip() and "\n" not in exc.message
        return
    assert compiled.schedule.ranks == topology.size and compiled.proof.operations > 0
    assert compiled.sim.time_s >= compiled.bound.time_s * (1 - 1e-9)
