"""The report's timeline as data for the page's script: rows per rank and channel, or heat strips per host and rack.

What an engineer asks of a timeline is which ranks and channels are busy when,
in which step, and where the run stalls.  Up to :data:`INTERVAL_RANKS` ranks
every message is kept, as an interval on its sender's and its receiver's row
(the page draws a row per rank and channel, or per rank, coloured by step,
phase or channel).  A row per host and per rack (the only rows beyond that)
shows how fast its ranks send data out of it and within it in each of
:data:`BINS` time bins, as heat strips.  A strip per step (when it moves its data) and the busiest links'
utilisation over time come with both.  Everything is computed here with numpy from a
:class:`~topocc.planner.report._run.Run` (one row per message), so a 1024-rank run
takes a second, and the page only draws.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from topocc.planner.report._run import Run, link_bins, spread
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_bandwidth

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
MAX_STEP_ROWS = 24
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
    if len(steps) <= 4 * MAX_STEP_ROWS:
        doc["phase"] = {str(int(s)): "reduce" if run.reduce[run.step == s].mean() >= 0.5 else "copy" for s in steps}
    else:
        doc["phase"] = {}

    channels = sorted({int(c) for c in np.unique(run.channel)})
    doc["channels"] = channels
    if topology.size <= INTERVAL_RANKS and 2 * run.messages <= MAX_INTERVALS:
        doc["intervals"] = _intervals(run, total)
        lanes = len({(r, c) for rank in (run.src, run.dst) for r, c in zip(rank.tolist(), run.channel.tolist())})
        if len(channels) > 1:
            doc["views"].append({"id": "lanes", "label": f"a row per rank and channel ({lanes})", "kind": "lanes",
                                 "n": lanes})
        doc["views"].append({"id": "ranks", "label": f"a row per rank ({topology.size})", "kind": "ranks",
                             "n": topology.size})
    # ---- per host and per rack: the data its ranks send out of it, and within it, per time bin
    for what, groups in (("host", topology.hosts), ("rack", topology.racks)):
        if len(groups) > 1 and not (what == "rack" and len(groups) == len(topology.hosts)):
            doc["views"].append(_group_view(what, groups, run, topology.size, total, bins))
    doc["links"] = _links(topology, run, total, bins)
    if not doc["views"]:  # one rank, or a schedule without messages: nothing moves
        doc["views"].append({"id": "none", "label": "no messages", "kind": "heat", "rows": [], "n": 0})
    # the finest view that fits the screen (row per rank and channel up to LANE_ROWS, else ~64 rows), else the coarsest
    fits = [v for v in doc["views"] if v["n"] <= (LANE_ROWS if v["id"] == "lanes" else DEFAULT_ROWS)]
    doc["default"] = (fits[0] if fits else doc["views"][-1])["id"]
    return doc


def _group_view(what: str, groups: dict[str, tuple[int, ...]], run: Run, ranks: int, total: float,
                bins: int) -> dict[str, Any]:
    """Heat strips, a row per group (host or rack): bytes per second its ranks send out of it and within it.

    Data rates rather than "a message in flight" show stalls: a pipelined
    schedule keeps every rank's connections open all run long, but a rank whose
    messages crawl behind a congested link sends little.  Each half of a row is
    scaled to its :func:`_peak` over all groups, so groups compare at a glance.
    """
    group_of = np.empty(ranks, dtype=np.int64)
    for g, members in enumerate(groups.values()):
        group_of[list(members)] = g
    src = group_of[run.src]
    out = src != group_of[run.dst]
    rates, peaks = {}, {}
    for side, mask in (("out", out), ("in", ~out)):
        carried = spread(src[mask], run.start[mask], run.sent[mask], run.nbytes[mask], len(groups), total, bins)
        rates[side] = carried * (bins / total if total > 0 else 0.0)
        peaks[side] = _peak(rates[side])
    rows = [{"label": name, "n": len(members),
             **{side: _levels(rates[side][g] / peaks[side]) for side in rates},
             **{f"mean_{side}": float(run.nbytes[(src == g) & m].sum() / total) if total > 0 else 0.0
                for side, m in (("out", out), ("in", ~out))}}
            for g, (name, members) in enumerate(groups.items())]
    return {"id": what, "label": f"a row per {what} ({len(groups)})", "kind": "heat", "rows": rows, "n": len(rows),
            "peak_out": peaks["out"], "peak_in": peaks["in"]}


def _peak(values: np.ndarray) -> float:
    """The top of a strip's colour scale: the 99th percentile of the non-zero values (1 if none).

    A robust peak: the odd bin where a message's end meets the next one's start
    must not wash the strip out; the few bins above it are drawn as full.
    """
    busy = values[values > 0]
    return float(np.percentile(busy, 99)) if len(busy) else 1.0


def _intervals(run: Run, total: float) -> list[int]:
    """Every message end as ``[rank, channel, t0, t1, step, peer, flags]``, flattened; flags: 1 send, 2 reduce.

    Times are in :data:`TICKS` of the run; sorted by rank, channel and start.
    """
    scale = TICKS / total if total > 0 else 0.0
    both = np.concatenate
    table = np.stack([both([run.src, run.dst]), both([run.channel] * 2), np.rint(both([run.start] * 2) * scale),
                      np.rint(both([run.end] * 2) * scale), both([run.step] * 2), both([run.dst, run.src]),
                      both([np.ones(run.messages), np.zeros(run.messages)]) + 2 * both([run.reduce] * 2)],
                     axis=1).astype(np.int64)
    table = table[np.lexsort((table[:, 2], table[:, 1], table[:, 0]))]
    return table.ravel().tolist()


def _steps(run: Run, steps: np.ndarray, total: float, bins: int) -> dict[str, Any]:
    """A strip per step (or range of steps): the bytes of its messages on the wire in each time bin.

    Each strip's levels are relative to its own :func:`_peak` (``peak`` bytes
    per bin), so a step that moves little still shows when it runs.
    ``pipelined`` says whether several steps are usually in flight at once
    (pipelined slices), where colouring the bars by step gives stripes.
    """
    if not len(steps) or total <= 0:
        return {"rows": [], "width": 1, "pipelined": False}
    first = int(steps[0])
    width = max(1, -(-(int(steps[-1]) - first + 1) // MAX_STEP_ROWS))
    group = (run.step - first) // width
    present = np.unique(group)
    row_of = np.searchsorted(present, group)
    carried = spread(row_of, run.start, run.sent, run.nbytes, len(present), total, bins)
    peak = np.array([_peak(row) for row in carried])
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

    See :func:`~topocc.planner.report._run.link_bins`: a strip shows what each link
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
    carried = link_bins(run, [index[key] for _, key in top], bins)
    bin_s = total / bins
    for i, (util, (a, b)) in enumerate(top):
        link = topology.link(a, b)
        bw = link.bandwidth if link is not None else 1.0
        out["rows"].append({"label": f"{a} -> {b}", "kind": (link.kind if link is not None else "") or "link",
                            "bw": format_bandwidth(bw), "mean": round(util, 4),
                            "v": _levels(carried[i] / (bw * bin_s))})
    return out
