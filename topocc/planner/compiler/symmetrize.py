"""Find the rank classes of a compiled schedule and write it in the symmetric form.

Ranks whose programs differ only in their peers and chunk indices, and there by affine formulas of the ranks'
coordinates on a grid (:mod:`topocc.runtime.symmetric`), form a class stored once.  The grids tried come from
the topology (:func:`grid_shapes`).  Programs are first put in a canonical order (:func:`canonical_order`), then
each class is found by fitting: a formula's coefficient along a dimension is the difference between a rank
and its neighbour there, and every member is checked against the fitted formulas, so a rank is put in a class
only where its class's template gives exactly its (canonically ordered) program.  Ranks the formulas miss
start classes of their own.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from topocc.planner.analysis.automorphisms import has_symmetries
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology
from topocc.runtime.matching import StreamKey, stream_key
from topocc.runtime.plan import Plan
from topocc.runtime.schedule import Op, Schedule, operation
from topocc.runtime.symmetric import Field, Formula, SymmetricPrograms, Symmetry, TemplateOp, TemplateRef, grid_strides

__all__ = ["CLASS_BUILD_MIN_RANKS", "SYMMETRIC_MIN_RANKS", "builds_by_class", "canonical_order", "fitting_ranks",
           "grid_shapes", "one_class", "symmetric_form", "symmetric_plan", "symmetrize"]

#: Schedules of fewer ranks are written rank by rank: their files are small either way.
SYMMETRIC_MIN_RANKS = 64
#: Most classes a grid may need before it is given up (a schedule with little symmetry stays per rank).
MAX_CLASSES = 256
#: Ranks whose formulas are checked at once (bounds the checking's temporary arrays).
_BLOCK = 512

#: The fields of an operation that are the same on every rank of a class.
_Skeleton = tuple[Any, ...]


def grid_shapes(topo: Topology) -> list[tuple[int, ...]]:
    """The grids to try for ``topo``'s ranks: its hierarchy (:attr:`~topocc.planner.topology.model.Topology.levels`)
    with each level split into its prime factors, powers of two last, so that halving-doubling's partner (a
    rank with one bit of its position flipped) is a neighbour along one dimension of two; then the hierarchy
    itself, fewer coefficients per formula, taken where it stores fewer operations."""
    levels = topo.levels
    fine = tuple(f for n in levels for f in _factors(n))
    return [fine, levels] if fine != levels else [fine]


def _factors(n: int) -> list[int]:
    """``n``'s prime factors, the odd ones first (largest first), then its twos."""
    out, twos, f = [], 0, 3
    while n % 2 == 0:
        n, twos = n // 2, twos + 1
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 2
    if n > 1:
        out.append(n)
    return sorted(out, reverse=True) + [2] * twos


def symmetric_form(schedule: Schedule, topo: Topology, min_ranks: int = SYMMETRIC_MIN_RANKS) -> Schedule:
    """``schedule`` as it is best written: symmetric (over ``topo``'s grids) where it has at least
    ``min_ranks`` ranks and that form stores at most half its operations, else as it is."""
    if schedule.ranks < min_ranks or schedule.symmetry is not None:
        return schedule
    return symmetrize(schedule, grid_shapes(topo))


def symmetric_plan(plan: Plan, topo: Topology) -> Plan:
    """``plan`` with each bucket's schedule as :func:`symmetric_form` writes it (``plan`` itself where none
    changes)."""
    written = tuple(symmetric_form(s, topo) for s in plan.schedules)
    return plan if all(a is b for a, b in zip(written, plan.schedules)) else Plan(written)


def symmetrize(schedule: Schedule, shapes: Iterable[tuple[int, ...]]) -> Schedule:
    """``schedule`` in the symmetric form over the best of ``shapes`` (fewest stored operations, the first of
    equals), or ``schedule`` itself where no grid stores at most half its operations, or where it records
    paths (which the symmetric form does not hold)."""
    if schedule.paths or schedule.symmetry is not None:
        return schedule
    total = schedule.op_count
    programs = tuple(canonical_order(p) for p in schedule.programs)
    groups = _skeleton_groups(programs)
    limits = {"i": schedule.input_chunks, "o": schedule.output_chunks, "s": schedule.scratch_chunks}
    best: Symmetry | None = None
    budget = total // 2
    for shape in shapes:
        if math.prod(shape) != schedule.ranks:
            continue
        found = _classes(programs, groups, shape, limits, budget)
        if found is not None:  # within the budget; a later grid must store fewer to be taken
            best, budget = found, sum(len(t) for t in found.templates) - 1
    if best is None:
        return schedule
    return Schedule(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks,
                    SymmetricPrograms(best), schedule.scratch_chunks, schedule.root, schedule.inplace,
                    schedule.metadata, (), best)


#: From this many ranks, on a sprayed fabric with symmetries, an algorithm that can builds its schedule for a
#: few ranks and fits it as one class of the symmetric form (:func:`builds_by_class`).
CLASS_BUILD_MIN_RANKS = 1024


def builds_by_class(net: Network) -> bool:
    """Whether to build a schedule as one class, from the programs of the few ranks that fit it
    (:func:`fitting_ranks`, :func:`one_class`), before building every rank's: on a large sprayed fabric with
    symmetries (:func:`~topocc.planner.analysis.automorphisms.has_symmetries`), where the compiler keeps and
    times the symmetric form anyway and every rank's program would cost most of the compile.  The form so
    fitted is what is proved, timed and written."""
    topo = net.topology
    return topo.size >= CLASS_BUILD_MIN_RANKS and topo.routing == "spray" and has_symmetries(net)


def fitting_ranks(shape: tuple[int, ...]) -> frozenset[int]:
    """The ranks :func:`one_class` fits a class over ``shape`` from: rank 0, its neighbour along each
    dimension, and as witnesses the last rank and one a third of the way."""
    ranks = math.prod(shape)
    strides = grid_strides(shape)
    return frozenset({0, ranks - 1, (ranks - 1) // 3, *(s for n, s in zip(shape, strides) if n > 1)})


def one_class(programs: dict[int, tuple[Op, ...]], shape: tuple[int, ...], limits: dict[str, int]) -> Symmetry | None:
    """One class over the grid ``shape``, fitted from a few ranks' ``programs``: rank 0 and its neighbour
    along each dimension give each formula's offset and coefficients, and every other rank given must be
    what the formulas make of it (a witness); None where the programs differ in more than peers and chunks,
    a neighbour is missing, or a witness disagrees.

    The formulas are a guess for the ranks not given: a schedule so fitted is what it says, and is proved
    and timed as such (:mod:`~topocc.planner.analysis.verify_symmetric`).
    """
    ranks = math.prod(shape)
    strides = grid_strides(shape)
    canon = {r: canonical_order(p) for r, p in programs.items()}
    if 0 not in canon or any(n > 1 and stride not in canon for n, stride in zip(shape, strides)):
        return None
    skeleton = _skeleton(canon[0])
    if any(_skeleton(p) != skeleton for p in canon.values()):
        return None
    values = {r: np.array(_fields(p, ranks, limits)[0], dtype=np.int64) for r, p in canon.items()}
    moduli = np.array(_fields(canon[0], ranks, limits)[1], dtype=np.int64)
    coefs = np.zeros((len(shape), len(moduli)), dtype=np.int64)
    for d, (n, stride) in enumerate(zip(shape, strides)):
        if n > 1:
            coefs[d] = (values[stride] - values[0]) % moduli
    offsets = values[0]
    for r, found in values.items():
        coords = np.array([(r // stride) % n for n, stride in zip(shape, strides)], dtype=np.int64)
        if not np.array_equal((offsets + coords @ coefs) % moduli, found):
            return None
    return Symmetry(shape, (_template(canon[0], offsets, coefs),), ((0, ranks),), limits)


#: How operations that may run in either order are ordered (see :func:`canonical_order`): receives, sends, local.
_RANK_OF_KIND = {"recv": 0, "recv_reduce": 0, "send": 1, "copy": 2, "reduce": 2}


def canonical_order(program: tuple[Op, ...]) -> tuple[Op, ...]:
    """``program`` in one order that depends on what its operations do, not on the order an emitter wrote
    them: among the operations whose dependencies are placed, first the lowest step, then receives before
    sends before local operations, then the one whose last dependency was placed first (so consumers follow
    their producers' order, not their chunks' numbers), then program order; dependencies renumbered.

    Any such order is the same program: operations run when their dependencies complete, and the one order
    the format gives otherwise unordered operations, the posting order of one stream's messages (sends to
    one peer on one channel, receives from one), is kept as if it were a dependency.  Emitters write a
    pairwise exchange as send-then-receive on one side and the reverse on the other; in this order, both
    sides are one class.
    """
    n = len(program)
    waits = [0] * n
    after: list[list[int]] = [[] for _ in range(n)]
    last: dict[StreamKey, int] = {}
    for k, op in enumerate(program):
        before = set(op.deps)
        stream = stream_key(op)
        if stream is not None:
            if stream in last:
                before.add(last[stream])
            last[stream] = k
        waits[k] = len(before)
        for d in before:
            after[d].append(k)
    ready = [(op.step, _RANK_OF_KIND[op.kind], -1, k) for k, op in enumerate(program) if not waits[k]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)[3]
        order.append(k)
        for j in after[k]:
            waits[j] -= 1
            if not waits[j]:
                heapq.heappush(ready, (program[j].step, _RANK_OF_KIND[program[j].kind], len(order) - 1, j))
    if order == list(range(n)):
        return program
    new_index = {old: new for new, old in enumerate(order)}
    out = []
    for old in order:
        op = program[old]
        deps = tuple(sorted(new_index[d] for d in op.deps))
        out.append(op if deps == op.deps else operation(op.kind, op.peer, op.src, op.dst, deps, op.step, op.channel,
                                                        op.encoding))
    return tuple(out)


def _skeleton(program: Sequence[Op]) -> _Skeleton:
    return tuple((op.kind, op.deps, op.step, op.channel, op.encoding,
                  None if op.src is None else (op.src.buffer, op.src.count),
                  None if op.dst is None else (op.dst.buffer, op.dst.count)) for op in program)


def _skeleton_groups(programs: Sequence[Sequence[Op]]) -> list[list[int]]:
    """Ranks grouped by their programs' skeletons (all but peers and chunk indices), groups by first rank."""
    found: dict[_Skeleton, list[int]] = {}
    for rank, program in enumerate(programs):
        found.setdefault(_skeleton(program), []).append(rank)
    return list(found.values())


def _fields(program: Sequence[Op], ranks: int, limits: dict[str, int]) -> tuple[list[int], list[int]]:
    """The values that may differ within a class, each operation's peer and its references' first chunks, and
    each one's modulus: the rank count for a peer, the buffer's chunk count for a chunk."""
    values, moduli = [], []
    for op in program:
        if op.peer is not None:
            values.append(op.peer)
            moduli.append(ranks)
        for ref in (op.src, op.dst):
            if ref is not None:
                values.append(ref.index)
                moduli.append(limits[ref.buffer])
    return values, moduli


def _classes(programs: Sequence[Sequence[Op]], groups: list[list[int]], shape: tuple[int, ...],
             limits: dict[str, int], budget: int) -> Symmetry | None:
    """The classes over ``shape``, or None where they take more than :data:`MAX_CLASSES` or store more than
    ``budget`` operations."""
    ranks_all = len(programs)
    strides = grid_strides(shape)
    all_coords = (np.arange(ranks_all, dtype=np.int64)[:, None] // np.array(strides)) % np.array(shape)
    found: list[tuple[int, tuple[TemplateOp, ...], np.ndarray]] = []  # (first rank, template, members)
    stored = 0
    for group in groups:
        ranks = np.array(group, dtype=np.int64)
        moduli = np.array(_fields(programs[group[0]], ranks_all, limits)[1], dtype=np.int64)
        values = np.array([_fields(programs[r], ranks_all, limits)[0] for r in group],
                          dtype=np.int64).reshape(len(group), -1)
        for members, offset, coefs in _fit(ranks, all_coords, values, moduli, shape, strides):
            if len(found) >= MAX_CLASSES:
                return None
            template = _template(programs[int(members[0])], offset, coefs)
            stored += len(template)
            if stored > budget:
                return None
            found.append((int(members[0]), template, members))
    found.sort(key=lambda f: f[0])
    owner = np.empty(ranks_all, dtype=np.int64)
    for cls, (_, _, members) in enumerate(found):
        owner[members] = cls
    cuts = np.flatnonzero(np.diff(owner)) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), ranks_all]
    runs = tuple((int(owner[a]), b - a) for a, b in zip(starts, ends))
    return Symmetry(shape, tuple(t for _, t, _ in found), runs, limits)


def _fit(ranks: np.ndarray, coords: np.ndarray, values: np.ndarray, moduli: np.ndarray,
         shape: tuple[int, ...], strides: Sequence[int]) -> Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Peel classes off ranks of one skeleton: fit formulas at the first rank left (a coefficient per
    dimension from its neighbour there), keep every rank they give exactly, repeat with the rest.

    Yields (member ranks, offsets, coefficients): field f of a member with coordinates c is
    ``(offsets[f] + c @ coefs[:, f]) mod moduli[f]``.
    """
    where = {int(r): i for i, r in enumerate(ranks)}
    left = np.arange(len(ranks))
    dims = coords.shape[1]
    while left.size:
        first = int(left[0])
        c0 = coords[ranks[first]]
        coefs = np.zeros((dims, values.shape[1]), dtype=np.int64)
        here = coords[ranks[left]]
        for d in range(dims):
            if (here[:, d] == c0[d]).all():
                continue  # the dimension does not vary in what is left: its coefficient is never used
            neighbour = where.get(int(ranks[first]) + strides[d]) if c0[d] + 1 < shape[d] else None
            if neighbour is not None:
                coefs[d] = (values[neighbour] - values[first]) % moduli
        offsets = (values[first] - c0 @ coefs) % moduli
        keep = np.zeros(left.size, dtype=bool)
        for a in range(0, left.size, _BLOCK):
            block = left[a:a + _BLOCK]
            predicted = (offsets + coords[ranks[block]] @ coefs) % moduli
            keep[a:a + _BLOCK] = (predicted == values[block]).all(axis=1)
        yield ranks[left[keep]], offsets, coefs
        for i in left[keep]:
            del where[int(ranks[i])]
        left = left[~keep]


def _template(program: Sequence[Op], offsets: np.ndarray, coefs: np.ndarray) -> tuple[TemplateOp, ...]:
    """``program`` with each field (in :func:`_fields`' order: peer, src, dst) as its fitted formula."""
    column = iter(range(len(offsets)))

    def field() -> Field:
        f = next(column)
        if not coefs[:, f].any():
            return int(offsets[f])
        return Formula(int(offsets[f]), tuple(int(a) for a in coefs[:, f]))

    out = []
    for op in program:
        peer = field() if op.peer is not None else None
        src = TemplateRef(op.src.buffer, field(), op.src.count) if op.src is not None else None
        dst = TemplateRef(op.dst.buffer, field(), op.dst.count) if op.dst is not None else None
        out.append(TemplateOp(op.kind, peer, src, dst, op.deps, op.step, op.channel, op.encoding))
    return tuple(out)
