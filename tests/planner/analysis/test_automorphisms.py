"""Timing by class: the symmetries a symmetric schedule shares with its network, and the simulation that
replays one rank per orbit of them, against the simulation of every rank."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from benchmarks.fabrics import heterogeneous_nics, rail_optimized
from tests.planner.analysis.test_simulate import ring_topology
from tests.runtime.test_symmetric import ring
from topocc.planner.analysis.automorphisms import (
    _DIGITS,
    _FABRIC,
    has_symmetries,
    hosts_alike,
    pair_key,
    pair_orbits,
    schedule_orbits,
)
from topocc.planner.analysis.simulate import SimResult, _bound, simulate, simulate_within
from topocc.planner.compiler import evaluate
from topocc.planner.compiler.compile import Compiled, compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import grid_shapes, symmetrize
from topocc.planner.errors import NotApplicableError, SimulationError
from topocc.planner.routing.network import MAX_PATHS, Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.schedule import Schedule
from topocc.runtime.symmetric import Formula, SymmetricPrograms, Symmetry, TemplateOp

SIZE = 16 << 20


def assert_alike(by_class: SimResult, full: SimResult) -> None:
    """Two results the same but for rounding: time, every rank's finish, every link's bytes and use."""
    assert by_class.time_s == pytest.approx(full.time_s, rel=1e-12)
    assert by_class.busbw_GBps == pytest.approx(full.busbw_GBps, rel=1e-12)
    np.testing.assert_allclose(by_class.rank_finish_s, full.rank_finish_s, rtol=1e-12)
    assert by_class.link_bytes.keys() == full.link_bytes.keys()
    for key, value in full.link_bytes.items():
        assert by_class.link_bytes[key] == pytest.approx(value, rel=1e-9, abs=1e-6), key
        assert by_class.link_utilisation[key] == pytest.approx(full.link_utilisation[key], rel=1e-9, abs=1e-12)


def by_class_and_full(net: Network, schedule: Schedule, size: int = SIZE) -> bool:
    """Time a symmetric ``schedule`` by class and rank by rank, with and without contention, and against
    deadlines either side of its time; whether it was replayed by class."""
    full = simulate(net, schedule, size, by_class=False)
    assert_alike(simulate(net, schedule, size), full)
    assert _bound(net, schedule, size).time_s == pytest.approx(_bound(net, schedule, size, by_class=False).time_s,
                                                              rel=1e-9)
    assert simulate_within(net, schedule, size, full.time_s * 0.99) is None
    within = simulate_within(net, schedule, size, full.time_s * 1.01)
    assert within is not None and within.time_s == pytest.approx(full.time_s, rel=1e-12)
    return schedule_orbits(net, schedule) is not None


# --------------------------------------------------------------------------- many schedules on many fabrics

FABRICS = ["dgx2", "dgx2-2chassis", "dgx-a100-4node", "emu-racks", "emu-uniform", "ibm-s822lc-48x4",
           "pcie-4x4-10gbe", "ndv2-2chassis", "dgx1-v100", "torus-4x4"]
ALGORITHMS = ["ring", "halving-doubling", "hierarchical", "direct", "tree"]
COLLECTIVES = ["allreduce", "allgather", "reducescatter", "alltoall"]


@pytest.mark.parametrize("fabric", FABRICS)
def test_every_algorithm_times_alike_by_class_and_rank_by_rank(fabric: str) -> None:
    topo = resolve_topology(fabric)
    net = Network(topo)
    tried = by_class = 0
    for collective in COLLECTIVES:
        for algorithm in ALGORITHMS:
            if topo.size > 64 and (algorithm != "hierarchical" or collective != "allreduce"):
                continue  # minutes of simulating every rank on 192
            try:
                s = compile_schedule(net, collective, algorithm, Options(size_bytes=SIZE)).schedule
            except NotApplicableError:
                continue
            sym = symmetrize(s, grid_shapes(topo))
            if sym.symmetry is None:
                continue
            tried += 1
            by_class += by_class_and_full(net, sym)
    assert tried >= 1 if topo.size > 64 else tried >= 3
    if fabric in ("dgx2", "dgx2-2chassis", "emu-racks", "emu-uniform", "ibm-s822lc-48x4", "pcie-4x4-10gbe"):
        assert by_class >= min(tried, 2), f"only {by_class} of {tried} symmetric schedules replayed by class"
    if fabric == "torus-4x4":  # its routes follow the dimensions, which a translation of the line does not keep
        assert by_class == 0


def test_the_shipped_fattree_replays_one_rank_for_all() -> None:
    from tests.conftest import REPO
    from topocc.runtime.schedule import load_schedule

    s = load_schedule(REPO / "schedules" / "fattree-1024-allreduce.json.gz")
    net = Network(resolve_topology("fattree-1024"))
    orbits = schedule_orbits(net, s)
    assert orbits is not None and orbits.reps == (0,) and orbits.copies == 1024
    assert simulate(net, s, s.metadata.size_bytes or 0).time_s == pytest.approx(s.metadata.predicted_time_s,
                                                                               rel=1e-12)


# --------------------------------------------------------------------------- the orbits are symmetries


def test_every_rank_of_an_orbit_runs_its_representatives_program_with_peers_moved() -> None:
    topo = resolve_topology("ibm-s822lc-48x4")
    net = Network(topo)
    s = symmetrize(compile_schedule(net, "allreduce", "hierarchical", Options(size_bytes=SIZE)).schedule,
                   grid_shapes(topo))
    orbits = schedule_orbits(net, s)
    assert orbits is not None and len(orbits.reps) * orbits.copies == s.ranks
    for rank in range(s.ranks):
        mine, theirs = s.programs[rank], s.programs[int(orbits.rep_of[rank])]
        assert [(o.kind, o.count, o.deps, o.channel, o.encoding) for o in mine] == \
            [(o.kind, o.count, o.deps, o.channel, o.encoding) for o in theirs]
    links = topo.links
    for orbit in range(len(orbits.link_count)):
        members = np.flatnonzero(orbits.link_orbit == orbit)
        assert len(members) == orbits.link_count[orbit]
        assert len({(links[k].bandwidth, links[k].latency, links[k].kind) for k in members}) == 1


def test_a_ring_on_a_ring_is_one_orbit_and_its_links_two() -> None:
    net = Network(ring_topology(8))
    orbits = schedule_orbits(net, ring(8))
    assert orbits is not None and orbits.reps == (0,) and orbits.copies == 8
    assert sorted(orbits.link_count.tolist()) == [8, 8]  # the links each way
    assert by_class_and_full(net, ring(8))


def test_the_orbits_of_a_form_are_found_once_per_network() -> None:
    net, form = Network(ring_topology(8)), ring(8)
    first = schedule_orbits(net, form)
    assert first is not None and schedule_orbits(net, form) is first  # asked by the compiler, then its simulator
    other = ring(8)  # an equal form, another object: found anew
    again = schedule_orbits(net, other)
    assert again is not first and again is not None and again.reps == first.reps


def test_a_slower_link_breaks_the_symmetry_and_the_time_is_still_right() -> None:
    topo = ring_topology(8)
    k = next(k for k, link in enumerate(topo.links) if (link.src, link.dst) == ("g3", "g4"))  # one the ring uses
    slow = replace(topo.links[k], bandwidth=topo.links[k].bandwidth / 2)
    uneven = replace(topo, links=(*topo.links[:k], slow, *topo.links[k + 1:]))
    net = Network(uneven)
    assert not has_symmetries(net) and schedule_orbits(net, ring(8)) is None
    assert not by_class_and_full(net, ring(8))
    assert simulate(net, ring(8), SIZE).time_s > simulate(Network(topo), ring(8), SIZE).time_s


def test_a_schedule_whose_peers_do_not_move_with_the_ranks_is_not_replayed_by_class() -> None:
    # rank r sends to 2r: the doubling does not commute with any translation
    sym = ring(8).symmetry
    assert sym is not None
    doubled = Symmetry(sym.shape, (tuple(replace(op, peer=Formula(0, (2,)) if op.kind == "send" else op.peer)
                                         for op in sym.templates[0]),), sym.runs, sym.limits)
    s = replace(ring(8), symmetry=doubled, programs=SymmetricPrograms(doubled))
    assert schedule_orbits(Network(ring_topology(8)), s) is None


def test_an_extension_that_does_not_exist_is_refused() -> None:
    # a rotation of a ring is an automorphism; swapping two neighbours is not, and fails the link check
    net = Network(ring_topology(6))
    fabric = net.memo(_FABRIC)
    assert fabric.extend(np.array([1, 2, 3, 4, 5, 0])) is not None
    assert fabric.extend(np.array([1, 0, 2, 3, 4, 5])) is None  # a transposition breaks the ring


def test_a_deadlock_by_class_names_a_rank_and_its_operation() -> None:
    # every rank receives from its left before it sends to its right: no message ever starts
    template = (TemplateOp("recv", Formula(7, (1,)), dst=None), TemplateOp("send", Formula(1, (1,)), deps=(0,)))
    base = ring(8)
    assert base.symmetry is not None
    src, dst = base.symmetry.templates[0][0].src, base.symmetry.templates[0][0].dst
    template = (replace(template[0], dst=dst), replace(template[1], src=src))
    stuck = Symmetry((8,), (template,), ((0, 8),), base.symmetry.limits)
    s = replace(base, symmetry=stuck, programs=SymmetricPrograms(stuck))
    net = Network(ring_topology(8))
    assert schedule_orbits(net, s) is not None
    with pytest.raises(SimulationError, match=r"deadlock: 0 of 16 operations completed; rank 0 op 0 \(recv from "
                                              r"rank 7\) never did"):
        simulate(net, s, SIZE)


# --------------------------------------------------------------------------- routes decided by the shape


def fat_tree(spines: int, routing: str = "spray") -> Topology:
    """Two leaves of two GPUs each, every leaf joined to every spine."""
    lines = ["name: ft", "devices:", "  - {name: g, type: gpu, count: 4}", "  - {name: leaf, type: switch, count: 2}",
             f"  - {{name: spine, type: switch, count: {spines}}}", "links:"]
    lines += [f"  - {{ends: [g{i}, leaf{i // 2}], bandwidth: 10 GB/s, latency: 1 us}}" for i in range(4)]
    lines += [f"  - {{ends: [leaf{j}, spine{k}], bandwidth: 1 GB/s, latency: 1 us}}" for j in range(2)
              for k in range(spines)]
    lines.append(f"routing: {routing}")
    return parse_topology_text("\n".join(lines) + "\n")


def test_routes_decided_by_the_shape() -> None:
    net = Network(fat_tree(MAX_PATHS))
    assert net.routed_by_shape(0, 1)  # one path, through the leaf
    assert net.routed_by_shape(0, 2)  # every path of MAX_PATHS sprayed
    wide = Network(fat_tree(MAX_PATHS + 1))
    assert wide.routed_by_shape(0, 2) and wide.sprayed(0, 2) is not None  # every path counted, none listed
    hashed = Network(fat_tree(2, "ecmp"))
    assert hashed.routed_by_shape(0, 1) and not hashed.routed_by_shape(0, 2)


SMALL_FATTREE = """name: fattree-64
cluster:
  hosts: 8
  host:
    gpus: 8
    fabric: nvswitch
    gpu_link: {bandwidth: 25 GB/s, count: 12, latency: 0.35 us}
    nics: 8
    nic: {bandwidth: 200 Gbit/s, latency: 0.5 us, kind: ib, attach_bandwidth: 32 GB/s, attach_latency: 0.5 us}
  network: {type: fat-tree, hosts_per_leaf: 4, spines: 4, oversubscription: 2, latency: 0.5 us, routing: spray}
"""


def small_fattree() -> Topology:
    """64 GPUs, two leaves of four 8-GPU hosts, packets sprayed over four spines: fattree-1024 in small."""
    return parse_topology_text(SMALL_FATTREE, "fattree-64.yaml")


@cache
def compiled_by_class() -> tuple[Network, Compiled]:
    """The small fat-tree's hierarchical all-reduce at 1 MiB, compiled as a large schedule is (timed by class)."""
    net = Network(small_fattree())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "BY_CLASS_MIN_OPS", 0)
        return net, compile_schedule(net, "allreduce", "hierarchical", Options(size_bytes=1 << 20))


def test_compile_times_a_large_schedule_in_the_form_it_writes() -> None:
    net, compiled = compiled_by_class()
    assert compiled.schedule.symmetry is not None
    assert not evaluate.by_class_may_pay(net, compiled.schedule.expanded())  # unless the threshold is lowered
    assert schedule_orbits(net, compiled.schedule) is not None
    plain = compiled.schedule.expanded()
    assert compiled.sim.time_s == pytest.approx(simulate(net, plain, 1 << 20).time_s, rel=1e-12)
    assert math.isclose(compiled.schedule.metadata.predicted_time_s or 0, compiled.sim.time_s)
    # where the routes are hashed (ECMP) a schedule is timed rank by rank, as it was built
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "BY_CLASS_MIN_OPS", 0)
        assert evaluate.by_class_may_pay(net, plain)
        assert not evaluate.by_class_may_pay(Network(small_fattree().with_routing("ecmp")), plain)


# --------------------------------------------------------------------------- rank pairs by orbit


@pytest.mark.parametrize("name", ["small-fattree", "emu-racks", "ibm-s822lc-48x4", "dgx-a100-4node", "rail-pods"])
def test_a_pair_routes_as_its_orbits_representative_does(name: str) -> None:
    """A pair and its :func:`pair_key` have routes alike (one or none, equal costs, paths decided by the
    shape alike, the same bandwidth and shares where they are); the key is a representative (its own key)."""
    topo = small_fattree() if name == "small-fattree" else rail_pods() if name == "rail-pods" else \
        resolve_topology(name)
    net = Network(topo)
    key = pair_key(net)
    assert key is not None and has_symmetries(net)
    n = topo.size
    reps = set()
    for a in range(n):
        for b in range(0, n, 3):
            rep = key(a, b)
            reps.add(rep)
            assert key(*rep) == rep
            assert net.has_route(a, b) == net.has_route(*rep)
            if a == b or not net.has_route(a, b):
                continue
            assert net.route_cost(a, b) == pytest.approx(net.route_cost(*rep), rel=1e-12)
            assert net.routed_by_shape(a, b) == net.routed_by_shape(*rep)
            if net.routed_by_shape(a, b):
                assert net.route_bandwidth(a, b) == net.route_bandwidth(*rep)
                assert sorted(net.route_shares(a, b).values()) == sorted(net.route_shares(*rep).values())
    src, dst = np.divmod(np.arange(n * n), n)
    many = key.many(src, dst)
    assert [key(x, y) for x, y in zip(src.tolist(), dst.tolist())] == list(zip(*(m.tolist() for m in many)))
    assert len({a for a, _ in reps}) < n  # some sources stand for others
    if name in ("small-fattree", "rail-pods"):
        assert {a for a, _ in reps} == {0}  # racks (or pods), hosts and GPUs all move: one source for all


def rail_pods() -> Topology:
    """Eight 2-GPU hosts of a three-tier rail-optimised fabric: two pods of four under their own spines, two
    cores joining the pods (rail-65536 in small, with sprayed routes)."""
    return rail_optimized(8, 2, 2, pods=2).topology().with_routing("spray")


def test_hosts_that_come_in_pods_move_within_their_pod_and_with_it() -> None:
    """Moving the hosts by one is no automorphism where they come in pods (the fourth host's image is in the
    other pod); moving them within their pod and moving the pods are, so every host is another's image."""
    net = Network(rail_pods())
    assert net.topology.levels == (8, 2)
    assert [(d.stride, d.size) for d in net.memo(_DIGITS)] == [(1, 2), (2, 4), (8, 2)]
    assert hosts_alike(net)
    assert not hosts_alike(Network(heterogeneous_nics(((2, 200), (2, 200), (1, 100), (1, 100)), gpus=2).topology()))


def test_the_translations_that_keep_a_steps_pairs() -> None:
    """:func:`pair_orbits` keeps the translations that carry the weighted pairs onto themselves: a ring over
    each host's GPUs moves with all of them; halving-doubling's first step (GPU ``g`` with ``g ^ 1``) not with
    the GPUs' own translation, only with the hosts' and racks'; pairs of unequal weights with none."""
    net = Network(small_fattree())
    ranks = np.arange(64)
    ring_pairs = pair_orbits(net, ranks, ranks // 8 * 8 + (ranks + 1) % 8, np.ones(64))
    assert ring_pairs is not None and {ring_pairs.key(a, (a + 1) % 8 + a // 8 * 8)[0] for a in range(64)} == {0}
    flipped = pair_orbits(net, ranks, ranks ^ 1, np.ones(64))
    assert flipped is not None and {flipped.key(a, a ^ 1)[0] for a in range(64)} == set(range(8))
    assert sum(flipped.count) == len(net.topology.links)
    uneven = pair_orbits(net, ranks, ranks ^ 1, ranks.astype(float))
    assert uneven is None


def test_a_fabric_sprayed_over_more_paths_than_are_listed_times_alike_by_class() -> None:
    """20 spines: a pair across the leaves sprays over 20 paths, each message one flow over all their links
    (counted, not listed), which a translation carries onto its image's: timed by class as rank by rank."""
    topo = parse_topology_text(SMALL_FATTREE.replace("spines: 4", "spines: 20"), "fattree-64-wide.yaml")
    net = Network(topo)
    assert net.sprayed(0, 63) is not None and net.routed_by_shape(0, 63)
    by_class = 0
    for collective, algorithm in (("allreduce", "hierarchical"), ("allreduce", "ring"), ("allgather", "ring")):
        s = compile_schedule(net, collective, algorithm, Options(size_bytes=SIZE)).schedule
        by_class += by_class_and_full(net, symmetrize(s, grid_shapes(topo)))
    assert by_class >= 2
