"""The front door: compile a collective for a topology into a verified, timed schedule.

``compile_schedule`` runs one named algorithm, or ``auto``: every algorithm that
supports the collective, each verified and simulated, the fastest kept.  Nothing
leaves this module unverified.  It also finds topologies by name (the shipped
ones) and the topology a schedule was compiled for.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from topocc.planner.compiler.algorithms import ALGORITHMS, Options, get_algorithm
from topocc.planner.analysis.bounds import Bound, lower_bound
from topocc.planner.analysis.collectives import canonical_collective
from topocc.planner.collector import rare_collections
from topocc.planner.errors import (
    InfeasibleError,
    NotApplicableError,
    SimulationError,
    TopoccError,
    UsageError,
    VerificationError,
)
from topocc.planner.routing.paths import assign_paths, connection_chunks, recorded_paths, spread_channels
from topocc.planner.analysis.simulate import SimResult, chunk_bytes, simulate, simulate_within
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import load_topology
from topocc.planner.units import format_size, format_time
from topocc.planner.analysis.verify import VerifyReport, verify
from topocc.runtime.plan import Plan
from topocc.runtime.schedule import Schedule, save_schedule

__all__ = [
    "Candidate",
    "Compiled",
    "Progress",
    "ProgressFn",
    "compile_plan",
    "compile_schedule",
    "compile_shipped",
    "compiled_for",
    "least_latency",
    "link_time",
    "resolve_topology",
    "schedule_topology",
    "scheduled_topologies",
    "shipped_topologies",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One algorithm tried by ``auto``: its simulated time, or why it did not apply.

    ``link_time_s`` is, for a candidate that was built, its busiest link's time
    (:func:`link_time`): a lower bound of its simulated time, so the bound of
    one that was not simulated because it cannot win.
    """

    algorithm: str
    time_s: float | None
    compile_s: float
    operations: int = 0
    reason: str | None = None
    link_time_s: float | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """One event of a compilation, for a progress display.

    In an ``auto`` race, ``phase`` is ``build``, ``simulate`` or ``verify`` when
    that phase of candidate ``index`` (of ``total``) starts, and ``done`` when
    the candidate is settled (``candidate`` says how); ``elapsed_s`` counts from
    the start of the race.  While a plan is compiled, ``bucket`` names the size
    bucket (``bucket 2/6 (64KiB)``) and the plan adds its own events: ``bucket``
    as a bucket starts and ``bucket done`` (``candidate``: the winner) as it
    ends, with ``index``/``total`` counting buckets and ``elapsed_s`` from the
    start of the plan.
    """

    algorithm: str
    phase: str
    index: int
    total: int
    elapsed_s: float
    candidate: Candidate | None = None
    bucket: str = ""

    def describe(self) -> str:
        """One status line: ``[2/8] tree: simulate (3.1 s)``, or how the candidate or bucket was settled."""
        head = f"{self.bucket} [{self.index}/{self.total}] {self.algorithm}".lstrip()
        clock = f"{self.elapsed_s:.1f} s"
        c = self.candidate
        if self.phase == "bucket":
            return f"{self.bucket}: compile with {self.algorithm} ({clock})"
        if self.phase == "bucket done" and c is not None and c.time_s is not None:
            return (f"{self.bucket}: {c.algorithm}, {format_time(c.time_s)}, {c.operations:,} operations "
                    f"({clock})")
        if self.phase == "verify":
            return f"{head}: verify the winner ({clock})"
        if c is None:
            return f"{head}: {self.phase} ({clock})"
        if c.time_s is None:
            return f"{head}: {c.reason} ({clock})"
        return f"{head}: {format_time(c.time_s)}, {c.operations:,} operations, {c.compile_s:.1f} s ({clock})"


ProgressFn = Callable[[Progress], None]


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
    # on a source-routed fabric every connection is given its path before the schedule is timed; under
    # ECMP its channels are renumbered to spread the connections over the paths, where that unloads the
    # busiest link (fattree-64-4to1 hierarchical all-gather at 256 MiB: 66.7% of the bound with the
    # algorithm's channels, whose hashes collide on the leaves' uplinks)
    schedule = assign_paths(topology, algorithm.load()(topology, collective, options))
    spread = spread_channels(topology, schedule)
    if spread is not schedule and (link_time(topology, spread, options.size_bytes)
                                   < link_time(topology, schedule, options.size_bytes) * (1 - 1e-9)):
        return spread
    return schedule


def link_time(topology: Topology, schedule: Schedule, size_bytes: int) -> float:
    """A lower bound of :func:`~topocc.planner.analysis.simulate.simulate`'s time: the busiest link's bytes over its bandwidth.

    Every connection's messages follow the paths the simulator gives them (the
    schedule's recorded path on a source-routed topology, else
    :meth:`Topology.route_shares` of the connection), and the simulator never
    lets the flows on a link exceed its bandwidth (max-min fair rates are
    feasible), so no schedule finishes before its most loaded link has carried
    its load.  Costs one pass over the sends, no events.
    """
    cb = chunk_bytes(schedule, size_bytes)
    recorded = recorded_paths(topology, schedule)
    load: dict[tuple[str, str], float] = {}
    for (a, b, channel), chunks in connection_chunks(schedule).items():
        if not topology.has_route(a, b):
            continue  # the simulator refuses the schedule; it says why
        path = recorded.get((a, b, channel))
        shares = topology.route_shares(a, b, channel) if path is None else {(ln.src, ln.dst): 1.0 for ln in path}
        for key, share in shares.items():
            load[key] = load.get(key, 0.0) + share * chunks * cb
    link = topology.link
    return max((v / link(*key).bandwidth for key, v in load.items()), default=0.0)  # type: ignore[union-attr]


#: ``auto`` stops racing (skips the costlier tiers, :attr:`~topocc.planner.compiler.algorithms.Algorithm.auto_tier`) once its
#: best schedule reaches this share of the lower bound: no other can gain more than 3%, and the costly
#: builders take seconds to minutes (issue #11's targets: 97% of the bound, 95% for all-reduce).  At 98%,
#: rail-8x8's all-reduce (hierarchical at 97.6%) went on to build and simulate tree packing (83.4%) and
#: MultiTree (92.7%): 20 s instead of 6.
GOOD_ENOUGH = 0.97


def least_latency(topology: Topology) -> float:
    """A lower bound of any message's latency between two ranks: the least latency of a route's first link
    plus that of a last one (one link, where it joins two ranks).

    Routes cross no other GPU, so a route's first link leaves its sender and its last enters its receiver;
    they are two links unless the route is one, which then joins two ranks.
    """
    def compute() -> float:
        ranks = set(topology.ranks)
        into = min((ln.latency for ln in topology.links if ln.dst in ranks and ln.src not in ranks),
                   default=math.inf)
        best = math.inf
        for ln in topology.links:
            if ln.src in ranks:
                best = min(best, ln.latency if ln.dst in ranks else ln.latency + into)
        return best if math.isfinite(best) else 0.0

    return topology.derived("compile.least_latency", compute)


#: Schedules with at least this many operations are verified in a forked process while the planner
#: simulates, on the machine's other core (fattree-1024: 9 s of proof behind 15 s of simulation;
#: fattree-64-4to1's 1 MiB reduce-scatter: 1.1 s of a 7 s compile).
PARALLEL_VERIFY_OPS = 20_000


class _Verification:
    """``verify(schedule)``, started in a forked child for large schedules where the platform forks.

    The child inherits the schedule (nothing is pickled but the small report or
    the error's text); :meth:`result` waits for it, and verifies in this process
    when there is no child or it died.
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self._child: multiprocessing.process.BaseProcess | None = None
        if schedule.op_count >= PARALLEL_VERIFY_OPS and "fork" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("fork")
            self._conn, sender = context.Pipe(duplex=False)
            self._child = context.Process(target=_verify_to, args=(sender, schedule), daemon=True)
            self._child.start()
            sender.close()

    def result(self) -> VerifyReport:
        if self._child is None:
            return verify(self.schedule)
        try:
            outcome = self._conn.recv()
        except EOFError:  # the child died (killed, out of memory): prove it here
            outcome = (True, verify(self.schedule))
        finally:
            self.cancel()
        if outcome[0]:
            return outcome[1]
        _, message, where, fix = outcome
        raise VerificationError(message, where=where, fix=fix)

    def cancel(self) -> None:
        if self._child is not None:
            if self._child.is_alive():
                self._child.terminate()
            self._child.join()
            self._conn.close()
            self._child = None


def _verify_to(conn: multiprocessing.connection.Connection, schedule: Schedule) -> None:
    try:
        conn.send((True, verify(schedule)))
    except VerificationError as exc:
        conn.send((False, exc.message, exc.where, exc.fix))
    finally:
        conn.close()


def _finish(topology: Topology, schedule: Schedule, options: Options, size_range: tuple[int, int | None] | None,
            candidates: tuple[Candidate, ...] = (), sim: SimResult | None = None,
            verification: _Verification | None = None) -> Compiled:
    verification = verification or _Verification(schedule)
    try:
        sim = sim or simulate(topology, schedule, options.size_bytes)
    finally:
        proof = verification.result()
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


@rare_collections()
def compile_schedule(topology: Topology, collective: str, algorithm: str = "auto", options: Options | None = None,
                     *, size_range: tuple[int, int | None] | None = None,
                     progress: ProgressFn | None = None) -> Compiled:
    """Compile ``collective`` on ``topology`` with ``algorithm`` (or the fastest, for ``auto``).

    The result is verified (a :class:`~topocc.planner.errors.VerificationError` here is a
    planner bug, never silently written) and simulated at ``options.size_bytes``.

    ``auto`` builds every applicable algorithm, then simulates them in order of
    :func:`link_time` (first, of those within 1% of the least, the one of most
    operations, the finest pipeline) and skips one whose link time already exceeds the best
    simulated time (it cannot win: link time is a lower bound of its
    simulation), and gives up a simulation once its clock passes the best time;
    the winner is verified.  An algorithm whose schedules all have a chain of
    dependent messages (:attr:`Algorithm.min_chain`: the ring's p - 1) is built
    after the others of its tier are timed, and not at all when that chain
    times :func:`least_latency` already exceeds the best time: a 128-rank ring
    at 1 MiB cost most of the race and lost twenty-fold.  So is one with a
    :attr:`Algorithm.link_floor`, a bound of its link time found unbuilt.  ``progress`` is called
    as each candidate starts a phase and when it is settled.
    """
    collective = canonical_collective(collective)
    options = options or Options()
    if algorithm != "auto":
        return _finish(topology, _build(topology, collective, algorithm, options), options, size_range)
    names = [a.name for a in ALGORITHMS.values() if collective in a.collectives]
    race_start = time.perf_counter()
    settled: dict[str, Candidate] = {}

    def report(name: str, phase: str, candidate: Candidate | None = None) -> None:
        if progress is not None:
            progress(Progress(name, phase, names.index(name) + 1, len(names), time.perf_counter() - race_start,
                              candidate))

    def settle(candidate: Candidate) -> None:
        settled[candidate.algorithm] = candidate
        report(candidate.algorithm, "done", candidate)

    # a large candidate is proved in a forked child while the race goes on (kept if it wins)
    proofs: dict[str, _Verification] = {}
    best: tuple[float, int, Schedule, SimResult] | None = None  # (time, position in names, ...)
    tiers = sorted({ALGORITHMS[name].auto_tier for name in names})
    bound = lower_bound(topology, collective, options.size_bytes, options.root).time_s
    try:
        for tier in tiers:
            members = [name for name in names if ALGORITHMS[name].auto_tier == tier]
            if _near_bound(best, bound):
                for name in members:
                    settle(_good_enough(name, names, best, bound))
                continue
            best = _race(topology, collective, options, members, names, best, bound, proofs, report, settle)
        candidates = tuple(settled[name] for name in names)
        if best is None:
            reasons = "; ".join(f"{c.algorithm}: {c.reason}" for c in candidates)
            raise NotApplicableError(f"no algorithm applies to {collective} on {topology.name} ({reasons})")
        winner = names[best[1]]
        report(winner, "verify")
        return _finish(topology, best[2], options, size_range, candidates, best[3], proofs.pop(winner, None))
    finally:
        for proof in proofs.values():
            proof.cancel()


def _race(topology: Topology, collective: str, options: Options, members: list[str], names: list[str],
          best: tuple[float, int, Schedule, SimResult] | None, bound: float, proofs: dict[str, _Verification],
          report: Callable[..., None], settle: Callable[[Candidate], None],
          ) -> tuple[float, int, Schedule, SimResult] | None:
    """One tier of ``auto``: build ``members``, simulate them in order of link time against ``best``.

    Members with a :attr:`~topocc.planner.compiler.algorithms.Algorithm.min_chain` or a
    :attr:`~topocc.planner.compiler.algorithms.Algorithm.link_floor` are built after the others
    are timed, and not at all when their chain of dependent messages times
    :func:`least_latency`, or their link floor, already loses to the best.
    Returns the new best (time, position in ``names``, schedule, simulation).
    """
    first: list[str] = []
    chained: list[str] = []  # built last: a bound found unbuilt may spare their build
    for name in members:
        limit = ALGORITHMS[name].auto_max_ranks
        if limit is not None and topology.size > limit:
            settle(Candidate(name, None, 0.0, reason=f"auto skips it above {limit} ranks, where it "
                             f"costs too much to compile; ask for it with --algorithm {name}"))
            continue
        deferred = ALGORITHMS[name].min_chain is not None or ALGORITHMS[name].link_floor is not None
        (chained if deferred else first).append(name)
    best = _time_candidates(topology, collective, options, first, names, best, bound, proofs, report, settle)
    later = []
    for name in chained:
        started = time.perf_counter()  # a link floor may cost seconds (tree packing packs its trees)
        reason = None if best is None else _cannot_win(topology, collective, options, name, names[best[1]], best[0])
        if reason is not None:
            settle(Candidate(name, None, time.perf_counter() - started, reason=reason))
            continue
        if _near_bound(best, bound):
            settle(_good_enough(name, names, best, bound))
            continue
        later.append(name)
    return _time_candidates(topology, collective, options, later, names, best, bound, proofs, report, settle)


def _near_bound(best: tuple[float, int, Schedule, SimResult] | None, bound: float) -> bool:
    """Whether the best so far is within :data:`GOOD_ENOUGH` of the lower ``bound``: no other can gain more."""
    return best is not None and bound >= GOOD_ENOUGH * best[0]


def _good_enough(name: str, names: list[str], best: tuple[float, int, Schedule, SimResult], bound: float,
                 build_s: float = 0.0, operations: int = 0, link_time_s: float | None = None) -> Candidate:
    """``name`` settled untimed because the best so far is within :data:`GOOD_ENOUGH` of the lower bound."""
    return Candidate(name, None, build_s, operations, reason=f"not tried: {names[best[1]]} is already at "
                     f"{100 * bound / best[0]:.1f}% of the lower bound", link_time_s=link_time_s)


def _cannot_win(topology: Topology, collective: str, options: Options, name: str, leader: str,
                best_s: float) -> str | None:
    """Why algorithm ``name`` cannot beat ``leader``'s ``best_s`` unbuilt (its :attr:`~Algorithm.min_chain`
    or :attr:`~Algorithm.link_floor` already needs more), or None when it might."""
    algorithm = ALGORITHMS[name]
    if algorithm.min_chain is not None:
        hops = algorithm.min_chain(collective, topology.size)
        floor = hops * least_latency(topology)
        if floor * (1 - 1e-9) > best_s:
            return (f"cannot win: its chain of {hops} dependent messages alone needs {format_time(floor)}, "
                    f"more than {leader}'s {format_time(best_s)}")
    link_floor = algorithm.load_link_floor()
    if link_floor is not None:
        try:
            floor = link_floor(topology, collective, options)
        except (NotApplicableError, InfeasibleError):
            return None  # the build says why
        if floor * (1 - 1e-9) > best_s:
            return (f"cannot win: its busiest link alone needs {format_time(floor)}, more than {leader}'s "
                    f"{format_time(best_s)}")
    return None


def _time_candidates(topology: Topology, collective: str, options: Options, members: list[str], names: list[str],
                     best: tuple[float, int, Schedule, SimResult] | None, bound: float,
                     proofs: dict[str, _Verification], report: Callable[..., None], settle: Callable[[Candidate], None],
                     ) -> tuple[float, int, Schedule, SimResult] | None:
    """Build ``members``, then simulate each that can still win, in order of link time; returns the new best.

    Once the best is within :data:`GOOD_ENOUGH` of the lower ``bound`` the rest are not simulated, as the
    costlier tiers are not tried: none can gain more than 3%, and a simulation can take longer than the
    build (a 4x4x4 torus: tree packing's 65k operations simulate in 26 s where MultiTree's 129k take 2).
    """
    built: list[tuple[float, str, Schedule, float]] = []  # (link time, name, schedule, build seconds)
    for name in members:
        report(name, "build")
        started = time.perf_counter()
        try:
            schedule = _build(topology, collective, name, options)
        except (NotApplicableError, InfeasibleError) as exc:
            settle(Candidate(name, None, time.perf_counter() - started, reason=exc.message))
            continue
        built.append((link_time(topology, schedule, options.size_bytes), name, schedule,
                      time.perf_counter() - started))

    built.sort(key=lambda item: item[0])

    def likeliest(found: list[tuple[float, str, Schedule, float]]) -> tuple[float, str, Schedule, float]:
        """The likeliest winner: the least link time, and of those within 1% of it the most operations, the
        finest pipeline (fattree-1024: halving-doubling's 41,984 and hierarchical's 328,704 operations load
        the busiest link alike; hierarchical wins at 56% of the other's time)."""
        return max((c for c in found if c[0] <= found[0][0] * 1.01), key=lambda c: c[2].op_count)

    large = [c for c in built if c[2].op_count >= PARALLEL_VERIFY_OPS]
    if large and not proofs:  # the costly proof that runs beside the simulations
        _, name, schedule, _ = likeliest(large)
        proofs[name] = _Verification(schedule)
    if built:
        # simulated first, so that the others are given up once they pass it (fattree-1024 at 256 MiB:
        # halving-doubling stopped at hierarchical's 2.76 ms, not run to its 4.92 ms)
        first = likeliest(built)
        built.remove(first)
        built.insert(0, first)
    for floor, name, schedule, build_s in built:
        if best is not None and floor * (1 - 1e-9) > best[0]:  # the margin absorbs rounding in the sums
            settle(Candidate(name, None, build_s, schedule.op_count,
                             reason=f"cannot win: its busiest link alone needs {format_time(floor)}, "
                                    f"more than {names[best[1]]}'s {format_time(best[0])}", link_time_s=floor))
            continue
        if _near_bound(best, bound):
            settle(_good_enough(name, names, best, bound, build_s, schedule.op_count, floor))
            continue
        report(name, "simulate")
        started = time.perf_counter()
        try:  # given up once it passes the best: it cannot win (a tie still can, listed first)
            sim = simulate_within(topology, schedule, options.size_bytes,
                                  math.inf if best is None else best[0] * (1 + 1e-9))
        except SimulationError as exc:
            verify(schedule)  # a schedule that does not run is a planner bug unless it is correct
            settle(Candidate(name, None, build_s + time.perf_counter() - started, reason=exc.message,
                             link_time_s=floor))
            continue
        if sim is None:
            assert best is not None
            settle(Candidate(name, None, build_s + time.perf_counter() - started, schedule.op_count,
                             reason=f"cannot win: its simulation passed {names[best[1]]}'s {format_time(best[0])} "
                                    "with work left", link_time_s=floor))
            continue
        settle(Candidate(name, sim.time_s, build_s + time.perf_counter() - started, schedule.op_count,
                         link_time_s=floor))
        # ties go to the algorithm listed first, whatever order the race simulated them in
        if best is None or (sim.time_s, names.index(name)) < best[:2]:
            best = (sim.time_s, names.index(name), schedule, sim)
    return best
