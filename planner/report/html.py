"""One self-contained HTML report of a plan: topology, structure, per-step traffic, timeline and summary.

Everything is inline (CSS, a little JS, SVG), so the file opens anywhere
without a network.  The layout and all aggregation are computed here, in
Python, deterministically; the template only draws (jinja2 with autoescape, so
device and algorithm names are always escaped).  Views aggregate by host or
rack on large topologies (:mod:`planner.report._model`), and every chart has an
element budget, so a 1024-rank report stays a few MB and quick to open.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from functools import cache
from typing import Any

import jinja2

from planner.bounds import lower_bound
from planner.report._model import (
    View,
    build_view,
    link_step_bytes,
    merge_intervals,
    messages,
    paused_gc,
    step_buckets,
    transfer_starts,
)
from planner.simulate import SimResult, simulate
from planner.topology import Topology, describe
from planner.units import format_bandwidth, format_size, format_time
from runtime.schedule import Schedule

__all__ = ["render_html", "render_topology_html"]

#: Element budgets (SVG shapes per view), so a report stays readable and small at 1024 ranks.
MAX_STRUCTURE_EDGES = 300
MAX_CHANNELS = 32
MAX_STEP_VIEWS = 120
STEP_TABLE_ROWS = 6
MAX_GANTT_RECTS = 3000
GANTT_RANK_ROWS = 64
GANTT_LINK_ROWS = 32
GANTT_WIDTH = 1000.0
GANTT_LABEL = 170.0
GANTT_ROW = 18.0

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
LINK_COLOURS = {"nvlink": "#5a9e00", "pcie": "#d98c00", "ib": "#0072b2", "qpi": "#cc79a7", "eth": "#009e73"}


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("planner.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["n"] = _num
    return env


def _num(value: float) -> str:
    """Coordinates with one decimal: enough for the eye, deterministic, and small files."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _link_colour(kind: str) -> str:
    for key, colour in LINK_COLOURS.items():
        if key in kind:
            return colour
    return "#888888"


# --------------------------------------------------------------------------- topology


def _topology_ctx(topology: Topology, view: View) -> dict[str, Any]:
    bws = [e.bandwidth for e in view.edges] or [1.0]
    lo, hi = min(bws), max(bws)

    def width(bw: float) -> float:
        return 1.0 if hi <= lo else 1.0 + 5.0 * math.log(bw / lo) / math.log(hi / lo)

    edges = []
    for i, e in enumerate(view.edges):
        a, b = view.nodes[e.a], view.nodes[e.b]
        edges.append({"i": i, "x1": a.x, "y1": a.y, "x2": b.x, "y2": b.y, "w": width(e.bandwidth),
                      "colour": _link_colour(e.kind),
                      "tip": f"{e.a} - {e.b}: {format_bandwidth(e.bandwidth)} ({e.links} link"
                             f"{'s' * (e.links != 1)}, {e.kind})"})
    kinds = sorted({e.kind for e in view.edges})
    doc = describe(topology)
    return {
        "width": view.width, "height": view.height, "level": view.level,
        "zoom": max(1.0, min(1.8, 800.0 / view.width)),
        "nodes": sorted(view.nodes.values(), key=lambda n: n.id), "boxes": view.boxes, "edges": edges,
        "legend": [(k, _link_colour(k)) for k in kinds],
        "facts": [
            ("name", topology.name), ("description", topology.description or "-"),
            ("ranks", str(topology.size)), ("hosts", str(len(topology.hosts))), ("racks", str(len(topology.racks))),
            ("devices", ", ".join(f"{n} {k}" for k, n in doc["devices"].items())),
            ("directed links", str(len(topology.links))),
            ("link bandwidth", f"{format_bandwidth(min(ln.bandwidth for ln in topology.links))} .. "
                               f"{format_bandwidth(max(ln.bandwidth for ln in topology.links))}"
             if topology.links else "-"),
            ("drawn as", {"device": "every device", "host": "one box per host (devices merged)",
                          "rack": "one box per rack (hosts merged)"}[view.level]),
        ],
    }


# --------------------------------------------------------------------------- structure


def _curve(ax: float, ay: float, bx: float, by: float, trim: float = 14.0) -> str:
    """A quadratic arc from a to b bent to the left, so a -> b and b -> a stay apart; trimmed at both ends."""
    dx, dy = bx - ax, by - ay
    length = math.hypot(dx, dy) or 1.0
    ux, uy = dx / length, dy / length
    t = min(trim, length / 3)
    sx, sy, ex, ey = ax + ux * t, ay + uy * t, bx - ux * t, by - uy * t
    bend = 0.15 * length
    cx, cy = (sx + ex) / 2 + uy * bend, (sy + ey) / 2 - ux * bend
    return f"M{_num(sx)} {_num(sy)} Q{_num(cx)} {_num(cy)} {_num(ex)} {_num(ey)}"


def _structure_ctx(topology: Topology, schedule: Schedule, view: View) -> dict[str, Any]:
    msgs = messages(schedule)
    per_channel: dict[int, dict[tuple[str, str], list[int]]] = defaultdict(dict)
    intra: dict[int, int] = defaultdict(int)
    for m in msgs:
        a, b = view.rank_node(topology, m.src), view.rank_node(topology, m.dst)
        if a == b:
            intra[m.channel] += m.messages
            continue
        e = per_channel[m.channel].setdefault((a, b), [0, 0, 0])
        e[0] += m.messages
        e[1] += m.chunks
        e[2] += 1
    channels = sorted(set(per_channel) | set(intra))
    shown, hidden = channels[:MAX_CHANNELS], channels[MAX_CHANNELS:]
    groups = []
    for ch in shown:
        pairs = sorted(per_channel[ch].items(), key=lambda kv: (-kv[1][1], kv[0]))
        kept = sorted(pairs[:MAX_STRUCTURE_EDGES])
        colour = PALETTE[ch % len(PALETTE)]
        paths = []
        for (a, b), (n, chunks, rank_pairs) in kept:
            na, nb = view.nodes[a], view.nodes[b]
            who = f"{a} -> {b}" if view.level == "device" else f"{a} -> {b} ({rank_pairs} rank pairs)"
            paths.append({"d": _curve(na.x, na.y, nb.x, nb.y), "tip": f"channel {ch}: {who}, {n} messages, "
                          f"{chunks} chunks", "w": 1.2 + min(3.0, math.log2(1 + chunks) / 3)})
        groups.append({"id": ch, "colour": colour, "paths": paths, "omitted": len(pairs) - len(kept),
                       "intra": intra.get(ch, 0), "pairs": len(pairs)})
    where = {"device": "", "host": " inside hosts", "rack": " inside racks"}[view.level]
    return {"channels": groups, "hidden_channels": len(hidden), "intra_label": where,
            "markers": [(g["id"], g["colour"]) for g in groups]}


# --------------------------------------------------------------------------- per-step link usage


def _steps_ctx(topology: Topology, view: View, per_link: Mapping[tuple[str, str, int], float]) -> dict[str, Any]:
    width, ranges = step_buckets((s for _, _, s in per_link), MAX_STEP_VIEWS)
    group = view.group
    edge_bytes: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    inside: dict[int, float] = defaultdict(float)
    rows: dict[int, list[tuple[float, str, str]]] = defaultdict(list)
    start = ranges[0][0] if ranges else 0
    for (src, dst, step), nbytes in per_link.items():
        key = start + (step - start) // width * width
        rows[key].append((nbytes, src, dst))
        a, b = group[src], group[dst]
        if a == b:
            inside[key] += nbytes
            continue
        idx = view.edge_of(a, b)
        if idx is not None:
            edge_bytes[key][idx] += nbytes
    top = max((v for d in edge_bytes.values() for v in d.values()), default=1.0)
    data: dict[str, list[list[float]]] = {}
    views = []
    for first, last in ranges:
        label = f"step {first}" if first == last else f"steps {first}-{last}"
        data[str(first)] = [[i, round(b)] for i, b in sorted(edge_bytes[first].items())]
        busiest = sorted(rows[first], key=lambda r: (-r[0], r[1], r[2]))[:STEP_TABLE_ROWS]
        table = []
        for nbytes, src, dst in busiest:
            link = topology.link(src, dst)
            bw = link.bandwidth if link else 0.0
            table.append((f"{src} -> {dst}", link.kind if link else "", format_size(nbytes),
                          format_time(nbytes / bw) if bw else "-"))
        views.append({"key": str(first), "label": label, "rows": table, "links": len(rows[first]),
                      "bytes": format_size(sum(r[0] for r in rows[first])),
                      "inside": format_size(inside[first]) if view.level != "device" else None})
    return {"views": views, "data": {"max": top, "steps": data}}


# --------------------------------------------------------------------------- Gantt


def _ticks(total: float) -> list[tuple[float, str]]:
    if total <= 0:
        return [(0.0, "0")]
    raw = total / 8
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    out, t = [], 0.0
    while t <= total * 1.0001:
        out.append((GANTT_LABEL + t / total * GANTT_WIDTH, format_time(t) if t else "0"))
        t += step
    return out


def _gantt_ctx(topology: Topology, schedule: Schedule, view: View, result: SimResult,
               per_link: Mapping[tuple[str, str, int], float]) -> dict[str, Any]:
    total = result.time_s or 1.0
    scale = GANTT_WIDTH / total
    starts = transfer_starts(schedule, result.op_events)
    host_of = {r: h for h, ranks in topology.hosts.items() for r in ranks}
    per_rank = topology.size <= GANTT_RANK_ROWS
    rects: list[dict[str, Any]] = []
    labels: list[tuple[float, str]] = []
    y = 24.0

    comm = [e for e in result.op_events if e.peer is not None]
    if per_rank:
        channels = sorted({e.channel for e in comm})
        lanes = max(1, min(8, len(channels)))
        row_h = max(GANTT_ROW, 5.0 * lanes + 2)
        lane_h = (row_h - 2) / lanes
        rows: dict[tuple[int, int], list[tuple[float, float, Any]]] = defaultdict(list)
        for e in comm:
            begin = starts.get((e.rank, e.index), e.start_s)
            rows[(e.rank, channels.index(e.channel) % lanes)].append((begin, e.end_s, e))
        merge = sum(len(v) for v in rows.values()) > MAX_GANTT_RECTS
        for rank in range(topology.size):
            labels.append((y + row_h / 2, f"rank {rank}"))
            for lane in range(lanes):
                items = rows.get((rank, lane), [])
                ly = y + 1 + lane * lane_h
                if merge:
                    for a, b in merge_intervals(((a, b) for a, b, _ in items), total / 800):
                        rects.append({"x": a, "w": b - a, "y": ly, "h": lane_h - 0.5, "colour": PALETTE[lane],
                                      "tip": f"rank {rank}: busy {format_time(a)} - {format_time(b)}"})
                    continue
                for a, b, e in sorted(items, key=lambda t: (t[0], t[1], t[2].index)):
                    send = e.kind == "send"
                    # sends fill the upper part of the channel's lane, receives the lower part
                    top, height = (ly, lane_h * 0.55) if send else (ly + lane_h * 0.55, lane_h * 0.4)
                    rects.append({"x": a, "w": b - a, "y": top, "h": height,
                                  "colour": PALETTE[e.channel % len(PALETTE)],
                                  "tip": f"rank {rank} step {e.step} {e.kind} {e.chunk} {'->' if send else '<-'} "
                                         f"r{e.peer} (channel {e.channel}): {format_time(a)} - {format_time(b)}"})
            y += row_h
        legend = [(f"channel {c}", PALETTE[c % len(PALETTE)]) for c in channels[:10]]
    else:
        hosts = list(topology.hosts)
        busy: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        for e in comm:
            h = host_of[e.rank]
            busy[(h, 0 if host_of[e.peer] == h else 1)].append((starts.get((e.rank, e.index), e.start_s), e.end_s))
        gap = total / 600
        # widen the gap that joins neighbouring bars until the chart fits its element budget
        while gap < total and sum(len(merge_intervals(v, gap)) for v in busy.values()) > MAX_GANTT_RECTS:
            gap *= 2
        for h in hosts:
            labels.append((y + GANTT_ROW / 2, f"{h} ({len(topology.hosts[h])} ranks)"))
            for lane, (what, colour) in enumerate((("inside the host", PALETTE[2]), ("to other hosts", PALETTE[0]))):
                for a, b in merge_intervals(busy.get((h, lane), ()), gap):
                    rects.append({"x": a, "w": b - a, "y": y + 1 + lane * 8, "h": 7.5, "colour": colour,
                                  "tip": f"{h}: messages {what}, {format_time(a)} - {format_time(b)}"})
            y += GANTT_ROW
        legend = [("messages inside a host", PALETTE[2]), ("messages between hosts", PALETTE[0])]
    rank_height = y

    # ---- links: the busiest drawn edges (directed), their busy intervals
    group = view.group
    edge_total: dict[tuple[str, str], float] = defaultdict(float)
    for (src, dst, _), nbytes in per_link.items():
        a, b = group[src], group[dst]
        key = (src, dst) if view.level == "device" else (a, b)
        if a != b or view.level == "device":
            edge_total[key] += nbytes
    chosen = sorted(sorted(edge_total.items(), key=lambda kv: (-kv[1], kv[0]))[:GANTT_LINK_ROWS])
    index = {k: i for i, (k, _) in enumerate(chosen)}
    wanted = {k[0] for k in index}
    srcs = {d for d, g in group.items() if d in wanted or g in wanted}
    intervals: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in result.link_events:
        if e.src not in srcs:
            continue
        key = (e.src, e.dst) if view.level == "device" else (group[e.src], group[e.dst])
        i = index.get(key)
        if i is not None:
            intervals[(i, e.step)].append((e.start_s, e.end_s))
    by_step = len(intervals) <= MAX_GANTT_RECTS  # else one bar per busy period, steps merged
    y += 26.0
    link_top = y
    for i, ((a, b), nbytes) in enumerate(chosen):
        labels.append((y + GANTT_ROW / 2, f"{a} -> {b}"))
        link = topology.link(a, b) if view.level == "device" else None
        colour = _link_colour(link.kind) if link and link.kind else PALETTE[9]
        steps = sorted(s for j, s in intervals if j == i)
        spans = ([(s, merge_intervals(intervals[(i, s)], total / 800)) for s in steps] if by_step else
                 [(None, merge_intervals([iv for s in steps for iv in intervals[(i, s)]], total / 800))])
        for step, merged in spans:
            for s, t in merged:
                what = f"step {step}" if step is not None else "busy"
                rects.append({"x": s, "w": t - s, "y": y + 2, "h": GANTT_ROW - 4, "colour": colour,
                              "opacity": 1.0 if (step or 0) % 2 == 0 else 0.6,
                              "tip": f"{a} -> {b}: {what} {format_time(s)} - {format_time(t)} "
                                     f"({format_size(nbytes)} in the whole run)"})
        y += GANTT_ROW
    for r in rects:
        r["x"] = GANTT_LABEL + r["x"] * scale
        r["w"] = max(0.6, r["w"] * scale)
    return {"rects": rects, "labels": labels, "ticks": _ticks(total), "width": GANTT_LABEL + GANTT_WIDTH + 20,
            "height": y + 10, "rank_height": rank_height, "link_top": link_top, "legend": legend,
            "rows_title": "ranks" if per_rank else "hosts", "link_rows": len(chosen), "link_candidates":
            len(edge_total)}


# --------------------------------------------------------------------------- summary


def _summary_ctx(topology: Topology, schedule: Schedule, result: SimResult,
                 baselines: Mapping[str, SimResult]) -> dict[str, Any]:
    bound = lower_bound(topology, schedule.collective, result.size_bytes, schedule.root or 0)

    def pct(sim: SimResult) -> str:
        return f"{100 * bound.time_s / sim.time_s:.1f}%" if sim.time_s > 0 else "-"

    name = schedule.metadata.algorithm
    rows = [(f"{name} (this plan)", format_time(result.time_s), pct(result), f"{result.algbw_GBps:.2f}",
             f"{result.busbw_GBps:.2f}", "1.00x", True)]
    for base, sim in sorted(baselines.items()):
        ratio = sim.time_s / result.time_s if result.time_s > 0 else float("nan")
        rows.append((base, format_time(sim.time_s), pct(sim), f"{sim.algbw_GBps:.2f}", f"{sim.busbw_GBps:.2f}",
                     f"{ratio:.2f}x", False))
    bottlenecks = []
    for (a, b), util in result.bottlenecks(10):
        link = topology.link(a, b)
        bottlenecks.append((f"{a} -> {b}", link.kind if link else "", format_bandwidth(link.bandwidth) if link else "",
                            format_size(result.link_bytes.get((a, b), 0.0)), f"{100 * util:.1f}%"))
    facts = [
        ("collective", f"{schedule.collective}" + (f" (root {schedule.root})" if schedule.root is not None else "")),
        ("algorithm", name), ("ranks", str(schedule.ranks)), ("operations", str(schedule.op_count)),
        ("size", format_size(result.size_bytes)), ("predicted time", format_time(result.time_s)),
        ("lower bound", f"{format_time(bound.time_s)} ({bound.cut})"), ("of lower bound", pct(result)),
        ("algbw / busbw", f"{result.algbw_GBps:.2f} / {result.busbw_GBps:.2f} GB/s"),
    ]
    return {"facts": facts, "rows": rows, "bottlenecks": bottlenecks}


# --------------------------------------------------------------------------- entry points


def render_html(topology: Topology, schedule: Schedule, size_bytes: int, *,
                baselines: Mapping[str, SimResult] | None = None, result: SimResult | None = None) -> str:
    """The plan report as one self-contained HTML page.

    Simulates ``schedule`` at ``size_bytes`` (with recording) unless ``result``
    already holds such a recorded simulation.  ``baselines`` (name -> result of
    another schedule, same topology and size) fill the comparison table.

    >>> html = render_html(topology, schedule, 64 << 20, baselines={"ring": ring_sim})  # doctest: +SKIP
    """
    if result is None or (schedule.op_count and not result.op_events):
        result = simulate(topology, schedule, size_bytes, record=True)
    with paused_gc():
        return _render(topology, schedule, result, baselines or {})


def _render(topology: Topology, schedule: Schedule, result: SimResult, baselines: Mapping[str, SimResult]) -> str:
    view = build_view(topology)
    per_link = link_step_bytes(result)
    ctx = {
        "title": f"{schedule.collective} ({schedule.metadata.algorithm}) on {topology.name}",
        "topo": _topology_ctx(topology, view),
        "structure": _structure_ctx(topology, schedule, view),
        "steps": _steps_ctx(topology, view, per_link),
        "gantt": _gantt_ctx(topology, schedule, view, result, per_link),
        "summary": _summary_ctx(topology, schedule, result, baselines),
    }
    return _env().get_template("report.html.j2").render(**ctx)


def render_topology_html(topology: Topology) -> str:
    """A self-contained HTML page drawing ``topology`` (``topocc topo show --html``)."""
    view = build_view(topology)
    return _env().get_template("topology.html.j2").render(title=f"topology {topology.name}",
                                                          topo=_topology_ctx(topology, view))

