"""Timing candidate schedules: the busiest link's time (a bound found without events), the least latency of
any message, and an :class:`Evaluator` that runs the simulator for one compilation.
"""

from __future__ import annotations

import math

from topocc.planner.analysis.bounds import Bound, lower_bound
from topocc.planner.analysis.simulate import SimResult, chunk_bytes, simulate, simulate_within
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Network
from topocc.planner.routing.paths import connection_chunks, recorded_paths
from topocc.planner.topology.model import Topology
from topocc.runtime.schedule import Schedule

__all__ = ["Evaluator", "least_latency", "link_time"]


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


class Evaluator:
    """The simulator for one compilation: its network, its size, and the last schedule it timed to the end.

    The compiler makes one per compilation and hands it to the algorithms in
    :class:`~topocc.planner.compiler.options.Options`.  An algorithm that
    chooses between schedules of its own by simulating them (hierarchical's
    all-reduce layouts) times them here, and when the compiler then times the
    schedule it returned (the very object), the result it kept answers: the
    winner is simulated once.  It keeps one result, the latest, as the caller
    holds that schedule anyway.
    """

    def __init__(self, net: Network, size_bytes: int) -> None:
        self.net = net
        self.size_bytes = size_bytes
        self._last: tuple[Schedule, SimResult] | None = None

    def simulate(self, schedule: Schedule) -> SimResult:
        """The simulation of ``schedule`` at this size."""
        found = self._kept(schedule)
        if found is None:
            found = simulate(self.net, schedule, self.size_bytes)
            self._last = (schedule, found)
        return found

    def within(self, schedule: Schedule, deadline_s: float) -> SimResult | None:
        """:meth:`simulate`, given up (None) once the simulated clock passes ``deadline_s`` with work left."""
        found = self._kept(schedule)
        if found is not None:
            return found if found.time_s <= deadline_s else None
        found = simulate_within(self.net, schedule, self.size_bytes, deadline_s)
        if found is not None:
            self._last = (schedule, found)
        return found

    def lower_bound(self, collective: str, root: int = 0) -> Bound:
        """The lower bound of ``collective`` at this size (:func:`~topocc.planner.analysis.bounds.lower_bound`)."""
        return lower_bound(self.net, collective, self.size_bytes, root)

    def _kept(self, schedule: Schedule) -> SimResult | None:
        last = self._last
        return last[1] if last is not None and last[0] is schedule else None
