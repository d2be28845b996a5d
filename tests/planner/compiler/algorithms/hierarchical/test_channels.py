"""Channels: every phase has its own, so messages of different phases never queue behind each other."""

from __future__ import annotations

from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from topocc.planner.compiler.algorithms.hierarchical import hierarchical, stages
from topocc.planner.compiler.options import HierarchicalOptions, Options
from topocc.planner.routing.network import Network


def test_every_phase_has_its_own_channel() -> None:
    """A channel carries one level's reduce-scatter or all-gather, so phases never queue behind each other."""
    net = Network(cluster([2] * 8, racks=2))
    # halving-doubling reduces as it receives (recv_reduce), so the receive's kind tells the phase
    pinned = HierarchicalOptions(stage_method="halving-doubling")
    schedule = hierarchical(net, "allreduce", Options(pipeline=4, hierarchical=pinned))
    levels = stages(net)
    group_of = [{r: gi for gi, g in enumerate(s.groups) for r in g} for s in levels]
    phase_of: dict[int, tuple[int, str]] = {}
    for rank, program in enumerate(schedule.programs):
        for op in program:
            if op.kind in ("recv", "recv_reduce"):
                assert op.peer is not None
                # two ranks share a group at exactly one level: the one this message belongs to
                level = next(i for i, g in enumerate(group_of) if g[rank] == g[op.peer])
                assert phase_of.setdefault(op.channel, (level, op.kind)) == (level, op.kind)
    assert sorted(phase_of.values()) == sorted((i, k) for i in range(len(levels)) for k in ("recv", "recv_reduce"))
