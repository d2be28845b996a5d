"""A tiny Chrome trace event writer (``chrome://tracing``, Perfetto), shared by the planner and the runtime.

The runtime records measured operations with the same fields as the
simulator's ``OpEvent`` (``rank, index, kind, peer, step, channel, chunk,
start_s, end_s``) and turns them into a trace with :func:`chrome_trace`; the
planner's simulated traces (``topocc.planner.report.simulated_trace``) add link tracks
through :class:`TraceWriter`.  This module imports only the standard library,
so a training job can write traces without loading the planner.

Format (Chrome "Trace Event Format"): ``{"traceEvents": [...]}``; a slice is
``ph: "X"`` with ``ts`` and ``dur`` in microseconds; ``ph: "M"`` events name
processes and threads.  Perfetto does not nest overlapping slices on one
``tid``, so every track is split into *lanes*: overlapping slices of one track
go to different ``tid``s, each named after the track.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Slice", "TraceWriter", "chrome_trace", "op_slice", "op_slice_name", "write_trace"]

#: Microseconds per second; trace timestamps are microseconds (floats: nanosecond detail survives).
US = 1e6
#: Digits kept after the decimal point of a microsecond value (picoseconds are noise).
_DIGITS = 4


@dataclass(frozen=True, slots=True)
class Slice:
    """One complete event (``ph: "X"``) on a track: a name, an interval in seconds, a category and arguments."""

    name: str
    start_s: float
    end_s: float
    cat: str = "op"
    args: Mapping[str, Any] = field(default_factory=dict)


def _get(record: Any, name: str, default: Any = None) -> Any:
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def op_slice_name(record: Any) -> str:
    """``"step 3 send o[5] -> r2"``: what an operation did, for a slice's title.

    ``record`` is an ``OpEvent`` or any object or mapping with its fields.
    """
    kind, peer, chunk = _get(record, "kind"), _get(record, "peer"), _get(record, "chunk", "")
    arrow = "" if peer is None else (f" -> r{peer}" if kind == "send" else f" <- r{peer}")
    return f"step {_get(record, 'step', 0)} {kind} {chunk}{arrow}".replace("  ", " ")


def op_slice(record: Any) -> Slice:
    """The slice of one recorded (or simulated) operation."""
    args = {key: _get(record, key) for key in ("rank", "index", "kind", "peer", "step", "channel", "chunk")}
    return Slice(op_slice_name(record), float(_get(record, "start_s")), float(_get(record, "end_s")),
                 str(_get(record, "kind", "op")), {k: v for k, v in args.items() if v is not None})


def _lanes(slices: Iterable[Slice]) -> list[list[Slice]]:
    """Interval partitioning: slices by start time go to the lowest-numbered free lane (no overlap in a lane).

    Uses as few lanes as the largest number of slices that overlap at one instant.
    """
    lanes: list[list[Slice]] = []
    busy: list[tuple[float, int]] = []  # (end, lane) of each lane's last slice
    free: list[int] = []
    for s in sorted(slices, key=lambda s: (s.start_s, s.end_s, s.name)):
        while busy and busy[0][0] <= s.start_s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = len(lanes)
            lanes.append([])
        lanes[lane].append(s)
        heapq.heappush(busy, (s.end_s, lane))
    return lanes


class TraceWriter:
    """Builds a trace: processes, tracks (split into non-overlapping lanes) and their slices.

    >>> w = TraceWriter()
    >>> pid = w.process("host h0")
    >>> w.track(pid, "rank 0", [Slice("step 0 send o[1] -> r1", 0.0, 2e-6)])
    [1]
    >>> w.to_dict()["traceEvents"][-1]["dur"]
    2.0
    """

    def __init__(self) -> None:
        self._meta: list[dict[str, Any]] = []
        self._slices: list[dict[str, Any]] = []
        self._pids: dict[str, int] = {}
        self._next_tid: dict[int, int] = {}

    def process(self, name: str, sort_index: int | None = None) -> int:
        """The pid of the process called ``name``, declared (with its metadata) on first use."""
        pid = self._pids.get(name)
        if pid is None:
            pid = len(self._pids) + 1
            self._pids[name] = pid
            self._next_tid[pid] = 1
            self._meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
            self._meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                               "args": {"sort_index": pid if sort_index is None else sort_index}})
        return pid

    def track(self, pid: int, name: str, slices: Iterable[Slice]) -> list[int]:
        """Add a named track to process ``pid``; overlapping slices go to extra lanes. Returns the tids used."""
        tids = []
        for lane_no, lane in enumerate(_lanes(slices) or [[]]):
            tid = self._next_tid[pid]
            self._next_tid[pid] = tid + 1
            tids.append(tid)
            label = name if lane_no == 0 else f"{name} (lane {lane_no + 1})"
            self._meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
            self._meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                               "args": {"sort_index": tid}})
            for s in lane:
                self._slices.append({
                    "name": s.name, "cat": s.cat, "ph": "X", "pid": pid, "tid": tid,
                    "ts": round(s.start_s * US, _DIGITS), "dur": round(max(0.0, s.end_s - s.start_s) * US, _DIGITS),
                    "args": dict(s.args),
                })
        return tids

    def to_dict(self, **other: Any) -> dict[str, Any]:
        """The trace document; ``other`` adds top-level keys (``otherData``, ``displayTimeUnit``)."""
        return {"traceEvents": self._meta + self._slices, "displayTimeUnit": "ns", **other}

    def write(self, path: str | Path, **other: Any) -> None:
        """Write the trace as compact JSON."""
        _dump(self.to_dict(**other), path)


def _dump(doc: Mapping[str, Any], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, separators=(",", ":"), allow_nan=False))


def chrome_trace(events: Iterable[Any], *, process_of: Callable[[int], str] | None = None,
                 writer: TraceWriter | None = None) -> dict[str, Any]:
    """A trace of operation records: one track per rank (split into lanes), one process per group.

    ``events`` are ``OpEvent``-like objects or mappings; ``process_of(rank)``
    names the process a rank belongs to (its host; default: one process
    ``"ranks"``).  Pass ``writer`` to add the ranks to a trace being built.
    """
    w = writer or TraceWriter()
    by_rank: dict[int, list[Slice]] = {}
    for record in events:
        by_rank.setdefault(int(_get(record, "rank")), []).append(op_slice(record))
    for rank in sorted(by_rank):
        pid = w.process(process_of(rank) if process_of else "ranks")
        w.track(pid, f"rank {rank}", by_rank[rank])
    return w.to_dict()


def write_trace(path: str | Path, events: Iterable[Any] | Mapping[str, Any], *,
                process_of: Callable[[int], str] | None = None) -> None:
    """Write a trace file: ``events`` is a finished trace document, or operation records for :func:`chrome_trace`."""
    if isinstance(events, Mapping) and "traceEvents" in events:
        _dump(events, path)
    else:
        _dump(chrome_trace(events, process_of=process_of), path)
