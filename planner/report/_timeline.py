"""The report's timeline as data for the page's script: rows per rank and channel, or busy strips per host and rack.

What an engineer asks of a timeline is which ranks and channels are busy when,
in which step, and where the run stalls.  Up to :data:`INTERVAL_RANKS` ranks
every message is kept, as an interval on its sender's and its receiver's row
(the page draws a row per rank and channel, or per rank, coloured by step,
phase or channel).  Beyond that a row per host and per rack shows the fraction
of its ranks with data on the wire in each of :data:`BINS` time bins, a heat
strip.  A strip per step (when it moves its data) and the busiest links'
utilisation over time come with both.  Everything is computed here with numpy from a
:class:`~planner.report._run.Run` (one row per message), so a 1024-rank run
takes a second, and the page only draws.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from planner.report._run import Run, link_bins, spread, union
from planner.topology import Topology
from planner.units import format_bandwidth

__all__ = ["BINS", "INTERVAL_RANKS", "timeline_doc"]

#: Time bins of the heat strips (the page's plot is narrower, so zooming in 2x still shows every bin apart).
BINS = 2000
#: Up to this many ranks every message is drawn; above, hosts and racks as heat strips.
INTERVAL_RANKS = 64
#: ... unless there are more message ends than this (they travel to the page as numbers).
MAX_INTERVALS = 200_000
#: A row per rank and channel by default while there are at most this many such rows (else per rank).
LANE_ROWS = 160
#: Other views are chosen by default while they have at most this many rows.
DEFAULT_ROWS = 64
#: Busiest links drawn as utilisation strips.
LINK_ROWS = 16
#: Steps drawn as strips of their own; more are grouped into consecutive ranges.
MAX_BAND_STEPS = 24
#: Interval times travel as integers, this many per run (enough to zoom in a thousandfold).
TICKS = 1_000_000


def _levels(fraction: np.ndarray) -> str:
    """Fractions in [0, 1] as one byte each (0-255), base64: compact in the page, exact to 0.4%."""
    data = np.rint(np.clip(fraction, 0.0, 1.0) * 255).astype(np.uint8)
    return base64.b64encode(data.tobytes()).decode("ascii")


def timeline_doc(topology: Topology, run: Run) -> dict[str, Any]:
    """Everything the page's timeline draws, as JSON-ready data; see the module docstring."""
    total = run.result.time_s
    bins = BINS if total > 0 else 1
    doc: dict[str, Any] = {"t": total, "bins": bins, "ticks": TICKS, "views": [], "ranks": topology.size}
    # ---- steps: their range, a strip each, and the phase of each (mostly reduced into a sum, or copied)
    steps = np.unique(run.step)
    doc["steps"] = _steps(run, steps, total, bins)
    doc["steps"]["range"] = [int(steps[0]), int(steps[-1])] if len(steps) else [0, 0]
    if len(steps) <= 4 * MAX_BAND_STEPS:
        doc["phase"] = {str(int(s)): "reduce" if run.reduce[run.step == s].mean() >= 0.5 else "copy" for s in steps}
    else:
        doc["phase"] = {}

    two = np.concatenate
    ranks, peers = two([run.src, run.dst]), two([run.dst, run.src])
    start, end = two([run.start, run.start]), two([run.end, run.end])
    channels = sorted({int(c) for c in np.unique(run.channel)})
    doc["channels"] = channels
    if topology.size <= INTERVAL_RANKS and 2 * run.messages <= MAX_INTERVALS:
        doc["intervals"] = _intervals(run, ranks, peers, start, end, total)
        lanes = len({(int(r), int(c)) for r, c in zip(ranks.tolist(), two([run.channel, run.channel]).tolist())})
        if len(channels) > 1:
            doc["views"].append({"id": "lanes", "label": f"a row per rank and channel ({lanes})", "kind": "lanes",
                                 "n": lanes})
        doc["views"].append({"id": "ranks", "label": f"a row per rank ({topology.size})", "kind": "ranks",
                             "n": topology.size})
    # ---- busy fraction per rank and time bin, averaged per host and per rack
    rows, s, e = union(ranks, start, end)
    busy = spread(rows, s, e, e - s, topology.size, total, bins) * (bins / total if total > 0 else 0.0)
    for what, groups in (("host", topology.hosts), ("rack", topology.racks)):
        if len(groups) <= 1 or (what == "rack" and len(groups) == len(topology.hosts)):
            continue
        heat = []
        for name, members in groups.items():
            fraction = busy[list(members)].mean(axis=0)
            heat.append({"label": name, "n": len(members), "v": _levels(fraction),
                         "mean": round(float(fraction.mean()), 4)})
        doc["views"].append({"id": what, "label": f"a row per {what} ({len(groups)})", "kind": "heat",
                             "rows": heat, "n": len(heat)})
    doc["links"] = _links(topology, run, total, bins)
    if not doc["views"]:  # one rank, or a schedule without messages: nothing moves
        doc["views"].append({"id": "none", "label": "no messages", "kind": "heat", "rows": [], "n": 0})
    # the finest view that fits the screen (row per rank and channel up to LANE_ROWS, else ~64 rows), else the coarsest
    fits = [v for v in doc["views"] if v["n"] <= (LANE_ROWS if v["id"] == "lanes" else DEFAULT_ROWS)]
    doc["default"] = (fits[0] if fits else doc["views"][-1])["id"]
    return doc


def _intervals(run: Run, ranks: np.ndarray, peers: np.ndarray, start: np.ndarray, end: np.ndarray,
               total: float) -> list[int]:
    """Every message end as ``[rank, channel, t0, t1, step, peer, flags]``, flattened; flags: 1 send, 2 reduce."""
    n = run.messages
    scale = TICKS / total if total > 0 else 0.0
    flags = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)])
    flags += 2 * np.concatenate([run.reduce, run.reduce]).astype(np.int64)
    table = np.stack([ranks, np.concatenate([run.channel, run.channel]), np.rint(start * scale),
                      np.rint(end * scale), np.concatenate([run.step, run.step]), peers, flags], axis=1)
    table = table.astype(np.int64)
    table = table[np.lexsort((table[:, 2], table[:, 1], table[:, 0]))]
    return table.ravel().tolist()  # type: ignore[no-any-return]


def _steps(run: Run, steps: np.ndarray, total: float, bins: int) -> dict[str, Any]:
    """A strip per step (or range of steps): the bytes of its messages on the wire in each time bin.

    Each strip's levels are relative to its own peak (``peak`` bytes per bin,
    the 98th percentile of its busy bins), so a step that moves little still
    shows when it runs.
    ``pipelined`` says whether several steps are usually in flight at once
    (pipelined slices), where colouring the bars by step gives stripes.
    """
    if not len(steps) or total <= 0:
        return {"rows": [], "width": 1, "pipelined": False}
    first = int(steps[0])
    width = max(1, -(-(int(steps[-1]) - first + 1) // MAX_BAND_STEPS))
    group = (run.step - first) // width
    present = np.unique(group)
    row_of = np.searchsorted(present, group)
    carried = spread(row_of, run.start, run.sent, run.nbytes, len(present), total, bins)
    # a robust peak: the odd bin where a message's end meets the next one's start must not wash the strip out
    peak = np.array([np.percentile(row[row > 0], 98) if (row > 0).any() else 0.0 for row in carried])
    in_bin = carried.sum(axis=0)
    active = in_bin > 0
    concurrent = (carried[:, active] > 0.05 * in_bin[active]).sum(axis=0)
    rows = []
    for i, grp in enumerate(present.tolist()):
        lo, hi = first + grp * width, min(int(steps[-1]), first + grp * width + width - 1)
        rows.append({"label": f"step {lo}" if lo == hi else f"steps {lo}-{hi}", "s": lo, "peak": float(peak[i]),
                     "bytes_total": float(run.nbytes[row_of == i].sum()),
                     "v": _levels(carried[i] / (peak[i] or 1.0))})
    return {"rows": rows, "width": width,
            "pipelined": bool(len(concurrent) and float(np.median(concurrent)) > 2)}


def _links(topology: Topology, run: Run, total: float, bins: int) -> dict[str, Any]:
    """The busiest directed links and their utilisation (bytes / bandwidth) per time bin.

    See :func:`~planner.report._run.link_bins`: a strip shows what each link
    carried, smoothed within each message (where a message sped up or slowed
    down while sharing links, a bin can hold more than the link's bandwidth
    allows: it is drawn as full).
    """
    used = [(u, key) for key, u in run.result.link_utilisation.items() if u > 0]
    top = sorted(used, key=lambda item: (-item[0], item[1]))[:LINK_ROWS]
    out: dict[str, Any] = {"rows": [], "candidates": len(used)}
    if not top or total <= 0:
        return out
    index = {(ln.src, ln.dst): i for i, ln in enumerate(topology.links)}
    carried = link_bins(topology, run, [index[key] for _, key in top], bins)
    bin_s = total / bins
    for i, (util, (a, b)) in enumerate(top):
        link = topology.link(a, b)
        bw = link.bandwidth if link is not None else 1.0
        out["rows"].append({"label": f"{a} -> {b}", "kind": (link.kind if link is not None else "") or "link",
                            "bw": format_bandwidth(bw), "mean": round(util, 4),
                            "v": _levels(carried[i] / (bw * bin_s))})
    return out
