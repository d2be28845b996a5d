"""Halving-doubling: the fold for non-powers of two, log-step structure, relayed partners."""

from __future__ import annotations

import importlib

import pytest

from tests.planner.analysis.test_automorphisms import small_fattree
from tests.planner.compiler.algorithms.test_baselines import check_schedule, switch_cluster
from tests.planner.routing.test_relay import chain
from topocc.planner.analysis.verify import verify
from topocc.planner.analysis.verify_symmetric import verify_by_class
from topocc.planner.compiler.algorithms.halving_doubling import halving_doubling
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import grid_shapes, symmetrize
from topocc.planner.routing.network import Network

symmetrize_module = importlib.import_module("topocc.planner.compiler.symmetrize")


@pytest.mark.parametrize("ranks", [3, 5, 6, 7, 12])
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_non_power_of_two(collective: str, ranks: int) -> None:
    topology = switch_cluster(ranks)
    net = Network(topology)
    schedule = halving_doubling(net, collective, Options(pipeline=2))
    extras = ranks - (1 << (ranks.bit_length() - 1))
    assert schedule.metadata.options["folded"] == extras
    check_schedule(topology, schedule, collective, "halving-doubling")


@pytest.mark.parametrize("ranks", [2, 4, 8, 16])
def test_log_steps(ranks: int) -> None:
    topology = switch_cluster(ranks)
    net = Network(topology)
    schedule = halving_doubling(net, "allreduce", Options(pipeline=1))
    steps = {op.step for p in schedule.programs for op in p if op.kind == "send"}
    assert len(steps) == 2 * (ranks.bit_length() - 1)
    # each rank talks to log2(p) partners
    assert len({op.peer for op in schedule.programs[0] if op.kind == "send"}) == ranks.bit_length() - 1


def test_partners_without_a_route_exchange_through_the_ranks_between() -> None:
    topology = chain(4)
    net = Network(topology)
    for collective in ("allreduce", "reducescatter", "allgather"):
        schedule = halving_doubling(net, collective, Options(pipeline=2))
        check_schedule(topology, schedule, collective, "halving-doubling")  # every message goes to a neighbour
        assert schedule.scratch_chunks > (4 if collective == "reducescatter" else 0)  # relay slots beyond its own


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter"])
def test_on_a_large_sprayed_fabric_it_is_built_as_the_class_every_rank_would_make(
        collective: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The small sprayed fat-tree with the threshold lowered: built for the few ranks that fit one class over
    the ranks' bits, the form that symmetrizing every rank's program gives, and proved by class."""
    topo = small_fattree()
    options = Options(size_bytes=64 << 20)
    full = halving_doubling(Network(topo), collective, options)
    monkeypatch.setattr(symmetrize_module, "CLASS_BUILD_MIN_RANKS", 64)
    built = halving_doubling(Network(topo), collective, options)
    want = symmetrize(full, grid_shapes(topo))
    assert full.symmetry is None and built.symmetry is not None
    assert built.symmetry == want.symmetry and built.symmetry.shape == (2,) * 6 and built.metadata == full.metadata
    report = verify_by_class(built)
    assert report is not None and report == verify(full)
