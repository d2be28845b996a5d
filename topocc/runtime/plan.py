"""A plan: one schedule per message-size bucket, as NCCL's tuner and MSCCL's minBytes/maxBytes do.

Buckets are half-open byte ranges ``[min_bytes, max_bytes)`` that tile the
compiled range without gaps; the runtime picks the schedule whose bucket holds
the call's size (sizes outside the range use the nearest bucket).  Stored as
versioned JSON holding complete schedule documents.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topocc.runtime.errors import CommunicatorError, ScheduleFormatError
from topocc.runtime.schedule import Schedule, parse_schedule, read_json_document, schedule_to_dict

__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "Plan", "PlanSource", "as_plan", "load_any", "load_plan", "save_plan"]

PLAN_FORMAT = "topocc-plan"
PLAN_VERSION = 1


@dataclass(frozen=True, slots=True)
class Plan:
    """Schedules for one collective and rank count, ordered by their size buckets."""

    schedules: tuple[Schedule, ...]

    def __post_init__(self) -> None:
        if not self.schedules:
            raise ScheduleFormatError("a plan needs at least one schedule")
        first = self.schedules[0]
        for s in self.schedules[1:]:
            if (s.collective, s.ranks) != (first.collective, first.ranks):
                raise ScheduleFormatError(
                    f"a plan mixes {first.collective}/{first.ranks} ranks with {s.collective}/{s.ranks} ranks"
                )
        bounds = [(s.metadata.min_bytes, s.metadata.max_bytes) for s in self.schedules]
        for (lo, hi), (next_lo, _) in itertools.pairwise(bounds):
            if hi is None or hi != next_lo or lo >= hi:
                raise ScheduleFormatError(
                    "plan buckets must be ordered, non-empty and contiguous",
                    fix="recompile the plan with topocc compile --size LOW:HIGH",
                )

    @property
    def collective(self) -> str:
        return self.schedules[0].collective

    @property
    def ranks(self) -> int:
        return self.schedules[0].ranks

    def select(self, nbytes: int) -> Schedule:
        """The schedule for a message of ``nbytes`` bytes."""
        for s in self.schedules:
            if s.metadata.max_bytes is None or nbytes < s.metadata.max_bytes:
                return s
        return self.schedules[-1]


#: What names a plan (:func:`as_plan`): a schedule or plan file, a schedule, a plan, or a list of schedules (or
#: their files) that are one plan's buckets.
PlanSource = str | Path | Schedule | Plan | Sequence[Schedule | str | Path]


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "collective": plan.collective,
        "ranks": plan.ranks,
        "buckets": [schedule_to_dict(s) for s in plan.schedules],
    }


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as JSON (gzip-compressed when the name ends in ``.gz``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(plan_to_dict(plan), separators=(",", ":"), allow_nan=False)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), compresslevel=6, mtime=0))
    else:
        path.write_text(text)


def parse_plan(doc: Any, source: str = "<plan>") -> Plan:
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise ScheduleFormatError("not a topocc plan", where=source)
    if doc.get("version") != PLAN_VERSION:
        raise ScheduleFormatError(f"unsupported plan format version {doc.get('version')!r}", where=source,
                                  fix="recompile the plan with this version of topocc")
    unknown = set(doc) - {"format", "version", "collective", "ranks", "buckets"}
    if unknown:
        raise ScheduleFormatError(f"unknown field {sorted(unknown)[0]!r}", where=source)
    buckets = doc.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        raise ScheduleFormatError("buckets must be a non-empty array", where=f"{source}: buckets")
    schedules = tuple(parse_schedule(b, f"{source}: buckets[{i}]") for i, b in enumerate(buckets))
    plan = Plan(schedules)
    if (doc.get("collective"), doc.get("ranks")) != (plan.collective, plan.ranks):
        raise ScheduleFormatError("the plan's collective or rank count disagrees with its schedules", where=source)
    return plan


def load_plan(path: str | Path) -> Plan:
    return parse_plan(read_json_document(path, "plan"), str(path))


def load_any(path: str | Path) -> Schedule | Plan:
    """Load a schedule or a plan, whichever the file holds."""
    doc = read_json_document(path, "schedule or plan")
    if isinstance(doc, dict) and doc.get("format") == PLAN_FORMAT:
        return parse_plan(doc, str(path))
    return parse_schedule(doc, str(path))


def as_plan(source: PlanSource) -> Plan:
    """The plan that ``source`` names, the one way every part of topocc reads one.

    A file is loaded first (:func:`load_any`).  A plan is itself; a single schedule is one bucket covering
    every size; a list of schedules (or their files) is the plan of their buckets, and a list of one is that
    one alone.
    """
    if isinstance(source, (str, Path)):
        source = load_any(source)
    if isinstance(source, Plan):
        return source
    if isinstance(source, Schedule):
        return Plan((source.with_metadata(min_bytes=0, max_bytes=None),))
    items = [load_any(s) if isinstance(s, (str, Path)) else s for s in source]
    if len(items) == 1:
        return as_plan(items[0])
    schedules = [s for s in items if isinstance(s, Schedule)]
    if len(schedules) != len(items):
        raise CommunicatorError("a list of schedules must hold schedules only (not plans)")
    return Plan(tuple(schedules))
