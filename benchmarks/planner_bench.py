"""Planner benchmark: schedule quality and compile time on the shipped topologies and the fabric suite.

Default: for every shipped topology and size, each algorithm's predicted time,
its percentage of the lower bound and its compile time (build + verify +
simulate); an algorithm above the rank count where ``auto`` skips it
(``Algorithm.auto_max_ranks``: minutes per compile there) is listed as skipped.
Then the compile time and peak memory of ``auto`` as the cluster grows.

``--suite`` measures the planner's yardstick: every fabric of
:mod:`benchmarks.fabrics` and every shipped topology, for all-gather,
reduce-scatter and all-reduce at 1 MiB and 256 MiB.  Per fabric, a table of
``auto``'s pick, its share of the lower bound and its compile time (loading
the YAML, the race and the proof), and each algorithm's share from the race
(``<=`` for one skipped as unable to win: the bound its busiest link allows)
or its one-line reason; then every compile against the targets of
:mod:`benchmarks.targets`, and a roll-up per family.  Interrupted (Ctrl-C), it
still prints the summary of what it measured.

Run: ``python benchmarks/planner_bench.py [--quick] [--topologies a,b] [--routing spray]
[--scale 16,128,1024,4096] [--scale-size 256MiB]``, or
``python benchmarks/planner_bench.py --suite [--quick] [--topologies a,b] [--collective allgather]
[--sizes 1MiB,256MiB] [--limit 600]``.

``--anchors`` measures the cases where a published plan led topocc's (:data:`targets.ANCHORS`): ``auto``'s
pick, its share of the bound against the anchor's target, its algbw beside the published one, and the compile
time; then each anchor's race.  Run: ``python benchmarks/planner_bench.py --anchors [--limit 600]``.

``--routing MODE`` times every shipped topology (and the scale table's fat-trees) under that routing instead of
its own (``spray`` gives the figures of topocc before routing was modelled).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as a script: the repository's modules
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fabrics import Fabric, shipped_fabrics, small_suite, suite
from benchmarks.targets import ANCHORS, LARGE_BYTES, SMALL_BYTES, Anchor, Measured, Verdict, judge
from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.collectives import canonical_collective
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.race import Candidate
from topocc.planner.errors import TopoccError
from topocc.planner.report.table import format_table
from topocc.planner.topology.catalogue import SCHEDULED_MAX_RANKS, resolve_topology, scheduled_topologies
from topocc.planner.topology.parse import parse_topology_text
from topocc.planner.units import UnitError, format_size, format_time, parse_size

SIZES = (64 << 10, 1 << 20, 64 << 20, 1 << 30)
SUITE_COLLECTIVES = ("allgather", "reducescatter", "allreduce")
SUITE_SIZES = (SMALL_BYTES, LARGE_BYTES)


def quality_rows(names: list[str], sizes: tuple[int, ...], collective: str,
                 routing: str | None = None) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for name in names:
        topology = resolve_topology(name)
        topology = topology.with_routing(routing) if routing else topology
        for size in sizes:
            bound = lower_bound(topology, collective, size).time_s
            label = f"{name} ({topology.routing})"
            for algorithm in [*(a.name for a in ALGORITHMS.values() if collective in a.collectives), "auto"]:
                if topology.size > 256 and algorithm in ("direct", "tree", "ring", "halving-doubling"):
                    continue  # flat algorithms on 1024 ranks: millions of operations; see the scale table
                limit = ALGORITHMS[algorithm].auto_max_ranks if algorithm in ALGORITHMS else None
                if limit is not None and topology.size > limit:  # as auto does: minutes per compile there
                    rows.append((label, format_size(size), algorithm, "-", "-", "-", f"skipped above {limit} ranks"))
                    continue
                started = time.perf_counter()
                try:
                    compiled = compile_schedule(topology, collective, algorithm, Options(size_bytes=size))
                except TopoccError as exc:
                    rows.append((label, format_size(size), algorithm, "-", "-", "-", exc.message[:60]))
                    continue
                elapsed = time.perf_counter() - started
                chosen = compiled.schedule.metadata.algorithm if algorithm == "auto" else ""
                rows.append((label, format_size(size), algorithm, format_time(compiled.sim.time_s),
                             f"{100 * bound / compiled.sim.time_s:.1f}%", f"{elapsed:.2f}s", chosen))
            print(f"  done {name} {format_size(size)}", file=sys.stderr, flush=True)
    return rows


def fat_tree(hosts: int) -> str:
    """A fattree-1024-like cluster of ``hosts`` x 8 GPUs (at most 4 hosts per leaf), for the scale table."""
    shipped = (Path(__file__).resolve().parent.parent / "topologies" / "fattree-1024.yaml").read_text()
    return (shipped.replace("hosts: 128", f"hosts: {hosts}")
            .replace("hosts_per_leaf: 4 ", f"hosts_per_leaf: {min(4, hosts)} ")
            .replace("name: fattree-1024", f"name: fattree-{hosts * 8}"))


def scale_rows(gpu_counts: tuple[int, ...], size: int = 64 << 20, routing: str | None = None,
               ) -> list[tuple[object, ...]]:
    """Per cluster size: ``auto``'s pick, its compile's wall and CPU time and peak memory, and the winner's
    simulation alone (what ``topocc simulate`` and the HTML report pay), at ``size`` bytes, under ``routing``
    (default: the generated fat-tree's own)."""
    rows: list[tuple[object, ...]] = []
    for gpus in gpu_counts:
        started, cpu = time.perf_counter(), time.process_time()
        topology = parse_topology_text(fat_tree(gpus // 8), f"fattree-{gpus}")
        if routing is not None:
            topology = topology.with_routing(routing)
        loaded = time.perf_counter() - started
        compiled = compile_schedule(topology, "allreduce", "auto", Options(size_bytes=size))
        total, cpu = time.perf_counter() - started, time.process_time() - cpu
        # large schedules are proved in a forked child (topocc.planner.compiler.proof): both peaks count
        planner_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        proof_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        sim_cpu = time.process_time()
        simulate(topology, compiled.schedule, size)  # routes are cached by now, as in a second compile
        sim_cpu = time.process_time() - sim_cpu
        rows.append((gpus, compiled.schedule.metadata.algorithm, compiled.schedule.op_count, f"{loaded:.2f}s",
                     f"{total:.2f}s", f"{cpu:.2f}s", f"{sim_cpu:.2f}s", f"{planner_gib:.2f} + {proof_gib:.2f} GiB",
                     f"{100 * compiled.efficiency:.1f}%"))
        print(f"  done {gpus} GPUs", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- --suite


@dataclass(frozen=True, slots=True)
class Run:
    """One ``auto`` compile of the suite: the figures the tables need (not the schedule), or why it failed."""

    fabric: Fabric
    measured: Measured
    chose: str | None
    candidates: tuple[Candidate, ...]
    error: str | None = None


class _OverTime(Exception):
    """Raised in the main thread when a compile runs past ``--limit``."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`_OverTime` after ``seconds`` of wall time (no limit when None)."""
    if seconds is None:
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise _OverTime

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def measure(fabric: Fabric, collective: str, size: int, limit: float | None) -> Run:
    """``auto`` on a freshly loaded topology (so no routes are reused), timed from the YAML to the proof."""
    started = time.perf_counter()
    chose = error = None
    predicted = bound = None
    candidates: tuple[Candidate, ...] = ()
    timed_out = False
    try:
        with _deadline(limit):
            compiled = compile_schedule(fabric.topology(), collective, "auto", Options(size_bytes=size))
        chose, candidates = compiled.schedule.metadata.algorithm, compiled.candidates
        predicted, bound = compiled.sim.time_s, compiled.bound.time_s
    except _OverTime:
        timed_out, error = True, f"abandoned after --limit {limit:g} s"
    except TopoccError as exc:
        error = exc.one_line()
    except Exception as exc:  # one crashing algorithm must not end an hour-long run
        error = f"crashed: {type(exc).__name__}: {exc}"
    elapsed = time.perf_counter() - started
    return Run(fabric, Measured(fabric.ranks, fabric.switch_based, collective, size, elapsed, predicted, bound,
                                timed_out), chose, candidates, error)


def _share(bound: float, time_s: float) -> str:
    return f"{100 * bound / time_s:.1f}%"


def run_rows(run: Run) -> list[tuple[object, ...]]:
    """auto's row, then one per algorithm of its race: share of the bound, predicted time, or why not."""
    m = run.measured
    head = (m.collective, format_size(m.size_bytes))
    if m.predicted_s is None or m.bound_s is None:
        return [(*head, "auto", "-", "-", f"{m.compile_s:.1f}s", run.error)]
    rows: list[tuple[object, ...]] = [(*head, "auto", _share(m.bound_s, m.predicted_s), format_time(m.predicted_s),
                                       f"{m.compile_s:.1f}s", f"chose {run.chose}")]
    for c in run.candidates:
        if c.time_s is not None:
            figures = (_share(m.bound_s, c.time_s), format_time(c.time_s))
        elif c.link_time_s is not None:  # built, not simulated: its busiest link bounds its time from below
            figures = ("<=" + _share(m.bound_s, c.link_time_s), ">=" + format_time(c.link_time_s))
        else:
            figures = ("-", "-")
        rows.append((*head, c.algorithm, *figures, f"{c.compile_s:.1f}s", c.reason or ""))
    return rows


def select_fabrics(names: list[str] | None, quick: bool) -> list[Fabric]:
    """The fabrics to measure: those named, else the smallest of each family (quick) or all and the shipped."""
    full = suite()
    if names is None:
        if not quick:
            return [*full, *(f for f in shipped_fabrics() if f.ranks <= SCHEDULED_MAX_RANKS)]
        smallest: dict[str, Fabric] = {}
        for fabric in full:  # smallest first within each family
            smallest.setdefault(fabric.family, fabric)
        return list(smallest.values())
    known = {f.name: f for f in (*full, *small_suite(), *shipped_fabrics())}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"planner_bench: unknown fabric {unknown[0]!r} (fix: use one of {', '.join(known)})")
    return [known[n] for n in names]


def summary_rows(runs: list[Run]) -> list[tuple[object, ...]]:
    """One row per compile: auto's pick, and each target that applies (met, or missed by how much)."""
    rows: list[tuple[object, ...]] = []
    for run in runs:
        m = run.measured
        cells = {v.kind: f"{v.measured} ({v.goal}): {v.describe()}" for v in judge(m)}
        quality = cells.get("bandwidth") or cells.get("latency")
        if quality is None:  # no target at this size on this fabric: the figure still says where it stands
            quality = "-" if m.predicted_s is None or m.bound_s is None else (
                f"{_share(m.bound_s, m.predicted_s)} of bound, {m.predicted_s / m.bound_s:.2f}x (no target)")
        rows.append((run.fabric.name, run.fabric.family, m.ranks, m.collective, format_size(m.size_bytes),
                     run.chose or "none", quality, cells.get("compile", "-")))
    return rows


def family_rows(runs: list[Run]) -> list[tuple[object, ...]]:
    """Per family and kind of target: how many compiles meet it, and the worst miss."""
    groups: dict[tuple[str, str], list[tuple[Verdict, Run]]] = {}
    for run in runs:
        for v in judge(run.measured):
            groups.setdefault((run.fabric.family, v.kind), []).append((v, run))
    order = {kind: i for i, kind in enumerate(("bandwidth", "latency", "compile"))}
    families = list(dict.fromkeys(run.fabric.family for run in runs))
    rows: list[tuple[object, ...]] = []
    for (family, kind), verdicts in sorted(groups.items(), key=lambda g: (families.index(g[0][0]), order[g[0][1]])):
        met = sum(v.met for v, _ in verdicts)
        worst, run = max(verdicts, key=lambda item: item[0].shortfall)
        where = f"{run.fabric.name} {run.measured.collective} {format_size(run.measured.size_bytes)}"
        goals = " / ".join(dict.fromkeys(v.goal for v, _ in verdicts))  # bandwidth: 97% or 95% by collective
        rows.append((family, kind, goals, f"{met}/{len(verdicts)}",
                     "-" if worst.met else f"{where}: {worst.measured}, {worst.describe()}"))
    return rows


def machine_line() -> str:
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"machine: {cores} CPU cores ({usable} usable by this process), load average {load} (1 / 5 / 15 min)"


def run_suite(fabrics: list[Fabric], collectives: tuple[str, ...], sizes: tuple[int, ...],
              limit: float | None) -> None:
    """Measure every fabric, printing its table as soon as it is done, then the summary tables (also after an
    interrupt, for the compiles measured by then)."""
    print(f"planner suite: {len(fabrics)} fabrics x {', '.join(collectives)} x "
          f"{', '.join(format_size(s) for s in sizes)}")
    print(machine_line())
    print("compile times (YAML to proof, one process) are meaningful only on an idle machine; the targets "
          "assume 2 idle cores\n", flush=True)
    runs: list[Run] = []
    total = len(fabrics) * len(collectives) * len(sizes)
    clock = time.perf_counter()
    try:
        for fabric in fabrics:
            rows: list[tuple[object, ...]] = []
            for collective in collectives:
                for size in sizes:
                    run = measure(fabric, collective, size, limit)
                    runs.append(run)
                    rows += run_rows(run)
                    outcome = f"auto chose {run.chose}" if run.chose else run.error
                    print(f"  [{len(runs)}/{total}] {fabric.name} ({fabric.ranks} ranks) {collective} "
                          f"{format_size(size)}: {outcome}, {run.measured.compile_s:.1f} s "
                          f"({time.perf_counter() - clock:.0f} s in all)", file=sys.stderr, flush=True)
            kind = "switch-based" if fabric.switch_based else "direct links / relays"
            print(f"{fabric.name}: {fabric.family}, {fabric.ranks} ranks, {kind}")
            print(format_table(rows, ("collective", "size", "algorithm", "of bound", "predicted", "compile",
                                      "chose / reason")), flush=True)
            print()
    except KeyboardInterrupt:  # a long run stopped early (SIGINT) still reports what it measured
        print(f"interrupted: the summary covers the {len(runs)} of {total} compiles measured\n", flush=True)
    print("Against the targets (benchmarks/targets.py)")
    print(format_table(summary_rows(runs), ("fabric", "family", "ranks", "collective", "size", "auto chose",
                                            "quality (target): verdict", "compile (target): verdict")))
    print()
    print("Per family")
    print(format_table(family_rows(runs), ("family", "target", "goal", "met", "worst")))
    print()
    print(machine_line().replace("machine:", "at the end, machine:"))


def anchor_row(anchor: Anchor, run: Run) -> tuple[object, ...]:
    """One anchor: auto's pick, its share of the bound (against the anchor's target), its algbw and the bound's
    beside the published figure, and the compile time."""
    m = run.measured
    head = (anchor.topology, m.collective, format_size(m.size_bytes), anchor.source)
    published = "-" if anchor.reported_GBps is None else f"{anchor.reported_GBps:.1f} GB/s"
    if m.predicted_s is None or m.bound_s is None:
        return (*head, "none", "-", f">= {anchor.share:.0%}", "missed", "-", "-", published,
                f"{m.compile_s:.1f}s", run.error)
    share = m.bound_s / m.predicted_s
    return (*head, run.chose, f"{100 * share:.1f}%", f">= {anchor.share:.0%}",
            "met" if share >= anchor.share else f"missed by {100 * (anchor.share - share):.1f} points",
            f"{m.size_bytes / m.predicted_s / 1e9:.1f} GB/s", f"{m.size_bytes / m.bound_s / 1e9:.1f} GB/s", published,
            f"{m.compile_s:.1f}s", "")


def run_anchors(limit: float | None) -> None:
    """Measure every anchor (:data:`targets.ANCHORS`) on its shipped topology: a table of the verdicts, then
    each anchor's race."""
    shipped = {f.name: f for f in shipped_fabrics()}
    print(machine_line(), flush=True)
    runs: list[tuple[Anchor, Run]] = []
    for anchor in ANCHORS:
        run = measure(shipped[anchor.topology], anchor.collective, anchor.size_bytes, limit)
        runs.append((anchor, run))
        print(f"  {anchor.topology} {anchor.collective} {format_size(anchor.size_bytes)}: "
              f"{run.chose or run.error}, {run.measured.compile_s:.1f} s", file=sys.stderr, flush=True)
    print("Anchors (benchmarks/targets.py): auto against the published plans that led it")
    print(format_table([anchor_row(anchor, run) for anchor, run in runs],
                       ("topology", "collective", "size", "anchor", "auto chose", "of bound", "target", "verdict",
                        "algbw", "bound algbw", "published", "compile", "error")))
    for anchor, run in runs:
        print(f"\n{anchor.topology} {anchor.collective} {format_size(anchor.size_bytes)}: the race")
        print(format_table(run_rows(run), ("collective", "size", "algorithm", "of bound", "predicted", "compile",
                                           "chose / reason")))


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(parse_size(part) for part in text.split(","))
    except UnitError as exc:
        raise SystemExit(f"planner_bench: --sizes: {exc} (fix: e.g. --sizes 1MiB,256MiB)") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default=None,
                        help="comma-separated names: shipped topologies (and, with --suite, fabrics of the suite)")
    parser.add_argument("--collective", default=None,
                        help="default allreduce; with --suite, comma-separated (default allgather,reducescatter,"
                             "allreduce)")
    parser.add_argument("--sizes", default=None, help="comma-separated sizes, e.g. 1MiB,256MiB")
    parser.add_argument("--quick", action="store_true",
                        help="64 MiB and 1 GiB only, scale up to 1024 GPUs; with --suite, the smallest fabric of "
                             "each family")
    parser.add_argument("--scale", default=None, help="comma-separated GPU counts for the scale table")
    parser.add_argument("--scale-only", action="store_true", help="print only the scale table")
    parser.add_argument("--scale-size", default="64MiB", help="message size of the scale table (default 64MiB)")
    parser.add_argument("--suite", action="store_true", help="the fabric suite against benchmarks/targets.py's targets")
    parser.add_argument("--anchors", action="store_true",
                        help="the cases where a published plan led topocc's (benchmarks/targets.py ANCHORS)")
    parser.add_argument("--limit", type=float, default=None,
                        help="with --suite or --anchors, abandon a compile after this many seconds (reported as "
                             "missed)")
    parser.add_argument("--routing", default=None,
                        help="time every topology (and the scale table's fat-trees) under this routing instead of "
                             "its own")
    args = parser.parse_args()
    names = args.topologies.split(",") if args.topologies else None
    if args.anchors:
        run_anchors(args.limit)
        return
    if args.suite:
        try:
            collectives = (tuple(canonical_collective(c) for c in args.collective.split(","))
                           if args.collective else SUITE_COLLECTIVES)
        except TopoccError as exc:
            raise SystemExit(f"planner_bench: --collective: {exc}") from None
        sizes = _sizes(args.sizes) if args.sizes else SUITE_SIZES
        run_suite(select_fabrics(names, args.quick), collectives, sizes, args.limit)
        return
    names = names or [t.name for t in scheduled_topologies()]
    sizes = _sizes(args.sizes) if args.sizes else (SIZES[2:] if args.quick else SIZES)
    if not args.scale_only:
        for name in names:  # a table per topology, printed as soon as it is measured
            print(format_table(quality_rows([name], sizes, args.collective or "allreduce", args.routing),
                               ("topology", "size", "algorithm", "predicted", "of bound", "compile", "chose / note")),
                  flush=True)
            print()
    counts = tuple(int(c) for c in args.scale.split(",")) if args.scale else (
        (16, 128, 1024) if args.quick else (16, 128, 1024, 4096))
    print()
    print(f"auto allreduce on fat-trees of 8-GPU hosts, {args.scale_size} (peak RSS: the largest so far)")
    print(format_table(scale_rows(counts, parse_size(args.scale_size), args.routing),
                       ("GPUs", "auto chose", "ops", "load", "compile (auto)", "compile CPU", "simulate winner CPU",
                        "peak RSS (planner + proof)", "of bound")))


if __name__ == "__main__":
    main()
