"""Report benchmark: the time and peak memory to write the HTML report of every shipped schedule.

Each report is written by ``topocc inspect SCHEDULE --html`` (``inspect_schedule``)
in a fresh process, so each peak resident memory is that report's alone.
Prints one row per schedule: ranks, operations, wall time, CPU time, peak
memory and the page's size.  Extra schedule files (e.g. a 256 MiB compile of
fattree-1024) can be given as arguments.
Run: ``python benchmarks/report_bench.py [--baselines ring,tree] [--only fattree] [more.json.gz ...]``.
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

from topocc.planner.report.table import format_table

SCHEDULES = Path(__file__).resolve().parent.parent / "schedules"


def one(path: str, baselines: list[str]) -> dict[str, object]:
    """Write the report of ``path`` in this process; measure it."""
    from topocc.planner.report.inspect import inspect_schedule
    from topocc.runtime.plan import as_plan

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        wall, cpu = time.perf_counter(), time.process_time()
        inspect_schedule(path, html=str(out), baselines=baselines)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        size = out.stat().st_size
    schedule = as_plan(path).schedules[0]
    return {"ranks": schedule.ranks, "operations": schedule.op_count, "wall_s": wall, "cpu_s": cpu,
            "peak_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "html_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="more schedule files to report on")
    parser.add_argument("--baselines", default="ring,tree", help="as topocc inspect --baselines (default ring,tree)")
    parser.add_argument("--only", default="", help="only shipped schedules whose name contains this")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one report, a JSON line out
    args = parser.parse_args()
    baselines = [b for b in args.baselines.split(",") if b]
    if args.one:
        print(json.dumps(one(args.one, baselines)))
        return
    paths = [str(p) for p in sorted(SCHEDULES.glob("*.json*")) if args.only in p.name] + args.paths
    rows = []
    for path in paths:
        done = subprocess.run([sys.executable, __file__, "--one", path, "--baselines", args.baselines],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            rows.append((Path(path).name, "-", "-", "-", "-", "-", done.stderr.strip().splitlines()[-1][:60]))
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append((Path(path).name, r["ranks"], f"{r['operations']:,}", f"{r['wall_s']:.2f}s", f"{r['cpu_s']:.2f}s",
                     f"{r['peak_MiB']:.0f} MiB", f"{r['html_bytes'] / 2**20:.2f} MiB"))
        print(f"  done {Path(path).name}", file=sys.stderr, flush=True)
    print(f"HTML report per schedule (topocc inspect --html, baselines: {args.baselines or 'none'})")
    print(format_table(rows, ("schedule", "ranks", "operations", "wall", "cpu", "peak memory", "page")))


if __name__ == "__main__":
    main()
