"""Plans at scale: ``auto``'s compile time, peak memory and share of the bound on the largest shipped clusters,
the schedule file's size and what loading it costs each rank.

Per case (a shipped topology, a collective, a size), one process compiles with ``auto`` and writes the schedule
as ``topocc compile -o f.json.gz`` does (gzip JSON, in the symmetric form where that pays: ``form`` says which,
``write`` what writing took, and finding the classes where the compile did not); ``timed`` says how the
simulator replayed the winner: one rank per orbit of its symmetries (``1 of 1,024 ranks``) or every rank.  A
second process loads the file as a rank does at start-up
(:func:`~topocc.runtime.schedule.load_schedule`, then that rank's program: the middle rank's). Each runs under
a memory cap and a time limit, so a case too large for the machine is a row that says so, not a machine that
swaps. Peak RSS counts the planner and its forked proof (each process's own peak, summed: the proof's pages
shared with the planner count twice).

``of bound`` is the bound's time over the predicted time (1.0: at the bound); at small sizes the bound holds
its latency term, so ``x bound`` (its inverse) is what the latency targets read.

Run: ``python benchmarks/scale_bench.py [--topologies fattree-1024,fattree-16384,rail-65536]
[--collectives allreduce,allgather,reducescatter] [--sizes 256MiB] [--limit 1800] [--memory 20]``;
``--small`` measures all-reduce at 1 MiB and 16 MiB instead.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as a script: the repository's modules
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topocc.planner.report.table import format_table
from topocc.planner.units import format_size, parse_size

TOPOLOGIES = ("fattree-1024", "fattree-16384", "rail-65536")
COLLECTIVES = ("allreduce", "allgather", "reducescatter")
SMALL_SIZES = (1 << 20, 16 << 20)
HEADERS = ("topology", "collective", "size", "auto chose", "operations", "compile", "CPU", "peak RSS",
           "of bound", "x bound", "timed", "form", "write", "file", "load (a rank)", "load RSS")


def _peak_gib() -> float:
    """This process's peak RSS plus its children's largest, in GiB (Linux reports KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 2**20


def compile_case(topology: str, collective: str, size: int, out: str) -> dict[str, object]:
    """Compile one case with ``auto`` and write its schedule to ``out``; the figures as a dict."""
    from topocc.planner.analysis.automorphisms import schedule_orbits
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.compiler.options import Options
    from topocc.planner.compiler.symmetrize import symmetric_form
    from topocc.planner.routing.network import Network
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.runtime.schedule import save_schedule

    started, cpu = time.perf_counter(), time.process_time()
    net = Network(resolve_topology(topology))
    compiled = compile_schedule(net, collective, "auto", Options(size_bytes=size))
    compiled_s, compiled_cpu = time.perf_counter() - started, time.process_time() - cpu
    peak = _peak_gib()
    written = symmetric_form(compiled.schedule, net.topology)
    save_schedule(written, out)
    write_s = time.perf_counter() - started - compiled_s
    form = "per-rank" if written.symmetry is None else f"{len(written.symmetry.templates)} classes"
    orbits = schedule_orbits(net, compiled.schedule)  # as the simulator found them
    timed = "rank by rank" if orbits is None else f"{len(orbits.reps)} of {written.ranks:,} ranks"
    return {"algorithm": compiled.schedule.metadata.algorithm, "operations": compiled.schedule.op_count,
            "wall_s": compiled_s, "cpu_s": compiled_cpu, "peak_gib": peak, "share": compiled.efficiency,
            "timed": timed, "form": form, "write_s": write_s, "file_bytes": Path(out).stat().st_size}


def load_case(path: str) -> dict[str, object]:
    """Load a schedule file as one rank does; the wall time and peak memory."""
    from topocc.runtime.schedule import load_schedule

    started = time.perf_counter()
    schedule = load_schedule(path)
    schedule.programs[schedule.ranks // 2]
    return {"load_s": time.perf_counter() - started, "load_gib": _peak_gib()}


def _child(args: list[str], limit: float, memory_gib: float) -> tuple[dict[str, Any] | None, str]:
    """Run this script's ``--child`` mode under the caps; its JSON figures, or why there are none."""
    cap = int(memory_gib * 2**30)

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    try:
        done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                              timeout=limit, preexec_fn=limits, check=False)
    except subprocess.TimeoutExpired:
        return None, f"over {limit:g} s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        if any("MemoryError" in line for line in lines[-3:]):
            return None, f"over {memory_gib:g} GiB"
        return None, f"failed under the {memory_gib:g} GiB cap: {lines[-1] if lines else done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


def row(topology: str, collective: str, size: int, limit: float, memory_gib: float) -> tuple[object, ...]:
    """One case's row: its compile, then its load, each in a capped process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "schedule.json.gz")
        built, why = _child(["compile", topology, collective, str(size), out], limit, memory_gib)
        head = (topology, collective, format_size(size))
        if built is None:
            return (*head, why, *("-",) * (len(HEADERS) - 4))
        loaded, why = _child(["load", out], limit, memory_gib)
    share = built["share"]
    figures = (built["algorithm"], f"{built['operations']:,}", f"{built['wall_s']:.1f} s", f"{built['cpu_s']:.1f} s",
               f"{built['peak_gib']:.2f} GiB", f"{100 * share:.1f}%", f"{1 / share:.2f}", built["timed"], built["form"],
               f"{built['write_s']:.1f} s", f"{built['file_bytes'] / 2**10:,.0f} KiB")
    if loaded is None:
        return (*head, *figures, why, "-")
    return (*head, *figures, f"{loaded['load_s']:.2f} s", f"{loaded['load_gib']:.2f} GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES), help="comma-separated shipped topologies")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--sizes", default="256MiB", help="comma-separated sizes (default 256MiB)")
    parser.add_argument("--small", action="store_true", help="all-reduce at 1 MiB and 16 MiB")
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds per compile or load (default 1800)")
    parser.add_argument("--memory", type=float, default=20.0, help="GiB each process may map (default 20)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, *rest = args.child
        figures = compile_case(rest[0], rest[1], int(rest[2]), rest[3]) if mode == "compile" else load_case(rest[0])
        print(json.dumps(figures))
        return 0
    cases = [(t, "allreduce", s) for t in args.topologies.split(",") for s in SMALL_SIZES] if args.small else [
        (t, c, parse_size(s)) for t in args.topologies.split(",") for c in args.collectives.split(",")
        for s in args.sizes.split(",")]
    rows = []
    for topology, collective, size in cases:
        rows.append(row(topology, collective, size, args.limit, args.memory))
        print(f"  done {topology} {collective} {format_size(size)}", file=sys.stderr, flush=True)
    print(format_table(rows, HEADERS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
