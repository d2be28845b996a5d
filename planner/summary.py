"""Plain summaries of topologies, compilations and simulations: dicts for ``--json``, text tables for people.

Both views come from the same dict so the terminal and scripts never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from planner.algorithms import ALGORITHMS
from planner.bounds import Bound, lower_bound
from planner.compile import Compiled
from planner.simulate import SimResult, simulate
from planner.topology import Topology, describe
from planner.units import format_bandwidth, format_size, format_time
from planner.verify import VerifyReport
from runtime.plan import Plan, as_plan
from runtime.schedule import Schedule

__all__ = [
    "algorithms_table",
    "compiled_summary",
    "format_plan",
    "format_summary",
    "format_table",
    "inspect_schedule",
    "plan_summary",
    "predicted_times",
    "simulation_summary",
    "topology_summary",
    "verify_summary",
]


def format_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A left-aligned text table."""
    cells = [[str(h) for h in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _bottlenecks(sim: SimResult, n: int = 5) -> list[dict[str, Any]]:
    return [{"link": f"{a} -> {b}", "utilisation": round(u, 4)} for (a, b), u in sim.bottlenecks(n)]


def _timing(sim: SimResult, bound: Bound) -> dict[str, Any]:
    return {
        "size_bytes": sim.size_bytes,
        "predicted_time_s": sim.time_s,
        "lower_bound_s": bound.time_s,
        "percent_of_bound": round(100.0 * bound.time_s / sim.time_s, 2) if sim.time_s > 0 else 100.0,
        "algbw_GBps": sim.algbw_GBps,
        "busbw_GBps": sim.busbw_GBps,
        "bound_cut": bound.cut,
        "bottleneck_links": _bottlenecks(sim),
    }


def compiled_summary(compiled: Compiled, output: str | None = None) -> dict[str, Any]:
    """What ``topocc compile`` reports."""
    s = compiled.schedule
    out: dict[str, Any] = {
        "topology": s.metadata.topology,
        "collective": s.collective,
        "algorithm": s.metadata.algorithm,
        "ranks": s.ranks,
        "operations": compiled.proof.operations,
        "messages": compiled.proof.messages,
        "verified": True,
        **_timing(compiled.sim, compiled.bound),
    }
    if compiled.candidates:
        out["candidates"] = [
            {"algorithm": c.algorithm, "predicted_time_s": c.time_s, "compile_s": round(c.compile_s, 3),
             "operations": c.operations, "reason": c.reason}
            for c in compiled.candidates
        ]
    if output:
        out["output"] = output
    return out


def plan_summary(results: Sequence[Compiled], output: str | None = None) -> dict[str, Any]:
    """What ``topocc compile --size LOW:HIGH`` reports: one row per size bucket."""
    first = results[0].schedule
    return {
        "topology": first.metadata.topology,
        "collective": first.collective,
        "ranks": first.ranks,
        "buckets": [compiled_summary(c) | {"min_bytes": c.schedule.metadata.min_bytes,
                                           "max_bytes": c.schedule.metadata.max_bytes} for c in results],
        **({"output": output} if output else {}),
    }


def format_plan(doc: Mapping[str, Any]) -> str:
    rows = [
        (format_size(b["min_bytes"]) if b["min_bytes"] else "0",
         format_size(b["max_bytes"]) if b["max_bytes"] is not None else "inf",
         b["algorithm"], format_size(b["size_bytes"]), format_time(b["predicted_time_s"]),
         _pct(b["percent_of_bound"]), f"{b['algbw_GBps']:.2f}")
        for b in doc["buckets"]
    ]
    text = (f"plan for {doc['collective']} on {doc['topology']} ({doc['ranks']} ranks): {len(rows)} buckets\n"
            + _indent(format_table(rows, ("from", "to", "algorithm", "tuned at", "predicted", "of bound",
                                          "algbw GB/s"))))
    if doc.get("output"):
        text += f"\n  wrote {doc['output']}"
    return text


def simulation_summary(topology: Topology, schedule: Schedule, size_bytes: int, *, candidates: bool = False,
                       trace: str | None = None) -> dict[str, Any]:
    """What ``topocc simulate`` reports: prediction, bound, bandwidths, busiest links.

    ``candidates`` races every algorithm at this size (as ``auto`` does) so the
    table shows where this schedule stands; ``trace`` writes the simulated
    timeline as a Chrome trace.
    """
    sim = simulate(topology, schedule, size_bytes, record=trace is not None)
    bound = lower_bound(topology, schedule.collective, size_bytes, schedule.root or 0)
    doc: dict[str, Any] = {
        "topology": topology.name,
        "collective": schedule.collective,
        "algorithm": schedule.metadata.algorithm,
        "ranks": schedule.ranks,
        **_timing(sim, bound),
        "link_utilisation": {f"{a} -> {b}": round(u, 4) for (a, b), u in sorted(sim.link_utilisation.items())},
    }
    if trace:
        from planner.formats.chrome_trace import simulated_trace
        from runtime.trace import write_trace

        write_trace(trace, simulated_trace(topology, schedule, sim))
        doc["trace"] = trace
    if candidates:
        from planner.algorithms import Options
        from planner.compile import compile_schedule

        race = compile_schedule(topology, schedule.collective, "auto",
                                Options(size_bytes=size_bytes, root=schedule.root or 0))
        doc["candidates"] = compiled_summary(race)["candidates"]
        doc["winner"] = race.schedule.metadata.algorithm
    return doc


def inspect_schedule(path: str, topology: str | None = None, size_bytes: int | None = None, *,
                     html: str | None = None, dot: str | None = None, baselines: Sequence[str] = ()) -> str:
    """``topocc inspect``: write the HTML report and/or DOT drawing, or return the terminal view."""
    from pathlib import Path

    from planner.algorithms import Options
    from planner.compile import compile_schedule, schedule_topology
    from planner.errors import TopoccError
    from planner.report import render_dot, render_html, terminal_summary
    from runtime.plan import load_any

    plan = as_plan(load_any(path))
    size = size_bytes or plan.schedules[0].metadata.size_bytes or (64 << 20)
    schedule = plan.select(size)
    topo = schedule_topology(schedule, path, topology)
    if not html and not dot:
        return terminal_summary(topo, schedule, size_bytes=size)
    result = simulate(topo, schedule, size, record=True)
    written = []
    if html:
        compared: dict[str, SimResult] = {}
        for name in baselines:
            if name == schedule.metadata.algorithm:
                continue
            try:
                compared[name] = compile_schedule(topo, schedule.collective, name,
                                                  Options(size_bytes=size, root=schedule.root or 0)).sim
            except TopoccError:
                continue  # a baseline that does not apply here is simply not compared
        Path(html).write_text(render_html(topo, schedule, size, baselines=compared, result=result))
        written.append(html)
    if dot:
        Path(dot).write_text(render_dot(topo, schedule, size_bytes=size, result=result))
        written.append(dot)
    return "wrote " + ", ".join(written)


def predicted_times(source: Schedule | Plan, sizes: Sequence[int], schedule_path: str | None = None,
                    topology: str | None = None) -> list[float | None]:
    """The simulator's prediction per size for a schedule or plan (None where its topology is not found)."""
    from planner.compile import schedule_topology
    from planner.errors import TopoccError

    plan = as_plan(source)
    try:
        topo = schedule_topology(plan.schedules[0], schedule_path, topology)
    except TopoccError:
        return [None for _ in sizes]
    return [simulate(topo, plan.select(size), size).time_s for size in sizes]


def verify_summary(schedule: Schedule, proof: VerifyReport) -> dict[str, Any]:
    return {
        "verified": True,
        "collective": schedule.collective,
        "algorithm": schedule.metadata.algorithm,
        "ranks": proof.ranks,
        "operations": proof.operations,
        "messages": proof.messages,
        "chunks_sent": proof.chunks_sent,
    }


def topology_summary(topology: Topology, size_bytes: int = 1 << 30) -> dict[str, Any]:
    """What ``topocc topo show`` reports, including the cut bound for allreduce and allgather."""
    out = dict(describe(topology))
    cuts = {}
    for collective in ("allreduce", "allgather"):
        bound = lower_bound(topology, collective, size_bytes)
        cuts[collective] = {
            "size_bytes": size_bytes,
            "lower_bound_s": bound.time_s,
            "max_algbw_GBps": size_bytes / bound.time_s / 1e9 if bound.time_s > 0 else None,
            "cut": bound.cut,
        }
    out["cut_bound"] = cuts
    return out


def algorithms_table() -> list[dict[str, Any]]:
    return [{"name": a.name, "collectives": list(a.collectives), "summary": a.summary} for a in ALGORITHMS.values()]


def _pct(value: float) -> str:
    return f"{value:.1f}%"


def format_summary(doc: Mapping[str, Any]) -> str:
    """Human text for any of the summaries above."""
    lines: list[str] = []
    if "predicted_time_s" in doc:
        lines.append(f"{doc.get('collective')} with {doc.get('algorithm')} on {doc.get('topology')} "
                     f"({doc.get('ranks')} ranks)")
        if "operations" in doc:
            lines.append(f"  verified: {doc['operations']} operations, {doc['messages']} messages")
        lines.append(f"  size:           {format_size(doc['size_bytes'])}")
        lines.append(f"  predicted time: {format_time(doc['predicted_time_s'])}")
        lines.append(f"  lower bound:    {format_time(doc['lower_bound_s'])} ({doc['bound_cut']})")
        lines.append(f"  of bound:       {_pct(doc['percent_of_bound'])}")
        lines.append(f"  algbw / busbw:  {doc['algbw_GBps']:.2f} / {doc['busbw_GBps']:.2f} GB/s")
        if doc.get("bottleneck_links"):
            busiest = ", ".join(f"{b['link']} ({100 * b['utilisation']:.0f}%)" for b in doc["bottleneck_links"][:3])
            lines.append(f"  busiest links:  {busiest}")
        if doc.get("candidates"):
            rows = [
                (c["algorithm"], format_time(c["predicted_time_s"]) if c["predicted_time_s"] else "-",
                 c["operations"] or "-", f"{c['compile_s']:.2f}s", c["reason"] or "")
                for c in doc["candidates"]
            ]
            lines.append("")
            lines.append(_indent(format_table(rows, ("candidate", "predicted", "ops", "compile", "why not chosen"))))
        if doc.get("output"):
            lines.append(f"  wrote {doc['output']}")
    elif "cut_bound" in doc:
        lines.append(f"{doc['name']}: {doc['ranks']} ranks, {doc['hosts']} hosts, {doc['racks']} racks, "
                     f"{doc['links']} directed links")
        if doc.get("description"):
            lines.append(f"  {doc['description']}")
        lines.append("  devices: " + ", ".join(f"{n} {k}" for k, n in doc["devices"].items()))
        lines.append(f"  link bandwidth: {format_bandwidth(doc['min_link_bandwidth_GBps'] * 1e9)} .. "
                     f"{format_bandwidth(doc['max_link_bandwidth_GBps'] * 1e9)}")
        lines.append(f"  routing: {doc['routing']}")
        for coll, cut in doc["cut_bound"].items():
            lines.append(f"  cut bound ({coll}, {format_size(cut['size_bytes'])}): {format_time(cut['lower_bound_s'])}"
                         f" = at most {cut['max_algbw_GBps']:.2f} GB/s algbw; tightest cut: {cut['cut']}")
        lines.append(f"  fingerprint: {doc['fingerprint'][:16]}")
    elif "verified" in doc:
        lines.append(f"verified: {doc['collective']} ({doc['algorithm']}) on {doc['ranks']} ranks, "
                     f"{doc['operations']} operations, {doc['messages']} messages")
    return "\n".join(lines)


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def format_algorithms(rows: Iterable[Mapping[str, Any]]) -> str:
    return format_table([(r["name"], ", ".join(r["collectives"]), r["summary"]) for r in rows],
                        ("algorithm", "collectives", "what"))
