"""Bucket collectives on a torus or mesh: every dimension's links busy at once (Jain and Sabharwal).

"Optimal bucket algorithms for large MPI collectives on torus interconnects"
(ICS 2010): a d-dimensional reduce-scatter runs along each dimension in turn
(a ring on a torus, a line on a mesh), an all-gather back in the reverse
order, an all-reduce both.  One such sequence keeps only one dimension's
links busy; the data is therefore cut into streams that each take the
dimensions in a rotated order (stream ``s`` starts with dimension ``s mod d``)
and, on a torus, go round the rings one way or the other.  At every level the
streams use different dimensions and directions, so every link carries one
stream and each node sends on all its links at once: a reduce-scatter moves
``(p-1)/p`` of each stream's data over its own links, what the cut bound of a
node's links allows.  On a mesh each line runs both ways at once (a part's
sums flow towards its owner from both ends), as fast as an end node's one
link allows.  That loads an end's link one way in the reduce-scatter and the
other way in the all-gather, so a mesh all-reduce runs in slices, one slice's
reduce-scatter beside an earlier one's all-gather, which keeps both ways of
the end links busy.  On a 3D mesh the later levels' sums cross the end links
too, which keeps it well short of the bound.  On unequal
dimensions the order that starts on the longest loads it most, so the orders
share the data unequally, in as many streams each (:func:`_order_parts`; a
torus all-reduce then runs in slices too).

Hierarchical and halving-doubling see a grid as one level: a single ring or
exchange over all ranks, a third of the bound or less on a 3D torus (routes
run in dimension order, so one ring's long hops collide).  Each rank owns one
router here; the grid is read off the links' ``dim`` labels.  An all-reduce
keeps each stream's data in its own order, a part one run.  Reduce-scatter and
all-gather must keep every rank's block where the collective puts it, where a
stream's share of k blocks lies in k places; they work in scratch instead,
each stream's share in its own order, and copy every share of every block
between scratch and the buffer on its own, within :data:`MAX_OPERATIONS`.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

from topocc.planner.compiler.algorithms._order import Send, ring_steps, single_rank
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Memo, Network
from topocc.planner.topology.model import Topology
from topocc.runtime.collective import ALLREDUCE, Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["Grid", "bucket", "grid_of"]


@dataclass(frozen=True, slots=True)
class Grid:
    """The ranks of a torus or mesh: each rank's coordinates, and per dimension its size and whether it wraps."""

    coords: tuple[tuple[int, ...], ...]
    sizes: tuple[int, ...]
    rings: tuple[bool, ...]

    def lines(self, dim: int) -> list[list[int]]:
        """The ranks along each line of ``dim``, in coordinate order."""
        by: dict[tuple[int, ...], list[int]] = {}
        for r, c in enumerate(self.coords):
            by.setdefault(c[:dim] + c[dim + 1:], []).append(r)
        return [sorted(g, key=lambda r: self.coords[r][dim]) for g in by.values()]


def grid_of(net: Network) -> Grid:
    """The grid the ``dim``-labelled links make, one rank per router; raises
    :class:`NotApplicableError` (saying why) where the fabric is not one."""
    found = net.memo(_GRID)
    if isinstance(found, str):
        raise NotApplicableError(found)
    return found


def _grid_or_why(net: Network) -> Grid | str:
    """The network's grid, or why it has none."""
    try:
        return _read_grid(net)
    except NotApplicableError as exc:
        return exc.message


#: Each network's grid, read once (every algorithm of the race asks whether the fabric is one).
_GRID: Memo[Grid | str] = Memo("bucket: grid", _grid_or_why)


def _read_grid(net: Network) -> Grid:
    topology = net.topology
    steps: dict[str, list[tuple[str, int, int]]] = {}  # router -> (neighbour, dim, +1 or -1)
    for link in topology.links:
        if link.dim is not None:
            steps.setdefault(link.src, []).append((link.dst, link.dim, 1 if link.ascending else -1))
    if not steps:
        raise NotApplicableError("bucket needs a torus or mesh network (links with a dim)",
                                 fix="describe the network as type: torus or mesh")
    ndim = 1 + max(d for out in steps.values() for _, d, _ in out)
    # each rank's router: the nearest one reached through devices that are neither ranks nor routers
    ranks = set(topology.ranks)
    out_links: dict[str, list[str]] = {}
    for link in topology.links:
        out_links.setdefault(link.src, []).append(link.dst)
    router_of: dict[str, int] = {}
    for r, name in enumerate(topology.ranks):
        seen, queue, found = {name}, deque([name]), None
        while queue and found is None:
            u = queue.popleft()
            for v in out_links.get(u, ()):
                if v in steps:
                    found = v
                    break
                if v not in seen and v not in ranks:
                    seen.add(v)
                    queue.append(v)
        if found is None:
            raise NotApplicableError(f"bucket: rank {name} reaches no router of the grid")
        if found in router_of:
            raise NotApplicableError(f"bucket needs one rank per grid router; {found} has several")
        router_of[found] = r
    # coordinates: the displacement from a first router, one per ascending (+1) or descending (-1) hop,
    # taken round a dimension's rings (whose length is found by going round the first router's)
    start = min(steps)
    pos: dict[str, tuple[int, ...]] = {start: (0,) * ndim}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v, d, sign in steps[u]:
            if v not in pos:
                c = list(pos[u])
                c[d] += sign
                pos[v] = tuple(c)
                queue.append(v)
    if set(pos) != set(steps):
        raise NotApplicableError("bucket: the grid's routers are not all connected")
    ring_size: list[int | None] = []
    for d in range(ndim):
        at, n = start, 0
        while True:
            nxt = [v for v, e, sign in steps[at] if e == d and sign == 1]
            if len(nxt) != 1:
                break
            at, n = nxt[0], n + 1
            if at == start or n > len(steps):
                break
        ring_size.append(n if at == start and n > 0 else None)
    rings = tuple(k is not None for k in ring_size)
    wrapped = {u: tuple(x % k if k else x for x, k in zip(c, ring_size)) for u, c in pos.items()}
    low = [min(c[d] for c in wrapped.values()) for d in range(ndim)]
    sizes = tuple(max(c[d] for c in wrapped.values()) - low[d] + 1 for d in range(ndim))
    coords = {u: tuple(x - lo for x, lo in zip(c, low)) for u, c in wrapped.items()}
    if len(set(coords.values())) != len(coords) or len(coords) != math.prod(sizes):
        raise NotApplicableError("bucket: the routers do not form a full grid")
    for u, out in steps.items():  # every link joins neighbours along its dimension
        for v, d, sign in out:
            step = list(coords[u])
            step[d] = (step[d] + sign) % sizes[d] if rings[d] else step[d] + sign
            if coords[v] != tuple(step):
                raise NotApplicableError(f"bucket: link {u} -> {v} does not join neighbours of a grid")
    if len(router_of) != len(coords):
        raise NotApplicableError("bucket needs one rank on every grid router")
    by_rank = [coords[u] for u, _ in sorted(router_of.items(), key=lambda item: item[1])]
    return Grid(tuple(by_rank), sizes, rings)


def _line(n: int, gather: bool) -> list[list[Send]]:
    """Reduce-scatter / all-gather along a line of ``n`` members, both ways at once.

    Reduce-scatter: part j's sums flow from member 0 up to j and from member
    n - 1 down to j, timed so that every chain ends at the last step: at step t
    member i sends part n - 1 + i - t up (t >= i) and part i - n + 1 + t down.
    All-gather is that run backwards, each message reversed.
    """
    steps: list[list[Send]] = []
    for t in range(n - 1):
        step = []
        for i in range(n):
            up, down = n - 1 + i - t, i - n + 1 + t
            if i < up < n:
                step.append((i, i + 1, up, up + 1))
            if 0 <= down < i:
                step.append((i, i - 1, down, down + 1))
        steps.append(step)
    if not gather:
        return steps
    return [[(j, i, a, b) for i, j, a, b in step] for step in reversed(steps)]


#: Operations a reduce-scatter or all-gather may take, a copy of every part of every block included: it bounds
#: compile and simulation time.  A part per order fits it on a 512-rank 3D torus; a part per stream, or the
#: messages of blocks kept in place, would not.
MAX_OPERATIONS = 1 << 20
#: A mesh all-reduce's slices (see the module docstring): at most this many, within this many operations,
#: each at least this large.  More slices overlap the phases more closely; each slice pays its own latency.
MESH_SLICES = 64
SLICED_OPERATIONS = 1 << 16
MIN_SLICE_BYTES = 16 << 10


#: At most this many parts of a block per way round the rings, shared among the orders (see :func:`_order_parts`).
MAX_ORDER_PARTS = 16


def _order_parts(grid: Grid, orders: list[list[int]], ways: int, bandwidth: dict[int, float], port: float,
                 levels: int) -> tuple[int, ...]:
    """How many parts of every block each order carries: the fewest, in the proportion that loads every
    dimension's links most evenly where they, not the ranks' ports, are the bottleneck (equal on a cube).

    At level l an order moves (n - 1) / n of what it holds over the links of its l-th dimension (n long),
    holding 1 / (the product of the earlier dimensions' lengths) of its data: round a ring each of the
    ``ways`` one way, along a line (a mesh, or a torus dimension of 2) every way both ways, its end link
    carrying that much; a rank's port (``port`` bytes/s) carries all it sends.  Only the first ``levels``
    count: an all-gather's levels overlap (its items go on as they arrive), a reduce-scatter's first level
    runs mostly alone (the others wait for it), so where the links bind over all levels a reduce-scatter
    balances its first.  Where the ports bind instead, equal parts balance best.
    """
    dims = orders[0]
    fastest = max(bandwidth.values())
    # per unit of an order's data, in the fastest link's time: on each dimension's busiest link, at its port
    load = [[0.0] * len(grid.sizes) for _ in orders]
    sent = [0.0] * len(orders)
    for o, order in enumerate(orders):
        held = 1.0
        for d in order[:levels]:
            moved = (grid.sizes[d] - 1) / grid.sizes[d] * held
            load[o][d] += moved / (ways if grid.rings[d] else 1) * fastest / bandwidth[d]
            sent[o] += moved * fastest / port
            held /= grid.sizes[d]
    best: tuple[tuple[float, int], tuple[int, ...]] | None = None
    for parts in itertools.product(range(1, MAX_ORDER_PARTS + 1), repeat=len(orders)):
        total = sum(parts)
        if total > MAX_ORDER_PARTS:
            continue
        busiest = max(sum(k * sent[o] for o, k in enumerate(parts)),
                      *(sum(k * load[o][d] for o, k in enumerate(parts)) for d in dims)) / total
        key = (round(busiest, 12), total)
        if best is None or key < best[0]:
            best = (key, parts)
    assert best is not None
    return best[1]


#: A torus all-reduce weighs its orders only where the slice budget leaves it at least this many slices
#: (see :func:`_streams`).
MIN_WEIGHTED_SLICES = 4


def _sends(grid: Grid, dims: list[int], ranks: int, streams: int) -> int:
    """Messages of one phase (a reduce-scatter or an all-gather) whose parts go as runs: every stream's levels."""
    return streams * ranks * sum(grid.sizes[d] - 1 for d in dims)


@dataclass(frozen=True, slots=True)
class _Streams:
    """The streams of a bucket collective: each takes the dimensions in one of the rotated ``orders`` (order
    ``o`` starts with the o-th), one of the ``ways`` round the rings; order ``o`` carries ``per_order[o]``
    parts of the data per way."""

    orders: list[list[int]]
    ways: tuple[int, ...]
    per_order: tuple[int, ...]

    @property
    def order_of(self) -> list[int]:
        """Each stream's order."""
        return [o for o, k in enumerate(self.per_order) for _ in range(k) for _ in self.ways]

    @property
    def streams(self) -> list[tuple[list[int], int]]:
        """Each stream's order of dimensions and way round the rings (1 or -1)."""
        return [(self.orders[o], self.ways[s % len(self.ways)]) for s, o in enumerate(self.order_of)]

    @property
    def weighted(self) -> bool:
        """Whether the orders carry unequal shares."""
        return len(set(self.per_order)) > 1


def _streams(grid: Grid, dims: list[int], topology: Topology, kind: Collective) -> _Streams:
    """Each dimension first once (some orders more than once, see :func:`_order_parts`), each way round its rings."""
    p = topology.size
    orders = [dims[s:] + dims[:s] for s in range(len(dims))]
    ways = (1, -1) if any(grid.rings[d] for d in dims) else (1,)
    bandwidth: dict[int, float] = {}  # the slowest link of each dimension
    egress: dict[str, float] = {}  # each device's links out, bytes/s
    for link in topology.links:
        egress[link.src] = egress.get(link.src, 0.0) + link.bandwidth
        if link.dim is not None:
            bandwidth[link.dim] = min(bandwidth.get(link.dim, math.inf), link.bandwidth)
    port = min(egress[name] for name in topology.ranks)
    per_order = _order_parts(grid, orders, len(ways), bandwidth, port, len(dims))
    if len(set(per_order)) > 1 and kind.scatters:  # the links bind, not the ports
        per_order = _order_parts(grid, orders, len(ways), bandwidth, port, 1)
    # an all-reduce weighs its orders on a torus only (a dimension of 2 is a line of one link), and only in
    # slices, where one slice's reduce-scatter runs beside an earlier one's all-gather and the two phases'
    # loads even out; a mesh line's load differs by phase, so one weighting cannot fit both
    if kind is ALLREDUCE and (any(not grid.rings[d] and grid.sizes[d] > 2 for d in dims) or
                              MIN_WEIGHTED_SLICES * 4 * _sends(grid, dims, p, sum(per_order) * len(ways))
                              > SLICED_OPERATIONS):
        per_order = (1,) * len(orders)
    return _Streams(orders, ways, per_order)


@dataclass(frozen=True, slots=True)
class _Phase:
    """One level of one slice's reduce-scatter or all-gather, from step ``start``; ``barrier`` and ``done``
    hold, per (rank, stream), the receives of the level before (what a reduce-scatter's level waits for) and
    of this one."""

    piece: int
    level: int
    gather: bool
    start: int
    barrier: dict[tuple[int, int], list[int]]
    done: dict[tuple[int, int], list[int]]


class _Bucket:
    """One bucket collective on a grid: its streams, its blocks' parts in scratch, its slices, and the steps
    that emit its schedule (see the module docstring).

    All-reduce: stream s takes chunk s of every virtual block (a rank's coordinates read as a mixed-radix
    number, the stream's first dimension most significant), so that at every level a rank holds one run of
    virtual blocks and sends each part as one run; slice l's stream s holds chunks (l n + s) p ... of the
    buffer, one per virtual block.  Reduce-scatter and all-gather: rank r's block is cut into ``parts``, each
    with one stream; a stream's items lie in scratch in its virtual order, so a part is one run, or, one by
    one (``itemwise``), each item goes on as soon as it arrives, where a run waits for its last.
    """

    def __init__(self, grid: Grid, topology: Topology, collective: str, options: Options,
                 meta: dict[str, object]) -> None:
        self.grid = grid
        self.collective = collective
        self.kind = kind = describe(collective)
        self.p = p = topology.size
        self.dims = dims = [d for d, n in enumerate(grid.sizes) if n > 1]
        plan = _streams(grid, dims, topology, kind)
        self.orders = plan.orders
        self.streams = plan.streams
        self.n = n = len(self.streams)
        meta["order_parts"] = ":".join(map(str, plan.per_order))
        self.whole = kind is not ALLREDUCE  # each rank's block stays where the collective puts it
        self.lined = kind.reduces and not all(grid.rings[d] for d in dims)  # sums flow along lines
        self.lines = {d: grid.lines(d) for d in dims}
        self.parts, self.itemwise = n, False
        self.item: list[tuple[int, int]] = []  # scratch index -> (rank, part)
        # stream -> scratch index of its first item at or after each virtual block
        self.first_item: list[list[int]] = []
        if self.whole:
            by_parity = self._cut(plan)
            self._place_items(plan, by_parity)
            meta["parts"] = self.parts
        self.slot = {(r, k): i for i, (r, k) in enumerate(self.item)}
        meta["streams"] = n
        meta["grid"] = "x".join(f"{grid.sizes[d]}{'' if grid.rings[d] else 'm'}" for d in dims)
        self.slices = 1
        if kind is ALLREDUCE and (self.lined or plan.weighted):
            # sends and receives of both phases per slice
            self.slices = options.pipeline or max(1, min(MESH_SLICES,
                                                         SLICED_OPERATIONS // (4 * _sends(grid, dims, p, n)),
                                                         options.size_bytes // MIN_SLICE_BYTES))
            meta["slices"] = self.slices
        self.spare = len(self.item)  # scratch: the items, then (meshes) where a line's owner receives aside
        self.copied: list[list[int]] = []  # per rank, its last copy into scratch (what the first level waits for)

    def _operations(self, cut: int, one_by_one: bool) -> int:
        """Copies to or from scratch (blocks cut in ``cut`` parts, each copied on its own), sends, receives."""
        p = self.p
        return cut * p * p + 2 * (cut * p * (p - 1) if one_by_one else _sends(self.grid, self.dims, p, self.n))

    def _cut(self, plan: _Streams) -> bool:
        """Set :attr:`parts` and :attr:`itemwise` within :data:`MAX_OPERATIONS`; returns whether the ways of an
        order's streams share one part (by the parity of the rank's coordinates' sum).

        A part per stream where that fits the budget, else the ways of an order's stream take one part, one way
        or the other by parity (so every line holds as many of each way's, on rings of even length); items go
        one by one where that fits too, but for a mesh's reduce-scatter, whose sums flow along lines in runs.
        """
        by_parity = self._operations(self.n, False) > MAX_OPERATIONS
        self.parts = self.n // len(plan.ways) if by_parity else self.n
        if self._operations(self.parts, False) > MAX_OPERATIONS:
            raise NotApplicableError(f"bucket's {self.collective} on {self.p} ranks copies every part of every block "
                                     f"on its own: {self._operations(self.parts, False):,} operations, more than "
                                     f"{MAX_OPERATIONS:,}", fix="use hierarchical or halving-doubling at this scale")
        self.itemwise = not self.lined and self._operations(self.parts, True) <= MAX_OPERATIONS
        return by_parity

    def _place_items(self, plan: _Streams, by_parity: bool) -> None:
        """Lay every stream's items out in scratch in its virtual order (:attr:`item`, :attr:`first_item`)."""
        grid, ways = self.grid, len(plan.ways)
        owner = [[0] * self.p for _ in self.orders]  # per order, the rank of each virtual block
        for o, order in enumerate(self.orders):
            for r in range(self.p):
                v = 0
                for e in order:
                    v = v * grid.sizes[e] + grid.coords[r][e]
                owner[o][v] = r
        stream_of = [[k * ways + sum(c) % ways if by_parity else k for k in range(self.parts)] for c in grid.coords]
        order_of = plan.order_of
        for s in range(self.n):
            self.first_item.append([len(self.item)])
            for r in owner[order_of[s]]:
                self.item.extend((r, k) for k in range(self.parts) if stream_of[r][k] == s)
                self.first_item[s].append(len(self.item))

    def emit(self) -> ScheduleBuilder:
        """The schedule: copies into scratch, every level's sends and receives, copies out."""
        p, parts, n = self.p, self.parts, self.n
        in_chunks, out_chunks = self.kind.sizes(p, parts) if self.whole else (self.slices * n * p,) * 2
        b = ScheduleBuilder(self.collective, p, in_chunks, out_chunks,
                            scratch_chunks=self.spare + (self.spare or self.slices * n * p) * self.lined)
        self._copy_in(b, in_chunks)
        self._copy_out(b, self._exchange(b))
        return b

    def _copy_in(self, b: ScheduleBuilder, in_chunks: int) -> None:
        parts = self.parts
        for r in range(self.p):
            if self.kind.gathers:
                b.copy(r, Chunk("i", 0, parts), Chunk("o", r * parts, parts))
                for k in range(parts):
                    b.copy(r, Chunk("i", k), Chunk("s", self.slot[r, k]))
            elif self.kind.scatters:
                for (owned, k), i in self.slot.items():
                    b.copy(r, Chunk("i", owned * parts + k), Chunk("s", i))
            else:
                b.copy(r, Chunk("i", 0, in_chunks), Chunk("o", 0, in_chunks))
        # the first level's sends and receives wait for all of a rank's copies into scratch, so that they become
        # ready together, in program order: a connection sends in the order its messages became ready (a line's
        # far parts first)
        self.copied = [[len(program) - 1] for program in b.programs]

    def _exchange(self, b: ScheduleBuilder) -> int:
        """Every slice's levels, each stream's sends step by step; returns the step after the last.

        A reduce-scatter's stream starts a level at a rank only once that rank has all of the level before:
        message by message, a stream's next level would take its next dimension's links while other streams
        still had their first level to send there.
        """
        grid = self.grid
        phases = [(level, True) for level in reversed(range(len(self.dims)))]
        if self.kind.reduces:  # reduce level by level, then (all-reduce) gather back down
            phases = [(level, False) for level in range(len(self.dims))] + (
                phases if self.kind.replicates else [])
        steps = {d: {gather: (ring_steps if grid.rings[d] else _line)(grid.sizes[d], gather)
                     for gather in (False, True)} for d in self.dims}
        done: dict[tuple[int, int], list[int]] = {}
        at = 0
        for piece, (level, gather) in itertools.product(range(self.slices), phases):
            width = max(grid.sizes[order[level]] for order in self.orders) - 1
            phase = _Phase(piece, level, gather, at, done if self.whole and not gather else {}, {})
            for t in range(width):
                for s, (order, _) in enumerate(self.streams):
                    plan = steps[order[level]][gather]
                    if t < len(plan):
                        self._stream_step(b, phase, s, t, plan[t])
            done = phase.done
            at += width
        return at

    def _stream_step(self, b: ScheduleBuilder, phase: _Phase, s: int, t: int, sends: list[Send]) -> None:
        """Stream ``s``'s messages of step ``t`` of ``phase``, on every line of the level's dimension."""
        grid = self.grid
        order, way = self.streams[s]
        d = order[phase.level]
        span = math.prod(grid.sizes[e] for e in order[phase.level + 1:])  # virtual blocks in one part
        first_level = self.whole and not phase.start
        for line in self.lines[d]:
            members = line if way == 1 or not grid.rings[d] else line[::-1]
            held = sum(grid.coords[line[0]][e] * math.prod(grid.sizes[f] for f in order[k + 1:])
                       for k, e in enumerate(order[:phase.level]))
            for i, j, lo, hi in sends:
                refs = self._refs(s, phase.piece, held + grid.coords[members[lo]][d] * span, span * (hi - lo))
                gate = self.copied[members[i]] if first_level else phase.barrier.get((members[i], s), ())
                # a line's owner gets its part from both ends at the last step: one of the two lands
                # in scratch and is added locally, or the second would wait for the first to finish
                aside = not phase.gather and not grid.rings[d] and j == lo < i
                for ref in refs:
                    into = Chunk("s", self.spare + ref.index, ref.count) if aside else ref
                    _, recv = b.transfer(members[i], members[j], ref, into, reduce=not phase.gather and not aside,
                                         step=phase.start + t, channel=s, after=gate,
                                         recv_after=self.copied[members[j]] if first_level else ())
                    if aside:
                        recv = b.reduce(members[j], into, ref, step=phase.start + t)
                    phase.done.setdefault((members[j], s), []).append(recv)

    def _refs(self, s: int, piece: int, first: int, count: int) -> list[Chunk]:
        """The chunks of stream ``s``'s part of ``count`` virtual blocks from ``first`` in slice ``piece``."""
        if not self.whole:
            return [Chunk("o", (piece * self.n + s) * self.p + first, count)]
        a, z = self.first_item[s][first], self.first_item[s][first + count]
        return [Chunk("s", x) for x in range(a, z)] if self.itemwise else [Chunk("s", a, z - a)] * (a < z)

    def _copy_out(self, b: ScheduleBuilder, at: int) -> None:
        """Last, so that the transfers find each run of scratch whole (copying an item splits it)."""
        for r in range(self.p):
            if self.kind.scatters:
                for k in range(self.parts):
                    b.copy(r, Chunk("s", self.slot[r, k]), Chunk("o", k), step=at)
            elif self.kind.gathers:
                for x, (owned, k) in enumerate(self.item):
                    if owned != r:
                        b.copy(r, Chunk("s", x), Chunk("o", owned * self.parts + k), step=at)


def bucket(net: Network, collective: str, options: Options) -> Schedule:
    """Bucket all-reduce, reduce-scatter or all-gather over the grid of ``topology`` (see the module docstring)."""
    topology = net.topology
    kind = describe(collective)
    collective = kind.name
    if kind.rooted or kind.exchanges:
        raise NotApplicableError(f"bucket does not implement {collective} (it builds allreduce, reducescatter, "
                                 "allgather)")
    meta = options.as_dict()
    if topology.size == 1:
        return single_rank(collective, 1, 1, "bucket", meta)
    return _Bucket(grid_of(net), topology, collective, options, meta).emit().build("bucket", meta)
