"""The symmetries a symmetric schedule shares with its network, and the orbits of ranks and links they make.

A permutation ``g`` of the ranks is a symmetry of a schedule on a network when it extends to an automorphism
of the network (devices onto devices, every link onto a link of the same bandwidth, latency, count, kind and
dimension) and carries every rank's program onto its image's: ``program(g r)`` is ``program(r)`` with each
peer ``p`` read as ``g p`` (chunk indices aside: no time depends on them).  Where, besides, every route is
decided by the network's shape (:meth:`~topocc.planner.routing.network.Network.routed_by_shape`), a group of
such symmetries carries each message's flows onto its image's, so a simulation whose every rank of an orbit
breaks its ties alike has the same state on each of them at every instant, and every link of a link orbit
carries the same load.  The simulator then runs one rank per orbit
(:func:`~topocc.planner.analysis.simulate.simulate`).

The candidates are the translations of the schedule's grid and of the topology's hierarchy, one digit at a
time (a ring's ``+1``, halving-doubling's flipped bit; where racks come in pods, a rack moved within its pod
and the pods moved); each is kept where the schedule's formulas commute
with it and it extends to the network.  The extension maps the ranks' devices as the permutation says, then
each mapped device's neighbours onto its image's (the first free one of the same link attributes and kind
whose already-mapped neighbours agree), and is checked link by link, so a wrong guess costs a candidate, never
a wrong time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from topocc.planner.routing.network import Memo, Network
from topocc.runtime.schedule import Schedule
from topocc.runtime.symmetric import Formula, Symmetry, grid_strides

__all__ = ["Commuting", "Orbits", "PairKey", "PairOrbits", "has_symmetries", "hosts_alike", "pair_key", "pair_orbits",
           "schedule_orbits"]


@dataclass(frozen=True, slots=True)
class Orbits:
    """The orbits of a group of symmetries of a schedule on a network.

    ``reps`` holds the least rank of each rank orbit, ascending; every orbit has ``copies`` ranks.
    ``link_orbit`` numbers each link's orbit (by the topology's link order, ``link_index``) and
    ``link_count`` counts each orbit's links.
    """

    reps: tuple[int, ...]
    rep_of: np.ndarray
    copies: int
    link_orbit: np.ndarray
    link_count: np.ndarray
    link_index: dict[tuple[str, str], int]


def schedule_orbits(net: Network, schedule: Schedule) -> Orbits | None:
    """The orbits of the symmetries of ``schedule`` on ``net`` (see the module docstring), or None where the
    schedule is not in the symmetric form, no candidate is a symmetry, the orbits differ in size, or a route
    between a representative and its peers is not decided by the network's shape."""
    sym = schedule.symmetry
    if sym is None or sym.ranks != net.topology.size:
        return None
    fabric = net.memo(_FABRIC)
    if fabric.orbits is None or fabric.orbits[0] is not sym:  # the compiler asks, then its simulator
        fabric.orbits = (sym, _orbits(net, schedule, sym, fabric))
    return fabric.orbits[1]


def _orbits(net: Network, schedule: Schedule, sym: Symmetry, fabric: _Fabric) -> Orbits | None:
    topo = net.topology
    ranks = sym.ranks
    commuting = Commuting(sym)
    rank_label = np.arange(ranks)
    link_perms: list[np.ndarray] = []
    # the hierarchy's translations (with its pods, where it has some) and those of the schedule's own grid
    candidates = [*_translations(topo.levels), *(d.perm for d in net.memo(_DIGITS)), *_translations(sym.shape)]
    tried: set[bytes] = set()
    for perm in candidates:
        key = perm.tobytes()
        if key in tried:
            continue
        tried.add(key)
        if np.array_equal(rank_label[perm], rank_label) or not commuting.under(perm):
            continue  # it joins no orbits, or the schedule does not commute with it
        link_perm = fabric.extend(perm)
        if link_perm is not None:
            link_perms.append(link_perm)
            rank_label = _orbit_labels(rank_label, [perm])
    if not link_perms:
        return None
    reps, sizes = np.unique(rank_label, return_counts=True)
    if (sizes != sizes[0]).any():
        return None
    for rep in reps.tolist():
        for op in schedule.programs[rep]:
            if op.peer is not None and not net.routed_by_shape(*((rep, op.peer) if op.kind == "send" else
                                                                 (op.peer, rep))):
                return None
    link_label = _orbit_labels(np.arange(len(topo.links)), link_perms)
    _, link_orbit, link_count = np.unique(link_label, return_inverse=True, return_counts=True)
    return Orbits(tuple(reps.tolist()), rank_label, int(sizes[0]), link_orbit, link_count, fabric.link_index)


def has_symmetries(net: Network) -> bool:
    """Whether a translation of the topology's hierarchy (one of racks, hosts or GPUs moved by one, or racks
    moved within their pod and pods moved, :func:`_digits`) extends to an automorphism of the network: where
    none does (a mesh's edges, a host unlike the others) no schedule is replayed by class, and a compiler need
    not look for its symmetric form to time it."""
    return net.memo(_PAIRS) is not None


def hosts_alike(net: Network) -> bool:
    """Whether the hierarchy's translations that are automorphisms (pods included) carry one host onto every
    other: then no host is behind fewer or slower links than another."""
    digits = net.memo(_DIGITS)
    if not digits:
        return False
    label = _orbit_labels(np.arange(net.topology.size), [d.perm for d in digits])
    host = np.asarray(net.topology.host_index)
    return bool(np.unique(host[label == 0]).size == len(net.topology.hosts))


class PairKey:
    """A representative of a rank pair's orbit under the translations of the topology's hierarchy that are
    automorphisms of the network: the pair moved so that its first rank's translated digits are zero.

    Whatever the network's shape alone decides (whether a pair has a route, its cost, its paths where
    :meth:`~topocc.planner.routing.network.Network.routed_by_shape` holds, and their bandwidth) is the same
    for a pair and its representative, so it is computed once per orbit.
    """

    def __init__(self, digits: list[tuple[int, int]]) -> None:
        self.digits = digits  # (stride, size) of each translated digit

    def __call__(self, a: int, b: int) -> tuple[int, int]:
        for stride, n in self.digits:
            da = (a // stride) % n
            if da:
                db = (b // stride) % n
                a -= da * stride
                b += ((db - da) % n - db) * stride
        return a, b

    def many(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The representatives of the pairs ``a[i] -> b[i]``, as :meth:`__call__` gives them one by one."""
        for stride, n in self.digits:
            da = (a // stride) % n
            db = (b // stride) % n
            a = a - da * stride
            b = b + ((db - da) % n - db) * stride
        return a, b


def pair_key(net: Network) -> PairKey | None:
    """The network's :class:`PairKey`, or None where no translation of its hierarchy is an automorphism."""
    return net.memo(_PAIRS)


def _pair_key(net: Network) -> PairKey | None:
    digits = net.memo(_DIGITS)
    return PairKey([(d.stride, d.size) for d in digits]) if digits else None


@dataclass(frozen=True, slots=True)
class _Digit:
    """A digit of the hierarchy whose translation by one is an automorphism: its stride and size, and the
    translation's permutations of the ranks and of the links."""

    stride: int
    size: int
    perm: np.ndarray
    link_perm: np.ndarray


def _digits(net: Network) -> list[_Digit]:
    fabric = net.memo(_FABRIC)
    levels = net.topology.levels
    out = [d for d in (_digit(fabric, *t) for t in _digit_translations(levels)) if d is not None]
    top, below = levels[0], math.prod(levels[1:])
    if len(levels) > 1 and not any(d.stride == below for d in out):
        # the outermost digit (racks, or hosts) moved by one is no automorphism where its members come in
        # pods (a rail-optimised fabric's scalable units under their pod's spines); moving them within their
        # pod and moving the pods are, for the largest pod size for which both extend
        for per_pod in range(top // 2, 1, -1):
            if top % per_pod:
                continue
            _, inner, outer = _digit_translations((top // per_pod, per_pod, below))
            within = _digit(fabric, *inner)
            pods = None if within is None else _digit(fabric, *outer)
            if within is not None and pods is not None:
                out += [within, pods]
                break
    return out


def _digit(fabric: _Fabric, stride: int, n: int, perm: np.ndarray) -> _Digit | None:
    """The digit of ``stride`` and size ``n`` whose translation is ``perm`` where that extends to an automorphism
    that keeps hosts whole (:meth:`_Fabric.keeps_hosts`); else None."""
    link_perm = fabric.extend(perm)
    return _Digit(stride, n, perm, link_perm) if link_perm is not None and fabric.keeps_hosts(link_perm) else None


@dataclass(frozen=True, slots=True)
class PairOrbits:
    """The orbits of rank pairs (``key``) and of links under a group of the hierarchy's translations that are
    automorphisms of the network: ``orbit(link)`` numbers a link's orbit (by its ends' names), ``count`` holds
    each orbit's number of links."""

    key: PairKey
    link_index: dict[tuple[str, str], int]
    link_orbit: np.ndarray
    count: np.ndarray

    def orbit(self, link: tuple[str, str]) -> int:
        return int(self.link_orbit[self.link_index[link]])


def pair_orbits(net: Network, src: np.ndarray, dst: np.ndarray, amount: np.ndarray) -> PairOrbits | None:
    """The orbits under the translations of the hierarchy that are automorphisms of ``net`` and carry the
    pairs ``src[i] -> dst[i]``, each with its ``amount``, onto themselves as a multiset; None where none does.

    Under such a group the pairs put equal loads on every link of a link orbit wherever each pair's routes
    are carried onto its image's (:meth:`~topocc.planner.routing.network.Network.routed_by_shape`).
    """
    digits = net.memo(_DIGITS)
    n = net.topology.size
    amounts, kind = np.unique(amount, return_inverse=True)
    kind = kind.ravel()

    def sorted_codes(s: np.ndarray, d: np.ndarray) -> np.ndarray:
        # each (src, dst, amount) as one integer, below n^2 times the distinct amounts: within int64 up to a
        # million ranks and millions of amounts
        return np.sort((s * n + d) * len(amounts) + kind)

    want = sorted_codes(src, dst)
    kept = [i for i, d in enumerate(digits) if np.array_equal(sorted_codes(d.perm[src], d.perm[dst]), want)]
    if not kept:
        return None
    fabric = net.memo(_FABRIC)
    found = fabric.pair_orbits.get(tuple(kept))
    if found is None:
        label = _orbit_labels(np.arange(len(fabric.link_ends)), [digits[i].link_perm for i in kept])
        _, link_orbit, count = np.unique(label, return_inverse=True, return_counts=True)
        found = fabric.pair_orbits[tuple(kept)] = PairOrbits(
            PairKey([(digits[i].stride, digits[i].size) for i in kept]), fabric.link_index, link_orbit, count)
    return found


def _translations(shape: tuple[int, ...]) -> list[np.ndarray]:
    """Each digit's translation by one of the row-major grid ``shape``, as a permutation of its points."""
    return [perm for _, _, perm in _digit_translations(shape)]


def _digit_translations(shape: tuple[int, ...]) -> list[tuple[int, int, np.ndarray]]:
    """Each digit of the row-major grid ``shape`` (its stride and size, innermost first) with its translation
    by one, as a permutation of the grid's points."""
    points = np.arange(math.prod(shape))
    out = []
    stride = 1
    for n in reversed(shape):
        if n > 1:
            digit = (points // stride) % n
            out.append((stride, n, points + np.where(digit < n - 1, stride, -stride * (n - 1))))
        stride *= n
    return out


def _orbit_labels(labels: np.ndarray, perms: list[np.ndarray]) -> np.ndarray:
    """Each point's least label over its orbit under ``perms`` (labels are points, each its own at first or an
    orbit's least point)."""
    while True:
        joined = labels
        for perm in perms:
            joined = np.minimum(joined, joined[perm])
        joined = joined[joined]  # a label is a point: take its label (halves the rounds of a long cycle)
        if np.array_equal(joined, labels):
            return labels
        labels = joined


class Commuting:
    """Whether the programs of a symmetric schedule commute with a permutation of its ranks: each class goes
    onto itself, and each peer formula ``f`` has ``f(g r) = g(f(r))`` on the class's ranks."""

    def __init__(self, sym: Symmetry) -> None:
        self.ranks = sym.ranks
        cls = np.empty(sym.ranks, dtype=np.int64)
        for start, (c, n) in zip(sym.starts, sym.runs):
            cls[start:start + n] = c
        self.cls = cls
        strides = grid_strides(sym.shape)
        self.coords = (np.arange(sym.ranks)[:, None] // np.array(strides)) % np.array(sym.shape)
        self.members = [np.flatnonzero(cls == c) for c in range(len(sym.templates))]
        self.peers = [list(dict.fromkeys(op.peer for op in template if op.peer is not None))
                      for template in sym.templates]

    def under(self, perm: np.ndarray) -> bool:
        if not np.array_equal(self.cls[perm], self.cls):
            return False
        for members, peers in zip(self.members, self.peers):
            images = perm[members]
            for peer in peers:
                if isinstance(peer, Formula):
                    if not np.array_equal(perm[self._at(peer, members)], self._at(peer, images)):
                        return False
                elif perm[peer] != peer:
                    return False
        return True

    def _at(self, f: Formula, ranks: np.ndarray) -> np.ndarray:
        return (f.offset + self.coords[ranks] @ np.array(f.coefs, dtype=np.int64)) % self.ranks


class _Fabric:
    """A network's devices and links as integers, each device's neighbours by the attributes that an
    automorphism keeps, for extending permutations of the ranks (built once per network)."""

    def __init__(self, net: Network) -> None:
        topo = net.topology
        index = {d.name: i for i, d in enumerate(topo.devices)}
        self.rank_device = np.array([index[name] for name in topo.ranks], dtype=np.int64)
        self.link_ends = [(index[link.src], index[link.dst]) for link in topo.links]
        self.link_of = {ends: k for k, ends in enumerate(self.link_ends)}
        kinds: dict[Any, int] = {}  # link attributes, then neighbour signatures, as small integers
        attrs = [kinds.setdefault((link.bandwidth, link.latency, link.count, link.kind, link.dim, link.ascending),
                                  len(kinds)) for link in topo.links]
        self.attrs = attrs
        devices = len(topo.devices)
        out_attr: list[dict[int, int]] = [{} for _ in range(devices)]
        in_attr: list[dict[int, int]] = [{} for _ in range(devices)]
        for (a, b), at in zip(self.link_ends, attrs):
            out_attr[a][b] = at
            in_attr[b][a] = at
        kind_of = [d.kind for d in topo.devices]
        sigs: dict[tuple[int, int, str], int] = {}
        # each device's neighbours with their signature: (link out's attributes, link in's, the neighbour's kind)
        self.neighbours: list[dict[int, int]] = []
        self.by_signature: list[dict[int, list[int]]] = []
        for u in range(devices):
            mine: dict[int, int] = {}
            grouped: dict[int, list[int]] = {}
            for w in sorted(out_attr[u].keys() | in_attr[u].keys()):
                sig = sigs.setdefault((out_attr[u].get(w, -1), in_attr[u].get(w, -1), kind_of[w]), len(sigs))
                mine[w] = sig
                grouped.setdefault(sig, []).append(w)
            self.neighbours.append(mine)
            self.by_signature.append(grouped)
        hosts = {name: h for h, name in enumerate(dict.fromkeys(d.host for d in topo.devices if d.host))}
        self.host_id = np.array([hosts[d.host] if d.host else -1 for d in topo.devices], dtype=np.int64)
        self.link_index = {(link.src, link.dst): k for k, link in enumerate(topo.links)}
        self.pair_orbits: dict[tuple[int, ...], PairOrbits] = {}  # by the digits translated
        self.extended: dict[bytes, np.ndarray | None] = {}  # by rank permutation: the compiler times many schedules
        self.orbits: tuple[Symmetry, Orbits | None] | None = None  # the last symmetric form's orbits

    def extend(self, perm: np.ndarray) -> np.ndarray | None:
        """The permutation of the links of an automorphism of the network that moves the ranks as ``perm`` does,
        or None where none was found."""
        key = perm.tobytes()
        if key not in self.extended:
            self.extended[key] = self._extend(perm)
        return self.extended[key]

    def keeps_hosts(self, link_perm: np.ndarray) -> bool:
        """Whether the automorphism of ``link_perm`` carries the devices of each host onto those of one host
        (and devices of no host onto such devices): what a translation of the hierarchy means to do, and
        what lets a host's links out stand for its image's."""
        ends = np.array(self.link_ends, dtype=np.int64).reshape(-1, 2)
        image = np.empty(len(self.host_id), dtype=np.int64)
        image[ends] = ends[link_perm]
        pairs = np.unique(np.stack([self.host_id, self.host_id[image]]), axis=1)
        return (len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1]
                and bool(((pairs[0] < 0) == (pairs[1] < 0)).all()))

    def _extend(self, perm: np.ndarray) -> np.ndarray | None:
        devices = len(self.neighbours)
        image = [-1] * devices
        used = bytearray(devices)
        queue = deque(self.rank_device.tolist())
        for u, v in zip(queue, self.rank_device[perm].tolist()):
            image[u] = v
            used[v] = 1
        neighbours, by_signature = self.neighbours, self.by_signature
        while queue:
            u = queue.popleft()
            v = image[u]
            for w, sig in neighbours[u].items():
                if image[w] >= 0:
                    continue
                mapped = [(image[y], s) for y, s in neighbours[w].items() if image[y] >= 0]
                x = next((x for x in by_signature[v].get(sig, ()) if not used[x]
                          and all(neighbours[x].get(y) == s for y, s in mapped)), -1)
                if x < 0:
                    return None
                image[w] = x
                used[x] = 1
                queue.append(w)
        if -1 in image:  # a device no rank reaches: left unmapped, so not proved an automorphism
            return None
        link_of, attrs = self.link_of, self.attrs
        out = np.empty(len(self.link_ends), dtype=np.int64)
        for k, (a, b) in enumerate(self.link_ends):
            j = link_of.get((image[a], image[b]))
            if j is None or attrs[j] != attrs[k]:
                return None
            out[k] = j
        return out


#: The network's devices and links as :meth:`_Fabric.extend` reads them (built once per network).
_FABRIC = Memo("automorphisms: devices and links", _Fabric)
#: The digits of the hierarchy whose translations are automorphisms of the network.
_DIGITS = Memo("automorphisms: the hierarchy's symmetries", _digits)
#: The orbits of rank pairs under the hierarchy's symmetries (:func:`pair_key`, :func:`has_symmetries`).
_PAIRS = Memo("automorphisms: rank pair orbits", _pair_key)
