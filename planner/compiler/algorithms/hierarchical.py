"""BlueConnect, pipelined: reduce-scatter level by level up the hierarchy, all-gather back down.

Cho et al., "BlueConnect: Decomposing all-reduce for deep learning on
heterogeneous network hierarchy", SysML 2019, section 3: factor ``p = p1 x p2 x
p3`` along the hierarchy (GPUs in a host, hosts in a rack, racks), then run a
reduce-scatter among the ranks that differ only in the level-1 coordinate,
then among those that differ only in the level-2 coordinate on the part each
now owns, and so on; the all-gather retraces the stages in reverse.  Each level
runs on its own fabric, so each level's links carry only that level's share of
the data.

Run one stage after the other and the fast intra-host fabric idles while the
NICs work, and the other way round.  So the buffer is cut into *slices*, each
a complete BlueConnect all-reduce of its own (chunk ``j * p + v`` is virtual
block ``v`` of slice ``j``): while slice ``j`` crosses the hosts, slice
``j + 1`` is reduced inside them (section 4's pipelining, applied across the
stages).  Reduce-scatter and all-gather are sliced the same way, every rank's
block cut into slices that are small at both ends of the pipeline (its fill
and drain), and a reduce-scatter's first ring phase is flow-controlled so that
it works on its oldest slices first.  A reduce-scatter or all-gather keeps
every rank's block whole in its buffer, so a part of k virtual blocks is k
messages, and the message budget leaves few slices on hundreds of ranks.  An
all-gather's lower levels pass each block on as it arrives, so even one slice
keeps every level busy; a reduce-scatter's lower levels reduce first the
blocks that the levels above pass on first, in *waves*, to the same effect.
Where not even one slice of whole blocks fits (a thousand ranks), a
reduce-scatter runs as an all-reduce's first half in virtual-block order
instead, and each rank then sends its sums to the ranks they belong to.  Even
a 1 MiB collective gets a few (equal) slices: unsliced, its levels would run
one after the other.  Every
phase (a level's reduce-scatter or all-gather) has channels of its own, so
messages of different phases never queue behind each other on one connection.

A level runs as a ring, as recursive halving / doubling (Rabenseifner;
``log2 n`` steps instead of ``n - 1``) when its size is a power of two, or
direct (one step: every member sends every other its part at once, as on a
switch every port can; one path latency), whichever a link-load estimate
times fastest, ties to the fewer steps: that keeps the latency of a 32-member
cross-leaf level at 5 hops, not 31, and of a DGX A100 host or a rail at one.

An all-reduce may choose who owns what, and BlueConnect's equal parts load a
host behind slower NICs as much as the others: on 8 x 200 Gbit/s DGX hosts
beside hosts with 2 x 100 Gbit/s, these would carry 1.75 times the data each
way (eight hosts).  So where the last level runs direct, its parts go to the
members so as to even out the time their hosts' NICs take (:func:`ownership`),
and the slow hosts own less or nothing (hetero-nics-8x8 at 256 MiB: 55.7% of
the bound with equal parts, 97.7% with these).  Equal NICs keep equal parts.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from topocc.planner.compiler.options import Options
from topocc.planner.compiler.algorithms._order import PIECE_BYTES, Send, chunk_runs, find_cycle, host_size, ring_steps, single_rank
from topocc.planner.compiler.algorithms.hierarchical_rooted import rooted_hierarchical
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.analysis.collectives import canonical_collective
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.relay import path_latency, path_shares, relays
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.routing.network import Memo, Network
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["Stage", "hierarchical", "stage_methods", "stages"]

#: At most this many chunks (ranks x slices), but never fewer than :data:`_MIN_SLICES` per rank's block:
#: the builder and the simulator cost grows with the messages, which more slices multiply, and this
#: keeps a 1024-rank compile near half a minute (8 slices).  (The proof holds runs of chunks, so its
#: cost follows the operations too: a 4096-rank all-reduce gets 6 slices from the message budget, 89%
#: of the bound, where 2 slices of this budget alone gave 71%.)
_MAX_CHUNKS = 8192
#: From this size on, twice the chunks: such a collective runs for milliseconds, every step of
#: training, so a compile twice as long buys the last few percent of pipeline fill and drain.
_LARGE_BYTES = 512 << 20
#: Target bytes per slice (:data:`~topocc.planner.compiler.algorithms._order.PIECE_BYTES`): the first slice's
#: intra-host reduce-scatter is the pipeline's fill, and the last one's all-gather its drain.
_SLICE_BYTES = PIECE_BYTES
#: Slices of a reduce-scatter's or all-reduce's first phase a rank may have in flight, where the first level
#: is not direct (all-reduce: a ring, or halving-doubling on large slices; see the flow control in
#: :func:`hierarchical`; ``options.hierarchical.window``, 0: no limit).
_WINDOW = 1
#: An all-reduce's first phase is flow-controlled behind halving-doubling only on slices this large.
_WINDOW_BYTES = 4 << 20
#: Largest slice of a reduce-scatter or all-gather, relative to its first (see :func:`_slice_shape`).
_PLATEAU = 8
#: An all-reduce that the message budget leaves this few slices shapes them by doubling (1, 2, 4, 8, 8, 4,
#: 2, 1; see :data:`_DOUBLING`), where its smallest is still :data:`_WINDOW_BYTES`: equal slices leave
#: the network idle while the first slice's intra-host reduce-scatter fills the pipeline and the last one's
#: all-gather drains it (a 1024-GPU fat-tree at 256 MiB: 8 slices, the NICs 13% busy over the first and
#: last 4% of the time; 92.9% of the bound equal, 96.7% shaped).  Not where faster hosts own more of the
#: last level (with 8 slices on two-speed NICs, hetero-nics-4x8 at 256 MiB: 87.4% equal, 78.6% shaped).
_FEW_SLICES = 16
#: With few shaped slices a rank starts a slice's middle phases (those between the first level's
#: reduce-scatter and its all-gather) only once it has finished the middle phases of the slice this many
#: before it.  Otherwise the slices share the NICs fairly, so the large ones end last and their first level's
#: all-gather drains the pipeline after all (the 1024-GPU fat-tree at 256 MiB: shaped slices 90.5% of the
#: bound without it, 96.7% with 2, 70% with 1, where each slice waits out the dependent steps of the last).
_MIDDLE_AHEAD = 2
#: Sizes of the first slices of a reduce-scatter or all-gather, relative to the first (then the plateau).
_RAMP = (1, 2, 3, 4, 6, 8)
#: The ramp of an all-reduce left few slices (see :data:`_FEW_SLICES`): doubling.  The slower :data:`_RAMP`
#: loses there (the 1024-GPU fat-tree at 256 MiB, 10 slices 1, 2, 3, 4, 6, 8, 8, 4, 2, 1: 95.7% of the bound;
#: 8 doubling: 96.7%).
_DOUBLING = (1, 2, 4, 8)
#: Reduce-scatter and all-gather slices average at least this much of a rank's block.
_MIN_SLICE_BYTES = 64 << 10
#: At least this many slices where there are two or more levels (within the message budget): below
#: :data:`_SLICE_BYTES` per slice, a 1 MiB collective would otherwise run its stages one after the
#: other, the fast intra-host fabric idle while the NICs work (emu-racks all-gather: 1.64x the bound).
_MIN_SLICES = 8


@dataclass(frozen=True, slots=True)
class Stage:
    """One level of the decomposition: its name and its groups, each a ring of ranks.

    A rank's position in its group's ring is its coordinate at this level.
    """

    level: str
    groups: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return len(self.groups[0])


def stages(net: Network) -> list[Stage]:
    """The non-trivial levels (host, rack, cluster), innermost first.

    Where racks differ in host count (a last leaf only partly filled, as real
    clusters grow), or a host spans racks, the racks are not a level: the
    hosts form one level above the host level, as if on one switch (ten hosts
    on leaves of 4, 4 and 2, 2:1 to the spines, at 256 MiB: reduce-scatter
    95.5% of the bound so, 76.8% with the leaves cut into racks of two hosts
    each; all-reduce 91.8% and 92.7%).  Raises :class:`NotApplicableError`
    when hosts differ in size.
    """
    topology = net.topology
    hosts = list(topology.hosts.values())
    host_size(net, "hierarchical")
    rack_of: dict[int, str] = {}
    for name, ranks in topology.racks.items():
        for r in ranks:
            rack_of[r] = name
    racks: dict[str, list[tuple[int, ...]]] = {}
    for h in hosts:
        racks.setdefault(rack_of[h[0]], []).append(h)
    if len({len(v) for v in racks.values()}) != 1 or any(len({rack_of[r] for r in h}) != 1 for h in hosts):
        racks = {"all": hosts}

    out: list[Stage] = []
    coord: dict[int, tuple[int, ...]] = {r: () for r in range(topology.size)}

    def add(level: str, groups: list[list[int]]) -> None:
        if len(groups[0]) == 1:
            return
        rings = tuple(tuple(find_cycle(net, g)) for g in groups)
        for rg in rings:
            for i, r in enumerate(rg):
                coord[r] = (*coord[r], i)
        out.append(Stage(level, rings))

    add("host", [list(h) for h in hosts])
    # level 2: within a rack, the ranks with the same host-level coordinate, one per host
    rack_groups: list[list[int]] = []
    for rack_hosts in racks.values():
        by: dict[tuple[int, ...], list[int]] = {}
        for h in rack_hosts:
            for r in h:
                by.setdefault(coord[r], []).append(r)
        rack_groups.extend(by.values())
    add("rack", rack_groups)
    # level 3: across racks, the ranks with the same coordinates inside their rack
    by3: dict[tuple[int, ...], list[int]] = {}
    for rack_hosts in racks.values():
        for h in rack_hosts:
            for r in h:
                by3.setdefault(coord[r], []).append(r)
    add("cluster", list(by3.values()))
    return out


def _split_last(net: Network, levels: list[Stage], options: Options, large: bool = True) -> list[Stage]:
    """``levels`` with the last one split in two (:func:`_split`), both direct, where :func:`_estimate` times
    them faster than the last level's step latencies alone: on small messages (under :data:`_MIN_SLICE_BYTES`
    a rank), where the last level is too large to run direct, or the cap on contending messages keeps it
    from running direct, and its halving-doubling or ring steps each wait out a path latency.

    fattree-1024, its 32 racks as 4 x 8, direct twice, as many operations: at 1 MiB all-gather 2.85x ->
    1.92x of the bound, reduce-scatter 3.37x -> 2.31x, all-reduce 3.64x -> 2.27x; at 2 MiB all-gather
    1.77x -> 1.47x, reduce-scatter 2.29x -> 1.84x.  The split must beat the last level's step latencies
    alone, not just its estimate, which it beat where bandwidth rules too (fattree-1024 at 16 MiB:
    all-gather 89.0% of the bound split, 92.1% not).  An all-reduce that builds and times two layouts (see
    :func:`hierarchical`) splits only a last level small enough to run direct (``large`` false): a split of
    a larger one, many flows contending at once, made those simulations the whole compile (64 hosts of 2
    GPUs at 1 MiB, 16 x 4: 5.7 s -> 173 s, for 49.5% -> 71.4% of the bound).
    """
    topology = net.topology
    last = levels[-1] if levels else None
    if (last is None or options.size_bytes / topology.size >= _MIN_SLICE_BYTES or options.pipeline is not None
            or options.hierarchical.stage_method is not None):
        return levels
    method = None  # the last level's, timed only once some split fits where it is too large for direct
    if _direct_fits(last):
        # small enough to run direct, unless the sharing cap rules that out: ten hosts on leaves of four,
        # 48 messages on an uplink, whose ring of ten waits out nine path latencies (80 GPUs at 1 MiB:
        # all-gather 3.39x -> 1.36x of the bound split 2 x 5, reduce-scatter 3.72x -> 1.55x, all-reduce
        # 4.18x -> 1.53x)
        method = stage_methods(net, levels, options.size_bytes, 1)[-1]
        if method == "direct":
            return levels
    elif not large:
        return levels
    n, si = last.size, len(levels) - 1
    splits = [(a, *_split(last, a)) for a in range(2, n // 2 + 1) if not n % a]
    splits = [(a, inner, outer) for a, inner, outer in splits if _direct_fits(inner) and _direct_fits(outer)]
    if not splits:  # before timing the levels (fattree-16384, a last level of 64 groups of 256: 40 s)
        return levels
    part = options.size_bytes / math.prod(s.size for s in levels)  # bytes of one part of the last level
    if method is None:
        method = stage_methods(net, levels, options.size_bytes, 1)[-1]
    best = _estimate(net, last, method, 0.0, 1, si)
    chosen = None
    for a, inner, outer in splits:
        estimate = (_estimate(net, inner, "direct", part * (n // a), 1, si)
                    + _estimate(net, outer, "direct", part, 1, si + 1))
        if estimate < best:
            best, chosen = estimate, (inner, outer)
    if chosen is None:
        return levels
    return [*levels[:-1], *(Stage(s.level, tuple(tuple(find_cycle(net, g)) for g in s.groups)) for s in chosen)]


def _split(stage: Stage, a: int) -> tuple[Stage, Stage]:
    """``stage`` as two levels: each group's ``a`` consecutive members, then the members ``a`` apart (groups in
    ``stage``'s order, not yet rings)."""
    n = stage.size
    return (Stage(stage.level, tuple(g[k * a:(k + 1) * a] for g in stage.groups for k in range(n // a))),
            Stage(stage.level, tuple(g[j::a] for g in stage.groups for j in range(a))))


# --------------------------------------------------------------------------- phase steps


def _halving_doubling_steps(n: int, gather: bool) -> list[list[Send]]:
    """Recursive halving (reduce-scatter) or doubling (all-gather) among ``n`` (a power of two) members.

    Thakur, Rabenseifner & Gropp 2005, section 4.4.  Halving at distance ``d``:
    member ``i`` holds the aligned run of ``2d`` parts around its own, sends the
    half its partner ``i ^ d`` keeps and keeps the other; doubling sends the
    aligned run of ``d`` parts it holds and receives the partner's.
    """
    distances = []
    d = 1
    while d < n:
        distances.append(d)
        d *= 2
    if not gather:
        distances.reverse()
    return [[(i, i ^ d, (i ^ d) & ~(d - 1) if not gather else i & ~(d - 1),
              ((i ^ d) & ~(d - 1) if not gather else i & ~(d - 1)) + d) for i in range(n)]
            for d in distances]


def _direct_steps(n: int, gather: bool) -> list[list[Send]]:
    """Direct reduce-scatter or all-gather among ``n`` members: one step, every member to every other.

    Reduce-scatter: member ``i`` sends part ``k`` to member ``k``; all-gather:
    member ``i`` sends its part ``i`` to everyone.  One path latency instead of
    ``n - 1`` (ring) or ``log2 n`` (halving-doubling): the latency-optimal
    stage where the members meet through a switch, whose every port then runs
    at once.  Member ``i`` walks its peers from ``i + 1`` on, so that no member
    is everyone's first destination.
    """
    return [[(i, (i + off) % n, i if gather else (i + off) % n, (i if gather else (i + off) % n) + 1)
             for i in range(n) for off in range(1, n)]]


_METHODS: dict[str, Callable[[int, bool], list[list[Send]]]] = {
    "ring": ring_steps,
    "halving-doubling": _halving_doubling_steps,
    "direct": _direct_steps,
}
#: A level of more members never runs direct: its n^2 messages per group would swamp the schedule.
_DIRECT_MAX_MEMBERS = 32
#: Nor one whose phase sends more messages than this per slice (ranks x (members - 1)) inside hosts, or
#: twice as many across the network, where a step waits out microseconds, not a fraction of one: a
#: 1024-rank cluster keeps halving-doubling inside its hosts (direct there: twice the operations, 2.1M,
#: for 2.66x of the bound at 1 MiB against 2.85x), while 32 rail-optimized hosts run direct across them
#: (7,936 messages, as many operations as halving-doubling; 1 MiB: all-gather and reduce-scatter 1.87x and
#: 2.05x -> 1.52x, all-reduce 2.22x -> 1.28x).
_DIRECT_MAX_SENDS = 4096
#: A level across the network runs direct only where its one step puts at most this many messages on a
#: link (route shares summed): more make many flows contend at leaves and spines, the simulator's worst
#: case (256-rank 2:1 fat-tree, 37 on a spine link: all-reduce at 1 MiB took 250 s to time, loaded, where
#: halving-doubling levels take 1.3 s; 128 PCIe GPUs on a 4:1 fat-tree, 57: 200 s).  Rails (15 on 16
#: hosts) and a 64-GPU 4:1 fat-tree (18) stay direct.
_DIRECT_MAX_SHARING = 32.0
#: And only where the estimate times it this much faster than the others: the estimate sees its lower
#: latency but not its contention, every member receiving from all others at once (4 DGX A100 at 256 MiB:
#: all-gather 98.6% of the bound direct, 99.4% by halving-doubling, which the estimate times 0.1% slower).
_DIRECT_GAIN = 0.02
#: All-reduce keeps up to this many equal slices; only more are shaped (fewer, over twice the chunks): at
#: 64 MiB on 4 DGX A100, 64 equal slices reach 97.3% of the bound with 41k operations, 20 shaped ones 94.8%.
_EQUAL_SLICES = 64
#: Fewer slices where slices x messages per slice would exceed this (the build, the proof and the
#: simulation grow with it): 256 MiB on 4 DGX A100 takes 100 slices of direct levels, not 256.
_MAX_TRANSFERS = 1 << 16
#: ... or this many per rank, where that is more: a 1024-GPU fat-tree keeps 8 slices at 64 MiB (3 slices
#: under the flat budget: 80.0% of the bound instead of about 90%).
_TRANSFERS_PER_RANK = 160
#: A small reduce-scatter or all-gather of whole blocks that the budget leaves one slice, so that its levels
#: run one after the other, may send this many times the budget's messages (rail-32x8 at 1 MiB: 4 slices,
#: 1.20x of the bound, 1.52x in one; fattree-256-2to1, its direct spine level over the sharing cap, which
#: a small one lifts: 1.38x, 1.65x in one).
#: Not an all-reduce of whole blocks, which gained nothing by it (rail-32x8 at 1 MiB: 1.28x either way, the
#: virtual order kept) but twice the time to build and time the blocks (8.3 s -> 18.0 s).
_SMALL_BUDGET = 4


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _spread_shares(net: Network, src: int, dst: int, channel: int,
                   spread: bool) -> Mapping[tuple[str, str], float]:
    """:func:`~topocc.planner.routing.relay.path_shares` as the estimates see them: with ``spread`` (all-reduce), where the
    routing hashes a pair's channels onto different paths (ECMP), the message split evenly over the pair's
    equal-cost paths.

    :func:`_spread_channels` gives each pair the channel that unloads the busiest
    link, which over a level's many pairs comes near that even split; one
    channel's hashes are luck instead (fattree-64-4to1, the cross-leaf level
    of 4: halving-doubling timed a third slower than a ring on channel 2's
    collisions, where it runs an all-reduce at 98.0% of the bound and the ring
    at 86.0%).  Only for an all-reduce, which sends a part as one message and
    keeps its slices: the message budget may leave a reduce-scatter or
    all-gather one slice, whose levels then overlap only as a ring's parts
    arrive, one step after the other, and there the hashed shares, which time
    a ring no slower, choose better (fattree-256-2to1 all-gather at 256 MiB,
    one slice: 97.9% of the bound with a cross-leaf ring, 94.7% with
    halving-doubling).
    """
    if not spread or not net.channels_change_path(src, dst):
        return path_shares(net, src, dst, channel)
    return net.even_shares(src, dst)


def _estimate(net: Network, stage: Stage, method: str, part_bytes: float, slices: int, channel: int,
              spread: bool = False) -> float:
    """Seconds one phase of ``stage`` takes with ``method`` on ``channel``: per step the path latency plus the
    step's bytes over its busiest link, every group of the stage loading the links at once, ``slices`` times
    (a relayed pair loads and waits for all its hops).

    A coarse model (no overlap between steps), used only to choose between ring and halving-doubling.
    ``spread``: ECMP routes as :func:`_spread_shares` sees them for an all-reduce.
    """
    topology = net.topology
    link = topology.link
    total = 0.0
    seen: dict[tuple[tuple[int, int, int], ...], float] = {}  # a ring's steps all cost the same
    for step in _METHODS[method](stage.size, False):
        shape = tuple((i, j, b - a) for i, j, a, b in step)
        cost = seen.get(shape)
        if cost is None:
            load: dict[tuple[str, str], float] = {}
            latency = 0.0
            for g in stage.groups:
                for i, j, parts in shape:
                    for key, share in _spread_shares(net, g[i], g[j], channel, spread).items():
                        load[key] = load.get(key, 0.0) + share * parts
                latency = max(latency, max(path_latency(net, g[i], g[j], channel) for i, j, _ in shape))
            busiest = max((v / link(*key).bandwidth for key, v in load.items()), default=0.0)  # type: ignore[union-attr]
            cost = seen[shape] = latency + slices * part_bytes * busiest
        total += cost
    return total


def _round_trip(net: Network, stage: Stage, method: str, part_bytes: float, slices: int, channel: int,
                weights: Mapping[int, int] | None) -> float:
    """Seconds the last level of an all-reduce takes with ``method``, reduce-scatter and all-gather pooled:
    every step's path latency plus all the bytes of both phases over the busiest link.

    Pooled since the pipeline runs both phases at once, on different slices:
    with uneven ownership (``weights``, see :func:`ownership`; by default one
    part each) a small owner's links carry mostly outgoing bytes in the
    reduce-scatter and incoming ones in the all-gather, which a phase-by-phase
    :func:`_estimate` would count as if they queued.
    """
    topology = net.topology
    link = topology.link
    load: dict[tuple[str, str], float] = {}
    latency = 0.0
    for gather in (False, True):
        for step in _METHODS[method](stage.size, gather):
            for g in stage.groups:
                for i, j, a, b in step:
                    parts = b - a if weights is None else sum(weights[g[x]] for x in range(a, b))
                    for key, share in _spread_shares(net, g[i], g[j], channel, True).items():
                        load[key] = load.get(key, 0.0) + share * parts
            latency += max(path_latency(net, g[i], g[j], channel) for g in stage.groups for i, j, _, _ in step)
    busiest = max((v / link(*key).bandwidth for key, v in load.items()), default=0.0)  # type: ignore[union-attr]
    return latency + slices * part_bytes * busiest


def _relayed(net: Network, stage: Stage) -> bool:
    """Whether some halving-doubling partners of ``stage`` have no GPU-free route (their messages relay).

    Such a level runs a ring or direct instead: a relayed partner changes with
    every step, so the gateways' queues change with it, where the estimate
    times all three alike (4 chassis of 16 GPUs, NICs on every fourth: the
    all-reduce across the chassis at 91.5% of the bound with halving-doubling,
    97.5% with a ring, 98.1% direct; 4 chassis of 8, all-gather, 92.5% -> 99.7%).
    """
    return any(not net.has_route(g[i], g[j]) for g in stage.groups
               for step in _halving_doubling_steps(stage.size, False) for i, j, _, _ in step)


def _direct_fits(stage: Stage) -> bool:
    """Whether ``stage`` is small enough to run direct at all (:data:`_DIRECT_MAX_MEMBERS`,
    :data:`_DIRECT_MAX_SENDS`)."""
    return (stage.size <= _DIRECT_MAX_MEMBERS
            and len(stage.groups) * stage.size * (stage.size - 1)
            <= _DIRECT_MAX_SENDS * (1 if stage.level == "host" else 2))


def _alike(net: Network, stage: Stage) -> bool:
    """Whether every pair of every group of ``stage`` has a route of one and the same cost (members on one
    switch), so that a direct step loads them alike."""
    costs = [net.route_cost(a, b) for g in stage.groups for a in g for b in g if a != b]
    return bool(costs) and max(costs) < math.inf and max(costs) <= min(costs) * (1 + 1e-9)


#: The most messages one link carries in a direct step, per (stage, channel) (see :func:`_sharing`).
_SHARING: Memo[dict[tuple[Stage, int], float]] = Memo("hierarchical: link sharing", lambda net: {})


def _sharing(net: Network, stage: Stage, channel: int) -> float:
    """The most messages (route shares summed) one link carries in a direct step of ``stage``; 0 for a
    host level, which the cap on it never limits (cached per topology: :func:`hierarchical` may ask twice)."""
    if stage.level == "host":
        return 0.0
    cache = net.memo(_SHARING)
    found = cache.get((stage, channel))
    if found is None:
        load: dict[tuple[str, str], float] = {}
        for g in stage.groups:
            for a in g:
                for b in g:
                    if a != b:
                        for key, share in path_shares(net, a, b, channel).items():
                            load[key] = load.get(key, 0.0) + share
        found = cache[(stage, channel)] = max(load.values(), default=0.0)
    return found


def _host_rates(net: Network, stage: Stage, channel: int) -> dict[int, float]:
    """Each rank's share of what its host's links to the outside carry, bytes/s: the lower of out and in.

    The links counted are those the routes of the stage's messages (each rank
    to its ring successor) cross out of a host (from a device of the host to
    one outside it) or into it, each counted once at its full bandwidth, and
    split evenly over the host's ranks: a host of 8 GPUs behind two 100 Gbit/s
    NICs gives each 3.125 GB/s, a DGX A100 (eight 200 Gbit/s NICs) 25 GB/s.
    Per host and not per rank, since one sampled route per rank says which
    NICs a host uses but not how its ranks would share them.
    """
    topology = net.topology
    place = {d.name: d.host or d.name for d in topology.devices}
    home = {r: place[topology.ranks[r]] for g in stage.groups for r in g}
    out: dict[str, set[tuple[str, str]]] = {}
    into: dict[str, set[tuple[str, str]]] = {}
    for g in stage.groups:
        for i, r in enumerate(g):
            for key in path_shares(net, r, g[(i + 1) % len(g)], channel):
                if place[key[0]] != place[key[1]]:
                    out.setdefault(place[key[0]], set()).add(key)
                    into.setdefault(place[key[1]], set()).add(key)
    members: dict[str, int] = {}
    for h in home.values():
        members[h] = members.get(h, 0) + 1
    link = topology.link

    def capacity(keys: set[tuple[str, str]]) -> float:
        return sum(link(*k).bandwidth for k in keys)  # type: ignore[union-attr]

    return {r: min(capacity(out.get(h, set())), capacity(into.get(h, set()))) / members[h] for r, h in home.items()}


def ownership(net: Network, stage: Stage, channel: int) -> dict[int, int] | None:
    """How many of its group's ``stage.size`` parts each rank of a direct level across hosts reduces, or
    None where every rank takes one (today's equal split).

    In a direct reduce-scatter plus all-gather a member owning the fraction
    ``f`` of the data sends (and receives) ``(1 - f) + (n - 1) f`` of it: it
    sends every other owner its part, then its own part to all ``n - 1``
    others.  Ownership is free in an all-reduce, so each part goes, one at a
    time, to the member whose time ``(1 + (n - 2) f) / rate`` (rates from
    :func:`_host_rates`) grows least: a min-max that leaves a host behind two
    100 Gbit/s NICs owning nothing while DGX hosts beside it reduce for it.
    Its NICs then carry only the data once each way, the cut bound of a lone
    host (:mod:`topocc.planner.analysis.bounds`).  Equal rates give one part each, and so do
    rates less than ``(3n - 4) / (2n - 2)`` apart (1.25 for three members,
    towards 1.5 for many), since a second part costs a member more than a
    first one does a member that much slower.  Of two members, ownership
    moves nothing (each sends the data once whatever it owns).  A ring or
    halving-doubling member forwards most parts whoever owns them, so only
    a direct level gets uneven parts (see :func:`hierarchical`).
    """
    n = stage.size
    if stage.level == "host" or n <= 2:
        return None
    rate = _host_rates(net, stage, channel)
    if min(rate.values()) <= 0:  # no route out of some host sampled: no basis for a choice
        return None
    weights: dict[int, int] = {}
    for g in stage.groups:
        # (time once it owns one part more, parts it owns, position): ties go to the one owning fewer
        heap = [((1 + (n - 2) / n) / rate[r], 0, i) for i, r in enumerate(g)]
        heapq.heapify(heap)
        owned = [0] * n
        for _ in range(n):
            _, parts, i = heapq.heappop(heap)
            owned[i] = parts + 1
            heapq.heappush(heap, ((1 + (n - 2) * (parts + 2) / n) / rate[g[i]], parts + 1, i))
        weights.update(zip(g, owned))
    return None if all(w == 1 for w in weights.values()) else weights


def stage_methods(net: Network, levels: Sequence[Stage], slice_bytes: float, slices: int,
                  force: str | None = None, weights: Mapping[int, int] | None = None,
                  fed: bool = False, spread: bool = False, sharing_cap: float = _DIRECT_MAX_SHARING,
                  waved: bool = False, contend: bool = True) -> list[str]:
    """Ring, halving-doubling or direct for each level: the one :func:`_estimate` times fastest (ties: fewer
    steps; direct only where it is :data:`_DIRECT_GAIN` faster, or, with ``fed``, above the first level
    where it is no slower).

    ``force`` (``options.hierarchical.stage_method``) picks one for every level it
    fits; halving-doubling fits a level whose size is a power of two and whose
    partners have routes (:func:`_relayed`), direct one of at most
    :data:`_DIRECT_MAX_MEMBERS` members.  A level of two members has
    one step whatever the method.  ``weights`` (:func:`ownership`) times a direct
    last level with that ownership.  ``fed``: a reduce-scatter, whose levels
    above the first get their slices one at a time from its flow-controlled
    first level, so that on the pipeline's small first slices a ring's ``n - 1``
    dependent steps show their latency in full, which the estimate, counting
    it once, does not see (rail-8x8 at 256 MiB, cross-host ring / direct:
    96.4% / 98.3% of the bound; the estimate times direct 1% faster).
    ``spread``: an all-reduce (see :func:`_spread_shares`).  ``waved``: a
    reduce-scatter (or an all-reduce's first half) of few slices in waves (see
    :func:`_waves`), whose levels take the methods that pipeline waves, where
    the estimate allows.  ``contend``: a direct level over the usual sharing cap
    must also beat the others' step latencies (see below); a small collective in
    a few slices lifts that.
    """
    out: list[str] = []
    part = slice_bytes
    small = slice_bytes * slices < _MIN_SLICE_BYTES * math.prod(s.size for s in levels)  # under 64 KiB a rank
    for si, s in enumerate(levels):
        part /= s.size  # bytes of one part of this level, per slice
        if s.size == 2:
            out.append("halving-doubling")
            continue
        # fewest steps first, so that ties go to the lower latency
        sharing = _sharing(net, s, si) if _direct_fits(s) else math.inf
        direct = sharing <= sharing_cap
        fits = [m for m, ok in (("direct", direct),
                                ("halving-doubling", _power_of_two(s.size) and not _relayed(net, s)),
                                ("ring", True)) if ok]
        if force is not None and force in fits:
            out.append(force)
            continue
        # timed on the channel of the level's reduce-scatter phase (all-reduce and reduce-scatter: its index)
        times = [_estimate(net, s, m, part, slices, si, spread) for m in fits]
        if weights is not None and si == len(levels) - 1:  # uneven ownership, where direct runs it
            times = [_round_trip(net, s, m, part, slices, si, weights if m == "direct" else None) for m in fits]
        if fed and not waved and si == 0 and small:
            # behind a first level that is not direct the flow control lets in a slice at a time, so its steps'
            # latencies are waited out once a slice, which the estimate counts once: on small messages
            # (fattree-128-4to1-pcie at 1 MiB, 4 slices, a ring in the hosts / direct: reduce-scatter 1.30x /
            # 1.21x of the bound, all-reduce of whole blocks 1.30x / 1.15x; at 4 MiB the reduce-scatter 1.12x /
            # 1.07x; but at 256 MiB, 37 slices in two 8-GPU chassis with one-way links, 90.2% direct where a
            # ring reaches 99.8%)
            times = [t if m == "direct" else t + (slices - 1) * _estimate(net, s, m, 0.0, slices, si, spread)
                     for m, t in zip(fits, times)]
        # where a reduce-scatter's first level is not direct, its flow control (see _windowed) makes it a ring,
        # which the estimate does not time: where every pair meets alike (an NVSwitch) direct wins even so
        # (fattree-80-2to1 at 256 MiB: 95.5% -> 99.0% of the bound, dgx-a100-4node 97.7% -> 98.9%), but not
        # where pairs differ (a hybrid cube-mesh: ndv2-2chassis 99.8% -> 89.2%)
        gain = 0.0 if fed and (si > 0 or _alike(net, s)) else _DIRECT_GAIN
        if fits[0] == "direct" and len(fits) > 1 and times[0] > min(times[1:]) * (1 - gain):
            fits, times = fits[1:], times[1:]
        if (contend and fits[0] == "direct" and len(fits) > 1 and sharing > _DIRECT_MAX_SHARING
                and _estimate(net, s, "direct", part, slices, si, True) > min(
                    _estimate(net, s, m, 0.0, slices, si, True) for m in fits[1:])):
            # Over the usual cap its many flows contend, which the estimate does not see, while the others'
            # hashed collisions flatter it (fattree-256-2to1 all-gather, one slice, a direct cross-leaf level:
            # 83.1% of the bound at 256 MiB, timed 26% faster, where a ring reaches 97.9%; 1.33x at 4 MiB,
            # halving-doubling 1.22x).  So it runs only where, its messages spread evenly over the paths, it is
            # over before the others' step latencies alone (1 MiB there: 2.11x -> 1.65x of the bound).
            fits, times = fits[1:], times[1:]
        best = min(times)
        choice = next(m for m, t in zip(fits, times) if t <= best * (1 + 1e-9))
        if waved and si > 0:
            # in waves the levels below work in the order this one needs their blocks, so the last level's
            # steps set the waves' grain: a ring's n - 1 steps each need 1/n of the blocks, halving-doubling's
            # first needs half and direct's all of them (rail-32x8 reduce-scatter at 256 MiB, one slice:
            # 77.7% of the bound with halving-doubling across the hosts, 93.1% with a ring); a level in
            # between runs direct where it may, its one step keeping the waves whole (fattree-256-2to1: a
            # direct rack level 92.8%, halving-doubling 82.8%).  Unless latency rules the estimate.
            want = "ring" if si == len(levels) - 1 else "direct"
            if want in fits and times[fits.index(want)] <= best * _WAVE_SLACK:
                choice = want
        elif waved and choice == "ring" and len(fits) > 1:
            # the first level's waves queue on a ring's one connection in the order they become ready, every
            # wave's first step before any wave's second, so the waves mix; halving-doubling or direct sends
            # each step to another member (fattree-128-4to1-pcie at 256 MiB, 4 slices: 79.3% of the bound with
            # a ring in the hosts, 99.2% with halving-doubling)
            choice = min((m for m in fits if m != "ring"), key=lambda m: times[fits.index(m)])
        out.append(choice)
    return out


#: A reduce-scatter in waves (see :func:`_waves`) gets at least this many slices wherever the message budget
#: fits one, so up to this many times the budget: its waves keep few flows in contention, so they simulate
#: fast (fattree-256-2to1 at 256 MiB: 1 / 4 slices, 95.5% / 98.8% of the bound; the 554k operations of 4
#: built and simulated in 12 s, where 32 slices in virtual order, 147k operations, took 20 s for 79.7%).
#: Up to this many slices pipeline mostly in waves: their levels take methods for them, and no window.
_WAVE_SLICES = 4
#: An all-reduce that may run as a reduce-scatter in waves and an all-gather takes that where it comes this
#: near the bound, without building the other (see :func:`_allreduce_layout`).
_BLOCKS_GOOD = 0.97
#: Up to this many ranks an all-reduce short of :data:`_BLOCKS_GOOD` in virtual order also tries whole
#: blocks: two builds and simulations of a few seconds there (ten DGX hosts on leaves of four, the last half
#: full, at 256 MiB: 91.8% of the bound in virtual order, 98.6% in whole blocks; 1.2 s -> 5.7 s to build).
_BLOCKS_TRIED_RANKS = 128
#: Below :data:`_MIN_SLICE_BYTES` a rank, up to this many ranks (a slice of whole blocks sends p^2 messages a
#: phase: fattree-1024 at 1 MiB, 4.3M operations, 3.82x of the bound, where virtual order takes 3.64x).
_BLOCKS_SMALL_RANKS = 256
#: In waves a level above the first takes the method that pipelines them best unless the estimate times
#: it this much slower than the fastest (latency: a 1 MiB collective's ring steps each wait out a path).
_WAVE_SLACK = 1.25


# --------------------------------------------------------------------------- slices of reduce-scatter, all-gather


def _windowed(net: Network, levels: Sequence[Stage], methods: Sequence[str], slice_bytes: float,
              slices: int) -> list[str]:
    """The methods of a flow-controlled reduce-scatter: a ring on every level of more than two members that
    does not run direct, since a windowed ring keeps its one link busy with the oldest slice; but a level
    keeps the method it was timed fastest with where a ring's step latencies alone take longer than that
    method's whole :func:`_estimate`, as on small messages.

    A ring's ``n - 1`` dependent steps each wait out a path latency (at 1 MiB: fattree-1024, a ring among
    its 32 racks, 14.2x the bound, halving-doubling 3.0x; 32 hosts of 2 GPUs on one fat-tree, 27.8% and
    68.2%), while elsewhere the estimate may time a ring too slow (ibm-s822lc-48x4 at 1 MiB: a ring among
    16 hosts 1.30x, halving-doubling, timed a third faster, 1.46x), so the rule asks for the latencies alone.
    """
    out: list[str] = []
    part = slice_bytes
    for si, (s, m) in enumerate(zip(levels, methods)):
        part /= s.size
        keep = (s.size <= 2 or m in ("direct", "ring")
                or _estimate(net, s, "ring", 0.0, 1, si) > _estimate(net, s, m, part, slices, si))
        out.append(m if keep else "ring")
    return out


def _slice_shape(slices: int, ramp: tuple[int, ...] = _RAMP) -> tuple[int, ...]:
    """Relative sizes of the ``slices`` slices of a reduce-scatter or all-gather: small at both ends.

    The first slice's first stage is the pipeline's fill and the last slice's
    last stage its drain; the slices in between keep every level busy.  Sizes
    grow from 1 up to :data:`_PLATEAU` by ``ramp`` and halve again towards the
    end, so fill and drain cost a small fraction of a slice (1, 2, 3, 4, 6, 8,
    8, ..., 4, 2, 1).  The ramp grows by about 1.5, not 2: the stage that binds
    is fed by the one before it, which on small slices runs at its latency, and
    a slice twice the last one leaves the binding stage waiting for it
    (rail-8x8 reduce-scatter at 256 MiB, 12 slices: 94.6% of the bound
    doubling, 96.2% by 1.5; fattree-64-4to1: 96.5%, 98.1%).  Halving at the end
    costs nothing measurable, and all-gathers keep 99.4% either way.  An
    all-reduce left few slices doubles instead (:data:`_DOUBLING`, see
    :data:`_FEW_SLICES`).
    """
    return tuple(min(ramp[min(j, len(ramp) - 1)], 2 ** (slices - 1 - j), _PLATEAU) for j in range(slices))


def _chunk_budget(p: int, size_bytes: int) -> int:
    """Chunks per rank's block that :data:`_MAX_CHUNKS` allows (twice from :data:`_LARGE_BYTES`), at least
    :data:`_MIN_SLICES`."""
    return max(_MAX_CHUNKS * (2 if size_bytes >= _LARGE_BYTES else 1) // p, _MIN_SLICES)


def _stage_slices(p: int, size_bytes: int) -> int:
    """Slices for a reduce-scatter or all-gather: as many as keep the chunks of :func:`_slice_shape` within
    :func:`_chunk_budget` and its pieces at least :data:`_MIN_SLICE_BYTES` on average."""
    budget = _chunk_budget(p, size_bytes)
    most = size_bytes / p / _MIN_SLICE_BYTES
    slices = 1
    while sum(_slice_shape(slices + 1)) <= min(budget, most):
        slices += 1
    return slices


def _budget_slices(levels: Sequence[Stage], phases: Sequence[tuple[int, bool]],
                   steps: Mapping[tuple[int, bool], list[list[Send]]], spans: Sequence[int], contiguous: bool,
                   scale: int = 1) -> int:
    """Slices the message budget allows (:data:`_MAX_TRANSFERS`, or :data:`_TRANSFERS_PER_RANK` per rank,
    ``scale`` times; 0 where not even one fits):
    one message per part where the buffer is in virtual-block order (``contiguous``), else one per virtual
    block of the part."""
    p = spans[0]
    per_slice = sum(len(levels[si].groups) * sum(1 if contiguous else (e - a) * (spans[si] // levels[si].size)
                                                 for step in steps[(si, gather)] for _, _, a, e in step)
                    for si, gather in phases)
    return scale * max(_MAX_TRANSFERS, _TRANSFERS_PER_RANK * p) // per_slice


def _piece_runs(buffer: str, owners: Sequence[int], units: int, offset: int, count: int) -> list[Chunk]:
    """Chunks ``offset .. offset + count`` of each owner's block of ``units`` chunks in ``buffer``, as runs
    (neighbouring owners' pieces merge only when a piece is the whole block)."""
    if count == units:
        return chunk_runs(buffer, owners) if units == 1 else [
            Chunk(buffer, c.index * units, c.count * units) for c in chunk_runs(buffer, owners)]
    return [Chunk(buffer, o * units + offset, count) for o in sorted(owners)]


# --------------------------------------------------------------------------- channels under ECMP


#: Channels a pair's messages may take per phase where ECMP hashes channels onto different paths.
_CHANNEL_CHOICES = 8


def _spread_channels(net: Network, levels: Sequence[Stage], phases: Sequence[tuple[int, bool]],
                     steps: dict[tuple[int, bool], list[list[Send]]], spans: Sequence[int]) -> dict[
                         tuple[int, int, int], int]:
    """The channel of each pair's messages in each phase: ``(phase, src, dst) -> channel``.

    Phase ``f`` owns channels ``f, f + len(phases), ...``, so phases still never
    share a connection.  Where the routing hashes connections onto paths (ECMP),
    a fixed channel per phase leaves the hashes to balance the uplinks, and on a
    4:1 fat-tree of 64 GPUs the busiest spine link carried 1.5 times its share;
    so each pair, in emission order, takes whichever of :data:`_CHANNEL_CHOICES`
    channels puts the least load on its busiest link so far (all phases loading
    the links at once, as the pipeline runs them).
    """
    topology = net.topology
    bandwidth = {(ln.src, ln.dst): ln.bandwidth for ln in topology.links}
    load: dict[tuple[str, str], float] = {}
    chosen: dict[tuple[int, int, int], int] = {}

    def busiest(shares: dict[tuple[str, str], float], weight: float) -> float:
        return max((load.get(key, 0.0) + share * weight) / bandwidth[key] for key, share in shares.items())

    for f, (si, gather) in enumerate(phases):
        sub = spans[si] // levels[si].size
        for step in steps[(si, gather)]:
            for g in levels[si].groups:
                for i, k, a, e in step:
                    src, dst = g[i], g[k]
                    weight = (e - a) * sub
                    channel = chosen.get((f, src, dst))
                    if channel is None:
                        channel = f
                        if net.channels_change_path(src, dst):
                            options = [f + m * len(phases) for m in range(_CHANNEL_CHOICES)]
                            channel = min(options, key=lambda c: busiest(net.route_shares(src, dst, c), weight))
                        chosen[(f, src, dst)] = channel
                    for key, share in net.route_shares(src, dst, channel).items():
                        load[key] = load.get(key, 0.0) + share * weight
    return chosen


def _waves(levels: Sequence[Stage], phases: Sequence[tuple[int, bool]],
           steps: Mapping[tuple[int, bool], list[list[Send]]], spans: Sequence[int],
           position: Sequence[Mapping[int, int]], block: Mapping[int, int],
           in_turn: bool) -> dict[tuple[int, int], list[set[int]]]:
    """The virtual blocks of each group of a reduce-scatter's phases below the last, in *waves*: ``(phase,
    group's first rank) -> sets of virtual blocks``, in the order the phases above need them.

    A block's need is the step at which the last phase sends it on from where
    the phases below leave it (its send step there, or after the last step if
    its holder keeps it), then the same for the phase before, and so on down:
    so a host reduces first what its rack must pass on across the cluster
    first.  Reduced all at once, every block of a phase is final at its end,
    and the phases run one after the other; in waves the phase above starts on
    the first wave while the phase below reduces the next, as an all-gather's
    lower phases pass blocks on as they arrive (fattree-256-2to1 at 256 MiB,
    one slice: 51.1% of the bound at once, 95.5% in waves).  ``in_turn``: a
    direct phase's sends, all one step, count in the order a member walks its
    peers, so that a level below feeds that phase's first peer first (with few
    slices; with many, a chassis-4x8-subset reduce-scatter lost 2% by it).
    """
    # first[(level, member)][part]: the step at which that member first sends that part (steps: never)
    first: dict[tuple[int, int], list[int]] = {}
    for si, gather in phases:
        n, phase = levels[si].size, steps[(si, gather)]
        for i in range(n):
            at = [len(phase) * n] * n
            for t in reversed(range(len(phase))):
                sends = [(a, e) for src, _, a, e in phase[t] if src == i]
                for x, (a, e) in reversed(list(enumerate(sends))):
                    at[a:e] = [t * n + (x if in_turn else 0)] * (e - a)
            first[(si, i)] = at
    group_of = {(si, r): g for si, s in enumerate(levels) for g in s.groups for r in g}

    def need(f: int, r: int, v: int) -> tuple[int, ...]:
        """Block ``v``'s need from phase ``f`` up, held by rank ``r`` as that phase starts: last phase first."""
        if f == len(phases):
            return ()
        si = phases[f][0]
        sub = spans[si] // levels[si].size
        part = (v - block[r] // spans[si] * spans[si]) // sub
        return (*need(f + 1, group_of[(si, r)][part], v), first[(si, position[si][r])][part])

    out: dict[tuple[int, int], list[set[int]]] = {}
    for f, (si, _) in enumerate(phases[:-1]):
        sub = spans[si] // levels[si].size
        for g in levels[si].groups:
            base = block[g[0]] // spans[si] * spans[si]
            keyed: dict[tuple[int, ...], set[int]] = {}
            for v in range(base, base + spans[si]):
                keyed.setdefault(need(f + 1, g[(v - base) // sub], v), set()).add(v)
            out[(f, g[0])] = [keyed[key] for key in sorted(keyed)]
    return out


def _spans(levels: Sequence[Stage], p: int) -> list[int]:
    """The virtual blocks one group of each level covers."""
    spans = [p]
    for s in levels[:-1]:
        spans.append(spans[-1] // s.size)
    return spans


def _blocks_may_win(net: Network, levels: Sequence[Stage], options: Options) -> bool:
    """Whether an all-reduce may run faster with each rank's block whole, as a reduce-scatter in waves and an
    all-gather, than in virtual-block order: where the message budget leaves its reduce-scatter half a few
    slices of whole blocks (hundreds of ranks), bandwidth rules, and the levels between the first and the
    last run direct in waves, so that the waves stay fine (ibm-s822lc-48x4, halving-doubling among 16 hosts
    of a rack: 92.2% of the bound in whole blocks, 98.9% in virtual order)."""
    topology = net.topology
    p = topology.size
    if not _layouts_apply(net, levels, options):
        return False
    halves = [(si, False) for si in range(len(levels))]
    spans = _spans(levels, p)
    # a slice of whole blocks sends one message per virtual block of a part, whatever the methods
    steps = {phase: ring_steps(levels[phase[0]].size, False) for phase in halves}
    if not 1 <= _budget_slices(levels, halves, steps, spans, False) <= _WAVE_SLICES:
        return False
    methods = stage_methods(net, levels, options.size_bytes / _WAVE_SLICES, _WAVE_SLICES, fed=True,
                            waved=True)
    return all(m == "direct" or s.size == 2 for s, m in zip(levels[1:-1], methods[1:-1]))


def _blocks_may_help(net: Network, levels: Sequence[Stage], options: Options) -> bool:
    """Whether an all-reduce should also try whole blocks where its virtual-block order falls short: up to
    :data:`_BLOCKS_TRIED_RANKS` ranks (4 MiB: emu-racks 88.4% of the bound in virtual order, 93.8% in whole
    blocks; chassis-2x16-subset 89.2% / 92.6%; at 16 MiB it 92.0% / 89.0%, and the faster is kept), and on
    small messages up to :data:`_BLOCKS_SMALL_RANKS` (1 MiB: fattree-256-2to1 2.46x / 1.74x of the bound,
    fattree-64-4to1 1.38x / 1.33x; rail-16x8 1.18x / 1.33x)."""
    topology = net.topology
    if not _layouts_free(levels, options):
        return False
    small = options.size_bytes / topology.size < _MIN_SLICE_BYTES
    return topology.size <= (_BLOCKS_SMALL_RANKS if small else _BLOCKS_TRIED_RANKS)


def _layouts_apply(net: Network, levels: Sequence[Stage], options: Options) -> bool:
    """Whether an all-reduce may take either layout by default (:func:`_layouts_free`), with blocks where
    bandwidth rules."""
    topology = net.topology
    return _layouts_free(levels, options) and options.size_bytes / topology.size >= _MIN_SLICE_BYTES


def _layouts_free(levels: Sequence[Stage], options: Options) -> bool:
    """Whether an all-reduce's layout is open to choice: two levels or more, slices not forced, waves allowed."""
    return len(levels) >= 2 and options.pipeline is None and options.hierarchical.waves


def _allreduce_layout(net: Network, levels: list[Stage], options: Options, first: str,
                      second: str) -> Schedule:
    """The all-reduce in layout ``first`` where it comes within :data:`_BLOCKS_GOOD` of the bound, else the
    faster of it and the all-reduce in layout ``second`` (``virtual`` or ``blocks``), as simulated.

    Neither layout wins everywhere (256 MiB, whole blocks / virtual order: fattree-256-2to1 98.7% / 91.0% of
    the bound, rail-32x8 99.2% / 95.9%, emu-racks at 4 MiB 93.8% / 88.4%; ibm-s822lc-48x4 92.2% / 98.9%,
    hetero-nics-8x8 57.0% / 97.7%), and the estimates do not see the waves.  They are timed by the
    compilation's evaluator (``options.evaluator``), which remembers the one it timed last, so the compiler
    timing the chosen schedule again costs nothing (unless its channel spreading replaces it).
    """
    evaluator = options.evaluator or Evaluator(net, options.size_bytes)

    def build(layout: str) -> Schedule:
        return _hierarchical(net, "allreduce", options, levels, layout)

    taken = build(first)
    time_s = evaluator.simulate(taken).time_s
    if evaluator.lower_bound("allreduce").time_s >= _BLOCKS_GOOD * time_s:
        return taken
    other = build(second)
    return other if evaluator.within(other, time_s) is not None else taken


# --------------------------------------------------------------------------- the schedule


def hierarchical(net: Network, collective: str, options: Options) -> Schedule:
    """Pipelined BlueConnect schedule for allreduce, reducescatter or allgather; broadcast and reduce run
    over the hosts' rails instead (:func:`~topocc.planner.compiler.algorithms.hierarchical_rooted.rooted_hierarchical`).

    ``options.pipeline`` sets the number of slices (all-reduce: equal ones; by
    default shaped by :func:`_slice_shape`, over twice the chunks of equal ones
    of about :data:`_SLICE_BYTES`; reduce-scatter and all-gather: shaped, by
    default as many as :func:`_stage_slices` allows).  By default there are at
    least :data:`_MIN_SLICES` where there are two levels or more, at most
    :func:`_chunk_budget` chunks and :data:`_MAX_TRANSFERS` messages
    (:data:`_SMALL_BUDGET` times that where it would leave a small
    reduce-scatter or all-gather one slice).  ``options.hierarchical.window``
    sets the flow control's window (reduce-scatter: 1 unless the first level
    is direct; all-reduce: 1 behind a ring, or halving-doubling on slices of
    4 MiB or more; 0 turns it off);
    ``options.hierarchical.layout`` (``virtual`` or ``blocks``) forces a
    reduce-scatter's or all-reduce's buffer order (an all-reduce of whole
    blocks is a reduce-scatter in waves and an all-gather; by default only
    where :func:`_blocks_may_win` or :func:`_blocks_may_help`, see :func:`_allreduce_layout`);
    ``options.hierarchical.waves`` (default true) lets a reduce-scatter of whole
    blocks reduce its lower levels in waves; ``options.hierarchical.stage_method`` (``ring``,
    ``halving-doubling`` or ``direct``) forces the method of every level whose
    size allows it.  An all-reduce whose direct last level splits unevenly
    (:func:`ownership`) records each virtual block's parts as ``ownership``.
    """
    topology = net.topology
    collective = canonical_collective(collective)
    if collective in ("broadcast", "reduce"):
        return rooted_hierarchical(net, collective, options)
    if collective not in ("allreduce", "reducescatter", "allgather"):
        raise NotApplicableError(
            f"hierarchical does not implement {collective} (it builds allreduce, reducescatter, allgather, "
            "broadcast, reduce)"
        )
    if topology.size == 1:
        return single_rank(collective, 1, 1, "hierarchical", options.as_dict())
    levels = stages(net)
    if collective == "allreduce" and options.hierarchical.layout is None:
        if _blocks_may_win(net, levels, options):
            return _allreduce_layout(net, levels, options, "blocks", "virtual")
        if _blocks_may_help(net, levels, options):
            return _allreduce_layout(net, _split_last(net, levels, options, large=False), options,
                                     "virtual", "blocks")
    return _hierarchical(net, collective, options, _split_last(net, levels, options),
                         options.hierarchical.layout)


def _hierarchical(net: Network, collective: str, options: Options, levels: list[Stage],
                  layout: str | None) -> Schedule:
    """:func:`hierarchical` on ``levels``, ``layout`` forced where not None (``virtual`` or ``blocks``)."""
    topology = net.topology
    p = topology.size
    meta = options.as_dict()
    relay = relays(net)  # a stage's pairs without a GPU-free route go through other GPUs
    meta["levels"] = [f"{s.level}:{s.size}" for s in levels]

    # A rank's virtual block: its coordinates read as a mixed-radix number, innermost level most
    # significant, so that every stage's group shares one contiguous range of virtual blocks.
    position: list[dict[int, int]] = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block: dict[int, int] = {}
    for r in range(p):
        v = 0
        for s, pos in zip(levels, position):
            v = v * s.size + pos[r]
        block[r] = v
    owner = {v: r for r, v in block.items()}

    budget = _chunk_budget(p, options.size_bytes)

    def wanted(virtual: bool) -> tuple[int, bool]:
        """Slices, and whether raised to the minimum.  In virtual order (all-reduce) about _SLICE_BYTES each
        (shaped below), else as many as _stage_slices allows; at least a few wherever there are stages to
        overlap (no per-message cost is charged, and without them a 1 MiB collective runs its stages one
        after the other).  Raised to the minimum, the slices are equal ones: at 1 MiB shaped ones leave the
        middle slices too big to overlap (dgx-a100-4node at 1 MiB, equal / shaped: reduce-scatter 1.18x /
        1.22x of the bound, all-reduce 1.22x / 1.25x, all-gather 1.17x / 1.16x)."""
        if virtual:
            # a reduce-scatter sends half an all-reduce's messages a slice, so twice the slices cost as much
            # (a 1024-GPU fat-tree at 256 MiB: 16 slices, 92.2% of the bound; 8, 88.0%)
            least = _MIN_SLICES
            most = budget * (2 if collective == "reducescatter" else 1)
            slices = max(1, min(most, round(options.size_bytes / _SLICE_BYTES)))
        else:
            least = max((n for n in range(1, _MIN_SLICES + 1) if sum(_slice_shape(n)) <= budget), default=1)
            slices = _stage_slices(p, options.size_bytes)
        if options.pipeline is not None:
            return max(1, options.pipeline), False
        if len(levels) > 1 and slices < least:
            return least, True
        return slices, False

    force = options.hierarchical.stage_method
    if force is not None and force not in _METHODS:
        raise NotApplicableError(f"hierarchical: unknown stage_method {force!r} (use {', '.join(_METHODS)})")
    # all-reduce may let the ranks of fast hosts reduce more of the last level (where that runs direct)
    weights = ownership(net, levels[-1], len(levels) - 1) if collective == "allreduce" else None
    spans = _spans(levels, p)

    # phases in pipeline order: reduce-scatter up the levels, all-gather back down
    phases: list[tuple[int, bool]] = []
    if collective != "allgather":
        phases += [(si, False) for si in range(len(levels))]
    if collective != "reducescatter":
        phases += [(si, True) for si in reversed(range(len(levels)))]

    # Methods, then the slices the message budget allows.  The sharing cap on direct network levels bounds
    # the messages that contend on a link at once, a step's per slice in flight; where the budget leaves a
    # reduce-scatter or all-gather one slice anyway, they contend once, so the methods are chosen again
    # without it (fattree-256-2to1 all-gather at 1 MiB, 37 on a spine link: 2.11x -> 1.65x of the bound
    # with a direct cross-leaf level, 6 s of CPU to time; a small one then takes more slices, see below; an
    # all-reduce keeps its slices and the cap).
    weighted = weights
    layout = layout if collective != "allgather" else None
    if layout not in (None, "virtual", "blocks"):
        raise NotApplicableError(f"hierarchical: unknown layout {layout!r} (use virtual or blocks)")
    # An all-reduce keeps its buffer in virtual-block order, so a part is one run of chunks; all-gather and
    # reduce-scatter keep each rank's block whole, so a part of k virtual blocks is k messages, p^2 a slice in
    # all.  Where that leaves a reduce-scatter fewer slices than it wants, its blocks are large enough for
    # bandwidth to matter, and not one slice fits (in waves, see _waves; without them, wherever virtual order
    # allows more slices), it runs as the all-reduce's first half instead, in virtual order, and each
    # rank sends its sums on to the ranks they belong to at the end: 1/p of the data more on the network,
    # and one path latency, for slices (a 1024-GPU fat-tree at 256 MiB: one slice, 49.5% of the bound; in
    # virtual order, 16 slices, 92.2%; but at 1 MiB on 256 GPUs, where latency rules, 2.9x the bound where
    # whole blocks take 1.8x).
    waved = collective != "allgather" and len(levels) > 1 and options.hierarchical.waves
    # Few slices run in waves' own way (methods, no window, one wave at a time) only where bandwidth rules;
    # below, each wave's steps add their latency (rail-16x8 at 1 MiB, 4 slices: 51.1% of the bound so, 82.5%
    # without).
    bulk = options.size_bytes / p >= _MIN_SLICE_BYTES

    def uncapped() -> bool:
        """Whether the sharing cap leaves every level that may run direct free to."""
        return all(_sharing(net, s, si) <= _DIRECT_MAX_SHARING for si, s in enumerate(levels) if _direct_fits(s))

    # A small reduce-scatter or all-gather (under 64 KiB a rank) that the cap leaves one slice, its latencies
    # ruling, runs without the cap at all: its direct levels run over it in a few slices (fattree-256-2to1 at
    # 1 MiB, 4 slices direct / one slice: all-gather 1.38x / 1.65x of the bound, reduce-scatter 1.56x / 1.71x;
    # at 4 MiB 1.08x / 1.22x and 1.28x / 1.33x, where 4 slices with a halving-doubling spine level take 1.05x
    # and 1.42x).  Where the cap leaves it slices it keeps them (fattree-128-4to1-pcie reduce-scatter at 4 MiB,
    # 4 slices: 1.07x of the bound with a halving-doubling spine level, 1.12x direct).
    small = not bulk and collective != "allreduce"
    for sharing_cap in (_DIRECT_MAX_SHARING, math.inf):
        lifted = small and sharing_cap == math.inf
        contiguous = (collective == "allreduce" and layout != "blocks") or layout == "virtual"
        few = waved and bulk and options.pipeline is not None and options.pipeline <= _WAVE_SLICES
        rechosen = False  # the methods are chosen again for one slice, the budget having cut them to it
        while True:
            if rechosen:
                slices = 1
            else:
                slices, raised = wanted(contiguous)
            in_waves = few and not contiguous
            weights = weighted if contiguous else None
            methods = stage_methods(net, levels, options.size_bytes / slices, slices, force, weights,
                                    fed=collective != "allgather" and not contiguous, spread=contiguous,
                                    sharing_cap=sharing_cap, waved=in_waves, contend=not lifted)
            if methods[-1] != "direct":
                weights = None
            # the flow control (below) keeps a ring's one link busy with the oldest slice; a direct first level
            # needs none (dgx-a100-4node reduce-scatter, windowed ring / direct / windowless direct: 7.8x / 1.8x
            # / 1.2x of the bound at 1 MiB, 95.6% / 96.2% / 96.4% at 256 MiB), so there it is off and direct
            # levels stay.  In virtual order the levels keep their methods (reduce-scatter on
            # fattree-128-4to1-pcie at 256 MiB: 67.6% of the bound without the window, 75.7% with it and
            # rings, 82.2% with it alone).  An all-reduce takes it behind a ring only (chassis-4x8-subset at
            # 256 MiB: 75.1% / 90.5% of the bound without / with it; ndv2-2chassis at 64 MiB: 83.7% / 98.9%), or
            # behind halving-doubling on slices of _WINDOW_BYTES or more: on small ones a slice's log n
            # dependent steps each wait out a latency before the next slice may start (two 8-GPU hosts at
            # 64 MiB, 1 MiB slices: 98.6% / 83.0%; 256 GPUs at 256 MiB, 16 MiB slices: 95.3% / 96.1%; 1024 at
            # 64 MiB, 8 MiB slices: 90.8% / 92.1%; 4096 at 256 MiB: 89.2% / 90.9%)
            if collective == "allreduce" and contiguous:
                gated = methods[0] == "ring" or (methods[0] == "halving-doubling"
                                                 and options.size_bytes / slices >= _WINDOW_BYTES)
            else:
                gated = collective != "allgather" and methods[0] != "direct"
            pinned = options.hierarchical.window
            window = pinned if pinned is not None else _WINDOW if gated else 0
            if in_waves:
                window = 0  # it needs slices to work on
            if window and force is None and not contiguous:
                methods = _windowed(net, levels, methods, options.size_bytes / slices, slices)
            steps = {(si, gather): _METHODS[methods[si]](levels[si].size, gather) for si, gather in phases}
            most = slices  # slices the message budget allows
            if options.pipeline is None:
                fit = _budget_slices(levels, phases, steps, spans, contiguous)
                most = max(1, fit)
                if fit <= 1 and raised and small and not contiguous and (lifted or uncapped()):
                    most = max(1, _budget_slices(levels, phases, steps, spans, False, _SMALL_BUDGET))
                if waved and bulk and not contiguous and _budget_slices(levels, phases[:len(levels)], steps, spans,
                                                                        False):
                    most = max(fit, _WAVE_SLICES)
                # in waves a few slices of whole blocks pipeline the levels (fattree-256-2to1 at 256 MiB: four,
                # 98.8% of the bound; 32 slices in virtual order, 79.7%)
                if (collective == "reducescatter" and layout is None and not contiguous and most < slices
                        and not (waved and fit) and bulk
                        and _budget_slices(levels, phases, steps, spans, True) > most):
                    contiguous = True
                    continue
                if (most == 1 < slices and not rechosen and small and not contiguous
                        and collective == "reducescatter"):
                    # methods timed for slices the budget does not allow are timed again for the one it does:
                    # the first level's window penalty (see stage_methods) is for slices it cannot have
                    # (ibm-s822lc-48x4 at 1 MiB: timed for 8, a direct first level, 1.41x of the bound; for 1,
                    # a ring, 1.30x)
                    rechosen = True
                    continue
                slices = min(slices, most)
                if waved and bulk and not contiguous and slices <= _WAVE_SLICES and not few:
                    # few slices pipeline mostly in waves: methods for them (see stage_methods), no window
                    few = True
                    continue
            break
        if options.pipeline is not None or contiguous or most > 1 or uncapped():
            break
    first_step = []
    at = 0
    for phase in phases:
        first_step.append(at)
        at += len(steps[phase])

    ahead = 0  # see _MIDDLE_AHEAD
    if contiguous:
        # by default shaped slices (see :func:`_slice_shape`) over up to twice the chunks of equal ones: as
        # fast within a point, with a fraction of the slices, so of the operations (dgx-a100-4node at 256 MiB:
        # 98.6% of the bound with 44k operations; 128 equal slices: 99.2% with 164k)
        shape = (1,) * slices
        if options.pipeline is None and not raised:
            doubled = _slice_shape(slices, _DOUBLING)
            if (len(levels) > 1 and 3 <= slices <= _FEW_SLICES and weights is None
                    and options.size_bytes / sum(doubled) >= _WINDOW_BYTES):
                shape, ahead = doubled, _MIDDLE_AHEAD
            elif slices > _EQUAL_SLICES:
                n = 1
                while n < most and sum(_slice_shape(n + 1)) <= 2 * slices:
                    n += 1
                shape = _slice_shape(n)
    else:
        # every rank's block is cut into the slices of ``shape`` (in chunks)
        shape = (1,) * slices if raised else _slice_shape(slices)
    slices, units = len(shape), sum(shape)
    offsets = [sum(shape[:j]) for j in range(slices)]
    meta.update(pipeline=slices, slice_shape=":".join(map(str, shape)), methods=methods)
    if collective == "allreduce" and not contiguous:
        meta["layout"] = "blocks"

    # A direct reduce-scatter receives every peer's part into a scratch slot of its own and reduces it in
    # locally: reducing receives into one chunk would wait for each other, a path latency per peer.
    waved = waved and not contiguous
    slotted = [not gather and (methods[si] == "direct" or (waved and f > 0)) for f, (si, gather) in enumerate(phases)]
    slot_chunks = sum((levels[si].size - 1) * (spans[si] // levels[si].size) * units
                      * (max(weights.values()) if weights is not None and si == len(levels) - 1 else 1)
                      for f, (si, gather) in enumerate(phases) if slotted[f])

    # reduce-scatter works on a scratch copy of its input (and its direct levels' slots after it), all-reduce
    # in its output; all-gather puts each rank's block in place
    buffer = "s" if collective == "reducescatter" else "o"
    slot_base = p * units if collective == "reducescatter" else 0
    if collective == "allgather":
        b = ScheduleBuilder(collective, p, units, p * units, relay=relay)
        for r in range(p):
            b.copy(r, Chunk("i", 0, units), Chunk("o", r * units, units))
    else:
        b = ScheduleBuilder(collective, p, p * units, p * units if collective == "allreduce" else units,
                            scratch_chunks=slot_base + slot_chunks, relay=relay)
        for r in range(p):
            b.copy(r, Chunk("i", 0, p * units), Chunk(buffer, 0, p * units))

    refs: Callable[[int, int, int], list[Chunk]]
    if contiguous:
        if collective == "reducescatter":
            meta["layout"] = "virtual"
        # virtual block v starts at start[v] units of a slice: v units, or the weights of the blocks before it
        start = list(range(p + 1))
        if weights is not None:
            meta["ownership"] = ":".join(str(weights[owner[v]]) for v in range(p))
            for v in range(p):
                start[v + 1] = start[v] + weights[owner[v]]

        def refs(j: int, lo: int, hi: int) -> list[Chunk]:
            # slice j holds chunks p * offsets[j] ... of every virtual block, shape[j] per unit, block-major
            count = (start[hi] - start[lo]) * shape[j]
            return [Chunk(buffer, p * offsets[j] + start[lo] * shape[j], count)] if count else []
    else:
        # slice j of virtual blocks lo..hi is that piece of each of their owners' blocks
        def refs(j: int, lo: int, hi: int) -> list[Chunk]:
            return _piece_runs(buffer, [owner[v] for v in range(lo, hi)], units, offsets[j], shape[j])

    next_slot = [slot_base] * p
    # per phase and pair, before compile's general pass (topocc.planner.routing.paths.spread_channels), which alone leaves
    # fattree-64-4to1 at 1 MiB at 1.33x / 1.48x of the bound for all-gather / all-reduce, not 1.28x / 1.38x
    channels = _spread_channels(net, levels, phases, steps, spans)

    def send(src: int, dst: int, ref: Chunk, reduce: bool, slotted: bool, step: int, channel: int,
             after: tuple[int, ...]) -> int:
        """One message of a phase; returns the receiver's last operation for it.  ``slotted``: a reduction
        received into a scratch slot of its own and reduced in locally, so that the transfer need not wait
        for the receiver's own part to be final."""
        if not (reduce and slotted):
            return b.transfer(src, dst, ref, ref, reduce=reduce, step=step, channel=channel, after=after)[1]
        slot = Chunk("s", next_slot[dst], ref.count)
        next_slot[dst] += ref.count
        b.transfer(src, dst, ref, slot, step=step, channel=channel, after=after)
        return b.reduce(dst, slot, ref, step=step)

    # Emitted as a wavefront (slice j's phase f in round j + f), so each rank posts its messages
    # roughly in the order their data becomes ready; any order that follows the data is deadlock-free.
    # With ``ahead`` (see _MIDDLE_AHEAD) a slice's middle phases are emitted in one round, after the middle
    # phases of the slices before it, which they wait for.
    # Flow control (reduce-scatter, all-reduce): a rank starts sending slice j of the first phase only once
    # it has finished slice j - window of it.  Posted all at once, the first step of every slice takes the links
    # from the later steps that complete slices, and the next level starves (a 4 x 8 rail cluster at
    # 256 MiB: 90.8% of the bound with halving-doubling and no window, 60% with rings and no window,
    # 95.5% with rings and a window of 1: a windowed ring keeps its one link busy with the oldest slice).
    finished: dict[tuple[int, int, int], int] = {}  # (rank, phase, slice) -> its last operation there
    # In waves, with few slices, a rank starts on a wave of the first phase only once it has the last one's
    # sums: all at once, a later wave's first step shares the links with the earlier waves' later steps, and
    # the level above waits (fattree-16-2to1 at 256 MiB, one slice: 70.6% / 77.4% of the bound without / with
    # it, the all-gather's 77.4%; fattree-256-2to1, 4 slices: 97.5% / 98.8%); with many slices, the window above
    # keeps the order, and this would only stall it (rail-8x8: 98.6% / 91.0%).
    order = _waves(levels, phases[:len(levels)], steps, spans, position, block, few) if waved else {}
    waited = waved and few
    wave_done: dict[tuple[int, int, int], int] = {}  # (rank, slice, wave) -> its last operation of the first phase
    delay = list(range(len(phases))) if not ahead else [0] + [1] * (len(phases) - 2) + [2]
    for rnd in range(slices + delay[-1]):
        for f, (si, gather) in enumerate(phases):
            j = rnd - delay[f]
            if not 0 <= j < slices:
                continue
            s = levels[si]
            sub = spans[si] // s.size  # virtual blocks per part
            waves = [order.get((f, g[0]), [None]) for g in s.groups]
            for w in range(max(map(len, waves))):
                for t, step in enumerate(steps[(si, gather)]):
                    for g, wave in ((g, gw[w]) for g, gw in zip(s.groups, waves) if w < len(gw)):
                        base = block[g[0]] // spans[si] * spans[si]
                        for i, k, a, e in step:
                            gate = finished.get((g[i], f, j - window), -1) if window and f == 0 else -1
                            if ahead and f == 1:
                                gate = finished.get((g[i], len(phases) - 2, j - ahead), -1)
                            if waited and f == 0 and w and t == 0:
                                gate = wave_done.get((g[i], j, w - 1), -1)
                            channel = channels[(f, g[i], g[k])]
                            if wave is None:
                                parts = refs(j, base + a * sub, base + e * sub)
                            else:
                                parts = _piece_runs(buffer, [owner[v] for v in range(base + a * sub, base + e * sub)
                                                             if v in wave], units, offsets[j], shape[j])
                            for ref in parts:
                                finished[g[k], f, j] = send(g[i], g[k], ref, not gather, slotted[f],
                                                            first_step[f] + t, channel, () if gate < 0 else (gate,))
                                if waited and f == 0:
                                    wave_done[g[k], j, w] = finished[g[k], f, j]
    if collective == "reducescatter" and contiguous:
        # each rank's sums to the ranks whose blocks they are, on a channel of their own, once it has its last
        # slice's: one slice's sums all belong to a few ranks, and sent at once they would swamp those ranks'
        # links while the later slices still need them (a 256-GPU fat-tree at 256 MiB: 79.8% of the bound
        # sent as each slice is done, 90.6% at the end, the hand-on then about (1/p) N over the NICs)
        channel = len(phases) * _CHANNEL_CHOICES
        last = [finished.get((r, len(phases) - 1, slices - 1), -1) for r in range(p)]
        for j in range(slices):
            for r in range(p):
                a = p * offsets[j] + block[r] * shape[j]
                for q in range(a // units, (a + shape[j] - 1) // units + 1):
                    lo, hi = max(a, q * units), min(a + shape[j], (q + 1) * units)
                    piece, dst = Chunk("s", lo, hi - lo), Chunk("o", lo - q * units, hi - lo)
                    if q == r:
                        b.copy(r, piece, dst, step=at)
                    else:
                        b.transfer(r, q, piece, dst, step=at, channel=channel,
                                   after=() if last[r] < 0 else (last[r],))
    elif collective == "reducescatter":
        for r in range(p):
            b.copy(r, Chunk("s", r * units, units), Chunk("o", 0, units), step=at)
    return b.build("hierarchical", meta)
