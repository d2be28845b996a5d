"""Plain summaries of topologies, compilations and simulations: dicts for ``--json``, text for people.

Both views come from the same dict, so the terminal and scripts never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from topocc.planner.analysis.bounds import Bound, lower_bound
from topocc.planner.analysis.simulate import SimResult, simulate
from topocc.planner.analysis.verify import VerifyReport
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.bundling import CompiledPlan
from topocc.planner.compiler.compile import Compiled, compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.report.simulated_trace import simulated_trace
from topocc.planner.report.table import format_table, indent, percent
from topocc.planner.routing.network import Network
from topocc.planner.topology.calibration import link_classes_of
from topocc.planner.topology.catalogue import compiled_for
from topocc.planner.topology.model import Link, Topology, describe
from topocc.planner.units import format_bandwidth, format_size, format_time
from topocc.runtime.bundle import group_label
from topocc.runtime.chrome_trace import write_trace
from topocc.runtime.schedule import Schedule

__all__ = [
    "algorithms_table",
    "bundle_summary",
    "compiled_summary",
    "format_algorithms",
    "format_bundle",
    "format_plan",
    "format_summary",
    "model_note",
    "plan_summary",
    "simulation_summary",
    "topology_summary",
    "verify_summary",
    "what_if_line",
    "what_if_note",
]


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


def written_form(schedule: Schedule) -> dict[str, Any]:
    """How a schedule file holds its programs: rank by rank, or symmetric (its classes and grid)."""
    if schedule.symmetry is None:
        return {"form": "per-rank"}
    return {"form": "symmetric", "class_programs": len(schedule.symmetry.templates),
            "grid": list(schedule.symmetry.shape),
            "stored_operations": sum(len(t) for t in schedule.symmetry.templates)}


def compiled_summary(compiled: Compiled, output: str | None = None, written: Schedule | None = None) -> dict[str, Any]:
    """What ``topocc compile`` reports (``written``: the schedule as the output file holds it)."""
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
        out["written"] = written_form(written or s)
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
         percent(b["percent_of_bound"]), format_bandwidth(b["algbw_GBps"] * 1e9))
        for b in doc["buckets"]
    ]
    text = (f"plan for {doc['collective']} on {doc['topology']} ({doc['ranks']} ranks): {len(rows)} buckets\n"
            + indent(format_table(rows, ("from", "to", "algorithm", "tuned at", "predicted", "of bound",
                                          "algbw"))))
    if doc.get("model"):
        text += f"\n  model: {doc['model']}"
    if doc.get("output"):
        text += f"\n  wrote {doc['output']}"
    return text


def bundle_summary(topology: Topology, plans: Sequence[CompiledPlan], manifest: str | Path) -> dict[str, Any]:
    """What ``topocc bundle`` reports: the world, and per plan its group, root, ``compile --size LOW:HIGH``'s
    summary, the time predicted at the largest size asked for (``size_bytes``) and the size below which calls
    go native (``native_below_bytes``; None for every call)."""
    return {
        "topology": topology.name,
        "ranks": topology.size,
        "fingerprint": topology.fingerprint,
        "plans": [{"group": list(c.request.group), "root": c.request.root, **plan_summary(c.buckets),
                   "size_bytes": c.request.high, "predicted_time_s": _predicted_at_largest(topology, c),
                   "native_below_bytes": c.native.native_below if c.native is not None else 0}
                  for c in plans],
        "output": str(manifest),
    }


def _predicted_at_largest(topology: Topology, compiled: CompiledPlan) -> float:
    """The plan's predicted time at the largest size its request asked for.  The last bucket serves it, but it
    was timed at the size it was tuned for, which is smaller where neighbouring buckets chose one schedule and
    were merged (a recorded 4.77 MB all-reduce served by the bucket tuned at 1 MiB)."""
    last = compiled.buckets[-1]
    if last.sim.size_bytes == compiled.request.high:
        return last.sim.time_s
    group = topology.subset(compiled.request.group)
    return simulate(group, last.schedule, compiled.request.high).time_s


def format_bundle(doc: Mapping[str, Any]) -> str:
    """A line per plan (collective, group, root, buckets, algorithms, the size below which calls go native,
    prediction at the largest size asked for), the manifest written, and how a job uses the bundle."""
    rows = []
    for p in doc["plans"]:
        algorithms = ",".join(dict.fromkeys(b["algorithm"] for b in p["buckets"]))
        rows.append((p["collective"], group_label(p["group"], doc["ranks"]), "-" if p["root"] is None else p["root"],
                     len(p["buckets"]), algorithms, _native_cell(p.get("native_below_bytes", 0)),
                     f"{format_time(p['predicted_time_s'])} at {format_size(p['size_bytes'])}"))
    folder = Path(doc["output"]).parent
    return (f"bundle for {doc['topology']} ({doc['ranks']} ranks): {len(rows)} plans\n"
            + indent(format_table(rows, ("collective", "group", "root", "buckets", "algorithms", "native below",
                                         "predicted")))
            + f"\n  wrote {doc['output']}"
            + f"\nnext: TOPOCC_PLAN={folder} torchrun ... train.py (with init_process_group(\"topocc\"))")


def _native_cell(native_below: int | None) -> str:
    """Where calls go to the native backend: ``-`` (none), a size, or ``every size``."""
    if native_below is None:
        return "every size"
    return format_size(native_below) if native_below else "-"


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
        **_what_if(schedule, topology),
        **_timing(sim, bound),
        "model": model_note(topology),
        "link_utilisation": {f"{a} -> {b}": round(u, 4) for (a, b), u in sorted(sim.link_utilisation.items())},
    }
    if trace:
        write_trace(trace, simulated_trace(topology, schedule, sim))
        doc["trace"] = trace
    if candidates:
        race = compile_schedule(topology, schedule.collective, "auto",
                                Options(size_bytes=size_bytes, root=schedule.root or 0))
        doc["candidates"] = compiled_summary(race)["candidates"]
        doc["winner"] = race.schedule.metadata.algorithm
    return doc


def _what_if(schedule: Schedule, topology: Topology) -> dict[str, Any]:
    """Whether a schedule is timed on a topology other than its own (``--what-if``), and which it was compiled for."""
    return {"what_if": not compiled_for(schedule, topology), "compiled_for": schedule.metadata.topology}


def model_note(topology: Topology) -> str:
    """Which model predicts on ``topology``: its calibration (when and over what), or the file's figures."""
    cal = topology.calibration
    if cal is None:
        return "datasheet (the file's figures; topocc calibrate measures them)"
    return f"calibrated (measured {cal.measured}, {cal.transport})"


def what_if_note(schedule: Schedule, topology: Topology) -> str | None:
    """:func:`what_if_line` for a schedule timed on ``topology``."""
    return what_if_line(_what_if(schedule, topology) | {"topology": topology.name})


def what_if_line(doc: Mapping[str, Any]) -> str | None:
    """The warning a what-if result carries in text: compiled for one topology, timed on another."""
    if not doc.get("what_if"):
        return None
    return (f"what-if: a schedule compiled for {doc.get('compiled_for') or 'another topology'}, "
            f"timed on {doc['topology']} (--what-if)")


def verify_summary(schedule: Schedule, proof: VerifyReport) -> dict[str, Any]:
    out: dict[str, Any] = {
        "verified": True,
        "collective": schedule.collective,
        "algorithm": schedule.metadata.algorithm,
        "ranks": proof.ranks,
        "operations": proof.operations,
        "messages": proof.messages,
        "chunks_sent": proof.chunks_sent,
    }
    if proof.approximate_chunks:  # an encoded schedule: proved bitwise equal on every rank, and this approximate
        out["approximate_chunks"] = proof.approximate_chunks
    return out


def topology_summary(topology: Topology, size_bytes: int = 1 << 30) -> dict[str, Any]:
    """What ``topocc topo show`` reports, including the lower bound of allreduce and allgather."""
    described = dict(describe(topology))
    out = {"topology": described.pop("name"), **described}
    bounds = {}
    net = Network(topology)  # one network: the two bounds share its candidate cuts
    for collective in ("allreduce", "allgather"):
        bound = lower_bound(net, collective, size_bytes)
        bounds[collective] = {
            "size_bytes": size_bytes,
            "lower_bound_s": bound.time_s,
            "max_algbw_GBps": size_bytes / bound.time_s / 1e9 if bound.time_s > 0 else None,
            "bound_cut": bound.cut,
        }
    out["bounds"] = bounds
    out["link_classes"] = _link_classes(topology)
    return out


def _link_classes(topology: Topology) -> dict[str, dict[str, Any]]:
    """Per link class (:func:`~topocc.planner.topology.calibration.link_classes_of`), narrowest first: its
    directed links, their bandwidth range (per direction) and the narrowest one with its latency, so that a
    figure in the wrong unit stands out at the top."""
    classes = link_classes_of(topology)
    members: dict[str, list[Link]] = {}
    for link in topology.links:
        members.setdefault(classes[(link.src, link.dst)], []).append(link)
    rows = {}
    for name, links in sorted(members.items(), key=lambda kv: (min(lk.bandwidth for lk in kv[1]), kv[0])):
        narrowest = min(links, key=lambda lk: lk.bandwidth)
        rows[name] = {"links": len(links), "min_link_bandwidth_GBps": narrowest.bandwidth / 1e9,
                      "max_link_bandwidth_GBps": max(lk.bandwidth for lk in links) / 1e9,
                      "link": f"{narrowest.src} -> {narrowest.dst}", "latency_s": narrowest.latency}
    return rows


def algorithms_table() -> list[dict[str, Any]]:
    """What ``topocc algorithms`` lists: each algorithm, the collectives it implements, its idea."""
    return [{"algorithm": a.name, "collectives": list(a.collectives), "summary": a.summary}
            for a in ALGORITHMS.values()]


def format_summary(doc: Mapping[str, Any]) -> str:
    """Human text for any of the summaries above."""
    lines: list[str] = []
    if "predicted_time_s" in doc:
        if warning := what_if_line(doc):
            lines.append(warning)
        lines.append(f"{doc.get('collective')} with {doc.get('algorithm')} on {doc.get('topology')} "
                     f"({doc.get('ranks')} ranks)")
        if "operations" in doc:
            lines.append(f"  verified: {doc['operations']} operations, {doc['messages']} messages")
        lines.append(f"  size:           {format_size(doc['size_bytes'])}")
        lines.append(f"  predicted time: {format_time(doc['predicted_time_s'])}")
        lines.append(f"  lower bound:    {format_time(doc['lower_bound_s'])} ({doc['bound_cut']})")
        lines.append(f"  of bound:       {percent(doc['percent_of_bound'])}")
        lines.append(f"  algbw / busbw:  {format_bandwidth(doc['algbw_GBps'] * 1e9)} / "
                     f"{format_bandwidth(doc['busbw_GBps'] * 1e9)}")
        if doc.get("model"):
            lines.append(f"  model:          {doc['model']}")
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
            lines.append(indent(format_table(rows, ("candidate", "predicted", "ops", "compile", "why not chosen"))))
        for written in ("output", "trace"):
            if doc.get(written):
                lines.append(f"  wrote {doc[written]}")
        form = doc.get("written", {})
        if form.get("form") == "symmetric":
            lines.append(f"  symmetric form: {form['class_programs']} class program(s), {form['stored_operations']} "
                         f"operations stored for {doc['operations']} (grid {'x'.join(map(str, form['grid']))})")
    elif "bounds" in doc:
        lines += _topology_lines(doc)
    elif "verified" in doc:
        lines.append(f"verified: {doc['collective']} ({doc['algorithm']}) on {doc['ranks']} ranks, "
                     f"{doc['operations']} operations, {doc['messages']} messages")
        if doc.get("approximate_chunks"):
            lines.append(f"  encoded: every rank ends bitwise equal; {doc['approximate_chunks']} output chunks (over "
                         "all ranks) hold an approximate value")
    return "\n".join(lines)


def _topology_lines(doc: Mapping[str, Any]) -> list[str]:
    """``topocc topo show`` as text: counts, bandwidth range (per direction), links by class, bounds."""
    lines = [f"{doc['topology']}: {doc['ranks']} ranks, {doc['hosts']} hosts, {doc['racks']} racks, "
             f"{doc['links']} directed links"]
    if doc.get("description"):
        lines.append(f"  {doc['description']}")
    lines.append("  devices: " + ", ".join(f"{n} {k}" for k, n in doc["devices"].items()))
    lines.append(f"  link bandwidth: {format_bandwidth(doc['min_link_bandwidth_GBps'] * 1e9)} .. "
                 f"{format_bandwidth(doc['max_link_bandwidth_GBps'] * 1e9)} per direction "
                 "(a full-duplex link carries its figure each way at once)")
    if doc.get("link_classes"):
        classes = [(name, c["links"], format_bandwidth(c["min_link_bandwidth_GBps"] * 1e9),
                    format_bandwidth(c["max_link_bandwidth_GBps"] * 1e9), format_time(c["latency_s"]), c["link"])
                   for name, c in doc["link_classes"].items()]
        lines.append("  links by class, narrowest first (bandwidth per direction):")
        lines.append(indent(format_table(classes, ("class", "links", "narrowest", "widest", "its latency",
                                                   "narrowest link"), "<>>>><"), "    "))
    lines.append(f"  routing: {doc['routing']}")
    for coll, cut in doc["bounds"].items():
        lines.append(f"  cut bound ({coll}, {format_size(cut['size_bytes'])}): {format_time(cut['lower_bound_s'])}"
                     f" = at most {format_bandwidth(cut['max_algbw_GBps'] * 1e9)} algbw; "
                     f"tightest cut: {cut['bound_cut']}")
    lines.append(f"  fingerprint: {doc['fingerprint'][:16]}")
    if doc.get("html"):
        lines.append(f"  wrote {doc['html']}")
    return lines


def format_algorithms(rows: Iterable[Mapping[str, Any]]) -> str:
    return format_table([(r["algorithm"], ", ".join(r["collectives"]), r["summary"]) for r in rows],
                        ("algorithm", "collectives", "what"))
