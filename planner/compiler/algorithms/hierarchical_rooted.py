"""Broadcast and reduce over hosts of several GPUs: a scatter in the root's host, a chain per rail, a fan-out.

A broadcast's bound on a cluster is the NICs (the root's rack or host sends N
out), but a ring's chain passes every GPU in turn: on six 8-GPU hosts 47 hops,
each a piece's transfer, so a pipeline of 32 pieces spends more time filling
than streaming (fattree-48-3to1 at 256 MiB: 65.5% of the bound).  Here the
data is cut into one piece per GPU of a host (a *rail*: the GPUs of one local
index, one per host, as NCCL's rings pair them across nodes):

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

from topocc.planner.compiler.options import Options
from topocc.planner.compiler.algorithms._order import depth_order, host_size, root_rank, single_rank
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.analysis.collectives import canonical_collective
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.relay import relays
from topocc.planner.routing.network import Network
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["rooted_hierarchical"]

#: No piece smaller than this (one rail's share of a slice) where the size allows :data:`MIN_SLICES` of them:
#: below it per-message costs outweigh the pipeline.
MIN_PIECE_BYTES = 64 << 10
#: At least this many slices where the message budget allows, however small the message: unsliced, a chain
#: runs its hops one after the other (broadcast at 1 MiB, 2 slices / 8: dgx-a100-4node 2.95x / 2.08x of the
#: bound, rail-8x8 5.50x / 3.55x, fattree-16-2to1 1.36x / 1.19x), as hierarchical's other collectives do.
MIN_SLICES = 8
#: Transfers per schedule at most (each a send and a receive): bounds compile and simulation time.
MAX_TRANSFERS = 1 << 15
#: Up to this many hosts a rail's piece crosses them on a chain; beyond, on two binary trees (:func:`_routes`).
#: Broadcast at 256 MiB, chain / trees: 6 hosts (fattree-48-3to1) 91.2% / 64.8% of the bound (the trees cross
#: the 3:1 leaves' uplinks more often); 10 (fattree-80-2to1) 81.6% / 89.2%; 16 (rail-16x8) 65.4% / 85.5%;
#: 32 (rail-32x8) 32.9% / 72.7%.
CHAIN_HOSTS = 8
#: Groups of slices (see :func:`_slices`) whose scratch slots a reduce keeps apart before it reuses them (a slot's
#: reuse waits for its reduction).
SLOT_SLICES = 4


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


def _routes(hosts: int) -> list[tuple[dict[int, int], list[int]]]:
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


def _slices(options: Options, routes: list[tuple[dict[int, int], list[int]]], hosts: int, k: int) -> tuple[int, int]:
    """Slices, and how many of them a host's fan-out (a reduce's gathering) covers at once.

    Pieces of at least :data:`MIN_PIECE_BYTES` but :data:`MIN_SLICES` at least, transfers within
    :data:`MAX_TRANSFERS`.  A slice costs its rail crossings, its scatter and the root's parts; a fan-out
    (k - 1 messages from each rail's GPU of every host) can cover a group of slices, since the hosts' switches
    do not need the pipeline's fine grain, so the same budget buys more slices.  The pipeline takes about S +
    D + G piece times for S slices, D the routes' depth and G the group (the last group's fan-out waits for
    it), so the (S, G) that least add to S, (D + G) / S, within the budget (256 MiB broadcast in the same
    budget: rail-32x8 16 slices one by one, 72.7% of the bound; 32 in fours, 79.6%; fattree-1024 41.2%, 32.4%
    one by one).
    """
    share = len(routes)
    crossing = k * (hosts - 1) * share + (k - 1) * (k - 1)  # a slice's rail crossings, scatter and root's parts
    fan = hosts * k * (k - 1)  # one fan-out in every host
    depth = 0
    for parent, order in routes:
        hops = {0: 0}
        for h in order:
            hops[h] = hops[parent[h]] + 1
        depth = max(depth, max(hops.values()))
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


def rooted_hierarchical(net: Network, collective: str, options: Options) -> Schedule:
    """Broadcast or reduce as a scatter in the root's host, a pipelined chain per rail, a fan-out in each host
    (see the module docstring).  Needs hosts of equal size, of several GPUs each."""
    topology = net.topology
    collective = canonical_collective(collective)
    if collective not in ("broadcast", "reduce"):
        raise NotApplicableError(f"hierarchical's rooted form builds broadcast and reduce, not {collective}")
    p = topology.size
    root = root_rank(options, p)
    meta = options.as_dict()
    if p == 1:
        return single_rank(collective, 1, 1, "hierarchical", meta, root)
    k = host_size(net, "hierarchical")
    if k == 1:
        raise NotApplicableError("hierarchical broadcast and reduce need hosts of several GPUs, to cross the "
                                 "hosts on rails (one GPU a host: tree or ring)")
    hosts = _hosts_in_order(net, root)
    home = hosts[0]
    c0 = home.index(root)
    others = [r for r in home if r != root]  # the root's host but the root: one part of the root's piece each
    rails = [[h[c] for h in hosts] for c in range(k)]
    routes = _routes(len(hosts))
    # chunks a piece: the root's piece is cut into its host's k - 1 other GPUs' parts, and each of those in
    # as many as the routes share a piece
    share = len(routes)
    units = (k - 1) * share
    slices, group = _slices(options, routes, len(hosts), k)
    n = slices * k * units
    meta.update(pipeline=slices, hosts=len(hosts), rails=k, trees=share if share > 1 else 0, fan_out_slices=group)
    reduce = collective == "reduce"
    # a reduce's scratch: per rank and group of slices (of SLOT_SLICES in turn), a slot for each piece it adds:
    # a rail's GPU gets k - 1 a slice from its host and one from the hosts beyond (a whole one on the chain; on
    # the trees half from each of at most two children)
    slot_units = k * group * units
    b = ScheduleBuilder(collective, p, n, n, root=root, relay=relays(net),
                        scratch_chunks=SLOT_SLICES * slot_units if reduce else 0)
    for r in range(p):
        if reduce or r == root:
            b.copy(r, Chunk("i", 0, n), Chunk("o", 0, n))

    def at(s: int, c: int) -> int:
        """Where piece ``c`` of slice ``s`` starts: a piece's slices one after another, so that a group of them
        is one message."""
        return (c * slices + s) * units

    def piece(s: int, c: int, count: int = 1) -> Chunk:
        """Piece ``c`` of slices ``s`` ... ``s + count - 1``."""
        return Chunk("o", at(s, c), count * units)

    def part(s: int, i: int) -> Chunk:
        """Part ``i`` of the root's piece of slice ``s`` (the share of ``others[i]``)."""
        return Chunk("o", at(s, c0) + i * share, share)

    def shares(s: int, c: int) -> list[tuple[Chunk, dict[int, int], list[int]]]:
        """Each route's share of piece ``c`` of slice ``s``, with its parents and hosts, parents first."""
        size = units // share
        return [(Chunk("o", at(s, c) + t * size, size), parent, order) for t, (parent, order) in enumerate(routes)]

    def fan_out(first: int, count: int) -> list[tuple[int, int, Chunk]]:
        """The hosts' messages of slices ``first`` ... ``first + count - 1`` between each rail's GPU and the
        host's others but the root: (rail GPU, other GPU, pieces)."""
        return [(rails[c][h], t, piece(first, c, count)) for c in range(k) for h, host in enumerate(hosts)
                if not (h == 0 and c == c0) for t in host if t != rails[c][h] and t != root]

    if not reduce:
        for s in range(slices):
            for c in range(k):
                chain = rails[c]
                if c != c0:
                    b.transfer(root, chain[0], piece(s, c), piece(s, c), step=0)
                for ref, parent, order in shares(s, c):
                    for h in order:
                        b.transfer(chain[parent[h]], chain[h], ref, ref, step=h, channel=1)
            for i, q in enumerate(others):
                b.transfer(root, q, part(s, i), part(s, i), step=1, channel=2)
            for i, q in enumerate(others):
                for t in others:
                    if t != q:
                        b.transfer(q, t, part(s, i), part(s, i), step=2, channel=2)
            if (s + 1) % group == 0 or s + 1 == slices:
                first = s // group * group
                for src, dst, run in fan_out(first, s + 1 - first):
                    b.transfer(src, dst, run, run, step=len(hosts))
        return b.build("hierarchical", meta)

    used = [0] * p  # slot units taken in the current group of slices, per rank

    def gather(src: int, dst: int, ref: Chunk, s: int, step: int, channel: int = 0) -> None:
        """``src``'s partial sum ``ref`` added into ``dst``'s, received into a slot of its own first."""
        slot = Chunk("s", (s // group % SLOT_SLICES) * slot_units + used[dst], ref.count)
        used[dst] += ref.count
        b.transfer(src, dst, ref, slot, step=step, channel=channel)
        b.reduce(dst, slot, ref, step=step)

    last = len(hosts)
    for s in range(slices):
        if s % group == 0:
            # every host's sums of the group's pieces onto their rails' GPUs
            used[:] = [0] * p
            for dst, src, run in fan_out(s, min(group, slices - s)):
                gather(src, dst, run, s, 0)
        # the root's host's sum of the root's piece, in parts
        for i, q in enumerate(others):
            for t in others:
                if t != q:
                    gather(t, q, part(s, i), s, 0, channel=2)
        for c in range(k):
            chain = rails[c]
            # the chain (or trees), from the far hosts to the root's
            for ref, parent, order in shares(s, c):
                for h in reversed(order):
                    gather(chain[h], chain[parent[h]], ref, s, last - h, channel=1)
            if c != c0:
                b.transfer(chain[0], root, piece(s, c), piece(s, c), reduce=True, step=last)
        for i, q in enumerate(others):
            b.transfer(q, root, part(s, i), part(s, i), reduce=True, step=last, channel=2)
    return b.build("hierarchical", meta)
