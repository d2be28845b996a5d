"""The native backend's algorithms as schedules: what gloo runs for each collective, for the simulator to time.

A plan is worth running only where it beats what ``torch.distributed`` would run
without it (:mod:`topocc.planner.compiler.thresholds`).  On CPU tensors that is
gloo, whose collectives are fixed algorithms over ranks in rank order, blind to
the topology (gloo ``allreduce.cc``, ``allgather.cc``, ``broadcast.cc``,
``reduce.cc``, ``alltoall.cc``):

* all-reduce: one ring in rank order, a reduce-scatter then an all-gather
  (Patarasuk & Yuan 2009), the data in pipelined pieces as the planner's ring
  cuts it;
* reduce-scatter: PyTorch's gloo backend has none of its own; it all-reduces
  the whole input and keeps the rank's block (its reduce-scatter takes as long
  as its all-reduce of the same buffer, README "With torchrun");
* all-gather: one ring in rank order;
* broadcast: a binomial tree from the root, the whole message per hop;
* reduce: a ring reduce-scatter in rank order, then each rank's reduced block
  sent to the root;
* all-to-all: every pair directly (the ``direct`` algorithm).

The schedules are built on the group's network with the planner's builder, so
they are timed by the same model as the plans they are compared with (a
calibrated topology's host costs included).
"""

from __future__ import annotations

from topocc.planner.compiler.algorithms._order import (
    PIECE_BYTES,
    pieces,
    ring_all_gather,
    ring_reduce_scatter,
    single_rank,
)
from topocc.planner.compiler.algorithms.direct import direct
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import UsageError
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import relays
from topocc.runtime.collective import Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["NATIVE_ALGORITHM", "native_schedule"]

#: The algorithm name the native schedules record (they are never written to a plan).
NATIVE_ALGORITHM = "gloo"
#: Most pipelined pieces per rank block of a ring (keeps op counts bounded at large sizes).
_MAX_PIECES = 64


def native_schedule(net: Network, collective: str, size_bytes: int, root: int = 0) -> Schedule:
    """What gloo runs for ``collective`` of ``size_bytes`` bytes (the larger buffer) on ``net``'s ranks.

    ``root`` (a rank of the group) for broadcast and reduce.
    """
    c = describe(collective)
    p = net.topology.size
    if p == 1:
        return single_rank(c.name, 1, 1, NATIVE_ALGORITHM, {}, root if c.rooted else None)
    if c.exchanges:
        return direct(net, c.name, Options(size_bytes=size_bytes))
    if c.from_root:
        return _binomial_broadcast(net, root)
    block = size_bytes / p  # a rank block: what one ring step moves
    q = pieces(None, block, _MAX_PIECES, PIECE_BYTES)
    if c.reduces:
        return _ring_reduction(net, c, q, root)
    if c.gathers:
        return _ring_allgather(net, q)
    raise UsageError(f"no native algorithm is modelled for {c.name}")


def _ring_reduction(net: Network, c: Collective, q: int, root: int) -> Schedule:
    """A rank-order ring reduce-scatter of ``p`` blocks of ``q`` pieces, then: the all-gather (all-reduce and
    reduce-scatter, which keeps its own block of the all-reduced buffer), or each block sent to the root."""
    p = net.topology.size
    ring = list(range(p))
    n = p * q
    if c.scatters:
        b = ScheduleBuilder(c.name, p, n, q, scratch_chunks=n, relay=relays(net))
        work = "s"
    else:
        b = ScheduleBuilder(c.name, p, n, n, root=root if c.to_root else None, relay=relays(net))
        work = "o"
    for r in range(p):
        b.copy(r, Chunk("i", 0, n), Chunk(work, 0, n))
    parts = [[Chunk(work, s * q + j) for j in range(q)] for s in range(p)]
    step = ring_reduce_scatter(b, ring, parts)
    if c.to_root:
        for r in range(p):
            if r != root:
                b.transfer(r, root, Chunk(work, r * q, q), Chunk(work, r * q, q), step=step)
        return b.build(NATIVE_ALGORITHM, {"pipeline": q})
    ring_all_gather(b, ring, parts, step=step)
    if c.scatters:
        for r in range(p):
            b.copy(r, Chunk("s", r * q, q), Chunk("o", 0, q), step=2 * step)
    return b.build(NATIVE_ALGORITHM, {"pipeline": q})


def _ring_allgather(net: Network, q: int) -> Schedule:
    """A rank-order ring all-gather, each rank's block in ``q`` pieces."""
    p = net.topology.size
    b = ScheduleBuilder("allgather", p, q, p * q, relay=relays(net))
    for r in range(p):
        b.copy(r, Chunk("i", 0, q), Chunk("o", r * q, q))
    parts = [[Chunk("o", s * q + j) for j in range(q)] for s in range(p)]
    ring_all_gather(b, list(range(p)), parts)
    return b.build(NATIVE_ALGORITHM, {"pipeline": q})


def _binomial_broadcast(net: Network, root: int) -> Schedule:
    """A binomial tree from ``root``: in round ``k`` every rank that has the data (``v < 2^k``, ranks
    renumbered from the root) sends it whole to ``v + 2^k``."""
    p = net.topology.size
    b = ScheduleBuilder("broadcast", p, 1, 1, root=root, relay=relays(net))
    b.copy(root, Chunk("i", 0), Chunk("o", 0))
    span, step = 1, 0
    while span < p:
        for v in range(min(span, p - span)):
            b.transfer((v + root) % p, (v + span + root) % p, Chunk("o", 0), Chunk("o", 0), step=step)
        span, step = 2 * span, step + 1
    return b.build(NATIVE_ALGORITHM, {})
