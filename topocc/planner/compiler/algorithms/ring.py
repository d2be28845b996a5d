"""Topology-aware rings: the bandwidth-optimal baseline for large messages.

All-reduce is a ring reduce-scatter followed by a ring all-gather (Patarasuk &
Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009, section 3); broadcast and reduce are pipelined chains along the ring
from or to the root.  The rings come from :func:`topocc.planner.compiler.algorithms._order.find_rings`:
several link-disjoint rings where the fabric has them (NCCL's channels), the
data split evenly between them, and each chunk split into pieces so that
consecutive steps overlap.
"""

from __future__ import annotations

import itertools

from topocc.planner.compiler.algorithms._order import (
    find_rings,
    pieces,
    ring_all_gather,
    ring_reduce_scatter,
    root_rank,
    single_rank,
    split,
)
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import hops, relays
from topocc.runtime.collective import ALLREDUCE, Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["ring", "ring_link_floor"]

#: Chunk budget for the all-to-all shaped phases (ranks x channels x pieces), to keep op counts bounded.
_MAX_CHUNKS = 1024
#: Pipelined piece size of a ring's chunk: with several channels a chunk is small, and even such a chunk
#: pipelines its steps better in two pieces than whole.
_PIECE_BYTES = 512 << 10
#: Most pieces a chain (broadcast, reduce) splits each channel's share into.
_MAX_CHAIN_PIECES = 64


def ring(net: Network, collective: str, options: Options) -> Schedule:
    """Ring schedule for ``collective`` over the best rings of ``topology``.

    Supports allreduce, reducescatter, allgather, broadcast and reduce.  A hop
    between ranks without a GPU-free route is relayed through other GPUs.
    """
    topology = net.topology
    kind = describe(collective)
    collective = kind.name
    if kind.exchanges:
        raise NotApplicableError("ring does not implement alltoall (use direct)")
    p = topology.size
    meta = options.as_dict()
    if p == 1:
        return single_rank(collective, 1, 1, "ring", meta, options.root if kind.rooted else None)
    rings = _rings(net, options)
    relay = relays(net)  # hops between ranks without a GPU-free route go through other GPUs
    c = len(rings)
    meta["channels"] = c
    if p <= 64:
        meta["rings"] = rings

    if not kind.rooted:  # all-reduce, reduce-scatter, all-gather
        q = pieces(options.pipeline, options.size_bytes / (c * p), max(1, _MAX_CHUNKS // (c * p)), _PIECE_BYTES)
        meta["pipeline"] = q
        if kind is ALLREDUCE:
            b = ScheduleBuilder(collective, p, c * p * q, c * p * q, relay=relay)
            for r in range(p):
                b.copy(r, Chunk("i", 0, c * p * q), Chunk("o", 0, c * p * q))
            for ch, rg in enumerate(rings):
                # segment s of channel ch: chunks (ch*p + s)*q ... + q; ring position i ends owning segment i
                parts = [[Chunk("o", (ch * p + s) * q + j) for j in range(q)] for s in range(p)]
                step = ring_reduce_scatter(b, rg, parts, channel=ch)
                ring_all_gather(b, rg, parts, step=step, channel=ch)
            return b.build("ring", meta)
        k = c * q  # chunks per rank block; channel ch carries chunks ch*q ... ch*q + q of every block
        if kind.scatters:
            b = ScheduleBuilder(collective, p, p * k, k, scratch_chunks=p * k, relay=relay)
            for r in range(p):
                b.copy(r, Chunk("i", 0, p * k), Chunk("s", 0, p * k))
            for ch, rg in enumerate(rings):
                parts = [[Chunk("s", rg[i] * k + ch * q + j) for j in range(q)] for i in range(p)]
                ring_reduce_scatter(b, rg, parts, channel=ch)
            for r in range(p):
                b.copy(r, Chunk("s", r * k, k), Chunk("o", 0, k), step=p - 1)
            return b.build("ring", meta)
        b = ScheduleBuilder(collective, p, k, p * k, relay=relay)
        for r in range(p):
            b.copy(r, Chunk("i", 0, k), Chunk("o", r * k, k))
        for ch, rg in enumerate(rings):
            parts = [[Chunk("o", rg[i] * k + ch * q + j) for j in range(q)] for i in range(p)]
            ring_all_gather(b, rg, parts, channel=ch)
        return b.build("ring", meta)

    # broadcast / reduce: a pipelined chain along each ring, from (to) the root
    root = root_rank(options, p)
    q = pieces(options.pipeline, options.size_bytes / c, _MAX_CHAIN_PIECES)
    meta["pipeline"] = q
    n = c * q
    b = ScheduleBuilder(collective, p, n, n, root=root, relay=relay)
    for r in range(p):
        if kind.to_root or r == root:
            b.copy(r, Chunk("i", 0, n), Chunk("o", 0, n))
    for ch, rg in enumerate(rings):
        chain = _chain(rg, root, kind)
        for piece in split(ch * q, q, q):
            for pos in range(p - 1):
                src = Chunk("i", piece.index, piece.count) if pos == 0 else piece
                b.transfer(chain[pos], chain[pos + 1], src, piece, reduce=kind.reduces, step=pos,
                           channel=ch)
    return b.build("ring", meta)


def _rings(net: Network, options: Options) -> list[list[int]]:
    """The rings of ``options.channels`` channels (memoised per topology by :func:`find_rings`)."""
    if options.channels is not None and options.channels < 1:
        raise NotApplicableError(f"ring needs at least one channel, got {options.channels}")
    return find_rings(net, options.channels)


def _chain(ring: list[int], root: int, kind: Collective) -> list[int]:
    """The ring as a chain from the root (broadcast) or ending at it (reduce)."""
    at = ring.index(root)
    return ring[at:] + ring[:at] if kind.from_root else ring[at + 1:] + ring[:at + 1]


def ring_link_floor(net: Network, collective: str, options: Options) -> float:
    """A lower bound of :func:`topocc.planner.compiler.evaluate.link_time` of the ring schedule, from its rings alone.

    Over each of its ``c`` rings a rank sends its successor ``(p-1)/p`` of the
    ring's ``N / c`` bytes in a reduce-scatter or an all-gather (twice in an
    all-reduce), and each hop of a broadcast or reduce chain carries ``N / c``;
    a relayed hop crosses every hop of :func:`topocc.planner.routing.relay.hops`.  Only the
    links every cheapest path of a hop crosses (:meth:`Topology.common_links`)
    are counted, so the bound holds under any routing and channel assignment.
    The rings are memoised for the build; the schedule (ranks x channels x
    pieces messages per step) is what ``auto`` saves where this already loses.
    """
    topology = net.topology
    kind = describe(collective)
    if kind.exchanges:
        raise NotApplicableError("ring does not implement alltoall (use direct)")
    p = topology.size
    if p == 1:
        return 0.0
    rings = _rings(net, options)
    share = options.size_bytes / len(rings)
    edges: list[tuple[int, int]] = []
    if not kind.rooted:
        share *= (p - 1) / p * kind.passes
        edges = [(rg[i], rg[(i + 1) % p]) for rg in rings for i in range(p)]
    else:
        root = root_rank(options, p)
        for rg in rings:
            edges += list(itertools.pairwise(_chain(rg, root, kind)))
    return net.common_link_time((a, b, share) for src, dst in edges for a, b in hops(net, src, dst))
