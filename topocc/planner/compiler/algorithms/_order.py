"""Helpers shared by the baseline algorithms: topology-aware rank orders, ring phases, pipelining.

The ring search looks for a Hamiltonian cycle over rank pairs that maximises
the bottleneck bandwidth (the ring runs at its slowest hop), visiting each
host's ranks contiguously so the ring crosses hosts as few times as possible.
Its hops are pairs with a GPU-free route where such a cycle exists, and
otherwise may be relayed through other GPUs (:mod:`topocc.planner.routing.relay`).  Several
rings ("channels", NCCL's term) are found greedily, each on the bandwidth left
by the previous ones, the way NCCL packs rings onto the NVLinks of a DGX-1
(NCCL ``graph/search.cc``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

from topocc.planner.analysis.automorphisms import PairKey, pair_key
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Memo, Network
from topocc.planner.routing.relay import path_shares
from topocc.runtime.schedule import Chunk, Schedule

__all__ = [
    "PIECE_BYTES",
    "LinkLoads",
    "Send",
    "chunk_runs",
    "depth_order",
    "find_cycle",
    "find_rings",
    "host_size",
    "pieces",
    "ring_all_gather",
    "ring_order",
    "ring_reduce_scatter",
    "ring_steps",
    "root_rank",
    "single_rank",
    "split",
]

#: Target size of one pipelined piece (NCCL's chunk steps are of this order for large messages).
PIECE_BYTES = 1 << 20
#: Above this many members the ring search stops sorting every candidate by bandwidth.
_SORT_LIMIT = 64
_EPS = 1e-9

Weight = Callable[[int, int], float]
#: One message of a phase step: (sending member, receiving member, first part, end part), members
#: and parts as positions in the group.
Send = tuple[int, int, int, int]


def pieces(requested: int | None, piece_source_bytes: float, cap: int, piece_bytes: int = PIECE_BYTES) -> int:
    """How many pieces to split one logical chunk of ``piece_source_bytes`` into.

    ``requested`` (``Options.pipeline``) wins; otherwise pieces of about
    ``piece_bytes``, at most ``cap`` so that op counts stay bounded.
    """
    if requested is not None:
        return max(1, requested)
    return max(1, min(cap, int(piece_source_bytes // piece_bytes)))


def split(start: int, count: int, parts: int) -> list[Chunk]:
    """``count`` chunks of the output buffer from ``start``, as ``parts`` near-equal runs (for pipelining)."""
    parts = max(1, min(parts, count))
    bounds = [start + (count * i) // parts for i in range(parts + 1)]
    return [Chunk("o", a, b - a) for a, b in itertools.pairwise(bounds)]


def chunk_runs(buffer: str, indices: Sequence[int]) -> list[Chunk]:
    """Sorted chunk indices as maximal contiguous :class:`Chunk` runs of ``buffer``."""
    runs: list[Chunk] = []
    for i in sorted(indices):
        if runs and runs[-1].index + runs[-1].count == i:
            last = runs[-1]
            runs[-1] = Chunk(buffer, last.index, last.count + 1)
        else:
            runs.append(Chunk(buffer, i, 1))
    return runs


def single_rank(collective: str, input_chunks: int, output_chunks: int, algorithm: str,
                options: dict[str, object], root: int | None = None) -> Schedule:
    """The one-rank schedule: copy input to output."""
    b = ScheduleBuilder(collective, 1, input_chunks, output_chunks, root=root)
    b.copy(0, Chunk("i", 0, input_chunks), Chunk("o", 0, output_chunks))
    return b.build(algorithm, options)


def root_rank(options: Options, p: int) -> int:
    """The root of a broadcast or reduce, checked to be a rank."""
    if not 0 <= options.root < p:
        raise NotApplicableError(f"root {options.root} is not a rank of this {p}-rank topology")
    return options.root


def host_size(net: Network, algorithm: str) -> int:
    """The GPUs of every host, or :class:`NotApplicableError` naming ``algorithm`` where hosts differ in size."""
    topology = net.topology
    sizes = {len(h) for h in topology.hosts.values()}
    if len(sizes) != 1:
        raise NotApplicableError(f"{algorithm} needs equal-sized hosts (host sizes {sorted(sizes)})")
    return sizes.pop()


def depth_order(root: int, parent: dict[int, int]) -> list[int]:
    """A tree's non-root nodes, parents before children (breadth first)."""
    children: dict[int, list[int]] = {}
    for child, par in parent.items():
        children.setdefault(par, []).append(child)
    order, frontier = [], [root]
    while frontier:
        nxt = [c for v in frontier for c in children.get(v, [])]
        order.extend(nxt)
        frontier = nxt
    return order


# --------------------------------------------------------------------------- link loads


class LinkLoads:
    """Route shares of every rank pair, and the load rings already put on each physical link.

    The weight of a pair is the bandwidth one more message would get on its
    route given the current loads (max-min share of each link), so a second
    ring prefers the links the first one left idle.  Routes are those of
    ``channel``, the channel the next ring will use: under ECMP each channel
    hashes onto its own paths, and a ring avoids hops whose hashed paths
    collide with the rings before it.  A relayed pair loads the links of all
    its hops (:func:`topocc.planner.routing.relay.path_shares`), the relay GPU's own links in
    and out included.
    """

    def __init__(self, net: Network, channel: int = 0) -> None:
        self.net = net
        self.channel = channel
        self.load: LinkLoad[tuple[str, str]] = LinkLoad()
        self._shares: dict[tuple[int, int, int], list[tuple[tuple[str, str], float, float]]] = {}

    def shares(self, a: int, b: int) -> list[tuple[tuple[str, str], float, float]]:
        """(link, share of the pair's traffic, link bandwidth) along the route ``a -> b`` on :attr:`channel`."""
        key = self.net.route_key(a, b, self.channel)
        got = self._shares.get(key)
        if got is None:
            bandwidth = self.net.topology.bandwidth
            got = [(k, s, bandwidth(*k))
                   for k, s in path_shares(self.net, a, b, self.channel).items()]
            self._shares[key] = got
        return got

    def weight(self, a: int, b: int) -> float:
        shares = self.shares(a, b)
        if not shares:
            return 0.0
        return min(bw / (self.load.get(k) + s) for k, s, bw in shares)

    def add_ring(self, ring: Sequence[int]) -> None:
        for a, b in zip(ring, [*ring[1:], ring[0]]):
            for k, s, _ in self.shares(a, b):
                self.load.add(k, s)

    def time_per_byte(self, rings: int) -> float:
        """Seconds per byte of the whole buffer when it is split evenly over ``rings`` rings."""
        bws = {k: bw for shares in self._shares.values() for k, _, bw in shares}
        return self.load.busiest(bws.__getitem__) / max(rings, 1)


# --------------------------------------------------------------------------- ring search


def _groups_of(net: Network, members: Sequence[int]) -> dict[int, int] | None:
    """Host index of each member, or None when all members share one host or each is alone."""
    host_index = net.topology.host_index
    groups = {m: host_index[m] for m in members}
    distinct = len(set(groups.values()))
    if distinct in (1, len(members)):
        return None
    return groups


class _CycleSearch:
    """The state of :func:`_search`: the members visited so far and, with groups, each group's members and
    exits not visited yet (an exit: a member with a hop out of its group that weighs at least ``floor``)."""

    def __init__(self, members: Sequence[int], weight: Weight, floor: float, groups: dict[int, int] | None,
                 direct: Callable[[int, int], bool]) -> None:
        self.members = members
        self.n = len(members)
        self.index = {m: i for i, m in enumerate(members)}
        self.weight = weight
        self.floor = floor
        self.groups = groups
        self.direct = direct
        self.by_group: dict[int, list[int]] = {}
        self.exits: dict[int, bool] = {}
        self.exits_left: dict[int, int] = {}
        if groups is not None:
            for m in members:
                self.by_group.setdefault(groups[m], []).append(m)
            self.exits = {m: any(weight(m, v) >= floor for v in self.outside(groups[m])) for m in members}
            for m in members:
                self.exits_left[groups[m]] = self.exits_left.get(groups[m], 0) + self.exits[m]
        self.group_order = list(self.by_group)
        self.visited: set[int] = set()
        self.remaining_in = {g: len(v) for g, v in self.by_group.items()}

    def outside(self, group: int) -> Iterator[int]:
        """The members of other groups than ``group``, in order (walked, not kept: a list per group would hold
        groups x members entries, half a billion on 65,536 ranks)."""
        groups = self.groups
        assert groups is not None
        return (m for m in self.members if groups[m] != group)

    def start(self) -> int | None:
        """The member to start from: with groups, an entry of the first member's group (entered by a direct
        hop, else entered at all, else the first); None when some group cannot be left at this threshold."""
        if self.groups is None:
            return self.members[0]
        if not all(self.exits_left.values()):
            return None
        groups = self.groups

        def entry(m: int) -> tuple[bool, bool, int]:
            return (not any(self.direct(u, m) and self.weight(u, m) >= self.floor for u in self.outside(groups[m])),
                    not any(self.weight(u, m) >= self.floor for u in self.outside(groups[m])), self.index[m])

        return min(self.by_group[groups[self.members[0]]], key=entry)

    def enter(self, v: int) -> None:
        self.visited.add(v)
        if self.groups is not None:
            self.remaining_in[self.groups[v]] -= 1
            self.exits_left[self.groups[v]] -= self.exits[v]

    def leave(self, v: int) -> None:
        self.visited.discard(v)
        if self.groups is not None:
            self.remaining_in[self.groups[v]] += 1
            self.exits_left[self.groups[v]] += self.exits[v]

    def ranked(self, u: int, cands: list[int]) -> list[int]:
        """The candidates at or above the floor: direct hops first, then best weight, then natural order."""
        scored = [(self.weight(u, v), v) for v in cands]
        kept = [(not self.direct(u, v), -w, (self.index[v] - self.index[u]) % self.n, v)
                for w, v in scored if w >= self.floor]
        return [v for *_, v in sorted(kept)]

    def keeps_an_exit(self, v: int) -> bool:
        """Whether visiting ``v`` leaves its group an exit for later (or ``v`` is the group's last member)."""
        g = self.groups[v]  # type: ignore[index]  # asked only where groups are given (candidates)
        return self.remaining_in[g] == 1 or not self.exits[v] or self.exits_left[g] > 1

    def candidates(self, u: int) -> Iterator[int]:
        """The members to try after ``u``, in order: its group's unvisited ones while any are left, else the
        unvisited groups' in group order from ``u``'s."""
        if self.groups is not None:
            g = self.groups[u]
            if self.remaining_in[g]:
                yield from (v for v in self.ranked(u, [v for v in self.by_group[g] if v not in self.visited])
                            if self.keeps_an_exit(v))
                return
            pos = self.group_order.index(g)
            for off in range(1, len(self.group_order)):
                h = self.group_order[(pos + off) % len(self.group_order)]
                if self.remaining_in[h] == len(self.by_group[h]):
                    yield from (v for v in self.ranked(u, self.by_group[h]) if self.keeps_an_exit(v))
            return
        if self.n <= _SORT_LIMIT:
            yield from self.ranked(u, [v for v in self.members if v not in self.visited])
            return
        for off in range(1, self.n):
            v = self.members[(self.index[u] + off) % self.n]
            if v not in self.visited and self.weight(u, v) >= self.floor:
                yield v

    def run(self, start: int, limit: int) -> list[int] | None:
        """Depth first from ``start``; None when the search tries more than ``limit`` nodes or exhausts them."""
        self.enter(start)
        path = [start]
        stack = [self.candidates(start)]
        nodes = 0
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                self.leave(path.pop())
                continue
            nodes += 1
            if nodes > limit:
                return None
            if len(path) == self.n - 1:
                if self.weight(nxt, start) >= self.floor:
                    return [*path, nxt]
                continue
            path.append(nxt)
            self.enter(nxt)
            stack.append(self.candidates(nxt))
        return None


def _search(members: Sequence[int], weight: Weight, threshold: float, groups: dict[int, int] | None,
            limit: int, direct: Callable[[int, int], bool]) -> list[int] | None:
    """Depth-first search for a Hamiltonian cycle whose every hop weighs at least ``threshold``.

    With ``groups``, each group is visited contiguously (one entry and one exit
    per host): the cycle starts at an entry of the first group, and a group's
    only remaining exit is kept for last.  Candidates are tried direct hops
    first (``direct``: the pair has a route, no relay), then best weight first,
    ties in natural order, so symmetric fabrics are solved without backtracking.
    """
    if len(members) == 1:
        return [members[0]]
    search = _CycleSearch(members, weight, threshold * (1 - _EPS), groups, direct)
    start = search.start()
    return None if start is None else search.run(start, limit)


def _thresholds(members: Sequence[int], weight: Weight, groups: dict[int, int] | None) -> list[float]:
    """Candidate bottleneck values, best first: every pair's weight on small sets, a sample on large ones."""
    if len(members) <= _SORT_LIMIT:
        values = [weight(a, b) for a in members for b in members if a != b]
        # the ring leaves every member once: the bottleneck is at most each member's best out-weight
        bound = min(max(weight(a, b) for b in members if b != a) for a in members)
    else:
        if groups is None:
            sample = list(members[:8])
            values = [weight(a, b) for a in sample for b in sample if a != b]
            values += [weight(a, b) for a, b in zip(members, [*members[1:], members[0]])]
        else:
            by_group: dict[int, list[int]] = {}
            for m in members:
                by_group.setdefault(groups[m], []).append(m)
            hosts = list(by_group.values())
            values = [weight(a, b) for a in hosts[0] for b in hosts[0] if a != b]
            # the search leaves each host for the next one in order: the ring is no better than the
            # worst of those host-to-host hops, each at its best pair
            cross = [
                max(weight(a, b) for a in h for b in g)
                for h, g in zip(hosts, [*hosts[1:], hosts[0]])
            ]
            values += cross
        bound = max(values, default=0.0)
        if groups is not None:
            bound = min(bound, min(cross))
    positive = sorted({v for v in values if 0 < v <= bound * (1 + _EPS)}, reverse=True)
    return positive or [0.0]


def _lone_weight(net: Network, key: PairKey | None) -> Weight:
    """:meth:`LinkLoads.weight` with no load: a routed pair's :meth:`~Topology.route_bandwidth` (the same
    minimum of bandwidth over share, found by counting paths under spray rather than listing them), a relayed
    pair's from the shares of all its hops.  With ``key``, a pair whose paths the network's shape decides
    weighs what its orbit's representative does (computed once per orbit)."""
    loads = LinkLoads(net)

    def weight(a: int, b: int) -> float:
        return net.route_bandwidth(a, b) if net.has_route(a, b) else loads.weight(a, b)

    if key is None:
        return weight
    by_orbit: dict[tuple[int, int], float | None] = {}

    def by_shape(a: int, b: int) -> float:
        rep = key(a, b)
        if rep not in by_orbit:  # None: a relayed pair, or one whose paths a hash or a cap picks
            by_orbit[rep] = weight(*rep) if net.has_route(*rep) and net.routed_by_shape(*rep) else None
        found = by_orbit[rep]
        return weight(a, b) if found is None else found

    return by_shape


def find_cycle(net: Network, members: Sequence[int], weight: Weight | None = None) -> list[int]:
    """A Hamiltonian cycle over ``members`` maximising the bottleneck weight, direct hops preferred.

    ``weight(a, b)`` defaults to the bandwidth of the hop given no other load
    (:class:`LinkLoads`).  The search first admits only direct hops (pairs with a
    GPU-free route); only when it finds no cycle of those does it admit relayed
    hops (:func:`topocc.planner.routing.relay.relay_path`), still trying direct ones first.
    Returns the cycle as a rank list; with relays every order is a cycle, so
    should the budgeted search find none, the members in their given order.
    """
    members = list(members)
    if len(members) <= 1:
        return members
    key = pair_key(net)
    if weight is None:
        weight = _lone_weight(net, key)
    cache: dict[tuple[int, int], float] = {}

    routed: dict[tuple[int, int], bool] = {}

    def direct(a: int, b: int) -> bool:
        pair = (a, b) if key is None else key(a, b)  # a route exists for a whole orbit of pairs or none
        found = routed.get(pair)
        if found is None:
            found = routed[pair] = net.has_route(*pair)
        return found

    def cached(a: int, b: int) -> float:
        w = cache.get((a, b))
        if w is None:
            w = cache[(a, b)] = weight(a, b)
        return w

    def direct_only(a: int, b: int) -> float:
        return cached(a, b) if direct(a, b) else 0.0

    limit = 4 * len(members) + 4000
    groups = _groups_of(net, members)
    for admitted in (direct_only, cached):
        for mode in ([groups, None] if groups is not None else [None]):
            ring = _best_cycle(members, admitted, mode, limit, direct)
            if ring is not None:
                return ring
    return members


def _best_cycle(members: list[int], weight: Weight, groups: dict[int, int] | None, limit: int,
                direct: Callable[[int, int], bool]) -> list[int] | None:
    """The cycle of the highest bottleneck :func:`_search` finds (binary search over the thresholds)."""
    values = _thresholds(members, weight, groups)
    ring = _search(members, weight, max(values[0], _EPS), groups, limit, direct)
    if ring is not None:
        return ring
    best: list[int] | None = None
    lo, hi = 1, len(values) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        ring = _search(members, weight, max(values[mid], _EPS), groups, limit, direct)
        if ring is not None:
            best, hi = ring, mid - 1
        else:
            lo = mid + 1
    if best is None and values[-1] > _EPS:
        best = _search(members, weight, _EPS, groups, limit, direct)
    return best


def ring_order(net: Network) -> list[int]:
    """The single best ring over all ranks (kept per network: every algorithm orders ranks by it)."""
    ring: tuple[int, ...] = net.memo(_RING_ORDER)
    return list(ring)


#: The best ring over all ranks, per network.
_RING_ORDER: Memo[tuple[int, ...]] = Memo("order: best ring",
                                         lambda net: tuple(find_cycle(net, range(net.topology.size))))
#: Rings per (channels, cap), per network (see :func:`_find_rings`).
_RINGS: Memo[dict[tuple[int | None, int], tuple[tuple[int, ...], ...]]] = Memo("order: rings", lambda net: {})


def find_rings(net: Network, channels: int | None, cap: int = 8) -> list[list[int]]:
    """Rings for ``channels`` channels (see :func:`_find_rings`), kept per network."""
    kept = net.memo(_RINGS)
    if (channels, cap) not in kept:
        kept[(channels, cap)] = _find_rings(net, channels, cap)
    return [list(rg) for rg in kept[(channels, cap)]]


def _find_rings(net: Network, channels: int | None, cap: int) -> tuple[tuple[int, ...], ...]:
    """Rings for ``channels`` channels, or, when None, the count (up to ``cap``) that moves data fastest.

    Each ring is searched on the bandwidth left by the previous ones
    (:class:`LinkLoads`); with ``channels=None`` the prefix of rings with the
    least time per byte (whole buffer split evenly) is kept, so on DGX-1 the
    lane-disjoint NVLink rings come out and on a switch a single ring does.
    """
    topology = net.topology
    members = list(range(topology.size))
    loads = LinkLoads(net)
    rings: list[list[int]] = []
    best, best_count = math.inf, 0
    want = channels if channels is not None else cap
    for channel in range(want):
        loads.channel = channel  # ring i runs on channel i
        ring = find_cycle(net, members, loads.weight)
        rings.append(ring)
        loads.add_ring(ring)
        t = loads.time_per_byte(len(rings))
        if t < best * (1 - 0.02):
            best, best_count = t, len(rings)
    kept = rings if channels is not None else rings[:best_count]
    return tuple(tuple(rg) for rg in kept)


# --------------------------------------------------------------------------- ring phases


def ring_steps(n: int, gather: bool) -> list[list[Send]]:
    """Ring reduce-scatter (Patarasuk & Yuan 2009) or all-gather among ``n`` members, step by step.

    Reduce-scatter: at step ``t`` member ``i`` passes part ``i-t-1`` on to
    member ``i+1``, which reduces it in, so member ``i`` ends owning part ``i``;
    the all-gather passes part ``i-t`` on.
    """
    shift = 0 if gather else 1
    return [[(i, (i + 1) % n, (i - t - shift) % n, (i - t - shift) % n + 1) for i in range(n)]
            for t in range(n - 1)]


def ring_reduce_scatter(b: ScheduleBuilder, ring: Sequence[int], parts: Sequence[Sequence[Chunk]], *,
                        step: int = 0, channel: int = 0) -> int:
    """Ring reduce-scatter (Patarasuk & Yuan 2009): member ``i`` ends with ``parts[i]`` reduced over the ring.

    Every member must already hold its own contribution in the chunks of
    ``parts``.  At step ``t`` member ``i`` passes part ``i-t-1`` on to member
    ``i+1``, which reduces it in; each part is a list of pieces sent as
    separate messages, so consecutive steps pipeline.  Returns the next step.
    """
    n = len(ring)
    for t in range(n - 1):
        for i in range(n):
            for piece in parts[(i - t - 1) % n]:
                b.transfer(ring[i], ring[(i + 1) % n], piece, piece, reduce=True, step=step + t, channel=channel)
    return step + max(n - 1, 0)


def ring_all_gather(b: ScheduleBuilder, ring: Sequence[int], parts: Sequence[Sequence[Chunk]], *,
                    step: int = 0, channel: int = 0) -> int:
    """Ring all-gather: member ``i`` starts with ``parts[i]``; all members end with every part."""
    n = len(ring)
    for t in range(n - 1):
        for i in range(n):
            for piece in parts[(i - t) % n]:
                b.transfer(ring[i], ring[(i + 1) % n], piece, piece, step=step + t, channel=channel)
    return step + max(n - 1, 0)
