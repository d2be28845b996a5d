"""hierarchical's entry point: what it builds, declines, and hands to the rooted form."""

from __future__ import annotations

import pytest

from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.algorithms.hierarchical import hierarchical
from topocc.planner.compiler.options import HierarchicalOptions, Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network


def test_the_algorithm_table_loads_the_entry_point() -> None:
    assert ALGORITHMS["hierarchical"].load() is hierarchical


def test_unequal_hosts_decline() -> None:
    with pytest.raises(NotApplicableError, match="equal-sized hosts"):
        hierarchical(Network(cluster([2, 3])), "allreduce", Options())


def test_unknown_stage_method_declines() -> None:
    with pytest.raises(NotApplicableError, match="stage_method"):
        hierarchical(Network(cluster([4] * 4)), "allreduce",
                     Options(hierarchical=HierarchicalOptions(stage_method="tree")))


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter"])
def test_unknown_layout_declines(collective: str) -> None:
    with pytest.raises(NotApplicableError, match="layout"):
        hierarchical(Network(cluster([4] * 4)), collective, Options(hierarchical=HierarchicalOptions(layout="rows")))


def test_all_gather_ignores_the_layout() -> None:
    """An all-gather keeps every rank's block whole: a layout pinned for the others changes nothing."""
    net = Network(cluster([4] * 3))
    pinned = hierarchical(net, "allgather", Options(pipeline=2, hierarchical=HierarchicalOptions(layout="rows")))
    assert pinned.programs == hierarchical(net, "allgather", Options(pipeline=2)).programs


@pytest.mark.parametrize("gpus", [[2, 3], [4, 4, 2], [1, 2]])
def test_uneven_clusters_decline_with_any_pipeline(gpus: list[int]) -> None:
    for pipeline in (None, 4):
        with pytest.raises(NotApplicableError, match="equal-sized hosts"):
            hierarchical(Network(cluster(gpus)), "allreduce", Options(pipeline=pipeline))


def test_alltoall_declines() -> None:
    with pytest.raises(NotApplicableError, match="does not implement alltoall"):
        hierarchical(Network(cluster([2] * 2)), "alltoall", Options())


def test_one_rank_is_a_copy() -> None:
    schedule = hierarchical(Network(cluster([1])), "allreduce", Options())
    assert schedule.ranks == 1 and schedule.metadata.algorithm == "hierarchical"
