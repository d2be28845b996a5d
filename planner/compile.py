"""The front door: compile a collective for a topology into a verified, timed schedule.

``compile_schedule`` runs one named algorithm, or ``auto``: every algorithm that
supports the collective, each verified and simulated, the fastest kept.  Nothing
leaves this module unverified.  It also finds topologies by name (the shipped
ones) and the topology a schedule was compiled for.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from planner.algorithms import ALGORITHMS, Options, get_algorithm
from planner.bounds import Bound, lower_bound
from planner.collectives import canonical_collective
from planner.errors import InfeasibleError, NotApplicableError, SimulationError, TopoccError, UsageError
from planner.simulate import SimResult, simulate
from planner.topology import Topology, load_topology
from planner.verify import VerifyReport, verify
from runtime.plan import Plan
from runtime.schedule import Schedule, save_schedule

__all__ = [
    "Candidate",
    "Compiled",
    "compile_plan",
    "compile_schedule",
    "compile_shipped",
    "resolve_topology",
    "schedule_topology",
    "shipped_topologies",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One algorithm tried by ``auto``: its simulated time, or why it did not apply."""

    algorithm: str
    time_s: float | None
    compile_s: float
    operations: int = 0
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Compiled:
    """A verified schedule with its proof summary, simulation and lower bound."""

    schedule: Schedule
    proof: VerifyReport
    sim: SimResult
    bound: Bound
    candidates: tuple[Candidate, ...] = ()

    @property
    def efficiency(self) -> float:
        """Lower bound / predicted time: 1.0 means the schedule meets the bound."""
        return self.bound.time_s / self.sim.time_s if self.sim.time_s > 0 else 1.0


def _build(topology: Topology, collective: str, name: str, options: Options) -> Schedule:
    algorithm = get_algorithm(name)
    if collective not in algorithm.collectives:
        others = [a.name for a in ALGORITHMS.values() if collective in a.collectives]
        raise NotApplicableError(
            f"{name} does not implement {collective}", fix=f"algorithms for {collective}: {', '.join(others)}"
        )
    return algorithm.load()(topology, collective, options)


def _finish(topology: Topology, schedule: Schedule, options: Options, size_range: tuple[int, int | None] | None,
            candidates: tuple[Candidate, ...] = ()) -> Compiled:
    proof = verify(schedule)
    sim = simulate(topology, schedule, options.size_bytes)
    bound = lower_bound(topology, schedule.collective, options.size_bytes, options.root)
    low, high = size_range if size_range else (0, None)
    schedule = schedule.with_metadata(
        topology=topology.name,
        topology_file=topology.source,
        fingerprint=topology.fingerprint,
        min_bytes=low,
        max_bytes=high,
        size_bytes=options.size_bytes,
        predicted_time_s=sim.time_s,
    )
    return Compiled(schedule, proof, sim, bound, candidates)


def compile_schedule(topology: Topology, collective: str, algorithm: str = "auto", options: Options | None = None,
                     *, size_range: tuple[int, int | None] | None = None) -> Compiled:
    """Compile ``collective`` on ``topology`` with ``algorithm`` (or the fastest, for ``auto``).

    The result is verified (a :class:`~planner.errors.VerificationError` here is a
    planner bug, never silently written) and simulated at ``options.size_bytes``.
    """
    collective = canonical_collective(collective)
    options = options or Options()
    if algorithm != "auto":
        return _finish(topology, _build(topology, collective, algorithm, options), options, size_range)
    names = [a.name for a in ALGORITHMS.values() if collective in a.collectives]
    best: tuple[float, Schedule] | None = None
    candidates: list[Candidate] = []
    for name in names:
        limit = ALGORITHMS[name].auto_max_ranks
        if limit is not None and topology.size > limit:
            candidates.append(Candidate(name, None, 0.0, reason=f"auto skips it above {limit} ranks, where it "
                                        f"costs too much to compile; ask for it with --algorithm {name}"))
            continue
        started = time.perf_counter()
        try:
            schedule = _build(topology, collective, name, options)
            verify(schedule)
            predicted = simulate(topology, schedule, options.size_bytes).time_s
        except (NotApplicableError, SimulationError, InfeasibleError) as exc:
            candidates.append(Candidate(name, None, time.perf_counter() - started, reason=exc.message))
            continue
        candidates.append(Candidate(name, predicted, time.perf_counter() - started, schedule.op_count))
        if best is None or predicted < best[0]:
            best = (predicted, schedule)
    if best is None:
        reasons = "; ".join(f"{c.algorithm}: {c.reason}" for c in candidates)
        raise NotApplicableError(f"no algorithm applies to {collective} on {topology.name} ({reasons})")
    return _finish(topology, best[1], options, size_range, tuple(candidates))


def bucket_sizes(low: int, high: int, factor: int = 4) -> list[int]:
    """Representative sizes from ``low`` to ``high``, ``factor`` apart (both ends included)."""
    sizes = [low]
    while sizes[-1] * factor < high:
        sizes.append(sizes[-1] * factor)
    if sizes[-1] != high:
        sizes.append(high)
    return sizes


def compile_plan(topology: Topology, collective: str, low: int, high: int, algorithm: str = "auto",
                 options: Options | None = None) -> tuple[Plan, list[Compiled]]:
    """Compile one schedule per size bucket over ``[low, high]`` and merge buckets that chose the same one.

    Each representative size is compiled (and, for ``auto``, raced) on its own;
    bucket edges lie at the geometric mean of neighbouring sizes.  The first
    bucket starts at 0 and the last is open-ended, so every size has a schedule.
    """
    options = options or Options()
    sizes = bucket_sizes(low, high)
    edges = [0] + [int((a * b) ** 0.5) for a, b in itertools.pairwise(sizes)] + [None]
    compiled: list[Compiled] = []
    for size, lo, hi in zip(sizes, edges, edges[1:]):
        result = compile_schedule(topology, collective, algorithm, replace(options, size_bytes=size),
                                  size_range=(lo, hi))  # type: ignore[arg-type]  # lo is never None
        previous = compiled[-1].schedule if compiled else None
        if previous is not None and previous.programs == result.schedule.programs and (
                previous.metadata.algorithm == result.schedule.metadata.algorithm):
            compiled[-1] = replace(compiled[-1], schedule=previous.with_metadata(max_bytes=hi))
            continue
        compiled.append(result)
    return Plan(tuple(c.schedule for c in compiled)), compiled


# --------------------------------------------------------------------------- finding topologies


def _shipped_dirs() -> list[Path]:
    """Where shipped topologies live: the source tree (editable install) or the installed share folder."""
    return [Path(__file__).resolve().parent.parent / "topologies", Path(sys.prefix) / "share" / "topocc" / "topologies"]


def shipped_topologies() -> dict[str, Path]:
    """Shipped topology files by name (file stem)."""
    found: dict[str, Path] = {}
    for folder in _shipped_dirs():
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return found


def resolve_topology(arg: str) -> Topology:
    """Load a topology from a path, or by the name of a shipped one (``dgx1-v100``)."""
    path = Path(arg)
    if path.exists() or path.suffix in (".yaml", ".yml"):
        return load_topology(path)
    shipped = shipped_topologies()
    if arg in shipped:
        return load_topology(shipped[arg])
    raise UsageError(f"no topology file or shipped topology named {arg!r}",
                     fix=f"pass a YAML path or one of: {', '.join(shipped) or '(none shipped)'}")


def schedule_topology(schedule: Schedule, schedule_path: str | Path | None = None,
                      override: str | None = None) -> Topology:
    """The topology a schedule was compiled for: ``override``, else the file or shipped name it records.

    The topology's fingerprint must match the schedule's, so a schedule is never
    simulated on a cluster it was not compiled for.
    """
    meta = schedule.metadata
    tried: list[str] = []
    candidates: list[Path | str] = []
    if override:
        candidates.append(override)
    else:
        if meta.topology_file:
            candidates.append(Path(meta.topology_file))
            if schedule_path is not None:
                candidates.append(Path(schedule_path).parent / meta.topology_file)
        if meta.topology:
            candidates.append(meta.topology)
    topology = None
    for candidate in candidates:
        try:
            topology = resolve_topology(str(candidate))
            break
        except TopoccError as exc:
            tried.append(f"{candidate} ({exc.message})")
    if topology is None:
        raise UsageError(
            "cannot find the topology this schedule was compiled for"
            + (f": tried {', '.join(tried)}" if tried else " (the schedule names none)"),
            fix="pass --topology TOPO.yaml",
        )
    if topology.size != schedule.ranks:
        raise SimulationError(
            f"the schedule has {schedule.ranks} ranks but topology {topology.name} has {topology.size}",
            fix="pass the topology the schedule was compiled for",
        )
    if meta.fingerprint and meta.fingerprint != topology.fingerprint and not override:
        raise SimulationError(
            f"topology {topology.name} has changed since the schedule was compiled (fingerprint mismatch)",
            fix="recompile the schedule, or pass --topology to simulate it on this topology anyway",
        )
    return topology


def compile_shipped(out_dir: str | Path, names: Iterable[str] | None = None, *, collective: str = "allreduce",
                    algorithm: str = "auto", size_bytes: int = 64 << 20) -> list[tuple[Path, Compiled]]:
    """Compile ``collective`` for each shipped topology into ``out_dir`` (the ``schedules/`` folder)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shipped = shipped_topologies()
    written = []
    for name in names or shipped:
        topology = resolve_topology(name)
        compiled = compile_schedule(topology, collective, algorithm, Options(size_bytes=size_bytes))
        # the recorded topology file is the shipped name, so the schedule resolves on any checkout
        schedule = compiled.schedule.with_metadata(topology_file=None)
        suffix = ".json.gz" if schedule.op_count > 50_000 else ".json"
        path = out / f"{topology.name}-{collective}{suffix}"
        save_schedule(schedule, path)
        written.append((path, replace(compiled, schedule=schedule)))
    return written
