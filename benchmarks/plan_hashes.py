"""Schedule fingerprints: the hash and predicted time of many compilations, to show a change kept them all.

``record`` compiles every case (every shipped topology and every fabric of the
suite, each collective, 1 MiB and 256 MiB, ``auto`` and each algorithm by name
that applies) and writes one JSON line per case: the schedule's :func:`fingerprint`
(the same in the symmetric form and rank by rank), its predicted time (to 12
digits), its lower bound, and ``auto``'s candidates; or the one-line error a
case ended with.  ``compare`` prints a table of what differs between two
such files and exits 1 if anything does.

An algorithm applies where it builds the collective and ``auto`` would race it at
that rank count (``Algorithm.auto_max_ranks``).  Above 64 ranks only ``auto``
runs (the flat algorithms build millions of operations there), above 4096
only ``auto``'s all-reduce at 1 MiB (fattree-16384: minutes for each case), and
above 16384 nothing (rail-65536: minutes for its all-reduce, its all-gather's proof does not fit;
``benchmarks/scale_bench.py`` measures it).

Run: ``python benchmarks/plan_hashes.py record -o before.jsonl [--shard 1/2] [--match REGEX]``, then
``python benchmarks/plan_hashes.py compare before.jsonl after.jsonl``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as a script: the repository's modules
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fabrics import shipped_fabrics, suite
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import canonical_order
from topocc.planner.errors import TopoccError
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.schedule import Schedule, dump_schedule

COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall")
SIZES = (1 << 20, 256 << 20)
#: Above this many ranks only ``auto`` runs; above the second, only its all-reduce at 1 MiB.
NAMED_MAX_RANKS = 64
AUTO_MAX_RANKS = 4096
#: Above this many ranks no case runs.
MAX_RANKS = 16384
#: Metadata options that are wall-clock times (the flow solver's): left out of the hash.
_WALL_CLOCK = ("solve_s",)
#: A schedule of more operations than this is hashed in its symmetric form where it has one: every rank's
#: program written out would not fit in memory (fattree-16384's all-reduce of whole blocks: 570 million).
EXPANDED_MAX_OPS = 50_000_000


@dataclass(frozen=True, slots=True)
class Case:
    """One compilation: a fabric (by name, with its YAML), a collective, a size and an algorithm."""

    fabric: str
    yaml: str
    source: str
    ranks: int
    collective: str
    size: int
    algorithm: str

    @property
    def key(self) -> str:
        return f"{self.fabric} {self.collective} {self.size} {self.algorithm}"


def cases() -> Iterator[Case]:
    """Every case, in a fixed order (smallest fabrics first, so a shard's progress shows early)."""
    fabrics = sorted((f for f in (*shipped_fabrics(), *suite()) if f.ranks <= MAX_RANKS),
                     key=lambda f: (f.ranks, f.name))
    for fabric in fabrics:
        for collective in COLLECTIVES:
            for size in SIZES:
                if fabric.ranks > AUTO_MAX_RANKS and (collective, size) != ("allreduce", 1 << 20):
                    continue
                names = ["auto"]
                if fabric.ranks <= NAMED_MAX_RANKS:
                    names += [a.name for a in ALGORITHMS.values() if collective in a.collectives
                              and (a.auto_max_ranks is None or fabric.ranks <= a.auto_max_ranks)]
                for name in names:
                    yield Case(fabric.name, fabric.yaml, f"{fabric.name}.yaml", fabric.ranks, collective, size, name)


def fingerprint(schedule: Schedule) -> str:
    """The SHA-256 of the schedule's JSON, whatever its form: every rank's program in canonical order
    (:func:`~topocc.planner.compiler.symmetrize.symmetrize`'s, which a symmetric schedule is written in), rank by
    rank; its metadata without the checkout's path, the solver's wall time or the predicted time (simulated
    by class or rank by rank, it differs in its last bits).  Above :data:`EXPANDED_MAX_OPS` a symmetric schedule
    is hashed in its symmetric form."""
    meta = schedule.metadata
    plain = schedule if schedule.symmetry is not None and schedule.op_count > EXPANDED_MAX_OPS else Schedule(
        schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks,
        tuple(canonical_order(program) for program in schedule.programs), schedule.scratch_chunks,
        schedule.root, schedule.inplace, meta, schedule.paths)
    plain = plain.with_metadata(topology_file=None, predicted_time_s=None,
                                options={k: v for k, v in meta.options.items() if k not in _WALL_CLOCK})
    return hashlib.sha256(dump_schedule(plain).encode()).hexdigest()


def _rounded(time_s: float | None) -> float | None:
    """A predicted time to 12 significant digits: the same by class and rank by rank."""
    return None if time_s is None else float(f"{time_s:.12g}")


def run(case: Case) -> dict[str, object]:
    """Compile one case; its fingerprint, or the error it ended with."""
    out: dict[str, object] = {"case": case.key}
    started = time.perf_counter()
    try:
        topology = parse_topology_text(case.yaml, case.source)
        compiled = compile_schedule(topology, case.collective, case.algorithm, Options(size_bytes=case.size))
    except TopoccError as exc:
        out["error"] = str(exc).splitlines()[0]
    else:
        out["hash"] = fingerprint(compiled.schedule)
        out["algorithm"] = compiled.schedule.metadata.algorithm
        out["operations"] = compiled.schedule.op_count
        out["predicted_s"] = _rounded(compiled.sim.time_s)
        out["bound_s"] = compiled.bound.time_s
        out["candidates"] = [[c.algorithm, _rounded(c.time_s), c.reason] for c in compiled.candidates]
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


def record(path: Path, shard: tuple[int, int], match: str | None) -> None:
    """Compile this shard's cases, appending a line each to ``path`` (cases already there are skipped)."""
    done = {json.loads(line)["case"] for line in path.read_text().splitlines()} if path.exists() else set()
    index, count = shard
    with path.open("a") as out:
        for i, case in enumerate(cases()):
            if i % count != index - 1 or case.key in done or (match and not re.search(match, case.key)):
                continue
            row = run(case)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{case.key}: {row.get('hash', row.get('error'))!s:.16} {row['seconds']} s", file=sys.stderr)


def _load(path: Path) -> dict[str, dict[str, object]]:
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {row["case"]: row for row in rows}


def compare(before: Path, after: Path, subset: bool = False) -> int:
    """Print the cases whose hash, predicted time, bound or error differ, or that one file lacks; 1 if any.
    ``subset``: compare only the cases ``after`` holds (a partial run)."""
    a, b = _load(before), _load(after)
    if subset:
        a = {key: row for key, row in a.items() if key in b}
    fields = ("hash", "error", "predicted_s", "bound_s", "algorithm", "candidates")
    differ = [key for key in a.keys() & b.keys() if any(a[key].get(f) != b[key].get(f) for f in fields)]
    missing = sorted(a.keys() ^ b.keys())
    same = len(a.keys() & b.keys()) - len(differ)
    built = sum(1 for key in a.keys() & b.keys() if "hash" in a[key])
    print(f"{len(a)} cases before, {len(b)} after; {same} identical ({built} schedules, the rest the same error), "
          f"{len(differ)} differ, {len(missing)} in one file only")
    for key in sorted(differ):
        what = [f for f in fields if a[key].get(f) != b[key].get(f)]
        print(f"  differs: {key}: {', '.join(what)}")
    for key in missing:
        print(f"  only in {'before' if key in a else 'after'}: {key}")
    return 1 if differ or missing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="compile every case and write its fingerprint")
    rec.add_argument("-o", "--output", type=Path, required=True)
    rec.add_argument("--shard", default="1/1", help="I/N: every N-th case from the I-th (for parallel runs)")
    rec.add_argument("--match", help="only cases whose 'fabric collective size algorithm' matches this regex")
    rec.add_argument("--list", action="store_true", help="print the cases (those --match takes) and stop")
    cmp = sub.add_parser("compare", help="compare two recordings")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument("--subset", action="store_true", help="compare only the cases the second file holds")
    args = parser.parse_args()
    if args.command == "compare":
        sys.exit(compare(args.before, args.after, args.subset))
    if args.list:
        for case in cases():
            if not args.match or re.search(args.match, case.key):
                print(case.key)
        return
    index, count = (int(x) for x in args.shard.split("/"))
    record(args.output, (index, count), args.match)


if __name__ == "__main__":
    main()
