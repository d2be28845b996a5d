"""Relay paths: how data reaches a rank it has no GPU-free route to, by way of other GPUs.

A topology's routes never pass through a GPU (:mod:`planner.topology`), so on
fabrics whose inter-node links are one-way or reach only some GPUs (TE-CCL's and
TACCL's multi-chassis models, hosts whose NIC hangs off one GPU) some rank pairs
have no route at all.  NCCL, TACCL and TE-CCL forward through GPUs there, and so
do we: a transfer between such a pair goes through intermediate ranks, each of
which receives the data and sends it on (:meth:`planner.builder.ScheduleBuilder.transfer`
lowers it into those ordinary receives and sends).  The intermediate ranks are
the cheapest chain in which every consecutive pair has a route: Dijkstra over
the ranks, an edge per routed pair, weighed by :meth:`Topology.route_cost`.
Every hop is an ordinary rank-to-rank message, so the verifier, the simulator,
the bounds and the runtime see nothing new; the relay's extra traffic is simply
more messages.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable

from planner.topology import Topology

__all__ = ["hops", "path_latency", "path_shares", "relay_path", "relays"]


def _parents(topology: Topology, src: int) -> tuple[int, ...]:
    """The rank before each rank on its cheapest relay chain from ``src`` (-1: the source itself).

    Dijkstra over the ranks, a hop per routed pair costing its route cost, kept
    per topology.  Ties keep the chain found first, ranks popping in (cost, rank)
    order, so the chains depend on nothing but the topology.
    """
    cache: dict[int, tuple[int, ...]] = topology.derived("relay.parents", dict)
    found = cache.get(src)
    if found is not None:
        return found
    p = topology.size
    dist = [math.inf] * p
    parent = [-1] * p
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v in range(p):
            if v == u:
                continue
            cost = topology.route_cost(u, v)
            if d + cost < dist[v] * (1 - 1e-12):
                dist[v] = d + cost
                parent[v] = u
                heapq.heappush(heap, (d + cost, v))
    found = cache[src] = tuple(parent)
    return found


def relay_path(topology: Topology, src: int, dst: int) -> tuple[int, ...]:
    """The ranks a message from ``src`` to ``dst`` is relayed through, in order; ``()`` when a route joins them.

    >>> relay_path(topology, 0, 9)  # doctest: +SKIP
    (8,)
    """
    if src == dst or topology.has_route(src, dst):
        return ()
    parent = _parents(topology, src)
    chain: list[int] = []
    at = parent[dst]
    while at != src:
        if at < 0:  # build_topology guarantees strong connectivity; a hand-built Topology may lack it
            raise ValueError(f"rank {dst} cannot be reached from rank {src} in {topology.name}")
        chain.append(at)
        at = parent[at]
    return tuple(reversed(chain))


def hops(topology: Topology, src: int, dst: int) -> list[tuple[int, int]]:
    """The routed rank pairs a message from ``src`` to ``dst`` crosses: ``[(src, dst)]`` when no relay is needed."""
    chain = (src, *relay_path(topology, src, dst), dst)
    return list(itertools.pairwise(chain))


def path_shares(topology: Topology, src: int, dst: int) -> dict[tuple[str, str], float]:
    """The fraction of a message ``src -> dst`` that crosses each directed link, over all its hops.

    A relayed message crosses the links of every hop, the relay GPU's links in
    and out included; a link two hops share carries both shares.
    """
    if topology.has_route(src, dst):
        return topology.route_shares(src, dst)
    cache: dict[tuple[int, int], dict[tuple[str, str], float]] = topology.derived("relay.shares", dict)
    found = cache.get((src, dst))
    if found is None:
        found = {}
        for a, b in hops(topology, src, dst):
            for key, share in topology.route_shares(a, b).items():
                found[key] = found.get(key, 0.0) + share
        cache[(src, dst)] = found
    return found


def path_latency(topology: Topology, src: int, dst: int) -> float:
    """Latency of a message ``src -> dst`` over its hops (each hop's cheapest path)."""
    return sum(topology.route_latency(a, b) for a, b in hops(topology, src, dst))


def relays(topology: Topology) -> Callable[[int, int], tuple[int, ...]]:
    """:func:`relay_path` on ``topology``, the ``relay`` a :class:`~planner.builder.ScheduleBuilder` takes."""
    return functools.partial(relay_path, topology)
