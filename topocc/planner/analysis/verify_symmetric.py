"""Prove a schedule in the symmetric form one rank per orbit of its symmetries, without expanding it.

A translation ``T`` of one digit of the schedule's grid (:mod:`topocc.runtime.symmetric`) is a symmetry of
the schedule when it maps each class onto itself, commutes with every peer formula, and a permutation
``pi`` of each buffer's chunks carries every operation of every rank onto the same operation of its image:

* a message's chunks (a send's source, a receive's destination and a reducing receive's operand) go onto the
  image's in order (``pi`` is one translation on them);
* a local copy or reduction's source and destination go onto the image's as sets, their chunks paired alike.

Then ``(T, pi)`` maps the whole dataflow (which chunk of which rank feeds which) onto itself, and where it
also maps the collective's initial and final values onto themselves (keys by ``pi`` of the input, masks by
``T``), a proof of one rank per orbit is a proof of all: from ``T``-invariant data, every message of an orbit
finds the same state, so every rank of an orbit runs its representative's program on the image of its
representative's data, races and all (``pi`` keeps overlaps).  The symmetries found generate a group of
digit translations; ``pi`` of each is checked to cycle back after the digit's size and to commute with the
others', so each group element has one ``pi`` and the orbits are the ranks that differ only in those digits.

The checks run over every rank of every class at once (numpy, one pass per digit and template operation).
Where a collective lays a buffer out as one block per rank (an all-gather's output, a reduce-scatter's
input) and every reference's formula is digit-wise (:mod:`~topocc.planner.analysis.digitwise`), ``pi`` is
a translation of those blocks (along the same digit, or along the block digit the formulas set from it where
the blocks are ordered otherwise than the ranks), chunks fixed at every rank that a copy or reduction pairs
with a run of blocks go as that run, and each reference is checked once for the whole grid, digit by digit:
an all-gather's template has an operation per rank, so the checks over every rank would grow with the ranks
squared.  The proof proper runs the representatives' programs as :func:`~topocc.planner.analysis.verify.verify` runs
every rank's, reading a message from a rank outside them as its representative's data, keys and masks
moved by the translation between the two.  Where no digit qualifies (a per-rank schedule, a rooted or
in-place collective, an encoded schedule), :func:`verify_by_class` returns None and the caller proves every
rank.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from topocc.planner.analysis.automorphisms import Commuting
from topocc.planner.analysis.collectives import CollectiveSpec, spec
from topocc.planner.analysis.digitwise import Digitwise, decode
from topocc.planner.analysis.encodings import is_encoded
from topocc.planner.analysis.verify import (
    Segment,
    VerifyReport,
    _check_header,
    _check_program,
    _check_races,
    _describe,
    _empty,
    _explain_value,
    _fail,
    _land,
    _Memory,
    _merged,
    _run_local,
    _uninitialised,
    _values,
    verify,
)
from topocc.runtime.collective import ALLGATHER, ALLREDUCE, REDUCESCATTER
from topocc.runtime.schedule import BUFFERS, Chunk, Op, Schedule
from topocc.runtime.symmetric import Field, Formula, Symmetry, TemplateRef, grid_strides

__all__ = ["prove", "verify_by_class"]

#: Operations whose chunks travel in a message: the chunks of each rank go onto its image's in order.
_MESSAGE_KINDS = frozenset({"send", "recv", "recv_reduce"})
#: :meth:`_Grid.moves` of a reference carried onto its image chunk by chunk.
_IN_ORDER = (0, 0)
#: The collectives whose initial and final values a digit translation can keep.
_BY_CLASS = (ALLREDUCE, ALLGATHER, REDUCESCATTER)

#: The messages (class, operation) whose chunks a translation's permutation moves as a set, not in order: each
#: with where its chunks go, relative to its image's first (the same at every rank of the class), or None where
#: the permutation was searched for and that is not known.
Twisted = dict[tuple[int, int], "np.ndarray | None"]
#: Chunk permutations of each buffer found for a translation, and the messages they twist.
Found = tuple[dict[str, np.ndarray], Twisted]


def prove(schedule: Schedule) -> VerifyReport:
    """Prove ``schedule``: by class where it is in the symmetric form and has symmetries this proof can use,
    else every rank's program (:func:`~topocc.planner.analysis.verify.verify`); the same report either way."""
    found = verify_by_class(schedule) if schedule.symmetry is not None else None
    return found if found is not None else verify(schedule)


def verify_by_class(schedule: Schedule) -> VerifyReport | None:
    """Prove ``schedule`` one rank per orbit of its symmetries (see the module docstring), or return None
    where it has none this proof can use; raises :class:`~topocc.planner.errors.VerificationError` as
    :func:`~topocc.planner.analysis.verify.verify` does."""
    sym = schedule.symmetry
    sp = spec(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks, schedule.root)
    if (sym is None or schedule.inplace or sp.description not in _BY_CLASS or sym.ranks != schedule.ranks
            or is_encoded(schedule)):
        return None
    _check_header(schedule, sp)
    limits = {"i": schedule.input_chunks, "o": schedule.output_chunks, "s": schedule.scratch_chunks}
    grid = _Grid(sym, limits, _block_units(sp))
    grid.check_ranges(schedule)
    group = _Group.find(grid, sp)
    if group is None:
        return None
    return _Proof(schedule, sp, group, limits).run()


def _block_units(sp: CollectiveSpec) -> dict[tuple[str, ...], list[tuple[int, int]]]:
    """The buffers that may be laid out as one block per rank, and how, alike within each group: (chunks of a
    block, copies of the layout one after the other), in order of preference.  The collective's split
    buffers and a split input's scratch copy that a reduce-scatter works in (from its start) hold one copy of
    whole blocks; an all-reduce's input and output hold whole blocks where its reduce-scatter keeps each
    rank's block whole, or in virtual order one copy per slice, each of one chunk a block.  (Where a
    schedule's formulas move as neither, the chunk permutations are searched for instead.)"""
    kind = sp.description
    units: dict[tuple[str, ...], list[tuple[int, int]]] = {}
    if kind is ALLREDUCE and not sp.input_chunks % sp.ranks:
        unit = sp.input_chunks // sp.ranks
        units["i", "o"] = [(unit, 1), (1, unit)] if unit > 1 else [(1, 1)]
    if kind.output_split:
        units["o",] = [(sp.output_chunks // sp.ranks, 1)]
    if kind.input_split:
        units["i", "s"] = [(sp.input_chunks // sp.ranks, 1)]
    return units


class _Grid:
    """The symmetric form's grid as arrays: every rank's coordinates and class, each class's members; and
    the buffers laid out by blocks (:func:`_block_units`), whose formulas may be decoded digit-wise."""

    def __init__(self, sym: Symmetry, limits: dict[str, int],
                 layouts: dict[tuple[str, ...], list[tuple[int, int]]]) -> None:
        self.sym = sym
        self.limits = limits
        self._decoded: dict[tuple[Field, str], Digitwise | None] = {}
        #: per buffer laid out by blocks, the chunks of a block and the copies of the layout
        self.units: dict[str, int] = {}
        self.repeats: dict[str, int] = {}
        for buffers, candidates in layouts.items():
            fitting = [(u, n) for u, n in candidates if all(u * n * sym.ranks <= limits[b] for b in buffers)]
            if fitting:
                layout = self._layout(buffers, fitting)
                for b in buffers:
                    self.units[b], self.repeats[b] = layout
        self.commuting = Commuting(sym)
        self.coords = self.commuting.coords
        self.members = self.commuting.members
        self.strides = np.array(grid_strides(sym.shape), dtype=np.int64)

    def _layout(self, buffers: tuple[str, ...], candidates: list[tuple[int, int]]) -> tuple[int, int]:
        """Of the candidate layouts of ``buffers``, the one under which the most of the templates' formulas in
        them decode digit-wise (ties: the first)."""
        if len(candidates) == 1:
            return candidates[0]
        formulas = {(ref.index, ref.buffer) for template in self.sym.templates for t in template
                    for ref in (t.src, t.dst)
                    if ref is not None and ref.buffer in buffers and not isinstance(ref.index, int)}

        def decoded(layout: tuple[int, int]) -> int:
            unit, repeats = layout
            return sum(decode(f, self.limits[b], self.sym.shape, unit, across=True, repeats=repeats) is not None
                       for f, b in formulas)

        return max(candidates, key=decoded)  # max keeps the first of equals

    def value(self, f: Field, points: np.ndarray, modulus: int) -> np.ndarray:
        """``f`` at each of ``points`` (rows of coordinates)."""
        if isinstance(f, int):
            return np.full(len(points), f, dtype=np.int64)
        return (f.offset + points @ np.array(f.coefs, dtype=np.int64)) % modulus

    def points(self, cls: int, fields: Sequence[Field | None], digit: int | None = None,
               steps: Sequence[int] | None = None) -> np.ndarray:
        """Coordinates that stand for every rank of class ``cls`` as far as ``fields`` (and a translation of
        ``digit``) tell: its members' where it is not the whole grid; else one point per value of the digits
        that the formulas read (coefficients not ``steps``), the others 0, which is fewer where formulas read
        few digits (a level's peers and chunks depend on that level's digits only)."""
        shape = self.sym.shape
        if len(self.members[cls]) < self.sym.ranks:
            return self.coords[self.members[cls]]
        base = steps if steps is not None else [0] * len(shape)
        active = {digit} if digit is not None else set()
        for f in fields:
            if isinstance(f, Formula):
                active |= {e for e, (a, b) in enumerate(zip(f.coefs, base)) if a != b}
        dims = sorted(active)
        out = np.zeros((math.prod(shape[e] for e in dims), len(shape)), dtype=np.int64)
        if dims:
            out[:, dims] = np.indices([shape[e] for e in dims]).reshape(len(dims), -1).T
        return out

    def digitwise(self, index: Field, buffer: str) -> Digitwise | None:
        """``index`` in ``buffer`` decoded digit-wise (:mod:`~topocc.planner.analysis.digitwise`), where the
        buffer is laid out by blocks and the formula is one; else None."""
        unit = self.units.get(buffer)
        if unit is None:
            return None
        key = (index, buffer)
        if key not in self._decoded:
            self._decoded[key] = decode(index, self.limits[buffer], self.sym.shape, unit, across=True,
                                        repeats=self.repeats[buffer])
        return self._decoded[key]

    def moves(self, ref: TemplateRef, digit: int, block: int | None) -> tuple[int, int] | None:
        """How the translation of ``digit`` with :func:`_by_blocks`'s chunk permutation (the blocks moved along
        block digit ``block``, or kept where None) moves ``ref`` onto its image at every rank:
        :data:`_IN_ORDER`; or as a set, the run of whole blocks (:meth:`Digitwise.run_start`) that ``block`` is in
        permuted among themselves, as (block's chunks, the run's first digit), which references moved alike
        share; None where neither is shown."""
        unit = self.units.get(ref.buffer)
        index = ref.index
        if unit is None or block is None or (isinstance(index, int)
                                             and index >= unit * self.sym.ranks * self.repeats[ref.buffer]):
            # chunks the permutation keeps: the formula must not read the digit
            if isinstance(index, int) or index.coefs[digit] % self.limits[ref.buffer] == 0:
                return _IN_ORDER
            return None
        decoded = self.digitwise(index, ref.buffer)
        start = decoded.run_start(ref.count) if decoded is not None else None
        if decoded is None or start is None:
            return None
        if block >= start:  # blocks moved within the run, which is the same run at the image
            return (unit, start) if decoded.sets(digit) is None else None
        return _IN_ORDER if decoded.follows(digit, block) else None

    def block_digits(self, digit: int) -> list[int | None]:
        """The block digits whose translation :func:`_by_blocks` tries with that of ``digit``, in order: the same
        digit (blocks moved as their ranks are), those the references' formulas set from ``digit`` (blocks
        ordered otherwise than ranks), and None (blocks kept)."""
        found: set[int] = set()
        for template in self.sym.templates:
            for t in template:
                for ref in (t.src, t.dst):
                    if ref is not None and ref.buffer in self.units and not isinstance(ref.index, int):
                        decoded = self.digitwise(ref.index, ref.buffer)
                        block = decoded.sets(digit) if decoded is not None else None
                        if block is not None:
                            found.add(block)
        return [digit, *sorted(found - {digit}), None]

    def chunk_at(self, ref: TemplateRef, rank: int) -> Chunk:
        """``ref`` on ``rank``."""
        limit = self.limits[ref.buffer]
        index = ref.index if isinstance(ref.index, int) else ref.index.at(self.coords[rank].tolist(), limit)
        return Chunk(ref.buffer, index, ref.count)

    def translation(self, shift: Sequence[int]) -> np.ndarray:
        """The permutation of the ranks that adds ``shift`` to every rank's coordinates (each digit modulo its
        size)."""
        moved = (self.coords + np.array(shift, dtype=np.int64)) % np.array(self.sym.shape, dtype=np.int64)
        return moved @ self.strides

    def check_ranges(self, schedule: Schedule) -> None:
        """Every rank's operations name another rank and chunks inside their buffers (what the loader checks
        of a rank's program as it builds it, here for every rank at once).  Where one does not, the first such
        rank's program is built, which raises the loader's error."""
        ranks, strides = self.sym.ranks, self.strides.tolist()
        first = ranks
        for cls, template in enumerate(self.sym.templates):
            whole = len(self.members[cls]) == ranks
            for t in template:
                if t.peer is not None:
                    peer = decode(t.peer, ranks, self.sym.shape, 1) if whole else None
                    if peer is not None:  # the ranks it names themselves: those whose every digit it keeps
                        own_digits = peer.fixed_ranks()
                        if all(own_digits):
                            first = min(first, sum(s * min(v) for s, v in zip(strides, own_digits)))
                    else:
                        points = self.points(cls, [t.peer], steps=strides)  # the digits where peer and rank differ
                        own = points @ self.strides
                        bad = own[self.value(t.peer, points, ranks) == own]
                        first = min(first, int(bad.min(initial=ranks)))
                for ref in (t.src, t.dst):
                    if ref is not None:
                        limit = self.limits[ref.buffer]
                        chunks = ref.index if isinstance(ref.index, int) else self.digitwise(ref.index, ref.buffer)
                        if chunks is not None:  # one bound for every rank
                            top = chunks if isinstance(chunks, int) else chunks.largest()
                            if top + ref.count <= limit:
                                continue
                        points = self.points(cls, [ref.index])
                        bad = (points @ self.strides)[self.value(ref.index, points, max(limit, 1)) + ref.count > limit]
                        first = min(first, int(bad.min(initial=ranks)))
        if first < ranks:
            # a point stands for the ranks of its class that agree with it on the digits the formula reads, and
            # is the least of them (the others 0): ``first`` is the first rank the loader would refuse
            schedule.programs[first]  # raises ScheduleFormatError, naming the file and the operation
            raise _fail(schedule, f"rank {first}'s program is not valid")

class _Group:
    """The digit translations kept as symmetries, each with its chunk permutations, and the orbits they make."""

    def __init__(self, grid: _Grid, digits: list[int], pis: dict[int, dict[str, np.ndarray]],
                 twisted: dict[int, Twisted]) -> None:
        self.grid = grid
        self.digits = digits
        self.pis = pis
        #: per kept digit, the messages whose chunks its translation moves as a set, not in order
        self.twisted = twisted
        shape = grid.sym.shape
        self.sizes = [shape[d] for d in digits]
        self.copies = math.prod(self.sizes)

    @classmethod
    def find(cls, grid: _Grid, sp: CollectiveSpec) -> _Group | None:
        """The digits whose translation is a symmetry, or None where none is."""
        shape = grid.sym.shape
        pis: dict[int, dict[str, np.ndarray]] = {}
        twisted: dict[int, Twisted] = {}
        for d, n in enumerate(shape):
            if n < 2:
                continue
            shift = [0] * len(shape)
            shift[d] = 1
            perm = grid.translation(shift)
            if not grid.commuting.under(perm):
                continue
            for found in _candidates(grid, d):
                if (found is not None and all(_cycles_back(pi, n) for pi in found[0].values())
                        and _keeps_values(sp, perm, found[0]) and all(_commute(found[0], pis[e]) for e in pis)):
                    pis[d], twisted[d] = found
                    break
        if not pis:
            return None
        return cls(grid, sorted(pis), pis, twisted)

    @property
    def reps(self) -> list[int]:
        """The least rank of each orbit: the ranks whose kept digits are all 0."""
        coords = self.grid.coords[:, self.digits]
        return np.flatnonzero((coords == 0).all(axis=1)).tolist()

    def split(self, rank: int) -> tuple[int, tuple[int, ...]]:
        """(``rank``'s representative, the shift of the kept digits that carries it onto ``rank``)."""
        shift = tuple(int(c) for c in self.grid.coords[rank, self.digits])
        return rank - int(np.dot(shift, self.grid.strides[self.digits])), shift

    def inverse(self, shift: tuple[int, ...]) -> tuple[int, ...]:
        return tuple((n - s) % n for n, s in zip(self.sizes, shift))

    def image(self, ranks: np.ndarray, shift: tuple[int, ...]) -> np.ndarray:
        """``ranks`` (an array of them) moved by the group element ``shift`` (per kept digit)."""
        coords = self.grid.coords[ranks]  # a copy: ``ranks`` is an array
        coords[..., self.digits] += np.array(shift, dtype=np.int64)
        return (coords % np.array(self.grid.sym.shape, dtype=np.int64)) @ self.grid.strides

    def chunks(self, shift: tuple[int, ...], buffer: str, index: np.ndarray) -> np.ndarray:
        """``pi`` of the group element ``shift`` on chunks ``index`` of ``buffer``: each generator's, as often as
        its shift (only the chunks asked for: a buffer may have as many chunks as there are ranks)."""
        for d, s in zip(self.digits, shift):
            pi = self.pis[d][buffer]
            for _ in range(s):
                index = pi[index]
        return index

    def moved_mask(self, mask: int, shift: tuple[int, ...]) -> int:
        """The ranks of ``mask`` moved by ``shift``."""
        ranks = self.grid.sym.ranks
        if mask == (1 << ranks) - 1:
            return mask
        nbytes = (ranks + 7) // 8
        bits = np.unpackbits(np.frombuffer(mask.to_bytes(nbytes, "little"), dtype=np.uint8), bitorder="little")
        moved = np.zeros(nbytes * 8, dtype=np.uint8)
        moved[self.image(np.flatnonzero(bits[:ranks]), shift)] = 1
        return int.from_bytes(np.packbits(moved, bitorder="little").tobytes(), "little")


def _candidates(grid: _Grid, digit: int) -> Iterator[Found | None]:
    """The chunk permutations to try with the translation of ``digit``, cheapest first, each built when asked
    for: by blocks (:func:`_by_blocks`) along each of :meth:`_Grid.block_digits`, then the search
    (:func:`_chunk_permutations`)."""
    for block in grid.block_digits(digit) if grid.units else []:
        yield _by_blocks(grid, digit, block)
    yield _chunk_permutations(grid, digit)


def _by_blocks(grid: _Grid, digit: int, block: int | None) -> Found | None:
    """What :func:`_chunk_permutations` finds, decided digit by digit where every reference allows: the blocks
    of the buffers laid out by blocks moved along block digit ``block`` (where the blocks are ordered as the
    ranks, ``digit`` itself: moved as their ranks are) or kept where None; the chunks of another buffer that a
    copy or reduction pairs, at every rank the same, with a run of blocks moved as a set are moved as it is;
    every other chunk kept.  None where a reference is not shown to follow those (its formula is not
    digit-wise, or not so for this digit), or an operation's two sides are not moved alike.

    Each reference is decided over the whole grid at once (:meth:`_Grid.moves`; fixed chunks, the same at every
    rank, by the permutation itself), so the time is the template's length times the digits, not times the
    ranks."""
    pis = {b: np.arange(limit, dtype=np.int64) for b, limit in grid.limits.items()}
    if block is not None:
        shift = [0] * len(grid.sym.shape)
        shift[block] = 1
        perm = grid.translation(shift)
        for b, unit in grid.units.items():
            period = perm.size * unit  # each copy of the layout permuted alike
            blocks = (perm[:, None] * unit + np.arange(unit, dtype=np.int64)[None, :]).ravel()
            copies = np.arange(grid.repeats[b], dtype=np.int64)[:, None] * period
            pis[b][:copies.size * period] = (copies + blocks[None, :]).ravel()
    # (class, operation, side) -> where the side's chunks go, relative to its image's first
    laid: dict[tuple[int, int, int], np.ndarray] = {}
    for cls, template in enumerate(grid.sym.templates):
        for k, t in enumerate(template):
            for side, r in enumerate((t.src, t.dst)):
                if r is not None and r.buffer in grid.units:
                    move = grid.moves(r, digit, block)
                    if move is None:
                        return None
                    laid[cls, k, side] = _relative(grid, move, r.count, block)
    # a fixed reference paired with a laid one takes its pattern
    paired = {b: np.full(limit, -1, dtype=np.int64) for b, limit in grid.limits.items() if b not in grid.units}
    for (cls, k, side), rel in laid.items():
        t = grid.sym.templates[cls][k]
        other = (t.src, t.dst)[1 - side]
        if other is not None and other.buffer in paired and isinstance(other.index, int):
            span = paired[other.buffer][other.index:other.index + other.count]
            if ((span >= 0) & (span != other.index + rel)).any():
                return None
            span[:] = other.index + rel
    for b, pattern in paired.items():
        pis[b] = np.where(pattern >= 0, pattern, pis[b])
        if np.unique(pis[b]).size != pis[b].size:
            return None
    twisted: Twisted = {}
    for cls, template in enumerate(grid.sym.templates):
        for k, t in enumerate(template):
            rels = []
            for side, r in enumerate((t.src, t.dst)):
                if r is None:
                    continue
                if r.buffer in grid.units:
                    rel = laid[cls, k, side]
                elif isinstance(r.index, int):  # the same chunks at the image: the permutation must keep them
                    rel = pis[r.buffer][r.index:r.index + r.count] - r.index
                    if not np.array_equal(np.sort(rel), np.arange(r.count)):
                        return None
                elif (paired[r.buffer] < 0).all() and grid.moves(r, digit, block) == _IN_ORDER:
                    rel = np.arange(r.count)
                else:
                    return None
                rels.append(rel)
            if len(rels) == 2 and not np.array_equal(rels[0], rels[1]):
                return None  # an operation's two sides must be moved alike
            if t.kind in _MESSAGE_KINDS and (rels[0] != np.arange(rels[0].size)).any():
                twisted[cls, k] = rels[0]
    return pis, twisted


def _alike(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Whether two twisted messages' ends are known to go alike."""
    return a is not None and b is not None and np.array_equal(a, b)


def _relative(grid: _Grid, move: tuple[int, int], count: int, block: int | None) -> np.ndarray:
    """Where :func:`_by_blocks`'s permutation puts a reference's ``count`` chunks, relative to its image's first,
    as :meth:`_Grid.moves` says it moves them: in order, or within their run of blocks with block digit
    ``block`` moved by one."""
    j = np.arange(count, dtype=np.int64)
    if move == _IN_ORDER:
        return j
    assert block is not None
    n, stride = grid.sym.shape[block], move[0] * int(grid.strides[block])
    y = j // stride % n
    return j + stride * ((y + 1) % n - y)


def _chunk_permutations(grid: _Grid, digit: int) -> Found | None:
    """For each buffer, a permutation of its chunks that carries every rank's operations onto its image's
    under the translation of ``digit`` (see the module docstring), and the messages (class, operation) whose
    chunks it does not carry in order; None where none is found.

    The references of single-reference operations are mapped by translation, the shortest first; a longer one
    that disagrees with what is mapped already must then go onto its image as a set (a halving-doubling
    level's half of a block holds the level below's quarters, swapped).  Then each operation with a source and
    a destination gives its unmapped side its mapped side's pattern.  Every reference is checked at the end
    against the whole permutation.
    """
    limits = grid.limits
    pis = {b: np.full(limits[b], -1, dtype=np.int64) for b in BUFFERS}
    refs: list[tuple[int, str, np.ndarray, tuple[int, int], bool]] = []  # count, buffer, (s, s2) rows, op, message
    local: list[tuple[str, str, np.ndarray]] = []  # (src buffer, dst buffer, rows of (s, s2, u, u2, count))
    paired: set[tuple[int, int]] = set()
    size = grid.sym.shape[digit]
    for cls, template in enumerate(grid.sym.templates):
        for k, t in enumerate(template):
            here = grid.points(cls, [r.index for r in (t.src, t.dst) if r is not None], digit)
            there = here.copy()
            there[:, digit] = (there[:, digit] + 1) % size
            at = [(r, grid.value(r.index, here, limits[r.buffer]), grid.value(r.index, there, limits[r.buffer]))
                  for r in (t.src, t.dst) if r is not None]
            for r, s, s2 in at:
                refs.append((r.count, r.buffer, _rows(np.stack([s, s2], axis=1)), (cls, k), t.kind in _MESSAGE_KINDS))
            if len(at) == 2:  # source and destination paired chunk by chunk
                paired.add((cls, k))
                (r, s, s2), (q, u, u2) = at
                local.append((r.buffer, q.buffer, _rows(np.stack([s, s2, u, u2, np.full_like(s, r.count)], axis=1))))
    refs.sort(key=lambda ref: ref[0])
    for n, b, rows, op, _ in refs:
        if op in paired:
            continue  # mapped from its other side (_assign_local)
        index, value = _spans(rows[:, 0], n), _spans(rows[:, 1], n)
        held = pis[b][index]
        fits = ~((held >= 0) & (held != value)).any(axis=1)
        pis[b][index[fits]] = value[fits]
    if not _assign_local(pis, local) or not all(_complete(pi) for pi in pis.values()):
        return None
    twisted: Twisted = {}
    for n, b, rows, op, message in refs:
        moved, want = pis[b][_spans(rows[:, 0], n)], _spans(rows[:, 1], n)
        if (moved == want).all():
            continue
        if not (np.sort(moved, axis=1) == want).all():
            return None  # not onto the image's chunks
        if message:
            twisted[op] = None
    return pis, twisted


def _spans(starts: np.ndarray, n: int) -> np.ndarray:
    """Rows ``start .. start + n`` for each of ``starts``."""
    return starts[:, None] + np.arange(n, dtype=np.int64)[None, :]


def _rows(a: np.ndarray) -> np.ndarray:
    """The distinct rows of ``a``."""
    if len(a) < 2:
        return a
    a = a[np.lexsort(a.T[::-1])]
    return a[np.concatenate(([True], (a[1:] != a[:-1]).any(axis=1)))]


def _assign_local(pis: dict[str, np.ndarray], local: list[tuple[str, str, np.ndarray]]) -> bool:
    """Extend ``pis`` over the copies and reductions, each pairing its source's and destination's chunks alike:
    a side already mapped gives the other its pattern, and two unmapped sides go by translation."""
    pending = [(a, b, row) for a, b, rows in local for row in rows.tolist()]
    while pending:
        left = []
        for a, b, (s, s2, u, u2, n) in pending:
            src, dst = pis[a][s:s + n], pis[b][u:u + n]
            have_src, have_dst = (src >= 0).all(), (dst >= 0).all()
            if ((src >= 0).any() and not have_src) or ((dst >= 0).any() and not have_dst):
                return False  # partly mapped: no pattern to pair
            if have_src and have_dst:
                if not np.array_equal(src - s2, dst - u2):
                    return False
            elif have_src:
                dst[:] = u2 + (src - s2)
            elif have_dst:
                src[:] = s2 + (dst - u2)
            else:
                left.append((a, b, (s, s2, u, u2, n)))
        if len(left) == len(pending):  # nothing maps either side: the first goes by translation
            a, b, (s, s2, u, u2, n) = left[0]
            pis[a][s:s + n] = np.arange(s2, s2 + n)
            if (pis[b][u:u + n] >= 0).any() and not np.array_equal(pis[b][u:u + n], np.arange(u2, u2 + n)):
                return False
            pis[b][u:u + n] = np.arange(u2, u2 + n)
            left = left[1:]
        pending = left
    return True


def _complete(pi: np.ndarray) -> bool:
    """Whether the mapped chunks of ``pi`` go to distinct chunks; the unmapped then get the chunks left, in
    order (no operation touches them)."""
    mapped = pi >= 0
    taken = pi[mapped]
    if np.unique(taken).size != taken.size:
        return False
    free = np.ones(pi.size, dtype=bool)
    free[taken] = False
    pi[~mapped] = np.flatnonzero(free)
    return True


def _cycles_back(pi: np.ndarray, n: int) -> bool:
    """Whether ``pi`` applied ``n`` times is the identity (as the translation is, after its digit's size)."""
    out = np.arange(pi.size)
    for _ in range(n):
        out = pi[out]
    return bool((out == np.arange(pi.size)).all())


def _commute(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[k][b[k]], b[k][a[k]]) for k in a)


def _keeps_values(sp: CollectiveSpec, perm: np.ndarray, pis: dict[str, np.ndarray]) -> bool:
    """Whether ``(perm, pis)`` maps the collective's initial values onto themselves (by construction of the
    keys' map, :meth:`_Proof.moved`) and its final values too: every rank's expected output at chunk ``y`` is
    the image of its preimage's at ``pi^-1(y)``."""
    pi_i, pi_o = pis["i"], pis["o"]
    inverse_o = np.argsort(pi_o)
    kind = sp.description
    if kind is ALLREDUCE:  # output y holds key y from every rank
        return bool(np.array_equal(pi_i, pi_o))
    if kind is ALLGATHER:  # output y holds rank y // C's key y
        c = sp.input_chunks
        x = inverse_o
        return bool(np.array_equal(perm[x // c] * c + pi_i[x % c], np.arange(pi_o.size)))
    # reduce-scatter: rank r's output j holds key r C + j from every rank
    c = sp.output_chunks
    ranks = np.arange(sp.ranks, dtype=np.int64)[:, None]
    return bool(np.array_equal(pi_i[ranks * c + inverse_o[None, :]], perm[ranks] * c + np.arange(c)[None, :]))


class _Proof:
    """The proof of the representatives' programs, their messages with ranks outside them read through the
    group (see the module docstring)."""

    def __init__(self, schedule: Schedule, sp: CollectiveSpec, group: _Group, limits: dict[str, int]) -> None:
        self.schedule, self.sp, self.group, self.grid = schedule, sp, group, group.grid
        self.reps = group.reps
        self.index = {r: i for i, r in enumerate(self.reps)}
        sym = schedule.symmetry
        assert sym is not None
        self.programs = [sym.program(r) for r in self.reps]
        for r, program in zip(self.reps, self.programs):
            _check_program(schedule, r, program, limits)
        self.memories = [_Memory(schedule, sp, r) for r in self.reps]
        for r, program, memory in zip(self.reps, self.programs, self.memories):
            _check_races(schedule, r, program, memory)

    def run(self) -> VerifyReport | None:
        """The proof's report, or None where a message's chunks are moved as a set between two different
        places (its data would not pair up on the image)."""
        matched = self._match()
        if matched is None:
            return None
        partner, prev, nxt, messages, chunks = matched
        programs, memories, schedule = self.programs, self.memories, self.schedule
        waiting = [[len(op.deps) + (p >= 0) for op, p in zip(program, pq)] for program, pq in zip(programs, prev)]
        dependents: list[list[list[int]]] = [[[] for _ in p] for p in programs]
        for i, program in enumerate(programs):
            for k, op in enumerate(program):
                for d in op.deps:
                    dependents[i][d].append(k)
        posted = [[False] * len(p) for p in programs]
        done = [[False] * len(p) for p in programs]
        ready = deque((i, k) for i, w in enumerate(waiting) for k, n in enumerate(w) if not n)

        def complete(i: int, k: int) -> None:
            done[i][k] = True
            for j in dependents[i][k]:
                waiting[i][j] -= 1
                if not waiting[i][j]:
                    ready.append((i, j))

        while ready:
            i, k = ready.popleft()
            op = programs[i][k]
            if op.kind == "copy" or op.kind == "reduce":
                _run_local(schedule, self.reps[i], k, op, memories[i])
                complete(i, k)
                continue
            following = nxt[i][k]
            if following >= 0:
                waiting[i][following] -= 1
                if not waiting[i][following]:
                    ready.append((i, following))
            j, m = partner[i][k]
            if not posted[j][m]:
                posted[i][k] = True
                continue
            (si, sk), (ri, rk) = ((i, k), (j, m)) if op.kind == "send" else ((j, m), (i, k))
            self._deliver(si, sk, ri, rk)
            complete(i, k)
            complete(j, m)
        for i, program in enumerate(programs):
            for k in range(len(program)):
                if not done[i][k]:
                    raise self._deadlock(i, k, posted, done, partner, prev)
        self._check_outputs()
        copies = self.group.copies
        return VerifyReport(schedule.collective, schedule.ranks, schedule.op_count, messages * copies,
                            chunks * copies)

    def _match(self) -> tuple[list[list[tuple[int, int]]], list[list[int]], list[list[int]], int, int] | None:
        """Each representative's messages paired with their partners' (as representatives' operations: the
        partner of a message to rank ``q`` is the matching operation of ``q``'s representative toward the
        preimage of this rank), its FIFO queues, and the sends and chunks sent per orbit.

        None where a message that a translation moves as a set (:attr:`_Group.twisted`) is not shown to pair
        the same chunks at its image (:meth:`_pairs_in_place`).
        """
        group, schedule = self.group, self.schedule
        streams: list[dict[tuple[str, int, int], list[int]]] = []
        prev = [[-1] * len(p) for p in self.programs]
        nxt = [[-1] * len(p) for p in self.programs]
        for i, program in enumerate(self.programs):
            found: dict[tuple[str, int, int], list[int]] = {}
            for k, op in enumerate(program):
                if op.peer is not None:
                    found.setdefault(("send" if op.kind == "send" else "recv", op.peer, op.channel), []).append(k)
            for queue in found.values():
                for a, b in itertools.pairwise(queue):
                    nxt[i][a], prev[i][b] = b, a
            streams.append(found)
        partner: list[list[tuple[int, int]]] = [[(-1, -1)] * len(p) for p in self.programs]
        messages = chunks = 0
        for i, (rank, found) in enumerate(zip(self.reps, streams)):
            for (direction, peer, channel), queue in found.items():
                rep, shift = group.split(peer)
                j = self.index[rep]
                back = int(group.image(np.array([rank]), group.inverse(shift))[0])  # the preimage of this rank
                other = "recv" if direction == "send" else "send"
                theirs = streams[j].get((other, back, channel), [])
                if len(theirs) != len(queue):
                    s, r = (rank, peer) if direction == "send" else (peer, rank)
                    ours, their_n = (len(queue), len(theirs)) if direction == "send" else (len(theirs), len(queue))
                    raise _fail(schedule, f"unmatched message: rank {s} sends {ours} message(s) to rank {r} on "
                                          f"channel {channel} but rank {r} receives {their_n} from rank {s}",
                                fix="every send needs exactly one matching receive (FIFO per rank pair and channel)")
                for k, m in zip(queue, theirs):
                    op, partner_op = self.programs[i][k], self.programs[j][m]
                    if op.count != partner_op.count:
                        raise _fail(schedule, f"{_describe(rank, k, op)} moves {op.count} chunk(s) but its partner "
                                              f"on rank {peer} (as {_describe(rep, m, partner_op)} on its class's "
                                              f"representative) moves {partner_op.count}",
                                    fix="a send and its matching receive must move the same number of chunks")
                    partner[i][k] = (j, m)
                    if not self._pairs_in_place(rank, k, op, peer, rep, m):
                        return None
                    if direction == "send":
                        messages += 1
                        chunks += op.count
        return partner, prev, nxt, messages, chunks

    def _pairs_in_place(self, rank: int, k: int, op: Op, peer: int, rep: int, m: int) -> bool:
        """Whether the message of ``rank``'s operation ``k`` with operation ``m`` of ``peer`` (whose
        representative is ``rep``) pairs the same chunks at its image under every kept translation: its two
        ends' chunks go alike (in order, or as each translation's permutation is known to move both); or it
        is received in place (same buffer, same chunks), the permutation then mapping both ends alike.  Being
        so on the representatives, it is so on every image."""
        sym = self.grid.sym
        mine, theirs = (sym.class_of(rank), k), (sym.class_of(rep), m)
        if all((mine not in twisted and theirs not in twisted) or _alike(twisted.get(mine), twisted.get(theirs))
               for twisted in self.group.twisted.values()):
            return True
        template = sym.templates[theirs[0]][m]
        ref = template.dst if op.kind == "send" else template.src
        assert ref is not None
        other = self.grid.chunk_at(ref, peer)
        own = op.src if op.kind == "send" else op.dst
        return other == own

    def _deliver(self, si: int, sk: int, ri: int, rk: int) -> None:
        """The message of representative ``si``'s send ``sk`` as representative ``ri``'s receive ``rk`` gets it:
        from the rank its receive names, the image of ``si``'s data under the shift between them."""
        send, recv = self.programs[si][sk], self.programs[ri][rk]
        assert send.src is not None and recv.dst is not None and recv.peer is not None
        _, shift = self.group.split(recv.peer)
        payload = self.memories[si].read(send.src)
        rank = self.reps[ri]
        if _empty(payload):
            raise _uninitialised(self.schedule, self.reps[si], sk, send.src, payload)
        if any(shift):  # the sender's chunks, each read where its preimage is on the representative
            template = self.grid.sym.templates[self.grid.sym.class_of(self.reps[si])][sk]
            assert template.src is not None
            there = self.grid.chunk_at(template.src, recv.peer)
            back = self.group.chunks(self.group.inverse(shift), there.buffer,
                                     np.arange(there.index, there.index + there.count, dtype=np.int64))
            if back[0] != send.src.index or (np.diff(back) != 1).any():
                memory = self.memories[si]
                cuts = [0, *(np.flatnonzero(np.diff(back) != 1) + 1).tolist(), len(back)]
                payload = _merged([seg for a, b in itertools.pairwise(cuts)
                                   for seg in memory.read(Chunk(there.buffer, int(back[a]), b - a))])
            payload = self.moved(payload, shift)
        _land(self.schedule, rank, rk, recv, self.memories[ri], payload)

    def moved(self, segments: list[Segment], shift: tuple[int, ...]) -> list[Segment]:
        """``segments`` (held data) as the rank ``shift`` away holds them: keys by ``pi`` of the input (and, where
        the output keeps the ranks' inputs apart, the owning rank moved), masks moved."""
        group = self.group
        gathers = self.sp.description.output_split
        c = self.schedule.input_chunks
        out: list[Segment] = []
        for n, key, mask in segments:
            assert key is not None
            keys = np.arange(key, key + n, dtype=np.int64)
            keys = (group.image(keys // c, shift) * c + group.chunks(shift, "i", keys % c) if gathers
                    else group.chunks(shift, "i", keys))
            moved = group.moved_mask(mask, shift)
            cuts = np.flatnonzero(np.diff(keys) != 1) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
                out.append((b - a, int(keys[a]), moved))
        return _merged(out)

    def _check_outputs(self) -> None:
        for rank, mem in zip(self.reps, self.memories):
            expected = self.sp.expected(rank)
            want = _merged([(1, None, 0) if w is None else (1, *w) for w in expected])
            found = mem.outputs()
            if found == want:
                continue
            actual = _values(found)
            for c, w in enumerate(expected):
                if w is not None and actual[c] != w:
                    raise _fail(self.schedule,
                                f"rank {rank} output chunk {c}: " + _explain_value(self.sp, actual[c], w))

    def _deadlock(self, i: int, k: int, posted: list[list[bool]], done: list[list[bool]],
                  partner: list[list[tuple[int, int]]], prev: list[list[int]]) -> Exception:
        """The first operation of a representative that never completes, and what it waits for."""
        op, rank = self.programs[i][k], self.reps[i]
        if posted[i][k]:
            j, m = partner[i][k]
            why = (f"its partner on rank {op.peer} never posts (as {_describe(self.reps[j], m, self.programs[j][m])} "
                   f"on its class's representative)")
        else:
            pending = [d for d in op.deps if not done[i][d]]
            d = pending[0] if pending else prev[i][k]
            why = f"it waits for {_describe(rank, d, self.programs[i][d])}"
        return _fail(self.schedule, f"deadlock: {_describe(rank, k, op)} never completes: {why}",
                     fix="reorder the operations or their deps so that every wait can be met")
