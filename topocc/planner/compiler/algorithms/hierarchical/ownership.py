"""Who owns what of a direct last level across hosts: fewer parts for the ranks of hosts behind slower NICs.

An all-reduce may choose who owns what, and BlueConnect's equal parts load a
host behind slower NICs as much as the others, so that its NICs carry a
multiple of the data each way and set the pace.  Where the last level runs
direct, its parts go to the members so as to even out the time their hosts'
NICs take, and the slow hosts own less or nothing.  Equal NICs keep equal
parts.
"""

from __future__ import annotations

import heapq

import numpy as np

from topocc.planner.analysis.automorphisms import hosts_alike, pair_orbits
from topocc.planner.compiler.algorithms.hierarchical.estimates import BY_ORBIT_MIN_RANKS
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import path_shares

__all__ = ["ownership"]


def _host_rates(net: Network, stage: Stage, channel: int) -> dict[int, float]:
    """Each rank's share of what its host's links to the outside carry, bytes/s: the lower of out and in.

    The links counted are those the routes of the stage's messages (each rank
    to its ring successor) cross out of a host (from a device of the host to
    one outside it) or into it, each counted once at its full bandwidth, and
    split evenly over the host's ranks: a host of 8 GPUs behind two 100 Gbit/s
    NICs gives each 3.125 GB/s, a DGX A100 (eight 200 Gbit/s NICs) 25 GB/s.
    Per host and not per rank, since one sampled route per rank says which
    NICs a host uses but not how its ranks would share them.
    """
    topology = net.topology
    place = {d.name: d.host or d.name for d in topology.devices}
    home = {r: place[topology.ranks[r]] for g in stage.groups for r in g}
    out: dict[str, set[tuple[str, str]]] = {}
    into: dict[str, set[tuple[str, str]]] = {}
    for g in stage.groups:
        for i, r in enumerate(g):
            for key in path_shares(net, r, g[(i + 1) % len(g)], channel):
                if place[key[0]] != place[key[1]]:
                    out.setdefault(place[key[0]], set()).add(key)
                    into.setdefault(place[key[1]], set()).add(key)
    members: dict[str, int] = {}
    for h in home.values():
        members[h] = members.get(h, 0) + 1
    bandwidth = topology.bandwidth

    def capacity(keys: set[tuple[str, str]]) -> float:
        total = 0.0
        for k in keys:
            total += bandwidth(*k)
        return total

    return {r: min(capacity(out.get(h, set())), capacity(into.get(h, set()))) / members[h] for r, h in home.items()}


def _one_orbit(net: Network, stage: Stage) -> bool:
    """Whether the fabric's translations that keep the stage's ring pairs (each rank to its successor, whose
    routes :func:`_host_rates` reads) make one orbit of its ranks, each pair routed by the fabric's shape
    (:func:`~topocc.planner.analysis.automorphisms.pair_orbits`): then each host's links out and in are
    carried onto every other's, and all rates are equal."""
    src = [r for g in stage.groups for r in g]
    dst = [g[(i + 1) % len(g)] for g in stage.groups for i in range(len(g))]
    orbits = pair_orbits(net, np.array(src), np.array(dst), np.ones(len(src)))
    if orbits is None:
        return False
    reps = {orbits.key(a, b) for a, b in zip(src, dst)}
    return (len({a for a, _ in reps}) == 1
            and all(net.has_route(a, b) and net.routed_by_shape(a, b) for a, b in reps))


def ownership(net: Network, stage: Stage, channel: int) -> dict[int, int] | None:
    """How many of its group's ``stage.size`` parts each rank of a direct level across hosts reduces, or
    None where every rank takes one (the equal split).

    In a direct reduce-scatter plus all-gather a member owning the fraction
    ``f`` of the data sends (and receives) ``(1 - f) + (n - 1) f`` of it: it
    sends every other owner its part, then its own part to all ``n - 1``
    others.  Ownership is free in an all-reduce, so each part goes, one at a
    time, to the member whose time ``(1 + (n - 2) f) / rate`` (rates from
    :func:`_host_rates`) grows least: a min-max that leaves a host behind two
    100 Gbit/s NICs owning nothing while DGX hosts beside it reduce for it.
    Its NICs then carry only the data once each way, the cut bound of a lone
    host (:mod:`topocc.planner.analysis.bounds`).  Equal rates give one part each, and so do
    rates less than ``(3n - 4) / (2n - 2)`` apart (1.25 for three members,
    towards 1.5 for many), since a second part costs a member more than a
    first one does a member that much slower.  Of two members, ownership
    moves nothing (each sends the data once whatever it owns).  A ring or
    halving-doubling member forwards most parts whoever owns them, so only
    a direct level gets uneven parts.
    """
    n = stage.size
    if stage.level == "host" or n <= 2:
        return None
    if _one_orbit(net, stage):
        return None  # every host is another's image: equal rates, one part each
    if net.topology.size >= BY_ORBIT_MIN_RANKS and hosts_alike(net):
        # no host is behind slower links than another; what the routes of the ring pairs would add (reading
        # them costs a route search from every rank) is not what ownership is for
        return None
    rate = _host_rates(net, stage, channel)
    if min(rate.values()) <= 0:  # no route out of some host sampled: no basis for a choice
        return None
    weights: dict[int, int] = {}
    for g in stage.groups:
        # (time once it owns one part more, parts it owns, position): ties go to the one owning fewer
        heap = [((1 + (n - 2) / n) / rate[r], 0, i) for i, r in enumerate(g)]
        heapq.heapify(heap)
        owned = [0] * n
        for _ in range(n):
            _, parts, i = heapq.heappop(heap)
            owned[i] = parts + 1
            heapq.heappush(heap, ((1 + (n - 2) * (parts + 2) / n) / rate[g[i]], parts + 1, i))
        weights.update(zip(g, owned))
    return None if all(w == 1 for w in weights.values()) else weights
