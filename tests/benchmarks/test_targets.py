"""The planner's targets: which apply to a measured compile, and by how much it meets or misses each."""

from __future__ import annotations

import pytest

from benchmarks.targets import ANCHORS, LARGE_BYTES, LATENCY_RATIO, SMALL_BYTES, Measured, compile_limit, judge
from topocc.planner.topology.catalogue import shipped_topologies
from topocc.runtime.collective import collective


def measured(**changes: object) -> Measured:
    base: dict[str, object] = {"ranks": 32, "switch_based": True, "collective": "allgather",
                               "size_bytes": LARGE_BYTES, "compile_s": 4.0, "predicted_s": 1.0, "bound_s": 0.98}
    return Measured(**{**base, **changes})  # type: ignore[arg-type]


def kinds(m: Measured) -> dict[str, str]:
    return {v.kind: v.describe() for v in judge(m)}


def test_large_messages_are_judged_on_bandwidth_and_compile_time() -> None:
    assert kinds(measured()) == {"bandwidth": "met", "compile": "met"}
    assert kinds(measured(bound_s=0.95)) == {"bandwidth": "missed by 2.0 points", "compile": "met"}
    assert kinds(measured(collective="allreduce", bound_s=0.95)) == {"bandwidth": "met", "compile": "met"}
    assert kinds(measured(size_bytes=2 * LARGE_BYTES, bound_s=0.5))["bandwidth"] == "missed by 47.0 points"


def test_small_messages_are_judged_on_latency_only_where_switch_based() -> None:
    assert kinds(measured(size_bytes=SMALL_BYTES, bound_s=0.8)) == {"latency": "met", "compile": "met"}
    assert kinds(measured(size_bytes=SMALL_BYTES, bound_s=0.5))["latency"] == "missed by 0.70x"
    assert kinds(measured(size_bytes=SMALL_BYTES, bound_s=0.5, switch_based=False)) == {"compile": "met"}
    assert kinds(measured(size_bytes=4 * SMALL_BYTES, bound_s=0.5)) == {"compile": "met"}


def test_no_schedule_misses_the_quality_target() -> None:
    verdicts = judge(measured(predicted_s=None, bound_s=None))
    assert [(v.kind, v.measured, v.met) for v in verdicts] == [("bandwidth", "no schedule", False),
                                                               ("compile", "4.0 s", True)]
    assert verdicts[0].describe() == "missed (no schedule)"


@pytest.mark.parametrize(("ranks", "limit"), [(8, 10.0), (64, 10.0), (65, 60.0), (512, 60.0), (1024, None)])
def test_compile_limit_by_rank_count(ranks: int, limit: float | None) -> None:
    assert compile_limit(ranks) == limit
    assert ("compile" in kinds(measured(ranks=ranks))) == (limit is not None)


def test_compile_time_over_the_limit_and_timeouts() -> None:
    assert kinds(measured(ranks=100, compile_s=75.0))["compile"] == "missed by 15.0 s"
    late = judge(measured(ranks=100, compile_s=300.0, timed_out=True, predicted_s=None, bound_s=None))
    assert [(v.kind, v.measured) for v in late] == [("bandwidth", "no schedule"), ("compile", "> 300 s")]
    early = judge(measured(ranks=100, compile_s=30.0, timed_out=True, predicted_s=None, bound_s=None))
    assert [v.kind for v in early] == ["bandwidth"]  # abandoned within the target: its compile time is unknown


SMALL_SWITCHED = ("rail-2x4", "hetero-nics-2x4", "emu-racks", "emu-uniform")


@pytest.mark.parametrize("name", SMALL_SWITCHED)
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_auto_meets_the_latency_target_on_small_switch_based_fabrics(name: str, collective: str) -> None:
    """At 1 MiB, auto is within LATENCY_RATIO of the bound (bandwidth plus path latency) where ranks meet through
    switches: the pipelined hierarchical schedule with direct levels (fewer steps, every port busy at once)."""
    from benchmarks.fabrics import shipped_fabrics, small_suite
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.compiler.options import Options

    fabric = next(f for f in (*small_suite(), *shipped_fabrics()) if f.name == name)
    assert fabric.switch_based
    compiled = compile_schedule(fabric.topology(), collective, "auto", Options(size_bytes=SMALL_BYTES))
    ratio = compiled.sim.time_s / compiled.bound.time_s
    assert 1 - 1e-9 <= ratio <= LATENCY_RATIO, (compiled.schedule.metadata.algorithm, ratio)


def test_anchors_name_shipped_topologies_and_collectives() -> None:
    """Each anchor is measurable: a shipped topology, a collective topocc knows, a share of the bound."""
    shipped = shipped_topologies()
    for anchor in ANCHORS:
        assert anchor.topology in shipped
        assert collective(anchor.collective).name == anchor.collective
        assert 0 < anchor.share <= 1 and anchor.size_bytes > 0
