"""Planner benchmark: schedule quality and compile time on the shipped topologies.

Prints, for every shipped topology and size, each algorithm's predicted time,
its percentage of the lower bound and its compile time (build + verify +
simulate); an algorithm above the rank count where ``auto`` skips it
(``Algorithm.auto_max_ranks``: minutes per compile there) is listed as skipped.
Then the compile time and peak memory of ``auto`` as the cluster grows.
``--routing MODE`` times every topology under that routing instead of its own
(``spray`` gives the figures of topocc before routing was modelled).
Run: ``python benchmarks/planner_bench.py [--quick] [--topologies a,b] [--routing spray] [--scale 16,128,1024,4096]``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from planner.algorithms import ALGORITHMS, Options
from planner.bounds import lower_bound
from planner.compile import compile_schedule, resolve_topology, shipped_topologies
from planner.errors import TopoccError
from planner.summary import format_table
from planner.topology import parse_topology_text
from planner.units import format_size, format_time

SIZES = (64 << 10, 1 << 20, 64 << 20, 1 << 30)


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


def scale_rows(gpu_counts: tuple[int, ...]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for gpus in gpu_counts:
        started = time.perf_counter()
        topology = parse_topology_text(fat_tree(gpus // 8), f"fattree-{gpus}")
        loaded = time.perf_counter() - started
        compiled = compile_schedule(topology, "allreduce", "auto", Options(size_bytes=64 << 20))
        total = time.perf_counter() - started
        # large schedules are proved in a forked child (planner.compile.PARALLEL_VERIFY_OPS): both peaks count
        planner_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        proof_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        rows.append((gpus, compiled.schedule.metadata.algorithm, compiled.schedule.op_count, f"{loaded:.2f}s",
                     f"{total:.2f}s", f"{planner_gib:.2f} + {proof_gib:.2f} GiB", f"{100 * compiled.efficiency:.1f}%"))
        print(f"  done {gpus} GPUs", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topologies", default=None, help="comma-separated shipped names (default: all)")
    parser.add_argument("--collective", default="allreduce")
    parser.add_argument("--quick", action="store_true", help="64 MiB and 1 GiB only; scale up to 1024 GPUs")
    parser.add_argument("--scale", default=None, help="comma-separated GPU counts for the scale table")
    parser.add_argument("--scale-only", action="store_true", help="print only the scale table")
    parser.add_argument("--routing", default=None, help="time every topology under this routing instead of its own")
    args = parser.parse_args()
    names = args.topologies.split(",") if args.topologies else list(shipped_topologies())
    sizes = SIZES[2:] if args.quick else SIZES
    if not args.scale_only:
        for name in names:  # a table per topology, printed as soon as it is measured
            print(format_table(quality_rows([name], sizes, args.collective, args.routing),
                               ("topology", "size", "algorithm", "predicted", "of bound", "compile", "chose / note")),
                  flush=True)
            print()
    counts = tuple(int(c) for c in args.scale.split(",")) if args.scale else (
        (16, 128, 1024) if args.quick else (16, 128, 1024, 4096))
    print()
    print(format_table(scale_rows(counts),
                       ("GPUs", "auto chose", "ops", "load", "compile (auto)", "peak RSS (planner + proof)",
                        "of bound")))


if __name__ == "__main__":
    main()
