"""The symmetric form of a schedule: rank classes, each class's program written once with formulas.

Most of a large cluster is the same thing many times (every host of a pod, every leaf of a fat-tree), and so
are the programs a planner gives its ranks.  This form stores one program per *class* of ranks and the map
from each rank to its class.  Ranks are the points of a grid (``shape``, row-major: rank ``r`` has coordinates
``c`` with ``r = sum(c[d] * stride[d])``), and a class's program is a template whose peers and chunk indices
are affine formulas of a rank's coordinates, ``(offset + sum(coefs[d] * c[d])) mod m``, where ``m`` is the
rank count for a peer and the buffer's chunk count for a chunk index (so a ring's ``rank + 1`` and a
reduce-scatter's ``rank - step`` are one formula each).  A rank's program is its class's template at its
coordinates: what a rank builds at start-up, without the other ranks' programs.

The section is format version 4 of ``docs/schedule-format.md``; :func:`parse_symmetry` reads it and
:func:`symmetry_to_json` writes it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, overload

import numpy as np

from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.matching import StreamKey
from topocc.runtime.schedule import (
    BUFFERS,
    OP_RULES,
    Chunk,
    Op,
    _fields_to_json,
    _parse_encoding,
    _Reader,
    _short,
    operation,
)

__all__ = ["Formula", "SymmetricPrograms", "Symmetry", "TemplateOp", "TemplateRef", "grid_strides", "parse_symmetry",
           "symmetry_to_json"]


def grid_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Each dimension's stride in the row-major grid ``shape``: rank ``r``'s coordinate ``d`` is
    ``r // strides[d] % shape[d]``."""
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


@dataclass(frozen=True, slots=True)
class Formula:
    """``(offset + sum(coefs[d] * c[d])) mod m`` of a rank's coordinates ``c`` (``m`` given where it is used)."""

    offset: int
    coefs: tuple[int, ...]

    def at(self, coords: Sequence[int], modulus: int) -> int:
        return (self.offset + sum(a * c for a, c in zip(self.coefs, coords))) % modulus


#: A field of a template: the same on every rank of the class, or a formula of the rank's coordinates.
Field = int | Formula


def _value(value: Field, coords: Sequence[int], modulus: int) -> int:
    return value if isinstance(value, int) else value.at(coords, modulus)


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """A chunk reference whose first chunk may be a formula (its count is the same on every rank)."""

    buffer: str
    index: Field
    count: int = 1


@dataclass(frozen=True, slots=True)
class TemplateOp:
    """An operation of a class's program: as an :data:`~topocc.runtime.schedule.Op`, with formulas for
    its peer and the first chunks of its references."""

    kind: str
    peer: Field | None = None
    src: TemplateRef | None = None
    dst: TemplateRef | None = None
    deps: tuple[int, ...] = ()
    step: int = 0
    channel: int = 0
    encoding: str | None = None


@dataclass(frozen=True, slots=True)
class _MessageTable:
    """A template's messages as arrays: each one's place in the program, peer formula (a fixed peer as an
    offset with no coefficients), whether it sends, and its channel."""

    places: np.ndarray
    offsets: np.ndarray
    coefs: np.ndarray
    sends: np.ndarray
    channels: np.ndarray

    @classmethod
    def of(cls, template: Sequence[TemplateOp], dims: int) -> _MessageTable:
        places = [k for k, t in enumerate(template) if t.peer is not None]
        peers = [p for t in template if (p := t.peer) is not None]
        return cls(np.array(places, dtype=np.int64),
                   np.array([p if isinstance(p, int) else p.offset for p in peers], dtype=np.int64),
                   np.array([(0,) * dims if isinstance(p, int) else p.coefs for p in peers],
                            dtype=np.int64).reshape(len(places), dims),
                   np.array([template[k].kind == "send" for k in places], dtype=bool),
                   np.array([template[k].channel for k in places], dtype=np.int64))


@dataclass(frozen=True, slots=True)
class Symmetry:
    """The classes of a schedule's ranks: the grid, one template program per class, and each rank's class.

    ``runs`` covers the ranks in order, as (class, number of consecutive ranks in it) pairs; ``limits`` is
    each buffer's chunk count (the modulus of its indices).
    """

    shape: tuple[int, ...]
    templates: tuple[tuple[TemplateOp, ...], ...]
    runs: tuple[tuple[int, int], ...]
    limits: Mapping[str, int]
    #: The first rank of each run.
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: Each class's messages as arrays (see :meth:`stream_keys`), built once asked for.
    _tables: dict[int, _MessageTable] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", (0, *accumulate(n for _, n in self.runs[:-1])))

    @property
    def ranks(self) -> int:
        return math.prod(self.shape)

    def class_of(self, rank: int) -> int:
        """The class of ``rank``."""
        return self.runs[bisect_right(self.starts, rank) - 1][0]

    def class_sizes(self) -> list[int]:
        """How many ranks each class has."""
        sizes = [0] * len(self.templates)
        for cls, n in self.runs:
            sizes[cls] += n
        return sizes

    def coordinates(self, rank: int) -> tuple[int, ...]:
        """``rank``'s point of the grid (row-major: the last dimension varies fastest)."""
        coords = []
        for n in reversed(self.shape):
            rank, c = divmod(rank, n)
            coords.append(c)
        return tuple(reversed(coords))

    def program(self, rank: int, source: str = "<schedule>") -> tuple[Op, ...]:
        """``rank``'s program: its class's template at its coordinates.

        Raises ScheduleFormatError (naming ``source``, the file) where the template does not give this rank a
        valid program (a peer that is the rank itself, a reference that runs past its buffer): formulas stay
        in range by their modulus, the rest is checked here, rank by rank, as each rank builds only its own.
        """
        cls = self.class_of(rank)
        coords = self.coordinates(rank)
        ranks = self.ranks
        out = []
        for k, t in enumerate(self.templates[cls]):
            peer = None if t.peer is None else _value(t.peer, coords, ranks)
            src = None if t.src is None else self._chunk(t.src, coords)
            dst = None if t.dst is None else self._chunk(t.dst, coords)
            if peer == rank or (t.src is not None and src is None) or (t.dst is not None and dst is None):
                raise self._fault(rank, cls, k, source)
            out.append(operation(t.kind, peer, src, dst, t.deps, t.step, t.channel, t.encoding))
        return tuple(out)

    def stream_keys(self, rank: int, among: np.ndarray | None = None) -> list[tuple[int, StreamKey]]:
        """Each message of ``rank``'s program whose peer is one of ``among`` (any where None), in program order,
        as its place in the program and its stream's name there, (whether it sends, its peer, its channel):
        where a rank's messages sit in its program, without building its chunks (a stream's sequence numbers,
        :func:`~topocc.runtime.matching.numbered`, count only the stream's own messages)."""
        cls = self.class_of(rank)
        table = self._tables.get(cls)
        if table is None:
            table = self._tables[cls] = _MessageTable.of(self.templates[cls], len(self.shape))
        peers = (table.offsets + table.coefs @ np.array(self.coordinates(rank), dtype=np.int64)) % self.ranks
        chosen = np.arange(len(peers)) if among is None else np.flatnonzero(np.isin(peers, among))
        return list(zip(table.places[chosen].tolist(),
                        zip(table.sends[chosen].tolist(), peers[chosen].tolist(), table.channels[chosen].tolist())))

    def _chunk(self, ref: TemplateRef, coords: Sequence[int]) -> Chunk | None:
        """``ref`` at ``coords``, or None where it runs past its buffer."""
        limit = self.limits[ref.buffer]
        index = _value(ref.index, coords, limit)
        return Chunk(ref.buffer, index, ref.count) if index + ref.count <= limit else None

    def _fault(self, rank: int, cls: int, k: int, source: str) -> ScheduleFormatError:
        """Why operation ``k`` of class ``cls`` gives ``rank`` no valid operation (built only when one fails)."""
        t, coords = self.templates[cls][k], self.coordinates(rank)
        place = f"{source}: symmetry.classes[{cls}][{k}]"
        for ref in (t.src, t.dst):
            if ref is not None and self._chunk(ref, coords) is None:
                index = _value(ref.index, coords, self.limits[ref.buffer])
                return ScheduleFormatError(
                    f"rank {rank}'s chunks {index}..{index + ref.count - 1} of buffer {ref.buffer!r} are out of "
                    f"range (it has {self.limits[ref.buffer]} chunks)", where=place)
        return ScheduleFormatError(f"rank {rank} {t.kind}s to itself", where=f"{place}.peer",
                                   fix="use copy or reduce for local data")


class SymmetricPrograms(Sequence[tuple[Op, ...]]):
    """Every rank's program of a symmetric schedule, each built from its class's template when first read
    (and kept): a rank that reads only its own program builds only that one."""

    def __init__(self, symmetry: Symmetry, source: str = "<schedule>") -> None:
        self.symmetry = symmetry
        self.source = source
        self._built: dict[int, tuple[Op, ...]] = {}

    def __len__(self) -> int:
        return self.symmetry.ranks

    @overload
    def __getitem__(self, index: int) -> tuple[Op, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[Op, ...]]: ...

    def __getitem__(self, index: int | slice) -> tuple[Op, ...] | Sequence[tuple[Op, ...]]:
        if isinstance(index, slice):
            return [self[r] for r in range(*index.indices(len(self)))]
        rank = index + len(self) if index < 0 else index
        if not 0 <= rank < len(self):
            raise IndexError(index)
        program = self._built.get(rank)
        if program is None:
            program = self._built[rank] = self.symmetry.program(rank, self.source)
        return program

    def __iter__(self) -> Iterator[tuple[Op, ...]]:
        return (self[r] for r in range(len(self)))

    def __eq__(self, other: object) -> bool:
        """Rank by rank, as a sequence of programs is compared (the same classes are the same programs)."""
        if isinstance(other, SymmetricPrograms) and other.symmetry == self.symmetry:
            return True
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to tuples that hash otherwise


# --------------------------------------------------------------------------- the JSON section


def _field_to_json(value: Field) -> Any:
    return value if isinstance(value, int) else [value.offset, *value.coefs]


def _ref_to_json(ref: TemplateRef) -> list[Any]:
    index = _field_to_json(ref.index)
    return [ref.buffer, index] if ref.count == 1 else [ref.buffer, index, ref.count]


def _template_op_to_json(op: TemplateOp) -> dict[str, Any]:
    return _fields_to_json(op, None if op.peer is None else _field_to_json(op.peer),
                           None if op.src is None else _ref_to_json(op.src),
                           None if op.dst is None else _ref_to_json(op.dst))


def symmetry_to_json(symmetry: Symmetry) -> dict[str, Any]:
    """The document's ``symmetry`` section."""
    return {
        "shape": list(symmetry.shape),
        "ranks": [[cls, n] for cls, n in symmetry.runs],
        "classes": [[_template_op_to_json(op) for op in template] for template in symmetry.templates],
    }


def parse_symmetry(r: _Reader, doc: Any, ranks: int, limits: Mapping[str, int]) -> Symmetry:
    """The ``symmetry`` section of a version-4 document, every field checked (each rank's peers and chunk
    ranges are checked when its program is built: :meth:`Symmetry.program`)."""
    top = r.obj(doc, "symmetry", ("shape", "ranks", "classes"))
    shape = tuple(r.integer(n, f"symmetry.shape[{d}]", 1, 1 << 20)
                  for d, n in enumerate(r.array(top["shape"], "symmetry.shape")))
    if not shape or math.prod(shape) != ranks:
        raise r.fail("symmetry.shape", f"a grid of {math.prod(shape) if shape else 0} ranks for {ranks} ranks",
                     fix="the shape's dimensions multiply to the rank count")
    classes = r.array(top["classes"], "symmetry.classes")
    if not classes:
        raise r.fail("symmetry.classes", "no class", fix="give at least one class program")
    templates = tuple(
        tuple(_parse_template_op(r, op, f"symmetry.classes[{c}][{k}]", k, len(shape), ranks, limits)
              for k, op in enumerate(r.array(program, f"symmetry.classes[{c}]")))
        for c, program in enumerate(classes))
    runs = []
    covered = 0
    for j, item in enumerate(r.array(top["ranks"], "symmetry.ranks")):
        pair = r.array(item, f"symmetry.ranks[{j}]")
        if len(pair) != 2:
            raise r.fail(f"symmetry.ranks[{j}]", f"expected [class, count], got {len(pair)} items")
        cls = r.integer(pair[0], f"symmetry.ranks[{j}][0]", 0, len(templates) - 1)
        n = r.integer(pair[1], f"symmetry.ranks[{j}][1]", 1, ranks)
        runs.append((cls, n))
        covered += n
    if covered != ranks:
        raise r.fail("symmetry.ranks", f"the runs cover {covered} ranks of {ranks}",
                     fix="give every rank a class, in order of rank")
    return Symmetry(shape, templates, tuple(runs), dict(limits))


def _parse_field(r: _Reader, doc: Any, place: str, dims: int, modulus: int) -> Field:
    if isinstance(doc, list):
        if len(doc) != dims + 1:
            raise r.fail(place, f"a formula is [offset, one coefficient per dimension], got {len(doc)} items "
                                f"for {dims} dimensions")
        values = [r.integer(v, f"{place}[{j}]", 0, modulus - 1) for j, v in enumerate(doc)]
        return Formula(values[0], tuple(values[1:]))
    return r.integer(doc, place, 0, modulus - 1)


def _parse_template_ref(r: _Reader, doc: Any, place: str, dims: int, limits: Mapping[str, int]) -> TemplateRef:
    items = r.array(doc, place)
    if len(items) not in (2, 3):
        raise r.fail(place, f"a chunk reference is [buffer, index] or [buffer, index, count], got {len(items)} items")
    buffer = items[0]
    if not isinstance(buffer, str) or buffer not in BUFFERS or not limits[buffer]:
        raise r.fail(f"{place}[0]", f"unknown or empty buffer {_short(buffer)}",
                     fix="use 'i' (input), 'o' (output) or 's' (scratch, where chunks.scratch is not 0)")
    limit = limits[buffer]
    count = r.integer(items[2], f"{place}[2]", 1, limit) if len(items) == 3 else 1
    return TemplateRef(buffer, _parse_field(r, items[1], f"{place}[1]", dims, limit), count)


def _parse_template_op(r: _Reader, doc: Any, place: str, k: int, dims: int, ranks: int,
                       limits: Mapping[str, int]) -> TemplateOp:
    op = r.obj(doc, place, ("op",), ("peer", "src", "dst", "deps", "step", "ch", "enc"))
    kind = op["op"]
    if not isinstance(kind, str) or kind not in OP_RULES:
        raise r.fail(f"{place}.op", f"unknown operation {_short(kind)}", fix=f"use one of {', '.join(OP_RULES)}")
    rule = OP_RULES[kind]
    if rule.peer != ("peer" in op):
        raise r.fail(place, f"{kind} needs a peer" if rule.peer else f"{kind} takes no peer")
    peer = _parse_field(r, op["peer"], f"{place}.peer", dims, ranks) if "peer" in op else None
    src = _parse_template_ref(r, op["src"], f"{place}.src", dims, limits) if "src" in op else None
    dst = _parse_template_ref(r, op["dst"], f"{place}.dst", dims, limits) if "dst" in op else None
    # the rule's checks of references look at buffers and counts only, the same on every rank
    fault = rule.refs_fault(*(None if t is None else Chunk(t.buffer, 0, t.count) for t in (src, dst)))
    if fault is not None:
        raise r.fail(place, f"{kind}: {fault.value}")
    deps_doc = r.array(op.get("deps", []), f"{place}.deps")
    deps = tuple(r.integer(d, f"{place}.deps[{j}]", 0) for j, d in enumerate(deps_doc))
    if any(d >= k for d in deps):
        raise r.fail(f"{place}.deps", f"depends on operation {max(deps)}, which is not earlier in the program",
                     fix="dependencies must point to earlier operations of the same class program")
    step = r.integer(op.get("step", 0), f"{place}.step", 0)
    channel = r.integer(op.get("ch", 0), f"{place}.ch", 0, 1 << 16)
    return TemplateOp(kind, peer, src, dst, deps, step, channel, _parse_encoding(r, op, kind, f"{place}.enc"))
