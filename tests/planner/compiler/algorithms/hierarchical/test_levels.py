"""Hierarchical's levels: stage structure from hosts and racks, and the virtual blocks across them."""

from __future__ import annotations

import pytest

from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.compiler.algorithms.hierarchical import hierarchical
from topocc.planner.compiler.algorithms.hierarchical.levels import spans, split, stages, virtual_blocks
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network


def test_three_levels() -> None:
    topology = cluster([2] * 8, racks=2)  # 2 racks x 4 hosts x 2 GPUs
    net = Network(topology)
    levels = stages(net)
    assert [(s.level, s.size, len(s.groups)) for s in levels] == [("host", 2, 8), ("rack", 4, 4), ("cluster", 2, 8)]
    host_of = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    rack_of = {r: k for k, ranks in enumerate(topology.racks.values()) for r in ranks}
    for g in levels[0].groups:
        assert len({host_of[r] for r in g}) == 1
    for g in levels[1].groups:  # one GPU from each host of one rack
        assert len({host_of[r] for r in g}) == 4 and len({rack_of[r] for r in g}) == 1
    for g in levels[2].groups:  # one GPU from each rack
        assert len({rack_of[r] for r in g}) == 2
    # every rank is in exactly one group per level
    for s in levels:
        assert sorted(r for g in s.groups for r in g) == list(range(16))


def test_trivial_levels_are_skipped() -> None:
    assert [s.level for s in stages(Network(cluster([4, 4, 4])))] == ["host", "cluster"]
    assert [s.level for s in stages(Network(cluster([1, 1, 1])))] == ["cluster"]
    assert [s.level for s in stages(Network(cluster([6])))] == ["host"]


def test_unequal_hosts_decline() -> None:
    with pytest.raises(NotApplicableError, match="equal-sized hosts"):
        stages(Network(cluster([2, 3])))


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_unequal_racks_make_one_level_across_the_hosts(collective: str) -> None:
    """Racks of 2 and 1 hosts (a partly filled last leaf): no rack level, the hosts one level as on one switch."""
    topology = cluster([2, 2, 2], racks=2)
    net = Network(topology)
    assert [(s.level, s.size) for s in stages(net)] == [("host", 2), ("rack", 3)]
    check_schedule(topology, hierarchical(net, collective, Options(pipeline=2)), collective, "hierarchical")


def test_virtual_blocks_give_every_group_one_contiguous_range() -> None:
    """A rank's coordinates read as a mixed-radix number, innermost level most significant: each group of
    each level covers one aligned range of virtual blocks of its span."""
    topology = cluster([2] * 8, racks=2)
    levels = stages(Network(topology))
    blocks = virtual_blocks(levels, 16)
    assert sorted(blocks.block.values()) == list(range(16))
    assert all(blocks.owner[v] == r for r, v in blocks.block.items())
    for s, span in zip(levels, spans(levels, 16)):
        for g in s.groups:
            base = blocks.block[g[0]] // span * span
            assert all(base <= blocks.block[r] < base + span for r in g)
            # the members' own parts: span / size blocks each, in ring order
            assert [(blocks.block[r] - base) // (span // s.size) for r in g] == list(range(s.size))


def test_split_cuts_a_level_into_runs_then_strides() -> None:
    levels = stages(Network(cluster([1] * 8)))
    inner, outer = split(levels[-1], 4)
    (group,) = levels[-1].groups
    assert inner.groups == (group[:4], group[4:])
    assert outer.groups == tuple(group[j::4] for j in range(4))
