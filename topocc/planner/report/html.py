"""One self-contained HTML report of a plan: topology, structure, per-step traffic, timeline and summary.

Everything is inline (CSS, a little JS, SVG), so the file opens anywhere
without a network.  The layout and all aggregation are computed here, in
Python, deterministically; the template only draws (jinja2 with autoescape, so
device and algorithm names are always escaped).  Views aggregate by host or
rack on large topologies (:mod:`topocc.planner.report._model`), and every chart has an
element budget, so a 1024-rank report stays a few MB and quick to open.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from functools import cache
from typing import Any

import jinja2
import markupsafe

from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.encodings import is_encoded
from topocc.planner.analysis.simulate import SimResult
from topocc.planner.compiler.compress import describe_encoded
from topocc.planner.report._model import View, build_view, messages, step_buckets
from topocc.planner.report._run import Run, link_step_bytes, record_run
from topocc.planner.report._timeline import INTERVAL_RANKS, timeline_doc
from topocc.planner.report.compression import compression_section
from topocc.planner.topology.model import Topology, describe
from topocc.planner.units import format_bandwidth, format_size, format_time
from topocc.runtime.schedule import Schedule

__all__ = ["render_html", "render_topology_html"]

#: Element budgets (SVG shapes per view), so a report stays readable and small at 1024 ranks.
MAX_STRUCTURE_EDGES = 300
MAX_CHANNELS = 32
MAX_STEP_VIEWS = 120
STEP_TABLE_ROWS = 6

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
LINK_COLOURS = {"nvlink": "#5a9e00", "pcie": "#d98c00", "ib": "#0072b2", "qpi": "#cc79a7", "eth": "#009e73"}


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("topocc.planner.report", "templates"),
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


# --------------------------------------------------------------------------- summary


def _summary_ctx(topology: Topology, schedule: Schedule, result: SimResult,
                 baselines: Mapping[str, SimResult | str]) -> dict[str, Any]:
    bound = lower_bound(topology, schedule.collective, result.size_bytes, schedule.root or 0)

    def pct(sim: SimResult) -> str:
        return f"{100 * bound.time_s / sim.time_s:.1f}%" if sim.time_s > 0 else "-"

    name = schedule.metadata.algorithm
    rows: list[tuple[Any, ...]] = [(f"{name} (this plan)", format_time(result.time_s), pct(result),
                                    f"{result.algbw_GBps:.2f}", f"{result.busbw_GBps:.2f}", "1.00x", True)]
    for base, sim in sorted(baselines.items()):
        if isinstance(sim, str):  # not compared, and why
            rows.append((base, sim))
            continue
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
    headline = [("predicted", format_time(result.time_s)), ("of the lower bound", pct(result)),
                ("algbw / busbw", f"{result.algbw_GBps:.1f} / {result.busbw_GBps:.1f} GB/s"),
                ("ranks", str(schedule.ranks)), ("buffer", format_size(result.size_bytes)),
                ("operations", f"{schedule.op_count:,}")]
    return {"facts": facts, "rows": rows, "bottlenecks": bottlenecks, "headline": headline}


# --------------------------------------------------------------------------- entry points


def render_html(topology: Topology, schedule: Schedule, size_bytes: int, *,
                baselines: Mapping[str, SimResult | str] | None = None, run: Run | None = None) -> str:
    """The plan report as one self-contained HTML page.

    Simulates ``schedule`` at ``size_bytes`` (keeping one row per message, see
    :func:`~topocc.planner.report._run.record_run`) unless ``run`` already holds that
    simulation.  ``baselines`` (name -> result of another schedule on the same
    topology and size, or a sentence saying why it was not compared) fill the
    comparison table.

    >>> html = render_html(topology, schedule, 64 << 20, baselines={"ring": ring_sim})  # doctest: +SKIP
    """
    if run is None:
        run = record_run(topology, schedule, size_bytes)
    view = build_view(topology)
    ctx = {
        "title": f"{schedule.collective} ({schedule.metadata.algorithm}) on {topology.name}",
        "topo": _topology_ctx(topology, view),
        "structure": _structure_ctx(topology, schedule, view),
        "steps": _steps_ctx(topology, view, link_step_bytes(run)),
        "timeline": timeline_doc(topology, run),
        "timeline_ranks": INTERVAL_RANKS,
        "summary": _summary_ctx(topology, schedule, run.result, baselines or {}),
        # an encoded schedule: which links carry which encoding, the bytes saved, the time against exact
        "compression": markupsafe.Markup(compression_section(describe_encoded(topology, schedule, size_bytes)
                                                               .to_json())) if is_encoded(schedule) else "",
    }
    return _env().get_template("report.html.j2").render(**ctx)


def render_topology_html(topology: Topology) -> str:
    """A self-contained HTML page drawing ``topology`` (``topocc topo show --html``)."""
    view = build_view(topology)
    return _env().get_template("topology.html.j2").render(title=f"topology {topology.name}",
                                                          topo=_topology_ctx(topology, view))

