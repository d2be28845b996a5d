"""Throughput-optimal spanning-tree packing (as in ForestColl), for large messages.

All-gather, reduce-scatter, broadcast and reduce: every root's data travels on
a few spanning out-trees of its own over the routed rank graph, packed by
:func:`topocc.planner.compiler.algorithms._arborescence.pack` so that the busiest physical link
carries as little as possible (ForestColl, Zhao et al., arXiv:2402.06787:
their switch removal becomes rank-to-rank arcs over the topology's fixed
routes, their arborescence packing a greedy multiplicative-weights packing
with Edmonds' algorithm as oracle; see that module).  On the fabrics we model
the packing meets the exact optimum over its arcs
(:func:`~topocc.planner.compiler.algorithms._arborescence.optimum`) or comes within a few per
cent of it.  No LP is solved, so nothing can time out into a degenerate
solution, and the work is polynomial: trees x passes x Edmonds' O(E log^2 E).

Schedules.  All-gather runs the out-trees root to leaf.  Each tree's share of
a root's block is cut into equal pieces and then three smaller ones
(4:...:4:2:2:1 of the share): the pieces sent last are the small ones, so
the links' queues drain in small steps at the end instead of waiting for one
large piece to cross the last hops.  Where the budget allows fewer, the shape's
tail is used.  Messages go on three
channels by the sender's depth (:data:`DEPTH_CHANNELS`).  The piece count is
bounded by :data:`MAX_TRANSFERS`, so compile and simulation time stay bounded
at any message size.

Reduce-scatter runs the trees of the reversed topology leaf to root, each rank
adding its children's partial sums to its own before it sends up.  Its order
is the all-gather's mirrored in time (:func:`_mirror`): the simulator times the
gather over the same trees on the reversed fabric, and the reduction sends in
the reverse order of the gather's finishing times.  Broadcast and reduce are
the same with one root and more trees.

Where hosts are joined rank to rank (TE-CCL's and TACCL's multi-chassis
models), all-gather and reduce-scatter are also built over the shallow hosted
trees of :mod:`topocc.planner.compiler.algorithms._hosted`, when they load no
link more, and the schedule predicted faster is kept.

All-reduce is reduce-scatter then all-gather over the same trees, the second
phase on its own channel.  Where ranks differ in what they can take in (a
mesh's corner routers, a rack of fewer hosts behind as many uplinks), each
phase packed on its own loads the weakest ranks with ``(p-1)/p`` of the data
twice; the two phases' trees are then packed together
(:func:`~topocc.planner.compiler.algorithms._arborescence.pack_phases`), so that the
reduction's trees make those ranks leaves, and the phases run overlapped, unit
tree by unit tree (:data:`JOINT_LAG`), as the joint packing assumes.  On a
full-duplex fabric it may instead pack
*undirected* spanning trees: each piece of data is reduced up a tree to the
tree's centre and broadcast back down the same tree, so every tree edge
carries the piece once each way (2(p-1) crossings per element, which is what
:mod:`topocc.planner.analysis.bounds` charges; by Nash-Williams and Tutte the best packing
meets the partition bound when the candidate edges allow it).  Unlike
reduce-scatter followed by all-gather no rank has to receive ``2 (p-1)/p N``:
a leaf sends N and receives N, which wins where ranks' capacities differ
(a mesh's corners and edges).  The packing comes from minimum spanning trees
under multiplicative link prices and one small LP that weighs them
(:func:`pack_undirected`).  It costs 4 (p-1) operations per piece and needs
many pieces, so it is used only while the budget holds
:data:`MIN_UNDIRECTED_PIECES` of them and its load is clearly lower
(:data:`UNDIRECTED_GAIN`).  On a torus or mesh of more ranks than that budget
serves, the trees are instead one tree's images under the grid's symmetries
(:mod:`~topocc.planner.compiler.algorithms._even_trees`): equal weights, so each
carries as many pieces, within a larger budget (:data:`EVEN_TRANSFERS`), the
first and last of each tree smaller (:data:`EVEN_ENDS`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.algorithms._arborescence import Packing, pack, pack_phases, rank_graph
from topocc.planner.compiler.algorithms._even_trees import even_trees
from topocc.planner.compiler.algorithms._hosted import hosted_packing
from topocc.planner.compiler.algorithms._order import depth_order
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Memo, Network
from topocc.planner.solvers import LinearProgram, SolverOptions, solve
from topocc.runtime.collective import ALLREDUCE
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["Undirected", "pack_undirected", "treepack", "treepack_link_floor"]

#: Tree edges x pieces per schedule (each a send and a receive): what bounds compile and simulation time.
#: 2^15 transfers make about 65k operations, which keeps a schedule's simulation short.
MAX_TRANSFERS = 1 << 15
#: Transfers with one piece per root (p (p-1) per phase) are the least a tree schedule needs; above this
#: many the schedule would take minutes to simulate and prove, and treepack declines (all-reduce beyond
#: about 360 ranks, all-gather and reduce-scatter beyond about 510).
MAX_LEAST_TRANSFERS = 1 << 18
#: Spanning trees per root, when the budget allows: more trees let the packing follow fractional optima
#: (an integral packing of one tree per root can load a link a whole tree more than the optimum).  A lone
#: root (broadcast, reduce) needs more to use every link into a host.
UNITS = 4
ROOTED_UNITS = 16
#: Relative sizes of the pieces a tree's share is cut into, in sending order (see the module docstring):
#: many equal pieces, then two halves and a quarter.  The small last pieces let the links' queues drain in
#: small steps; two equal halves rather than a halving run ease a reduction's start (the gather's end,
#: mirrored) at no more operations.  Where the budget allows fewer pieces, the shape's tail is used.
PIECE_SHAPE = (4,) * 13 + (2, 2, 1)
#: No piece smaller than this: below it per-message latency outweighs what pipelining gains.
MIN_PIECE_BYTES = 64 << 10
#: In a reduction a rank may start a send once the send two before it to the same peer has completed: the
#: order :func:`_mirror` plans is kept (a send queued behind a later one would hold up its whole subtree),
#: while one message's latency overlaps the next one's transfer.  Strict order (one ahead) loses that
#: overlap; no order at all loses far more.
SEND_AHEAD = 2
#: Channels by a sender's depth in the tree: roots, ranks one hop down, all deeper ones.  Separate
#: connections share a link fairly where one connection serves its messages first come, first served, so
#: forwarded pieces do not queue behind every piece a root injects at the start; a channel per depth gains
#: nothing more and slows the simulation down.
DEPTH_CHANNELS = 3
#: Broadcast and reduce have one root, so their trees pipeline equal pieces: at most this many per tree.
MAX_ROOTED_PIECES = 64
#: The hosted trees (:mod:`topocc.planner.compiler.algorithms._hosted`): a unit tree per rank of the largest host,
#: their pieces halving to the end, within half as many transfers again as :data:`MAX_TRANSFERS`.  Their trees take
#: a hop or two per host, so the pieces' sizes decide the pipeline's tail: two DGX-2 chassis as TE-CCL
#: models them, all-gather of 1 GB, reached 98.7% of the bound in two pieces (2:1), 99.4% in three (4:2:1).
HOSTED_SHAPE = (8, 4, 2, 1)
HOSTED_TRANSFERS = MAX_TRANSFERS * 3 // 2

#: CLP solves the tree-weighing LPs several times faster than GLOP and HiGHS.
DEFAULT_SOLVER = SolverOptions(backend="clp", time_limit_s=15.0)
#: A tiny cost per unit of edge latency, so that among equally loaded undirected trees short hops win.
LATENCY_WEIGHT = 1e-3
#: All-reduce over undirected trees: piece size, and the fewest pieces that pay for its 4 (p-1) operations
#: per piece (every tree fills and drains its pipeline once, which many pieces amortise).
ALLREDUCE_PIECE_BYTES = 64 << 10
MIN_UNDIRECTED_PIECES = 512
#: An all-reduce's two phases are packed together
#: (:func:`~topocc.planner.compiler.algorithms._arborescence.pack_phases`) where that loads the busiest link
#: less than this fraction of what packing each on its own does.
JOINT_GAIN = 0.98
#: ... on messages this large or larger: on smaller ones latency, not the busiest link, decides, and the second
#: packing only costs time.
JOINT_FROM_BYTES = 16 << 20
#: Jointly packed, unit tree j's reduction waits for unit tree j - JOINT_LAG's gather (see :func:`_rooted`),
#: so that the gather keeps ahead and both phases share the links throughout, as the joint packing assumes.
#: Two units did best of the lags tried (docs/algorithms.md, treepack).
JOINT_LAG = 2
#: A rank sends a piece up only once it has the result of the piece ``window`` before it (credits, as
#: NCCL's bounded slots): otherwise reductions race ahead of broadcasts on shared links and starve them.
#: WINDOW at 1024 pieces, growing as pieces^0.7: a small window stalls the pipeline, a large one lets the
#: reductions run ahead again (docs/algorithms.md, treepack).
WINDOW = 96
#: Undirected trees are used only when their busiest link carries less than this fraction of what
#: reduce-scatter + all-gather put on theirs: they need many more pieces to pipeline.
UNDIRECTED_GAIN = 0.95
#: Up to this many ranks undirected trees also win ties: their trees are shallow and the budget holds
#: thousands of pieces.
UNDIRECTED_TIES_UP_TO = 8
#: Undirected trees whose weights differ more than this (heaviest / lightest) run far below their load: links
#: are shared per connection, not per tree weight, so light trees take more than their share where they
#: meet heavy ones.  Such a packing is kept only if it beats the jointly packed rooted trees by
#: :data:`UNDIRECTED_GAIN`.
UNEVEN_TREES = 2.0
#: Multiplicative-weights rounds that generate candidate undirected trees, and the price step per round
#: (relative to the round's busiest link); the final LP picks among the trees found.
MWU_ROUNDS = 120
MWU_STEP = 0.1
#: Even trees (:mod:`~topocc.planner.compiler.algorithms._even_trees`), on a torus or mesh whose ranks are too many
#: for :data:`MAX_TRANSFERS` to hold :data:`MIN_UNDIRECTED_PIECES`: each of their many equal trees needs pieces
#: of its own to pipeline, so they get this larger budget (the 4x4x4 mesh's all-reduce of 256 MiB, 48 trees:
#: 81% of the bound in 480 equal pieces, 88% in 960, 90% in 1440; this budget makes 1536 there) ...
EVEN_TRANSFERS = 3 << 16
#: ... are used only where it holds this many pieces per tree ...
EVEN_PIECES_PER_TREE = 16
#: ... their window (see :data:`WINDOW`) is this many pieces of every tree (the same all-reduce in 1536 pieces
#: graded as below: 3 a tree 91.9%, 4 92.3%, 5 91.9%, 6 92.1%) ...
EVEN_WINDOW = 4
#: ... and their pieces are these many chunks, from either end of a tree's run inward: the first and last are
#: a quarter and a half of the others, so the pipeline fills and drains in small steps (the same all-reduce in
#: 1536 pieces: 92.3% against 91.8% in equal pieces; 1, 2, 4, 8 at each end 91.9%).
EVEN_ENDS = (1, 2, 4)
#: Undirected trees lighter than this (after the LP) are dropped and the rest rescaled.
MIN_TREE_WEIGHT = 1e-3
#: Fewest undirected trees whose best weighting is within this fraction of the optimum over all trees found
#: (fewer trees pipeline better).
TREE_SLACK = 0.002


# --------------------------------------------------------------------------- rooted trees


@dataclass(frozen=True, slots=True)
class _Pieces:
    """How a root's block is cut: ``units`` trees, each carrying pieces of ``shape`` chunks, in that order."""

    units: int
    shape: tuple[int, ...]

    @property
    def per_unit(self) -> int:
        return sum(self.shape)

    @property
    def per_root(self) -> int:
        return self.units * self.per_unit

    def offsets(self) -> list[int]:
        """Chunk offset of each piece within its tree's share."""
        return [sum(self.shape[:i]) for i in range(len(self.shape))]


def _cut(p: int, roots: int, block_bytes: float, options: Options) -> _Pieces:
    """Trees per root and piece shape within :data:`MAX_TRANSFERS` and :data:`MIN_PIECE_BYTES`.

    ``roots`` counts the trees' roots (twice over for all-reduce, which runs
    two phases over them).

    ``options.pipeline`` fixes the pieces per tree (equal pieces); ``options.channels``
    the trees per root.
    """
    per_root = max(1, MAX_TRANSFERS // (roots * (p - 1)))
    most = max(1, int(block_bytes // MIN_PIECE_BYTES))
    units = options.channels or max(1, min(ROOTED_UNITS if roots == 1 else UNITS, per_root, most))
    if options.pipeline:
        return _Pieces(units, (1,) * options.pipeline)
    if roots == 1:
        q = max(1, min(MAX_ROOTED_PIECES, per_root // units, most // units))
        return _Pieces(units, (1,) * q)
    for q in range(len(PIECE_SHAPE), 0, -1):
        shape = PIECE_SHAPE[-q:]
        if units * q <= per_root and block_bytes / units * shape[-1] / sum(shape) >= MIN_PIECE_BYTES:
            return _Pieces(units, shape)
    return _Pieces(units, (1,))


def _pieces_in_order(packing: Packing, cut: _Pieces, units: Sequence[int] | None = None,
                     ) -> Iterator[tuple[int, int, int, int, list[tuple[int, int]]]]:
    """(root, chunk offset of the piece in the root's block, its chunks, step, tree edges) in sending order,
    over the unit trees ``units`` (None: all).

    Piece by piece (largest first), within a piece tree by tree, within a tree
    root by root, so every root's data is in flight from the start.
    """
    units = range(cut.units) if units is None else units
    orders = {(r, j): _outward(packing.parents(r, j), r) for r in packing.roots for j in units}
    for i, (size, offset) in enumerate(zip(cut.shape, cut.offsets())):
        for j in units:
            for r in packing.roots:
                yield r, j * cut.per_unit + offset, size, i, orders[r, j]


_Transfer = tuple[int, int, int, int, int, int, int]  # root, offset in its block, chunks, step, parent, child, channel


def _gather(b: ScheduleBuilder, packing: Packing, cut: _Pieces, block: int, *, source: str, channel: int = 0,
            step0: int = 0, channels: int = DEPTH_CHANNELS, unit: int | None = None,
            received: dict[tuple[int, int, int, int], int] | None = None) -> dict[tuple[int, int], _Transfer]:
    """Root to leaves: each root's block (``block`` chunks from chunk ``r * block`` of the output, one root:
    from 0) travels down its trees; the root reads its piece from buffer ``source``.  Messages use
    channels ``channel`` to ``channel + channels - 1`` by the sender's depth.  With ``unit``, only the
    unit trees of that index; ``received`` gets each receive as (rank, root, unit, piece) -> operation index.

    Returns each transfer by its send: (rank, operation index) -> transfer.
    """
    rooted = len(packing.roots) == 1
    sends: dict[tuple[int, int], _Transfer] = {}
    for r, offset, size, i, order in _pieces_in_order(packing, cut, None if unit is None else (unit,)):
        c = offset if rooted else r * block + offset
        out = Chunk("o", c, size)
        if source != "o":
            b.copy(r, Chunk(source, offset, size), out, step=step0 + i)
        depth = {r: 0}
        for parent, child in order:
            depth[child] = depth[parent] + 1
            ch = channel + min(depth[parent], channels - 1)
            send, recv = b.transfer(parent, child, out, out, step=step0 + i, channel=ch)
            sends[parent, send] = (r, offset, size, i, parent, child, ch)
            if received is not None:
                received[child, r, offset // cut.per_unit, i] = recv
    return sends


def _mirror(net: Network, packing: Packing, cut: _Pieces, block: int, size_bytes: int) -> list[_Transfer]:
    """The transfers of a reduction over ``packing``'s trees (of the reversed fabric), in the order to send them.

    A reduction up trees is a gather down them run backwards in time, with each
    message reversed: the gather's link use mirrored, so just as fast.  The
    gather is timed by the simulator on the reversed fabric (whose routes are
    the reversed routes), where its greedy first-come-first-served dynamics
    keep every link busy; the reduction sends in the reverse order of the
    gather's finishing times.  (Run forwards with the same greedy dynamics, a
    reduction first floods every link with leaves' sums and leaves the sums of
    inner ranks queued behind them, far below the gather's speed.)
    """
    topology = net.topology
    p = topology.size
    rooted = len(packing.roots) == 1
    blocks = 1 if rooted else p
    gather = ScheduleBuilder("broadcast" if rooted else "allgather", p, block, block * blocks,
                             root=packing.roots[0] if rooted else None)
    sends = _gather(gather, packing, cut, block, source="i", channels=1)
    finish: dict[tuple[int, int], float] = {}

    def arrived(src: int, send: int, dst: int, recv: int, start_s: float, sent_s: float, end_s: float) -> None:
        finish[src, send] = end_s  # a send completes as its message arrives

    # the lean hook rather than ``record``, which keeps every operation's and flow's interval (a third of the time)
    simulate(net.reversed(), gather.build("treepack"), size_bytes, on_message=arrived)
    return [sends[key] for key in sorted(sends, key=lambda key: (-finish[key], key))]


def _spare_slots(packing: Packing, cut: _Pieces) -> tuple[dict[tuple[int, int, int, int], int], int]:
    """A scratch slot (one tree's share of chunks) for every child of a rank beyond its first, per tree.

    Returns ``(rank, root, unit, child) -> slot`` and the most slots any rank uses.
    """
    p = packing.graph.size
    slot: dict[tuple[int, int, int, int], int] = {}
    used = [0] * p
    for j in range(cut.units):
        for r in packing.roots:
            first: set[int] = set()
            for child, parent in sorted(packing.parents(r, j).items()):
                if parent in first:
                    slot[parent, r, j, child] = used[parent]
                    used[parent] += 1
                else:
                    first.add(parent)
    return slot, max(used)


def _scatter(b: ScheduleBuilder, packing: Packing, cut: _Pieces, block: int, acc: str, spare: int,
             order: list[_Transfer], *, sent: dict[tuple[int, int, int], list[int]] | None = None,
             wait: dict[tuple[int, int, int, int], int] | None = None) -> None:
    """Leaves to root: partial sums of each root's block in buffer ``acc`` flow up its (reversed) trees.

    ``order`` is :func:`_mirror`'s.  A rank's first child's sum is
    received-and-reduced into the rank's own; the others land in scratch slots
    (from chunk ``spare`` on) and are reduced locally, so all children of a
    rank can send at once instead of queueing on the accumulator (a receive
    completes only with its send).  ``sent`` keeps each connection's sends
    across calls; with ``wait`` (a :func:`_gather`'s ``received``) a rank sends
    a piece of unit tree j only once it has received the same piece of unit
    tree ``j -`` :data:`JOINT_LAG` of that root back.
    """
    rooted = len(packing.roots) == 1
    slots, _ = _spare_slots(packing, cut)
    sent = {} if sent is None else sent
    for r, offset, size, i, parent, child, channel in order:
        ref = Chunk(acc, offset if rooted else r * block + offset, size)
        step = len(cut.shape) - 1 - i
        before = sent.setdefault((child, parent, channel), [])
        gate = before[-SEND_AHEAD:-SEND_AHEAD + 1] if len(before) >= SEND_AHEAD else []
        back = None if wait is None else wait.get((child, r, offset // cut.per_unit - JOINT_LAG, i))
        if back is not None:
            gate = [*gate, back]
        before.append(b.send(child, parent, ref, step=step, channel=channel, after=gate))
        where = slots.get((parent, r, offset // cut.per_unit, child))
        if where is None:
            b.recv(parent, child, ref, reduce=True, step=step, channel=channel)
        else:
            tmp = Chunk("s", spare + where * cut.per_unit + offset % cut.per_unit, size)
            b.recv(parent, child, tmp, step=step, channel=channel)
            b.reduce(parent, tmp, ref, step=step)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a tree-packing schedule is built from: rooted packings with their cut (``down``: out-trees the
    data spreads on, ``up``: trees of the reversed fabric it is reduced on), or weighted ``undirected`` trees
    (all-reduce)."""

    cut: _Pieces | None = None
    down: Packing | None = None
    up: Packing | None = None
    undirected: Undirected | None = None
    joint: bool = False  # ``up`` and ``down`` packed together (all-reduce): its phases must overlap
    hosted: _Plan | None = None  # the hosted trees, where they load no link more: the faster schedule wins


#: The trees packed per (collective, size, channels, pipeline, root): ``auto`` packs them for
#: :func:`treepack_link_floor`, then builds the schedule from the same packing where it may win.
_PLANS: Memo[dict[tuple[object, ...], _Plan]] = Memo("treepack: plans", lambda net: {})


def _plan(net: Network, collective: str, options: Options) -> _Plan:
    """The trees of ``collective``'s schedule (see the module docstring), kept with the topology: ``auto``
    packs them for :func:`treepack_link_floor` and builds the schedule from the same packing where it may win."""
    key = (collective, options.size_bytes, options.channels, options.pipeline, options.root)
    plans = net.memo(_PLANS)
    found = plans.get(key)
    if found is None:
        found = plans[key] = _new_plan(net, collective, options)
    return found


def _new_plan(net: Network, collective: str, options: Options) -> _Plan:
    """The trees of :func:`_plan`, packed."""
    topology = net.topology
    p = topology.size
    if p == 1:
        raise NotApplicableError("tree packing needs at least two ranks")
    kind = describe(collective)
    if kind.exchanges:
        raise NotApplicableError("tree packing does not implement alltoall (use direct)")
    least = p * (p - 1) * (0 if kind.rooted else kind.passes)
    if least > MAX_LEAST_TRANSFERS:
        raise NotApplicableError(f"tree packing needs at least {least:,} transfers for {collective} on {p} ranks, "
                                 f"more than {MAX_LEAST_TRANSFERS:,}", fix="use hierarchical at this scale")
    rooted = kind.rooted
    roots = [options.root] if rooted else list(range(p))
    cut = _cut(p, len(roots) * kind.passes, options.size_bytes / len(roots), options)
    down = up = None
    if kind.replicates:
        down = pack(rank_graph(net), roots, cut.units)
    if kind.reduces:
        # on a full-duplex fabric the reversed graph is the same graph: reduce along the broadcast trees
        up = down if down is not None and topology.symmetric else pack(rank_graph(net, reverse=True),
                                                                       roots, cut.units)
    if kind is not ALLREDUCE:
        plan = _Plan(cut, down, up)
        return replace(plan, hosted=_hosted_plan(net, roots, options, plan))
    assert up is not None and down is not None
    wanted = min(MIN_UNDIRECTED_PIECES, max(1, options.size_bytes // ALLREDUCE_PIECE_BYTES))
    undirected = None
    if topology.symmetric and _undirected_pieces(p, options) >= wanted:
        undirected = pack_undirected(net)
    elif topology.symmetric and (even_pieces := _undirected_pieces(p, options, EVEN_TRANSFERS)) >= wanted:
        undirected = _even_undirected(net, even_pieces)
    if undirected is not None:
        # reduce-scatter + all-gather move 2 blocks of N/p per root over the rooted trees
        gain = 1 + 1e-9 if p <= UNDIRECTED_TIES_UP_TO else UNDIRECTED_GAIN
        if undirected.load < gain * 2 * down.load / p:
            weights = [w for w, _ in undirected.trees]
            if max(weights) <= UNEVEN_TREES * min(weights):
                return _Plan(undirected=undirected)
            joint = _joint(net, roots, cut, up, down, options)
            if joint is None or joint.up is None or joint.down is None:
                return _Plan(undirected=undirected)
            # the joint trees' busiest link per byte of the buffer, in the undirected load's units
            if undirected.load < gain * _phases_load(joint.up, joint.down) * down.graph.top_bandwidth / (p * cut.units):
                return _Plan(undirected=undirected)
            return joint
    return _joint(net, roots, cut, up, down, options) or _Plan(cut, down, up)


def _joint(net: Network, roots: list[int], cut: _Pieces, up: Packing, down: Packing,
           options: Options) -> _Plan | None:
    """All-reduce's two phases packed together
    (:func:`~topocc.planner.compiler.algorithms._arborescence.pack_phases`), where that loads the busiest link
    :data:`JOINT_GAIN` less than ``up`` and ``down`` packed on their own, from :data:`JOINT_FROM_BYTES` on."""
    if options.size_bytes < JOINT_FROM_BYTES:
        return None
    # the graphs the phases were packed on alone; on a full-duplex fabric both used the forward one
    reverse = rank_graph(net, reverse=True) if up is down else up.graph
    joint_up, joint_down = pack_phases([reverse, down.graph], roots, cut.units)
    if _phases_load(joint_up, joint_down) < JOINT_GAIN * _phases_load(up, down):
        return _Plan(cut, joint_down, joint_up, joint=True)
    return None


def _hosted_plan(net: Network, roots: list[int], options: Options, general: _Plan) -> _Plan | None:
    """All-gather's or reduce-scatter's hosted trees (see :data:`HOSTED_SHAPE`), where the fabric is hosts joined
    rank to rank and they load the busiest link no more than ``general``'s packings do; None elsewhere, on
    messages too small for a piece of :data:`MIN_PIECE_BYTES` per unit, and where the options pin the trees
    per root or the pieces."""
    topology = net.topology
    if options.channels or options.pipeline or len(roots) < 2:
        return None
    p = topology.size
    units = max(len(ranks) for ranks in topology.hosts.values())
    q = min(len(HOSTED_SHAPE), HOSTED_TRANSFERS // (len(roots) * (p - 1) * units))
    share = options.size_bytes / len(roots) / units  # one unit tree's bytes
    while q and share * HOSTED_SHAPE[-1] / sum(HOSTED_SHAPE[-q:]) < MIN_PIECE_BYTES:
        q -= 1
    if not q:
        return None
    found: list[Packing | None] = []
    for general_packing, reverse in ((general.down, False), (general.up, True)):
        if general_packing is None:
            found.append(None)
            continue
        hosted = hosted_packing(net, roots, units, reverse)
        if hosted is None or (hosted.load / hosted.graph.top_bandwidth
                              > general_packing.load / general_packing.graph.top_bandwidth * (1 + 1e-9)):
            return None
        found.append(hosted)
    return _Plan(_Pieces(units, HOSTED_SHAPE[-q:]), found[0], found[1])


def _faster(net: Network, options: Options, first: Schedule, second: Schedule) -> Schedule:
    """``second`` where it is predicted strictly faster than ``first``, else ``first`` (timed by the compilation's
    evaluator where there is one: it keeps the last schedule it timed, which the compiler then need not time
    again)."""
    def seconds(schedule: Schedule) -> float:
        if options.evaluator is not None:
            return options.evaluator.simulate(schedule).time_s
        return simulate(net, schedule, options.size_bytes).time_s

    return second if seconds(second) < seconds(first) else first


def _phases_load(*packings: Packing) -> float:
    """Seconds per byte of a root's unit tree share on the busiest link, all ``packings`` running at once."""
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    for packing in packings:
        graph = packing.graph
        per_link = sum((graph.arc_loads(arcs) for trees in packing.trees.values() for arcs in trees),
                       np.zeros(len(graph.links)))
        for key, x in zip(graph.links, per_link / graph.top_bandwidth):
            load.add(key, float(x))
    return load.busiest()


def _rooted(net: Network, collective: str, options: Options, plan: _Plan) -> Schedule:
    """All-gather, reduce-scatter, broadcast, reduce, and all-reduce as reduce-scatter + all-gather, over
    ``plan``'s packings."""
    topology = net.topology
    p = topology.size
    kind = describe(collective)
    rooted = kind.rooted
    cut, down, up = plan.cut, plan.down, plan.up
    assert cut is not None
    block = cut.per_root
    in_chunks, out_chunks = kind.sizes(p, p * block if kind is ALLREDUCE else block)
    spare = in_chunks if kind.scatters else 0
    extra = _spare_slots(up, cut)[1] * cut.per_unit if up is not None else 0
    b = ScheduleBuilder(kind.name, p, in_chunks, out_chunks, scratch_chunks=spare + extra,
                        root=options.root if rooted else None)
    if not kind.reduces:  # all-gather, broadcast: one gather
        assert down is not None
        _gather(b, down, cut, block, source="i")
    else:
        assert up is not None
        acc = "s" if kind.scatters else "o"
        for rank in range(p):
            b.copy(rank, Chunk("i", 0, in_chunks), Chunk(acc, 0, in_chunks))
        order = _mirror(net, up, cut, block, options.size_bytes)
        # the second phase has its own channel, so its messages never queue behind the first's; one, as
        # depth channels gain nothing here and, with the first phase's traffic, make the simulation much slower
        def second_phase(unit: int | None = None, received: dict[tuple[int, int, int, int], int] | None = None) -> None:
            assert down is not None
            _gather(b, down, cut, block, source="o", channel=1, step0=len(cut.shape), channels=1, unit=unit,
                    received=received)

        if plan.joint:
            # unit tree by unit tree, each reduction held back until the gather JOINT_LAG units before it is
            # under way, so that both phases share the links throughout as their packing assumes
            sent: dict[tuple[int, int, int], list[int]] = {}
            received: dict[tuple[int, int, int, int], int] = {}
            by_unit: list[list[_Transfer]] = [[] for _ in range(cut.units)]
            for t in order:
                by_unit[t[1] // cut.per_unit].append(t)
            for j in range(cut.units):
                _scatter(b, up, cut, block, acc, spare, by_unit[j], sent=sent, wait=received)
                second_phase(j, received)
        else:
            _scatter(b, up, cut, block, acc, spare, order)
            if kind.scatters:
                for rank in range(p):
                    b.copy(rank, Chunk("s", rank * block, block), Chunk("o", 0, block))
            if down is not None:
                second_phase()
    loads = [x.load for x in (down, up) if x is not None]
    return b.build("treepack", {**options.as_dict(), "trees_per_root": cut.units,
                                "pieces_per_tree": ":".join(map(str, cut.shape)),
                                "load": round(max(loads), 6),
                                "oracle": (down or up).oracle})  # type: ignore[union-attr]  # a plan has a phase


# --------------------------------------------------------------------------- undirected trees (all-reduce)


@dataclass(frozen=True, slots=True)
class Undirected:
    """Weighted undirected spanning trees: ``trees`` as (weight, parent map child -> parent from rank 0).

    ``load`` is the busiest link's load per unit of data, counting each tree
    edge both ways, in units of a link of the fastest bandwidth.  ``even``
    trees (:func:`_even_undirected`) weigh the same, and their schedule has
    its own budget and window.
    """

    trees: tuple[tuple[float, dict[int, int]], ...]
    load: float
    even: bool = False


def pack_undirected(net: Network, solver: SolverOptions | None = None) -> Undirected:
    """Undirected spanning trees for all-reduce, every tree edge carrying data both ways.

    The fractional packing is found by column generation without duals: a
    multiplicative-weights pass (Garg and Koenemann, "Faster and simpler
    algorithms for multicommodity flow", FOCS 1998) repeatedly takes the minimum
    spanning tree under link prices that grow with each link's load, and a small
    LP then weighs the trees found to minimise the busiest link's load.
    """
    topology = net.topology
    p = topology.size
    graph = rank_graph(net, both_ways=True)
    arc_of = {(int(u), int(v)): k for k, (u, v) in enumerate(zip(graph.tail, graph.head))}
    pairs = sorted((u, v) for u, v in arc_of if u < v and (v, u) in arc_of)
    both = [(arc_of[u, v], arc_of[v, u]) for u, v in pairs]
    latency = np.array([graph.latency[a] + graph.latency[b] for a, b in both])
    tie = 1.0 + LATENCY_WEIGHT * latency / (latency.max() or 1.0)
    columns: dict[tuple[int, ...], np.ndarray] = {}
    price = np.ones(len(graph.links))
    for _ in range(MWU_ROUNDS):
        arc_price = graph.arc_prices(price)
        cost = [(arc_price[a] + arc_price[b]) * t for (a, b), t in zip(both, tie)]
        chosen = _spanning_tree(p, pairs, cost)
        if chosen is None:
            raise NotApplicableError("tree packing: the ranks are not connected by routes both ways",
                                     fix="all-reduce tree packing needs full-duplex routes; try ring or mcf")
        load = graph.arc_loads([a for e in chosen for a in both[e]])
        price *= np.exp(MWU_STEP * load / load.max())
        columns.setdefault(tuple(chosen), load)
    keys = list(columns)
    loads = [columns[key] for key in keys]
    weights, best = _weigh(loads, solver)
    # fewer trees pipeline better (each keeps more pieces in flight): keep the heaviest few that stay
    # within TREE_SLACK of the optimum
    ranked = sorted(range(len(loads)), key=lambda j: -weights[j])
    lo, hi = 1, len(ranked)
    kept: tuple[list[float], float, list[int]] = (weights, best, list(range(len(loads))))
    while lo < hi:
        mid = (lo + hi) // 2
        w, value = _weigh([loads[j] for j in ranked[:mid]], solver)
        if value <= best * (1 + TREE_SLACK):
            kept, hi = (w, value, ranked[:mid]), mid
        else:
            lo = mid + 1
    w, value, chosen_columns = kept
    trees = [(w[n], _parent_map(p, [pairs[e] for e in keys[j]])) for n, j in enumerate(chosen_columns)
             if w[n] > MIN_TREE_WEIGHT]
    total = sum(x for x, _ in trees)
    return Undirected(tuple((x / total, parent) for x, parent in trees), value * total)


def _even_undirected(net: Network, pieces: int) -> Undirected | None:
    """The grid's even trees (:func:`~topocc.planner.compiler.algorithms._even_trees.even_trees`) as an undirected
    packing of equal weights; None where the fabric has none, or ``pieces`` are fewer than
    :data:`EVEN_PIECES_PER_TREE` per tree."""
    found = even_trees(net)
    if found is None or pieces < EVEN_PIECES_PER_TREE * len(found.trees):
        return None
    p = net.topology.size
    return Undirected(tuple((1 / len(found.trees), _parent_map(p, list(edges))) for edges in found.trees), found.load,
                      even=True)


def _weigh(columns: list[np.ndarray], solver: SolverOptions | None) -> tuple[list[float], float]:
    """Tree weights summing to 1 that minimise the busiest link's load, and that load."""
    lp = LinearProgram()
    t = lp.var(cost=1.0)
    weight = [lp.var() for _ in columns]
    lp.add_eq([(w, 1.0) for w in weight], 1.0)
    matrix = np.array(columns)
    for link in range(matrix.shape[1]):
        used = np.flatnonzero(matrix[:, link])
        if len(used):
            lp.add_le([*((weight[j], float(matrix[j, link])) for j in used), (t, -1.0)], 0.0)
    values = solve(lp, solver or DEFAULT_SOLVER).values
    return [float(values[w]) for w in weight], float(values[t])


def _spanning_tree(p: int, pairs: list[tuple[int, int]], cost: list[float]) -> list[int] | None:
    """Kruskal: indices into ``pairs`` of a minimum spanning tree under ``cost``, None if disconnected."""
    leader = list(range(p))

    def find(a: int) -> int:
        while leader[a] != a:
            leader[a] = leader[leader[a]]
            a = leader[a]
        return a

    chosen: list[int] = []
    for e in sorted(range(len(pairs)), key=lambda e: (cost[e], e)):
        a, b = find(pairs[e][0]), find(pairs[e][1])
        if a != b:
            leader[a] = b
            chosen.append(e)
    return chosen if len(chosen) == p - 1 else None


def _bfs_tree(p: int, root: int, edges: list[tuple[int, int]]) -> dict[int, int] | None:
    """Child -> parent of a breadth-first tree from ``root`` over directed ``edges``; None unless it spans."""
    adjacency: dict[int, list[int]] = {}
    for u, v in edges:
        adjacency.setdefault(u, []).append(v)
    parent: dict[int, int] = {}
    seen = {root}
    queue = deque([root])
    while queue:
        u = queue.popleft()
        for v in adjacency.get(u, ()):
            if v not in seen:
                seen.add(v)
                parent[v] = u
                queue.append(v)
    return parent if len(seen) == p else None


def _parent_map(p: int, edges: list[tuple[int, int]]) -> dict[int, int]:
    """The undirected tree ``edges`` as child -> parent from rank 0."""
    tree = _bfs_tree(p, 0, [*edges, *((v, u) for u, v in edges)])
    assert tree is not None  # a spanning tree spans
    return tree


def _outward(parent: dict[int, int], root: int) -> list[tuple[int, int]]:
    """Tree edges (parent, child) from the root outward, breadth first, siblings by rank."""
    return [(parent[v], v) for v in depth_order(root, dict(sorted(parent.items())))]


def _centred(net: Network, parent: dict[int, int]) -> list[tuple[int, int]]:
    """The tree's edges (parent, child) outward from its latency centre, the root that makes pipelines shortest.

    A piece's reduce and broadcast both take the tree's height from the root, so
    the root is the rank of smallest eccentricity (route latencies, then hops).
    """
    adjacency: dict[int, list[int]] = {}
    for child, par in parent.items():
        adjacency.setdefault(child, []).append(par)
        adjacency.setdefault(par, []).append(child)

    def eccentricity(start: int) -> tuple[float, int]:
        far, hops = 0.0, 0
        stack = [(start, -1, 0.0, 0)]
        while stack:
            u, came, dist, depth = stack.pop()
            far, hops = max(far, dist), max(hops, depth)
            stack.extend((v, u, dist + net.route_latency(u, v), depth + 1) for v in adjacency[u] if v != came)
        return round(far, 12), hops

    root = min(sorted(adjacency), key=eccentricity)
    rerooted = _bfs_tree(len(adjacency), root, [(u, v) for u in adjacency for v in adjacency[u]])
    assert rerooted is not None  # a spanning tree spans
    return _outward(rerooted, root)


def _assign_pieces(weights: list[float], pieces: int) -> list[int]:
    """Largest-remainder split of ``pieces`` among trees by weight: how many pieces each tree carries."""
    quotas = [w * pieces for w in weights]
    counts = [int(q) for q in quotas]
    for i in sorted(range(len(weights)), key=lambda i: counts[i] - quotas[i])[: pieces - sum(counts)]:
        counts[i] += 1
    return counts


def _interleave(counts: list[int]) -> list[int]:
    """Tree index of every piece, the trees' pieces spread evenly over the sequence (each tree keeps busy)."""
    slots = sorted(((j + 0.5) / n, i) for i, n in enumerate(counts) for j in range(n))
    return [i for _, i in slots]


def _undirected_pieces(p: int, options: Options, transfers: int = MAX_TRANSFERS) -> int:
    """Pieces of :data:`ALLREDUCE_PIECE_BYTES`, at most what ``transfers`` allows (2 (p-1) each)."""
    if options.pipeline:
        return options.pipeline
    return max(1, min(transfers // (2 * (p - 1)), options.size_bytes // ALLREDUCE_PIECE_BYTES))


def _tree_pieces(p: int, packing: Undirected, options: Options) -> tuple[int, list[int]]:
    """How many pieces an undirected packing's schedule cuts, and how many each tree carries.  Even trees carry
    as many each (a tree with one piece more than the others finishes a piece's time late)."""
    k = _undirected_pieces(p, options, EVEN_TRANSFERS if packing.even else MAX_TRANSFERS)
    if packing.even and k >= len(packing.trees):
        k -= k % len(packing.trees)
    return k, _assign_pieces([w for w, _ in packing.trees], k)


def _allreduce(net: Network, packing: Undirected, options: Options) -> Schedule:
    """All-reduce over undirected packed trees: each piece reduced up its tree, then broadcast down it.

    On even trees a rank receives each child's sum into a scratch slot of its own and reduces it in
    locally: received straight into the piece, the children's sums would arrive one after the other, each
    waiting for the last to land.  A slot per tree and child position: the next piece of a tree from that
    child lands once the last has been reduced, which keeps a fast subtree from running ahead of its
    siblings.  A weighted packing's few heavy trees keep receiving into the piece (docs/algorithms.md,
    treepack).
    """
    topology = net.topology
    p = topology.size
    k, counts = _tree_pieces(p, packing, options)
    used = [(parent, n) for (_, parent), n in zip(packing.trees, counts) if n]
    orders = [_centred(net, parent) for parent, _ in used]
    trees = _interleave([n for _, n in used])
    # pieces in units of chunks: even trees' pieces are graded at both ends of each tree's run (they go round
    # robin, so piece c is its tree's c // len(used)-th), every other piece is one chunk
    units = [_graded(c // len(used), k // len(used)) if packing.even else 1 for c in range(k)]
    total, widest = sum(units), max(units)
    # even trees' scratch: a slot per tree and child position (the most children a rank has in a tree), of
    # the largest piece
    children = max(max(Counter(par for par, _ in order).values()) for order in orders)
    slots = children * len(used) * widest if packing.even else 0
    b = ScheduleBuilder("allreduce", p, total, total, scratch_chunks=slots)
    for rank in range(p):
        b.copy(rank, Chunk("i", 0, total), Chunk("o", 0, total))
    window = EVEN_WINDOW * len(used) if packing.even else max(WINDOW, round(WINDOW * (k / 1024) ** 0.7))
    done: list[list[int]] = [[] for _ in range(p)]  # per rank, its last op on each piece, in piece order
    offset = 0
    for i, n in zip(trees, units):
        piece = Chunk("o", offset, n)
        offset += n
        nth: Counter[int] = Counter()  # children of each rank so far in this tree
        for par, child in reversed(orders[i]):  # deepest edges first: a node has all its children's sums
            gate = done[child][-window:-window + 1] if len(done[child]) >= window else []
            b.send(child, par, piece, step=0, channel=0, after=gate)
            if not slots:
                b.recv(par, child, piece, reduce=True, step=0, channel=0)
                continue
            slot = Chunk("s", (nth[par] * len(used) + i) * widest, n)
            nth[par] += 1
            b.recv(par, child, slot, step=0, channel=0)
            b.reduce(par, slot, piece, step=0)
        root = orders[i][0][0]
        for par, child in orders[i]:
            b.send(par, child, piece, step=1, channel=1)
            done[child].append(b.recv(child, par, piece, step=1, channel=1))
        done[root].append(len(b.programs[root]) - 1)
    return b.build("treepack", {**options.as_dict(), "pieces": k, "trees": len(used),
                                "load": round(packing.load, 6)})


def _graded(j: int, n: int) -> int:
    """Chunks in the ``j``-th of a tree's ``n`` pieces: :data:`EVEN_ENDS` from either end, the last of them
    in between."""
    return EVEN_ENDS[min(j, n - 1 - j, len(EVEN_ENDS) - 1)]


def treepack(net: Network, collective: str, options: Options) -> Schedule:
    """Tree-packing schedule for ``collective`` (see the module docstring).

    >>> treepack(load_topology("topologies/ndv2-2chassis.yaml"), "allgather", Options())  # doctest: +SKIP
    """
    plan = _plan(net, collective, options)
    if plan.undirected is not None:
        return _allreduce(net, plan.undirected, options)
    schedule = _rooted(net, collective, options, plan)
    if plan.hosted is None:
        return schedule
    return _faster(net, options, schedule, _rooted(net, collective, options, plan.hosted))


def treepack_link_floor(net: Network, collective: str, options: Options) -> float:
    """A lower bound of :func:`topocc.planner.compiler.evaluate.link_time` of the schedule, from its trees alone.

    Every tree edge carries its tree's share of the data (each way, for an
    undirected tree); only the links that every cheapest path of the edge's pair
    crosses (:meth:`Topology.common_links`) are counted, so the bound holds under
    any routing and channel assignment.  The packing is kept for the build; the
    schedule's ordering (a simulation of the gather, for reductions) and its
    operations are what ``auto`` saves where this already loses.
    """
    topology = net.topology
    plan = _plan(net, collective, options)
    size = options.size_bytes
    if plan.undirected is not None:
        # a tree's pieces (of N / k bytes each) cross each of its edges both ways
        traffic: dict[tuple[int, int], float] = {}
        k, counts = _tree_pieces(topology.size, plan.undirected, options)
        for (_, parents), n in zip(plan.undirected.trees, counts):
            for child, par in parents.items():
                for pair in ((child, par), (par, child)):
                    traffic[pair] = traffic.get(pair, 0.0) + n * size / k
        return net.common_link_time((a, b, nbytes) for (a, b), nbytes in traffic.items())
    # the schedule is built from the plan or from its hosted trees, whichever is faster
    return min(net.common_link_time((a, b, nbytes) for (a, b), nbytes in _rooted_traffic(option, size).items())
               for option in (plan, plan.hosted) if option is not None)


def _rooted_traffic(plan: _Plan, size: int) -> dict[tuple[int, int], float]:
    """Bytes per rank pair of a schedule over ``plan``'s rooted packings."""
    assert plan.cut is not None
    traffic: dict[tuple[int, int], float] = {}
    for packing, toward_root in ((plan.down, False), (plan.up, True)):
        if packing is None:
            continue
        # each unit tree of a root carries that root's block over its edges: N / (roots x units) bytes
        share = size / (len(packing.roots) * plan.cut.units)
        for r in packing.roots:
            for j in range(plan.cut.units):
                for child, parent in packing.parents(r, j).items():
                    pair = (child, parent) if toward_root else (parent, child)
                    traffic[pair] = traffic.get(pair, 0.0) + share
    return traffic
