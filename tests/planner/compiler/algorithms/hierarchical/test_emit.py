"""The emitted schedules: they verify in every buffer order, slicing and method, and keep each level's data
on its own fabric."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import peer_of
from tests.planner.analysis.test_automorphisms import small_fattree
from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from tests.runtime.test_symmetric import ring
from tests.strategies import topologies
from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.analysis.verify import verify
from topocc.planner.analysis.verify_lowered import verify_lowering
from topocc.planner.analysis.verify_symmetric import verify_by_class
from topocc.planner.compiler.algorithms.hierarchical import hierarchical, slicing
from topocc.planner.compiler.algorithms.hierarchical.emit import build_schedule
from topocc.planner.compiler.algorithms.hierarchical.estimates import DIRECT_MAX_MEMBERS
from topocc.planner.compiler.algorithms.hierarchical.levels import stages
from topocc.planner.compiler.algorithms.hierarchical.slicing import CLASS_SLICE_BYTES, CLASS_TRANSFERS_PER_RANK
from topocc.planner.compiler.algorithms.hierarchical.split import split_last
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import HierarchicalOptions, Options
from topocc.planner.compiler.symmetrize import (
    builds_by_class,
    canonical_order,
    fitting_ranks,
    grid_shapes,
    one_class,
    symmetrize,
)
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.model import Topology
from topocc.runtime.lowering import lower

symmetrize_module = importlib.import_module("topocc.planner.compiler.symmetrize")
decisions = importlib.import_module("topocc.planner.compiler.algorithms.hierarchical.decisions")


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("shape", [([2] * 8, 2), ([3] * 4, 0), ([4] * 3, 3), ([1] * 5, 0)])
def test_schedules_verify(collective: str, shape: tuple[list[int], int]) -> None:
    net = Network(cluster(*shape))
    schedule = hierarchical(net, collective, Options(pipeline=2))
    check_schedule(net, schedule, collective, "hierarchical")


def test_intra_host_stage_stays_in_host() -> None:
    topology = cluster([4, 4])
    net = Network(topology)
    schedule = hierarchical(net, "allreduce", Options(pipeline=1))
    host_of = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    cross = [op for r, p in enumerate(schedule.programs) for op in p
             if op.kind == "send" and host_of[peer_of(op)] != host_of[r]]
    # only the cross-host stage leaves the host: one block (1/8 of the data) each way per rank
    assert all(op.count == 1 for op in cross) and len(cross) == 2 * 8


SHIPPED = ["dgx-a100-4node", "emu-racks", "emu-uniform", "pcie-4x4-10gbe"]


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("pipeline", [1, 3, None])
@pytest.mark.parametrize("method", [None, "ring", "halving-doubling", "direct"])
def test_pipelined_schedules_verify_on_shipped_clusters(name: str, pipeline: int | None, method: str | None) -> None:
    topology = resolve_topology(name)
    net = Network(topology)
    schedule = hierarchical(net, "allreduce", Options(size_bytes=16 << 20, pipeline=pipeline,
                                                      hierarchical=HierarchicalOptions(stage_method=method)))
    check_schedule(net, schedule, "allreduce", "hierarchical")
    shape = [int(x) for x in schedule.metadata.options["slice_shape"].split(":")]
    assert len(shape) == schedule.metadata.options["pipeline"]
    assert schedule.output_chunks == topology.size * sum(shape)
    if method is not None:
        sizes = [int(level.split(":")[1]) for level in schedule.metadata.options["levels"]]
        fits = {"ring": lambda n: True, "halving-doubling": lambda n: n & (n - 1) == 0,
                "direct": lambda n: n <= DIRECT_MAX_MEMBERS}
        for size, used in zip(sizes, schedule.metadata.options["methods"]):
            assert used == ("halving-doubling" if size == 2 else method if fits[method](size) else used)


@pytest.mark.parametrize("shape", [([2] * 8, 2), ([3] * 4, 0), ([4] * 4, 2), ([1] * 6, 3), ([8] * 2, 0)])
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_pipelined_schedules_verify_on_small_clusters(shape: tuple[list[int], int], collective: str) -> None:
    net = Network(cluster(*shape))
    for pipeline in (2, 5):
        schedule = hierarchical(net, collective, Options(size_bytes=8 << 20, pipeline=pipeline))
        check_schedule(net, schedule, collective, "hierarchical")


@pytest.mark.parametrize("shape", [([2] * 8, 2), ([3] * 4, 0), ([4] * 4, 2), ([8] * 2, 0)])
@pytest.mark.parametrize(("pipeline", "size"), [(1, 1 << 20), (3, 1 << 20), (None, 1 << 20), (None, 256 << 20)])
def test_reduce_scatter_in_virtual_order_verifies(shape: tuple[list[int], int], pipeline: int | None,
                                                  size: int) -> None:
    """In virtual order each rank ends by sending its sums to the ranks they belong to (pieces that straddle
    two ranks' blocks too: at 256 MiB the slices are shaped); it verifies and never beats the bound."""
    net = Network(cluster(*shape))
    schedule = hierarchical(net, "reducescatter", Options(size_bytes=size, pipeline=pipeline,
                                                          hierarchical=HierarchicalOptions(layout="virtual")))
    assert schedule.metadata.options["layout"] == "virtual"
    check_schedule(net, schedule, "reducescatter", "hierarchical")
    assert simulate(net, schedule, size).time_s >= lower_bound(net, "reducescatter", size).time_s * (1 - 1e-9)


@pytest.mark.parametrize("pipeline", [None, 1, 3])
@pytest.mark.parametrize("topology", [cluster([4] * 3), cluster([2] * 4, racks=2)], ids=["hosts", "racks"])
def test_all_reduce_of_whole_blocks_verifies(topology: Topology, pipeline: int | None) -> None:
    """An all-reduce with each rank's block whole: a reduce-scatter in waves, then an all-gather, in place."""
    net = Network(topology)
    for size in (1 << 20, 256 << 20):
        schedule = hierarchical(net, "allreduce", Options(size_bytes=size, pipeline=pipeline,
                                                          hierarchical=HierarchicalOptions(layout="blocks")))
        assert schedule.metadata.options["layout"] == "blocks"
        check_schedule(net, schedule, "allreduce", "hierarchical")
        assert simulate(net, schedule, size).time_s >= lower_bound(net, "allreduce", size).time_s * (1 - 1e-9)


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_direct_stages_take_one_step_and_reduce_from_their_own_slots(collective: str) -> None:
    """A direct level is one step; its reduce-scatter receives each peer's part into a slot of its own (plain
    receives that run at once), then reduces locally, so it pays one path latency, not one per peer."""
    net = Network(cluster([4] * 3))
    schedule = hierarchical(net, collective, Options(size_bytes=1 << 20,
                                                     hierarchical=HierarchicalOptions(stage_method="direct")))
    check_schedule(net, schedule, collective, "hierarchical")
    assert schedule.metadata.options["methods"] == ["direct", "direct"]
    assert schedule.metadata.options["pipeline"] > 1  # several slices even at 1 MiB: the levels overlap
    kinds = {op.kind for program in schedule.programs for op in program}
    assert "recv_reduce" not in kinds
    assert ("reduce" in kinds) == (collective != "allgather")
    steps = {op.step for program in schedule.programs for op in program if op.kind == "send"}
    assert len(steps) == {"allreduce": 4, "reducescatter": 2, "allgather": 2}[collective]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=topologies(max_hosts=3, max_gpus=3), data=st.data())
def test_direct_levels_on_random_topologies(topology: Topology, data: st.DataObject) -> None:
    """Forced direct levels, in either buffer order, verify, lower into NCCL groups the proof accepts, and
    never beat the bound."""
    net = Network(topology)
    collective = data.draw(st.sampled_from(["allreduce", "reducescatter", "allgather"]))
    size = data.draw(st.sampled_from([1 << 10, 1 << 20]))
    layout: str | None = None
    if collective == "reducescatter":  # either buffer order (virtual: the sums handed on at the end)
        layout = data.draw(st.sampled_from(["blocks", "virtual"]))
    evaluator = Evaluator(net, size)  # an all-reduce may choose its layout by simulation: timed once
    pinned = HierarchicalOptions(stage_method="direct", layout=layout)
    try:
        schedule = hierarchical(net, collective, Options(size_bytes=size, evaluator=evaluator, hierarchical=pinned))
    except NotApplicableError:
        return
    check_schedule(net, schedule, collective, "hierarchical")
    verify_lowering(schedule, lower(schedule, data.draw(st.integers(1, 8))))
    time_s = evaluator.simulate(schedule).time_s
    assert time_s >= evaluator.lower_bound(collective).time_s * (1 - 1e-9)


# --------------------------------------------------------------------------- built as one class


@pytest.mark.parametrize("collective, pinned", [
    ("allreduce", HierarchicalOptions(layout="virtual")),
    ("allgather", HierarchicalOptions()),
    ("reducescatter", HierarchicalOptions(layout="blocks", stage_method="halving-doubling")),
    ("reducescatter", HierarchicalOptions(layout="virtual")),
])
def test_a_large_sprayed_schedule_is_built_as_the_class_every_rank_would_make(
        collective: str, pinned: HierarchicalOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    """The small sprayed fat-tree, its schedule built from the few ranks that fit one class: the form that
    symmetrizing every rank's program gives, proved by class; a reduce-scatter in the virtual layout (many
    classes) is built rank by rank."""
    topo = small_fattree()
    net = Network(topo)
    options = Options(size_bytes=64 << 20, hierarchical=pinned)
    full = hierarchical(net, collective, options)
    assert full.symmetry is None and not builds_by_class(net)
    monkeypatch.setattr(symmetrize_module, "CLASS_BUILD_MIN_RANKS", 64)
    assert builds_by_class(net)
    built = hierarchical(net, collective, options)
    want = symmetrize(full, grid_shapes(topo))
    if collective == "reducescatter" and pinned.layout == "virtual":  # the fit fails: built rank by rank
        assert built.symmetry is None and built == full
        assert want.symmetry is None or len(want.symmetry.templates) > 1
        return
    assert built.symmetry == want.symmetry and built.metadata == full.metadata
    report = verify_by_class(built)
    assert report is not None and report == verify(full)


def test_direct_levels_built_by_class_are_one_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small all-reduce's direct levels on the small sprayed fat-tree built by class: in their peers' digit
    order one class, proved by class as proving every rank does, and timed as the members' order; in that
    order (``(i + k) mod n``, receives by sender) the fit fails, so every rank is built."""
    net = Network(small_fattree())
    monkeypatch.setattr(symmetrize_module, "CLASS_BUILD_MIN_RANKS", 64)
    options = Options(size_bytes=1 << 20, hierarchical=HierarchicalOptions(layout="virtual"))
    built = hierarchical(net, "allreduce", options)
    assert "direct" in built.metadata.options["methods"] and built.symmetry is not None
    report = verify_by_class(built)
    assert report is not None and report == verify(built.expanded())
    real = decisions.level_steps
    monkeypatch.setattr(decisions, "level_steps", lambda method, n, gather, _: real(method, n, gather, False))
    rotated = hierarchical(net, "allreduce", options)
    assert rotated.symmetry is None and rotated.metadata == built.metadata
    assert simulate(net, rotated, 1 << 20).time_s == pytest.approx(simulate(net, built, 1 << 20).time_s)


def test_a_small_all_reduce_built_only_as_one_class_takes_more_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small all-reduce in virtual order built one rank per class or not at all (``every_rank`` false) takes
    slices of CLASS_SLICE_BYTES within a rank's message budget, not every rank's: one class, proved by class as
    proving every rank does, and faster than the slices every rank's budget leaves; where it may be built rank
    by rank, that budget holds."""
    net = Network(small_fattree())
    monkeypatch.setattr(symmetrize_module, "CLASS_BUILD_MIN_RANKS", 64)
    size = 1 << 20  # 16 KiB a rank: small
    options = Options(size_bytes=size, hierarchical=HierarchicalOptions(direct_uncapped=True))
    levels = stages(net)
    every = build_schedule(net, "allreduce", options, levels, None)
    alone = build_schedule(net, "allreduce", options, levels, None, every_rank=False)
    assert alone is not None and alone.symmetry is not None
    wanted = size // CLASS_SLICE_BYTES
    assert alone.metadata.options["pipeline"] == wanted > every.metadata.options["pipeline"]
    assert alone.metadata.options["methods"] == every.metadata.options["methods"]
    report = verify_by_class(alone)
    assert report is not None and report == verify(alone.expanded())
    sends = max(sum(op.kind == "send" for op in program) for program in alone.expanded().programs)
    assert sends <= CLASS_TRANSFERS_PER_RANK
    assert simulate(net, alone, size).time_s < simulate(net, every, size).time_s
    # a rank's budget for a quarter of those slices' messages leaves a quarter of the slices
    monkeypatch.setattr(slicing, "CLASS_TRANSFERS_PER_RANK", sends // 4)
    fewer = build_schedule(net, "allreduce", options, levels, None, every_rank=False)
    assert fewer is not None and fewer.metadata.options["pipeline"] == wanted // 4


def test_a_direct_level_built_as_one_class_has_the_members_a_rank_s_budget_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Built one rank per class, a small all-reduce may run a level direct where its messages, 2 (n - 1) a rank
    and slice at the slices wanted, stay within a rank's message budget (not the every-rank caps): the small
    fat-tree's hosts of 8 at 16 slices need 224; one message fewer and they run halving-doubling."""
    net = Network(small_fattree())
    monkeypatch.setattr(symmetrize_module, "CLASS_BUILD_MIN_RANKS", 64)
    monkeypatch.setattr(slicing, "DIRECT_MAX_MEMBERS", 2)
    options = Options(size_bytes=1 << 20, hierarchical=HierarchicalOptions(direct_uncapped=True))
    levels = stages(net)
    assert [s.size for s in levels] == [8, 4, 2]
    for budget, host in ((2 * 7 * 16, "direct"), (2 * 7 * 16 - 1, "halving-doubling")):
        monkeypatch.setattr(slicing, "CLASS_TRANSFERS_PER_RANK", budget)
        built = build_schedule(net, "allreduce", options, split_last(net, "allreduce", levels, options), None,
                               every_rank=False)
        assert built is not None and built.metadata.options["methods"][0] == host
        assert max(sum(op.kind == "send" for op in program) for program in built.expanded().programs) <= budget


def test_one_class_is_refused_where_a_witness_disagrees() -> None:
    form = ring(8)
    assert form.symmetry is not None
    ranks = fitting_ranks((8,))
    programs = {r: form.programs[r] for r in ranks}
    fitted = one_class(programs, (8,), dict(form.symmetry.limits))
    assert fitted is not None  # every rank's program, in canonical order
    assert all(fitted.program(r) == canonical_order(form.programs[r]) for r in range(8))
    odd = max(ranks)
    programs[odd] = programs[odd][:-1]  # a witness with an operation fewer
    assert one_class(programs, (8,), dict(form.symmetry.limits)) is None
    del programs[1]  # the neighbour that gives the coefficient
    assert one_class({r: form.programs[r] for r in ranks - {1}}, (8,), dict(form.symmetry.limits)) is None
