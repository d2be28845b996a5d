"""MultiTree: one spanning tree per root, grown in lock-step over contention-free link slots.

Huang et al., "Communication Algorithm-Architecture Co-Design for Distributed
Deep Learning", ISCA 2021.  Section IV-A (Algorithm 1) builds every rank's
spanning tree top-down, all trees together, one time step at a time: in each
step the trees take turns (round robin, the first tree rotating each step) to
add one child over links that no other transfer of that step uses, until no
tree can grow; a link of ``k`` times the base bandwidth offers ``k`` slots per
step.  Section IV-B turns the trees into a schedule: reduce-scatter runs every
tree leaf to root in reverse time order, all-gather root to leaf, and
all-reduce is the one followed by the other.

Our generalisation of "link": a candidate tree edge is any routable rank pair
``u -> v``; it takes, on every physical directed link of its routes, the share
of a slot that the topology's routing puts there (tree ``i`` runs on channel
``i``, which ECMP may hash onto other paths than another tree's).  On switched
fabrics (NVSwitch, fat-trees) the switch ports therefore become the contended
resources, as they are.  Within a step, cheaper edges
(lower route cost: fewer hops, more bandwidth) are offered to every tree before
dearer ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Memo, Network
from topocc.runtime.collective import ALLREDUCE, BROADCAST, Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["TreeEdge", "TreePlan", "build_trees", "multitree", "multitree_link_floor"]

#: Pipelining aims at pieces of about this many bytes: large enough to amortise per-message latency, small
#: enough that the pieces fill the trees' pipelines quickly.
_TARGET_PIECE_BYTES = 256 << 10
#: Most pieces each tree's block is split into (more pipeline a very large message better, at more operations).
_MAX_PIECES = 64
#: Cap on tree edges x pieces per phase, so that op counts (and simulation time) stay bounded.
_MAX_TRANSFERS = 1 << 16
#: Up to this many ranks, every routable pair is a candidate tree edge.
_ALL_PAIRS_UP_TO = 64
#: ... and below this size only up to :data:`_ALL_PAIRS_SMALL_UP_TO`: the exhaustive search balances link
#: loads, which pays at large sizes, and costs several times the compile time of the quotas.
_ALL_PAIRS_FROM_BYTES = 16 << 20
_ALL_PAIRS_SMALL_UP_TO = 32
#: Beyond that, each rank keeps at most this many candidates of each route-cost class (spread evenly).
_CLASS_QUOTA = 16
#: Two route costs closer than this (relative) are one class.
_SAME_COST = 1e-6
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class TreeEdge:
    """``parent -> child`` joined the tree in lock-step ``step`` (1-based)."""

    parent: int
    child: int
    step: int


@dataclass(frozen=True, slots=True)
class TreePlan:
    """The trees of a MultiTree construction and the step each edge was added in.

    ``edges[i]`` lists tree ``i``'s edges in the order they were added (steps
    non-decreasing); ``slots`` is how many transfers each directed link
    ``(src, dst)`` may carry in one step; with ``reverse`` the data of edge
    ``parent -> child`` flows from child to parent (reduction trees).
    """

    roots: tuple[int, ...]
    edges: tuple[tuple[TreeEdge, ...], ...]
    slots: Mapping[tuple[str, str], float]
    reverse: bool = False

    @property
    def steps(self) -> int:
        """Lock-step time steps until every tree spans all ranks."""
        return max((e.step for tree in self.edges for e in tree), default=0)

    def depth(self, tree: int) -> int:
        """Steps tree ``tree`` needed."""
        return max((e.step for e in self.edges[tree]), default=0)


def _bit_reversed(n: int) -> list[int]:
    """A permutation key of ``0..n-1`` that spreads consecutive offsets far apart (bit reversal)."""
    bits = max(1, (n - 1).bit_length())
    return [int(f"{i:0{bits}b}"[::-1], 2) for i in range(n)]


class _Fabric:
    """Candidate tree edges of a topology: per rank, whom it may feed, cheapest route first.

    ``reverse`` builds trees whose data flows child to parent (reductions): the
    route of edge ``u -> v`` is then ``v -> u``.  A pair is a candidate only if
    the slowest link its routes touch reaches the base bandwidth, the highest
    one at which the candidate pairs still connect every rank (so a slow detour such as a
    QPI hop is never a tree edge when NVLink connects the ranks).

    The candidates are numbered (edge ``e``: ``edge_u[e] -> edge_v[e]``, rank ``u``'s
    from ``first[u]`` on, cheapest first) and their link loads kept as padded rows
    (``rows[k]``: link indices, ``links`` after the last; ``shares[k]``: the slot
    share on each), so that the fit test and the busiest link of every candidate
    of a tree are a few numpy operations instead of a Python loop per candidate.
    Row ``e`` is edge ``e`` on channel 0; :meth:`variants` adds the
    rows of edges whose route depends on the channel (ECMP) as trees ask for them.
    """

    def __init__(self, net: Network, *, reverse: bool, quota: int | None) -> None:
        topology = net.topology
        p = topology.size
        self.p = p
        self.net = net
        self.reverse = reverse
        self.link_ids = link_ids = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
        self.bandwidth = [link.bandwidth for link in topology.links]
        self.keys = [(link.src, link.dst) for link in topology.links]
        spread = _bit_reversed(p)
        loads: dict[tuple[int, int], tuple[tuple[int, float], ...]] = {}  # on channel 0
        varies: set[tuple[int, int]] = set()  # pairs whose route depends on the channel
        ranked: list[list[tuple[float, int, int]]] = []
        for u in range(p):
            found = []
            for v in range(p):
                a, b = (v, u) if reverse else (u, v)
                c = net.route_cost(a, b)
                if v != u and c != math.inf:
                    found.append((c, spread[(v - u) % p], v))
            found.sort()
            ranked.append(found)
        kept = [self._keep(found, quota) for found in ranked]
        width: dict[tuple[int, int], float] = {}
        for u in range(p):
            for _, v in kept[u]:
                a, b = (v, u) if reverse else (u, v)
                load = tuple((link_ids[key], f) for key, f in net.route_shares(a, b).items())
                loads[(u, v)] = load
                if net.channels_change_path(a, b):
                    varies.add((u, v))
                width[(u, v)] = min(self.bandwidth[j] for j, _ in load)
        self.base = self._base_bandwidth(width)
        self.cap = [bw / self.base for bw in self.bandwidth]
        edge_u: list[int] = []
        edge_v: list[int] = []
        edge_class: list[int] = []
        self.first = [0] * (p + 1)
        for u in range(p):
            k, last = -1, None
            for c, v in kept[u]:
                if width[(u, v)] < self.base * (1 - _SAME_COST):
                    continue
                if last is None or c > last * (1 + _SAME_COST) + 1e-15:
                    k, last = k + 1, c
                edge_u.append(u)
                edge_v.append(v)
                edge_class.append(k)
            self.first[u + 1] = len(edge_u)
        self.top_class = max(edge_class, default=0)
        self.edge_u = np.array(edge_u, dtype=np.int64)
        self.edge_v = np.array(edge_v, dtype=np.int64)
        self.edge_class = np.array(edge_class, dtype=np.int64)
        self.varies = np.array([(u, v) in varies for u, v in zip(edge_u, edge_v)], dtype=bool)
        self.links = len(self.cap)  # the padding's link index: no load, unit capacity
        edge_loads = [loads[(u, v)] for u, v in zip(edge_u, edge_v)]
        self.rows = np.full((max(1, 2 * len(edge_loads)), max((len(x) for x in edge_loads), default=1)), self.links,
                            dtype=np.int64)
        self.shares = np.zeros(self.rows.shape)
        for e, load in enumerate(edge_loads):
            self._set_row(e, load)
        self.count = len(edge_loads)  # rows in use
        self._row_of: dict[tuple[int, ...], int] = {}  # channel variants' rows by their path (link indices)
        self._pairs = list(zip(edge_u, edge_v))
        self._variant: dict[int, np.ndarray] = {}  # per channel: each edge's row (-1: not computed yet)

    def _set_row(self, k: int, load: tuple[tuple[int, float], ...]) -> None:
        """Write ``load`` as row ``k`` (widening every row if it is the longest yet)."""
        if len(load) > self.rows.shape[1]:
            wider = np.full((self.rows.shape[0], len(load)), self.links, dtype=np.int64)
            wider[:, :self.rows.shape[1]] = self.rows
            shares = np.zeros(wider.shape)
            shares[:, :self.shares.shape[1]] = self.shares
            self.rows, self.shares = wider, shares
        self.rows[k, :len(load)] = [j for j, _ in load]
        self.shares[k, :len(load)] = [f for _, f in load]

    def variants(self, channel: int, edges: np.ndarray) -> np.ndarray:
        """The rows of ``edges`` on ``channel`` (computing the routes of those that depend on it)."""
        if not channel:
            return edges
        found = self._variant.get(channel)
        if found is None:
            found = self._variant[channel] = np.where(self.varies, -1, np.arange(len(self.varies)))
        rows = found[edges]
        missing = edges[rows < 0]
        if missing.size:
            # a pair whose route depends on the channel is routed per connection (ecmp, source): one hashed path,
            # which carries all of a message (Topology.route_shares), walked without the route caches
            link_ids, hashed_path, row_of = self.link_ids, self.net.hashed_path, self._row_of
            for e in missing.tolist():
                u, v = self._pairs[e]
                a, b = (v, u) if self.reverse else (u, v)
                path = tuple(link_ids[link.src, link.dst] for link in hashed_path(a, b, channel))
                row = row_of.get(path)
                if row is None:  # a path not seen before (a pair's channels share a few paths)
                    load = tuple((j, 1.0) for j in path)
                    if self.count == self.rows.shape[0]:
                        self.rows = np.concatenate([self.rows, np.full(self.rows.shape, self.links, dtype=np.int64)])
                        self.shares = np.concatenate([self.shares, np.zeros(self.shares.shape)])
                    row = row_of[path] = self.count
                    self._set_row(row, load)
                    self.count += 1
                found[e] = row
            rows = found[edges]
        return rows

    def load(self, row: int) -> list[tuple[int, float]]:
        """(link index, share) of row ``row`` (see :meth:`variants`)."""
        return [(j, f) for j, f in zip(self.rows[row].tolist(), self.shares[row].tolist()) if j != self.links]

    @staticmethod
    def _keep(found: list[tuple[float, int, int]], quota: int | None) -> list[tuple[float, int]]:
        """(cost, rank) of the candidates kept: all, or ``quota`` of each cost class."""
        kept: list[tuple[float, int]] = []
        taken, last = 0, None
        for c, _, v in found:
            if last is None or c > last * (1 + _SAME_COST) + 1e-15:
                taken, last = 0, c
            if quota is None or taken < quota:
                kept.append((c, v))
                taken += 1
        return kept

    def _base_bandwidth(self, width: Mapping[tuple[int, int], float]) -> float:
        """The highest route bandwidth B such that pairs at least B wide still connect all ranks."""
        levels = sorted(set(width.values()), reverse=True)
        lo, hi = 0, len(levels) - 1  # levels[hi] (the narrowest) connects if anything does
        if not self._connected(width, levels[hi]):
            raise NotApplicableError("multitree: the ranks are not connected by routable pairs")
        while lo < hi:
            mid = (lo + hi) // 2
            if self._connected(width, levels[mid]):
                hi = mid
            else:
                lo = mid + 1
        return levels[lo]

    def _connected(self, width: Mapping[tuple[int, int], float], base: float) -> bool:
        """Every rank reaches every other over pairs at least ``base`` wide (both directions of search)."""
        out: list[list[int]] = [[] for _ in range(self.p)]
        inn: list[list[int]] = [[] for _ in range(self.p)]
        for (u, v), w in width.items():
            if w >= base * (1 - _SAME_COST):
                out[u].append(v)
                inn[v].append(u)
        return all(_reaches_all(adj, self.p) for adj in (out, inn))


def _reaches_all(adj: list[list[int]], p: int) -> bool:
    seen = bytearray(p)
    seen[0] = 1
    stack = [0]
    while stack:
        for v in adj[stack.pop()]:
            if not seen[v]:
                seen[v] = 1
                stack.append(v)
    return all(seen)


def build_trees(net: Network, roots: Sequence[int], *, reverse: bool = False,
                quota: int | None = None, prior: TreePlan | None = None) -> TreePlan:
    """Grow one spanning tree per entry of ``roots`` in lock-step, contention-free per step (Algorithm 1).

    In step ``t`` a tree may add ``u -> v`` when ``u`` joined before ``t``,
    ``v`` is not in the tree yet, and every link of the route (``v -> u`` with
    ``reverse``, for reductions) still has the slot share the edge needs in
    step ``t``.  Passes over route-cost classes (cheapest first) hand out the
    cheap edges before the dear ones; within a pass the trees add one edge per
    turn, the first tree rotating each step.  Among the edges a tree may add, it
    takes the one whose busiest link has carried the least so far, which
    spreads the load over the steps.  ``quota`` limits the candidates of each
    cost class per rank (None: all).  ``prior`` trees count as load already
    carried, so that all-reduce's reduction trees balance the links against
    its broadcast trees (apart, each set can favour the same links).
    """
    fab = _Fabric(net, reverse=reverse, quota=quota)
    growth = _Growth(net, fab, roots, prior, exhaustive=quota is None)
    step = 0
    while any(s < growth.p for s in growth.size):
        step += 1
        if not growth.grow(step):
            if quota is None:
                raise NotApplicableError("multitree: some rank cannot be reached over routable pairs")
            return build_trees(net, roots, reverse=reverse, quota=None)
    slots = {fab.keys[j]: c for j, c in enumerate(fab.cap)}
    return TreePlan(tuple(roots), tuple(tuple(e) for e in growth.edges), slots, reverse)


class _Growth:
    """The state of :func:`build_trees`: each tree's members and senders, and each link's use this step and
    load so far, in slots (with one more entry last, the padding of the fabric's rows, which loads nothing)."""

    def __init__(self, net: Network, fab: _Fabric, roots: Sequence[int], prior: TreePlan | None, *,
                 exhaustive: bool) -> None:
        self.fab = fab
        self.p = p = net.topology.size
        self.n = n = len(roots)
        self.exhaustive = exhaustive
        self.limits = np.array([*fab.cap, 1.0])  # slots per step
        self.member = [np.zeros(p, dtype=bool) for _ in range(n)]
        self.senders: list[list[int]] = [[r] for r in roots]  # members that joined before this step
        self.fresh: list[list[int]] = [[] for _ in range(n)]  # members that joined in this step
        self.size = [1] * n
        for i, r in enumerate(roots):
            self.member[i][r] = True
        self.edges: list[list[TreeEdge]] = [[] for _ in range(n)]
        self.used = np.zeros(len(self.limits))
        self.total = np.zeros(len(self.limits))
        if prior is not None:
            index = {key: j for j, key in enumerate(fab.keys)}
            for channel, tree in enumerate(prior.edges):
                for e in tree:
                    a, b = (e.child, e.parent) if prior.reverse else (e.parent, e.child)
                    for key, f in net.route_shares(a, b, channel).items():
                        self.total[index[key]] += f / fab.cap[index[key]]

    def grow(self, step: int) -> bool:
        """Lock-step ``step``: pass by pass over the cost classes, the trees (the first rotating each step) add
        an edge each in turn while any fits; returns whether any tree grew."""
        n, p, size = self.n, self.p, self.size
        for i in range(n):
            self.senders[i].extend(self.fresh[i])
            self.fresh[i].clear()
        self.used[:] = 0.0
        pools: list[list[np.ndarray] | None] = [None] * n  # per tree, its edges that may join this step
        grown = False
        start = step % n
        rotation = list(range(start, n)) + list(range(start))
        for pass_class in range(self.fab.top_class + 1):
            active = [i for i in rotation if size[i] < p]
            while active:
                still = []
                for i in active:
                    pool = pools[i]
                    if pool is None:
                        pool = pools[i] = _pool(self.fab, self.member[i], self.senders[i])
                    found = _find_edge(self.fab, i, self.member[i], pool, pass_class, self.used, self.total,
                                       self.limits, self.exhaustive)
                    if found is None:
                        continue
                    self._add(i, *found, step)
                    grown = True
                    if size[i] < p:
                        still.append(i)
                active = still
        return grown

    def _add(self, i: int, edge: int, row: int, step: int) -> None:
        """Tree ``i`` takes candidate ``edge`` (its links' loads in ``row`` of the fabric) in ``step``."""
        fab = self.fab
        u, v = int(fab.edge_u[edge]), int(fab.edge_v[edge])
        for j, f in fab.load(row):
            self.used[j] += f
            self.total[j] += f / fab.cap[j]
        self.member[i][v] = True
        self.size[i] += 1
        self.fresh[i].append(v)
        self.edges[i].append(TreeEdge(u, v, step))


def _pool(fab: _Fabric, member: np.ndarray, senders: list[int]) -> list[np.ndarray]:
    """Per cost class, the candidate edges from a sender to a non-member, senders in turn (edge numbers)."""
    first = fab.first
    edges = np.concatenate([np.arange(first[u], first[u + 1]) for u in senders])
    edges = edges[~member[fab.edge_v[edges]]]
    classes = fab.edge_class[edges]
    return [edges[classes == c] for c in range(fab.top_class + 1)]


def _find_edge(fab: _Fabric, tree: int, member: np.ndarray, pool: list[np.ndarray], max_class: int,
               used: np.ndarray, total: np.ndarray, limits: np.ndarray, exhaustive: bool,
               ) -> tuple[int, int] | None:
    """An edge of tree ``tree`` (on its channel), cost class <= ``max_class``, from ``pool`` (the tree's
    candidate edges of this step, see :func:`_pool`) to a non-member, that fits this step: (edge, its row
    in ``fab``).

    The cheapest class first; within it, the least loaded busiest link (all
    candidates when ``exhaustive``, else the first that fits; ties to the first
    in the pool).  Edges found to lead to a member or not to fit are dropped from
    ``pool``: within a step the members and the links' use only grow, so they
    cannot join later in the step (so each is tried once per step instead of
    once per edge added).  Classes are tried cheapest first: by the time a pass offers class k,
    the tree's cheaper classes have been exhausted for the step.  ``used`` and
    ``total`` are each link's slot use this step and load so far (in slots),
    ``limits`` its slots per step, each with the padding's entry last.
    """
    for c in range(max_class + 1):
        edges = pool[c]
        if not edges.size:
            continue
        edges = edges[~member[fab.edge_v[edges]]]
        rows = fab.variants(tree, edges)
        links, shares = fab.rows[rows], fab.shares[rows]
        fits = (used[links] + shares <= limits[links] + _EPS).all(axis=1)
        if not exhaustive:
            hit = np.flatnonzero(fits)
            pool[c] = edges[hit[0]:] if hit.size else edges[:0]
            if hit.size:
                return int(edges[hit[0]]), int(rows[hit[0]])
            continue
        edges, rows, links, shares = edges[fits], rows[fits], links[fits], shares[fits]
        pool[c] = edges
        if edges.size:
            best = int(np.argmin((total[links] + shares / limits[links]).max(axis=1)))
            return int(edges[best]), int(rows[best])
    return None


# --------------------------------------------------------------------------- schedules (section IV-B)


def _pieces(options: Options, block_bytes: float, transfers: int) -> int:
    """Pieces per tree block: ``options.pipeline``, else about :data:`_TARGET_PIECE_BYTES` each, within the op
    budget."""
    if options.pipeline is not None:
        if options.pipeline < 1:
            raise NotApplicableError(f"multitree: pipeline must be >= 1, got {options.pipeline}")
        return options.pipeline
    want = max(1, min(_MAX_PIECES, round(block_bytes / _TARGET_PIECE_BYTES)))
    return max(1, min(want, _MAX_TRANSFERS // max(1, transfers)))


def _by_step(tree: Sequence[TreeEdge], reverse: bool = False) -> list[TreeEdge]:
    return sorted(tree, key=lambda e: e.step, reverse=reverse)


def multitree(net: Network, collective: str, options: Options) -> Schedule:
    """MultiTree schedule for allreduce, reducescatter, allgather or broadcast.

    All-gather: tree ``r`` carries rank ``r``'s block from ``r`` down to every
    rank.  Reduce-scatter: tree ``r`` sums block ``r`` from the leaves up to
    ``r``, each rank adding its children's partial sums to its own before it
    sends up.  All-reduce: reduce-scatter then all-gather over the same trees;
    tree ``r`` owns chunks ``r*pipeline ... r*pipeline + pipeline - 1``.
    Broadcast: several trees from the root, built the same way, each carrying
    an equal share.  Every block is split into ``pipeline`` pieces that stream
    through the tree, so consecutive steps overlap.  Tree ``i``'s messages use
    channel ``i``.

    >>> multitree(load_topology("topologies/torus-4x4.yaml"), "allreduce", Options())  # doctest: +SKIP
    """
    topology = net.topology
    kind = describe(collective)
    collective = kind.name
    p = topology.size
    meta = options.as_dict()
    if kind.to_root or kind.exchanges:
        raise NotApplicableError(f"multitree does not implement {collective}")
    if kind.from_root:
        return _broadcast(net, options, meta)
    if p == 1:
        return _single(kind, meta)
    down, up = _trees(net, kind, options.size_bytes)
    n = len((down or up).roots)  # type: ignore[union-attr]  # all-gather has its down trees, the others up
    if kind is ALLREDUCE:
        meta["trees_per_root"] = n // p
    phases = kind.passes
    # c trees per root make c times the transfers per piece, each link serving c times as many trees at once;
    # the op budget counts them c^2 times over, as simulating them costs that much more (and the many trees
    # already pipeline the data: a few pieces each suffice)
    q = _pieces(options, options.size_bytes / n, phases * n * (p - 1) * (n // p) ** 2)
    meta.update(pipeline=q, steps=sum(plan.steps for plan in (up, down) if plan is not None))
    if kind.gathers:
        assert down is not None
        b = ScheduleBuilder(collective, p, q, p * q)
        for r in range(p):
            b.copy(r, Chunk("i", 0, q), Chunk("o", r * q, q))
        _gather(b, down, q, source=lambda r, j: Chunk("i", j), block=lambda r, j: Chunk("o", r * q + j))
    elif kind.scatters:
        assert up is not None
        b = ScheduleBuilder(collective, p, p * q, q, scratch_chunks=(p + _extra_children(up, p)) * q)
        _scatter(b, up, q, own=lambda r, j: Chunk("i", r * q + j),
                 partial=lambda r, j: Chunk("s", r * q + j), result=lambda j: Chunk("o", j), spare=p * q)
    else:
        assert up is not None and down is not None
        # tree i (rooted at i mod p) owns chunks i*q ... i*q + q - 1
        b = ScheduleBuilder(collective, p, n * q, n * q, scratch_chunks=_extra_children(up, p) * q)
        _scatter(b, up, q, own=lambda i, j: Chunk("i", i * q + j),
                 partial=lambda i, j: Chunk("o", i * q + j), result=None, spare=0)
        _gather(b, down, q, source=lambda i, j: Chunk("o", i * q + j), block=lambda i, j: Chunk("o", i * q + j),
                step_offset=up.steps)
    return b.build("multitree", meta)


#: The broadcast and reduction trees per (collective, size) (see :func:`_trees`).
_TREES: Memo[dict[tuple[str, int], tuple[TreePlan | None, TreePlan | None]]] = Memo("multitree: trees", lambda net: {})


def _trees(net: Network, kind: Collective, size_bytes: int) -> tuple[TreePlan | None, TreePlan | None]:
    """The broadcast (down) and reduction (up) trees of all-gather, reduce-scatter or all-reduce on at least
    two ranks, kept with the topology: ``auto`` grows them for :func:`multitree_link_floor` and builds the
    schedule from the same trees where it may win."""
    topology = net.topology
    cache = net.memo(_TREES)
    found = cache.get((kind.name, size_bytes))
    if found is None:
        p = topology.size
        quota = None if p <= _all_pairs_limit(size_bytes) else _CLASS_QUOTA
        if kind is ALLREDUCE:
            found = _allreduce_trees(net, quota, size_bytes)
        else:
            found = (build_trees(net, range(p), quota=quota) if kind.gathers else None,
                     build_trees(net, range(p), reverse=True, quota=quota) if kind.scatters else None)
        cache[(kind.name, size_bytes)] = found
    return found


def multitree_link_floor(net: Network, collective: str, options: Options) -> float:
    """A lower bound of :func:`topocc.planner.compiler.evaluate.link_time` of the schedule, from its trees alone (0 for
    broadcast, whose tree count is chosen with the schedule).

    Every tree carries its block (N / trees bytes) over each of its edges, in
    each phase; only the links that every cheapest path of the edge's pair
    crosses (:meth:`Topology.common_links`) are counted, so the bound holds under
    any routing and channel assignment.  The trees are kept for the build; the
    schedule's operations are what ``auto`` saves where this already loses.
    """
    topology = net.topology
    kind = describe(collective)
    if kind.rooted or kind.exchanges or topology.size == 1:
        return 0.0
    plans = [plan for plan in _trees(net, kind, options.size_bytes) if plan is not None]
    return net.common_link_time(
        ((e.child, e.parent) if plan.reverse else (e.parent, e.child)) + (options.size_bytes / len(plan.roots),)
        for plan in plans for tree in plan.edges for e in tree)


def _all_pairs_limit(size_bytes: int) -> int:
    """Up to how many ranks every routable pair is a candidate tree edge at ``size_bytes``."""
    return _ALL_PAIRS_UP_TO if size_bytes >= _ALL_PAIRS_FROM_BYTES else _ALL_PAIRS_SMALL_UP_TO


def _single(kind: Collective, meta: dict) -> Schedule:
    b = ScheduleBuilder(kind.name, 1, 1, 1, root=0 if kind.rooted else None)
    b.copy(0, Chunk("i", 0), Chunk("o", 0))
    return b.build("multitree", meta)


def _gather(b: ScheduleBuilder, plan: TreePlan, q: int, *, source, block, step_offset: int = 0) -> None:
    """Root to leaves: tree ``i``'s root sends ``source(i, j)``, every other rank forwards ``block(i, j)``."""
    for i, tree in enumerate(plan.edges):
        root = plan.roots[i]
        for e in _by_step(tree):
            for j in range(q):
                src = source(i, j) if e.parent == root else block(i, j)
                b.send(e.parent, e.child, src, step=step_offset + e.step, channel=i)
                b.recv(e.child, e.parent, block(i, j), step=step_offset + e.step, channel=i)


def _extra_children(plan: TreePlan, p: int) -> int:
    """Most children beyond the first that one rank has, summed over the trees (its scratch slots)."""
    extra = [0] * p
    for tree in plan.edges:
        kids = [0] * p
        for e in tree:
            kids[e.parent] += 1
        for r, k in enumerate(kids):
            extra[r] += max(0, k - 1)
    return max(extra)


def _scatter(b: ScheduleBuilder, plan: TreePlan, q: int, *, own, partial, result, spare: int) -> None:
    """Leaves to root in reverse step order; each rank folds its children's sums into its own, then sends up.

    ``own(i, j)`` is a rank's contribution to piece ``j`` of tree ``i``,
    ``partial(i, j)`` where it accumulates, ``result(j)`` where the root
    accumulates (None: in ``partial`` as well).  The first child's sum is
    received-and-reduced in place; the others land in their own scratch chunks
    (from ``spare`` on) and are reduced locally, so that all children of a rank
    can send at once instead of queueing on the accumulator.
    """
    depth = plan.steps
    slot = [spare] * b.ranks
    for i, tree in enumerate(plan.edges):
        root = plan.roots[i]
        started: set[int] = set()  # ranks whose partial sum holds their own contribution already
        for e in _by_step(tree, reverse=True):
            child, parent = e.child, e.parent
            up = depth + 1 - e.step
            first = parent not in started
            for j in range(q):
                src = partial(i, j) if child in started else own(i, j)
                acc = result(j) if (parent == root and result is not None) else partial(i, j)
                b.send(child, parent, src, step=up, channel=i)
                if first:
                    b.recv(parent, child, acc, reduce=True, src=own(i, j), step=up, channel=i)
                else:
                    tmp = Chunk("s", slot[parent] + j)
                    b.recv(parent, child, tmp, step=up, channel=i)
                    b.reduce(parent, tmp, acc, step=up)
            if not first:
                slot[parent] += q
            started.add(parent)


#: Tree counts tried for broadcast (each tree carries an equal share of the buffer).
_BROADCAST_TREES = (1, 2, 3, 4, 6, 8, 12, 16)


def _congestion(net: Network, *plans: TreePlan) -> float:
    """Seconds per byte of one tree's share on the busiest link (all trees of ``plans`` streaming at once)."""
    topology = net.topology
    bandwidth = {(link.src, link.dst): link.bandwidth for link in topology.links}
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    for plan in plans:
        for channel, tree in enumerate(plan.edges):
            for e in tree:
                a, b = (e.child, e.parent) if plan.reverse else (e.parent, e.child)
                load.add_shares(net.route_shares(a, b, channel), 1)
    return load.busiest(bandwidth.__getitem__)


#: Trees per root tried for all-reduce.  With one tree per root every tree carries 1/p of the data, and
#: integral edge counts can leave links unevenly loaded (where the trees' link crossings do not divide evenly
#: over the links, some carry a tree more than the mean); with more trees per root the shares can even out.
_ALLREDUCE_COPIES = (1, 2, 3, 4)
#: ... while the trees number at most this many (copies x ranks): each try grows twice that many trees, and
#: growing them costs far more than the trees' count.
_ALLREDUCE_MAX_TREES = 64
#: More than one tree per root only from this size: each copy adds as many lock-step steps again (a path
#: latency each), which only a bandwidth-bound collective wins back.
_COPIES_FROM_BYTES = 16 << 20
#: And only while c^2 p^4 stays within this: growing c x p trees exhaustively costs about that much, and
#: by itself this allows four trees per root on 32 ranks, one on 64.
_COPIES_WORK = 4**2 * 32**4


def allreduce_copies(p: int, size_bytes: int) -> tuple[int, ...]:
    """Trees per root that all-reduce tries on ``p`` ranks at ``size_bytes`` (always 1; more when they pay)."""
    return tuple(c for c in _ALLREDUCE_COPIES
                 if c == 1 or (size_bytes >= _COPIES_FROM_BYTES and c * c * p**4 <= _COPIES_WORK
                               and c * p <= _ALLREDUCE_MAX_TREES))


def _allreduce_trees(net: Network, quota: int | None, size_bytes: int) -> tuple[TreePlan, TreePlan]:
    """Broadcast and reduction trees for all-reduce, as many per root (of :func:`allreduce_copies`) as congest
    least.

    The reduction trees are grown against the broadcast trees' load, since the
    two phases of a piece share the links.
    """
    topology = net.topology
    p = topology.size
    best: tuple[float, TreePlan, TreePlan] | None = None
    for c in allreduce_copies(p, size_bytes):
        roots = [r for _ in range(c) for r in range(p)]
        down = build_trees(net, roots, quota=quota)
        up = build_trees(net, roots, reverse=True, quota=quota, prior=down)
        cost = _congestion(net, down, up) / len(roots)
        if best is None or cost < best[0] * (1 - 1e-6):
            best = (cost, down, up)
    assert best is not None
    return best[1], best[2]


def _broadcast(net: Network, options: Options, meta: dict) -> Schedule:
    """Several trees from the root, grown together like MultiTree's, each carrying ``1/k`` of the buffer.

    ``k`` is chosen from :data:`_BROADCAST_TREES` to minimise the busiest
    link's load per byte broadcast.
    """
    topology = net.topology
    p = topology.size
    root = options.root
    if not 0 <= root < p:
        raise NotApplicableError(f"multitree: root {root} is not a rank of {topology.name} ({p} ranks)")
    if p == 1:
        return _single(BROADCAST, meta)
    quota = None if p <= _ALL_PAIRS_UP_TO else _CLASS_QUOTA
    best: tuple[float, TreePlan] | None = None
    for k in _BROADCAST_TREES if options.channels is None else (options.channels,):
        plan = build_trees(net, [root] * k, quota=quota)
        cost = _congestion(net, plan) / k
        if best is None or cost < best[0] * (1 - 1e-6):
            best = (cost, plan)
    assert best is not None
    plan = best[1]
    k = len(plan.roots)
    q = _pieces(options, options.size_bytes / k, k * (p - 1))
    meta.update(channels=k, pipeline=q, steps=plan.steps)
    b = ScheduleBuilder("broadcast", p, k * q, k * q, root=root)
    b.copy(root, Chunk("i", 0, k * q), Chunk("o", 0, k * q))
    _gather(b, plan, q, source=lambda i, j: Chunk("i", i * q + j), block=lambda i, j: Chunk("o", i * q + j))
    return b.build("multitree", meta)
