"""Broadcast and reduce over hosts of several GPUs: a scatter in the root's host, a chain per rail, a fan-out.

A broadcast's bound on a cluster is the NICs (the root's rack or host sends N
out), but a ring's chain passes every GPU in turn: on six 8-GPU hosts 47 hops,
each a piece's transfer, so a pipeline of pieces spends more time filling than
streaming.  Here the data is cut into one piece per GPU of a host (a *rail*:
the GPUs of one local index, one per host, as NCCL's rings pair them across
nodes):

1. the root sends piece c to the GPU of index c in its own host (a scatter
   over the host's switch);
2. piece c crosses the hosts on a pipelined chain of rail c, the hosts in
   rack order from the root's, so that each rack boundary is crossed once and
   every NIC sends and receives N / k (k GPUs a host): the NICs' bound.  On
   more than :data:`CHAIN_HOSTS` hosts the chain would be too deep, and the
   piece crosses them in halves on two binary trees instead, as NCCL's double
   binary tree does (:func:`_routes`);
3. in every host the rail's GPU passes each piece on to the host's other GPUs
   as it arrives.  The root's own piece is cut into k - 1 parts, one for each
   other GPU of its host, which passes its part on to the rest: so the root's
   link to its switch carries N, not N plus (k - 1) / k N again.

The buffer is cut into slices that run this one after the other, each step as
soon as its data is there: the chain is H - 1 hops deep for H hosts (the trees
about 2 log2 H), not p - 1.  Where the message budget binds (many hosts), a
host's fan-out covers a group of slices at once, so that the rails get more.

Reduce is the same run backwards: every host reduces each piece onto its
rail's GPU, the rails' chains add the hosts' sums towards the root's host, and
the root collects the pieces.  Receives that a GPU adds up land in scratch
slots of their own, reused a few groups later, so that no receive waits for
another's reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from topocc.planner.compiler.algorithms._order import depth_order, host_size, root_rank, single_rank
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import relays
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["CHAIN_HOSTS", "MAX_TRANSFERS", "SLOT_SLICES", "rooted_hierarchical"]

#: No piece smaller than this (one rail's share of a slice) where the size allows :data:`MIN_SLICES` of them:
#: below it per-message costs outweigh the pipeline.
MIN_PIECE_BYTES = 64 << 10
#: At least this many slices where the message budget allows, however small the message: unsliced, a chain
#: runs its hops one after the other, as hierarchical's other collectives would run their levels.
MIN_SLICES = 8
#: Transfers per schedule at most (each a send and a receive): bounds compile and simulation time.
MAX_TRANSFERS = 1 << 15
#: Up to this many hosts a rail's piece crosses them on a chain; beyond, on two binary trees (:func:`_routes`):
#: a chain's depth grows with the hosts, the trees' with their logarithm, but the trees cross the leaves'
#: uplinks more often, which on a few oversubscribed leaves costs more than the depth saves.
CHAIN_HOSTS = 8
#: Groups of slices (see :func:`_slices`) whose scratch slots a reduce keeps apart before it reuses them (a slot's
#: reuse waits for its reduction).
SLOT_SLICES = 4

#: How a rail's piece (or an equal share of it) crosses the hosts: each host's parent, and the hosts, parents
#: first (positions in :func:`_hosts_in_order`; the root's host is 0).
Route = tuple[dict[int, int], list[int]]


def _hosts_in_order(net: Network, root: int) -> list[tuple[int, ...]]:
    """The hosts, the root's first, then the rest of its rack, then the other racks a rack at a time."""
    topology = net.topology
    rack_of = {r: name for name, ranks in topology.racks.items() for r in ranks}
    hosts = list(topology.hosts.values())
    home = next(h for h in hosts if root in h)
    racks: dict[str, list[tuple[int, ...]]] = {}
    for h in hosts:
        racks.setdefault(rack_of.get(h[0], ""), []).append(h)
    first = rack_of.get(root, "")
    ordered = [home, *(h for h in racks[first] if h != home)]
    for name, members in racks.items():
        if name != first:
            ordered.extend(members)
    return ordered


def _routes(hosts: int) -> list[Route]:
    """How each rail's piece crosses the hosts (positions in :func:`_hosts_in_order`): per equal share of the
    piece, each host's parent and the hosts, parents first.

    A chain, or on more hosts than :data:`CHAIN_HOSTS` two binary trees each carrying half the piece, the second
    shifted by one so that a host forwarding in one is a leaf in the other (NCCL's double binary tree, per
    rail): a NIC still sends N / k, and the pipeline is about 2 log2 H transfers deep instead of H - 1.
    """
    if hosts <= CHAIN_HOSTS:
        return [({h: h - 1 for h in range(1, hosts)}, list(range(1, hosts)))]
    rest = list(range(1, hosts))
    routes = []
    for nodes in (rest, rest[1:] + rest[:1]):
        top, parent = _counting_tree(nodes)
        parent[top] = 0
        routes.append((parent, depth_order(0, parent)))
    return routes


def _counting_tree(nodes: list[int]) -> tuple[int, dict[int, int]]:
    """An in-order binary tree over ``nodes`` in which the x-th (from 1) sits at the height of x's trailing zero
    bits: the odd-numbered are the leaves, so in the same tree over the nodes shifted by one the leaves are the
    others, and no node has more than two children in the two trees together (Sanders, Speck and Traeff,
    "Two-tree algorithms for full bandwidth broadcast, reduction and scan", 2009, section 3).  Returns the
    top node and every other node's parent."""
    m = len(nodes)
    top = 1 << (m.bit_length() - 1)
    parent: dict[int, int] = {}
    for x in range(1, m + 1):
        p = x
        while p != top:
            h = (p & -p).bit_length() - 1
            p = p + (1 << h) if not (p >> (h + 1)) & 1 else p - (1 << h)
            if p <= m:
                break
        if x != top:
            parent[nodes[x - 1]] = nodes[p - 1]
    return nodes[top - 1], parent


def _slices(options: Options, routes: list[Route], hosts: int, k: int) -> tuple[int, int]:
    """Slices, and how many of them a host's fan-out (a reduce's gathering) covers at once.

    Pieces of at least :data:`MIN_PIECE_BYTES` but :data:`MIN_SLICES` at least, transfers within
    :data:`MAX_TRANSFERS`.  A slice costs its rail crossings, its scatter and the root's parts; a fan-out
    (k - 1 messages from each rail's GPU of every host) can cover a group of slices, since the hosts' switches
    do not need the pipeline's fine grain, so the same budget buys more slices.  The pipeline takes about S +
    D + G piece times for S slices, D the routes' depth and G the group (the last group's fan-out waits for
    it), so the (S, G) that least add to S, (D + G) / S, within the budget.
    """
    share = len(routes)
    crossing = k * (hosts - 1) * share + (k - 1) * (k - 1)  # a slice's rail crossings, scatter and root's parts
    fan = hosts * k * (k - 1)  # one fan-out in every host
    depth = max(_depth(route) for route in routes)
    wanted = max(int(options.size_bytes // (k * MIN_PIECE_BYTES)), MIN_SLICES)
    best: tuple[float, int, int] | None = None
    group = 1
    while True:
        slices = max(1, options.pipeline) if options.pipeline is not None else max(1, min(
            wanted, MAX_TRANSFERS * group // (group * crossing + fan)))
        fits = slices * crossing + -(-slices // group) * fan <= MAX_TRANSFERS
        if fits or group >= slices:
            cost = (depth + group) / slices
            if best is None or cost < best[0]:
                best = (cost, slices, group)
        if group >= slices:
            break
        group *= 2
    assert best is not None
    return best[1], best[2]


def _depth(route: Route) -> int:
    """Transfers from the root's host to the farthest host on ``route``."""
    parent, order = route
    hops = {0: 0}
    for h in order:
        hops[h] = hops[parent[h]] + 1
    return max(hops.values())


@dataclass(frozen=True, slots=True)
class _Rails:
    """Where every piece of the buffer lives and how it travels: the hosts, the rails, the slices.

    The buffer holds each rail's piece for every slice in turn (a piece's
    slices one after another, so that a group of them is one message); a piece
    is ``units`` chunks: the root's piece is cut into its host's k - 1 other
    GPUs' parts, and each of those in as many as the routes share a piece.
    """

    root: int
    hosts: list[tuple[int, ...]]
    rails: list[list[int]]  # rails[c][h]: the GPU of local index c in the h-th host
    routes: list[Route]
    slices: int
    group: int  # slices a host's fan-out covers at once

    @property
    def k(self) -> int:
        return len(self.hosts[0])

    @property
    def c0(self) -> int:
        """The root's local index: its piece is the one the root's host shares out in parts."""
        return self.hosts[0].index(self.root)

    @property
    def others(self) -> list[int]:
        """The root's host but the root: one part of the root's piece each."""
        return [r for r in self.hosts[0] if r != self.root]

    @property
    def share(self) -> int:
        return len(self.routes)

    @property
    def units(self) -> int:
        return (self.k - 1) * self.share

    def at(self, s: int, c: int) -> int:
        """Where piece ``c`` of slice ``s`` starts."""
        return (c * self.slices + s) * self.units

    def piece(self, s: int, c: int, count: int = 1) -> Chunk:
        """Piece ``c`` of slices ``s`` ... ``s + count - 1``."""
        return Chunk("o", self.at(s, c), count * self.units)

    def part(self, s: int, i: int) -> Chunk:
        """Part ``i`` of the root's piece of slice ``s`` (the share of ``others[i]``)."""
        return Chunk("o", self.at(s, self.c0) + i * self.share, self.share)

    def shares(self, s: int, c: int) -> list[tuple[Chunk, dict[int, int], list[int]]]:
        """Each route's share of piece ``c`` of slice ``s``, with its parents and hosts, parents first."""
        size = self.units // self.share
        return [(Chunk("o", self.at(s, c) + t * size, size), parent, order)
                for t, (parent, order) in enumerate(self.routes)]

    def fan_out(self, first: int, count: int) -> list[tuple[int, int, Chunk]]:
        """The hosts' messages of slices ``first`` ... ``first + count - 1`` between each rail's GPU and the
        host's others but the root: (rail GPU, other GPU, pieces)."""
        rails, c0, root = self.rails, self.c0, self.root
        return [(rails[c][h], t, self.piece(first, c, count))
                for c in range(self.k) for h, host in enumerate(self.hosts)
                if not (h == 0 and c == c0) for t in host if t != rails[c][h] and t != root]


def rooted_hierarchical(net: Network, collective: str, options: Options) -> Schedule:
    """Broadcast or reduce as a scatter in the root's host, a pipelined chain per rail, a fan-out in each host
    (see the module docstring).  Needs hosts of equal size, of several GPUs each."""
    kind = describe(collective)
    collective = kind.name
    if not kind.rooted:
        raise NotApplicableError(f"hierarchical's rooted form builds broadcast and reduce, not {collective}")
    p = net.topology.size
    root = root_rank(options, p)
    meta = options.as_dict()
    if p == 1:
        return single_rank(collective, 1, 1, "hierarchical", meta, root)
    k = host_size(net, "hierarchical")
    if k == 1:
        raise NotApplicableError("hierarchical broadcast and reduce need hosts of several GPUs, to cross the "
                                 "hosts on rails (one GPU a host: tree or ring)")
    hosts = _hosts_in_order(net, root)
    routes = _routes(len(hosts))
    slices, group = _slices(options, routes, len(hosts), k)
    rails = _Rails(root, hosts, [[h[c] for h in hosts] for c in range(k)], routes, slices, group)
    meta.update(pipeline=slices, hosts=len(hosts), rails=k, trees=rails.share if rails.share > 1 else 0,
                fan_out_slices=group)
    n = slices * k * rails.units
    reduce = kind.reduces
    # a reduce's scratch: per rank and group of slices (of SLOT_SLICES in turn), a slot for each piece it adds:
    # a rail's GPU gets k - 1 a slice from its host and one from the hosts beyond (a whole one on the chain; on
    # the trees half from each of at most two children)
    b = ScheduleBuilder(collective, p, n, n, root=root, relay=relays(net),
                        scratch_chunks=SLOT_SLICES * _slot_units(rails) if reduce else 0)
    for r in range(p):
        if reduce or r == root:
            b.copy(r, Chunk("i", 0, n), Chunk("o", 0, n))
    if reduce:
        _Reduce(b, rails, p).emit()
    else:
        _broadcast(b, rails)
    return b.build("hierarchical", meta)


def _slot_units(rails: _Rails) -> int:
    """Scratch units a reduce's rank takes per group of slices."""
    return rails.k * rails.group * rails.units


def _broadcast(b: ScheduleBuilder, rails: _Rails) -> None:
    """Each slice: the root's scatter to the rails, the rails' chains (or trees), the root's parts shared in
    its host; each group of slices: the fan-out in every host."""
    root, c0, others = rails.root, rails.c0, rails.others
    for s in range(rails.slices):
        for c in range(rails.k):
            chain = rails.rails[c]
            if c != c0:
                b.transfer(root, chain[0], rails.piece(s, c), rails.piece(s, c), step=0)
            for ref, parent, order in rails.shares(s, c):
                for h in order:
                    b.transfer(chain[parent[h]], chain[h], ref, ref, step=h, channel=1)
        for i, q in enumerate(others):
            b.transfer(root, q, rails.part(s, i), rails.part(s, i), step=1, channel=2)
        for i, q in enumerate(others):
            for t in others:
                if t != q:
                    b.transfer(q, t, rails.part(s, i), rails.part(s, i), step=2, channel=2)
        if (s + 1) % rails.group == 0 or s + 1 == rails.slices:
            first = s // rails.group * rails.group
            for src, dst, run in rails.fan_out(first, s + 1 - first):
                b.transfer(src, dst, run, run, step=len(rails.hosts))


class _Reduce:
    """A reduce, the broadcast run backwards: each partial sum received into a scratch slot, then added."""

    def __init__(self, b: ScheduleBuilder, rails: _Rails, p: int) -> None:
        self.b, self.rails = b, rails
        self.slot_units = _slot_units(rails)
        self.used = [0] * p  # slot units taken in the current group of slices, per rank

    def gather(self, src: int, dst: int, ref: Chunk, s: int, step: int, channel: int = 0) -> None:
        """``src``'s partial sum ``ref`` added into ``dst``'s, received into a slot of its own first."""
        rails = self.rails
        slot = Chunk("s", (s // rails.group % SLOT_SLICES) * self.slot_units + self.used[dst], ref.count)
        self.used[dst] += ref.count
        self.b.transfer(src, dst, ref, slot, step=step, channel=channel)
        self.b.reduce(dst, slot, ref, step=step)

    def emit(self) -> None:
        """Every slice: each group's sums onto the rails' GPUs, the root's host's sum of its piece in parts,
        the chains (or trees) towards the root's host, and the pieces to the root."""
        rails, b = self.rails, self.b
        root, others, last = rails.root, rails.others, len(rails.hosts)
        for s in range(rails.slices):
            if s % rails.group == 0:
                # every host's sums of the group's pieces onto their rails' GPUs
                self.used[:] = [0] * len(self.used)
                for dst, src, run in rails.fan_out(s, min(rails.group, rails.slices - s)):
                    self.gather(src, dst, run, s, 0)
            # the root's host's sum of the root's piece, in parts
            for i, q in enumerate(others):
                for t in others:
                    if t != q:
                        self.gather(t, q, rails.part(s, i), s, 0, channel=2)
            for c in range(rails.k):
                chain = rails.rails[c]
                # the chain (or trees), from the far hosts to the root's
                for ref, parent, order in rails.shares(s, c):
                    for h in reversed(order):
                        self.gather(chain[h], chain[parent[h]], ref, s, last - h, channel=1)
                if c != rails.c0:
                    b.transfer(chain[0], root, rails.piece(s, c), rails.piece(s, c), reduce=True, step=last)
            for i, q in enumerate(others):
                b.transfer(q, root, rails.part(s, i), rails.part(s, i), reduce=True, step=last, channel=2)
