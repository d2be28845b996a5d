"""All-pairs exchange in one logical step: the latency-optimal baseline for small messages.

Every rank talks to every other rank directly (MSCCL's "all-pairs" algorithms,
e.g. ``ndv4/ap2ll.xml``): all-reduce is a direct reduce-scatter (rank ``j``
collects and reduces block ``j`` from everyone) followed by a direct all-gather.
Each rank walks its peers starting after itself (``r+1, r+2, ...``) so that no
rank is everyone's first destination at once.  A pair without a GPU-free route
exchanges through other GPUs (:mod:`topocc.planner.routing.relay`).
"""

from __future__ import annotations

from topocc.planner.compiler.algorithms._order import pieces, root_rank, single_rank, split
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import relays
from topocc.runtime.collective import ALLREDUCE
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["direct"]

_MAX_CHUNKS = 4096


def direct(net: Network, collective: str, options: Options) -> Schedule:
    """Direct schedule for any of the six collectives; pairs without a route are relayed."""
    topology = net.topology
    kind = describe(collective)
    collective = kind.name
    p = topology.size
    meta = options.as_dict()
    rooted = kind.rooted
    root = root_rank(options, p) if rooted else None
    if p == 1:
        return single_rank(collective, 1, 1, "direct", meta, root)

    def peers(r: int) -> list[int]:
        return [(r + off) % p for off in range(1, p)]

    relay = relays(net)

    if rooted:
        q = max(1, options.pipeline or 1)  # one hop: pieces only help if the caller asks
        meta["pipeline"] = q
        b = ScheduleBuilder(collective, p, q, q, root=root, relay=relay)
        b.copy(options.root, Chunk("i", 0, q), Chunk("o", 0, q))
        for r in peers(options.root):
            for piece in split(0, q, q):
                src = Chunk("i", piece.index, piece.count)
                if kind.from_root:
                    b.transfer(options.root, r, src, piece)
                else:
                    b.transfer(r, options.root, src, piece, reduce=True)
        return b.build("direct", meta)

    if kind is ALLREDUCE:
        # pieces let the all-gather of a block's first piece overlap the reduction of its rest
        k = pieces(options.pipeline, options.size_bytes / p, max(1, _MAX_CHUNKS // (p * p)))
        meta["pipeline"] = k
        b = ScheduleBuilder(collective, p, p * k, p * k, relay=relay)
        for r in range(p):
            b.copy(r, Chunk("i", 0, p * k), Chunk("o", 0, p * k))
        for r in range(p):
            for j in peers(r):
                for piece in split(j * k, k, k):
                    b.transfer(r, j, Chunk("i", piece.index, 1), piece, reduce=True, step=0)
        for r in range(p):
            for j in peers(r):
                for piece in split(r * k, k, k):
                    b.transfer(r, j, piece, piece, step=1)
        return b.build("direct", meta)
    k = max(1, options.pipeline or 1)
    meta["pipeline"] = k

    def send_block(r: int, j: int, src: int, dst: int, reduce: bool = False) -> None:
        """Input chunks ``src ...`` of rank r to output chunks ``dst ...`` of rank j, piece by piece."""
        for off in range(k):
            b.transfer(r, j, Chunk("i", src + off), Chunk("o", dst + off), reduce=reduce)

    if kind.scatters:
        b = ScheduleBuilder(collective, p, p * k, k, relay=relay)
        for r in range(p):
            b.copy(r, Chunk("i", r * k, k), Chunk("o", 0, k))
        for r in range(p):
            for j in peers(r):
                send_block(r, j, j * k, 0, reduce=True)
        return b.build("direct", meta)
    if kind.gathers:
        b = ScheduleBuilder(collective, p, k, p * k, relay=relay)
        for r in range(p):
            b.copy(r, Chunk("i", 0, k), Chunk("o", r * k, k))
        for r in range(p):
            for j in peers(r):
                send_block(r, j, 0, r * k)
        return b.build("direct", meta)
    # alltoall: output block s on rank r is input block r of rank s
    b = ScheduleBuilder(collective, p, p * k, p * k, relay=relay)
    for r in range(p):
        b.copy(r, Chunk("i", r * k, k), Chunk("o", r * k, k))
    for r in range(p):
        for j in peers(r):
            send_block(r, j, j * k, r * k)
    return b.build("direct", meta)
