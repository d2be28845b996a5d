"""The network the planner plans on: a topology's routes, and every table derived from them, built once.

A :class:`~topocc.planner.topology.model.Topology` is the cluster as written (devices, links, rank order,
routing mode): immutable data.  A :class:`Network` is that topology as the planner sees it, a bandwidth
graph with routes.  Messages between two ranks follow the cheapest paths whose interior holds no GPU (GPUs
do not forward data on their own: a schedule that needs to relay through a GPU says so with a receive and a
send).  Where a pair has several cheapest paths, the topology's ``routing`` says which a connection
(sender, receiver, channel) takes, as its fabric would:

* ``spray``: every message split evenly over the paths (adaptive routing, packet spraying); where a pair has
  more than :data:`MAX_PATHS` of them, as one flow putting on each link the share of the paths through it,
  counted without listing the paths (:meth:`Network.sprayed`);
* ``ecmp``: one path per connection; every device with several next hops on a cheapest path picks one by
  hashing the connection with its own name, as a switch hashes a flow's 5-tuple (:func:`ecmp_hash`);
* ``dimension-order``: the one cheapest path that corrects the lowest dimension first (links labelled
  with ``dim``: torus and mesh networks);
* ``source``: the sender picks among the paths (a schedule records its choices,
  :mod:`topocc.planner.routing.paths`); a connection without one hashes as ``ecmp``.

:meth:`Network.connection_paths` is the one place that applies the mode; the simulator, the bounds and
every algorithm's cost model go through it.

A network is mutable working state with one owner: whoever starts planning on a topology (a compile, a
simulation, a report) builds one and passes it to every step, and each step's route queries are answered
once.  Layers above routing keep their own per-network tables through :meth:`Network.memo`, each declared
as a typed :class:`Memo` in the module that owns it.  Entry points that take a topology build a fresh
network (:func:`network_of`); passing a network shares the work across calls.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.route_trees import HubSearches, RouteTree, SharedTree, hubs, route_tree, search
from topocc.planner.topology.model import Link, Topology

__all__ = ["MAX_PATHS", "PER_CONNECTION", "Memo", "Network", "Spray", "ecmp_hash", "network_of"]

T = TypeVar("T")

#: Modes in which two channels between one pair may take different paths.
PER_CONNECTION = ("ecmp", "source")
#: A route's cost is its latency plus the time a message of this size takes on each hop:
#: both terms matter when choosing between a short slow path and a longer fast one.
ROUTE_REFERENCE_BYTES = 1 << 20
#: At most this many equal-cost paths are listed per pair (messages are split evenly over them); a pair with
#: more lists those its hash picks (:meth:`Network.routes`), and under spray is modelled by counting all of
#: them instead (:meth:`Network.sprayed`).
MAX_PATHS = 16
#: From this many ranks on, routes are read off shared searches where the fabric has few hubs
#: (:mod:`topocc.planner.routing.route_trees`): above it one search per rank costs seconds; below it the
#: routes are listed in the order the smaller shipped schedules were compiled with.
SHARED_ROUTES_RANKS = 1024
#: Rank pairs (or connections) whose routes a network keeps per table (each up to MAX_PATHS paths); a full
#: table starts again, so memory stays bounded (an all-to-all on 1024 ranks asks for a million pairs).
_PATH_CACHE_PAIRS = 1 << 17


def ecmp_hash(src: int, dst: int, channel: int, device: str) -> int:
    """The ECMP hash of connection ``src -> dst`` on ``channel`` at ``device``: CRC-32 of ``"src dst channel device"``.

    Deterministic across processes and platforms (unlike Python's ``hash``); the
    device's name plays the part of a switch's hash seed, so that consecutive
    switches do not all pick the same index (hash polarisation).

    >>> ecmp_hash(0, 1, 0, "leaf0") == ecmp_hash(0, 1, 0, "leaf0")
    True
    """
    return zlib.crc32(f"{src} {dst} {channel} {device}".encode())


@dataclass(frozen=True, eq=False)
class Memo(Generic[T]):
    """A table a layer above routing keeps per network: declared once, as a module constant, by the module
    that owns it (``_CUTS = Memo("bounds: cut family", _CutFamily)``); ``build`` makes its value from the
    network on first use."""

    name: str
    build: Callable[[Network], T]


@dataclass(frozen=True, slots=True)
class Spray:
    """A message sprayed over all of a pair's cheapest paths, more than :data:`MAX_PATHS` of them: the links on
    some path (indices into the topology's links) with the share of the message each carries (the paths
    through it over all paths), and the latency of the slowest path."""

    links: tuple[int, ...]
    shares: tuple[float, ...]
    latency: float


@dataclass(frozen=True, slots=True)
class _PathCounts:
    """The cheapest paths of a pair, counted: ``paths`` of them; ``order``, the devices on some path in
    depth-first postorder back from the destination (every device after those on the way to it from the
    source), each with its ``parents`` links; ``into``, the paths from the source to each device."""

    paths: int
    order: list[int]
    parents: dict[int, tuple[int, ...]]
    into: dict[int, int]


def network_of(where: Topology | Network) -> Network:
    """``where`` itself if it is a network, else a fresh one for the topology (nothing shared with others)."""
    return where if isinstance(where, Network) else Network(where)


class Network:
    """A topology's routes (see the module docstring), computed on demand and kept for the network's life."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        # the topology's fields that the route searches read in their inner loops
        self._links = topology.links
        self._devices = topology.devices
        self._ranks = topology.ranks
        self._by_pair = {(link.src, link.dst): link for link in topology.links}
        self._route_cache: dict[int, RouteTree | SharedTree] = {}
        self._paths_cache: dict[tuple[int, int], tuple[tuple[Link, ...], ...]] = {}
        self._hops_cache: dict[tuple[int, int], tuple[dict[int, tuple[int, ...]], bool]] = {}
        self._connection_cache: dict[tuple[int, int, int], tuple[tuple[Link, ...], ...]] = {}
        self._shares_cache: dict[tuple[int, int, int], dict[tuple[str, str], float]] = {}
        self._even_cache: dict[tuple[int, int], dict[tuple[str, str], float]] = {}
        self._latency_cache: dict[tuple[int, int, int], float] = {}
        self._spray_cache: dict[tuple[int, int], Spray | None] = {}
        self._memos: dict[Memo[Any], Any] = {}
        self._reversed: Network | None = None

    def __repr__(self) -> str:
        return f"Network({self.topology.name!r}, {self.topology.size} ranks)"

    def memo(self, memo: Memo[T]) -> T:
        """The value of ``memo`` for this network, built on first use."""
        if memo not in self._memos:
            self._memos[memo] = memo.build(self)
        return self._memos[memo]

    def reversed(self) -> Network:
        """The network of the topology with every link turned round (itself when all links are full duplex): a
        gather timed on it is the reduction it mirrors, timed on this one."""
        if self.topology.symmetric:
            return self
        if self._reversed is None:
            self._reversed = Network(self.topology.reversed())
        return self._reversed

    # ----------------------------------------------------------------- route searches

    def _cost(self, link: Link) -> float:
        return link.latency + ROUTE_REFERENCE_BYTES / link.bandwidth

    @cached_property
    def _device_position(self) -> dict[str, int]:
        """Each device's index in :attr:`devices`."""
        return {d.name: i for i, d in enumerate(self._devices)}

    @cached_property
    def _graph(self) -> tuple[list[list[tuple[int, float, int]]], bytearray, list[int]]:
        """Devices as indices: out-links ``(head, route cost, link index)`` per device, a rank flag per
        device, and each rank's device index."""
        index = self._device_position
        adjacency: list[list[tuple[int, float, int]]] = [[] for _ in self._devices]
        for k, link in enumerate(self._links):
            adjacency[index[link.src]].append((index[link.dst], self._cost(link), k))
        is_rank = bytearray(len(self._devices))
        rank_device = [index[name] for name in self._ranks]
        for i in rank_device:
            is_rank[i] = 1
        return adjacency, is_rank, rank_device

    @cached_property
    def _link_src(self) -> list[int]:
        """The device index of each link's source (by link index), for walking route trees back."""
        index = self._device_position
        return [index[link.src] for link in self._links]

    @cached_property
    def _link_bandwidth(self) -> list[float]:
        """Each link's bandwidth by link index, for the route bandwidth's inner loop."""
        return [link.bandwidth for link in self._links]

    @cached_property
    def _hub_searches(self) -> HubSearches | None:
        """The hubs' shared searches (:mod:`~topocc.planner.routing.route_trees`) where this network's routes are
        read from them: from :data:`SHARED_ROUTES_RANKS` ranks on, when the hubs are fewer than half the ranks."""
        if self.topology.size < SHARED_ROUTES_RANKS:
            return None
        adjacency, is_rank, _ = self._graph
        flags = hubs(adjacency, is_rank)
        return HubSearches(adjacency, is_rank, flags) if 2 * sum(flags) < self.topology.size else None

    def _shortest_from(self, src: int) -> RouteTree | SharedTree:
        """The shortest-path DAG from rank ``src`` (routes never cross another rank), searched once per source.

        Kept compactly (a parent link index per device, a cost per rank: about
        5 bytes per device, so 4096 ranks on 8848 devices hold under 200 MB) or,
        on a large fabric, as a :class:`~topocc.planner.routing.route_trees.SharedTree`.
        """
        cached = self._route_cache.get(src)
        if cached is not None:
            return cached
        adjacency, is_rank, rank_device = self._graph
        shared = self._hub_searches
        tree: RouteTree | SharedTree
        if shared is not None:
            tree = shared.tree(rank_device[src], rank_device)
        else:
            tree = route_tree(search(adjacency, is_rank, rank_device[src]), rank_device)
        self._route_cache[src] = tree
        return tree

    def has_route(self, src: int, dst: int) -> bool:
        """Whether rank ``src`` can send to rank ``dst`` directly (over switches, NICs, PCIe, no GPU)."""
        parts = self._fabric_parts
        if parts is None or src == dst:
            return self._shortest_from(src).cost[dst] != float("inf")
        joined, linked = parts
        return not joined[src].isdisjoint(joined[dst]) or (src, dst) in linked

    @cached_property
    def _fabric_parts(self) -> tuple[list[frozenset[int]], set[tuple[int, int]]] | None:
        """Where every link has a reverse: the connected parts of the devices that are not ranks each rank
        has a link to, and the pairs of ranks linked directly; None elsewhere.

        Routes cross no rank, so two ranks have one exactly where a link joins them or both touch one part;
        with every link reversible a part reaches all of itself both ways, so no route search is needed.
        """
        pairs = self._by_pair
        if any((dst, src) not in pairs for src, dst in pairs):
            return None
        adjacency, is_rank, rank_device = self._graph
        root = list(range(len(adjacency)))  # union-find over the devices that are not ranks

        def find(u: int) -> int:
            while root[u] != u:
                root[u] = root[root[u]]
                u = root[u]
            return u

        for u, outs in enumerate(adjacency):
            if not is_rank[u]:
                for v, _, _ in outs:
                    if not is_rank[v]:
                        root[find(u)] = find(v)
        rank_of = {d: r for r, d in enumerate(rank_device)}
        joined = [frozenset(find(v) for v, _, _ in adjacency[d] if not is_rank[v]) for d in rank_device]
        linked = {(r, rank_of[v]) for r, d in enumerate(rank_device) for v, _, _ in adjacency[d] if is_rank[v]}
        return joined, linked

    def route_cost(self, src: int, dst: int) -> float:
        """The cost the routes minimise (latency plus a reference message's transfer time; inf: no route)."""
        return self._shortest_from(src).cost[dst]

    def routes(self, src: int, dst: int) -> tuple[tuple[Link, ...], ...]:
        """The equal-cost paths from rank ``src`` to rank ``dst`` (at most :data:`MAX_PATHS`), each as links.

        Kept per pair (up to :data:`_PATH_CACHE_PAIRS` pairs): the algorithms' cost
        models, the route shares and the simulator all ask for the same pairs.
        """
        cache = self._paths_cache
        found = cache.get((src, dst))
        if found is not None:
            return found
        tree = self._shortest_from(src)
        if src == dst or tree.cost[dst] == float("inf"):
            return ()
        _, _, rank_device = self._graph
        links, link_src, devices = self._links, self._link_src, self._devices
        first, extra = tree.first, tree.extra

        def listed(hashed: bool) -> tuple[list[tuple[Link, ...]], bool]:
            """The first MAX_PATHS paths, and whether there are more."""
            paths: list[tuple[Link, ...]] = []
            # depth first back from the destination over the equal-cost parent links, the first parent before
            # the others (or, ``hashed``, the pair's hash picks where to start among them); a run of devices
            # with one parent each is followed in a loop, and only the alternatives wait on the stack
            stack: list[tuple[int, tuple[Link, ...]]] = [(rank_device[dst], ())]
            while stack and len(paths) < MAX_PATHS:
                node, suffix = stack.pop()
                while True:
                    head = first[node]
                    if head == -2:
                        paths.append(suffix)
                        break
                    more = extra.get(node)
                    if more is not None:
                        if hashed:
                            ks = (head, *more)
                            at = ecmp_hash(src, dst, 0, devices[node].name) % len(ks)
                            head, more = ks[at], ks[at + 1:] + ks[:at]
                        stack.extend((link_src[k], (links[k], *suffix)) for k in reversed(more))
                    suffix = (links[head], *suffix)
                    node = link_src[head]
            return paths, bool(stack)

        paths, truncated = listed(hashed=False)
        if truncated:
            # more than MAX_PATHS paths (behind more than 16 spines): each pair keeps MAX_PATHS of them where its
            # hash starts at each choice, so that pairs together cross every path, as sprayed packets do, and
            # not all the same first 16 (half the spines of a 32-spine fabric left idle)
            paths, _ = listed(hashed=True)
        if len(cache) >= _PATH_CACHE_PAIRS:
            cache.clear()  # bounded memory: an all-to-all on 1024 ranks asks for a million pairs
        found = cache[(src, dst)] = tuple(paths)
        return found

    def _next_hops(self, src: int, dst: int) -> tuple[dict[int, tuple[int, ...]], bool]:
        """Every device on a cheapest path from rank ``src`` to rank ``dst`` with its out-links (indices, in
        declaration order) that stay on one; and whether any device has a choice (several paths)."""
        cache: dict[tuple[int, int], tuple[dict[int, tuple[int, ...]], bool]] = self._hops_cache
        found = cache.get((src, dst))
        if found is not None:
            return found
        tree = self._shortest_from(src)
        _, _, rank_device = self._graph
        index = self._device_position
        links = self._links
        hops: dict[int, set[int]] = {}
        target = rank_device[dst]
        seen = {target}
        stack = [target] if src != dst and tree.cost[dst] != float("inf") else []
        while stack:  # back from the destination over every equal-cost parent link
            node = stack.pop()
            head = tree.first[node]
            if head == -2:
                continue
            for k in (head, *tree.extra.get(node, ())):
                u = index[links[k].src]
                hops.setdefault(u, set()).add(k)
                if u not in seen:
                    seen.add(u)
                    stack.append(u)
        ordered = {u: tuple(sorted(ks)) for u, ks in hops.items()}
        if len(cache) >= _PATH_CACHE_PAIRS:
            cache.clear()
        found = cache[(src, dst)] = (ordered, any(len(ks) > 1 for ks in ordered.values()))
        return found

    def _walk(self, src: int, dst: int, choose: Callable[[int, tuple[int, ...]], int]) -> tuple[Link, ...]:
        """The cheapest path from rank ``src`` to rank ``dst`` on which ``choose(device, out-links)`` picks every
        next hop that has alternatives (a link index of the choices)."""
        hops, _ = self._next_hops(src, dst)
        _, _, rank_device = self._graph
        index = self._device_position
        node, target = rank_device[src], rank_device[dst]
        path: list[Link] = []
        while node != target:
            choices = hops[node]
            link = self._links[choices[0] if len(choices) == 1 else choose(node, choices)]
            path.append(link)
            node = index[link.dst]
        return tuple(path)

    def equal_cost_links(self, src: int, dst: int) -> tuple[Link, ...]:
        """Every link on some cheapest path from rank ``src`` to rank ``dst``: the paths a connection may take
        where the fabric lets it choose (any path through them, from ``src`` on, is a cheapest path)."""
        hops, _ = self._next_hops(src, dst)
        return tuple(self._links[k] for ks in hops.values() for k in ks)

    def common_link_time(self, messages: Iterable[tuple[int, int, float]]) -> float:
        """Seconds the busiest link needs for ``messages`` (source rank, destination rank, bytes), counting
        only the links every cheapest path of each pair crosses (:meth:`common_links`): a lower bound of
        their link time under any routing and channel assignment (the algorithms' link floors)."""
        load: LinkLoad[Link] = LinkLoad()
        for src, dst, nbytes in messages:
            load.add_along(self.common_links(src, dst), nbytes)
        return load.busiest(lambda link: link.bandwidth)

    def common_links(self, src: int, dst: int) -> tuple[Link, ...]:
        """Links that every cheapest path from rank ``src`` to rank ``dst`` crosses, whatever the routing.

        The stretch from ``src`` while each device has a single next hop, and the
        stretch into ``dst`` while each device has a single cheapest parent (on a
        fat-tree: the GPU's and NIC's links at both ends, not the spine choice).
        Every path the routing may give the pair (spray's share, ECMP's hash, a
        recorded source route) carries all of a message across these links, so
        their load bounds any schedule's time from below.  Empty without a route.
        """
        tree = self._shortest_from(src)
        if src == dst or tree.cost[dst] == float("inf"):
            return ()
        hops, _ = self._next_hops(src, dst)
        _, _, rank_device = self._graph
        index = self._device_position
        links = self._links
        found: dict[int, None] = {}
        node, target = rank_device[src], rank_device[dst]
        while node != target and len(hops[node]) == 1:
            found[hops[node][0]] = None
            node = index[links[hops[node][0]].dst]
        node = target
        while tree.first[node] >= 0 and node not in tree.extra:  # one cheapest parent link
            found[tree.first[node]] = None
            node = index[links[tree.first[node]].src]
        return tuple(links[k] for k in found)

    def route_key(self, src: int, dst: int, channel: int = 0) -> tuple[int, int, int]:
        """The connection ``(src, dst, channel)``, or ``(src, dst, 0)`` where the channel cannot change the path:
        connections with one key take the same paths (what the route caches are keyed by)."""
        if channel and self.topology.routing in PER_CONNECTION and self._next_hops(src, dst)[1]:
            return (src, dst, channel)
        return (src, dst, 0)

    def channels_change_path(self, src: int, dst: int) -> bool:
        """Whether the pair's connections may take different paths by channel (ECMP, source routing, several
        equal-cost paths): what renumbering a schedule's channels can spread."""
        return self.has_route(src, dst) and self.route_key(src, dst, 1)[2] != 0

    def routed_by_shape(self, src: int, dst: int) -> bool:
        """Whether the pair's connections take paths that the network's shape alone decides: its only cheapest
        path, or under ``spray`` every cheapest path (listed or counted, :meth:`sprayed`).  An automorphism of
        the network then carries them onto its image pair's paths, where a hash would not."""
        return self.topology.routing == "spray" or not self._next_hops(src, dst)[1]

    def connection_paths(self, src: int, dst: int, channel: int = 0) -> tuple[tuple[Link, ...], ...]:
        """The paths the messages of connection ``(src, dst, channel)`` take under the topology's routing.

        A message is split evenly over them: all of :meth:`routes` under
        ``spray``, one path otherwise (under ``source``, the ``ecmp`` path: a
        schedule's recorded choices are applied by :func:`topocc.planner.routing.paths.recorded_paths`).
        Empty when the pair has no route.  A pair sprayed over more than
        :data:`MAX_PATHS` paths lists those its hash picks here (for callers
        that want some of its links); its shares, bandwidth and latency, and the
        simulator's flow, come from :meth:`sprayed`.
        """
        key = self.route_key(src, dst, channel)
        cache: dict[tuple[int, int, int], tuple[tuple[Link, ...], ...]] = self._connection_cache
        found = cache.get(key)
        if found is not None:
            return found
        if self.topology.routing == "spray" or not self.has_route(src, dst):
            found = self.routes(src, dst)
        elif self.topology.routing == "dimension-order":
            links = self._links

            def lowest_dimension(node: int, choices: tuple[int, ...]) -> int:
                return min(choices, key=lambda k: (links[k].dim is None, links[k].dim or 0, not links[k].ascending, k))

            found = (self._walk(src, dst, lowest_dimension),)
        else:
            found = (self.hashed_path(src, dst, key[2]),)
        if len(cache) >= _PATH_CACHE_PAIRS:
            cache.clear()
        cache[key] = found
        return found

    def hashed_path(self, src: int, dst: int, channel: int) -> tuple[Link, ...]:
        """The cheapest path from rank ``src`` to rank ``dst`` whose every choice of next hop is the ECMP hash of
        connection ``(src, dst, channel)``: the path of such a connection under ``ecmp`` (and ``source``) routing.

        Uncached, unlike :meth:`connection_paths`, for callers that ask once for each of many channels of a
        pair (MultiTree's trees, one channel each: the caches' bookkeeping cost five times the walk).
        """
        devices = self._devices

        def hashed(node: int, choices: tuple[int, ...]) -> int:
            return choices[ecmp_hash(src, dst, channel, devices[node].name) % len(choices)]

        return self._walk(src, dst, hashed)

    def path_through(self, src: int, dst: int, via: Iterable[str]) -> tuple[Link, ...] | None:
        """The cheapest path from rank ``src`` to rank ``dst`` through the devices ``via`` (in order), or None
        if that is not one (a source-routed schedule's recorded choice, checked against this topology)."""
        hops, _ = self._next_hops(src, dst)
        _, _, rank_device = self._graph
        index = self._device_position
        node = rank_device[src]
        path: list[Link] = []
        for name in (*via, self._ranks[dst]):
            step = index.get(name)
            link = next((self._links[k] for k in hops.get(node, ()) if index[self._links[k].dst] == step), None)
            if link is None:
                return None
            path.append(link)
            node = step  # type: ignore[assignment]  # a link was found, so the name is a device
        return tuple(path)

    def route_shares(self, src: int, dst: int, channel: int = 0) -> dict[tuple[str, str], float]:
        """The fraction of a message of connection ``(src, dst, channel)`` that crosses each directed link.

        Under :meth:`connection_paths`: one path carries all of it, or (spray)
        the paths share it evenly, and links that several paths share carry
        every share; beyond :data:`MAX_PATHS` sprayed paths, the counted shares
        of :meth:`sprayed`.
        """
        cache: dict[tuple[int, int, int], dict[tuple[str, str], float]] = self._shares_cache
        key = self.route_key(src, dst, channel)
        found = cache.get(key)
        if found is None:
            sprayed = self.sprayed(src, dst)
            found = _split_evenly(self.connection_paths(src, dst, channel)) if sprayed is None else \
                self._named_shares(sprayed)
            if len(cache) >= _PATH_CACHE_PAIRS:
                cache.clear()
            cache[key] = found
        return found

    def even_shares(self, src: int, dst: int) -> dict[tuple[str, str], float]:
        """The fraction of a message from rank ``src`` to rank ``dst`` on each directed link were it split evenly
        over all the pair's equal-cost paths (:meth:`routes`; under spray beyond :data:`MAX_PATHS`, all of them
        counted, :meth:`sprayed`): what ``spray`` does, and what spreading connections over the paths comes near
        under ECMP."""
        cache: dict[tuple[int, int], dict[tuple[str, str], float]] = self._even_cache
        found = cache.get((src, dst))
        if found is None:
            sprayed = self.sprayed(src, dst)
            found = _split_evenly(self.routes(src, dst)) if sprayed is None else self._named_shares(sprayed)
            if len(cache) >= _PATH_CACHE_PAIRS:
                cache.clear()
            cache[(src, dst)] = found
        return found

    def route_bandwidth(self, src: int, dst: int, channel: int = 0) -> float:
        """Bandwidth of a lone message of connection ``(src, dst, channel)`` over its paths.

        Under spray, from the count of cheapest paths through each link where the pair has at most
        :data:`MAX_PATHS` of them (:meth:`_spray_bandwidth`), without listing the paths: the ring search asks
        it of every pair of every group, and on a fat-tree each pair across leaves has a path per spine.
        """
        if self.topology.routing == "spray" and (src, dst) not in self._paths_cache:
            found = self._spray_bandwidth(src, dst)
            if found is not None:
                return found
            sprayed = self.sprayed(src, dst)  # kept as the paths were counted
            if sprayed is not None:
                bandwidth = self._link_bandwidth
                return min(bandwidth[k] / share for k, share in zip(sprayed.links, sprayed.shares))
        shares = self.route_shares(src, dst, channel)
        return min((self._by_pair[key].bandwidth / share for key, share in shares.items()), default=0.0)

    def _spray_bandwidth(self, src: int, dst: int) -> float | None:
        """:meth:`route_bandwidth` under spray by counting paths, or None where the pair has more than
        :data:`MAX_PATHS` of them or no route.  Beyond :data:`MAX_PATHS` the counts give the pair's
        :meth:`sprayed`, which is kept, so that the caller's next question does not count them again.

        A link ``u -> v`` lies on (paths from ``src`` to ``u``) x (paths from ``v`` to ``dst``) of the pair's
        cheapest paths; its share is that many times 1/n summed one by one, the same float the even split of
        the listed paths (:func:`_split_evenly`) adds up.
        """
        counts = self._path_counts(src, dst)
        if counts is None:
            return None
        if counts.paths > MAX_PATHS:
            if (src, dst) not in self._spray_cache:
                self._keep_spray(src, dst, counts)
            return None
        n = counts.paths
        totals = [0.0]  # totals[c]: 1/n added c times
        share = 1.0 / n
        for _ in range(n):
            totals.append(totals[-1] + share)
        bandwidth = self._link_bandwidth
        return min(bandwidth[k] / totals[c] for k, c in self._through(counts).items())

    def sprayed(self, src: int, dst: int) -> Spray | None:
        """Under spray, the pair's message as one flow over all of its cheapest paths where it has more than
        :data:`MAX_PATHS` of them; None where it has fewer (they are listed, :meth:`routes`), no route, or the
        routing is not spray.  Counting the paths through each link costs a pass over the
        devices on them, where listing them would cost their number: 32,768 between two pods of rail-65536.
        """
        if self.topology.routing != "spray":
            return None
        if (src, dst) in self._spray_cache:
            return self._spray_cache[(src, dst)]
        return self._keep_spray(src, dst, self._path_counts(src, dst))

    def _keep_spray(self, src: int, dst: int, counts: _PathCounts | None) -> Spray | None:
        """:meth:`sprayed` from the pair's counted paths, kept per pair."""
        found = None
        if counts is not None and counts.paths > MAX_PATHS:
            n = counts.paths
            through = self._through(counts)
            latency: dict[int, float] = {}  # the slowest path's latency from ``src`` to each device
            links, link_src = self._links, self._link_src
            for node in counts.order:
                ks = counts.parents[node]
                latency[node] = max((latency[link_src[k]] + links[k].latency for k in ks), default=0.0)
            found = Spray(tuple(through), tuple(c / n for c in through.values()), latency[counts.order[-1]])
        cache = self._spray_cache
        if len(cache) >= _PATH_CACHE_PAIRS:
            cache.clear()
        cache[(src, dst)] = found
        return found

    def _named_shares(self, sprayed: Spray) -> dict[tuple[str, str], float]:
        """The shares of a sprayed message keyed by link ends, as :meth:`route_shares` gives them."""
        links = self._links
        return {(links[k].src, links[k].dst): share for k, share in zip(sprayed.links, sprayed.shares)}

    def _path_counts(self, src: int, dst: int) -> _PathCounts | None:
        """The pair's cheapest paths counted (see :class:`_PathCounts`); None without a route."""
        tree = self._shortest_from(src)
        if src == dst or tree.cost[dst] == float("inf"):
            return None
        first, extra = tree.first, tree.extra
        link_src = self._link_src
        _, _, rank_device = self._graph
        parents: dict[int, tuple[int, ...]] = {}
        order: list[int] = []
        stack = [(rank_device[dst], False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if node in parents:
                continue
            head = first[node]
            ks = parents[node] = () if head == -2 else (head, *extra.get(node, ()))
            stack.append((node, True))
            for k in ks:
                if link_src[k] not in parents:
                    stack.append((link_src[k], False))
        into: dict[int, int] = {}
        for node in order:
            ks = parents[node]
            if ks:
                count = 0
                for k in ks:
                    count += into[link_src[k]]
                into[node] = count
            else:
                into[node] = 1
        return _PathCounts(into[order[-1]], order, parents, into)

    def _through(self, counts: _PathCounts) -> dict[int, int]:
        """How many of the pair's cheapest paths cross each link on one (by link index)."""
        link_src = self._link_src
        parents, into = counts.parents, counts.into
        out = dict.fromkeys(parents, 0)  # paths from each device to ``dst``
        out[counts.order[-1]] = 1
        through: dict[int, int] = {}  # a link is the parent link of one device only
        for node in reversed(counts.order):  # every device before those nearer ``src``
            paths = out[node]
            for k in parents[node]:
                out[link_src[k]] += paths
                through[k] = into[link_src[k]] * paths
        return through

    def route_latency(self, src: int, dst: int, channel: int = 0) -> float:
        """Latency of connection ``(src, dst, channel)``: of its slowest path, as the simulator charges it.

        Kept per connection that differs (the cost models ask it of every pair of every step)."""
        cache: dict[tuple[int, int, int], float] = self._latency_cache
        key = self.route_key(src, dst, channel)
        found = cache.get(key)
        if found is None:
            sprayed = self.sprayed(src, dst)
            if sprayed is not None:
                found = sprayed.latency
            else:
                paths = self.connection_paths(src, dst, channel)
                found = max(sum(link.latency for link in path) for path in paths) if paths else float("inf")
            if len(cache) >= _PATH_CACHE_PAIRS:
                cache.clear()
            cache[key] = found
        return found


def _split_evenly(paths: Sequence[Sequence[Link]]) -> dict[tuple[str, str], float]:
    """Each directed link's share of a message split evenly over ``paths`` (a link on several paths carries
    each of their shares)."""
    shares: dict[tuple[str, str], float] = {}
    if not paths:
        return shares
    share = 1.0 / len(paths)
    get = shares.get
    for path in paths:
        for link in path:
            key = (link.src, link.dst)
            shares[key] = get(key, 0.0) + share
    return shares
