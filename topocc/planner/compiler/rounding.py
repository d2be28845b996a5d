"""Make an encoded schedule consistent: a rank that sends a value encoded keeps the decoded value.

Marking messages encoded (:mod:`topocc.planner.compiler.compress`) breaks an all-reduce's agreement: the
owner of a reduced chunk sends ``decode(encode(x))`` to the others and keeps ``x``.  :func:`make_consistent`
repairs a marked schedule by the rule ZeRO++ and 1-bit Adam use: where an encoded send's value lives on at
its sender (another operation reads it, or it is the sender's result), a *rounding copy* (a ``copy`` of the
chunks onto themselves with the message's encoding) replaces it with its decoded value right after the
operation that produced it, and every operation that reads that value waits for the rounding.  Encodings
are idempotent, so the send then delivers exactly what its sender holds.  A send whose value cannot be
rounded (the input of an out-of-place schedule, a value already decoded from another encoding, a value
whose readers come before its last producer) goes exact instead.

Each round runs the schedule symbolically (:func:`~topocc.planner.analysis.encodings.trace_lineages`),
fixes the sends that deliver something other than what their sender keeps, and removes a rounding that
would re-round an already decoded value (a chain of two roundings on two ranks disagrees), sending its
messages exact; it stops when nothing is left to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from topocc.planner.analysis.collectives import spec
from topocc.planner.analysis.encodings import SAME_ON_EVERY_RANK, Cell, Lineages, trace_lineages
from topocc.runtime.encoding import parse_encoding
from topocc.runtime.matching import streams
from topocc.runtime.schedule import Chunk, Copy, Op, Recv, Reduce, Schedule

__all__ = ["Consistent", "make_consistent"]

#: A chunk's place after in-place aliasing.
Place = tuple[str, int]
#: A value on one rank: its place and the operation that wrote it (None: the input).
ValueAt = tuple[Place, int | None]


@dataclass(frozen=True, slots=True)
class Consistent:
    """A repaired schedule: how many rounding copies it gained and how many marked messages went exact."""

    schedule: Schedule
    roundings: int
    kept_exact: int


@dataclass(frozen=True, slots=True)
class _Rounding:
    """A rounding copy of ``chunk`` on ``rank``, placed after operation ``after`` (-1: first), depending on
    ``producers``, and waited for by ``readers`` (original operation indices); it rounds ``values`` and
    serves ``sends`` ((rank, op index): they go exact if it is undone).  ``redirects``: sends of this rank that
    read the value from the input of an out-of-place schedule, which cannot be rounded, and read the rounded copy
    of it instead (op index, its new src)."""

    rank: int
    chunk: Chunk
    encoding: str
    after: int
    producers: tuple[int, ...]
    readers: frozenset[int]
    values: tuple[ValueAt, ...]
    sends: tuple[tuple[int, int], ...]
    redirects: tuple[tuple[int, Chunk], ...] = ()


class _Values:
    """One rank's program, statically: which operation wrote the value each operation reads (the latest
    writer among its ancestors; race freedom makes it unique), who reads each value and who overwrites it."""

    def __init__(self, schedule: Schedule, rank: int) -> None:
        sp = spec(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks, schedule.root)

        def place(buffer: str, index: int) -> Place:
            return sp.alias(rank, buffer, index) if schedule.inplace else (buffer, index)

        self.place = place
        # the output chunks the collective defines on this rank (a reduce's root alone has a result)
        self.outputs = {place("o", j) for j, want in enumerate(sp.expected(rank)) if want is not None}
        self.writable = {"o", "s"} | ({"i"} if schedule.inplace else set())
        self.reads: dict[tuple[int, Place], int | None] = {}  # (op, place) -> the writer of the value it reads
        self.readers: dict[ValueAt, list[int]] = {}
        self.overwriters: dict[ValueAt, list[int]] = {}  # the first writes after each value (WAR: after a rounding)
        ancestors: list[int] = []
        writers: dict[Place, list[int]] = {}

        def reaching(mask: int, at: Place) -> int | None:
            return next((w for w in reversed(writers.get(at, ())) if (mask >> w) & 1), None)

        for k, op in enumerate(schedule.programs[rank]):
            mask = 0
            for d in op.deps:
                mask |= ancestors[d] | (1 << d)
            ancestors.append(mask)
            for ref in op.reads:
                for j in range(ref.count):
                    at = place(ref.buffer, ref.index + j)
                    writer = self.reads[(k, at)] = reaching(mask, at)
                    self.readers.setdefault((at, writer), []).append(k)
            if op.dst is not None:
                for j in range(op.dst.count):
                    at = place(op.dst.buffer, op.dst.index + j)
                    self.overwriters.setdefault((at, reaching(mask, at)), []).append(k)
                    writers.setdefault(at, []).append(k)

    def escapes(self, k: int, src: Chunk) -> bool:
        """Whether the value send ``k`` reads lives on at its rank: read by another operation, or never
        overwritten in an output chunk."""
        for j in range(src.count):
            at = self.place(src.buffer, src.index + j)
            value = (at, self.reads[(k, at)])
            if any(r != k for r in self.readers.get(value, ())) or (value not in self.overwriters
                                                                      and at in self.outputs):
                return True
        return False


@dataclass(slots=True)
class _State:
    """What the repair has decided so far: each marked send's encoding (dropped ones removed) and the
    rounding copies, with the values each rounds (to refuse a second, different rounding of one value)."""

    marks: dict[tuple[int, int], str]
    roundings: list[_Rounding] = field(default_factory=list)
    rounded: dict[tuple[int, ValueAt], tuple[str, Chunk]] = field(default_factory=dict)
    dropped: int = 0

    def drop(self, rank: int, k: int) -> None:
        if self.marks.pop((rank, k), None) is not None:
            self.dropped += 1


def make_consistent(schedule: Schedule, marks: Mapping[tuple[int, int], str], *, max_rounds: int = 32,
                    redirect: bool = True) -> Consistent:
    """``schedule`` with the sends ``marks`` names ((rank, op index) -> encoding spec) encoded, both ends, and
    the rounding copies that keep every rank's result the same (see the module docstring).  ``redirect``: a
    value in the input of an out-of-place schedule is rounded where a copy put it, and its other readers read it
    there (else the sends that carry it go exact)."""
    state = _State(dict(marks))
    if schedule.collective not in SAME_ON_EVERY_RANK:  # each output chunk lives on one rank: nothing to agree on
        return Consistent(_build(schedule, state)[0], 0, 0)
    plan = _Plan(schedule, [_Values(schedule, r) for r in range(schedule.ranks)],
                 {(b, kr): (a, ks) for (a, b, _), stream in streams(schedule).items() for ks, kr in stream.messages()},
                 redirect)
    for _ in range(max_rounds):
        built, where = _build(schedule, state)
        trace = trace_lineages(built)
        if not plan.fix(state, trace.lineages, {key: trace.encoded_inputs[new] for key, new in where.items()}):
            return Consistent(built, len(state.roundings), state.dropped)
    for key in list(state.marks):  # did not settle: everything exact is consistent
        state.drop(*key)
    state.roundings.clear()
    return Consistent(_build(schedule, state)[0], 0, state.dropped)


def _changes(lineages: Lineages, encoding: str, cells: list[Cell]) -> bool:
    """Whether encoding ``cells`` gives anything but themselves."""
    return lineages.encoded(parse_encoding(encoding), cells, "") != cells


def _already_decoded(lineages: Lineages, cells: list[Cell]) -> bool:
    """Whether some chunk holds a value as decoded from an encoding (other ranks may hold the same bits)."""
    return any(lineages.single_atom(lineage) is not None for _, lineage in cells)


@dataclass(frozen=True, slots=True)
class _Plan:
    """The unmarked schedule, statically: each rank's :class:`_Values`, the send each receive meets, and whether
    to redirect readers of the input (see :func:`make_consistent`)."""

    schedule: Schedule
    values: list[_Values]
    send_of: dict[tuple[int, int], tuple[int, int]]
    redirect: bool

    def fix(self, state: _State, lineages: Lineages, seen: Mapping[tuple[str, int, int], list[Cell]]) -> bool:
        """One round of repairs from what a symbolic run saw (``seen``: what each encoded send and rounding
        read, by ("send" or "round", rank, index)); whether anything changed."""
        changed = False
        for j, rounding in enumerate(list(state.roundings)):  # a rounding of a value decoded before: undo it
            cells = seen[("round", rounding.rank, j)]
            if _already_decoded(lineages, cells) and _changes(lineages, rounding.encoding, cells):
                state.roundings.remove(rounding)
                for rank, k in rounding.sends:
                    state.drop(rank, k)
                changed = True
        if changed:  # the rounded values' records are rebuilt from what remains
            state.rounded = {(r.rank, v): (r.encoding, r.chunk) for r in state.roundings for v in r.values}
            return True
        for (rank, k), encoding in sorted(state.marks.items()):
            if (rank, k) not in state.marks:  # dropped in this round
                continue
            cells = seen[("send", rank, k)]
            if not _changes(lineages, encoding, cells):
                continue
            if _already_decoded(lineages, cells):
                state.drop(rank, k)
                changed = True
                continue
            origins = [self.origin(state, rank, k, j) for j in range(len(cells))]
            src = self.schedule.programs[rank][k].src
            assert src is not None
            if all(o == (rank, k, j) for j, o in enumerate(origins)) and not self.values[rank].escapes(k, src):
                continue  # a fresh value that only this message carries
            changed = True
            if not self.round(state, (rank, k), encoding, origins):
                state.drop(rank, k)
        return changed

    def origin(self, state: _State, rank: int, k: int, j: int) -> tuple[int, int, int]:
        """Where the value chunk ``j`` of send ``k`` carries was made: follow exact receives back to their
        sends; the first operation that read it where something else (a reduction, a copy, the input, an
        encoded message) put it there, as (rank, that reading send, chunk of its src)."""
        programs = self.schedule.programs
        while True:
            op = programs[rank][k]
            assert op.kind == "send"  # the chain runs from send to send
            values = self.values[rank]
            at = values.place(op.src.buffer, op.src.index + j)
            producer = values.reads[(k, at)]
            if producer is None or programs[rank][producer].kind != "recv":
                return rank, k, j
            send = self.send_of[(rank, producer)]
            if send in state.marks:
                return rank, k, j
            dst = programs[rank][producer].dst
            assert dst is not None
            j = next(t for t in range(dst.count) if values.place(dst.buffer, dst.index + t) == at)
            rank, k = send

    def round(self, state: _State, send: tuple[int, int], encoding: str,
              origins: list[tuple[int, int, int]]) -> bool:
        """Add the rounding copies where the values ``send`` carries were made; False where one cannot be."""
        elementwise = parse_encoding(encoding).elementwise
        pieces: list[_Piece] = []
        for rank, k, j in origins:
            piece = self.piece(rank, k, j)
            if piece is None:
                return False
            last = pieces[-1] if pieces else None
            if (last is not None and last.rank == rank and last.chunk.buffer == piece.chunk.buffer
                    and last.chunk.index + last.chunk.count == piece.chunk.index
                    and (not elementwise or last.producers == piece.producers)):
                pieces[-1] = last.joined(piece)
            else:
                pieces.append(piece)
        if not elementwise and len(pieces) != 1:
            return False  # a block encoding rounds the message's elements as one group
        planned = []
        for piece in pieces:
            found = _plan(self.values[piece.rank], state, piece, encoding, send)
            if found is None:
                return False
            planned.append(found)
        for rounding, fresh in planned:
            if fresh:
                state.roundings.append(rounding)
                for value in rounding.values:
                    state.rounded[(rounding.rank, value)] = (encoding, rounding.chunk)
            else:
                found_at = state.roundings.index(rounding)
                state.roundings[found_at] = replace(rounding, sends=(*rounding.sends, send))
        return True

    def piece(self, rank: int, k: int, j: int) -> _Piece | None:
        """The chunk to round for chunk ``j`` of what op ``k`` of ``rank`` reads, where its value can be rounded:
        in place, or (the input of an out-of-place schedule) where a copy put it, its other readers redirected
        there; None where neither can be."""
        programs, values = self.schedule.programs[rank], self.values[rank]
        src = programs[k].src
        assert src is not None
        at = values.place(src.buffer, src.index + j)
        producer = values.reads[(k, at)]
        if src.buffer in values.writable:
            return _Piece(rank, Chunk(src.buffer, src.index + j), (producer,) if producer is not None else (),
                          [(at, producer)], frozenset(), ())
        if not self.redirect:
            return None
        readers = values.readers.get((at, producer), [])
        copy = next((c for c in readers if _copies_into(programs[c], values.writable)), None)
        if copy is None or producer is not None:
            return None
        cop_src, cop_dst = programs[copy].src, programs[copy].dst
        assert cop_src is not None and cop_dst is not None
        redirects = []
        for reader in readers:
            ref = programs[reader].src
            if reader == copy:
                continue
            if programs[reader].kind != "send" or ref is None or ref.buffer != cop_src.buffer or not (
                    cop_src.index <= ref.index and ref.index + ref.count <= cop_src.index + cop_src.count):
                return None  # read other than by a send of a part of the copy's range: cannot be redirected
            redirects.append((reader, Chunk(cop_dst.buffer, cop_dst.index + ref.index - cop_src.index, ref.count)))
        there = Chunk(cop_dst.buffer, cop_dst.index + src.index + j - cop_src.index)
        value = (values.place(there.buffer, there.index), copy)
        return _Piece(rank, there, (copy,), [value], frozenset(r for r, _ in redirects), tuple(redirects))


def _copies_into(op: Op, buffers: AbstractSet[str]) -> bool:
    """Whether ``op`` is a copy into one of ``buffers``."""
    return op.kind == "copy" and op.dst.buffer in buffers


@dataclass(frozen=True, slots=True)
class _Piece:
    """Chunks of one rank to round together: where, after which producers, the values they hold, and the sends
    that will read them there instead of the input (``redirected``, with their new src)."""

    rank: int
    chunk: Chunk
    producers: tuple[int, ...]
    values: list[ValueAt]
    redirected: frozenset[int]
    redirects: tuple[tuple[int, Chunk], ...]

    def joined(self, other: _Piece) -> _Piece:
        """This piece and the next chunk's, as one."""
        return _Piece(self.rank, Chunk(self.chunk.buffer, self.chunk.index, self.chunk.count + other.chunk.count),
                      tuple(sorted(set(self.producers) | set(other.producers))), self.values + other.values,
                      self.redirected | other.redirected, tuple(dict(self.redirects + other.redirects).items()))


def _plan(values: _Values, state: _State, piece: _Piece, encoding: str,
          send: tuple[int, int]) -> tuple[_Rounding, bool] | None:
    """The rounding of ``piece`` for ``send``: an existing one that does the same (and False), a new one (and
    True), or None where a different rounding of the value exists or some reader of it comes before its last
    producer."""
    after = max(piece.producers, default=-1)
    readers: set[int] = set(piece.redirected)
    existing: set[tuple[str, Chunk]] = set()
    for value in piece.values:
        readers.update(values.readers.get(value, ()))
        readers.update(values.overwriters.get(value, ()))
        if (piece.rank, value) in state.rounded:
            existing.add(state.rounded[(piece.rank, value)])
    if existing:
        if existing != {(encoding, piece.chunk)}:
            return None
        same = next(r for r in state.roundings
                    if r.rank == piece.rank and r.chunk == piece.chunk and r.encoding == encoding)
        return same, False
    if any(r <= after for r in readers):
        return None
    return _Rounding(piece.rank, piece.chunk, encoding, after, piece.producers, frozenset(readers),
                     tuple(piece.values), (send,), piece.redirects), True


def _build(schedule: Schedule, state: _State) -> tuple[Schedule, dict[tuple[str, int, int], tuple[int, int]]]:
    """The schedule with the state's encodings (both ends of each marked message) and rounding copies, and
    where each marked send and rounding landed: ("send", rank, original index) or ("round", rank, number)
    -> (rank, new index)."""
    receive_of = {(a, ks): (b, kr) for (a, b, _), stream in streams(schedule).items() for ks, kr in stream.messages()}
    encoding_at: dict[tuple[int, int], str] = {}
    for (rank, k), encoding in state.marks.items():
        encoding_at[(rank, k)] = encoding
        encoding_at[receive_of[(rank, k)]] = encoding
    where: dict[tuple[str, int, int], tuple[int, int]] = {}
    programs = []
    for rank, program in enumerate(schedule.programs):
        mine = [(j, r) for j, r in enumerate(state.roundings) if r.rank == rank]
        at_position: dict[int, list[tuple[int, _Rounding]]] = {}
        for j, r in mine:
            at_position.setdefault(r.after, []).append((j, r))
        new_index: list[int] = []
        rounding_index: dict[int, int] = {}
        order: list[tuple[str, int]] = [("round", j) for j, _ in at_position.get(-1, [])]
        for k in range(len(program)):
            order.append(("op", k))
            order.extend(("round", j) for j, _ in at_position.get(k, []))
        for position, (what, index) in enumerate(order):
            if what == "op":
                new_index.append(position)
            else:
                rounding_index[index] = position
        waits: dict[int, list[int]] = {}
        moved: dict[int, Chunk] = {}
        for j, r in mine:
            for reader in r.readers:
                waits.setdefault(reader, []).append(rounding_index[j])
            moved.update(r.redirects)
        out: list[Op] = []
        for what, index in order:
            if what == "round":
                r = state.roundings[index]
                deps = tuple(sorted(new_index[p] for p in r.producers))
                step = program[r.after].step if r.after >= 0 else 0
                out.append(Copy(r.chunk, r.chunk, r.encoding, deps=deps, step=step))
                where[("round", rank, index)] = (rank, len(out) - 1)
                continue
            op = program[index]
            op = replace(op, deps=tuple(sorted({new_index[d] for d in op.deps} | set(waits.get(index, ())))))
            src, encoded = moved.get(index), encoding_at.get((rank, index))
            if src is not None:
                assert not isinstance(op, Recv)  # only an operation that reads a src is redirected
                op = replace(op, src=src)
            if encoded is not None:
                assert not isinstance(op, Reduce)  # only messages are encoded
                op = replace(op, encoding=encoded)
            out.append(op)
            if (rank, index) in state.marks:
                where[("send", rank, index)] = (rank, len(out) - 1)
        programs.append(tuple(out))
    return replace(schedule.expanded(), programs=tuple(programs)), where
