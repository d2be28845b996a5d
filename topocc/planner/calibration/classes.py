"""Which rank pairs measure which link class (:func:`~topocc.planner.topology.calibration.link_classes_of`).

A topology's links fall into a few classes by where they sit, not by name (inside a host, per link kind;
host to network; each switch level), and a calibration measures each class once, as TACCL profiles each
kind of link once.  Two ranks' path is a sequence of classes, its *signature*; ranks with the same
signature see the same links, so one pair per signature is measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from topocc.planner.routing.network import Network, network_of
from topocc.planner.topology.calibration import link_classes_of
from topocc.planner.topology.model import Link, Topology
from topocc.planner.topology.plausible import gpu_fabric

__all__ = ["NOT_OVER_MPI", "LinkClasses", "PairProbe", "bottleneck"]

#: Why a class keeps the file's figures: the probe's messages go between CPU processes over MPI, which moves
#: a host's messages through the host's memory and never over its GPU fabric.
NOT_OVER_MPI = "not measurable over MPI between CPU processes"


@dataclass(frozen=True, slots=True)
class PairProbe:
    """A rank pair standing for every pair of its ``signature``; ``link`` is the class it measures (the
    path's narrowest class not measured by a shorter signature), None when it measures nothing new."""

    src: int
    dst: int
    signature: tuple[str, ...]
    link: str | None


class LinkClasses:
    """The classes of a topology's links, and the pairs that measure them."""

    def __init__(self, topology: Topology | Network) -> None:
        self.net = network_of(topology)
        self.topology = self.net.topology
        self._signatures: dict[tuple[int, int], tuple[str, ...]] = {}  # by (src, dst), as found

    @cached_property
    def _labels(self) -> dict[tuple[str, str], str]:
        return link_classes_of(self.topology)

    def of(self, link: Link) -> str:
        """The class of ``link``."""
        return self._labels[(link.src, link.dst)]

    def path(self, src: int, dst: int) -> tuple[Link, ...]:
        """The links a message from ``src`` to ``dst`` crosses (the first of its equal-cost paths); none where
        no route joins them without relaying through another GPU."""
        paths = self.net.connection_paths(src, dst, 0) if self.net.has_route(src, dst) else ()
        return paths[0] if paths else ()

    def signature(self, src: int, dst: int) -> tuple[str, ...]:
        """The classes along the path from ``src`` to ``dst``, in order."""
        key = (src, dst)
        found = self._signatures.get(key)
        if found is None:
            found = self._signatures[key] = tuple(self.of(link) for link in self.path(src, dst))
        return found


    @cached_property
    def unmeasurable(self) -> dict[str, str]:
        """The classes the probe cannot measure, each with why: a host's GPU fabric (NVLink, NVSwitch, xGMI:
        every link of the class is one, :func:`~topocc.planner.topology.plausible.gpu_fabric`).  They keep the
        file's figures."""
        types = {d.name: d.kind for d in self.topology.devices}
        fabric: dict[str, bool] = {}
        for link in self.topology.links:
            name = self.of(link)
            if name.startswith("host:"):
                fabric[name] = fabric.get(name, True) and gpu_fabric(link.kind, (types[link.src], types[link.dst]))
        return {name: NOT_OVER_MPI for name, every in fabric.items() if every}

    @cached_property
    def pairs(self) -> tuple[PairProbe, ...]:
        """One pair per signature (the first in rank order), those with fewer classes first, each with the
        class it measures (never an :attr:`unmeasurable` one).  Sources are every rank of the first host and
        the first rank of every host: a host's ranks differ by their place in it (their links, their NIC),
        hosts by where they hang."""
        found: dict[tuple[str, ...], tuple[int, int]] = {}
        n = self.topology.size
        hosts = list(self.topology.hosts.values())
        sources = sorted(set(hosts[0]) | {ranks[0] for ranks in hosts})
        for src in sources:
            for dst in range(n):
                if src != dst and (signature := self.signature(src, dst)):
                    found.setdefault(signature, (src, dst))
        known = set(self.unmeasurable)  # as good as measured: the file's figures stand
        probes = []
        for signature, (src, dst) in sorted(found.items(), key=lambda kv: (len(set(kv[0])), len(kv[0]), kv[1])):
            fresh = [c for c in dict.fromkeys(signature) if c not in known]
            link = None
            if fresh:
                bandwidth = {c: min(lk.bandwidth for lk in self.path(src, dst) if self.of(lk) == c) for c in fresh}
                link = min(fresh, key=lambda c: (bandwidth[c], fresh.index(c)))
                known.add(link)
            probes.append(PairProbe(src, dst, signature, link))
        return tuple(probes)


def bottleneck(links: Sequence[Link], cls: str, classes: LinkClasses) -> Link:
    """The narrowest link of class ``cls`` among ``links``."""
    return min((lk for lk in links if classes.of(lk) == cls), key=lambda lk: lk.bandwidth)
