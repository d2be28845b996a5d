"""A plan: one schedule per message-size bucket, as NCCL's tuner and MSCCL's minBytes/maxBytes do.

Buckets are half-open byte ranges ``[min_bytes, max_bytes)`` that tile the
compiled range without gaps; the runtime picks the schedule whose bucket holds
the call's size (sizes outside the range use the nearest bucket).  Stored as
versioned JSON holding complete schedule documents.

The schedule format loads with the first schedule parsed, not with this module: a training job's
``init_process_group("topocc")`` reads its bundle's plans without it (its first calls are the native backend's).
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from topocc.runtime.documents import read_json_document
from topocc.runtime.errors import CommunicatorError, ScheduleFormatError

if TYPE_CHECKING:
    from topocc.runtime.schedule import Schedule

__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "AnyPlan", "LazyPlan", "Plan", "PlanSource", "as_plan", "load_any",
           "load_plan", "read_lazy_plan", "save_plan"]

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
        _check_bounds([(s.metadata.min_bytes, s.metadata.max_bytes) for s in self.schedules])

    @property
    def collective(self) -> str:
        return self.schedules[0].collective

    @property
    def ranks(self) -> int:
        return self.schedules[0].ranks

    def expanded(self) -> Plan:
        """This plan with every schedule written rank by rank (:meth:`Schedule.expanded`)."""
        return Plan(tuple(s.expanded() for s in self.schedules))

    def bucket(self, nbytes: int) -> int:
        """The index of the bucket holding a message of ``nbytes`` bytes (the last for larger ones)."""
        for i, s in enumerate(self.schedules):
            if s.metadata.max_bytes is None or nbytes < s.metadata.max_bytes:
                return i
        return len(self.schedules) - 1

    def schedule(self, index: int) -> Schedule:
        return self.schedules[index]

    @property
    def bucket_count(self) -> int:
        return len(self.schedules)

    def select(self, nbytes: int) -> Schedule:
        """The schedule for a message of ``nbytes`` bytes."""
        return self.schedules[self.bucket(nbytes)]

    @property
    def fingerprints(self) -> tuple[str | None, ...]:
        """Each bucket's topology fingerprint."""
        return tuple(s.metadata.fingerprint for s in self.schedules)


class LazyPlan:
    """A plan file whose buckets are parsed on first use: a job's first call of a size reads one schedule, not
    every bucket's (each holds every rank's program).

    Read from the same document as :func:`parse_plan`, with the same checks, but a bucket's are made when it
    is first selected: a damaged bucket fails that call, in one line naming the bucket.  What every rank must
    agree on before any bucket is parsed (collective, ranks, bucket bounds, fingerprints, root) is read from the
    buckets' headers at once.  ``digest`` names the file's bytes (ranks that read one file agree on it).
    """

    __slots__ = ("_docs", "_parsed", "_source", "bounds", "collective", "digest", "fingerprints", "ranks", "root")

    def __init__(self, doc: Any, source: str, digest: int) -> None:
        buckets = _plan_buckets(doc, source)
        self._docs = buckets
        self._source = source
        self._parsed: list[Schedule | None] = [None] * len(buckets)
        self.digest = digest
        heads = [_bucket_head(b, f"{source}: buckets[{i}]") for i, b in enumerate(buckets)]
        self.collective, self.ranks, self.root = heads[0][:3]
        if any(h[:3] != heads[0][:3] for h in heads) or (doc.get("collective"), doc.get("ranks")) != (
                self.collective, self.ranks):
            raise ScheduleFormatError("the plan's collective, rank count or root differs between its buckets",
                                      where=source, fix="recompile the plan")
        self.bounds = tuple(h[3] for h in heads)
        _check_bounds(self.bounds)
        self.fingerprints = tuple(h[4] for h in heads)

    @property
    def bucket_count(self) -> int:
        return len(self.bounds)

    def bucket(self, nbytes: int) -> int:
        """The index of the bucket holding a message of ``nbytes`` bytes."""
        for i, (_, high) in enumerate(self.bounds):
            if high is None or nbytes < high:
                return i
        return len(self.bounds) - 1

    def schedule(self, index: int) -> Schedule:
        """Bucket ``index``'s schedule, parsed on first use."""
        parsed = self._parsed[index]
        if parsed is None:
            from topocc.runtime.schedule import parse_schedule  # the format, loaded with the first schedule

            parsed = self._parsed[index] = parse_schedule(self._docs[index], f"{self._source}: buckets[{index}]")
        return parsed

    def select(self, nbytes: int) -> Schedule:
        """The schedule for a message of ``nbytes`` bytes."""
        return self.schedule(self.bucket(nbytes))

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """Every bucket's schedule (parses those not yet parsed)."""
        return tuple(self.schedule(i) for i in range(len(self._docs)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Plan, LazyPlan)):
            return NotImplemented
        return self.schedules == other.schedules

    def __hash__(self) -> int:
        return hash(self.schedules)


def _plan_buckets(doc: Any, source: str) -> list[Any]:
    """A plan document's bucket documents, after its own fields are checked."""
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
    return buckets


def _bucket_head(doc: Any, where: str) -> tuple[Any, Any, Any, tuple[int, int | None], str | None]:
    """A bucket's collective, ranks, root, size bounds and fingerprint, read without its programs."""
    meta = doc.get("metadata", {}) if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        raise ScheduleFormatError("a bucket must be a schedule object with a metadata object", where=where,
                                  fix="recompile the plan")
    low, high, fingerprint = meta.get("min_bytes", 0), meta.get("max_bytes"), meta.get("fingerprint")
    sizes = _is_size(low) and (high is None or _is_size(high))
    if not (sizes and (fingerprint is None or isinstance(fingerprint, str))):
        raise ScheduleFormatError("metadata.min_bytes/max_bytes must be sizes in bytes and fingerprint a string",
                                  where=f"{where}: metadata", fix="recompile the plan")
    return doc.get("collective"), doc.get("ranks"), doc.get("root"), (low, high), fingerprint


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_bounds(bounds: Sequence[tuple[int, int | None]]) -> None:
    """Buckets ordered, non-empty and contiguous (what :func:`Plan.select` assumes)."""
    for (lo, hi), (next_lo, _) in itertools.pairwise(bounds):
        if hi is None or hi != next_lo or lo >= hi:
            raise ScheduleFormatError(
                "plan buckets must be ordered, non-empty and contiguous",
                fix="recompile the plan with topocc compile --size LOW:HIGH",
            )


#: A plan parsed whole, or bucket by bucket as used.
AnyPlan = Plan | LazyPlan
#: What names a plan (:func:`as_plan`): a schedule or plan file, a schedule, a plan, or a list of schedules (or
#: their files) that are one plan's buckets.
PlanSource: TypeAlias = "str | Path | Schedule | Plan | Sequence[Schedule | str | Path]"


def plan_to_dict(plan: AnyPlan) -> dict[str, Any]:
    from topocc.runtime.schedule import schedule_to_dict  # the format, loaded with the first schedule

    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "collective": plan.collective,
        "ranks": plan.ranks,
        "buckets": [schedule_to_dict(s) for s in plan.schedules],
    }


def save_plan(plan: AnyPlan, path: str | Path) -> None:
    """Write ``plan`` as JSON (gzip-compressed when the name ends in ``.gz``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(plan_to_dict(plan), separators=(",", ":"), allow_nan=False)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), compresslevel=6, mtime=0))
    else:
        path.write_text(text)


def parse_plan(doc: Any, source: str = "<plan>") -> Plan:
    from topocc.runtime.schedule import parse_schedule  # the format, loaded with the first schedule

    buckets = _plan_buckets(doc, source)
    schedules = tuple(parse_schedule(b, f"{source}: buckets[{i}]") for i, b in enumerate(buckets))
    plan = Plan(schedules)
    if (doc.get("collective"), doc.get("ranks")) != (plan.collective, plan.ranks):
        raise ScheduleFormatError("the plan's collective or rank count disagrees with its schedules", where=source)
    return plan


def load_plan(path: str | Path) -> Plan:
    return parse_plan(read_json_document(path, "plan"), str(path))


def read_lazy_plan(path: str | Path, digest: int) -> LazyPlan:
    """The plan file ``path`` with its buckets parsed on first use; ``digest`` names its bytes."""
    return LazyPlan(read_json_document(path, "plan"), str(path), digest)


def load_any(path: str | Path) -> Schedule | Plan:
    """Load a schedule or a plan, whichever the file holds."""
    from topocc.runtime.schedule import parse_schedule  # the format, loaded with the first schedule

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
    from topocc.runtime.schedule import Schedule  # the format, loaded with the first schedule

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
