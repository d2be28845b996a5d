"""Replay overhead: a ring allreduce replayed by topocc's runtime vs native MPI_Allreduce.

4 ranks on this machine, float32, 1 MiB and 64 MiB (targets: replay <= 2x native
at 1 MiB, <= 1.3x at 64 MiB).  Replays a hand-built in-place ring (one message per
block, as NCCL's ring) from tests/runtime/mpi_scripts/schedules.py; prints each size against its target.

    python benchmarks/runtime_overhead.py [--ranks 4] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from topocc.runtime.harness.launch import BenchRequest, bench_schedule
from topocc.runtime.schedule import Schedule

TARGETS = {1 << 20: 2.0, 64 << 20: 1.3}


def ring_schedule(ranks: int) -> Schedule:
    """A ring allreduce for ``ranks`` ranks on one host."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: its tests' schedules
    from tests.runtime.mpi_scripts import schedules

    return schedules.ring_allreduce(ranks, 1, inplace=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    schedule = ring_schedule(args.ranks)
    print(f"# {args.ranks} ranks on {os.cpu_count()} cores"
          + (" (oversubscribed: ranks share cores, CPU-bound regime)" if args.ranks > (os.cpu_count() or 1) else ""))
    request = BenchRequest(tuple(sorted(TARGETS)), args.iters, args.warmup, timeout=60)
    rows = bench_schedule(schedule, args.ranks, request)
    print(f"\n{'size':>10} {'replay (ms)':>12} {'MPI (ms)':>10} {'ratio':>6} {'target':>7}  ok")
    ok = True
    for r in rows:
        target = TARGETS[r.size]
        assert r.native_time_s is not None  # bench_schedule times MPI's own allreduce beside each replay
        good = r.ratio is not None and r.ratio <= target
        ok &= good
        print(f"{r.size >> 20:>7} MiB {r.time_s * 1e3:12.2f} {r.native_time_s * 1e3:10.2f} {r.ratio:6.2f} "
              f"{target:6.1f}x  {'yes' if good else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
