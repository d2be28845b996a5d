"""How many NCCL groups the lowering (runtime/lowering.py) makes: shipped schedules, and pipelined rings and chains.

Prints, for every shipped schedule, its operations per rank and the NCCL groups of its busiest rank at
1, 16, 64 and 256 MiB (the stream capacity follows the chunk size: at least ``DEFAULT_GROUP_BYTES`` per
(sender, receiver, channel) stream and group); then, for a ring all-reduce of p ranks and q pieces and a
chain broadcast, the groups and rounds with one piece per stream and group against plain
as-soon-as-possible rounds (lock-step), and how long each takes on unit links: a round lasts as long as
its busiest rank pair's chunks (NCCL moves a pair's messages one after another), rounds one after
another.  Each lowering is proved (``topocc.planner.analysis.verify_lowered``) before it is counted.

    python benchmarks/lowering_groups.py [--skip-large]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from topocc.planner.analysis.verify_lowered import verify_lowering  # noqa: E402
from topocc.runtime.lowering import DEFAULT_GROUP_BYTES, chunks_per_round_for, lower  # noqa: E402
from topocc.runtime.schedule import load_schedule  # noqa: E402

MIB = 1 << 20
SIZES = (1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
LOCKSTEP = 1 << 30  # chunks per stream and round: no limit, every message as early as its dependencies allow


def shipped(skip_large: bool) -> None:
    print(f"# shipped schedules: NCCL groups of the busiest rank (group bytes {DEFAULT_GROUP_BYTES >> 10} KiB)")
    print(f"#{'schedule':>17} {'ops/rank':>9} | " + " ".join(f"{s // MIB:>6} MiB" for s in SIZES) + " | proof (s)")
    for path in sorted((REPO / "schedules").glob("*.json*")):
        schedule = load_schedule(path)
        if skip_large and schedule.op_count > 100_000:
            continue
        start = time.perf_counter()
        counts = []
        for size in SIZES:
            cap = chunks_per_round_for(size / schedule.input_chunks)
            counts.append(verify_lowering(schedule, lower(schedule, cap)).max_groups)
        name = path.name.split("-allreduce")[0]
        ops = max(len(p) for p in schedule.programs)
        print(f" {name:>17} {ops:>9} | " + " ".join(f"{c:>10}" for c in counts)
              + f" | {time.perf_counter() - start:9.1f}")


def unit_time(schedule: object, lowering: object) -> int:
    """Chunk-times on unit links: the sum over rounds of the most chunks any ordered rank pair moves in it."""
    load: dict[tuple[int, int, int], int] = {}
    for rank, mine in enumerate(lowering.ranks):  # type: ignore[attr-defined]
        program = schedule.programs[rank]  # type: ignore[attr-defined]
        for group in mine.groups:
            for k in group.p2p:
                op = program[k]
                if op.kind == "send":
                    key = (group.round, rank, op.peer)
                    load[key] = load.get(key, 0) + op.src.count
    per_round: dict[int, int] = {}
    for (r, _, _), chunks in load.items():
        per_round[r] = max(per_round.get(r, 0), chunks)
    return sum(per_round.values())


def pipelines() -> None:
    spec = importlib.util.spec_from_file_location("schedules", REPO / "tests" / "runtime" / "mpi_scripts" /
                                                  "schedules.py")
    S = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(S)  # type: ignore[union-attr]
    print("\n# pipelined schedules: one piece per stream and group vs lock-step (as early as dependencies allow)")
    print(f"#{'schedule':>25} {'ops/rank':>9} | {'groups':>6} {'rounds':>6} {'time':>5} | {'lock-step groups':>16} "
          f"{'time':>5}")
    cases = [(f"ring allreduce p={p} q={q}", S.ring_allreduce(p, q)) for p, q in ((4, 1), (4, 8), (8, 16))]
    cases += [(f"chain broadcast p={p} q={q}", S.chain_broadcast(p, q)) for p, q in ((4, 8), (8, 32))]
    for name, schedule in cases:
        piecewise, steps = lower(schedule, 1), lower(schedule, LOCKSTEP)
        verify_lowering(schedule, piecewise)
        verify_lowering(schedule, steps)
        ops = max(len(p) for p in schedule.programs)
        print(f" {name:>25} {ops:>9} | {piecewise.max_groups:>6} {piecewise.rounds:>6} "
              f"{unit_time(schedule, piecewise):>5} | {steps.max_groups:>16} {unit_time(schedule, steps):>5}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="leave out schedules above 100k operations")
    args = parser.parse_args()
    shipped(args.skip_large)
    pipelines()
    return 0


if __name__ == "__main__":
    sys.exit(main())
