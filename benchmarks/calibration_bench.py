"""Calibrate emulated clusters, then measure auto's plans and the ring against MPICH beside both models.

For each topology (default: the shipped emu-uniform and emu-racks):

1. ``topocc calibrate`` on the emulated cluster (:func:`topocc.planner.testbed.calibrate.calibrate`): the
   fitted figures against the file's;
2. ``auto``'s plan on the file (before) and on the calibrated file (after), and the ring, over 1-64 MiB:
   which algorithm each picks per size;
3. each distinct plan timed on the emulated cluster (MPICH's ``MPI_Allreduce`` once, with auto's plan after
   calibration), and every measured time set beside the datasheet model's prediction and the calibrated
   one's, with their errors;
4. the targets: auto's (after) and the ring's calibrated predictions within 10% of measured; auto at most
   1.05x the better of MPICH and the ring; on emu-racks auto at least 1.5x faster than MPICH from 16 MiB.

Needs root (network namespaces) and MPICH.  Takes about ten minutes for both clusters on two cores.

    sudo .venv/bin/python benchmarks/calibration_bench.py [--topologies emu-racks] [--out out/calibration]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.size_buckets import compile_plan
from topocc.planner.report.table import format_table
from topocc.planner.testbed.bench import EmulatedRow, bench_emulated
from topocc.planner.testbed.calibrate import calibrate, format_calibration
from topocc.planner.testbed.emulation import DEFAULT_SCALE, emulation_available, scaled_topology
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.units import format_size, format_time
from topocc.runtime.plan import Plan

MIB = 1 << 20
SIZES = [MIB, 4 * MIB, 16 * MIB, 64 * MIB]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _same(a: Plan, b: Plan, sizes: list[int]) -> bool:
    """Whether two plans run the same schedule (algorithm and its options) at every size."""
    def key(plan: Plan, size: int) -> tuple[str, str]:
        meta = plan.select(size).metadata
        return meta.algorithm, repr(sorted((k, v) for k, v in meta.options.items() if k != "size_bytes"))

    return all(key(a, s) == key(b, s) for s in sizes)


def run(name: str, sizes: list[int], scale: float, iters: int, budget_s: float, out: Path) -> list[str]:
    """Calibrate, compile, measure and print one topology; returns its target lines."""
    started = time.perf_counter()
    datasheet = resolve_topology(name)
    done = calibrate(name, out / f"{name}.yaml", emulate=True, scale=scale, progress=_say)
    calibrated = done.topology
    print(format_calibration(done))
    print(f"# calibration took {time.perf_counter() - started:.0f} s; written to {out / f'{name}.yaml'}")
    low, high = sizes[0], sizes[-1]
    plans = {"auto before": compile_plan(datasheet, "allreduce", low, high, "auto")[0],
             "auto after": compile_plan(calibrated, "allreduce", low, high, "auto")[0],
             "ring": compile_plan(calibrated, "allreduce", low, high, "ring")[0]}
    print(format_table([(format_size(s), *(plans[k].select(s).metadata.algorithm for k in plans)) for s in sizes],
                       ("size", *plans), "<<<<"))
    models = {"datasheet": scaled_topology(datasheet, scale), "calibrated": scaled_topology(calibrated, scale)}
    measured: dict[str, list[EmulatedRow]] = {}
    for key, plan in plans.items():
        if key == "auto before" and _same(plan, plans["auto after"], sizes):
            continue  # the same schedules: measuring them twice says nothing new
        _say(f"bench: {name}, {key}")
        measured[key] = bench_emulated(calibrated, plan, sizes, scale=scale, iters=iters, include_gloo=False,
                                       include_native=key == "auto after", budget_s=budget_s, progress=_say)
    mpi = {r.size: r.native_time_s for r in measured["auto after"]}
    rows = []
    for key, got in measured.items():
        plan = plans[key]
        for r in got:
            schedule = plan.select(r.size)
            pred = {m: simulate(t, schedule, r.size).time_s for m, t in models.items()}
            rows.append((format_size(r.size), key, r.algorithm, format_time(r.time_s),
                         format_time(pred["datasheet"]), f"{pred['datasheet'] / r.time_s - 1:+.1%}",
                         format_time(pred["calibrated"]), f"{pred['calibrated'] / r.time_s - 1:+.1%}",
                         format_time(native) if (native := mpi[r.size]) else "-"))
    print(format_table(rows, ("size", "plan", "algorithm", "measured", "datasheet model", "error", "calibrated model",
                              "error", "MPICH"), "<<<>>>>>>"))
    lines = []
    after = {r.size: r for r in measured["auto after"]}
    ring = {r.size: r for r in measured["ring"]}
    for s in sizes:
        a, g = after[s], ring[s]
        for label, r, plan in (("auto", a, plans["auto after"]), ("ring", g, plans["ring"])):
            err = simulate(models["calibrated"], plan.select(s), s).time_s / r.time_s - 1
            lines.append(f"{'met ' if abs(err) <= 0.10 else 'MISS'} {name} {format_size(s)}: {label} predicted "
                         f"{err:+.1%} off measured (target within 10%)")
        best = min(t for t in (mpi[s], g.time_s) if t)
        lines.append(f"{'met ' if a.time_s <= 1.05 * best else 'MISS'} {name} {format_size(s)}: auto "
                     f"{a.time_s / best:.2f}x the better of MPICH and ring (target <= 1.05)")
        if name == "emu-racks" and s >= 16 * MIB and (native := mpi[s]):
            lines.append(f"{'met ' if native >= 1.5 * a.time_s else 'MISS'} {name} {format_size(s)}: MPICH / auto "
                         f"{native / a.time_s:.2f} (target >= 1.5)")
    print(f"# {name} took {time.perf_counter() - started:.0f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=["emu-uniform", "emu-racks"])
    parser.add_argument("--sizes", nargs="+", type=int, default=SIZES)
    parser.add_argument("--scale", type=float, default=DEFAULT_SCALE)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--budget", type=float, default=20.0,
                        help="seconds of timed calls per size and plan (fewer iterations where calls are long)")
    parser.add_argument("--out", type=Path, default=Path("out/calibration"))
    args = parser.parse_args(argv)
    why = emulation_available()
    if why is not None:
        print(f"calibration_bench: cannot emulate a cluster here: {why}", file=sys.stderr)
        return 2
    lines = []
    for name in args.topologies:
        lines += run(name, sorted(args.sizes), args.scale, args.iters, args.budget, args.out)
    print("\n# targets")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
