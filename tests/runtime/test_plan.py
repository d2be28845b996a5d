"""Plans: ``as_plan``, the one way a path, schedule, plan or list of them becomes a plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from topocc.runtime.errors import CommunicatorError, ScheduleFormatError
from topocc.runtime.plan import Plan, as_plan, load_plan, save_plan
from topocc.runtime.schedule import Chunk, Metadata, Op, Schedule, build_schedule, save_schedule


def local(min_bytes: int, max_bytes: int | None, algorithm: str) -> Schedule:
    """A one-rank all-reduce (its input copied out) for the bucket ``[min_bytes, max_bytes)``."""
    return build_schedule("allreduce", 1, 1, 1, [[Op("copy", None, Chunk("i", 0), Chunk("o", 0))]],
                          metadata=Metadata(algorithm=algorithm, min_bytes=min_bytes, max_bytes=max_bytes))


SMALL, LARGE = local(0, 1024, "small"), local(1024, None, "large")


def test_a_schedule_is_one_bucket_for_every_size(tmp_path: Path) -> None:
    save_schedule(SMALL, tmp_path / "s.json")
    for source in (SMALL, tmp_path / "s.json", str(tmp_path / "s.json"), [SMALL], [tmp_path / "s.json"]):
        plan = as_plan(source)
        assert len(plan.schedules) == 1
        assert (plan.schedules[0].metadata.min_bytes, plan.schedules[0].metadata.max_bytes) == (0, None)
        assert plan.select(1 << 30).metadata.algorithm == "small"


def test_a_plan_is_itself_and_a_list_of_schedules_its_buckets(tmp_path: Path) -> None:
    plan = Plan((SMALL, LARGE))
    assert as_plan(plan) is plan
    save_plan(plan, tmp_path / "p.json.gz")
    assert as_plan(tmp_path / "p.json.gz") == load_plan(tmp_path / "p.json.gz") == plan
    assert as_plan([tmp_path / "p.json.gz"]) == plan
    save_schedule(LARGE, tmp_path / "large.json")
    listed = as_plan([SMALL, tmp_path / "large.json"])
    assert [s.metadata.algorithm for s in listed.schedules] == ["small", "large"]
    assert listed.select(100).metadata.algorithm == "small" and listed.select(4096).metadata.algorithm == "large"


def test_what_is_not_a_plan_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommunicatorError, match="schedules only"):
        as_plan([Plan((SMALL, LARGE)), SMALL])
    with pytest.raises(ScheduleFormatError, match="at least one schedule"):
        as_plan([])
    with pytest.raises(ScheduleFormatError, match="contiguous"):
        as_plan([LARGE, SMALL])
