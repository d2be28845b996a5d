"""Shallow spanning trees for hosts joined rank to rank: the hosted packing behind
:mod:`topocc.planner.compiler.algorithms.treepack`.

The multi-chassis models of TE-CCL and TACCL (two DGX-2, say) put a switch inside each host, so a rank reaches
every host peer in one hop, and join the hosts by direct links between some of their GPUs, often one-way.  The
general packing (:func:`~topocc.planner.compiler.algorithms._arborescence.pack`) meets the busiest link's optimum
there with trees five to seven hops deep, whose pipelines fill and drain for several per cent of the time.  Here a
root's block takes one hop inside its own host, one between hosts and two inside each other host: the root sends
it to every peer of its host (a star); for each other host, in breadth-first order over the inter-host links, a
rank of the host it came from sends it across one such link, and the rank it enters by hands it to one forwarder,
which sends it to the rest of that host (or sends it there itself, as its own forwarder).  Every rank receives
each block once, so a rank's intake is the collective's least; what differs is who sends.  Each root's block is
cut into one unit per rank of the largest host, and each unit takes the forwarder that keeps the busiest of the
links it loads least loaded, so the forwarding spreads over every rank of a host and the ranks that also pass
blocks between hosts forward less.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from topocc.planner.compiler.algorithms._arborescence import Packing, RankGraph, arc_graph
from topocc.planner.routing.network import Network

__all__ = ["hosted_packing"]

#: How steeply a link's price grows with its load, relative to the busiest link (see :meth:`_Loads.cheapest`).
STEEPNESS = 8.0


def _host_arcs(net: Network, reverse: bool) -> tuple[list[tuple[int, ...]], list[tuple[int, int]]] | None:
    """The hosts' ranks and the logical arcs between hosts, or None unless the fabric is of this module's kind:
    two or more hosts, every rank reaching each host peer, and every route between hosts one direct link."""
    topology = net.topology
    hosts = list(topology.hosts.values())
    if len(hosts) < 2:
        return None
    for ranks in hosts:
        if any(not net.has_route(u, v) for u in ranks for v in ranks if u != v):
            return None
    host_of = {r: h for h, ranks in enumerate(hosts) for r in ranks}
    between: list[tuple[int, int]] = []
    for u in range(topology.size):
        for v in range(topology.size):
            if host_of[u] == host_of[v] or not net.has_route(*((v, u) if reverse else (u, v))):
                continue
            a, b = (v, u) if reverse else (u, v)
            shares = net.route_shares(a, b)
            if set(shares) != {(topology.ranks[a], topology.ranks[b])}:
                return None  # a route through switches or NICs: the general packing's fabric
            between.append((u, v))
    if any(len(_host_order(host_of, between, h)) < len(hosts) for h in range(len(hosts))):
        return None  # some host reaches not every other one over the inter-host links
    return hosts, between


def _host_order(host_of: dict[int, int], between: list[tuple[int, int]], start: int) -> dict[int, int | None]:
    """Hosts breadth first from ``start`` over the inter-host arcs: host -> the host it is reached from."""
    parent: dict[int, int | None] = {start: None}
    queue = deque([start])
    while queue:
        h = queue.popleft()
        for other in sorted({host_of[v] for u, v in between if host_of[u] == h}):
            if other not in parent:
                parent[other] = h
                queue.append(other)
    return parent


class _Loads:
    """The links' loads of the trees chosen so far, and the arcs' loads to add (a row per arc)."""

    def __init__(self, graph: RankGraph, index: dict[tuple[int, int], int]) -> None:
        self.index = index
        self.load = np.zeros(len(graph.links))
        self.rows = np.array([graph.arc_loads([k]) for k in range(graph.arcs)]) if graph.arcs else np.zeros((0, 0))

    def add(self, arcs: Sequence[tuple[int, int]], times: int = 1) -> None:
        self.load += times * self.rows[[self.index[a] for a in arcs]].sum(axis=0)

    def cheapest(self, options: Sequence[Sequence[tuple[int, int]]], times: int = 1,
                 prefer: Sequence[bool] | None = None) -> int:
        """The option (a set of arcs, added ``times`` over) that raises the links' potential least, the sum of
        exp(:data:`STEEPNESS` x load / busiest load) (Garg and Koenemann's prices: a link's price grows with its
        load, so the least rise keeps the busiest links least loaded, and links every option loads alike cancel
        out); ties: an option ``prefer`` marks, then the first."""
        added = [times * self.rows[[self.index[a] for a in arcs]].sum(axis=0) for arcs in options]
        scale = STEEPNESS / max(float(self.load.max()), max(float(a.max()) for a in added), 1e-12)
        best, best_key = 0, (np.inf, True)
        for i, extra in enumerate(added):
            touched = extra > 0
            before = self.load[touched]
            rise = float(np.exp(scale * (before + extra[touched])).sum() - np.exp(scale * before).sum())
            key = (round(rise, 9), not (prefer is not None and prefer[i]))
            if key < best_key:
                best, best_key = i, key
        return best


def _spread(host: Sequence[int], entry: int) -> list[list[tuple[int, int]]]:
    """The ways a block entering ``host`` at ``entry`` reaches the rest of it: per forwarder, its arcs."""
    ways = []
    for f in host:
        rest = [v for v in host if v not in (entry, f)]
        ways.append([(entry, v) for v in rest] if f == entry else [(entry, f), *((f, v) for v in rest)])
    return ways


def hosted_packing(net: Network, roots: Sequence[int], units: int, reverse: bool = False) -> Packing | None:
    """``units`` trees per root of the shape the module docstring describes, or None where the fabric is not
    hosts joined rank to rank.  ``reverse``: trees of the reversed fabric, for data that flows toward the root."""
    found = _host_arcs(net, reverse)
    if found is None:
        return None
    hosts, between = found
    host_of = {r: h for h, ranks in enumerate(hosts) for r in ranks}
    intra = [(u, v) for ranks in hosts for u in ranks for v in ranks if u != v]
    arcs = sorted({*intra, *between})
    graph = arc_graph(net, arcs, reverse)
    index = {a: k for k, a in enumerate(arcs)}
    loads = _Loads(graph, index)
    orders = {h: _host_order(host_of, between, h) for h in range(len(hosts))}
    # the stars are fixed: their loads come first, so that every choice after them sees them
    stars = {r: [(r, v) for v in hosts[host_of[r]] if v != r] for r in roots}
    for star in stars.values():
        loads.add(star, units)
    # one entry per host for the whole block, roots with a link of their own to another host first: each
    # leaves from the rank the block entered the host before by (the root at home) where that is as cheap,
    # which saves the block a hop
    entries: dict[int, dict[int, tuple[int, int]]] = {}
    for r in sorted(roots, key=lambda r: (not any(u == r for u, _ in between), r)):
        entered = {host_of[r]: r}
        entries[r] = {}
        for h, parent in orders[host_of[r]].items():
            if parent is None:
                continue
            options = [(u, v) for u, v in between if host_of[u] == parent and host_of[v] == h]
            k = loads.cheapest([[a] for a in options], units, [u == entered[parent] for u, _ in options])
            entries[r][h] = options[k]
            entered[h] = options[k][1]
            loads.add([options[k]], units)
    # a root's units one after the other, so that each picks another forwarder: a block's units, in flight
    # together, are then forwarded side by side
    trees: dict[int, list[np.ndarray]] = {r: [] for r in roots}
    for r in roots:
        for _ in range(units):
            chosen = list(stars[r])
            for h, (u, v) in entries[r].items():
                ways = _spread(hosts[h], v)
                way = ways[loads.cheapest(ways)]
                loads.add(way)
                chosen += [(u, v), *way]
            trees[r].append(np.array(sorted((index[a] for a in chosen), key=lambda k: int(graph.head[k])),
                                     dtype=np.int64))
    return Packing(graph, tuple(roots), trees, float(loads.load.max()) / units, "hosted")
