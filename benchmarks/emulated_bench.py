"""Compiled allreduce vs MPICH's MPI_Allreduce vs torch gloo on emulated clusters, beside the simulator.

For each topology (default: the shipped emu-uniform and emu-racks) this compiles an allreduce plan with
``topocc.planner.compiler.compile.compile_plan`` (``auto`` per size bucket, or ``--algorithm``), then runs
:func:`topocc.planner.testbed.bench.bench_emulated` over 1 MiB .. 64 MiB and prints its table, then checks the targets:

* emu-racks: the compiled schedule at least 1.3x faster than MPI_Allreduce at 16 MiB and above;
* emu-uniform: no more than 10% slower than MPI_Allreduce;
* both: measured within 20% of the simulator's prediction (on the scaled topology) at 4 MiB and above.

Needs root (network namespaces), MPICH and torch.  Takes minutes: fewer iterations run at large sizes.

    sudo /work/venv/bin/python benchmarks/emulated_bench.py [--topologies emu-racks] [--sizes 4194304 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from topocc.planner.compiler.size_buckets import compile_plan
from topocc.planner.testbed.bench import EmulatedRow, bench_emulated, format_emulated_table
from topocc.planner.testbed.emulation import DEFAULT_SCALE, emulation_available
from topocc.planner.topology.catalogue import resolve_topology

MIB = 1 << 20
SIZES = [MIB, 4 * MIB, 16 * MIB, 64 * MIB]


def targets(name: str, rows: list[EmulatedRow]) -> list[str]:
    """One line per target: met or missed, with the figure."""
    out = []
    for r in rows:
        speed = 1 / r.ratio if r.ratio else float("nan")  # native MPI's time over ours
        if name == "emu-racks" and r.size >= 16 * MIB:
            out.append(f"{'met ' if speed >= 1.3 else 'MISS'} {name} {r.size // MIB} MiB: mpi/ours {speed:.2f} "
                       "(target >= 1.30)")
        if name == "emu-uniform":
            out.append(f"{'met ' if speed >= 1 / 1.1 else 'MISS'} {name} {r.size // MIB} MiB: mpi/ours {speed:.2f} "
                       "(target >= 0.91)")
        if r.size >= 4 * MIB:
            err = abs(r.time_s - r.predicted_time_s) / r.time_s
            out.append(f"{'met ' if err <= 0.2 else 'MISS'} {name} {r.size // MIB} MiB: measured vs predicted "
                       f"{err:.0%} apart (target <= 20%)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=["emu-uniform", "emu-racks"])
    parser.add_argument("--sizes", nargs="+", type=int, default=SIZES)
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--scale", type=float, default=DEFAULT_SCALE)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    why = emulation_available()
    if why is not None:
        print(f"emulated_bench: cannot run here: {why}", file=sys.stderr)
        return 2
    report, lines = {}, []
    for name in args.topologies:
        topology = resolve_topology(name)
        start = time.monotonic()
        plan, compiled = compile_plan(topology, "allreduce", min(args.sizes), max(args.sizes), args.algorithm)
        print(f"{name}: plan of {len(plan.schedules)} bucket(s): "
              + ", ".join(f"{c.schedule.metadata.algorithm} [{c.schedule.metadata.min_bytes}, "
                          f"{c.schedule.metadata.max_bytes})" for c in compiled)
              + f" (compiled in {time.monotonic() - start:.1f} s)", flush=True)
        rows = bench_emulated(topology, plan, args.sizes, scale=args.scale, iters=args.iters,
                              include_gloo=not args.no_gloo)
        print(format_emulated_table(rows, topology, args.scale), flush=True)
        print(f"({name}: {time.monotonic() - start:.0f} s)\n", flush=True)
        report[name] = [r.to_json() for r in rows]
        lines += targets(name, rows)
    print("targets:")
    print("\n".join("  " + line for line in lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
