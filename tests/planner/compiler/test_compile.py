"""The compile front door: ``auto``'s candidates record what it measured; source-routed fabrics get paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.planner.compiler.algorithms.test_baselines import switch_cluster
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.evaluate import link_time
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.schedule import load_schedule, save_schedule


def test_auto_candidates_carry_their_link_time() -> None:
    """Every built candidate records its busiest link's time: at most its simulated time, and more than the
    winner's time where it was skipped as unable to win."""
    compiled = compile_schedule(switch_cluster(4, hosts=2), "allgather", "auto", Options(size_bytes=64 << 20))
    built = [c for c in compiled.candidates if c.link_time_s is not None]
    assert any(c.time_s is None for c in built) and any(c.time_s is not None for c in built)
    for c in built:
        assert c.link_time_s is not None  # built: the candidates that carry it
        if c.time_s is not None:
            assert c.link_time_s <= c.time_s * (1 + 1e-9)
        elif "simulation passed" in (c.reason or ""):  # timed against the best and given up
            assert (c.reason or "").startswith("cannot win") and c.operations > 0
        else:
            assert c.reason is not None and c.reason.startswith("cannot win")
            assert c.link_time_s > compiled.sim.time_s
    assert all(c.link_time_s is None for c in compiled.candidates if c.time_s is None
               and not (c.reason or "").startswith(("cannot win", "not tried")))


def test_auto_gives_up_a_simulation_once_it_passes_the_best() -> None:
    """On dgx2 direct's all-reduce is simulated after hierarchical's and given up once it runs past it; the
    race picks what timing it to the end picks (its simulation: longer than the winner's)."""
    from topocc.planner.analysis.simulate import simulate
    from topocc.planner.topology.catalogue import resolve_topology

    topology, options = resolve_topology("dgx2"), Options(size_bytes=1 << 20)
    compiled = compile_schedule(topology, "allreduce", "auto", options)
    direct = next(c for c in compiled.candidates if c.algorithm == "direct")
    assert direct.time_s is None and (direct.reason or "").startswith("cannot win: its simulation passed")
    alone = compile_schedule(topology, "allreduce", "direct", options)
    assert alone.sim.time_s > compiled.sim.time_s == simulate(topology, compiled.schedule, 1 << 20).time_s


def test_auto_races_without_a_solver_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without OR-Tools (the GPU machines) still compiles: the solver-backed candidates decline in one
    line and the bound drops only its LP refinement."""
    import sys

    monkeypatch.setitem(sys.modules, "topocc.planner.solvers.ortools", None)  # any import of it now fails
    topology = switch_cluster(2, 2)
    compiled = compile_schedule(topology, "allreduce", "auto", Options(size_bytes=1 << 20))
    reasons = {c.algorithm: c.reason for c in compiled.candidates}
    assert "is not installed" in (reasons["treepack"] or "")
    assert compiled.schedule.metadata.algorithm not in ("treepack", "mcf")
    assert compiled.sim.time_s >= compiled.bound.time_s * (1 - 1e-9)


FAT_TREE = """
name: small-fat-tree
cluster:
  hosts: 8
  host: {{gpus: 2, fabric: nvswitch, gpu_link: {{bandwidth: 100 GB/s, latency: 1 us}}, nics: 2,
         nic: {{bandwidth: 100 Gbit/s, latency: 1 us}}}}
  network: {{type: fat-tree, hosts_per_leaf: 2, spines: 4, routing: {routing}}}
"""


def test_source_routed_fabrics_get_their_paths_chosen_and_kept(tmp_path: Path) -> None:
    """On a source-routed fat-tree every crossing connection records its spine, the schedule keeps them
    through a save and a load, and the choices beat ECMP's hashing (hierarchical: 99.6% against 93.8%)."""
    options = Options(size_bytes=64 << 20)
    source = parse_topology_text(FAT_TREE.format(routing="source"))
    source_net = Network(source)
    compiled = compile_schedule(source, "allreduce", "hierarchical", options)
    assert compiled.schedule.paths and compiled.schedule.metadata.fingerprint == source.fingerprint
    path = tmp_path / "routed.json"
    save_schedule(compiled.schedule, path)
    loaded = load_schedule(path)
    assert loaded.paths == compiled.schedule.paths
    assert simulate(source, loaded, options.size_bytes).time_s == compiled.sim.time_s
    assert link_time(source_net, loaded, options.size_bytes) <= compiled.sim.time_s
    hashed = compile_schedule(parse_topology_text(FAT_TREE.format(routing="ecmp")), "allreduce", "hierarchical",
                              options)
    assert not hashed.schedule.paths
    assert compiled.sim.time_s < hashed.sim.time_s * 0.97


def test_auto_skips_the_costly_tiers_once_it_is_near_the_bound() -> None:
    """On emu-racks sliced hierarchical all-gather reaches 99.8% of the bound, so auto never builds
    tree packing, MultiTree or the flow LP (seconds to minutes at scale); where the cheap tier falls short
    (a 3x2 mesh, 90.9% with the bucket algorithm) it goes on to them."""
    from benchmarks.fabrics import grid
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.race import GOOD_ENOUGH
    from topocc.planner.topology.catalogue import resolve_topology

    compiled = compile_schedule(resolve_topology("emu-racks"), "allgather", "auto", Options(size_bytes=256 << 20))
    assert compiled.schedule.metadata.algorithm == "hierarchical"
    assert compiled.efficiency >= GOOD_ENOUGH
    for c in compiled.candidates:
        if ALGORITHMS[c.algorithm].auto_tier > 0:
            assert c.time_s is None and c.reason is not None and c.reason.startswith("not tried"), c
    mesh = compile_schedule(grid("mesh", (3, 2)).topology(), "allgather", "auto", Options(size_bytes=256 << 20))
    assert any(c.time_s is not None for c in mesh.candidates if ALGORITHMS[c.algorithm].auto_tier > 0)


def test_auto_stops_simulating_a_tier_once_it_is_near_the_bound() -> None:
    """Within a tier too: on dgx2 halving-doubling's all-gather reaches 99.9% of the bound, so direct and
    hierarchical, built and able to tie it by their busiest links, are not simulated."""
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.race import GOOD_ENOUGH
    from topocc.planner.topology.catalogue import resolve_topology

    compiled = compile_schedule(resolve_topology("dgx2"), "allgather", "auto", Options(size_bytes=256 << 20))
    assert compiled.efficiency >= GOOD_ENOUGH
    winner = compiled.schedule.metadata.algorithm
    skipped = [c for c in compiled.candidates if c.time_s is None and c.link_time_s is not None
               and ALGORITHMS[c.algorithm].auto_tier == ALGORITHMS[winner].auto_tier]
    assert skipped and all(c.link_time_s is not None and c.link_time_s <= compiled.sim.time_s and c.operations > 0
                           for c in skipped)
    assert all((c.reason or "").startswith(f"not tried: {winner} is already at") for c in skipped)


def test_auto_simulates_the_finest_of_equally_loaded_candidates_first() -> None:
    """Halving-doubling and hierarchical load a fat-tree's NICs alike; hierarchical's pipeline, many more
    operations, wins, so it is simulated first and halving-doubling, which can no longer gain 3%, is not
    simulated at all (before: simulated to its end, 3.18 ms against 2.70 ms)."""
    from benchmarks.fabrics import fat_tree

    compiled = compile_schedule(fat_tree(2, 1, 2, 2).topology(), "allreduce", "auto", Options(size_bytes=256 << 20))
    by_name = {c.algorithm: c for c in compiled.candidates}
    assert compiled.schedule.metadata.algorithm == "hierarchical"
    hd = by_name["halving-doubling"]
    assert hd.time_s is None and hd.link_time_s is not None and hd.link_time_s <= compiled.sim.time_s * 1.01
    assert (hd.reason or "").startswith("not tried: hierarchical is already at")


@pytest.mark.parametrize("name", ["dgx1-v100", "emu-racks", "pcie-4x4-10gbe", "ndv2-2chassis", "torus-4x4"])
@pytest.mark.parametrize("collective", ["allgather", "allreduce", "broadcast"])
def test_ring_never_beats_its_chain_of_least_latencies(name: str, collective: str) -> None:
    """The floor auto uses to skip the ring unbuilt is a lower bound of its simulated time (relays included)."""
    from topocc.planner.analysis.simulate import simulate
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.evaluate import least_latency
    from topocc.planner.topology.catalogue import resolve_topology

    topology = resolve_topology(name)
    for size in (1 << 10, 1 << 20):
        schedule = compile_schedule(topology, collective, "ring", Options(size_bytes=size)).schedule
        floor = ALGORITHMS["ring"].min_chain(collective, topology.size) * least_latency(topology)  # type: ignore[misc]
        assert simulate(topology, schedule, size).time_s >= floor * (1 - 1e-9)


def test_auto_skips_the_ring_unbuilt_where_its_latency_chain_loses() -> None:
    """32 ranks at 1 MiB: a ring needs 62 hops of at least 0.7 us; the hierarchical schedule takes 12 us."""
    from topocc.planner.topology.catalogue import resolve_topology

    compiled = compile_schedule(resolve_topology("dgx-a100-4node"), "allreduce", "auto", Options(size_bytes=1 << 20))
    ring = next(c for c in compiled.candidates if c.algorithm == "ring")
    assert ring.time_s is None and ring.operations == 0 and "62 dependent messages" in (ring.reason or "")


def test_auto_skips_the_tree_unbuilt_where_its_link_floor_loses() -> None:
    """32 ranks at 256 MiB: the trees' NIC links alone need 10.7 ms, the hierarchical schedule takes 2.0 ms,
    so the tree is never built (at 1024 ranks its build cost ten seconds of a 50-second race)."""
    from topocc.planner.topology.catalogue import resolve_topology

    compiled = compile_schedule(resolve_topology("dgx-a100-4node"), "allreduce", "auto",
                                Options(size_bytes=256 << 20))
    tree = next(c for c in compiled.candidates if c.algorithm == "tree")
    assert tree.time_s is None and tree.operations == 0 and tree.link_time_s is None
    assert (tree.reason or "").startswith("cannot win: its busiest link alone needs 10.74 ms")
    # where the tree can win (small messages: latency) the floor does not keep it from being built
    small = compile_schedule(resolve_topology("dgx-a100-4node"), "allreduce", "auto", Options(size_bytes=1 << 10))
    assert next(c for c in small.candidates if c.algorithm == "tree").operations > 0
