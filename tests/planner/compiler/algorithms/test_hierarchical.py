"""Hierarchical (BlueConnect): stage structure from hosts and racks, uniformity checks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topocc.planner.routing.network import Network
from topocc.planner.compiler.options import HierarchicalOptions, Options
from topocc.planner.compiler.algorithms.hierarchical import (
    _DIRECT_MAX_MEMBERS,
    _DOUBLING,
    _METHODS,
    _slice_shape,
    hierarchical,
    ownership,
    stages,
)
from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.errors import NotApplicableError
from benchmarks.fabrics import heterogeneous_nics
from topocc.planner.analysis.simulate import simulate
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from tests.strategies import topologies


def cluster(gpus: list[int], racks: int = 0) -> Topology:
    """Hosts of ``gpus[h]`` GPUs on a switch, NICs on a top switch, ``racks`` racks (0: no rack info)."""
    devices, links = ["devices:"], ["links:"]
    for h, n in enumerate(gpus):
        place = f"host: h{h}" + (f", rack: r{h * racks // len(gpus)}" if racks else "")
        devices += [f"  - {{name: h{h}g, type: gpu, count: {n}, {place}}}",
                    f"  - {{name: h{h}sw, type: nvswitch, {place}}}"]
        links += [f"  - {{ends: [h{h}g{i}, h{h}sw], bandwidth: 100 GB/s, latency: 1 us}}" for i in range(n)]
        links.append(f"  - {{ends: [h{h}sw, top], bandwidth: 10 GB/s, latency: 5 us}}")
    devices.append("  - {name: top, type: switch}")
    return parse_topology_text("\n".join(["name: cluster", *devices, *links]))


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


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("shape", [([2] * 8, 2), ([3] * 4, 0), ([4] * 3, 3), ([1] * 5, 0)])
def test_schedules_verify(collective: str, shape: tuple[list[int], int]) -> None:
    topology = cluster(*shape)
    net = Network(topology)
    schedule = hierarchical(net, collective, Options(pipeline=2))
    check_schedule(topology, schedule, collective, "hierarchical")


def test_intra_host_stage_stays_in_host() -> None:
    topology = cluster([4, 4])
    net = Network(topology)
    schedule = hierarchical(net, "allreduce", Options(pipeline=1))
    host_of = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    cross = [op for r, p in enumerate(schedule.programs) for op in p
             if op.kind == "send" and host_of[op.peer] != host_of[r]]
    # only the cross-host stage leaves the host: one block (1/8 of the data) each way per rank
    assert all(op.count == 1 for op in cross) and len(cross) == 2 * 8


def test_unequal_hosts_decline() -> None:
    with pytest.raises(NotApplicableError, match="equal-sized hosts"):
        hierarchical(Network(cluster([2, 3])), "allreduce", Options())


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_unequal_racks_make_one_level_across_the_hosts(collective: str) -> None:
    """Racks of 2 and 1 hosts (a partly filled last leaf): no rack level, the hosts one level as on one switch."""
    topology = cluster([2, 2, 2], racks=2)
    net = Network(topology)
    assert [(s.level, s.size) for s in stages(net)] == [("host", 2), ("rack", 3)]
    check_schedule(topology, hierarchical(net, collective, Options(pipeline=2)), collective, "hierarchical")


# --------------------------------------------------------------------------- pipelined stages


def _owners_after(steps: list[list[tuple[int, int, int, int]]], n: int) -> list[set[int]]:
    """Run reduce-scatter steps on sets of contributions: which members each member's own part holds."""
    holds = [[{i} for _ in range(n)] for i in range(n)]  # holds[member][part] = contributions
    for step in steps:
        sent = [(k, a, e, [set(holds[i][x]) for x in range(a, e)]) for i, k, a, e in step]
        for k, a, e, values in sent:
            for x, value in zip(range(a, e), values):
                assert not holds[k][x] & value, "a contribution would be counted twice"
                holds[k][x] |= value
    return [holds[i][i] for i in range(n)]


@pytest.mark.parametrize("method", ["ring", "halving-doubling", "direct"])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_phase_steps_reduce_and_gather(method: str, n: int) -> None:
    rs = _METHODS[method](n, False)
    assert _owners_after(rs, n) == [set(range(n))] * n
    assert len(rs) == {"ring": n - 1, "halving-doubling": n.bit_length() - 1, "direct": 1}[method]
    # the all-gather starts from each member's own part and ends with every part everywhere
    have = [{i} for i in range(n)]
    for step in _METHODS[method](n, True):
        sent = [(k, set(range(a, e))) for i, k, a, e in step if set(range(a, e)) <= have[i]]
        assert len(sent) == len(step), "a member sends a part it does not hold yet"
        for k, parts in sent:
            have[k] |= parts
    assert have == [set(range(n))] * n


SHIPPED = ["dgx-a100-4node", "emu-racks", "emu-uniform", "pcie-4x4-10gbe"]


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("pipeline", [1, 3, None])
@pytest.mark.parametrize("method", [None, "ring", "halving-doubling", "direct"])
def test_pipelined_schedules_verify_on_shipped_clusters(name: str, pipeline: int | None, method: str | None) -> None:
    from topocc.planner.topology.catalogue import resolve_topology

    topology = resolve_topology(name)
    net = Network(topology)
    extra = {"stage_method": method} if method else {}
    schedule = hierarchical(net, "allreduce", Options(size_bytes=16 << 20, pipeline=pipeline, hierarchical=HierarchicalOptions(**extra)))
    check_schedule(topology, schedule, "allreduce", "hierarchical")
    shape = [int(x) for x in schedule.metadata.options["slice_shape"].split(":")]
    assert len(shape) == schedule.metadata.options["pipeline"]
    assert schedule.output_chunks == topology.size * sum(shape)
    if method is not None:
        sizes = [int(level.split(":")[1]) for level in schedule.metadata.options["levels"]]
        fits = {"ring": lambda n: True, "halving-doubling": lambda n: n & (n - 1) == 0,
                "direct": lambda n: n <= _DIRECT_MAX_MEMBERS}
        for size, used in zip(sizes, schedule.metadata.options["methods"]):
            assert used == ("halving-doubling" if size == 2 else method if fits[method](size) else used)


@pytest.mark.parametrize("shape", [([2] * 8, 2), ([3] * 4, 0), ([4] * 4, 2), ([1] * 6, 3), ([8] * 2, 0)])
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_pipelined_schedules_verify_on_small_clusters(shape: tuple[list[int], int], collective: str) -> None:
    topology = cluster(*shape)
    net = Network(topology)
    for pipeline in (2, 5):
        schedule = hierarchical(net, collective, Options(size_bytes=8 << 20, pipeline=pipeline))
        check_schedule(topology, schedule, collective, "hierarchical")


def test_every_phase_has_its_own_channel() -> None:
    """A channel carries one level's reduce-scatter or all-gather, so phases never queue behind each other."""
    topology = cluster([2] * 8, racks=2)
    net = Network(topology)
    # halving-doubling reduces as it receives (recv_reduce), so the receive's kind tells the phase
    schedule = hierarchical(net, "allreduce", Options(pipeline=4, hierarchical=HierarchicalOptions(stage_method="halving-doubling")))
    levels = stages(net)
    group_of = [{r: gi for gi, g in enumerate(s.groups) for r in g} for s in levels]
    phase_of: dict[int, tuple[int, str]] = {}
    for rank, program in enumerate(schedule.programs):
        for op in program:
            if op.kind in ("recv", "recv_reduce"):
                # two ranks share a group at exactly one level: the one this message belongs to
                level = next(i for i, g in enumerate(group_of) if g[rank] == g[op.peer])
                assert phase_of.setdefault(op.channel, (level, op.kind)) == (level, op.kind)
    assert sorted(phase_of.values()) == sorted((i, k) for i in range(len(levels)) for k in ("recv", "recv_reduce"))


def test_pipelining_overlaps_the_levels() -> None:
    """Slices let the NICs work while the intra-host fabric reduces the next slice: faster than one slice."""
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.planner.analysis.simulate import simulate

    topology = resolve_topology("dgx-a100-4node")
    net = Network(topology)
    size = 64 << 20
    one = simulate(topology, hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=1)), size)
    many = simulate(topology, hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=16)), size)
    assert many.time_s < 0.8 * one.time_s


def test_unknown_stage_method_declines() -> None:
    with pytest.raises(NotApplicableError, match="stage_method"):
        hierarchical(Network(cluster([4] * 4)), "allreduce", Options(hierarchical=HierarchicalOptions(stage_method="tree")))


@pytest.mark.parametrize("gpus", [[2, 3], [4, 4, 2], [1, 2]])
def test_uneven_clusters_decline_with_any_pipeline(gpus: list[int]) -> None:
    for pipeline in (None, 4):
        with pytest.raises(NotApplicableError, match="equal-sized hosts"):
            hierarchical(Network(cluster(gpus)), "allreduce", Options(pipeline=pipeline))


# --------------------------------------------------------------------------- sliced reduce-scatter, all-gather


def test_slice_shape_is_small_at_both_ends() -> None:
    assert _slice_shape(1) == (1,)
    assert _slice_shape(4) == (1, 2, 2, 1)
    assert _slice_shape(9) == (1, 2, 3, 4, 6, 8, 4, 2, 1)  # grows by about 1.5, halves at the end
    assert _slice_shape(11) == (1, 2, 3, 4, 6, 8, 8, 8, 4, 2, 1)


def test_few_slices_double_from_both_ends() -> None:
    assert _slice_shape(4, _DOUBLING) == (1, 2, 2, 1)
    assert _slice_shape(8, _DOUBLING) == (1, 2, 4, 8, 8, 4, 2, 1)
    assert _slice_shape(11, _DOUBLING) == (1, 2, 4, 8, 8, 8, 8, 8, 4, 2, 1)


@pytest.mark.parametrize("name", ["fattree-16-2to1", "emu-racks", "ndv2-2chassis", "rail-8x8"])
def test_all_reduce_shapes_few_slices_and_keeps_them_in_order(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Issue #11: where the message budget leaves an all-reduce few large slices (on a thousand ranks; here
    the budget is cut to 8 chunks a block), they double from both ends and each rank keeps at most two in its
    middle levels: faster than equal slices, which fill and drain the pipeline a whole slice at a time (the
    1024-GPU fat-tree at 256 MiB: 92.9% of the bound equal, 96.7% so)."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from benchmarks.fabrics import shipped_fabrics, small_suite, suite

    topology = next(f for f in (*suite(), *small_suite(), *shipped_fabrics()) if f.name == name).topology()
    net = Network(topology)
    monkeypatch.setattr(module, "_MAX_CHUNKS", 8 * topology.size)
    size = 256 << 20
    shaped = hierarchical(net, "allreduce", Options(size_bytes=size))
    slices = shaped.metadata.options["pipeline"]
    assert shaped.metadata.options["slice_shape"] == ":".join(map(str, _slice_shape(slices, _DOUBLING)))
    check_schedule(topology, shaped, "allreduce", "hierarchical")
    equal = hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=slices))
    assert set(equal.metadata.options["slice_shape"].split(":")) == {"1"}
    fast, slow = simulate(topology, shaped, size).time_s, simulate(topology, equal, size).time_s
    assert lower_bound(topology, "allreduce", size).time_s <= fast < 0.97 * slow
    # small slices stay equal: the doubled ends would be latency-bound
    small = hierarchical(net, "allreduce", Options(size_bytes=8 << 20, hierarchical=HierarchicalOptions(layout="virtual")))
    assert set(small.metadata.options["slice_shape"].split(":")) == {"1"}


@pytest.mark.parametrize("shape", [([2] * 8, 2), ([3] * 4, 0), ([4] * 4, 2), ([8] * 2, 0)])
@pytest.mark.parametrize(("pipeline", "size"), [(1, 1 << 20), (3, 1 << 20), (None, 1 << 20), (None, 256 << 20)])
def test_reduce_scatter_in_virtual_order_verifies(shape: tuple[list[int], int], pipeline: int | None,
                                                  size: int) -> None:
    """Issue #11: in virtual order each rank ends by sending its sums to the ranks they belong to (pieces
    that straddle two ranks' blocks too: at 256 MiB the slices are shaped); it verifies and never beats the
    bound."""
    topology = cluster(*shape)
    net = Network(topology)
    schedule = hierarchical(net, "reducescatter",
                            Options(size_bytes=size, pipeline=pipeline, hierarchical=HierarchicalOptions(layout="virtual")))
    assert schedule.metadata.options["layout"] == "virtual"
    check_schedule(topology, schedule, "reducescatter", "hierarchical")
    assert simulate(topology, schedule, size).time_s >= lower_bound(topology, "reducescatter", size).time_s * (
        1 - 1e-9)


def test_reduce_scatter_turns_to_virtual_order_where_blocks_leave_few_slices() -> None:
    """Issue #11: on a 128-GPU fat-tree each rank's block whole leaves a 256 MiB reduce-scatter 4 slices of
    the message budget; without waves that is 90.5% of the bound, and virtual order, a part one message, gets
    23 slices (91.6%); in waves the 4 slices of whole blocks reach 99.1%, so they stay."""
    from topocc.planner.compiler.compile import compile_schedule
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(16, 4, 4, 1).topology()
    size = 256 << 20

    def run(**extra: object) -> tuple[float, dict[str, object]]:
        compiled = compile_schedule(topology, "reducescatter", "hierarchical", Options(size_bytes=size, hierarchical=HierarchicalOptions(**extra)))
        return compiled.efficiency, dict(compiled.schedule.metadata.options)

    blocks, _ = run(layout="blocks", waves=False)
    unwaved, options = run(waves=False)
    assert options["layout"] == "virtual" and options["pipeline"] > 4
    assert unwaved > blocks
    waved, options = run()
    assert "layout" not in options and options["pipeline"] == 4
    assert waved >= 0.97


def test_waves_follow_the_level_above() -> None:
    """A host reduces first the blocks its cross-host level sends on, and those it keeps last; a direct level
    above, its sends one step, is fed peer by peer with few slices, and all at once otherwise."""
    from topocc.planner.compiler.algorithms.hierarchical import _waves
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(2, 1, 2, 2).topology()  # two 8-GPU hosts
    net = Network(topology)
    levels = stages(net)
    phases = [(0, False), (1, False)]
    spans = [16, 2]
    position = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block = {r: position[0][r] * 2 + position[1][r] for r in range(16)}
    steps = {(si, False): _METHODS["halving-doubling"](levels[si].size, False) for si in (0, 1)}
    waves = _waves(levels, phases, steps, spans, position, block, True)
    for g in levels[0].groups:
        first, kept = waves[(0, g[0])]
        # each member keeps one block of its part and sends the other across: the ones sent go first
        assert sorted(first) == [block[r] ^ 1 for r in g] and sorted(kept) == [block[r] for r in g]

    three = cluster([4] * 3)
    three_net = Network(three)
    levels = stages(three_net)
    position = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block = {r: position[0][r] * 3 + position[1][r] for r in range(12)}
    steps = {(0, False): _METHODS["ring"](4, False), (1, False): _METHODS["direct"](3, False)}
    for in_turn, count in ((True, 3), (False, 2)):
        waves = _waves(levels, phases, steps, [12, 3], position, block, in_turn)
        assert all(len(w) == count for w in waves.values())  # peers in turn, then the kept blocks
        assert all(sum(map(len, w)) == 12 for w in waves.values())


def test_reduce_scatter_in_waves_mirrors_the_all_gather() -> None:
    """Issue #11: in one slice across two hosts, the reduce-scatter in waves sends each block's sum across as
    soon as the host has it, as the all-gather forwards each block as it arrives: just as fast (77.4% of the
    bound both; the reduce-scatter took 2.130 ms to the all-gather's 1.739 ms without waves)."""
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(2, 1, 2, 2).topology()
    net = Network(topology)
    size = 256 << 20
    times = {}
    for collective, extra in (("allgather", {}), ("reducescatter", {}), ("reducescatter", {"waves": False})):
        pinned = HierarchicalOptions(layout="blocks", **extra) if collective == "reducescatter" else HierarchicalOptions()
        options = Options(size_bytes=size, pipeline=1, hierarchical=pinned)
        schedule = hierarchical(net, collective, options)
        check_schedule(topology, schedule, collective, "hierarchical")
        times[(collective, bool(extra))] = simulate(topology, schedule, size).time_s
    assert times[("reducescatter", False)] == pytest.approx(times[("allgather", False)], rel=1e-3)
    assert times[("reducescatter", True)] > 1.1 * times[("allgather", False)]


@pytest.mark.parametrize("pipeline", [None, 1, 3])
@pytest.mark.parametrize("topology", [cluster([4] * 3), cluster([2] * 4, racks=2)], ids=["hosts", "racks"])
def test_all_reduce_of_whole_blocks_verifies(topology: Topology, pipeline: int | None) -> None:
    """An all-reduce with each rank's block whole: a reduce-scatter in waves, then an all-gather, in place."""
    net = Network(topology)
    for size in (1 << 20, 256 << 20):
        schedule = hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=pipeline,
                                                               hierarchical=HierarchicalOptions(layout="blocks")))
        assert schedule.metadata.options["layout"] == "blocks"
        check_schedule(topology, schedule, "allreduce", "hierarchical")
        assert simulate(topology, schedule, size).time_s >= lower_bound(topology, "allreduce", size).time_s * (
            1 - 1e-9)


def test_all_reduce_takes_whole_blocks_where_they_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #11: on 128 GPUs at 256 MiB the all-reduce of whole blocks (a reduce-scatter in waves and an
    all-gather) comes within 97% of the bound and is taken unbuilt the other way (98.4%; virtual order:
    97.9%); asked to compare, hierarchical keeps the faster as simulated; on 32 GPUs near the bound in virtual
    order it is not tried."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from benchmarks.fabrics import rail_optimized

    size = 256 << 20
    topology = rail_optimized(16).topology()
    net = Network(topology)
    times = {}
    for layout in ("blocks", "virtual"):
        built = hierarchical(net, "allreduce", Options(size_bytes=size, hierarchical=HierarchicalOptions(layout=layout)))
        times[layout] = simulate(topology, built, size).time_s
    bound = lower_bound(topology, "allreduce", size).time_s
    assert bound >= 0.97 * times["blocks"]
    chosen = hierarchical(net, "allreduce", Options(size_bytes=size))
    assert chosen.metadata.options["layout"] == "blocks"
    monkeypatch.setattr(module, "_BLOCKS_GOOD", 1.01)  # never near enough: both built, the faster kept
    chosen = hierarchical(net, "allreduce", Options(size_bytes=size))
    assert simulate(topology, chosen, size).time_s == pytest.approx(min(times.values()))
    monkeypatch.undo()
    small = rail_optimized(4).topology()  # 98.6% in virtual order: nothing else is tried
    small_net = Network(small)
    assert "layout" not in hierarchical(small_net, "allreduce", Options(size_bytes=size)).metadata.options


def test_all_reduce_tries_whole_blocks_where_virtual_order_falls_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #11: on two 16-GPU chassis joined through some of their GPUs, the all-reduce in virtual-block
    order is short of 97% of the bound (4 MiB: 89.2%), so whole blocks are tried too and kept where faster
    (92.6%); up to 64 ranks only; where virtual order comes near the bound, nothing else is built."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from benchmarks.fabrics import multi_chassis, rail_optimized

    size = 4 << 20
    topology = multi_chassis(2, 16, "subset").topology()
    net = Network(topology)
    times = {layout: simulate(topology, hierarchical(net, "allreduce", Options(
        size_bytes=size, hierarchical=HierarchicalOptions(layout=layout))), size).time_s for layout in ("blocks", "virtual")}
    assert lower_bound(topology, "allreduce", size).time_s < 0.97 * times["virtual"]
    assert times["blocks"] < times["virtual"]
    chosen = hierarchical(net, "allreduce", Options(size_bytes=size))
    assert chosen.metadata.options["layout"] == "blocks"
    assert simulate(topology, chosen, size).time_s == pytest.approx(times["blocks"])
    monkeypatch.setattr(module, "_BLOCKS_TRIED_RANKS", 16)
    assert "layout" not in hierarchical(net, "allreduce", Options(size_bytes=size)).metadata.options
    monkeypatch.undo()
    built: list[str | None] = []
    real = module._hierarchical
    monkeypatch.setattr(module, "_hierarchical", lambda *a: built.append(a[-1]) or real(*a))
    near = rail_optimized(4).topology()  # 98.6% in virtual order at 256 MiB
    near_net = Network(near)
    hierarchical(near_net, "allreduce", Options(size_bytes=256 << 20))
    assert built == ["virtual"]


def test_reduce_scatter_reaches_the_target_across_rails() -> None:
    """Issue #11: on 4 DGX A100 hosts the reduce-scatter's cross-host level runs direct (the windowed pipeline
    feeds it a slice at a time) and the slices ramp up slowly: 97.5% of the bound at 256 MiB (95.6% before,
    with a ring there and slices doubling); its host level runs direct too, as the NVSwitch meets every pair
    alike: 98.9%."""
    from topocc.planner.compiler.compile import compile_schedule
    from benchmarks.fabrics import rail_optimized

    topology = rail_optimized(4).topology()
    compiled = compile_schedule(topology, "reducescatter", "hierarchical", Options(size_bytes=256 << 20))
    assert compiled.schedule.metadata.options["methods"] == ["direct", "direct"]
    assert compiled.efficiency >= 0.985


def test_all_reduce_times_ecmp_levels_as_spread() -> None:
    """Issue #11: on a 4:1 fat-tree of 64 GPUs the cross-leaf level, timed with ECMP pairs split evenly over
    their paths (as the channel spread comes to), runs halving-doubling, not a ring that one channel's hash
    collisions made look faster: 98.0% of the bound at 256 MiB (85.2% with the ring)."""
    from topocc.planner.compiler.compile import compile_schedule
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(8, 2, 4, 4).topology()
    compiled = compile_schedule(topology, "allreduce", "hierarchical", Options(size_bytes=256 << 20))
    assert compiled.schedule.metadata.options["methods"][-1] == "halving-doubling"
    assert compiled.efficiency >= 0.95


@pytest.mark.parametrize("fed", [False, True])
def test_direct_over_the_sharing_cap_only_where_its_latency_wins(fed: bool) -> None:
    """Issue #11: the cross-leaf level of a 256-GPU 2:1 fat-tree puts 37 messages on a spine link when direct,
    over the cap that bounds an all-reduce's contending slices; where a reduce-scatter's or all-gather's
    budget leaves one slice, the cap is lifted, and direct then runs that level at 1 MiB (all-gather 2.11x ->
    1.65x of the bound) but not at 4 MiB or 256 MiB, where its contention loses in one slice (1.33x / 83.1%,
    against halving-doubling's 1.22x and a ring's 97.9%); without ``contend`` (a small collective in a few
    slices, see the test below) at 4 MiB too."""
    import math

    from topocc.planner.compiler.algorithms.hierarchical import _DIRECT_MAX_SHARING, _sharing, stage_methods
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(32, 4, 8, 2).topology()
    net = Network(topology)
    levels = stages(net)
    assert [s.size for s in levels] == [8, 4, 8]
    assert _sharing(net, levels[-1], 2) > _DIRECT_MAX_SHARING
    mib = 1 << 20
    assert stage_methods(net, levels, mib / 8, 8, fed=fed)[-1] != "direct"
    assert stage_methods(net, levels, mib / 8, 8, fed=fed, sharing_cap=math.inf)[-1] == "direct"
    for size in (4 * mib, 256 * mib):
        assert stage_methods(net, levels, size / 8, 8, fed=fed, sharing_cap=math.inf)[-1] != "direct"
    assert stage_methods(net, levels, mib, 4, fed=fed, sharing_cap=math.inf, contend=False)[-1] == "direct"


@pytest.mark.parametrize("collective", ["reducescatter", "allgather"])
@pytest.mark.parametrize("name", ["rail-4x4", "emu-racks"])
def test_sliced_reduce_scatter_and_all_gather_overlap_the_levels(name: str, collective: str) -> None:
    """Issue #11: sliced, each level works while the next handles the slice before (one slice: 55-92% of the
    bound on these; measured 99.5-99.8%), and the flow-controlled reduce-scatter is as fast as the all-gather."""
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.topology.catalogue import resolve_topology
    from benchmarks.fabrics import rail_optimized
    from topocc.planner.analysis.verify_lowered import verify_lowering
    from topocc.runtime.lowering import chunks_per_round_for, lower

    size = 256 << 20
    topology = rail_optimized(4, gpus=4, spines=1).topology() if name == "rail-4x4" else resolve_topology(name)
    compiled = compile_schedule(topology, collective, "hierarchical", Options(size_bytes=size))
    assert compiled.efficiency > 0.98
    schedule = compiled.schedule
    verify_lowering(schedule, lower(schedule, chunks_per_round_for(size / schedule.input_chunks)))
    one = compile_schedule(topology, collective, "hierarchical", Options(size_bytes=size, pipeline=1))
    assert one.efficiency < 0.93


# --------------------------------------------------------------------------- direct levels


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_direct_stages_take_one_step_and_reduce_from_their_own_slots(collective: str) -> None:
    """A direct level is one step; its reduce-scatter receives each peer's part into a slot of its own (plain
    receives that run at once), then reduces locally, so it pays one path latency, not one per peer."""
    topology = cluster([4] * 3)
    net = Network(topology)
    schedule = hierarchical(net, collective, Options(size_bytes=1 << 20, hierarchical=HierarchicalOptions(stage_method="direct")))
    check_schedule(topology, schedule, collective, "hierarchical")
    assert schedule.metadata.options["methods"] == ["direct", "direct"]
    assert schedule.metadata.options["pipeline"] > 1  # several slices even at 1 MiB: the levels overlap
    kinds = {op.kind for program in schedule.programs for op in program}
    assert "recv_reduce" not in kinds
    assert ("reduce" in kinds) == (collective != "allgather")
    steps = {op.step for program in schedule.programs for op in program if op.kind == "send"}
    assert len(steps) == {"allreduce": 4, "reducescatter": 2, "allgather": 2}[collective]


def test_direct_levels_meet_the_latency_target_on_a_dgx_a100_cluster() -> None:
    """At 1 MiB the pipelined direct levels come within 1.3x of the bound (bandwidth plus path latency)."""
    from topocc.planner.analysis.bounds import lower_bound
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.planner.analysis.simulate import simulate

    topology = resolve_topology("dgx-a100-4node")
    net = Network(topology)
    size = 1 << 20
    for collective in ("allgather", "reducescatter", "allreduce"):
        schedule = hierarchical(net, collective, Options(size_bytes=size))
        assert schedule.metadata.options["methods"] == ["direct", "direct"]
        ratio = simulate(topology, schedule, size).time_s / lower_bound(topology, collective, size).time_s
        assert 1 <= ratio <= 1.3, (collective, ratio)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=topologies(max_hosts=3, max_gpus=3), data=st.data())
def test_direct_levels_on_random_topologies(topology: Topology, data: st.DataObject) -> None:
    """Forced direct levels, in either buffer order, verify, lower into NCCL groups the proof accepts, and
    never beat the bound."""
    net = Network(topology)
    from topocc.planner.analysis.bounds import lower_bound
    from topocc.planner.analysis.simulate import simulate
    from topocc.planner.analysis.verify_lowered import verify_lowering
    from topocc.runtime.lowering import lower

    collective = data.draw(st.sampled_from(["allreduce", "reducescatter", "allgather"]))
    size = data.draw(st.sampled_from([1 << 10, 1 << 20]))
    extra = {"stage_method": "direct"}
    if collective == "reducescatter":  # either buffer order (virtual: the sums handed on at the end)
        extra["layout"] = data.draw(st.sampled_from(["blocks", "virtual"]))
    try:
        schedule = hierarchical(net, collective, Options(size_bytes=size, hierarchical=HierarchicalOptions(**extra)))
    except NotApplicableError:
        return
    check_schedule(topology, schedule, collective, "hierarchical")
    verify_lowering(schedule, lower(schedule, data.draw(st.integers(1, 8))))
    time_s = simulate(topology, schedule, size).time_s
    assert time_s >= lower_bound(topology, collective, size).time_s * (1 - 1e-9)


# --------------------------------------------------------------------------- ownership on unequal NICs

#: Four hosts of two GPUs on one switch: two with two 200 Gbit/s NICs (25 GB/s per GPU), two with one
#: 100 Gbit/s NIC (6.25 GB/s per GPU).  Of two hosts (small_suite's hetero-nics-2x4) ownership moves
#: nothing: each host sends the data once whatever it owns.
UNEQUAL_NICS = ((2, 200), (2, 200), (1, 100), (1, 100))


def test_ownership_follows_each_hosts_nics() -> None:
    """Issue #11: the ranks of the fast hosts reduce the last level's data for the slow ones, whose NICs then
    carry it once each way (owning a quarter, they would carry it 1.5 times); equal NICs keep equal parts."""
    topology = heterogeneous_nics(UNEQUAL_NICS, gpus=2).topology()
    net = Network(topology)
    levels = stages(net)
    owned = ownership(net, levels[-1], len(levels) - 1)
    assert owned is not None
    host = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    assert {host[r]: parts for r, parts in owned.items()} == {0: 2, 1: 2, 2: 0, 3: 0}
    equal = heterogeneous_nics(((1, 100),) * 4, gpus=2).topology()
    equal_net = Network(equal)
    assert ownership(equal_net, stages(equal_net)[-1], 1) is None


@pytest.mark.parametrize(("size", "within"), [(1 << 20, 1.3), (64 << 20, 1.05)])
def test_all_reduce_on_unequal_nics_comes_near_the_bound(size: int, within: float) -> None:
    """The bound is the slow host's cut (the data once each way over its NIC); equal ownership took 1.5x it."""
    topology = heterogeneous_nics(UNEQUAL_NICS, gpus=2).topology()
    net = Network(topology)
    schedule = hierarchical(net, "allreduce", Options(size_bytes=size))
    check_schedule(topology, schedule, "allreduce", "hierarchical")
    assert schedule.metadata.options["methods"][-1] == "direct"
    ratio = simulate(topology, schedule, size).time_s / lower_bound(topology, "allreduce", size).time_s
    assert 1 - 1e-9 <= ratio <= within, ratio


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nics=st.lists(st.sampled_from([(1, 100), (1, 200), (2, 100), (2, 200)]), min_size=3, max_size=4),
       gpus=st.sampled_from([2, 4]), size=st.sampled_from([1 << 16, 1 << 20, 64 << 20]))
def test_unequal_ownership_verifies_and_never_beats_the_bound(nics: list[tuple[int, int]], gpus: int,
                                                              size: int) -> None:
    topology = heterogeneous_nics(tuple(nics), gpus=gpus).topology()
    net = Network(topology)
    schedule = hierarchical(net, "allreduce", Options(size_bytes=size))
    check_schedule(topology, schedule, "allreduce", "hierarchical")
    assert simulate(topology, schedule, size).time_s >= lower_bound(topology, "allreduce", size).time_s * (1 - 1e-9)


@pytest.mark.parametrize(("topology_name", "size"), [("ndv2-2chassis", 64 << 20), ("two-hosts", 64 << 20)])
def test_all_reduce_flow_control_behind_a_ring_or_large_slices(topology_name: str, size: int) -> None:
    """Issue #11: behind a ring (ndv2-2chassis), an all-reduce's first phase works on one slice at a time
    (83.7% of the bound without that, 98.9% with it); behind halving-doubling on 1 MiB slices (two 8-GPU
    hosts) it does not, each slice's dependent steps then waiting out their latencies (83.0%, not 98.6%)."""
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.topology.catalogue import resolve_topology
    from benchmarks.fabrics import fat_tree

    topology = resolve_topology(topology_name) if topology_name != "two-hosts" else fat_tree(2, 2, 2, 1).topology()
    compiled = compile_schedule(topology, "allreduce", "hierarchical", Options(size_bytes=size))
    assert compiled.efficiency >= 0.98


def test_windowed_reduce_scatter_keeps_halving_doubling_where_ring_latencies_rule() -> None:
    """Issue #11: the flow-controlled reduce-scatter runs rings, but not where a ring's step latencies alone
    outlast the method timed fastest: 32 hosts of 2 GPUs on one fat-tree at 1 MiB, halving-doubling across
    the hosts, 68.2% of the bound (a ring, 27.8%); at 256 MiB the ring stays."""
    from topocc.planner.compiler.algorithms.hierarchical import _windowed, stages
    from topocc.planner.compiler.compile import compile_schedule
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(32, 1, 2, 1, gpus=2).topology()
    net = Network(topology)
    compiled = compile_schedule(topology, "reducescatter", "hierarchical", Options(size_bytes=1 << 20))
    assert compiled.schedule.metadata.options["methods"] == ["halving-doubling", "halving-doubling"]
    assert compiled.efficiency >= 0.65
    levels = stages(net)
    assert _windowed(net, levels, ["halving-doubling"] * 2, (1 << 20) / 8, 8) == ["halving-doubling"] * 2
    # a level of two members runs one step whatever the method
    assert _windowed(net, levels, ["halving-doubling"] * 2, (256 << 20) / 8, 8) == ["halving-doubling", "ring"]


def test_small_all_reduces_also_try_whole_blocks() -> None:
    """Issue #11: at 1 MiB an all-reduce also tries whole blocks (a reduce-scatter and an all-gather), up to
    256 ranks, and keeps the faster: two chassis of 16 GPUs, 89.8% of the bound in virtual order, 91.4% so."""
    from topocc.planner.compiler.algorithms.hierarchical import _blocks_may_help
    from topocc.planner.compiler.compile import compile_schedule
    from benchmarks.fabrics import fat_tree, multi_chassis

    topology = multi_chassis(2, 16, "one-way").topology()
    compiled = compile_schedule(topology, "allreduce", "hierarchical", Options(size_bytes=1 << 20))
    assert compiled.schedule.metadata.options["layout"] == "blocks"
    assert compiled.efficiency >= 0.91
    small = Options(size_bytes=1 << 20)
    wide = fat_tree(32, 4, 8, 2).topology()  # 256 ranks
    wide_net = Network(wide)
    assert _blocks_may_help(wide_net, stages(wide_net), small)
    assert not _blocks_may_help(wide_net, stages(wide_net), Options(size_bytes=1 << 20, pipeline=4))
    assert not _blocks_may_help(wide_net, stages(wide_net), Options(size_bytes=256 << 20))


def test_direct_across_the_network_may_send_twice_the_messages() -> None:
    """Issue #11: a level across the network runs direct up to twice the messages a host level may (a step
    there waits out microseconds): 32 rail-optimized hosts (8 rails of 32, 7,936 messages) direct at
    1 MiB, 1.28x of the bound for all-reduce (2.22x by halving-doubling); 128 hosts of 8 GPUs (7,168) not
    inside them, where direct doubles the operations."""
    from topocc.planner.compiler.algorithms.hierarchical import Stage, _direct_fits

    def level(name: str, groups: int, size: int) -> Stage:
        return Stage(name, tuple(tuple(range(g * size, (g + 1) * size)) for g in range(groups)))

    assert _direct_fits(level("cluster", 8, 32))
    assert not _direct_fits(level("host", 128, 8))
    assert not _direct_fits(level("cluster", 16, 32))  # 15,872 messages


def test_small_reduce_scatters_split_a_large_last_level() -> None:
    """Issue #11: at 1 MiB fattree-1024's 32 racks run as 4 x 8, direct twice, where halving-doubling's five
    steps each wait out a path latency (all-gather 2.85x -> 1.92x of the bound, reduce-scatter 3.37x ->
    2.31x, measured by the benchmark); at 16 MiB, where bandwidth rules, they stay one level."""
    from topocc.planner.compiler.algorithms.hierarchical import _split_last
    from topocc.planner.topology.catalogue import resolve_topology

    topology = resolve_topology("fattree-1024")
    net = Network(topology)
    levels = stages(net)
    split = _split_last(net, levels, Options(size_bytes=1 << 20))
    assert [s.size for s in split] == [8, 4, 4, 8]
    for level in split[-2:]:  # each a partition of the ranks, within the racks' groups
        assert sorted(r for g in level.groups for r in g) == list(range(1024))
        assert all(any(set(g) <= set(whole) for whole in levels[-1].groups) for g in level.groups)
    assert _split_last(net, levels, Options(size_bytes=16 << 20)) == levels


@pytest.mark.parametrize("collective", ["allgather", "allreduce"])
def test_a_last_level_kept_from_direct_by_the_sharing_cap_splits_on_small_messages(collective: str) -> None:
    """Issue #11: ten hosts on leaves of four (the last half full) put 48 messages of a direct host level on
    an uplink, over the cap, and its ring of ten waits out nine path latencies; at 1 MiB the hosts run as
    2 x 5 (all-gather 3.39x -> 1.36x of the bound, all-reduce 4.18x -> 1.53x); at 256 MiB as one level."""
    from topocc.planner.compiler.algorithms.hierarchical import _split_last, hierarchical
    from topocc.planner.analysis.bounds import lower_bound
    from benchmarks.fabrics import fat_tree
    from topocc.planner.analysis.simulate import simulate

    topology = fat_tree(10, 4, 4, 2).topology()
    net = Network(topology)
    levels = stages(net)
    assert [s.size for s in levels] == [8, 10]
    assert _split_last(net, levels, Options(size_bytes=256 << 20)) == levels
    schedule = hierarchical(net, collective, Options(size_bytes=1 << 20))
    assert schedule.metadata.options["levels"] == ["host:8", "rack:2", "rack:5"]
    check_schedule(topology, schedule, collective, "hierarchical")
    ratio = simulate(topology, schedule, 1 << 20).time_s / lower_bound(topology, collective, 1 << 20).time_s
    assert ratio < {"allgather": 1.45, "allreduce": 1.65}[collective]


@pytest.mark.parametrize(("name", "first", "share"), [("dgx-a100-4node", "direct", 0.985),
                                                     ("ndv2-2chassis", "ring", 0.995)])
def test_a_reduce_scatter_runs_its_first_level_direct_where_its_pairs_meet_alike(name: str, first: str,
                                                                                share: float) -> None:
    """Issue #11: at 256 MiB a reduce-scatter's host level runs direct on an NVSwitch, where a ring behind the
    flow control reached 97.7% of the bound (now 98.9%), but stays a ring on a hybrid cube-mesh, whose pairs
    differ (direct there: 89.2%, the ring 99.8%)."""
    from topocc.planner.compiler.algorithms.hierarchical import _alike, hierarchical
    from topocc.planner.analysis.bounds import lower_bound
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.planner.analysis.simulate import simulate

    topology = resolve_topology(name)
    net = Network(topology)
    assert _alike(net, stages(net)[0]) == (first == "direct")
    size = 256 << 20
    schedule = hierarchical(net, "reducescatter", Options(size_bytes=size))
    assert schedule.metadata.options["methods"][0] == first
    assert lower_bound(topology, "reducescatter", size).time_s >= share * simulate(topology, schedule, size).time_s


def test_a_half_full_last_leaf_meets_the_all_reduce_target() -> None:
    """Issue #11: ten DGX hosts on leaves of four, one level of hosts (unequal racks): at 256 MiB the all-reduce
    in whole blocks reaches 98.6% of the bound, where the virtual order gives 91.8% (tried up to 128 ranks)."""
    from topocc.planner.compiler.algorithms.hierarchical import hierarchical
    from topocc.planner.analysis.bounds import lower_bound
    from benchmarks.fabrics import fat_tree
    from topocc.planner.analysis.simulate import simulate

    topology = fat_tree(10, 4, 4, 2).topology()
    net = Network(topology)
    size = 256 << 20
    schedule = hierarchical(net, "allreduce", Options(size_bytes=size))
    assert schedule.metadata.options["layout"] == "blocks"
    assert lower_bound(topology, "allreduce", size).time_s >= 0.95 * simulate(topology, schedule, size).time_s


@pytest.mark.parametrize("collective", ["reducescatter", "allgather", "allreduce"])
def test_a_split_last_level_verifies(collective: str) -> None:
    """Issue #11: a schedule over a last level split in two (16 hosts of 2 GPUs, the hosts as 4 x 4) passes
    the verifier."""
    from topocc.planner.compiler.algorithms.hierarchical import _hierarchical, _split
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(16, 1, 2, 1, gpus=2).topology()
    net = Network(topology)
    levels = stages(net)
    assert [s.size for s in levels] == [2, 16]
    split = [levels[0], *_split(levels[1], 4)]
    schedule = _hierarchical(net, collective, Options(size_bytes=1 << 20), split, None)
    assert schedule.metadata.options["levels"] == ["host:2", "cluster:4", "cluster:4"]
    check_schedule(topology, schedule, collective, "hierarchical")


def test_an_all_reduce_splits_its_last_level_only_where_it_builds_one_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #11: an all-reduce that builds and times both layouts (up to 256 ranks on small messages) keeps a
    last level too large for direct, as a split's direct steps made those two simulations the whole compile;
    with one layout (fattree-1024 at 1 MiB: 3.64x -> 2.27x of the bound) it splits as a reduce-scatter does."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from topocc.planner.compiler.algorithms.hierarchical import _split, hierarchical
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(16, 1, 2, 1, gpus=2).topology()
    net = Network(topology)

    asked: list[bool] = []

    def split_hosts(topology: object, levels: list, options: Options, large: bool = True) -> list:
        asked.append(large)
        return [levels[0], *_split(levels[1], 4)] if large else levels

    monkeypatch.setattr(module, "_split_last", split_hosts)
    both = hierarchical(net, "allreduce", Options(size_bytes=1 << 20))
    assert asked == [False] and both.metadata.options["levels"] == ["host:2", "cluster:16"]
    monkeypatch.setattr(module, "_BLOCKS_SMALL_RANKS", 16)
    one = hierarchical(net, "allreduce", Options(size_bytes=1 << 20))
    assert asked[-1] and one.metadata.options["levels"] == ["host:2", "cluster:4", "cluster:4"]
    check_schedule(topology, one, "allreduce", "hierarchical")


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_a_small_collective_left_one_slice_by_the_budget_may_send_more(collective: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #11: where the message budget leaves a 1 MiB all-gather or reduce-scatter of whole blocks one
    slice, its levels run one after the other; it may then send four times the budget's messages (rail-32x8:
    1.52x -> 1.20x of the bound), here on 4 rail-optimized hosts with the budget cut to match."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from topocc.planner.compiler.algorithms.hierarchical import hierarchical
    from benchmarks.fabrics import rail_optimized

    topology = rail_optimized(4).topology()
    net = Network(topology)
    monkeypatch.setattr(module, "_MAX_TRANSFERS", 1024)
    monkeypatch.setattr(module, "_TRANSFERS_PER_RANK", 0)
    bound = lower_bound(topology, collective, 1 << 20).time_s
    more = hierarchical(net, collective, Options(size_bytes=1 << 20))
    assert more.metadata.options["pipeline"] == 4
    check_schedule(topology, more, collective, "hierarchical")
    monkeypatch.setattr(module, "_SMALL_BUDGET", 1)
    one = hierarchical(net, collective, Options(size_bytes=1 << 20))
    assert one.metadata.options["pipeline"] == 1
    assert simulate(topology, more, 1 << 20).time_s < 1.25 * bound
    assert simulate(topology, one, 1 << 20).time_s > 1.45 * bound


def test_a_small_all_reduce_of_whole_blocks_keeps_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #11: a small all-reduce of whole blocks keeps the message budget, where a reduce-scatter or
    all-gather may exceed it: on rail-32x8 more slices gained it nothing and took twice as long to build and
    time."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from topocc.planner.compiler.algorithms.hierarchical import hierarchical
    from benchmarks.fabrics import rail_optimized

    monkeypatch.setattr(module, "_MAX_TRANSFERS", 1024)
    monkeypatch.setattr(module, "_TRANSFERS_PER_RANK", 0)
    schedule = hierarchical(Network(rail_optimized(4).topology()), "allreduce",
                            Options(size_bytes=1 << 20, hierarchical=HierarchicalOptions(layout="blocks")))
    assert schedule.metadata.options["pipeline"] == 1


@pytest.mark.parametrize(("collective", "within"), [("allgather", 1.5), ("reducescatter", 1.6)])
def test_a_small_collective_left_one_slice_by_the_cap_runs_direct_over_it(collective: str, within: float,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #11: a small all-gather or reduce-scatter that the sharing cap leaves one slice lifts the cap: its
    direct spine level runs in more slices (fattree-256-2to1 at 1 MiB: all-gather 1.65x -> 1.38x of the bound,
    reduce-scatter 1.71x -> 1.56x), here on 128 GPUs on a 2:1 fat-tree, 57 messages sharing a spine link, with
    the budget cut to leave one slice under the cap (all-gather 1.62x -> 1.43x, reduce-scatter 1.61x ->
    1.56x)."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from benchmarks.fabrics import fat_tree

    monkeypatch.setattr(module, "_MAX_TRANSFERS", 8192)
    monkeypatch.setattr(module, "_TRANSFERS_PER_RANK", 0)
    topology = fat_tree(16, 4, 2, 2).topology()
    net = Network(topology)
    schedule = hierarchical(net, collective, Options(size_bytes=1 << 20))
    assert schedule.metadata.options["methods"] == ["direct"] * 3
    assert schedule.metadata.options["pipeline"] > 1
    check_schedule(topology, schedule, collective, "hierarchical")
    bound = lower_bound(topology, collective, 1 << 20).time_s
    assert simulate(topology, schedule, 1 << 20).time_s < within * bound


def test_a_small_reduce_scatter_runs_its_first_level_direct_behind_no_window() -> None:
    """Issue #11: on small messages a first level that is not direct is flow-controlled a slice at a time, so
    each slice waits out its steps' latencies; direct needs no window (32 PCIe GPUs on a fat-tree, 4 to a host,
    at 1 MiB: a ring in the hosts 1.30x of the bound, direct 1.11x)."""
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(8, 8, 2, 4, gpus=4).topology()
    net = Network(topology)
    schedule = hierarchical(net, "reducescatter", Options(size_bytes=1 << 20))
    assert schedule.metadata.options["methods"][0] == "direct"
    check_schedule(topology, schedule, "reducescatter", "hierarchical")
    bound = lower_bound(topology, "reducescatter", 1 << 20).time_s
    assert simulate(topology, schedule, 1 << 20).time_s < 1.2 * bound


def test_methods_are_chosen_again_for_the_one_slice_the_budget_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #11: a small reduce-scatter's methods are timed for the slices it wants; where the message budget
    leaves it one, they are timed again for one (on ibm-s822lc-48x4 at 1 MiB the first level's window penalty,
    counted for slices it could not have, turned it direct and lost the window: 1.30x -> 1.41x of the
    bound)."""
    from topocc.planner.compiler.algorithms import hierarchical as module
    from benchmarks.fabrics import fat_tree

    topology = fat_tree(8, 8, 2, 4, gpus=4).topology()
    net = Network(topology)
    monkeypatch.setattr(module, "_MAX_TRANSFERS", 256)
    monkeypatch.setattr(module, "_TRANSFERS_PER_RANK", 0)
    timed: list[int] = []
    original = module.stage_methods

    def spy(*args: object, **kwargs: object) -> list[str]:
        timed.append(args[3])  # type: ignore[arg-type]
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "stage_methods", spy)
    schedule = hierarchical(net, "reducescatter", Options(size_bytes=1 << 20))
    assert schedule.metadata.options["pipeline"] == 1
    assert max(timed) > 1 and timed[-1] == 1  # (a first call, for one slice, asks whether the last level splits)
    assert schedule.metadata.options["methods"][0] != "direct"  # one slice: no window penalty, so the ring
    check_schedule(topology, schedule, "reducescatter", "hierarchical")
    # timed for 8 slices, direct there takes 1.58x of the bound; the ring 1.40x
    assert simulate(topology, schedule, 1 << 20).time_s < 1.5 * lower_bound(topology, "reducescatter", 1 << 20).time_s
