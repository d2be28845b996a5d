"""``auto``: every algorithm that builds the collective, raced tier by tier, the fastest simulated one kept.

The race builds each applicable algorithm, then simulates them in order of
:func:`~topocc.planner.compiler.evaluate.link_time` (first, of those within 1%
of the least, the one of most operations, the finest pipeline) and skips one
whose link time already exceeds the best simulated time (it cannot win: link
time is a lower bound of its simulation), and gives up a simulation once its
clock passes the best time.  An algorithm whose schedules all have a chain of
dependent messages (:attr:`~topocc.planner.compiler.algorithms.Algorithm.min_chain`:
the ring's p - 1) is built after the others of its tier are timed, and not at
all when that chain times :func:`~topocc.planner.compiler.evaluate.least_latency`
already exceeds the best time; so is one with a
:attr:`~topocc.planner.compiler.algorithms.Algorithm.link_floor`, a bound of
its link time found unbuilt.  Once the best is within :data:`GOOD_ENOUGH` of
the lower bound, the costlier tiers are not tried.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from topocc.planner.analysis.simulate import SimResult
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.evaluate import Evaluator, least_latency
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.proof import Proof, forks
from topocc.planner.compiler.routed import routed_schedule
from topocc.planner.errors import InfeasibleError, NotApplicableError, SimulationError
from topocc.planner.routing.network import Network
from topocc.planner.units import format_time
from topocc.runtime.schedule import Schedule

__all__ = ["GOOD_ENOUGH", "Candidate", "Leader", "Outcome", "Progress", "ProgressFn", "race"]

#: ``auto`` stops racing (skips the costlier tiers, :attr:`~topocc.planner.compiler.algorithms.Algorithm.auto_tier`)
#: once its best schedule reaches this share of the lower bound: no other can gain more than 3%, and the costly
#: builders take seconds to minutes.  A higher bar sends races whose leader is already near the bound on to
#: those builders, which then seldom win.
GOOD_ENOUGH = 0.97


@dataclass(frozen=True, slots=True)
class Candidate:
    """One algorithm tried by ``auto``: its simulated time, or why it did not apply.

    ``link_time_s`` is, for a candidate that was built, its busiest link's time
    (:func:`~topocc.planner.compiler.evaluate.link_time`): a lower bound of its
    simulated time, so the bound of one that was not simulated because it cannot win.
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
class Leader:
    """The fastest candidate so far, by simulated time; a tie goes to the algorithm listed first."""

    time_s: float
    position: int  # in the algorithm table's order
    name: str
    schedule: Schedule  # in the form it is kept in
    sim: SimResult
    built: Schedule  # as its algorithm built it (rank by rank)

    def loses_to(self, time_s: float, position: int) -> bool:
        return (time_s, position) < (self.time_s, self.position)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a race settled: the winner, every candidate in table order, and the winner's proof if started."""

    leader: Leader
    candidates: tuple[Candidate, ...]
    proof: Proof | None


@dataclass(frozen=True, slots=True)
class _Built:
    """A candidate built and waiting to be timed."""

    link_time_s: float
    name: str
    schedule: Schedule
    build_s: float


def race(net: Network, collective: str, options: Options, evaluator: Evaluator,
         progress: ProgressFn | None = None) -> Outcome:
    """Race every algorithm that builds ``collective`` (see the module docstring); ``progress`` is called as
    each candidate starts a phase and when it is settled.  Raises :class:`NotApplicableError` when none
    applies."""
    return _Race(net, collective, options, evaluator, progress).run()


class _Race:
    """The state of one race: the candidates settled so far, the leader, and the proof started beside it."""

    def __init__(self, net: Network, collective: str, options: Options, evaluator: Evaluator,
                 progress: ProgressFn | None) -> None:
        self.net = net
        self.collective = collective
        self.options = options
        self.evaluator = evaluator
        self.progress = progress
        self.names = [a.name for a in ALGORITHMS.values() if collective in a.collectives]
        self.settled: dict[str, Candidate] = {}
        # a large candidate is proved in a forked child while the race goes on (kept if it wins)
        self.proofs: dict[str, Proof] = {}
        self.leader: Leader | None = None
        self.bound = evaluator.lower_bound(collective, options.root).time_s
        self.started = time.perf_counter()

    def run(self) -> Outcome:
        try:
            for tier in sorted({ALGORITHMS[name].auto_tier for name in self.names}):
                members = [name for name in self.names if ALGORITHMS[name].auto_tier == tier]
                if self._near_bound():
                    for name in members:
                        self._settle(self._good_enough(name))
                    continue
                self._tier(members)
            candidates = tuple(self.settled[name] for name in self.names)
            if self.leader is None:
                reasons = "; ".join(f"{c.algorithm}: {c.reason}" for c in candidates)
                raise NotApplicableError(
                    f"no algorithm applies to {self.collective} on {self.net.topology.name} ({reasons})")
            self._report(self.leader.name, "verify")
            return Outcome(self.leader, candidates, self.proofs.pop(self.leader.name, None))
        finally:
            for proof in self.proofs.values():
                proof.cancel()

    # ---- events

    def _report(self, name: str, phase: str, candidate: Candidate | None = None) -> None:
        if self.progress is not None:
            self.progress(Progress(name, phase, self.names.index(name) + 1, len(self.names),
                                   time.perf_counter() - self.started, candidate))

    def _settle(self, candidate: Candidate) -> None:
        self.settled[candidate.algorithm] = candidate
        self._report(candidate.algorithm, "done", candidate)

    # ---- one tier

    def _tier(self, members: list[str]) -> None:
        """Build ``members`` and time them against the leader; those with a
        :attr:`~topocc.planner.compiler.algorithms.Algorithm.min_chain` or a
        :attr:`~topocc.planner.compiler.algorithms.Algorithm.link_floor` are built after the others are timed,
        and not at all when their chain of dependent messages times :func:`least_latency`, or their link
        floor, already loses to the leader."""
        first: list[str] = []
        chained: list[str] = []  # built last: a bound found unbuilt may spare their build
        for name in members:
            limit = ALGORITHMS[name].auto_max_ranks
            if limit is not None and self.net.topology.size > limit:
                self._settle(Candidate(name, None, 0.0, reason=f"auto skips it above {limit} ranks, where it "
                                       f"costs too much to compile; ask for it with --algorithm {name}"))
                continue
            deferred = ALGORITHMS[name].min_chain is not None or ALGORITHMS[name].link_floor is not None
            (chained if deferred else first).append(name)
        self._time(first)
        later = []
        for name in chained:
            started = time.perf_counter()  # a link floor may cost seconds (tree packing packs its trees)
            reason = None if self.leader is None else self._cannot_win(name, self.leader)
            if reason is not None:
                self._settle(Candidate(name, None, time.perf_counter() - started, reason=reason))
                continue
            if self._near_bound():
                self._settle(self._good_enough(name))
                continue
            later.append(name)
        self._time(later)

    def _near_bound(self) -> bool:
        """Whether the leader is within :data:`GOOD_ENOUGH` of the lower bound: no other can gain more."""
        return self.leader is not None and self.bound >= GOOD_ENOUGH * self.leader.time_s

    def _good_enough(self, name: str, build_s: float = 0.0, operations: int = 0,
                     link_time_s: float | None = None) -> Candidate:
        """``name`` settled untimed because the leader is within :data:`GOOD_ENOUGH` of the lower bound."""
        assert self.leader is not None
        return Candidate(name, None, build_s, operations, reason=f"not tried: {self.leader.name} is already at "
                         f"{100 * self.bound / self.leader.time_s:.1f}% of the lower bound", link_time_s=link_time_s)

    def _cannot_win(self, name: str, leader: Leader) -> str | None:
        """Why algorithm ``name`` cannot beat the leader unbuilt (its chain of dependent messages or its link
        floor already needs more), or None when it might."""
        algorithm = ALGORITHMS[name]
        best_s = leader.time_s
        if algorithm.min_chain is not None:
            hops = algorithm.min_chain(self.collective, self.net.topology.size)
            floor = hops * least_latency(self.net.topology)
            if floor * (1 - 1e-9) > best_s:
                return (f"cannot win: its chain of {hops} dependent messages alone needs {format_time(floor)}, "
                        f"more than {leader.name}'s {format_time(best_s)}")
        link_floor = algorithm.load_link_floor()
        if link_floor is not None:
            try:
                floor = link_floor(self.net, self.collective, self.options)
            except (NotApplicableError, InfeasibleError):
                return None  # the build says why
            if floor * (1 - 1e-9) > best_s:
                return (f"cannot win: its busiest link alone needs {format_time(floor)}, more than {leader.name}'s "
                        f"{format_time(best_s)}")
        return None

    # ---- building and timing

    def _time(self, members: list[str]) -> None:
        """Build ``members``, then simulate each that can still win, in order of link time.

        Once the leader is within :data:`GOOD_ENOUGH` of the lower bound the rest are not simulated, as the
        costlier tiers are not tried: none can gain more than 3%, and a simulation can take longer than the
        build (contending flows cost the simulator more than operations do).
        """
        built = self._build_all(members)
        self._prove_likeliest(built)
        if built:
            # the likeliest winner first, so that the others are given up once they pass its time instead of
            # being simulated to the end
            first = _likeliest(built)
            built.remove(first)
            built.insert(0, first)
        for candidate in built:
            self._time_one(candidate)

    def _build_all(self, members: list[str]) -> list[_Built]:
        """Build ``members``; those that apply, by link time."""
        built: list[_Built] = []
        for name in members:
            self._report(name, "build")
            started = time.perf_counter()
            try:
                schedule = routed_schedule(self.net, self.collective, name, self.options)
            except (NotApplicableError, InfeasibleError) as exc:
                self._settle(Candidate(name, None, time.perf_counter() - started, reason=exc.message))
                continue
            built.append(_Built(self.evaluator.link_time(schedule), name, schedule,
                                time.perf_counter() - started))
        built.sort(key=lambda c: c.link_time_s)
        return built

    def _prove_likeliest(self, built: list[_Built]) -> None:
        """Start the proof of the likeliest large winner beside the simulations (one per race), in the form it
        is kept in (:meth:`~topocc.planner.compiler.evaluate.Evaluator.form`): a symmetric one is proved by
        class where it can be."""
        large = [c for c in built if forks(c.schedule)]
        if large and not self.proofs:
            chosen = _likeliest(large)
            self.proofs[chosen.name] = Proof(self.evaluator.form(chosen.schedule), chosen.schedule)

    def _time_one(self, c: _Built) -> None:
        """Simulate ``c`` unless it cannot win, given up once it passes the leader; settle it."""
        leader = self.leader
        if leader is not None and c.link_time_s * (1 - 1e-9) > leader.time_s:  # the margin absorbs rounding
            self._settle(Candidate(c.name, None, c.build_s, c.schedule.op_count,
                                   reason=f"cannot win: its busiest link alone needs {format_time(c.link_time_s)}, "
                                          f"more than {leader.name}'s {format_time(leader.time_s)}",
                                   link_time_s=c.link_time_s))
            return
        if self._near_bound():
            self._settle(self._good_enough(c.name, c.build_s, c.schedule.op_count, c.link_time_s))
            return
        self._report(c.name, "simulate")
        started = time.perf_counter()
        try:  # given up once it passes the leader: it cannot win (a tie still can, listed first)
            sim = self.evaluator.within(c.schedule, math.inf if leader is None else leader.time_s * (1 + 1e-9))
        except SimulationError as exc:
            verify(c.schedule)  # a schedule that does not run is a planner bug unless it is correct
            self._settle(Candidate(c.name, None, c.build_s + time.perf_counter() - started, reason=exc.message,
                                   link_time_s=c.link_time_s))
            return
        spent = c.build_s + time.perf_counter() - started
        if sim is None:
            assert leader is not None
            self._settle(Candidate(c.name, None, spent, c.schedule.op_count,
                                   reason=f"cannot win: its simulation passed {leader.name}'s "
                                          f"{format_time(leader.time_s)} with work left", link_time_s=c.link_time_s))
            return
        self._settle(Candidate(c.name, sim.time_s, spent, c.schedule.op_count, link_time_s=c.link_time_s))
        position = self.names.index(c.name)
        if leader is None or leader.loses_to(sim.time_s, position):
            self.leader = Leader(sim.time_s, position, c.name, self.evaluator.form(c.schedule), sim, c.schedule)


def _likeliest(found: list[_Built]) -> _Built:
    """The likeliest winner of ``found`` (sorted by link time): the least link time, and of those within 1% of
    it the most operations, the finest pipeline: schedules that load the busiest link alike differ in how
    well they overlap, and the finer pipeline overlaps more."""
    return max((c for c in found if c.link_time_s <= found[0].link_time_s * 1.01), key=lambda c: c.schedule.op_count)
