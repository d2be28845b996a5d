"""The cluster model: devices, links and ranks, as the user described them.

A topology file lists devices and links explicitly, or describes a cluster compactly (``cluster:``,
expanded by :mod:`topocc.planner.topology.templates`), or both (:mod:`topocc.planner.topology.parse`).
Every GPU is a rank, in the order it is declared.  Links are directed inside the model; a full-duplex link
(the default) becomes one edge each way with the full bandwidth.  How messages find their way over the
links (routes, and the ``routing`` mode that picks among equal-cost paths) is
:mod:`topocc.planner.routing.network`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import networkx as nx

from topocc.planner.errors import TopologyError, UsageError
from topocc.runtime.bundle import rank_ranges

if TYPE_CHECKING:
    from topocc.planner.topology.calibration import Calibration

__all__ = [
    "DEFAULT_ROUTING",
    "DEVICE_KINDS",
    "ROUTING_MODES",
    "Device",
    "Link",
    "Topology",
    "build_topology",
    "describe",
    "parse_rank_ranges",
]

DEVICE_KINDS = ("gpu", "cpu", "pcie", "nvswitch", "nic", "switch")
#: How a fabric spreads a pair's traffic over its cheapest paths (see :mod:`topocc.planner.routing.network`).
ROUTING_MODES = ("spray", "ecmp", "dimension-order", "source")
#: The routing of a topology that does not say (explicit devices and links, single-host clusters): one path
#: per connection, what a switch without adaptive routing does; templates choose per network type.
DEFAULT_ROUTING = "ecmp"
UNLABELLED = "dimension-order routing needs links labelled with their dimension"


@dataclass(frozen=True, slots=True)
class Device:
    """A node of the cluster; ``host`` and ``rack`` group devices for hierarchical algorithms."""

    name: str
    kind: str
    host: str | None = None
    rack: str | None = None

    @property
    def domain(self) -> str | None:
        """The host the device belongs to (a GPU without one is its own host); None for network devices."""
        if self.host is not None:
            return self.host
        return self.name if self.kind == "gpu" else None


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
    """An immutable cluster description.

    Its lookups (graph, hosts, racks, fingerprint) are pure functions of the fields, computed once on first
    use; routes are the planner's business (:class:`~topocc.planner.routing.network.Network`).  A calibrated
    topology's ``links`` carry the measured figures and ``datasheet`` the file's, which its fingerprint
    keeps: it is the same cluster (:mod:`topocc.planner.topology.calibration`).
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    ranks: tuple[str, ...]
    description: str = ""
    source: str | None = field(default=None, compare=False)
    routing: str = DEFAULT_ROUTING
    calibration: Calibration | None = field(default=None, compare=False)
    datasheet: tuple[Link, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Devices as nodes (attribute ``device``), links as edges (attribute ``link``)."""
        g: nx.DiGraph[str] = nx.DiGraph(name=self.name)
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

    def bandwidth(self, src: str, dst: str) -> float:
        """The bandwidth of the directed link ``src -> dst``, which must exist (a key of a route or load table)."""
        return self._links[(src, dst)].bandwidth

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
                            for ln in (self.datasheet or self.links)),
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
    def host_index(self) -> tuple[int, ...]:
        """Each rank's host, numbered in the order of :attr:`hosts`."""
        index = [0] * self.size
        for h, ranks in enumerate(self.hosts.values()):
            for r in ranks:
                index[r] = h
        return tuple(index)

    @cached_property
    def racks(self) -> dict[str, tuple[int, ...]]:
        """Ranks grouped by rack (a rank with no rack is in the rack named after its host)."""
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(self.ranks):
            d = self._by_name[name]
            groups.setdefault(d.rack or d.host or name, []).append(i)
        return {r: tuple(v) for r, v in groups.items()}

    @cached_property
    def levels(self) -> tuple[int, ...]:
        """The ranks as a row-major grid of the hierarchy: racks x hosts x GPUs where every rack and every host
        holds as many consecutive ranks, else hosts x GPUs, else a line of the ranks."""
        ranks = self.size
        per_host = _regular(self.hosts.values(), ranks)
        if not per_host or not 1 < per_host < ranks:
            return (ranks,)
        per_rack = _regular(self.racks.values(), ranks)
        if per_rack and per_host < per_rack < ranks and per_rack % per_host == 0:
            return (ranks // per_rack, per_rack // per_host, per_host)
        return (ranks // per_host, per_host)

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

    def with_routing(self, routing: str) -> Topology:
        """This topology under another routing (to compare modes); checked as :func:`build_topology` checks it."""
        if unlabelled(routing, self.links):
            raise TopologyError(UNLABELLED, where=self.source or self.name, fix="use a torus or mesh network")
        built = build_topology(self.name, self.devices, self.links, description=self.description, source=self.source,
                               routing=routing)
        built = replace(built, calibration=self.calibration, datasheet=self.datasheet)
        return built if built.ranks == self.ranks else replace(built, ranks=self.ranks)  # a subset stays one

    def subset(self, ranks: Sequence[int]) -> Topology:
        """The same devices and links with only ``ranks`` as ranks, in that order: a process group's topology.

        The group's rank ``i`` is this topology's rank ``ranks[i]``; the other GPUs stay devices (they may
        carry traffic, as they do in the whole cluster).  The name (and source) gain the ranks, compacted:
        ``emu-racks[0-3]``, which :func:`~topocc.planner.topology.catalogue.resolve_topology` reads back.
        All ranks in their order are the topology itself.
        """
        where = self.source or self.name
        if not ranks:
            raise UsageError("a process group needs at least one rank", where=where, fix="list the group's ranks")
        bad = next((r for r in ranks if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < self.size),
                   None)
        if bad is not None:
            raise UsageError(f"rank {bad!r} is not a rank of {self.name} (0-{self.size - 1})", where=where,
                             fix=f"list ranks between 0 and {self.size - 1}, or pass the topology the job runs on")
        seen: set[int] = set()
        for r in ranks:
            if r in seen:
                raise UsageError(f"rank {r} is listed twice", where=where, fix="list each rank of the group once")
            seen.add(r)
        if tuple(ranks) == tuple(range(self.size)):
            return self
        label = f"[{rank_ranges(ranks)}]"
        return Topology(self.name + label, self.devices, self.links, tuple(self.ranks[r] for r in ranks),
                        self.description, self.source + label if self.source else None, self.routing,
                        self.calibration, self.datasheet)

    def reversed(self) -> Topology:
        """The topology with every link turned round (itself when all links are full duplex): a gather timed
        on it is the reduction it mirrors, timed on this one."""
        if self.symmetric:
            return self
        return Topology(f"{self.name} (reversed)", self.devices,
                        tuple(replace(k, src=k.dst, dst=k.src, ascending=not k.ascending) for k in self.links),
                        self.ranks, self.description, self.source, self.routing, self.calibration)


def _regular(groups: Iterable[Sequence[int]], ranks: int) -> int | None:
    """The size of every group where all have one size and each holds consecutive ranks, else None."""
    sizes = set()
    for group in groups:
        if list(group) != list(range(group[0], group[0] + len(group))):
            return None
        sizes.add(len(group))
    size = sizes.pop() if len(sizes) == 1 else None
    return size if size and ranks % size == 0 else None


def parse_rank_ranges(text: str) -> tuple[int, ...]:
    """The ranks ``0-3,8`` names, in order: comma-separated ranks and ascending ranges (the inverse of
    :func:`~topocc.runtime.bundle.rank_ranges`)."""
    ranks: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise UsageError(f"cannot read ranks {text!r}", fix="write ranks as 0-3, 0,1,2,3 or 8-11,20")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last < first:
            raise UsageError(f"rank range {part.strip()!r} runs backwards", fix=f"write {last}-{first}")
        ranks.extend(range(first, last + 1))
    return tuple(ranks)


def unlabelled(routing: str | None, links: Iterable[Link]) -> bool:
    """Whether ``routing`` is dimension-order over links none of which says its dimension."""
    return routing == "dimension-order" and all(link.dim is None for link in links)


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
