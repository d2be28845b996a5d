"""Relay paths: how data reaches a rank it has no GPU-free route to, by way of other GPUs.

A network's routes never pass through a GPU (:mod:`topocc.planner.routing.network`), so on
fabrics whose inter-node links are one-way or reach only some GPUs (TE-CCL's and
TACCL's multi-chassis models, hosts whose NIC hangs off one GPU) some rank pairs
have no route at all.  NCCL, TACCL and TE-CCL forward through GPUs there, and so
do we: a transfer between such a pair goes through intermediate ranks, each of
which receives the data and sends it on (:meth:`topocc.planner.compiler.builder.ScheduleBuilder.transfer`
lowers it into those ordinary receives and sends).  The intermediate ranks are
the cheapest chain in which every consecutive pair has a route: Dijkstra over
the ranks, an edge per routed pair, weighed by :meth:`~topocc.planner.routing.network.Network.route_cost`.
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

from topocc.planner.routing.network import Memo, Network

__all__ = ["hops", "path_latency", "path_shares", "relay_path", "relays"]

#: Two chain costs closer than this (relative) are equally cheap.
_SAME_COST = 1e-9

#: Per source rank, the ranks before each rank on its cheapest relay chains (:func:`_parents`).
_PARENTS: Memo[dict[int, tuple[tuple[int, ...], ...]]] = Memo("relay: cheapest chains", lambda net: {})
#: Per relayed connection, its share of each link over all its hops (:func:`path_shares`).
_SHARES: Memo[dict[tuple[int, int, int], dict[tuple[str, str], float]]] = Memo("relay: shares", lambda net: {})


def _parents(net: Network, src: int) -> tuple[tuple[int, ...], ...]:
    """The ranks before each rank on its cheapest relay chains from ``src`` (none: the source itself).

    Dijkstra over the ranks, a hop per routed pair costing its route cost, kept
    per network; every predecessor of equal cost is kept, so that
    :func:`relay_path` can spread pairs over equally cheap relays.
    """
    cache = net.memo(_PARENTS)
    found = cache.get(src)
    if found is not None:
        return found
    p = net.topology.size
    dist = [math.inf] * p
    parents: list[list[int]] = [[] for _ in range(p)]
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v in range(p):
            if v in (u, src):
                continue
            reach = d + net.route_cost(u, v)
            if reach < dist[v] * (1 - _SAME_COST):
                dist[v] = reach
                parents[v] = [u]
                heapq.heappush(heap, (reach, v))
            elif reach <= dist[v] * (1 + _SAME_COST):
                parents[v].append(u)
    found = cache[src] = tuple(tuple(ps) for ps in parents)
    return found


def _spread(src: int, rank: int, choices: int) -> int:
    """Which of ``choices`` equally cheap predecessors of ``rank`` a chain from ``src`` takes.

    A multiplicative hash (Knuth's) of the pair: deterministic, and even over
    the pairs of a pattern (rank i to rank i + k, all to one, one to all), where
    a sum or a product of the two would give one parity to all of them.
    """
    return (((((src << 16) + rank) * 2654435761) & 0xFFFFFFFF) >> 16) % choices


def _host_index(net: Network) -> tuple[list[int], list[tuple[int, ...]]]:
    """Each rank's host (an index) and the ranks of each host."""
    groups = list(net.topology.hosts.values())
    host = [0] * net.topology.size
    for h, ranks in enumerate(groups):
        for r in ranks:
            host[r] = h
    return host, groups


_HOSTS = Memo("relay: hosts", _host_index)


def _choose(net: Network, src: int, dst: int, at: int, choices: tuple[int, ...]) -> int:
    """Which of ``choices``, equally cheap predecessors of ``at`` on a chain ``src -> dst``, the chain takes.

    Where the pair crosses hosts and the choices are gateways of one end's host
    (all on that host: the GPUs with a NIC, the chassis's GPUs linked to the
    next one), the choice follows that end's position among its host's other
    ranks, so each gateway serves an equal share of them, whatever the pattern:
    a chassis of 16 GPUs with NICs on 4 relays 3 GPUs per NIC.  A hash of the
    pair leaves some gateways carrying half as much again as others, and a
    schedule balanced over the ranks then waits on its busiest NIC.  The
    position is shifted by the far end's host, so a rank's messages to
    different hosts take different gateways, not one connection in turn.
    Elsewhere :func:`_spread`.
    """
    if len(choices) == 1:
        return 0
    host, groups = net.memo(_HOSTS)
    if host[src] != host[dst]:
        for end, far in ((dst, src), (src, dst)):
            if all(host[c] == host[end] for c in choices):
                others = [r for r in groups[host[end]] if r not in choices]
                if end in others:
                    return (others.index(end) + host[far]) % len(choices)
    return _spread(src, at, len(choices))


def relay_path(net: Network, src: int, dst: int) -> tuple[int, ...]:
    """The ranks a message from ``src`` to ``dst`` is relayed through, in order; ``()`` when a route joins them.

    The cheapest chain of routed hops; among equally cheap ones, pairs are
    spread (:func:`_choose`: a host's gateways serve equal shares of its
    ranks; on a multi-chassis box with two links between two chassis, half
    the pairs cross each).

    >>> relay_path(net, 0, 9)  # doctest: +SKIP
    (8,)
    """
    if src == dst or net.has_route(src, dst):
        return ()
    parents = _parents(net, src)
    chain: list[int] = []
    at = dst
    while True:
        before = parents[at]
        if not before:  # build_topology guarantees strong connectivity; a hand-built Topology may lack it
            raise ValueError(f"rank {dst} cannot be reached from rank {src} in {net.topology.name}")
        at = before[_choose(net, src, dst, at, before)]
        if at == src:
            return tuple(reversed(chain))
        chain.append(at)


def hops(net: Network, src: int, dst: int) -> list[tuple[int, int]]:
    """The routed rank pairs a message from ``src`` to ``dst`` crosses: ``[(src, dst)]`` when no relay is needed."""
    chain = (src, *relay_path(net, src, dst), dst)
    return list(itertools.pairwise(chain))


def path_shares(net: Network, src: int, dst: int, channel: int = 0) -> dict[tuple[str, str], float]:
    """The fraction of a message ``src -> dst`` on ``channel`` that crosses each directed link, over all its hops.

    A relayed message crosses the links of every hop (each routed as the
    topology routes that channel), the relay GPU's links in and out included;
    a link two hops share carries both shares.
    """
    if net.has_route(src, dst):
        return net.route_shares(src, dst, channel)
    cache = net.memo(_SHARES)
    found = cache.get((src, dst, channel))
    if found is None:
        found = {}
        for a, b in hops(net, src, dst):
            for key, share in net.route_shares(a, b, channel).items():
                found[key] = found.get(key, 0.0) + share
        cache[(src, dst, channel)] = found
    return found


def path_latency(net: Network, src: int, dst: int, channel: int = 0) -> float:
    """Latency of a message ``src -> dst`` on ``channel`` over its hops (each routed as the topology routes it)."""
    return sum(net.route_latency(a, b, channel) for a, b in hops(net, src, dst))


def relays(net: Network) -> Callable[[int, int], tuple[int, ...]]:
    """:func:`relay_path` on ``net``: the ``relay`` a :class:`~topocc.planner.compiler.builder.ScheduleBuilder`
    takes."""
    return functools.partial(relay_path, net)
