"""Plain-text view of a plan for ``topocc inspect`` without output files: structure, busiest links, steps."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from topocc.planner.report._model import Message, messages, step_buckets
from topocc.planner.report._run import Run, link_step_bytes, record_run
from topocc.planner.report.table import format_table
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_size, format_time
from topocc.runtime.schedule import Schedule

__all__ = ["describe_channel", "terminal_summary"]

#: Characters of a structure line before it is cut with "... (N more)".
LINE_WIDTH = 110
#: Step rows listed before the rest are summed into one line.
MAX_STEP_ROWS = 40


def _cut(parts: list[str], sep: str, width: int = LINE_WIDTH) -> str:
    out = ""
    for i, part in enumerate(parts):
        nxt = part if not out else out + sep + part
        if len(nxt) > width and out:
            return f"{out}{sep}... ({len(parts) - i} more)"
        out = nxt
    return out


def describe_channel(msgs: list[Message], ranks: int) -> str:
    """One line for one channel: ``ring 0 -> 3 -> 2 -> ...``, ``tree (root 0) ...`` or its rank pairs."""
    succ: dict[int, set[int]] = defaultdict(set)
    pred: dict[int, set[int]] = defaultdict(set)
    for m in msgs:
        succ[m.src].add(m.dst)
        pred[m.dst].add(m.src)
    nodes = sorted(set(succ) | set(pred))
    pairs = {(m.src, m.dst) for m in msgs}
    # one directed cycle through every node it touches: a ring
    if nodes and all(len(succ[n]) == 1 and len(pred[n]) == 1 for n in nodes):
        order, cur = [nodes[0]], next(iter(succ[nodes[0]]))
        while cur != nodes[0] and len(order) <= len(nodes):
            order.append(cur)
            cur = next(iter(succ[cur]))
        if len(order) == len(nodes):
            return f"ring over {len(nodes)} ranks: " + _cut([str(r) for r in [*order, order[0]]], " -> ")
    # as many undirected edges as nodes - 1 (a connected plan): a tree, walked down (broadcast), up
    # (reduce) or both ways (allreduce: the parent is the neighbour a rank sends to before receiving from it)
    undirected = {tuple(sorted(p)) for p in pairs}
    if nodes and len(undirected) == len(nodes) - 1:
        if all(len(pred[n]) <= 1 for n in nodes) and len(pairs) == len(undirected):
            parent = {n: next(iter(pred[n])) for n in nodes if pred[n]}
        elif all(len(succ[n]) <= 1 for n in nodes) and len(pairs) == len(undirected):
            parent = {n: next(iter(succ[n])) for n in nodes if succ[n]}
        else:
            first: dict[tuple[int, int], int] = {}
            for m in msgs:
                first[(m.src, m.dst)] = min(first.get((m.src, m.dst), m.first_step), m.first_step)
            parent = {a: b for (a, b), s in first.items() if s < first.get((b, a), s + 1)}
        roots = [n for n in nodes if n not in parent]
        kids: dict[int, list[int]] = defaultdict(list)
        for child, par in sorted(parent.items()):
            kids[par].append(child)
        root = roots[0] if len(roots) == 1 else min(nodes)
        return (f"tree over {len(nodes)} ranks, root {root}: "
                + _cut([f"{p}->[{','.join(map(str, c))}]" for p, c in sorted(kids.items())], " "))
    shown = [f"{a}->{b}" for a, b in sorted(pairs)]
    return f"{len(pairs)} rank pairs: " + _cut(shown, " ")


def terminal_summary(topology: Topology, schedule: Schedule, run: Run | None = None, *,
                     size_bytes: int | None = None, top: int = 8) -> str:
    """Text tables: the plan's structure per channel, the ``top`` busiest links and per-step link usage.

    Simulates at ``size_bytes`` (default: the size the plan was compiled for,
    else 64 MiB) unless ``run`` already holds that simulation.
    """
    if run is None:
        run = record_run(topology, schedule, size_bytes or schedule.metadata.size_bytes or (64 << 20))
    result = run.result
    meta = schedule.metadata
    out = [f"{schedule.collective} ({meta.algorithm}) on {topology.name}: {schedule.ranks} ranks, "
           f"{len(topology.hosts)} hosts, {schedule.op_count} operations",
           f"  {format_size(result.size_bytes)}: predicted {format_time(result.time_s)}, "
           f"algbw {result.algbw_GBps:.2f} GB/s, busbw {result.busbw_GBps:.2f} GB/s", ""]

    by_channel: dict[int, list[Message]] = defaultdict(list)
    for m in messages(schedule):
        by_channel[m.channel].append(m)
    out.append(f"structure ({len(by_channel)} channel{'s' * (len(by_channel) != 1)}):")
    channels = sorted(by_channel)
    for ch in channels[:32]:
        out.append(f"  channel {ch}: {describe_channel(by_channel[ch], schedule.ranks)}")
    if len(channels) > 32:
        out.append(f"  ... {len(channels) - 32} more channels")

    out.append("")
    out.append(f"busiest links (of {sum(1 for b in result.link_bytes.values() if b > 0)} used):")
    rows = []
    for (a, b), util in result.bottlenecks(top):
        link = topology.link(a, b)
        rows.append((f"{a} -> {b}", link.kind if link else "", format_size(result.link_bytes[(a, b)]),
                     f"{100 * util:.1f}%"))
    out.append(_indent(format_table(rows, ("link", "kind", "bytes", "utilisation"))))

    per_link = link_step_bytes(run)
    width, ranges = step_buckets((s for _, _, s in per_link), MAX_STEP_ROWS)
    agg: dict[int, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    start = ranges[0][0] if ranges else 0
    for (src, dst, step), nbytes in per_link.items():
        agg[start + (step - start) // width * width][(src, dst)] += nbytes
    # when each row's messages were on the wire: first start and last arrival of its steps
    bucket = start + (run.step - start) // width * width
    windows = {int(k): (float(run.start[bucket == k].min()), float(run.end[bucket == k].max()))
               for k in np.unique(bucket)}
    step_rows = []
    for first, last in ranges:
        links = agg[first]
        busiest = sorted(links.items(), key=lambda kv: (-kv[1], kv[0]))[: min(top, 2)]
        t0, t1 = windows.get(first, (0.0, 0.0))
        step_rows.append((str(first) if first == last else f"{first}-{last}", f"{format_time(t0)} - {format_time(t1)}",
                          len(links), format_size(sum(links.values())),
                          ", ".join(f"{a}->{b} {format_size(v)}" for (a, b), v in busiest)))
    out.append("")
    out.append("link usage per step" + (f" ({width} steps per row)" if width > 1 else "") + ":")
    out.append(_indent(format_table(step_rows, ("step", "when", "links", "bytes", "busiest"))))
    return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
