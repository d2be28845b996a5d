"""Ownership of a direct last level on unequal NICs: the fast hosts reduce for the slow ones."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fabrics import heterogeneous_nics
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.compiler.algorithms.hierarchical import hierarchical, ownership, stages
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network

#: Four hosts of two GPUs on one switch: two with two 200 Gbit/s NICs (25 GB/s per GPU), two with one
#: 100 Gbit/s NIC (6.25 GB/s per GPU).  Of two hosts (small_suite's hetero-nics-2x4) ownership moves
#: nothing: each host sends the data once whatever it owns.
UNEQUAL_NICS = ((2, 200), (2, 200), (1, 100), (1, 100))


def test_ownership_follows_each_hosts_nics() -> None:
    """The ranks of the fast hosts reduce the last level's data for the slow ones, whose NICs then carry it
    once each way (owning a quarter, they would carry it 1.5 times); equal NICs keep equal parts."""
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
    evaluator = Evaluator(net, size)
    schedule = hierarchical(net, "allreduce", Options(size_bytes=size, evaluator=evaluator))
    check_schedule(net, schedule, "allreduce", "hierarchical")
    assert schedule.metadata.options["methods"][-1] == "direct"
    ratio = evaluator.simulate(schedule).time_s / evaluator.lower_bound("allreduce").time_s
    assert 1 - 1e-9 <= ratio <= within, ratio


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nics=st.lists(st.sampled_from([(1, 100), (1, 200), (2, 100), (2, 200)]), min_size=3, max_size=4),
       gpus=st.sampled_from([2, 4]), size=st.sampled_from([1 << 16, 1 << 20, 64 << 20]))
def test_unequal_ownership_verifies_and_never_beats_the_bound(nics: list[tuple[int, int]], gpus: int,
                                                              size: int) -> None:
    topology = heterogeneous_nics(tuple(nics), gpus=gpus).topology()
    net = Network(topology)
    evaluator = Evaluator(net, size)
    schedule = hierarchical(net, "allreduce", Options(size_bytes=size, evaluator=evaluator))
    check_schedule(net, schedule, "allreduce", "hierarchical")
    assert evaluator.simulate(schedule).time_s >= evaluator.lower_bound("allreduce").time_s * (1 - 1e-9)
