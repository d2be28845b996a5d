"""Timing candidate schedules: the busiest link's time (a bound found without events), the least latency of
any message, and an :class:`Evaluator` that runs the simulator for one compilation.
"""

from __future__ import annotations

import math

import numpy as np

from topocc.planner.analysis.automorphisms import Orbits, has_symmetries, schedule_orbits
from topocc.planner.analysis.bounds import Bound, lower_bound
from topocc.planner.analysis.simulate import SimResult, chunk_bytes, simulate, simulate_within
from topocc.planner.compiler.symmetrize import SYMMETRIC_MIN_RANKS, symmetric_form
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Network
from topocc.planner.routing.paths import connection_chunks, recorded_paths
from topocc.planner.topology.model import Topology
from topocc.runtime.schedule import Schedule

__all__ = ["BY_CLASS_MIN_OPS", "Evaluator", "by_class_may_pay", "least_latency", "link_time"]


def link_time(net: Network, schedule: Schedule, size_bytes: int) -> float:
    """A lower bound of :func:`~topocc.planner.analysis.simulate.simulate`'s time: the busiest link's bytes
    over its bandwidth.

    Every connection's messages follow the paths the simulator gives them (the
    schedule's recorded path on a source-routed topology, else
    :meth:`~topocc.planner.routing.network.Network.route_shares` of the connection), and the simulator never
    lets the flows on a link exceed its bandwidth (max-min fair rates are
    feasible), so no schedule finishes before its most loaded link has carried
    its load.  Costs one pass over the sends, no events.
    """
    cb = chunk_bytes(schedule, size_bytes)
    orbits = schedule_orbits(net, schedule)
    if orbits is not None:
        return _link_time_by_class(net, schedule, cb, orbits)
    recorded = recorded_paths(net, schedule)
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    for (a, b, channel), chunks in connection_chunks(schedule).items():
        if not net.has_route(a, b):
            continue  # the simulator refuses the schedule; it says why
        path = recorded.get((a, b, channel))
        shares = net.route_shares(a, b, channel) if path is None else {(ln.src, ln.dst): 1.0 for ln in path}
        for key, share in shares.items():
            load.add(key, share * chunks * cb)
    bandwidth = net.topology.bandwidth
    return load.busiest(lambda key: bandwidth(*key))


def _link_time_by_class(net: Network, schedule: Schedule, cb: float, orbits: Orbits) -> float:
    """:func:`link_time` from one rank per orbit: a representative's connection stands for its orbit's
    ``copies``, whose loads fall on the same orbits of links, and the links of an orbit carry equal loads
    (the symmetries map each onto the others), so each carries its orbit's load over its link count."""
    topo = net.topology
    index = orbits.link_index
    load = np.zeros(len(orbits.link_count))
    for (a, b, channel), chunks in connection_chunks(schedule, orbits.reps).items():
        if not net.has_route(a, b):
            continue  # the simulator refuses the schedule; it says why
        for key, share in net.route_shares(a, b, channel).items():
            load[orbits.link_orbit[index[key]]] += share * chunks * cb
    per_link = load * orbits.copies / orbits.link_count
    bandwidth = np.zeros(len(orbits.link_count))
    bandwidth[orbits.link_orbit] = [topo.bandwidth(link.src, link.dst) for link in topo.links]
    return float((per_link / bandwidth).max(initial=0.0))


def least_latency(topology: Topology) -> float:
    """A lower bound of any message's latency between two ranks: the least latency of a route's first link
    plus that of a last one (one link, where it joins two ranks).

    Routes cross no other GPU, so a route's first link leaves its sender and its last enters its receiver;
    they are two links unless the route is one, which then joins two ranks.
    """
    ranks = set(topology.ranks)
    into = min((ln.latency for ln in topology.links if ln.dst in ranks and ln.src not in ranks), default=math.inf)
    best = math.inf
    for ln in topology.links:
        if ln.src in ranks:
            best = min(best, ln.latency if ln.dst in ranks else ln.latency + into)
    return best if math.isfinite(best) else 0.0


#: Schedules of fewer operations are timed rank by rank: finding the classes costs about half a simulation
#: of every rank, which the replay by class saves only where it finds them, and small schedules simulate fast.
BY_CLASS_MIN_OPS = 200_000


def by_class_may_pay(net: Network, schedule: Schedule) -> bool:
    """Whether to look for ``schedule``'s symmetric form to time it by class: a large schedule on a sprayed
    network with symmetries.  Elsewhere the routes seldom allow it (ECMP hashes a pair's channels onto one of
    its paths, which no symmetry carries onto its image's) and the search would cost more than it saves."""
    return (schedule.op_count >= BY_CLASS_MIN_OPS and schedule.ranks >= SYMMETRIC_MIN_RANKS
            and net.topology.routing == "spray" and has_symmetries(net))


#: Schedules whose forms an :class:`Evaluator` keeps: a tier's candidates, timed after all are built.
_FORMS_KEPT = 4


class Evaluator:
    """The simulator for one compilation: its network, its size, the forms of its schedules and the last one
    it timed.

    The compiler makes one per compilation and hands it to the algorithms in
    :class:`~topocc.planner.compiler.options.Options`.  An algorithm that
    chooses between schedules of its own by simulating them (hierarchical's
    all-reduce layouts) times them here, and when the compiler then times the
    schedule it returned (the very object), the result it kept answers: the
    winner is simulated once.  It keeps one result, the latest, as the caller
    holds that schedule anyway, and the forms (below) of the last few schedules it saw.

    A large schedule on a sprayed network with symmetries (:func:`by_class_may_pay`) is kept in its symmetric
    form (:func:`~topocc.planner.compiler.symmetrize.symmetric_form`, the form it is written in:
    :meth:`form`), and timed in it where the simulator replays it one rank per orbit
    (:mod:`~topocc.planner.analysis.automorphisms`), else as it was built.
    """

    def __init__(self, net: Network, size_bytes: int) -> None:
        self.net = net
        self.size_bytes = size_bytes
        # each schedule's form and the form it is timed in, by the schedule's identity (kept alive with it)
        self._form_of: dict[int, tuple[Schedule, Schedule, Schedule]] = {}
        # the last schedule timed and its time (None: not timed to the end)
        self._last: tuple[Schedule, SimResult | None] | None = None

    def simulate(self, schedule: Schedule) -> SimResult:
        """The simulation of ``schedule`` at this size."""
        _, timed = self._forms(schedule)
        found = self._kept(schedule)
        if found is None:
            found = simulate(self.net, timed, self.size_bytes)
            self._last = (schedule, found)
        return found

    def within(self, schedule: Schedule, deadline_s: float) -> SimResult | None:
        """:meth:`simulate`, given up (None) once the simulated clock passes ``deadline_s`` with work left."""
        _, timed = self._forms(schedule)
        found = self._kept(schedule)
        if found is not None:
            return found if found.time_s <= deadline_s else None
        found = simulate_within(self.net, timed, self.size_bytes, deadline_s)
        self._last = (schedule, found)
        return found

    def link_time(self, schedule: Schedule) -> float:
        """:func:`link_time` of ``schedule``, found one rank per orbit where it is timed so."""
        return link_time(self.net, self._forms(schedule)[1], self.size_bytes)

    def form(self, schedule: Schedule) -> Schedule:
        """``schedule`` as it is kept and written: its symmetric form where :func:`by_class_may_pay` and it has
        one, else itself."""
        return self._forms(schedule)[0]

    def _forms(self, schedule: Schedule) -> tuple[Schedule, Schedule]:
        """``schedule``'s :meth:`form` and the form it is timed in: the symmetric one where the simulator
        replays it by class, else the schedule as built (its programs at hand, not built from classes)."""
        known = self._form_of.get(id(schedule))
        if known is not None and known[0] is schedule:
            return known[1], known[2]
        form = timed = schedule
        if by_class_may_pay(self.net, schedule):
            form = symmetric_form(schedule, self.net.topology, SYMMETRIC_MIN_RANKS)
            if form is not schedule and schedule_orbits(self.net, form) is not None:
                timed = form
        self._form_of[id(schedule)] = (schedule, form, timed)
        if len(self._form_of) > _FORMS_KEPT:  # the oldest goes: a race holds its candidates, not more
            del self._form_of[next(iter(self._form_of))]
        return form, timed

    def lower_bound(self, collective: str, root: int = 0) -> Bound:
        """The lower bound of ``collective`` at this size (:func:`~topocc.planner.analysis.bounds.lower_bound`)."""
        return lower_bound(self.net, collective, self.size_bytes, root)

    def _kept(self, schedule: Schedule) -> SimResult | None:
        last = self._last
        return last[1] if last is not None and last[0] is schedule else None
