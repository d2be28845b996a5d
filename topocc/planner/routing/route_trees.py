"""Shortest-path DAGs from a source rank over the device graph: what every route is read from.

A route never passes through a GPU, so a search from a rank expands only
devices that are not ranks (:func:`search`).  One search per rank costs ranks x
devices, which on a fat-tree of tens of thousands of GPUs is minutes and
gigabytes.  But on a large fabric a rank reaches the network through devices of
its own (its NIC, its host's NVSwitch), each with at most one way on into the
fabric, and then through switches that every rank shares.  :class:`SharedTree`
reads a rank's DAG off a small search of its own devices plus one search from
each such switch (a *hub*, :func:`hubs`), done once for all ranks.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, overload

__all__ = ["Adjacency", "HubSearches", "RouteTree", "Search", "SharedTree", "hubs", "route_tree", "search"]

#: Out-links per device: ``(head, route cost, link index)``.
Adjacency = Sequence[Sequence[tuple[int, float, int]]]

#: Two route costs within this relative difference are equal (both paths are cheapest).
TIE = 1e-9
_INF = float("inf")

_T = TypeVar("_T")
#: A value per device: a list indexed by device (a full search) or a dict of the devices reached (a local one).
PerDevice = MutableMapping[int, _T] | list[_T]


@dataclass(frozen=True, slots=True)
class RouteTree:
    """The shortest-path DAG from one source rank: ``first[d]`` is a parent link index of device ``d`` (-1:
    unreached, -2: the source), ``extra[d]`` its further equal-cost parent links, ``cost[r]`` the route
    cost to rank ``r`` (inf: no route)."""

    first: array
    extra: dict[int, tuple[int, ...]]
    cost: array


@dataclass(frozen=True, slots=True)
class Search:
    """One search's result: cost and parent link per device reached, further equal-cost parents."""

    dist: PerDevice[float]
    first: PerDevice[int]
    extra: dict[int, list[int]]

    def frozen_extra(self) -> dict[int, tuple[int, ...]]:
        """:attr:`extra` with each device's further parents as a tuple, to keep."""
        return {k: tuple(v) for k, v in self.extra.items()}


def _reached(found: Search) -> MutableMapping[int, float]:
    """A local search's costs by device reached (a full search's are a list indexed by device)."""
    dist = found.dist
    assert not isinstance(dist, list), "a local search keeps its costs in a dict"
    return dist


class _Costs(dict[int, float]):
    """Costs of the devices a local search reached; inf for the others."""

    def __missing__(self, node: int) -> float:
        return _INF


def search(adjacency: Adjacency, blocked: bytearray, start: int, *, local: bool = False) -> Search:
    """Dijkstra from device ``start`` that reaches but never expands a device flagged in ``blocked``; keeps
    every equal-cost parent link.  Lists indexed by device (-1: unreached) unless ``local`` (a search that
    stays near ``start``): then dicts of the devices reached."""
    dist: PerDevice[float]
    first: PerDevice[int]
    if local:
        dist, first = _Costs({start: 0.0}), {start: -2}
    else:
        dist, first = [_INF] * len(adjacency), [-1] * len(adjacency)
        dist[start], first[start] = 0.0, -2
    extra: dict[int, list[int]] = {}
    heap = [(0.0, start)]
    heappop, heappush = heapq.heappop, heapq.heappush
    while heap:
        d, node = heappop(heap)
        if d > dist[node] * (1 + 1e-12) + 1e-18:
            continue
        for head, cost, link in adjacency[node]:
            nd = d + cost
            old = dist[head]
            if nd < old * (1 - TIE):
                dist[head] = nd
                first[head] = link
                extra.pop(head, None)
                if not blocked[head]:  # GPUs are endpoints, not forwarders: never expanded
                    heappush(heap, (nd, head))
            elif nd <= old * (1 + TIE):
                extra.setdefault(head, []).append(link)
    return Search(dist, first, extra)


def route_tree(found: Search, rank_device: Sequence[int]) -> RouteTree:
    """A full search from a rank, kept compactly: about 5 bytes per device."""
    dist = found.dist
    return RouteTree(array("i", found.first), found.frozen_extra(),
                     array("d", [dist[i] for i in rank_device]))


def hubs(adjacency: Adjacency, is_rank: bytearray) -> bytearray:
    """Flags the devices searched once for all ranks: every non-rank device with out-links to two or more
    non-rank devices.  The others (a NIC's one way on to its switch, an NVSwitch that only reaches GPUs) are
    part of the own search of each rank that reaches them."""
    flags = bytearray(len(adjacency))
    for node, out in enumerate(adjacency):
        if not is_rank[node] and len({head for head, _, _ in out if not is_rank[head]}) > 1:
            flags[node] = 1
    return flags


class _Hub:
    """A hub's search, kept as arrays: cost and parent link per device, further equal-cost parents."""

    __slots__ = ("device", "dist", "extra", "first")

    def __init__(self, device: int, found: Search) -> None:
        self.device = device
        self.dist = array("d", found.dist)
        self.first = array("i", found.first)
        self.extra = found.frozen_extra()


class SharedTree:
    """A rank's shortest-path DAG from its own search up to the first hubs and those hubs' shared searches.

    Every path from the rank first crosses devices that are neither hubs nor
    ranks, then either ends or enters a hub ``h`` at the own search's cost
    ``c_h``, after which it is a path of ``h``'s search.  So a device's cost is
    the least of its own-search cost and ``c_h`` plus its cost from each hub
    reached, and its cheapest parent links are those of every term that attains
    that least cost (the links tight in the whole graph are exactly these).
    Answers :class:`RouteTree`'s ``first``, ``extra`` and ``cost`` per device,
    on demand, in the same form.
    """

    __slots__ = ("_hubs", "_near", "_own", "_own_dist", "_rank_device", "_through", "cost", "extra", "first")

    def __init__(self, start: int, own: Search, reached: list[tuple[float, _Hub]], rank_device: Sequence[int]):
        self._own = own
        self._own_dist = _reached(own)
        self._hubs = reached
        self._rank_device = rank_device
        self._through: tuple[float, _Hub] | None = None  # set below, once the near devices are worked out
        near = {node: self._tight(node) for node in self._own_dist}
        near[start] = (-2,)
        self._near = near  # the devices its own search reached, worked out at once: few, and asked often
        # a rank that reaches a single hub (a fat-tree GPU's NIC leads to one leaf) has that hub's costs and
        # parents, as they are, on every device its own search did not reach
        self._through = reached[0] if len(reached) == 1 else None
        self.first = _First(self)
        self.extra = _Extra(self)
        self.cost = _Cost(self)

    def dist(self, node: int) -> float:
        """The route cost to device ``node`` (inf: unreached)."""
        through = self._through
        if through is not None and node not in self._near:
            return through[0] + through[1].dist[node]
        best = self._own_dist.get(node, _INF)
        for offset, hub in self._hubs:
            d = offset + hub.dist[node]
            if d < best:
                best = d
        return best

    def parents(self, node: int) -> tuple[int, ...]:
        """The cheapest parent links of device ``node`` (``(-2,)`` at the source, ``()`` where unreached)."""
        found = self._near.get(node)
        if found is not None:
            return found
        through = self._through
        if through is not None:
            hub = through[1]
            head = hub.first[node]
            return () if head == -1 else (head, *hub.extra.get(node, ()))
        return self._tight(node)

    def _tight(self, node: int) -> tuple[int, ...]:
        """The parent links of ``node`` in every term that attains its least cost."""
        best = self.dist(node)
        if best == _INF:
            return ()
        tight = best * (1 + TIE)
        links: list[int] = []
        own = self._own
        if self._own_dist.get(node, _INF) <= tight:
            links.append(own.first[node])
            links.extend(own.extra.get(node, ()))
        for offset, hub in self._hubs:
            if node != hub.device and offset + hub.dist[node] <= tight:
                links.append(hub.first[node])
                links.extend(hub.extra.get(node, ()))
        return tuple(dict.fromkeys(links))


class _First:
    __slots__ = ("_tree",)

    def __init__(self, tree: SharedTree) -> None:
        self._tree = tree

    def __getitem__(self, node: int) -> int:
        tree = self._tree
        through = tree._through
        if through is not None and node not in tree._near:  # parents()' shortcut, without building a tuple
            return through[1].first[node]
        found = tree.parents(node)
        return found[0] if found else -1


class _Extra:
    __slots__ = ("_tree",)

    def __init__(self, tree: SharedTree) -> None:
        self._tree = tree

    @overload
    def get(self, node: int) -> tuple[int, ...] | None: ...

    @overload
    def get(self, node: int, default: tuple[int, ...]) -> tuple[int, ...]: ...

    def get(self, node: int, default: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """As ``dict.get`` on :attr:`RouteTree.extra`: the further parent links of ``node``, else ``default``."""
        tree = self._tree
        through = tree._through
        if through is not None and node not in tree._near:  # as in _First: a route walk asks this per device
            return through[1].extra.get(node, default)
        found = tree.parents(node)
        return found[1:] if len(found) > 1 else default

    def __contains__(self, node: int) -> bool:
        return self.get(node) is not None


class _Cost:
    __slots__ = ("_tree",)

    def __init__(self, tree: SharedTree) -> None:
        self._tree = tree

    def __getitem__(self, rank: int) -> float:
        return self._tree.dist(self._tree._rank_device[rank])


class HubSearches:
    """The searches from a topology's hubs, each done once, when a rank's own search first reaches it."""

    def __init__(self, adjacency: Adjacency, is_rank: bytearray, flags: bytearray) -> None:
        self._adjacency = adjacency
        self._is_rank = is_rank
        self._own_blocked = bytearray(a | b for a, b in zip(is_rank, flags, strict=True))
        self._flags = flags
        self._done: dict[int, _Hub] = {}

    def tree(self, start: int, rank_device: Sequence[int]) -> SharedTree:
        """The DAG from rank device ``start``: its own search over non-hub devices, then the hubs it reached."""
        own = search(self._adjacency, self._own_blocked, start, local=True)
        reached: list[tuple[float, _Hub]] = []
        for node, d in _reached(own).items():
            if self._flags[node]:
                hub = self._done.get(node)
                if hub is None:
                    hub = self._done[node] = _Hub(node, search(self._adjacency, self._is_rank, node))
                reached.append((d, hub))
        return SharedTree(start, own, reached, rank_device)
