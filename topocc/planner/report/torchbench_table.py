"""What ``topocc torchbench`` prints and writes: nccl-tests' table, one column group per backend, and its footer.

The columns are nccl-tests' (``size count type redop root``, then ``time algbw busbw #wrong`` per group) in
its number formats, so a script that reads nccl-tests' output reads this; its two groups (out-of-place,
in-place) become one group per backend, each in torch's call form (``all_reduce``, ``broadcast`` and
``reduce`` work in place, the others out of place).  The footer has nccl-tests' two lines (out-of-bounds
values, average bus bandwidth, here per backend) and the topocc backend's calls: how many ran a plan and
how many went to the native backend, and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from topocc.planner.units import format_size
from topocc.runtime.collective import collective as describe
from topocc.runtime.errors import WrongResultError
from topocc.runtime.harness.torchbench.sweep import Sweep
from topocc.runtime.harness.torchbench.torchrun import Row, TorchbenchResult

__all__ = ["format_torchbench", "torchbench_json", "torchbench_progress", "torchbench_wrong"]

#: The torch call that runs each collective: in place (one tensor in and out) where no buffer is split, else
#: into an output tensor of its own.
TORCH_CALLS = {"allreduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
               "allgather": "all_gather_into_tensor", "reducescatter": "reduce_scatter_tensor",
               "alltoall": "all_to_all_single"}


def _formula(name: str) -> str:
    """nccl-tests' busbw / algbw for the collective, as a formula (its value is :func:`bus_factor`'s)."""
    desc = describe(name)
    return "1" if desc.rooted else "2(n-1)/n" if desc.passes == 2 else "(n-1)/n"


def _left(size: object, count: object, kind: object, redop: object, root: object) -> str:
    """The columns left of the groups, nccl-tests' widths (a header line starts with ``#`` in the first)."""
    return f"{size:>12}  {count:>12}  {kind:>8}  {redop:>6}  {root:>6}"


def _group(time: object, algbw: object, busbw: object, wrong: object) -> str:
    """One backend's columns, nccl-tests' widths."""
    return f"  {time:>7}  {algbw:>6}  {busbw:>6}  {wrong:>6}"


def _time_us(seconds: float) -> str:
    """nccl-tests' time cell: microseconds, fewer decimals as they grow, 7 wide."""
    us = seconds * 1e6
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def _header(result: TorchbenchResult) -> list[str]:
    sweep = result.sweep
    backends = sweep.backends
    form, other = ("out-of-place", "in-place") if describe(sweep.collective).split else ("in-place", "out-of-place")
    lines = [f"# topocc torchbench: {sweep.collective} on {sweep.ranks} ranks (torchrun --standalone), "
             f"{sweep.datatype.nccl} on {sweep.device}" + (" (nccl on cuda)" if "nccl" in backends else ""),
             f"# time: the slowest rank's mean of {sweep.iters} calls after {sweep.warmup} warm-up; busbw = algbw x "
             f"{result.factor:.4g} (nccl-tests' {_formula(sweep.collective)}); #wrong: elements, over all ranks, "
             "that differ from the exact result of one checked call",
             f"# one column group per backend, in torch's call form: {TORCH_CALLS[sweep.collective]} is {form} "
             f"(nccl-tests' {form} group; its {other} one is not measured)"]
    if result.bundle is not None:
        lines.append(f"# topocc's plans: {result.bundle}"
                     + ("; every size runs the plan (--force-plans)" if result.forced else ""))
    width = len(_group("", "", "", ""))
    lines += ["#",
              ("#" + _left("", "", "", "", "")[1:] + "".join(f"{b:^{width}}" for b in backends)).rstrip(),
              "#" + _left("size", "count", "type", "redop", "root")[1:]
              + "".join(_group("time", "algbw", "busbw", "#wrong") for _ in backends),
              ("#" + _left("(B)", "(elements)", "", "", "")[1:]
               + "".join(_group("(us)", "(GB/s)", "(GB/s)", "") for _ in backends)).rstrip()]
    return lines


def _rows_by_size(result: TorchbenchResult) -> list[tuple[int, int, dict[str, Row]]]:
    """The rows of each size (in sweep order): size, count, and the row of each backend."""
    table: dict[int, tuple[int, dict[str, Row]]] = {}
    for row in result.rows:
        table.setdefault(row.size, (row.count, {}))[1][row.backend] = row
    return [(size, count, rows) for size, (count, rows) in table.items()]


def _average_busbw(result: TorchbenchResult, backend: str) -> float:
    rows = [r for r in result.rows if r.backend == backend]
    return sum(r.algbw for r in rows) * result.factor / len(rows) if rows else 0.0


def _calls_line(result: TorchbenchResult) -> str | None:
    """The topocc backend's calls of the sweep: planned and native, at which sizes, and the first reason."""
    rows = [r for r in result.rows if r.backend == "topocc"]
    if not rows:
        return None
    planned = sum(r.planned or 0 for r in rows)
    native = sum(r.native or 0 for r in rows)
    sizes = [r.size for r in rows if r.planned]
    where = ("" if not sizes else " (at every size)" if len(sizes) == len(rows)
             else f" (at {len(sizes)} of {len(rows)} sizes: {', '.join(format_size(s) for s in sizes)})")
    tally = (result.counters or {}).get(result.sweep.collective, {})
    why = f" ({tally['why']})" if native and tally.get("why") else ""
    fallback = "gloo" if result.sweep.device == "cpu" else "nccl"
    return (f"# topocc calls        : {planned} of {planned + native} ran a plan{where}, {native} went to "
            f"{fallback}{why}")


def format_torchbench(result: TorchbenchResult) -> str:
    """nccl-tests' table of ``result``, with its header and footer."""
    sweep = result.sweep
    lines = _header(result)
    for size, count, rows in _rows_by_size(result):
        cells = _left(size, count, sweep.datatype.nccl, sweep.redop, sweep.shown_root)
        for backend in sweep.backends:
            row = rows[backend]
            cells += _group(_time_us(row.time_s), f"{row.algbw:.2f}", f"{row.algbw * result.factor:.2f}", row.wrong)
        lines.append(cells)
    wrong = sum(r.wrong for r in result.rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
    lines.append("# Avg bus bandwidth    : "
                 + "  ".join(f"{b} {_average_busbw(result, b):.4g}" for b in sweep.backends) + " (GB/s)")
    calls = _calls_line(result)
    if calls is not None:
        lines.append(calls)
    return "\n".join(lines)


def torchbench_json(result: TorchbenchResult) -> dict[str, Any]:
    """What ``--json PATH`` writes: the sweep, a row per size and backend, and each backend's summary."""
    sweep = result.sweep
    root = sweep.root if sweep.shown_root >= 0 else None
    rows = [{"backend": r.backend, "size_bytes": r.size, "count": r.count, "type": sweep.dtype, "redop": sweep.redop,
             "root": root, "time_s": r.time_s, "algbw_GBps": r.algbw, "busbw_GBps": r.algbw * result.factor,
             "wrong": r.wrong, "planned": r.planned, "native": r.native} for r in result.rows]
    tally = (result.counters or {}).get(sweep.collective, {})
    backends = [{"backend": b, "avg_busbw_GBps": _average_busbw(result, b),
                 "wrong": sum(r.wrong for r in result.rows if r.backend == b),
                 "planned": sum(r.planned or 0 for r in result.rows if r.backend == b) if b == "topocc" else None,
                 "native": sum(r.native or 0 for r in result.rows if r.backend == b) if b == "topocc" else None,
                 "why_native": (tally.get("why") or None) if b == "topocc" else None}
                for b in sweep.backends]
    return {"collective": sweep.collective, "ranks": sweep.ranks, "type": sweep.dtype, "redop": sweep.redop,
            "root": root, "iters": sweep.iters, "warmup": sweep.warmup, "device": sweep.device,
            "bundle": result.bundle, "force_plans": result.forced, "rows": rows, "backends": backends}


def torchbench_wrong(result: TorchbenchResult) -> WrongResultError | None:
    """The error of a sweep with wrong elements (exit 7, after the table), naming the backends and sizes."""
    bad: Sequence[Row] = [r for r in result.rows if r.wrong]
    if not bad:
        return None
    places = ", ".join(f"{r.backend} at {format_size(r.size)}" for r in bad)
    return WrongResultError(f"{sum(r.wrong for r in bad)} element(s) differ from the exact result: {places}",
                            fix="a wrong topocc result is a bug of its runtime or plan: rerun with "
                                "TOPOCC_DEBUG=INFO to see which plan ran each call")


def torchbench_progress(echo: Callable[[str], None], sweep: Sweep) -> Callable[[Row], None]:
    """A ``progress`` callback for the sweep: one line per size and backend as it is measured."""
    total = len(sweep.sizes) * len(sweep.backends)
    done: list[Row] = []

    def report(row: Row) -> None:
        done.append(row)
        echo(f"torchbench: {row.backend} at {format_size(row.size)} ({len(done)}/{total}): "
             f"{row.time_s * 1e6:.1f} us, {row.wrong} wrong")

    return report
