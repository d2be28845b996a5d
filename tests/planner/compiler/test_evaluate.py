"""The evaluator: one compilation's simulator, which times the schedule it was last given once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.planner.analysis.test_simulate import ring_allreduce, ring_topology
from tests.runtime.test_symmetric import ring
from topocc.planner.analysis.automorphisms import schedule_orbits
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.evaluate import Evaluator, least_latency, link_time
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.schedule import load_schedule


def test_the_last_schedule_timed_to_the_end_is_not_simulated_again() -> None:
    """An algorithm that times a candidate to choose it, then the compiler timing it again: simulated once."""
    net = Network(ring_topology(4))
    evaluator = Evaluator(net, 1 << 20)
    schedule = ring_allreduce(4)
    first = evaluator.simulate(schedule)
    assert first == simulate(net, schedule, 1 << 20)
    assert evaluator.simulate(schedule) is first  # kept
    assert evaluator.within(schedule, first.time_s * 1.01) is first
    assert evaluator.within(schedule, first.time_s * 0.99) is None  # longer than the deadline
    copy = ring_allreduce(4)  # equal, but another object: simulated anew
    again = evaluator.simulate(copy)
    assert again is not first and again == first
    assert evaluator.simulate(schedule) is not first  # only the latest is kept
    assert Evaluator(net, 1 << 21).simulate(schedule).time_s > first.time_s  # one size per evaluator


def test_a_deadline_that_cuts_the_run_keeps_nothing() -> None:
    net = Network(ring_topology(4))
    evaluator = Evaluator(net, 1 << 20)
    schedule = ring_allreduce(4)
    assert evaluator.within(schedule, 1e-9) is None
    full = simulate(net, schedule, 1 << 20)
    assert evaluator.within(schedule, full.time_s) == full


def test_link_time_bounds_the_simulation_and_latency_bounds_a_message() -> None:
    net = Network(ring_topology(4, latency="2 us"))
    schedule = ring_allreduce(4)
    sim = simulate(net, schedule, 1 << 20)
    assert 0 < link_time(net, schedule, 1 << 20) <= sim.time_s
    assert least_latency(net.topology) == 2e-6  # GPU to GPU: one link of 2 us


def test_compilations_sharing_a_network_agree_with_one_on_its_topology() -> None:
    """Passing a network shares its routes across compilations, and changes nothing they produce."""
    net = Network(ring_topology(4))
    first = compile_schedule(net, "allreduce", "ring", Options(size_bytes=1 << 20))
    second = compile_schedule(net, "allreduce", "ring", Options(size_bytes=1 << 20))
    assert first.schedule == second.schedule and first.sim.time_s == second.sim.time_s
    assert compile_schedule(net.topology, "allreduce", "ring", Options(size_bytes=1 << 20)).schedule == first.schedule


def test_link_time_by_class_is_the_link_time_of_every_rank() -> None:
    """One rank per orbit: a ring on a ring, and the shipped fat-tree's all-reduce (one rank of 1,024)."""
    shipped = load_schedule(Path(__file__).resolve().parents[3] / "schedules" / "fattree-1024-allreduce.json.gz")
    for net, form in ((Network(ring_topology(8)), ring(8)), (Network(resolve_topology("fattree-1024")), shipped)):
        assert schedule_orbits(net, form) is not None
        for size in (1 << 20, 256 << 20):
            assert link_time(net, form, size) == pytest.approx(link_time(net, form.expanded(), size), rel=1e-9)
