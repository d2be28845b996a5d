"""The cluster model: devices and links from YAML, as a bandwidth graph with routes.

A topology file lists devices and links explicitly, or describes a cluster
compactly (``cluster:``, expanded by :mod:`planner.templates`), or both.  Every
GPU is a rank, in the order it is declared.  Links are directed inside the
model; a full-duplex link (the default) becomes one edge each way with the full
bandwidth.  Messages between two ranks follow the cheapest paths whose interior
holds no GPU (GPUs do not forward data on their own: a schedule that needs to
relay through a GPU says so with a receive and a send).

Where a pair has several cheapest paths, the topology's ``routing`` says which
a connection (sender, receiver, channel) takes, as its fabric would:

* ``spray``: every message split evenly over the paths (adaptive routing,
  packet spraying);
* ``ecmp``: one path per connection; every device with several next hops on
  a cheapest path picks one by hashing the connection with its own name, as a
  switch hashes a flow's 5-tuple (:func:`ecmp_hash`);
* ``dimension-order``: the one cheapest path that corrects the lowest
  dimension first (links labelled with ``dim``: torus and mesh networks);
* ``source``: the sender picks among the paths (a schedule records its
  choices, :mod:`planner.paths`); a connection without one hashes as ``ecmp``.

:meth:`Topology.connection_paths` is the one place that applies the mode; the
simulator, the bounds and every algorithm's cost model go through it.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import networkx as nx

from planner._yaml import Source, YDict, YList, load_yaml, parse_yaml
from planner.errors import TopologyError
from planner.route_trees import HubSearches, RouteTree, SharedTree, hubs, route_tree, search
from planner.units import UnitError, parse_bandwidth, parse_time

__all__ = [
    "DEFAULT_ROUTING",
    "DEVICE_KINDS",
    "ROUTING_MODES",
    "Device",
    "Link",
    "Topology",
    "build_topology",
    "ecmp_hash",
    "load_topology",
    "parse_topology",
    "parse_topology_text",
]

T = TypeVar("T")

DEVICE_KINDS = ("gpu", "cpu", "pcie", "nvswitch", "nic", "switch")
#: How a fabric spreads a pair's traffic over its cheapest paths (see the module docstring).
ROUTING_MODES = ("spray", "ecmp", "dimension-order", "source")
#: The routing of a topology that does not say (explicit devices and links, single-host clusters): one path
#: per connection, what a switch without adaptive routing does; templates choose per network type.
DEFAULT_ROUTING = "ecmp"
#: Modes in which two channels between one pair may take different paths.
PER_CONNECTION = ("ecmp", "source")
#: A route's cost is its latency plus the time a message of this size takes on each hop:
#: both terms matter when choosing between a short slow path and a longer fast one.
ROUTE_REFERENCE_BYTES = 1 << 20
#: At most this many equal-cost paths are kept per pair (messages are split evenly over them); a pair with
#: more keeps those its hash picks (:meth:`Topology.routes`).
MAX_PATHS = 16
#: From this many ranks on, routes are read off shared searches where the fabric has few hubs
#: (:mod:`planner.route_trees`): below it one search per rank costs seconds, and its routes are listed in the
#: order the shipped schedules were compiled with.
SHARED_ROUTES_RANKS = 2048
#: Rank pairs whose paths a topology keeps (each up to MAX_PATHS paths).
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


@dataclass(frozen=True, slots=True)
class Device:
    """A node of the cluster; ``host`` and ``rack`` group devices for hierarchical algorithms."""

    name: str
    kind: str
    host: str | None = None
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class Link:
    """A directed link; ``bandwidth`` (bytes/s) already counts all ``count`` parallel lanes.

    ``dim`` labels a torus or mesh link with the dimension it moves along, and
    ``ascending`` whether it moves to the next coordinate (wrapping round) or the
    previous one: what dimension-order routing follows.
    """

    src: str
    dst: str
    bandwidth: float
    latency: float
    count: int = 1
    kind: str = ""
    dim: int | None = None
    ascending: bool = True


@dataclass(frozen=True)
class Topology:
    """An immutable cluster description; derived views (graph, routes) are computed once, lazily."""

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    ranks: tuple[str, ...]
    description: str = ""
    source: str | None = field(default=None, compare=False)
    routing: str = DEFAULT_ROUTING

    @property
    def size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Devices as nodes (attribute ``device``), links as edges (attribute ``link``)."""
        g = nx.DiGraph(name=self.name)
        for d in self.devices:
            g.add_node(d.name, device=d)
        for link in self.links:
            g.add_edge(link.src, link.dst, link=link, bandwidth=link.bandwidth, latency=link.latency)
        return g

    @cached_property
    def _by_name(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}

    @cached_property
    def _rank_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.ranks)}

    @cached_property
    def _links(self) -> dict[tuple[str, str], Link]:
        return {(link.src, link.dst): link for link in self.links}

    def device(self, name: str) -> Device:
        return self._by_name[name]

    def rank_device(self, rank: int) -> Device:
        return self._by_name[self.ranks[rank]]

    def rank_of(self, device: str) -> int | None:
        return self._rank_index.get(device)

    def link(self, src: str, dst: str) -> Link | None:
        """The directed link ``src -> dst``, if there is one."""
        return self._links.get((src, dst))

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the normalised topology (devices, links, rank order, routing; not the name).

        Under spray routing the document is what it was before topologies had a
        routing (every topology sprayed then), so a schedule compiled then still
        matches a spray topology, and no other; links' ``dim`` labels count only
        where dimension-order routing follows them.
        """
        labelled = self.routing == "dimension-order"
        doc: dict[str, Any] = {
            "devices": sorted([d.name, d.kind, d.host or "", d.rack or ""] for d in self.devices),
            "links": sorted([ln.src, ln.dst, repr(ln.bandwidth), repr(ln.latency), ln.count]
                            + ([ln.dim, ln.ascending] if labelled and ln.dim is not None else [])
                            for ln in self.links),
            "ranks": list(self.ranks),
        }
        if self.routing != "spray":
            doc["routing"] = self.routing
        return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()

    @cached_property
    def hosts(self) -> dict[str, tuple[int, ...]]:
        """Ranks grouped by host, hosts in order of their first rank (a rank with no host is its own host)."""
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(self.ranks):
            groups.setdefault(self._by_name[name].host or name, []).append(i)
        return {h: tuple(r) for h, r in groups.items()}

    @cached_property
    def racks(self) -> dict[str, tuple[int, ...]]:
        """Ranks grouped by rack (a rank with no rack is in the rack named after its host)."""
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(self.ranks):
            d = self._by_name[name]
            groups.setdefault(d.rack or d.host or name, []).append(i)
        return {r: tuple(v) for r, v in groups.items()}

    # ----------------------------------------------------------------- routing

    def _cost(self, link: Link) -> float:
        return link.latency + ROUTE_REFERENCE_BYTES / link.bandwidth

    @cached_property
    def _device_position(self) -> dict[str, int]:
        """Each device's index in :attr:`devices`."""
        return {d.name: i for i, d in enumerate(self.devices)}

    @cached_property
    def _graph(self) -> tuple[list[list[tuple[int, float, int]]], bytearray, list[int]]:
        """Devices as indices: out-links ``(head, route cost, link index)`` per device, a rank flag per
        device, and each rank's device index."""
        index = self._device_position
        adjacency: list[list[tuple[int, float, int]]] = [[] for _ in self.devices]
        for k, link in enumerate(self.links):
            adjacency[index[link.src]].append((index[link.dst], self._cost(link), k))
        is_rank = bytearray(len(self.devices))
        rank_device = [index[name] for name in self.ranks]
        for i in rank_device:
            is_rank[i] = 1
        return adjacency, is_rank, rank_device

    @cached_property
    def _link_src(self) -> list[int]:
        """The device index of each link's source (by link index), for walking route trees back."""
        index = self._device_position
        return [index[link.src] for link in self.links]

    @cached_property
    def _link_bandwidth(self) -> list[float]:
        """Each link's bandwidth by link index, for the route bandwidth's inner loop."""
        return [link.bandwidth for link in self.links]

    @cached_property
    def _route_cache(self) -> dict[int, RouteTree | SharedTree]:
        return {}

    @cached_property
    def _paths_cache(self) -> dict[tuple[int, int], tuple[tuple[Link, ...], ...]]:
        return {}

    @cached_property
    def _hub_searches(self) -> HubSearches | None:
        """The hubs' shared searches (:mod:`planner.route_trees`) where this topology's routes are read from
        them: from :data:`SHARED_ROUTES_RANKS` ranks on, when the hubs are fewer than half the ranks."""
        if self.size < SHARED_ROUTES_RANKS:
            return None
        adjacency, is_rank, _ = self._graph
        flags = hubs(adjacency, is_rank)
        return HubSearches(adjacency, is_rank, flags) if 2 * sum(flags) < self.size else None

    def _shortest_from(self, src: int) -> RouteTree | SharedTree:
        """The shortest-path DAG from rank ``src`` (routes never cross another rank), searched once per source.

        Kept compactly (a parent link index per device, a cost per rank: about
        5 bytes per device, so 4096 ranks on 8848 devices hold under 200 MB) or,
        on a large fabric, as a :class:`~planner.route_trees.SharedTree`.
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
        return self._shortest_from(src).cost[dst] != float("inf")

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
        links, link_src, devices = self.links, self._link_src, self.devices
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

    @cached_property
    def symmetric(self) -> bool:
        """Whether every link has a reverse twin of equal bandwidth and latency (all full duplex).

        On a symmetric topology data flowing toward a root can use the reverse of
        any plan that spreads data from it, so such plans are solved once.
        """
        links = self._links
        return all(
            (twin := links.get((link.dst, link.src))) is not None
            and twin.bandwidth == link.bandwidth and twin.latency == link.latency
            for link in self.links
        )

    def _next_hops(self, src: int, dst: int) -> tuple[dict[int, tuple[int, ...]], bool]:
        """Every device on a cheapest path from rank ``src`` to rank ``dst`` with its out-links (indices, in
        declaration order) that stay on one; and whether any device has a choice (several paths)."""
        cache: dict[tuple[int, int], tuple[dict[int, tuple[int, ...]], bool]] = self.derived("next_hops", dict)
        found = cache.get((src, dst))
        if found is not None:
            return found
        tree = self._shortest_from(src)
        _, _, rank_device = self._graph
        index = self._device_position
        links = self.links
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
            link = self.links[choices[0] if len(choices) == 1 else choose(node, choices)]
            path.append(link)
            node = index[link.dst]
        return tuple(path)

    def equal_cost_links(self, src: int, dst: int) -> tuple[Link, ...]:
        """Every link on some cheapest path from rank ``src`` to rank ``dst``: the paths a connection may take
        where the fabric lets it choose (any path through them, from ``src`` on, is a cheapest path)."""
        hops, _ = self._next_hops(src, dst)
        return tuple(self.links[k] for ks in hops.values() for k in ks)

    def common_link_time(self, messages: Iterable[tuple[int, int, float]]) -> float:
        """Seconds the busiest link needs for ``messages`` (source rank, destination rank, bytes), counting
        only the links every cheapest path of each pair crosses (:meth:`common_links`): a lower bound of
        their link time under any routing and channel assignment (the algorithms' link floors)."""
        load: dict[Link, float] = {}
        for src, dst, nbytes in messages:
            for link in self.common_links(src, dst):
                load[link] = load.get(link, 0.0) + nbytes
        return max((v / link.bandwidth for link, v in load.items()), default=0.0)

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
        links = self.links
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
        if channel and self.routing in PER_CONNECTION and self._next_hops(src, dst)[1]:
            return (src, dst, channel)
        return (src, dst, 0)

    def channels_change_path(self, src: int, dst: int) -> bool:
        """Whether the pair's connections may take different paths by channel (ECMP, source routing, several
        equal-cost paths): what renumbering a schedule's channels can spread."""
        return self.has_route(src, dst) and self.route_key(src, dst, 1)[2] != 0

    def connection_paths(self, src: int, dst: int, channel: int = 0) -> tuple[tuple[Link, ...], ...]:
        """The paths the messages of connection ``(src, dst, channel)`` take under the topology's routing.

        A message is split evenly over them: all of :meth:`routes` under
        ``spray``, one path otherwise (under ``source``, the ``ecmp`` path: a
        schedule's recorded choices are applied by :func:`planner.paths.recorded_paths`).
        Empty when the pair has no route.
        """
        key = self.route_key(src, dst, channel)
        cache: dict[tuple[int, int, int], tuple[tuple[Link, ...], ...]] = self.derived("connection_paths", dict)
        found = cache.get(key)
        if found is not None:
            return found
        if self.routing == "spray" or not self.has_route(src, dst):
            found = self.routes(src, dst)
        elif self.routing == "dimension-order":
            links = self.links

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
        devices = self.devices

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
        for name in (*via, self.ranks[dst]):
            step = index.get(name)
            link = next((self.links[k] for k in hops.get(node, ()) if index[self.links[k].dst] == step), None)
            if link is None:
                return None
            path.append(link)
            node = step  # type: ignore[assignment]  # a link was found, so the name is a device
        return tuple(path)

    def route_shares(self, src: int, dst: int, channel: int = 0) -> dict[tuple[str, str], float]:
        """The fraction of a message of connection ``(src, dst, channel)`` that crosses each directed link.

        Under :meth:`connection_paths`: one path carries all of it, or (spray)
        the paths share it evenly, and links that several paths share carry
        every share.
        """
        cache: dict[tuple[int, int, int], dict[tuple[str, str], float]] = self.derived("route_shares", dict)
        key = self.route_key(src, dst, channel)
        found = cache.get(key)
        if found is None:
            found = _split_evenly(self.connection_paths(src, dst, channel))
            if len(cache) >= _PATH_CACHE_PAIRS:
                cache.clear()
            cache[key] = found
        return found

    def even_shares(self, src: int, dst: int) -> dict[tuple[str, str], float]:
        """The fraction of a message from rank ``src`` to rank ``dst`` on each directed link were it split evenly
        over all the pair's equal-cost paths (:meth:`routes`): what ``spray`` does, and what spreading
        connections over the paths comes near under ECMP."""
        cache: dict[tuple[int, int], dict[tuple[str, str], float]] = self.derived("even_shares", dict)
        found = cache.get((src, dst))
        if found is None:
            found = _split_evenly(self.routes(src, dst))
            if len(cache) >= _PATH_CACHE_PAIRS:
                cache.clear()
            cache[(src, dst)] = found
        return found

    def route_bandwidth(self, src: int, dst: int, channel: int = 0) -> float:
        """Bandwidth of a lone message of connection ``(src, dst, channel)`` over its paths.

        Under spray, from the count of cheapest paths through each link where the pair has at most
        :data:`MAX_PATHS` of them (:meth:`_spray_bandwidth`), without listing the paths: the ring search asks
        it of every pair of every group (31k pairs of 16 paths each on fattree-1024).
        """
        if self.routing == "spray" and (src, dst) not in self._paths_cache:
            found = self._spray_bandwidth(src, dst)
            if found is not None:
                return found
        shares = self.route_shares(src, dst, channel)
        return min((self._links[key].bandwidth / share for key, share in shares.items()), default=0.0)

    def _spray_bandwidth(self, src: int, dst: int) -> float | None:
        """:meth:`route_bandwidth` under spray by counting paths, or None where :meth:`routes` would keep only
        :data:`MAX_PATHS` of the paths (or there is no route).

        A link ``u -> v`` lies on (paths from ``src`` to ``u``) x (paths from ``v`` to ``dst``) of the pair's
        cheapest paths; its share is that many times 1/n summed one by one, the same float the even split of
        the listed paths (:func:`_split_evenly`) adds up.
        """
        tree = self._shortest_from(src)
        if src == dst or tree.cost[dst] == float("inf"):
            return None
        first, extra = tree.first, tree.extra
        link_src = self._link_src
        _, _, rank_device = self._graph
        target = rank_device[dst]
        # the devices on some cheapest path, in depth-first postorder back from the destination (every device
        # after those on the way to it from ``src``), each with its parent links
        parents: dict[int, tuple[int, ...]] = {}
        order: list[int] = []
        stack = [(target, False)]
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
        into: dict[int, int] = {}  # paths from ``src`` to each device
        for node in order:
            ks = parents[node]
            if ks:
                count = 0
                for k in ks:
                    count += into[link_src[k]]
                into[node] = count
            else:
                into[node] = 1
        n = into[target]
        if n > MAX_PATHS:
            return None
        out = dict.fromkeys(parents, 0)  # paths from each device to ``dst``
        out[target] = 1
        through: dict[int, int] = {}  # paths through each link (a link is the parent link of one device only)
        for node in reversed(order):  # every device before those nearer ``src``
            paths = out[node]
            for k in parents[node]:
                out[link_src[k]] += paths
                through[k] = into[link_src[k]] * paths
        totals = [0.0]  # totals[c]: 1/n added c times
        share = 1.0 / n
        for _ in range(n):
            totals.append(totals[-1] + share)
        bandwidth = self._link_bandwidth
        return min(bandwidth[k] / totals[c] for k, c in through.items())

    def route_latency(self, src: int, dst: int, channel: int = 0) -> float:
        """Latency of connection ``(src, dst, channel)``: of its slowest path, as the simulator charges it.

        Kept per connection that differs (the cost models ask it of every pair of every step)."""
        cache: dict[tuple[int, int, int], float] = self.derived("route_latency", dict)
        key = self.route_key(src, dst, channel)
        found = cache.get(key)
        if found is None:
            paths = self.connection_paths(src, dst, channel)
            found = max(sum(link.latency for link in path) for path in paths) if paths else float("inf")
            if len(cache) >= _PATH_CACHE_PAIRS:
                cache.clear()
            cache[key] = found
        return found

    def with_routing(self, routing: str) -> Topology:
        """This topology under another routing (to compare modes); checked as :func:`build_topology` checks it."""
        if _unlabelled(routing, self.links):
            raise TopologyError(_UNLABELLED, where=self.source or self.name, fix="use a torus or mesh network")
        return build_topology(self.name, self.devices, self.links, description=self.description, source=self.source,
                              routing=routing)

    def reversed(self) -> Topology:
        """The topology with every link turned round (itself when all links are full duplex): a gather timed
        on it is the reduction it mirrors, timed on this one."""
        if self.symmetric:
            return self
        return self.derived("reversed", lambda: Topology(
            f"{self.name} (reversed)", self.devices,
            tuple(replace(k, src=k.dst, dst=k.src, ascending=not k.ascending) for k in self.links),
            self.ranks, self.description, self.source, self.routing))

    def derived(self, key: str, factory: Callable[[], T]) -> T:
        """A value computed once per topology and kept with it (the simulator's network, the cut family)."""
        store: dict[str, Any] = self.__dict__.setdefault("_derived", {})
        if key not in store:
            store[key] = factory()
        return store[key]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- loading

_TOP_KEYS = ("name", "description", "defaults", "routing", "devices", "links", "cluster")
_DEVICE_KEYS = ("name", "type", "host", "rack", "count")
_LINK_KEYS = ("ends", "bandwidth", "latency", "count", "direction", "kind", "dim")


def load_topology(path: str | Path) -> Topology:
    """Load and validate a topology YAML file.

    >>> topo = load_topology("topologies/dgx1-v100.yaml")  # doctest: +SKIP
    >>> topo.size  # doctest: +SKIP
    8
    """
    return parse_topology(load_yaml(path), str(path))


def parse_topology_text(text: str, name: str = "<topology>") -> Topology:
    """Parse topology YAML given as text (``name`` is used in messages)."""
    return parse_topology(parse_yaml(text, name), name)


def check_keys(src: Source, obj: Any, what: str, allowed: Iterable[str], required: Iterable[str] = ()) -> YDict:
    """``obj`` must be a mapping with only ``allowed`` keys and all ``required`` ones."""
    if not isinstance(obj, dict):
        raise src.error(obj, None, f"{what} must be a mapping, got {_kind(obj)}")
    allowed = tuple(allowed)
    for key in obj:
        if key not in allowed:
            hint = _close_match(str(key), allowed)
            raise src.error(
                obj, key, f"unknown key {key!r} in {what}",
                fix=f"did you mean {hint!r}?" if hint else f"allowed keys: {', '.join(allowed)}",
            )
    for key in required:
        if key not in obj:
            raise src.error(obj, None, f"{what} lacks the required key {key!r}")
    return obj  # type: ignore[return-value]


def _close_match(word: str, choices: Iterable[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _kind(value: Any) -> str:
    return {dict: "a mapping", YDict: "a mapping", list: "a list", YList: "a list", str: "a string",
            type(None): "nothing"}.get(type(value), type(value).__name__)


def quantity(src: Source, obj: Any, key: str, parse: Any, default: Any = None) -> float:
    """Parse ``obj[key]`` with a unit parser, reporting the line on failure."""
    if key not in obj or obj[key] is None:
        if default is None:
            example = "0.7 us" if parse is parse_time else "25 GB/s" if parse is parse_bandwidth else "..."
            raise src.error(obj, None, f"missing {key}", fix=f"add '{key}: {example}'")
        return default
    try:
        return parse(obj[key])
    except UnitError as exc:
        raise src.error(obj, key, f"bad {key}: {exc}") from None


def positive_int(src: Source, obj: Any, key: str, default: int | None = None, minimum: int = 1) -> int:
    value = obj.get(key, default) if isinstance(obj, dict) else default
    if value is None:
        raise src.error(obj, None, f"missing {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise src.error(obj, key, f"{key} must be a whole number >= {minimum}, got {value!r}")
    return value


def name_string(src: Source, obj: Any, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value).strip() == "":
        raise src.error(obj, key, f"{key} must be a non-empty name, got {value!r}")
    return str(value)


@dataclass(frozen=True, slots=True)
class LinkDefaults:
    """Values a link takes when it does not say (``defaults:`` at the top of a file)."""

    latency: float = 0.0
    bandwidth: float | None = None


def parse_link(src: Source, item: Any, defaults: LinkDefaults) -> tuple[list[Link], str, str]:
    """One ``links:`` entry -> its directed links (two for full duplex) and its two ends."""
    check_keys(src, item, "a link", _LINK_KEYS, ("ends",))
    ends = item["ends"]
    if not isinstance(ends, list) or len(ends) != 2 or not all(isinstance(e, (str, int)) for e in ends):
        raise src.error(item, "ends", "ends must be a list of two device names, e.g. [gpu0, gpu1]")
    a, b = str(ends[0]), str(ends[1])
    if a == b:
        raise src.error(item, "ends", f"self-loop: link from {a} to itself", fix="a link joins two different devices")
    count = positive_int(src, item, "count", 1)
    per_lane = quantity(src, item, "bandwidth", parse_bandwidth, defaults.bandwidth)
    latency = quantity(src, item, "latency", parse_time, defaults.latency)
    kind = str(item.get("kind", ""))
    direction = item.get("direction", "both")
    if direction not in ("both", "forward"):
        raise src.error(item, "direction", f"direction must be 'both' or 'forward', got {direction!r}")
    dim = positive_int(src, item, "dim", minimum=0) if "dim" in item else None
    links = [Link(a, b, per_lane * count, latency, count, kind, dim)]
    if direction == "both":
        links.append(Link(b, a, per_lane * count, latency, count, kind, dim, ascending=False))
    return links, a, b


_UNLABELLED = "dimension-order routing needs links labelled with their dimension"


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


def _unlabelled(routing: str | None, links: Iterable[Link]) -> bool:
    """Whether ``routing`` is dimension-order over links none of which says its dimension."""
    return routing == "dimension-order" and all(link.dim is None for link in links)


def choice(src: Source, obj: YDict, key: str, choices: tuple[str, ...], default: str | None, what: str) -> str:
    """``obj[key]`` must be one of ``choices``; a near miss is suggested."""
    if key not in obj:
        if default is None:
            raise src.error(obj, None, f"missing {key}", fix=f"use one of {', '.join(choices)}")
        return default
    value = obj[key]
    if value not in choices:
        hint = _close_match(str(value), choices)
        raise src.error(obj, key, f"unknown {what} {value!r}",
                        fix=f"did you mean {hint!r}?" if hint else f"use one of {', '.join(choices)}")
    return str(value)


def parse_topology(doc: Any, source: str = "<topology>") -> Topology:
    """Validate a decoded topology document and build the :class:`Topology`."""
    src = Source(source)
    if doc is None:
        raise TopologyError("empty topology file", where=source, fix="see docs/topology-format.md")
    top = check_keys(src, doc, "the topology", _TOP_KEYS, ("name",))
    name = name_string(src, top, "name")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise src.error(top, "description", "description must be text")
    defaults = LinkDefaults()
    if "defaults" in top:
        d = check_keys(src, top["defaults"], "defaults", ("latency", "bandwidth"))
        defaults = LinkDefaults(
            quantity(src, d, "latency", parse_time, 0.0),
            quantity(src, d, "bandwidth", parse_bandwidth) if "bandwidth" in d else None,
        )
    if "devices" not in top and "cluster" not in top:
        raise src.error(top, None, "the topology declares no devices", fix="add 'devices:' and 'links:' or 'cluster:'")
    routing = choice(src, top, "routing", ROUTING_MODES, None, "routing") if "routing" in top else None

    devices: list[Device] = []
    places: dict[str, str] = {}  # device name -> where it was declared
    links: list[Link] = []
    link_places: dict[tuple[str, str], str] = {}

    def add_device(device: Device, where: str) -> None:
        if device.name in places:
            raise TopologyError(f"duplicate device name {device.name!r} (first declared at {places[device.name]})",
                                where=where, fix="give every device a unique name")
        places[device.name] = where
        devices.append(device)

    def add_links(new: Iterable[Link], where: str) -> None:
        for link in new:
            key = (link.src, link.dst)
            if key in link_places:
                raise TopologyError(
                    f"link {link.src} -> {link.dst} is declared twice (first at {link_places[key]})",
                    where=where, fix="declare it once; use count: N for parallel links",
                )
            link_places[key] = where
            links.append(link)

    if "cluster" in top:
        from planner.templates import expand_cluster

        t_devices, t_links, routing = expand_cluster(src, top["cluster"], defaults, routing)
        where = src.at(top, "cluster")
        for device in t_devices:
            add_device(device, where)
        add_links(t_links, where)

    device_list = top.get("devices", [])
    if not isinstance(device_list, list):
        raise src.error(top, "devices", "devices must be a list")
    for i, item in enumerate(device_list):
        where = src.at(device_list, i)
        check_keys(src, item, "a device", _DEVICE_KEYS, ("name", "type"))
        base = name_string(src, item, "name")
        kind = item["type"]
        if kind not in DEVICE_KINDS:
            hint = _close_match(str(kind), DEVICE_KINDS)
            raise src.error(item, "type", f"unknown device type {kind!r}",
                            fix=f"did you mean {hint!r}?" if hint else f"use one of {', '.join(DEVICE_KINDS)}")
        host = item.get("host")
        rack = item.get("rack")
        for key, value in (("host", host), ("rack", rack)):
            if value is not None and (not isinstance(value, (str, int)) or isinstance(value, bool)):
                raise src.error(item, key, f"{key} must be a name")
        count = positive_int(src, item, "count", 0, minimum=0) if "count" in item else None
        names = [base] if count is None else [f"{base}{j}" for j in range(count)]
        for n in names:
            add_device(Device(n, kind, None if host is None else str(host), None if rack is None else str(rack)), where)

    link_list = top.get("links", [])
    if not isinstance(link_list, list):
        raise src.error(top, "links", "links must be a list")
    for i, item in enumerate(link_list):
        new, a, b = parse_link(src, item, defaults)
        for end in (a, b):
            if end not in places:
                hint = _close_match(end, places)
                raise src.error(item, "ends", f"link names unknown device {end!r}",
                                fix=f"did you mean {hint!r}?" if hint else "declare it under devices:")
        add_links(new, src.at(link_list, i))

    if _unlabelled(top.get("routing"), links):
        raise src.error(top, "routing", _UNLABELLED,
                        fix="use a torus or mesh network under cluster:, or give the grid's links dim: 0, 1, ...")
    return build_topology(name, devices, links, description=description, source=source,
                          routing=routing or DEFAULT_ROUTING)


def build_topology(name: str, devices: Iterable[Device], links: Iterable[Link], *, description: str = "",
                   source: str | None = None, routing: str = DEFAULT_ROUTING) -> Topology:
    """Assemble and check a topology: known endpoints, at least one rank, every rank reaching every other."""
    devices = tuple(devices)
    links = tuple(links)
    where = source or name
    if routing not in ROUTING_MODES:
        raise TopologyError(f"unknown routing {routing!r}", where=where, fix=f"use one of {', '.join(ROUTING_MODES)}")
    known = {d.name for d in devices}
    for link in links:
        for end in (link.src, link.dst):
            if end not in known:
                raise TopologyError(f"link {link.src} -> {link.dst} names unknown device {end!r}", where=where)
        if link.bandwidth <= 0:
            raise TopologyError(f"link {link.src} -> {link.dst} has no bandwidth", where=where)
    ranks = tuple(d.name for d in devices if d.kind == "gpu")
    if not ranks:
        raise TopologyError("the topology has no GPUs, so no ranks", where=where, fix="add devices of type gpu")
    topo = Topology(name, devices, links, ranks, description, source, routing)
    _check_connected(topo, where)
    return topo


def _check_connected(topo: Topology, where: str) -> None:
    """Every rank must be able to reach every other, relaying through GPUs if need be."""
    g = topo.graph
    for component in nx.strongly_connected_components(g):
        members = [r for r in topo.ranks if r in component]
        if members and len(members) < len(topo.ranks):
            outside = next(r for r in topo.ranks if r not in component)
            raise TopologyError(
                f"ranks cannot reach each other: {members[0]} has no path to or from {outside}",
                where=where, fix="add the missing links (or check link directions)",
            )


def describe(topo: Topology) -> Mapping[str, Any]:
    """A plain summary (``topocc topo show``): counts by kind, hosts, racks, bandwidth range."""
    kinds: dict[str, int] = {}
    for d in topo.devices:
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    bws = [link.bandwidth for link in topo.links]
    return {
        "name": topo.name,
        "description": topo.description,
        "ranks": topo.size,
        "devices": kinds,
        "links": len(topo.links),
        "routing": topo.routing,
        "hosts": len(topo.hosts),
        "racks": len(topo.racks),
        "min_link_bandwidth_GBps": min(bws) / 1e9 if bws else None,
        "max_link_bandwidth_GBps": max(bws) / 1e9 if bws else None,
        "fingerprint": topo.fingerprint,
    }
