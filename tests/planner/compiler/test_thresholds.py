"""Where a plan pays: the size from which the model predicts it beats gloo's own algorithm."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.training.launch import TOPOLOGY
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.bundling import compile_bundle, requests_for
from topocc.planner.compiler.native import native_schedule
from topocc.planner.compiler.size_buckets import compile_plan
from topocc.planner.compiler.thresholds import MIN_PREDICTED_GAIN, native_threshold
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.bundle import load_bundle, save_bundle
from topocc.runtime.plan import Plan

KIB, MIB = 1 << 10, 1 << 20


def gains(net: Network, plan: Plan, size: int, root: int = 0) -> bool:
    mine = simulate(net, plan.select(size), size).time_s
    theirs = simulate(net, native_schedule(net, plan.collective, size, root), size).time_s
    return mine < (1 - MIN_PREDICTED_GAIN) * theirs


def test_the_native_algorithm_itself_gains_nowhere() -> None:
    """A plan that is gloo's own algorithm is never predicted faster: every call goes native."""
    net = Network(parse_topology_text(TOPOLOGY.format(hosts=2, gpus=2), "t2x2"))
    plan = Plan((native_schedule(net, "allreduce", 64 * KIB).with_metadata(min_bytes=0, max_bytes=None),))
    threshold = native_threshold(net, plan, KIB, 4 * MIB)
    assert threshold.native_below is None
    assert [size for size, _, _ in threshold.probes] == [KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB]


def test_a_broadcast_tree_gains_from_a_threshold_on() -> None:
    """On emu-racks gloo's binomial tree sends the whole message log2(12) times in a row: a pipelined plan
    wins from some size on, and loses (or ties) below it; every probe agrees with the threshold."""
    topology = resolve_topology("emu-racks")
    net = Network(topology)
    plan, _ = compile_plan(net, "broadcast", KIB, 4 * MIB)
    threshold = native_threshold(net, plan, KIB, 4 * MIB)
    below = threshold.native_below
    assert below is not None and KIB < below <= 4 * MIB, threshold
    def gain(probe: tuple[int, float, float]) -> bool:
        return probe[1] < (1 - MIN_PREDICTED_GAIN) * probe[2]

    above = [probe for probe in threshold.probes if probe[0] >= below]
    under = [probe for probe in threshold.probes if probe[0] < below]
    assert all(gain(probe) for probe in above) and under and not gain(max(under)), threshold
    assert gains(net, plan, below) and gains(net, plan, 4 * MIB)


@pytest.mark.parametrize("collective", ["reducescatter"])
def test_a_plan_that_gains_everywhere_runs_every_call(collective: str) -> None:
    """gloo's reduce-scatter all-reduces the whole input: any reduce-scatter plan halves its traffic."""
    net = Network(parse_topology_text(TOPOLOGY.format(hosts=2, gpus=1), "t2x1"))
    plan, _ = compile_plan(net, collective, KIB, MIB)
    assert native_threshold(net, plan, KIB, MIB).native_below == 0


def test_compile_bundle_writes_each_plans_threshold(tmp_path: Path) -> None:
    topology = parse_topology_text(TOPOLOGY.format(hosts=2, gpus=1), "t2x1")
    bundle, plans = compile_bundle(topology, requests_for(2, ("allreduce", "reducescatter"), KIB, 64 * KIB))
    assert [e.native_below for e in bundle.plans] == [c.native.native_below for c in plans if c.native]
    assert bundle.plans[1].native_below == 0  # the reduce-scatter plan gains at every size
    loaded = load_bundle(save_bundle(bundle, tmp_path / "b"))
    assert [e.native_below for e in loaded.plans] == [e.native_below for e in bundle.plans]
    unthresholded, _ = compile_bundle(topology, requests_for(2, ("allreduce",), KIB, 64 * KIB), thresholds=False)
    assert unthresholded.plans[0].native_below == 0
