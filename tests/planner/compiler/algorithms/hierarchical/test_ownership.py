"""Ownership of a direct last level on unequal NICs: the fast hosts reduce for the slow ones."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fabrics import heterogeneous_nics, rail_optimized
from tests.planner.analysis.test_automorphisms import rail_pods, small_fattree
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.compiler.algorithms.hierarchical import hierarchical, ownership, stages
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology

ownership_module = importlib.import_module("topocc.planner.compiler.algorithms.hierarchical.ownership")

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


@pytest.mark.parametrize("name", ["small-fattree", "rail-8x8", "hetero-nics-4x8", "ibm-s822lc-48x4"])
def test_where_every_host_is_anothers_image_their_rates_are_equal(name: str) -> None:
    """Where the translations that keep the last level's ring pairs make one orbit of its ranks, ownership
    keeps equal parts without reading a route; and there every rank's rate is indeed the same."""
    topo = {"small-fattree": small_fattree, "rail-8x8": lambda: rail_optimized(8).topology(),
            "hetero-nics-4x8": lambda: heterogeneous_nics(((4, 200), (4, 200), (2, 100), (2, 100))).topology()
            }.get(name, lambda: resolve_topology(name))()
    net = Network(topo)
    last = stages(net)[-1]
    one = ownership_module._one_orbit(net, last)
    assert one == (name in ("small-fattree", "rail-8x8"))
    rates = ownership_module._host_rates(net, last, 0)
    if one:
        assert ownership(net, last, 0) is None
        assert max(rates.values()) == pytest.approx(min(rates.values()), rel=1e-12)
    assert (ownership(net, last, 0) is None) == (name != "hetero-nics-4x8")


def test_at_scale_hosts_alike_keep_equal_parts_without_reading_a_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """From BY_ORBIT_MIN_RANKS ranks on (lowered here), where every host is another's image (pods included)
    ownership keeps equal parts without the route search from every rank that the host rates cost; unequal
    NICs are still read and still get uneven parts."""
    monkeypatch.setattr(ownership_module, "BY_ORBIT_MIN_RANKS", 0)
    pods = Network(rail_pods())
    last = stages(pods)[-1]
    assert not ownership_module._one_orbit(pods, last)  # the ring across the pods is not moved within a pod

    def refuse(*_: object) -> None:
        raise AssertionError("host rates read")

    with monkeypatch.context() as patch:
        patch.setattr(ownership_module, "_host_rates", refuse)
        assert ownership(pods, last, 0) is None
    uneven = Network(heterogeneous_nics(UNEQUAL_NICS + UNEQUAL_NICS).topology())
    assert ownership(uneven, stages(uneven)[-1], 0) is not None
