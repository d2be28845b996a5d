"""Recursive halving and doubling (Rabenseifner's algorithm): log p steps each way.

Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005, section 4.4: reduce-scatter by recursive
vector halving, then all-gather by recursive doubling.  With ``p`` not a power
of two, the standard fold (same paper, section 4.4, "non-power-of-two"): the
first ``2r`` ranks of the order pair up, the even one of each pair hands its
data to the odd one and sits out, and gets its result back at the end.

Ranks are taken in ring order (hosts contiguous).  All-reduce pairs nearest
first, so the largest exchange (half the buffer) stays inside a host; reduce-
scatter and all-gather pair farthest first (all-gather: nearest first, being
the reverse), which keeps each rank's final block in one contiguous range.
Partners without a GPU-free route exchange through other GPUs
(:mod:`topocc.planner.routing.relay`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from topocc.planner.compiler.algorithms._order import chunk_runs, pieces, ring_order, single_rank, split
from topocc.planner.compiler.builder import Relay, ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import builds_by_class, fitting_ranks
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import relays
from topocc.runtime.collective import ALLREDUCE, Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["halving_doubling"]

_MAX_CHUNKS = 2048


def _fold(order: Sequence[int]) -> tuple[list[int], dict[int, int]]:
    """(active ranks, power-of-two many, in order; extra rank -> the active rank that stands in for it)."""
    p = len(order)
    p2 = 1 << (p.bit_length() - 1)
    r = p - p2
    extras = {order[2 * i]: order[2 * i + 1] for i in range(r)}
    active = [order[2 * i + 1] for i in range(r)] + list(order[2 * r:])
    return active, extras


def halving_doubling(net: Network, collective: str, options: Options) -> Schedule:
    """Rabenseifner schedule for allreduce, reducescatter or allgather, any rank count."""
    topology = net.topology
    kind = describe(collective)
    collective = kind.name
    if kind.rooted or kind.exchanges:
        raise NotApplicableError(
            f"halving-doubling does not implement {collective} (it builds allreduce, reducescatter, allgather)"
        )
    p = topology.size
    meta = options.as_dict()
    if p == 1:
        return single_rank(collective, 1, 1, "halving-doubling", meta)
    active, extras = _fold(ring_order(net))
    meta["folded"] = len(extras)
    relay = relays(net)  # partners without a GPU-free route exchange through other GPUs
    focus = _class_ranks(net, active, extras)
    if focus is not None:
        form = _build(kind, active, extras, p, options, meta, relay, focus)
        if form is not None:
            return form
    built = _build(kind, active, extras, p, options, meta, relay, None)
    assert built is not None  # only a focused build can fail to fit one class
    return built


def _class_ranks(net: Network, active: list[int], extras: dict[int, int]) -> frozenset[int] | None:
    """The few ranks whose programs give the schedule's one class over the binary grid of the ranks
    (:func:`~topocc.planner.compiler.symmetrize.fitting_ranks`), where it is built so
    (:func:`~topocc.planner.compiler.symmetrize.builds_by_class`): the ranks in their own order (a partner is
    the rank with one bit flipped), none folded, and every partner routed (no relay through other ranks)."""
    p = len(active)
    if extras or not builds_by_class(net) or active != list(range(p)):
        return None
    bits = [1 << k for k in range(p.bit_length() - 1)]
    if not all(net.has_route(v, v ^ d) for d in bits for v in range(p)):
        return None
    return fitting_ranks((2,) * len(bits))


def _build(kind: Collective, active: list[int], extras: dict[int, int], p: int, options: Options,
           meta: dict[str, object], relay: Relay, focus: frozenset[int] | None) -> Schedule | None:
    """The schedule: every rank's program, or with ``focus`` those ranks' fitted as one class (None where they
    are not one)."""
    if kind is ALLREDUCE:
        b = _allreduce(active, extras, p, options, meta, relay, focus)
    else:
        b = _gather_scatter(kind, active, extras, p, meta, relay, focus)
    if focus is None:
        return b.build("halving-doubling", meta)
    return b.build_class("halving-doubling", (2,) * (p.bit_length() - 1), meta)


def _members(n: int, d: int, focus: frozenset[int] | None) -> Iterable[int]:
    """The active indices whose exchange with their partner ``v ^ d`` is written: all, or those of the focus
    ranks and their partners (the ranks are their own indices where a focus is given)."""
    return range(n) if focus is None else sorted({x for f in focus for x in (f, f ^ d)})


def _allreduce(active: list[int], extras: dict[int, int], p: int, options: Options,
               meta: dict[str, object], relay: Relay, focus: frozenset[int] | None) -> ScheduleBuilder:
    n = len(active)
    q = pieces(options.pipeline, options.size_bytes / n, max(1, _MAX_CHUNKS // n))
    meta["pipeline"] = q
    total = n * q  # block v of the vector: chunks v*q ... v*q + q
    b = ScheduleBuilder("allreduce", p, total, total, relay=relay, focus=focus)
    whole = split(0, total, q)
    for r in active:
        b.copy(r, Chunk("i", 0, total), Chunk("o", 0, total))
    for x, y in extras.items():
        for piece in whole:
            b.transfer(x, y, Chunk("i", piece.index, piece.count), piece, reduce=True, step=0)
    step = 1
    ranges = [(0, n)] * n  # blocks [lo, hi) each active index is responsible for
    history: list[list[tuple[int, int]]] = []
    d = 1
    while d < n:  # recursive halving, nearest partner first
        history.append(list(ranges))
        new = list(ranges)
        for v in range(n):
            lo, hi = ranges[v]
            mid = (lo + hi) // 2
            new[v] = (lo, mid) if not v & d else (mid, hi)
        for v in _members(n, d, focus):
            u = v ^ d
            lo, hi = new[u]  # what u keeps, v sends
            for piece in split(lo * q, (hi - lo) * q, q):
                b.transfer(active[v], active[u], piece, piece, reduce=True, step=step)
        ranges = new
        d *= 2
        step += 1
    for before in reversed(history):  # recursive doubling: undo the halving steps
        d //= 2
        for v in _members(n, d, focus):
            lo, hi = ranges[v]
            for piece in split(lo * q, (hi - lo) * q, q):
                b.transfer(active[v], active[v ^ d], piece, piece, step=step)
        ranges = before
        step += 1
    for x, y in extras.items():
        for piece in whole:
            b.transfer(y, x, piece, piece, step=step)
    return b


def _gather_scatter(kind: Collective, active: list[int], extras: dict[int, int], p: int,
                    meta: dict[str, object], relay: Relay, focus: frozenset[int] | None) -> ScheduleBuilder:
    """Reduce-scatter (halving, farthest first) or all-gather (doubling, nearest first), one chunk per rank."""
    n = len(active)
    meta["pipeline"] = 1
    stand_in = {y: x for x, y in extras.items()}
    # the rank blocks each active index stands for: its own and its folded partner's
    blocks = [[r] + ([stand_in[r]] if r in stand_in else []) for r in active]

    def runs(buffer: str, lo: int, hi: int) -> list[Chunk]:
        return chunk_runs(buffer, [blk for v in range(lo, hi) for blk in blocks[v]])

    if kind.scatters:
        b = ScheduleBuilder(kind.name, p, p, 1, scratch_chunks=p, relay=relay, focus=focus)
        for r in active:
            b.copy(r, Chunk("i", 0, p), Chunk("s", 0, p))
        for x, y in extras.items():
            b.transfer(x, y, Chunk("i", 0, p), Chunk("s", 0, p), reduce=True, step=0)
        ranges = [(0, n)] * n
        d, step = n // 2, 1
        while d >= 1:
            new = [((lo + hi) // 2, hi) if v & d else (lo, (lo + hi) // 2) for v, (lo, hi) in enumerate(ranges)]
            for v in _members(n, d, focus):
                for ref in runs("s", *new[v ^ d]):
                    b.transfer(active[v], active[v ^ d], ref, ref, reduce=True, step=step)
            ranges = new
            d //= 2
            step += 1
        for r in active:
            b.copy(r, Chunk("s", r), Chunk("o", 0), step=step)
        for x, y in extras.items():
            b.transfer(y, x, Chunk("s", x), Chunk("o", 0), step=step)
        return b

    b = ScheduleBuilder(kind.name, p, 1, p, relay=relay, focus=focus)
    for r in range(p):
        b.copy(r, Chunk("i", 0), Chunk("o", r))
    for x, y in extras.items():
        b.transfer(x, y, Chunk("i", 0), Chunk("o", x), step=0)
    ranges = [(v, v + 1) for v in range(n)]
    d, step = 1, 1
    while d < n:
        for v in _members(n, d, focus):
            for ref in runs("o", *ranges[v]):
                b.transfer(active[v], active[v ^ d], ref, ref, step=step)
        ranges = [(min(lo, ranges[v ^ d][0]), max(hi, ranges[v ^ d][1])) for v, (lo, hi) in enumerate(ranges)]
        d *= 2
        step += 1
    for x, y in extras.items():
        for ref in chunk_runs("o", [blk for blk in range(p) if blk != x]):
            b.transfer(y, x, ref, ref, step=step)
    return b
