"""Waves: a reduce-scatter's lower levels reduce first the blocks the levels above pass on first."""

from __future__ import annotations

import pytest

from benchmarks.fabrics import fat_tree
from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.algorithms.hierarchical import hierarchical, stages
from topocc.planner.compiler.algorithms.hierarchical.levels import Phase
from topocc.planner.compiler.algorithms.hierarchical.steps import METHODS
from topocc.planner.compiler.algorithms.hierarchical.waves import waves
from topocc.planner.compiler.options import HierarchicalOptions, Options
from topocc.planner.routing.network import Network


def test_waves_follow_the_level_above() -> None:
    """A host reduces first the blocks its cross-host level sends on, and those it keeps last; a direct level
    above, its sends one step, is fed peer by peer with few slices, and all at once otherwise."""
    net = Network(fat_tree(2, 1, 2, 2).topology())  # two 8-GPU hosts
    levels = stages(net)
    phases = [Phase(0, False), Phase(1, False)]
    spans = [16, 2]
    position = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block = {r: position[0][r] * 2 + position[1][r] for r in range(16)}
    steps = {Phase(si, False): METHODS["halving-doubling"](levels[si].size, False) for si in (0, 1)}
    found = waves(levels, phases, steps, spans, position, block, True)
    for g in levels[0].groups:
        first, kept = found[(0, g[0])]
        # each member keeps one block of its part and sends the other across: the ones sent go first
        assert sorted(first) == [block[r] ^ 1 for r in g] and sorted(kept) == [block[r] for r in g]

    three_net = Network(cluster([4] * 3))
    levels = stages(three_net)
    position = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block = {r: position[0][r] * 3 + position[1][r] for r in range(12)}
    steps = {Phase(0, False): METHODS["ring"](4, False), Phase(1, False): METHODS["direct"](3, False)}
    for in_turn, count in ((True, 3), (False, 2)):
        found = waves(levels, phases, steps, [12, 3], position, block, in_turn)
        assert all(len(w) == count for w in found.values())  # peers in turn, then the kept blocks
        assert all(sum(map(len, w)) == 12 for w in found.values())


def test_waves_for_a_focus_are_those_of_its_groups() -> None:
    """Asked for a few ranks (a build by class), the waves are those of every group with one of them, and no
    other group's."""
    net = Network(cluster([4] * 3))
    levels = stages(net)
    phases = [Phase(0, False), Phase(1, False)]
    position = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block = {r: position[0][r] * 3 + position[1][r] for r in range(12)}
    steps = {Phase(0, False): METHODS["ring"](4, False), Phase(1, False): METHODS["direct"](3, False)}
    every = waves(levels, phases, steps, [12, 3], position, block, True)
    for focus in ({0}, {5, 11}, {3, 4}):
        found = waves(levels, phases, steps, [12, 3], position, block, True, frozenset(focus))
        assert found == {(f, g[0]): every[(f, g[0])] for f in range(1) for g in levels[0].groups
                         if not focus.isdisjoint(g)}


def test_reduce_scatter_in_waves_mirrors_the_all_gather() -> None:
    """In one slice across two hosts, the reduce-scatter in waves sends each block's sum across as soon as the
    host has it, as the all-gather forwards each block as it arrives: just as fast (without waves, a
    quarter slower)."""
    net = Network(fat_tree(2, 1, 2, 2).topology())
    size = 256 << 20
    times = {}
    for collective, unwaved in (("allgather", False), ("reducescatter", False), ("reducescatter", True)):
        pinned = (HierarchicalOptions(layout="blocks", waves=not unwaved) if collective == "reducescatter"
                  else HierarchicalOptions())
        options = Options(size_bytes=size, pipeline=1, hierarchical=pinned)
        schedule = hierarchical(net, collective, options)
        check_schedule(net, schedule, collective, "hierarchical")
        times[(collective, unwaved)] = simulate(net, schedule, size).time_s
    assert times[("reducescatter", False)] == pytest.approx(times[("allgather", False)], rel=1e-3)
    assert times[("reducescatter", True)] > 1.1 * times[("allgather", False)]
