"""The decisions behind a schedule: buffer order, slices within the budgets, methods, window, slice shape."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.fabrics import fat_tree, rail_optimized, shipped_fabrics, small_suite, suite
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.analysis.verify_lowered import verify_lowering
from topocc.planner.compiler.algorithms.hierarchical import decisions, hierarchical, slicing
from topocc.planner.compiler.algorithms.hierarchical.slicing import DOUBLING, slice_shape
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import HierarchicalOptions, Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.lowering import chunks_per_round_for, lower


def test_pipelining_overlaps_the_levels() -> None:
    """Slices let the NICs work while the intra-host fabric reduces the next slice: faster than one slice."""
    net = Network(resolve_topology("dgx-a100-4node"))
    size = 64 << 20
    one = simulate(net, hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=1)), size)
    many = simulate(net, hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=16)), size)
    assert many.time_s < 0.8 * one.time_s


@pytest.mark.parametrize("name", ["fattree-16-2to1", "emu-racks", "ndv2-2chassis", "rail-8x8"])
def test_all_reduce_shapes_few_slices_and_keeps_them_in_order(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Where the message budget leaves an all-reduce few large slices (on a thousand ranks; here the budget
    is cut to 8 chunks a block), they double from both ends and each rank keeps at most two in its middle
    levels: faster than equal slices, which fill and drain the pipeline a whole slice at a time."""
    topology = next(f for f in (*suite(), *small_suite(), *shipped_fabrics()) if f.name == name).topology()
    net = Network(topology)
    monkeypatch.setattr(slicing, "MAX_CHUNKS", 8 * topology.size)
    size = 256 << 20
    evaluator = Evaluator(net, size)
    shaped = hierarchical(net, "allreduce", Options(size_bytes=size, evaluator=evaluator))
    slices = shaped.metadata.options["pipeline"]
    assert shaped.metadata.options["slice_shape"] == ":".join(map(str, slice_shape(slices, DOUBLING)))
    check_schedule(net, shaped, "allreduce", "hierarchical")
    equal = hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=slices))
    assert set(equal.metadata.options["slice_shape"].split(":")) == {"1"}
    fast, slow = evaluator.simulate(shaped).time_s, simulate(net, equal, size).time_s
    assert evaluator.lower_bound("allreduce").time_s <= fast < 0.97 * slow
    # small slices stay equal: the doubled ends would be latency-bound
    small = hierarchical(net, "allreduce",
                         Options(size_bytes=8 << 20, hierarchical=HierarchicalOptions(layout="virtual")))
    assert set(small.metadata.options["slice_shape"].split(":")) == {"1"}


def test_reduce_scatter_turns_to_virtual_order_where_blocks_leave_few_slices() -> None:
    """On a 128-GPU fat-tree each rank's block whole leaves a 256 MiB reduce-scatter 4 slices of the message
    budget; without waves virtual order, a part one message, gets more slices and is faster; in waves the
    4 slices of whole blocks come within 3% of the bound, so they stay."""
    topology = fat_tree(16, 4, 4, 1).topology()
    size = 256 << 20

    def run(**extra: Any) -> tuple[float, dict[str, Any]]:
        compiled = compile_schedule(topology, "reducescatter", "hierarchical",
                                    Options(size_bytes=size, hierarchical=HierarchicalOptions(**extra)))
        return compiled.efficiency, dict(compiled.schedule.metadata.options)

    blocks, _ = run(layout="blocks", waves=False)
    unwaved, options = run(waves=False)
    assert options["layout"] == "virtual" and options["pipeline"] > 4
    assert unwaved > blocks
    waved, options = run()
    assert "layout" not in options and options["pipeline"] == 4
    assert waved >= 0.97


@pytest.mark.parametrize("collective", ["reducescatter", "allgather"])
@pytest.mark.parametrize("name", ["rail-4x4", "emu-racks"])
def test_sliced_reduce_scatter_and_all_gather_overlap_the_levels(name: str, collective: str) -> None:
    """Sliced, each level works while the next handles the slice before (in one slice well short of the
    bound), and the flow-controlled reduce-scatter is as fast as the all-gather."""
    size = 256 << 20
    topology = rail_optimized(4, gpus=4, spines=1).topology() if name == "rail-4x4" else resolve_topology(name)
    compiled = compile_schedule(topology, collective, "hierarchical", Options(size_bytes=size))
    assert compiled.efficiency > 0.98
    schedule = compiled.schedule
    verify_lowering(schedule, lower(schedule, chunks_per_round_for(size / schedule.input_chunks)))
    one = compile_schedule(topology, collective, "hierarchical", Options(size_bytes=size, pipeline=1))
    assert one.efficiency < 0.93


@pytest.mark.parametrize(("topology_name", "size"), [("ndv2-2chassis", 64 << 20), ("two-hosts", 64 << 20)])
def test_all_reduce_flow_control_behind_a_ring_or_large_slices(topology_name: str, size: int) -> None:
    """Behind a ring (ndv2-2chassis), an all-reduce's first phase works on one slice at a time; behind
    halving-doubling on 1 MiB slices (two 8-GPU hosts) it does not, each slice's dependent steps then
    waiting out their latencies."""
    topology = resolve_topology(topology_name) if topology_name != "two-hosts" else fat_tree(2, 2, 2, 1).topology()
    compiled = compile_schedule(topology, "allreduce", "hierarchical", Options(size_bytes=size))
    assert compiled.efficiency >= 0.98


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_a_small_collective_left_one_slice_by_the_budget_may_send_more(collective: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the message budget leaves a 1 MiB all-gather or reduce-scatter of whole blocks one slice, its
    levels run one after the other; it may then send four times the budget's messages, here on 4
    rail-optimized hosts with the budget cut to match."""
    net = Network(rail_optimized(4).topology())
    monkeypatch.setattr(slicing, "MAX_TRANSFERS", 1024)
    monkeypatch.setattr(slicing, "TRANSFERS_PER_RANK", 0)
    bound = lower_bound(net, collective, 1 << 20).time_s
    more = hierarchical(net, collective, Options(size_bytes=1 << 20))
    assert more.metadata.options["pipeline"] == 4
    check_schedule(net, more, collective, "hierarchical")
    monkeypatch.setattr(slicing, "SMALL_BUDGET", 1)
    one = hierarchical(net, collective, Options(size_bytes=1 << 20))
    assert one.metadata.options["pipeline"] == 1
    assert simulate(net, more, 1 << 20).time_s < 1.25 * bound
    # one slice runs the levels one after the other: slower than four
    assert simulate(net, one, 1 << 20).time_s > 1.05 * simulate(net, more, 1 << 20).time_s


def test_a_small_all_reduce_of_whole_blocks_keeps_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small all-reduce of whole blocks keeps the message budget, where a reduce-scatter or all-gather may
    exceed it: more slices gained it nothing and took twice as long to build and time."""
    monkeypatch.setattr(slicing, "MAX_TRANSFERS", 1024)
    monkeypatch.setattr(slicing, "TRANSFERS_PER_RANK", 0)
    schedule = hierarchical(Network(rail_optimized(4).topology()), "allreduce",
                            Options(size_bytes=1 << 20, hierarchical=HierarchicalOptions(layout="blocks")))
    assert schedule.metadata.options["pipeline"] == 1


@pytest.mark.parametrize(("collective", "within"), [("allgather", 1.5), ("reducescatter", 1.6)])
def test_a_small_collective_left_one_slice_by_the_cap_runs_direct_over_it(collective: str, within: float,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A small all-gather or reduce-scatter that the sharing cap leaves one slice lifts the cap: its direct
    spine level runs in more slices, here on 128 GPUs on a 2:1 fat-tree, 57 messages sharing a spine link,
    with the budget cut to leave one slice under the cap."""
    monkeypatch.setattr(slicing, "MAX_TRANSFERS", 8192)
    monkeypatch.setattr(slicing, "TRANSFERS_PER_RANK", 0)
    net = Network(fat_tree(16, 4, 2, 2).topology())
    schedule = hierarchical(net, collective, Options(size_bytes=1 << 20))
    assert schedule.metadata.options["methods"] == ["direct"] * 3
    assert schedule.metadata.options["pipeline"] > 1
    check_schedule(net, schedule, collective, "hierarchical")
    bound = lower_bound(net, collective, 1 << 20).time_s
    assert simulate(net, schedule, 1 << 20).time_s < within * bound


def test_methods_are_chosen_again_for_the_one_slice_the_budget_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small reduce-scatter's methods are timed for the slices it wants; where the message budget leaves it
    one, they are timed again for one (the first level's window penalty, counted for slices it could not
    have, would turn it direct and lose the window)."""
    net = Network(fat_tree(8, 8, 2, 4, gpus=4).topology())
    monkeypatch.setattr(slicing, "MAX_TRANSFERS", 256)
    monkeypatch.setattr(slicing, "TRANSFERS_PER_RANK", 0)
    timed: list[int] = []
    original = decisions.stage_methods

    def spy(*args: object, **kwargs: object) -> list[str]:
        timed.append(args[3])  # type: ignore[arg-type]
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(decisions, "stage_methods", spy)
    schedule = hierarchical(net, "reducescatter", Options(size_bytes=1 << 20))
    assert schedule.metadata.options["pipeline"] == 1
    assert max(timed) > 1 and timed[-1] == 1
    assert schedule.metadata.options["methods"][0] != "direct"  # one slice: no window penalty, so the ring
    check_schedule(net, schedule, "reducescatter", "hierarchical")
    # timed for 8 slices, direct there takes 1.58x of the bound; the ring 1.40x
    assert simulate(net, schedule, 1 << 20).time_s < 1.5 * lower_bound(net, "reducescatter", 1 << 20).time_s
