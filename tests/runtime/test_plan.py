"""Plans: ``as_plan``, the one way a path, schedule, plan or list of them becomes a plan."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from topocc.runtime.errors import CommunicatorError, ScheduleFormatError
from topocc.runtime.plan import LazyPlan, Plan, as_plan, load_plan, plan_to_dict, read_lazy_plan, save_plan
from topocc.runtime.schedule import Chunk, Metadata, Schedule, build_schedule, operation, save_schedule


def local(min_bytes: int, max_bytes: int | None, algorithm: str) -> Schedule:
    """A one-rank all-reduce (its input copied out) for the bucket ``[min_bytes, max_bytes)``."""
    return build_schedule("allreduce", 1, 1, 1, [[operation("copy", None, Chunk("i", 0), Chunk("o", 0))]],
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
        as_plan([Plan((SMALL, LARGE)), SMALL])  # type: ignore[list-item]  # the refusal under test
    with pytest.raises(ScheduleFormatError, match="at least one schedule"):
        as_plan([])
    with pytest.raises(ScheduleFormatError, match="contiguous"):
        as_plan([LARGE, SMALL])


# ---------------------------------------------------------------------------------------------- lazy plans


def lazy(tmp_path: Path, plan: Plan, edit: Callable[[dict[str, Any]], None] | None = None) -> LazyPlan:
    """``plan`` written, optionally edited as JSON, and read back bucket by bucket."""
    doc = plan_to_dict(plan)
    if edit is not None:
        edit(doc)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return read_lazy_plan(path, zlib.crc32(path.read_bytes()))


def test_a_lazy_plan_parses_only_the_buckets_used_and_equals_the_plan(tmp_path: Path) -> None:
    plan = Plan((SMALL, LARGE))
    read = lazy(tmp_path, plan)
    assert (read.collective, read.ranks, read.bucket_count) == ("allreduce", 1, 2)
    assert read.bounds == ((0, 1024), (1024, None))
    assert read.select(4096) == LARGE and read._parsed[0] is None  # the small bucket not parsed
    assert read.bucket(10) == 0 and read == plan and read.schedules == plan.schedules


def test_a_damaged_bucket_of_a_lazy_plan_fails_its_first_use_naming_it(tmp_path: Path) -> None:
    def damage(doc: dict[str, Any]) -> None:
        doc["buckets"][1]["programs"][0][0]["op"] = "teleport"

    read = lazy(tmp_path, Plan((SMALL, LARGE)), damage)
    assert read.select(10) == SMALL  # the sound bucket serves its sizes
    with pytest.raises(ScheduleFormatError) as err:
        read.select(4096)
    assert "p.json: buckets[1]" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: d["buckets"][1]["metadata"].update(min_bytes=2048), "ordered, non-empty and contiguous"),
    (lambda d: d["buckets"][1]["metadata"].update(max_bytes="big"), "sizes in bytes"),
    (lambda d: d["buckets"][1].update(ranks=2), "differs between its buckets"),
    (lambda d: d.update(version=9), "unsupported plan format version 9"),
])
def test_a_lazy_plan_checks_its_buckets_headers_at_once(tmp_path: Path, edit: Callable[[dict[str, Any]], None],
                                                        says: str) -> None:
    with pytest.raises(ScheduleFormatError, match=says):
        lazy(tmp_path, Plan((SMALL, LARGE)), edit)
