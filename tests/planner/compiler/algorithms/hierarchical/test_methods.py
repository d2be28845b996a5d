"""Each level's method: ring, halving-doubling or direct, as the estimate and its corrections choose."""

from __future__ import annotations

import math

import pytest

from benchmarks.fabrics import fat_tree, rail_optimized
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.algorithms.hierarchical import hierarchical
from topocc.planner.compiler.algorithms.hierarchical.estimates import DIRECT_MAX_SHARING, alike, sharing
from topocc.planner.compiler.algorithms.hierarchical.levels import stages
from topocc.planner.compiler.algorithms.hierarchical.methods import stage_methods, windowed
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import builds_by_class
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology


def test_reduce_scatter_reaches_the_target_across_rails() -> None:
    """On 4 DGX A100 hosts the reduce-scatter's cross-host level runs direct (the windowed pipeline feeds it a
    slice at a time) and the slices ramp up slowly; its host level runs direct too, as the NVSwitch meets
    every pair alike: within 1.5% of the bound at 256 MiB."""
    topology = rail_optimized(4).topology()
    compiled = compile_schedule(topology, "reducescatter", "hierarchical", Options(size_bytes=256 << 20))
    assert compiled.schedule.metadata.options["methods"] == ["direct", "direct"]
    assert compiled.efficiency >= 0.985


def test_all_reduce_times_ecmp_levels_as_spread() -> None:
    """On a 4:1 fat-tree of 64 GPUs the cross-leaf level, timed with ECMP pairs split evenly over their paths
    (as the channel spread comes to), runs halving-doubling, not a ring that one channel's hash collisions
    made look faster."""
    topology = fat_tree(8, 2, 4, 4).topology()
    compiled = compile_schedule(topology, "allreduce", "hierarchical", Options(size_bytes=256 << 20))
    assert compiled.schedule.metadata.options["methods"][-1] == "halving-doubling"
    assert compiled.efficiency >= 0.95


@pytest.mark.parametrize("fed", [False, True])
def test_direct_over_the_sharing_cap_only_where_its_latency_wins(fed: bool) -> None:
    """The cross-leaf level of a 256-GPU 2:1 fat-tree puts 37 messages on a spine link when direct, over the
    cap that bounds an all-reduce's contending slices; where a reduce-scatter's or all-gather's budget leaves
    one slice, the cap is lifted, and direct then runs that level at 1 MiB but not at 4 MiB or 256 MiB, where
    its contention loses in one slice; without ``contend`` (a small collective in a few slices) at 4 MiB
    too."""
    topology = fat_tree(32, 4, 8, 2).topology()
    net = Network(topology)
    levels = stages(net)
    assert [s.size for s in levels] == [8, 4, 8]
    assert sharing(net, levels[-1], 2) > DIRECT_MAX_SHARING
    mib = 1 << 20
    assert stage_methods(net, levels, mib / 8, 8, fed=fed)[-1] != "direct"
    assert stage_methods(net, levels, mib / 8, 8, fed=fed, sharing_cap=math.inf)[-1] == "direct"
    for size in (4 * mib, 256 * mib):
        assert stage_methods(net, levels, size / 8, 8, fed=fed, sharing_cap=math.inf)[-1] != "direct"
    assert stage_methods(net, levels, mib, 4, fed=fed, sharing_cap=math.inf, contend=False)[-1] == "direct"


def test_direct_levels_meet_the_latency_target_on_a_dgx_a100_cluster() -> None:
    """At 1 MiB the pipelined direct levels come within 1.3x of the bound (bandwidth plus path latency)."""
    topology = resolve_topology("dgx-a100-4node")
    net = Network(topology)
    size = 1 << 20
    for collective in ("allgather", "reducescatter", "allreduce"):
        evaluator = Evaluator(net, size)  # an all-reduce's layout is chosen by simulation: timed once
        schedule = hierarchical(net, collective, Options(size_bytes=size, evaluator=evaluator))
        assert schedule.metadata.options["methods"] == ["direct", "direct"]
        ratio = evaluator.simulate(schedule).time_s / evaluator.lower_bound(collective).time_s
        assert 1 <= ratio <= 1.3, (collective, ratio)


def test_windowed_reduce_scatter_keeps_halving_doubling_where_ring_latencies_rule() -> None:
    """The flow-controlled reduce-scatter runs rings, but not where a ring's step latencies alone outlast the
    method timed fastest: 32 hosts of 2 GPUs on one fat-tree at 1 MiB, halving-doubling across the hosts (a
    ring there is well under half as fast); at 256 MiB the ring stays."""
    topology = fat_tree(32, 1, 2, 1, gpus=2).topology()
    net = Network(topology)
    compiled = compile_schedule(net, "reducescatter", "hierarchical", Options(size_bytes=1 << 20))
    assert compiled.schedule.metadata.options["methods"] == ["halving-doubling", "halving-doubling"]
    assert compiled.efficiency >= 0.65
    levels = stages(net)
    assert windowed(net, levels, ["halving-doubling"] * 2, (1 << 20) / 8, 8) == ["halving-doubling"] * 2
    # a level of two members runs one step whatever the method
    assert windowed(net, levels, ["halving-doubling"] * 2, (256 << 20) / 8, 8) == ["halving-doubling", "ring"]


@pytest.mark.parametrize(("name", "first", "share"), [("dgx-a100-4node", "direct", 0.985),
                                                     ("ndv2-2chassis", "ring", 0.995)])
def test_a_reduce_scatter_runs_its_first_level_direct_where_its_pairs_meet_alike(name: str, first: str,
                                                                                share: float) -> None:
    """At 256 MiB a reduce-scatter's host level runs direct on an NVSwitch, where a ring behind the flow
    control is slower, but stays a ring on a hybrid cube-mesh, whose pairs differ (direct there loses a
    tenth)."""
    topology = resolve_topology(name)
    net = Network(topology)
    assert alike(net, stages(net)[0]) == (first == "direct")
    size = 256 << 20
    schedule = hierarchical(net, "reducescatter", Options(size_bytes=size))
    assert schedule.metadata.options["methods"][0] == first
    assert lower_bound(net, "reducescatter", size).time_s >= share * simulate(net, schedule, size).time_s


def test_a_small_reduce_scatter_runs_its_first_level_direct_behind_no_window() -> None:
    """On small messages a first level that is not direct is flow-controlled a slice at a time, so each slice
    waits out its steps' latencies; direct needs no window (32 PCIe GPUs on a fat-tree, 4 to a host, at
    1 MiB)."""
    topology = fat_tree(8, 8, 2, 4, gpus=4).topology()
    net = Network(topology)
    schedule = hierarchical(net, "reducescatter", Options(size_bytes=1 << 20))
    assert schedule.metadata.options["methods"][0] == "direct"
    check_schedule(net, schedule, "reducescatter", "hierarchical")
    bound = lower_bound(net, "reducescatter", 1 << 20).time_s
    assert simulate(net, schedule, 1 << 20).time_s < 1.2 * bound


def test_a_small_collective_built_by_class_may_run_its_levels_direct_uncapped() -> None:
    """fattree-1024 at 1 MiB: its hosts' direct step (7,168 messages) is over a host level's cap and its
    32 leaves' over the sharing cap, so both run halving-doubling; asked uncapped on this fabric built by
    class, every level runs direct."""
    net = Network(resolve_topology("fattree-1024"))
    levels = stages(net)
    assert builds_by_class(net) and [s.size for s in levels] == [8, 4, 32]
    assert stage_methods(net, levels, 1 << 20, 1) == ["halving-doubling", "direct", "halving-doubling"]
    assert stage_methods(net, levels, 1 << 20, 1, class_members=32) == ["direct"] * 3
