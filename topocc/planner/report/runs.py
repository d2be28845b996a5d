"""Measured runs beside the simulator: what ``topocc run`` and ``topocc bench`` print and return.

A run's rows come from the runtime's launcher (:mod:`topocc.runtime.harness.launch`); each size is shown with the
simulator's prediction for it, from the topology the schedule was compiled for (or another, as a what-if).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topocc.planner.analysis.simulate import simulate
from topocc.planner.errors import TopoccError
from topocc.planner.report.summary import model_note, what_if_note
from topocc.planner.report.table import RATIO, format_table, opt_cell
from topocc.planner.topology.catalogue import schedule_topology
from topocc.planner.units import format_bandwidth, format_size, format_time
from topocc.runtime.bandwidth import bus_factor
from topocc.runtime.collective import collective as describe
from topocc.runtime.errors import WrongResultError
from topocc.runtime.harness.launch import BenchRow, RunResult
from topocc.runtime.plan import Plan, as_plan
from topocc.runtime.schedule import Schedule

__all__ = [
    "BENCH_COLUMNS",
    "Predictions",
    "bench_progress",
    "bench_rows",
    "bench_verdict",
    "format_bench",
    "format_run",
    "predicted_times",
    "run_summary",
    "wrong_result",
]


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
    plan = as_plan(source)
    try:
        topo = schedule_topology(plan.schedules[0], schedule_path, topology, what_if=what_if)
    except TopoccError as exc:
        if topology:
            raise
        return Predictions([None for _ in sizes], note=f"no prediction: {exc.one_line()}")
    what_if_text = what_if_note(plan.schedules[0], topo)
    model = f"model: {model_note(topo)}"
    note = model if what_if_text is None else f"{what_if_text}; {model}"
    return Predictions([simulate(topo, plan.select(size), size).time_s for size in sizes], what_if_text is not None,
                       note)


#: ``topocc bench``'s columns: nccl-tests' (size ... #wrong), then the error, MPI's own collective, their ratio
#: and the simulator with its error; each with the name its value has in ``--json`` (docs/json.md).
BENCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("size", "size_bytes"), ("count", "count"), ("type", "type"), ("redop", "redop"), ("time", "time_s"),
    ("algbw", "algbw_GBps"), ("busbw", "busbw_GBps"), ("#wrong", "wrong"), ("max_error", "max_error"),
    ("native_time", "native_time_s"), ("ratio", "ratio"), ("predicted_time", "predicted_time_s"),
    ("error", "error"), ("algorithm", "algorithm"),
)


def bench_rows(rows: Sequence[BenchRow], predictions: Predictions) -> list[dict[str, Any]]:
    """``topocc bench --json``: each measured row with the simulator's prediction for its size."""
    return [r.to_json() | {"predicted_time_s": p, "what_if": predictions.what_if,
                           "error": p / r.time_s - 1 if p is not None and r.time_s > 0 else None}
            for r, p in zip(rows, predictions.times)]


def format_bench_row(row: Mapping[str, Any]) -> list[str]:
    """One :func:`bench_rows` row as the cells of :data:`BENCH_COLUMNS`, in human units."""
    return [format_size(row["size_bytes"]), str(row["count"]), row["type"], row["redop"], format_time(row["time_s"]),
            format_bandwidth(row["algbw_GBps"] * 1e9), format_bandwidth(row["busbw_GBps"] * 1e9), str(row["wrong"]),
            f"{row['max_error']:.3g}", opt_cell(row["native_time_s"], format_time),
            opt_cell(row["ratio"], RATIO.format), opt_cell(row["predicted_time_s"], format_time),
            opt_cell(row.get("error"), "{:+.1%}".format), row["algorithm"]]


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
    """A ``progress`` callback for :func:`~topocc.runtime.harness.launch.bench_schedule`: one line per size as it
    ends."""
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
    doc = {"collective": result.collective, "ranks": result.ranks,
           "result": "PASS" if result.passed else "FAIL", **result.rows[0].to_json()}
    if result.requested_size is not None:
        doc["requested_size_bytes"] = result.requested_size
    return doc


def format_run(doc: Mapping[str, Any], warmup: int) -> str:
    """:func:`run_summary` as text: the verdict first, then wrong elements, time and bandwidths."""
    head = (f"{doc['collective']} of {format_size(doc['size_bytes'])} ({doc['count']} x {doc['type']}, "
            f"{doc['redop']}) with {doc['algorithm']} on {doc['ranks']} ranks: {doc['result']}")
    rounded = doc.get("requested_size_bytes")
    per_rank = f" for each of {doc['ranks']} ranks" if describe(doc["collective"]).split else ""
    note = ([f"  size:           {doc['size_bytes']} bytes, the {rounded} asked rounded down to whole "
             f"{doc['type']} elements" + per_rank]
            if rounded is not None else [])
    return "\n".join([
        head,
        *note,
        f"  wrong elements: {doc['wrong']} (beyond {doc['type']}'s rounding tolerance; max error "
        f"{doc['max_error']:.3g})",
        f"  time:           {format_time(doc['time_s'])} (slowest rank's mean of {doc['iters']} calls after "
        f"{warmup} warm-up)",
        f"  algbw / busbw:  {format_bandwidth(doc['algbw_GBps'] * 1e9)} / {format_bandwidth(doc['busbw_GBps'] * 1e9)}",
    ])
