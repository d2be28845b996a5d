"""Plain summaries of topologies, compilations and simulations: dicts for ``--json``, text tables for people.

Both views come from the same dict so the terminal and scripts never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.analysis.bounds import Bound, lower_bound
from topocc.planner.compiler.compile import Compiled
from topocc.planner.analysis.simulate import SimResult, simulate
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology, describe
from topocc.planner.units import format_bandwidth, format_size, format_time
from topocc.planner.analysis.verify import VerifyReport
from topocc.runtime.errors import WrongResultError
from topocc.runtime.launch import BenchRow, RunResult, bus_factor
from topocc.runtime.plan import Plan, as_plan
from topocc.runtime.schedule import Schedule

__all__ = [
    "BENCH_COLUMNS",
    "RATIO",
    "Predictions",
    "algorithms_table",
    "bench_progress",
    "bench_rows",
    "bench_verdict",
    "compiled_summary",
    "format_bench",
    "format_plan",
    "format_run",
    "format_summary",
    "format_table",
    "inspect_schedule",
    "opt_cell",
    "plan_summary",
    "predicted_times",
    "run_summary",
    "simulation_summary",
    "topology_summary",
    "verify_summary",
    "wrong_result",
]


def format_table(rows: Sequence[Sequence[Any]], header: Sequence[str], align: str = "") -> str:
    """A text table; ``align`` has one ``<`` (left, the default) or ``>`` (right) per column."""
    cells = [[str(h) for h in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    sides = align.ljust(len(header), "<")
    lines = ["  ".join(c.rjust(w) if side == ">" else c.ljust(w) for c, w, side in zip(row, widths, sides)).rstrip()
             for row in cells]
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
         _pct(b["percent_of_bound"]), format_bandwidth(b["algbw_GBps"] * 1e9))
        for b in doc["buckets"]
    ]
    text = (f"plan for {doc['collective']} on {doc['topology']} ({doc['ranks']} ranks): {len(rows)} buckets\n"
            + _indent(format_table(rows, ("from", "to", "algorithm", "tuned at", "predicted", "of bound",
                                          "algbw"))))
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
        **_what_if(schedule, topology),
        **_timing(sim, bound),
        "link_utilisation": {f"{a} -> {b}": round(u, 4) for (a, b), u in sorted(sim.link_utilisation.items())},
    }
    if trace:
        from topocc.planner.formats.chrome_trace import simulated_trace
        from topocc.runtime.trace import write_trace

        write_trace(trace, simulated_trace(topology, schedule, sim))
        doc["trace"] = trace
    if candidates:
        from topocc.planner.compiler.options import Options
        from topocc.planner.compiler.compile import compile_schedule

        race = compile_schedule(topology, schedule.collective, "auto",
                                Options(size_bytes=size_bytes, root=schedule.root or 0))
        doc["candidates"] = compiled_summary(race)["candidates"]
        doc["winner"] = race.schedule.metadata.algorithm
    return doc


def _what_if(schedule: Schedule, topology: Topology) -> dict[str, Any]:
    """Whether a schedule is timed on a topology other than its own (``--what-if``), and which it was compiled for."""
    from topocc.planner.topology.catalogue import compiled_for

    return {"what_if": not compiled_for(schedule, topology), "compiled_for": schedule.metadata.topology}


def _what_if_note(schedule: Schedule, topology: Topology) -> str | None:
    """:func:`what_if_line` for a schedule timed on ``topology``."""
    return what_if_line(_what_if(schedule, topology) | {"topology": topology.name})


def what_if_line(doc: Mapping[str, Any]) -> str | None:
    """The warning a what-if result carries in text: compiled for one topology, timed on another."""
    if not doc.get("what_if"):
        return None
    return (f"what-if: a schedule compiled for {doc.get('compiled_for') or 'another topology'}, "
            f"timed on {doc['topology']} (--what-if)")


#: A baseline with more operations than this is not simulated for the report; its busiest link's time is shown.
BASELINE_SIMULATE_OPS = 200_000


def _baseline(topology: Topology, schedule: Schedule, name: str, size: int) -> SimResult | str | None:
    """Another algorithm's plan for the report's comparison: its simulation, a sentence why not, or None.

    Baselines are built and simulated, not verified (only compared; every
    algorithm's schedules are verified by its tests and by ``compile``).  An
    algorithm is not built above the rank count where ``auto`` skips it
    (:attr:`Algorithm.auto_max_ranks`: a ring over 1024 ranks is 4.7 million
    operations, minutes to build and simulate), and a schedule of more than
    :data:`BASELINE_SIMULATE_OPS` operations is timed by its busiest link alone,
    a lower bound of its simulated time (:func:`topocc.planner.compiler.compile.link_time`).
    None: the algorithm does not apply here.
    """
    from topocc.planner.compiler.options import Options
    from topocc.planner.compiler.algorithms import get_algorithm
    from topocc.planner.compiler.evaluate import link_time
    from topocc.planner.errors import TopoccError

    try:
        algorithm = get_algorithm(name)
        if schedule.collective not in algorithm.collectives:
            return None
        if algorithm.auto_max_ranks is not None and topology.size > algorithm.auto_max_ranks:
            return (f"not compared: above {algorithm.auto_max_ranks} ranks it takes minutes to build "
                    "(auto skips it too)")
        net = Network(topology)
        other = algorithm.load()(net, schedule.collective, Options(size_bytes=size, root=schedule.root or 0))
        if other.op_count > BASELINE_SIMULATE_OPS:
            bound = link_time(net, other, size)
            return (f"not simulated ({other.op_count:,} operations): its busiest link alone needs "
                    f"{format_time(bound)}")
        return simulate(net, other, size)
    except TopoccError:
        return None  # a baseline that does not apply here is simply not compared


def inspect_schedule(path: str, topology: str | None = None, size_bytes: int | None = None, *,
                     html: str | None = None, dot: str | None = None, baselines: Sequence[str] = (),
                     what_if: bool = False) -> str:
    """``topocc inspect``: write the HTML report and/or DOT drawing, or return the terminal view.

    ``what_if`` allows a topology other than the schedule's (see
    :func:`~topocc.planner.compiler.compile.schedule_topology`); the text then starts with a
    line that says so.  The plan is simulated once, keeping one row of numbers
    per message (:func:`topocc.planner.report._run.record_run`), which every view
    aggregates; ``baselines`` are compared as :func:`_baseline` says.
    """
    from pathlib import Path

    from topocc.planner.topology.catalogue import schedule_topology
    from topocc.planner.report import render_dot, render_html, terminal_summary
    from topocc.planner.report._run import record_run
    from topocc.runtime.plan import load_any

    plan = as_plan(load_any(path))
    size = size_bytes or plan.schedules[0].metadata.size_bytes or (64 << 20)
    schedule = plan.select(size)
    topo = schedule_topology(schedule, path, topology, what_if=what_if)
    warning = _what_if_note(schedule, topo)
    head = f"{warning}\n" if warning else ""
    run = record_run(topo, schedule, size)
    if not html and not dot:
        return head + terminal_summary(topo, schedule, run)
    written = []
    if html:
        compared: dict[str, SimResult | str] = {}
        for name in baselines:
            if name != schedule.metadata.algorithm:
                found = _baseline(topo, schedule, name, size)
                if found is not None:
                    compared[name] = found
        Path(html).write_text(render_html(topo, schedule, size, baselines=compared, run=run))
        written.append(html)
    if dot:
        Path(dot).write_text(render_dot(topo, schedule, size_bytes=size, result=run.result))
        written.append(dot)
    return head + "wrote " + ", ".join(written)


@dataclass(frozen=True, slots=True)
class Predictions:
    """The simulator's time per benchmarked size, whether it is a what-if, and a note for the reader."""

    times: list[float | None]
    what_if: bool = False
    note: str | None = None


def predicted_times(source: Schedule | Plan, sizes: Sequence[int], schedule_path: str | None = None,
                    topology: str | None = None, *, what_if: bool = False) -> Predictions:
    """The simulator's prediction per size for a schedule or plan.

    With ``topology`` given, its errors (and a fingerprint mismatch without
    ``what_if``) are raised; without, a schedule whose own topology cannot be
    found gets no predictions (None) and a note that says why.
    """
    from topocc.planner.topology.catalogue import schedule_topology
    from topocc.planner.errors import TopoccError

    plan = as_plan(source)
    try:
        topo = schedule_topology(plan.schedules[0], schedule_path, topology, what_if=what_if)
    except TopoccError as exc:
        if topology:
            raise
        return Predictions([None for _ in sizes], note=f"no prediction: {exc.one_line()}")
    note = _what_if_note(plan.schedules[0], topo)
    return Predictions([simulate(topo, plan.select(size), size).time_s for size in sizes], note is not None, note)


#: How a ratio of two times prints in tables.
RATIO = "{:.2f}"


def opt_cell(value: float | None, fmt: Callable[[float], str]) -> str:
    """A table cell for a value that may be missing: ``fmt(value)``, or ``n/a``."""
    return fmt(value) if value else "n/a"


#: ``topocc bench``'s columns: nccl-tests' (size ... #wrong), then the error, MPI's own collective, their ratio
#: and the simulator; each with the name its value has in ``--json`` (docs/json.md).
BENCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("size", "size_bytes"), ("count", "count"), ("type", "type"), ("redop", "redop"), ("time", "time_s"),
    ("algbw", "algbw_GBps"), ("busbw", "busbw_GBps"), ("#wrong", "wrong"), ("max_error", "max_error"),
    ("native_time", "native_time_s"), ("ratio", "ratio"), ("predicted_time", "predicted_time_s"),
    ("algorithm", "algorithm"),
)


def bench_rows(rows: Sequence[BenchRow], predictions: Predictions) -> list[dict[str, Any]]:
    """``topocc bench --json``: each measured row with the simulator's prediction for its size."""
    return [r.to_json() | {"predicted_time_s": p, "what_if": predictions.what_if}
            for r, p in zip(rows, predictions.times)]


def format_bench_row(row: Mapping[str, Any]) -> list[str]:
    """One :func:`bench_rows` row as the cells of :data:`BENCH_COLUMNS`, in human units."""
    return [format_size(row["size_bytes"]), str(row["count"]), row["type"], row["redop"], format_time(row["time_s"]),
            format_bandwidth(row["algbw_GBps"] * 1e9), format_bandwidth(row["busbw_GBps"] * 1e9), str(row["wrong"]),
            f"{row['max_error']:.3g}", opt_cell(row["native_time_s"], format_time),
            opt_cell(row["ratio"], RATIO.format), opt_cell(row["predicted_time_s"], format_time), row["algorithm"]]


def format_bench(doc: Sequence[Mapping[str, Any]], collective: str, ranks: int, predictions: Predictions,
                 *, iters: int, warmup: int) -> str:
    """The nccl-tests table of ``topocc bench``, with the verdict: PASS when no element of any size is wrong."""
    factor = bus_factor(collective, ranks)
    lines = [f"# {collective} on {ranks} ranks; time: slowest rank's mean of {iters} calls after {warmup} warm-up; "
             f"busbw = algbw x {factor:.3g}; ratio = time / native_time (MPI's own {collective})"]
    if predictions.note:
        lines.append(f"# {predictions.note}")
    header = [h for h, _ in BENCH_COLUMNS]
    lines.append(format_table([format_bench_row(r) for r in doc], header, ">" * (len(header) - 1) + "<"))
    lines.append(f"# {bench_verdict(doc)}")
    return "\n".join(lines)


def bench_verdict(doc: Sequence[Mapping[str, Any]]) -> str:
    """``PASS``, or ``FAIL`` with the wrong elements and the sizes they are in."""
    failed = [r for r in doc if r["wrong"]]
    if not failed:
        return f"PASS: no wrong element at {len(doc)} size{'s' if len(doc) > 1 else ''}"
    wrong = sum(r["wrong"] for r in failed)
    return (f"FAIL: {wrong} element{'s' if wrong > 1 else ''} differ from numpy's result by more than the "
            f"dtype's tolerance at {', '.join(format_size(r['size_bytes']) for r in failed)} "
            f"(max error {max(r['max_error'] for r in failed):.3g})")


def bench_progress(echo: Callable[[str], None], sizes: int, ranks: int) -> Callable[[BenchRow], None]:
    """A ``progress`` callback for :func:`~topocc.runtime.launch.bench_schedule`: one line per size as it ends."""
    echo(f"bench: {sizes} sizes on {ranks} ranks")
    done: list[BenchRow] = []

    def report(row: BenchRow) -> None:
        done.append(row)
        echo(f"bench: {format_size(row.size)} done ({len(done)}/{sizes}): {format_time(row.time_s)}, "
             f"{row.wrong} wrong")

    return report


def wrong_result(rows: Sequence[Mapping[str, Any]], path: str) -> WrongResultError:
    """The error of a run or bench whose results are wrong (exit 7), after the table has been printed."""
    return WrongResultError(bench_verdict(rows), where=path,
                            fix=f"prove the schedule with topocc verify {path}; a proved schedule that fails here "
                                "is a runtime bug")


def run_summary(result: RunResult) -> dict[str, Any]:
    """What ``topocc run`` reports: PASS or FAIL, the time and the bandwidths of the one case."""
    return {"collective": result.collective, "ranks": result.ranks,
            "result": "PASS" if result.passed else "FAIL", **result.rows[0].to_json()}


def format_run(doc: Mapping[str, Any], warmup: int) -> str:
    """:func:`run_summary` as text: the verdict first, then wrong elements, time and bandwidths."""
    head = (f"{doc['collective']} of {format_size(doc['size_bytes'])} ({doc['count']} x {doc['type']}, "
            f"{doc['redop']}) with {doc['algorithm']} on {doc['ranks']} ranks: {doc['result']}")
    return "\n".join([
        head,
        f"  wrong elements: {doc['wrong']} (beyond {doc['type']}'s rounding tolerance; max error "
        f"{doc['max_error']:.3g})",
        f"  time:           {format_time(doc['time_s'])} (slowest rank's mean of {doc['iters']} calls after "
        f"{warmup} warm-up)",
        f"  algbw / busbw:  {format_bandwidth(doc['algbw_GBps'] * 1e9)} / {format_bandwidth(doc['busbw_GBps'] * 1e9)}",
    ])


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
    """What ``topocc topo show`` reports, including the lower bound of allreduce and allgather."""
    described = dict(describe(topology))
    out = {"topology": described.pop("name"), **described}
    bounds = {}
    for collective in ("allreduce", "allgather"):
        bound = lower_bound(topology, collective, size_bytes)
        bounds[collective] = {
            "size_bytes": size_bytes,
            "lower_bound_s": bound.time_s,
            "max_algbw_GBps": size_bytes / bound.time_s / 1e9 if bound.time_s > 0 else None,
            "bound_cut": bound.cut,
        }
    out["bounds"] = bounds
    return out


def algorithms_table() -> list[dict[str, Any]]:
    """What ``topocc algorithms`` lists: each algorithm, the collectives it implements, its idea."""
    return [{"algorithm": a.name, "collectives": list(a.collectives), "summary": a.summary}
            for a in ALGORITHMS.values()]


def _pct(value: float) -> str:
    return f"{value:.1f}%"


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
        lines.append(f"  of bound:       {_pct(doc['percent_of_bound'])}")
        lines.append(f"  algbw / busbw:  {format_bandwidth(doc['algbw_GBps'] * 1e9)} / "
                     f"{format_bandwidth(doc['busbw_GBps'] * 1e9)}")
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
    elif "bounds" in doc:
        lines.append(f"{doc['topology']}: {doc['ranks']} ranks, {doc['hosts']} hosts, {doc['racks']} racks, "
                     f"{doc['links']} directed links")
        if doc.get("description"):
            lines.append(f"  {doc['description']}")
        lines.append("  devices: " + ", ".join(f"{n} {k}" for k, n in doc["devices"].items()))
        lines.append(f"  link bandwidth: {format_bandwidth(doc['min_link_bandwidth_GBps'] * 1e9)} .. "
                     f"{format_bandwidth(doc['max_link_bandwidth_GBps'] * 1e9)}")
        lines.append(f"  routing: {doc['routing']}")
        for coll, cut in doc["bounds"].items():
            lines.append(f"  cut bound ({coll}, {format_size(cut['size_bytes'])}): {format_time(cut['lower_bound_s'])}"
                         f" = at most {format_bandwidth(cut['max_algbw_GBps'] * 1e9)} algbw; "
                         f"tightest cut: {cut['bound_cut']}")
        lines.append(f"  fingerprint: {doc['fingerprint'][:16]}")
    elif "verified" in doc:
        lines.append(f"verified: {doc['collective']} ({doc['algorithm']}) on {doc['ranks']} ranks, "
                     f"{doc['operations']} operations, {doc['messages']} messages")
    return "\n".join(lines)


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def format_algorithms(rows: Iterable[Mapping[str, Any]]) -> str:
    return format_table([(r["algorithm"], ", ".join(r["collectives"]), r["summary"]) for r in rows],
                        ("algorithm", "collectives", "what"))
