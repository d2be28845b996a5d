"""mcf benchmark: solver backends on one model, and schedule quality against the lower bound and treepack.

Prints one table: topology, collective, size, backend, model size (variables,
rows), solve seconds, predicted time, % of the lower bound and algbw; treepack
rows (no solver columns) for comparison.
Run: ``python benchmarks/mcf_bench.py [--quick]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.algorithms.mcf import mcf
from topocc.planner.compiler.algorithms.treepack import treepack
from topocc.planner.compiler.options import McfOptions, Options
from topocc.planner.errors import TopoccError
from topocc.planner.report.table import format_table
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.units import format_size, format_time

#: (topology, collective, size, backends): the first case compares backends on one LP model.
CASES = [
    ("dgx1-v100", "allgather", 100 << 20, ("glop", "highs", "clp", "pdlp", "pulp-cbc")),
    ("ndv2-2chassis", "allgather", 1 << 30, ("clp", "glop")),
    ("dgx1-v100", "allreduce", 64 << 20, ("clp",)),
    ("dgx1-v100", "allreduce", 1 << 30, ("clp",)),
    ("torus-4x4", "allreduce", 64 << 20, ("clp",)),
    ("torus-4x4", "allreduce", 1 << 30, ("clp",)),
]
QUICK = [(*CASES[0][:3], ("glop", "clp", "pulp-cbc")), (*CASES[1][:3], ("clp",))]


def rows(cases: list[tuple[str, str, int, tuple[str, ...]]]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for name, collective, size, backends in cases:
        topology = resolve_topology(name)
        net = Network(topology)
        bound = lower_bound(net, collective, size).time_s
        runs = [(b, mcf, McfOptions(solver=b, time_limit_s=300)) for b in backends]
        runs.append(("treepack", treepack, McfOptions()))
        for label, fn, extra in runs:
            started = time.perf_counter()
            try:
                schedule = fn(net, collective, Options(size_bytes=size, mcf=extra))
            except TopoccError as exc:
                out.append((name, collective, format_size(size), label, "-", "-", "-", "-", "-", exc.message[:50]))
                continue
            elapsed = time.perf_counter() - started
            verify(schedule)
            sim = simulate(topology, schedule, size)
            meta = schedule.metadata.options
            out.append((name, collective, format_size(size), label if fn is treepack else f"mcf/{label}",
                        meta.get("variables", "-"), meta.get("rows", "-"),
                        f"{meta['solve_s']:.2f}" if "solve_s" in meta else f"({elapsed:.2f})",
                        format_time(sim.time_s), f"{100 * bound / sim.time_s:.1f}%", f"{sim.algbw_GBps:.2f}"))
            print("  done", out[-1], file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two cases, three backends")
    args = parser.parse_args()
    table = rows(QUICK if args.quick else CASES)
    print(format_table(table, ("topology", "collective", "size", "backend", "variables", "rows", "solve s",
                               "predicted", "% of bound", "algbw GB/s")))


if __name__ == "__main__":
    main()
