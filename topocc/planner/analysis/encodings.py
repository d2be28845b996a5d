"""What an encoded schedule delivers: which output chunks are approximate, and whether every rank agrees.

An encoded message delivers ``decode(encode(x))`` (:mod:`topocc.runtime.encoding`): the dataflow is the
exact one, which :func:`topocc.planner.analysis.verify.verify` proves, but a value that came through an
encoding is an approximation, and two ranks that hold the same output chunk by different routes (one
exact, one decoded; or decoded from differently grouped messages) end with different bits.  This module
executes the schedule once more, symbolically, following each chunk's *lineage*: the exact contributions
it holds and the encodings it came through.

A lineage is a set of parts, reduced by union (reductions are associative and commutative, as the
verifier assumes): ``(key, rank)`` is rank's exact contribution to logical chunk ``key``; an integer is
an *atom*, the value that came out of one encoding of one value.  An atom is named by what determines its
bits: the encoding and the encoded value (for an elementwise encoding, the chunk's own key and lineage;
for a block encoding, the whole message's keys and lineages, and the chunk's place in it).  Encodings are
idempotent, so encoding an atom again the same way gives the atom itself.  Two output chunks hold the same
bits exactly when their lineages are equal; :func:`check_encodings` proves that every rank ends an
all-reduce, all-gather or broadcast with equal lineages, chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from topocc.planner.analysis.collectives import CollectiveSpec, spec
from topocc.planner.errors import VerificationError
from topocc.runtime.collective import DESCRIPTIONS
from topocc.runtime.collective import collective as describe
from topocc.runtime.encoding import Encoding, parse_encoding
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.matching import streams
from topocc.runtime.schedule import Chunk, Copy, Receive, Reduce, Schedule

__all__ = ["SAME_ON_EVERY_RANK", "Cell", "EncodingReport", "LineageTrace", "Lineages", "check_encodings", "is_encoded",
           "trace_lineages"]

#: Collectives whose output is the same on every rank (:attr:`Collective.replicates`): these must end with the
#: same bits everywhere.
SAME_ON_EVERY_RANK = frozenset(c.name for c in DESCRIPTIONS if c.replicates)

#: A chunk's symbolic value: its logical key and its lineage's id.
Cell = tuple[int, int]


@dataclass(frozen=True, slots=True)
class LineageTrace:
    """One symbolic run: the lineages, every rank's output chunks, and what each encoded send and rounding
    copy read (its cells before encoding), by (rank, operation index)."""

    lineages: Lineages
    outputs: list[list[Cell | None]]
    encoded_inputs: dict[tuple[int, int], list[Cell]]


@dataclass(frozen=True, slots=True)
class EncodingReport:
    """What an encoded schedule carries: its encoded messages and rounding copies, the encodings it uses,
    and per rank the output chunks that end approximate (decoded from some encoding)."""

    encoded_messages: int
    rounding_copies: int
    encodings: tuple[str, ...]
    approximate: tuple[tuple[int, ...], ...]

    @property
    def approximate_chunks(self) -> int:
        """Output chunks, over all ranks, that hold an approximate value."""
        return sum(len(chunks) for chunks in self.approximate)


def is_encoded(schedule: Schedule) -> bool:
    """Whether some operation of ``schedule`` names an encoding."""
    return any(op.encoding is not None for op in schedule.written_ops())


def _fail(schedule: Schedule, message: str, fix: str | None = None) -> VerificationError:
    return VerificationError(message, where=f"{schedule.collective} schedule ({schedule.metadata.algorithm})",
                             fix=fix)


class Lineages:
    """Lineages interned as integers, and the atoms they are made of (see the module docstring)."""

    def __init__(self) -> None:
        self.ids: dict[frozenset[Hashable], int] = {}
        self.parts: list[frozenset[Hashable]] = []
        self.atoms: dict[tuple[Any, ...], int] = {}  # what determines an atom's bits -> its number
        self.atom_key: list[tuple[Any, ...]] = []
        self.origin: list[str] = []  # the operation that first made each atom, for messages
        self._unions: dict[tuple[int, int], int] = {}

    def of(self, parts: frozenset[Hashable]) -> int:
        found = self.ids.get(parts)
        if found is None:
            found = self.ids[parts] = len(self.parts)
            self.parts.append(parts)
        return found

    def union(self, a: int, b: int) -> int:
        key = (a, b) if a < b else (b, a)
        found = self._unions.get(key)
        if found is None:
            found = self._unions[key] = self.of(self.parts[a] | self.parts[b])
        return found

    def atom(self, key: tuple[Any, ...], origin: str) -> int:
        """The lineage holding the one atom ``key`` names."""
        number = self.atoms.get(key)
        if number is None:
            number = self.atoms[key] = len(self.atom_key)
            self.atom_key.append(key)
            self.origin.append(origin)
        return self.of(frozenset((number,)))

    def single_atom(self, lineage: int) -> tuple[Any, ...] | None:
        """The key of the atom a lineage consists of, if it is one atom alone."""
        parts = self.parts[lineage]
        if len(parts) != 1:
            return None
        (part,) = parts
        return self.atom_key[part] if isinstance(part, int) else None

    def approximate(self, lineage: int) -> bool:
        return any(isinstance(part, int) for part in self.parts[lineage])

    def describe(self, lineage: int) -> str:
        """``exact``, or the encodings it came through (the first few)."""
        atoms = sorted(part for part in self.parts[lineage] if isinstance(part, int))
        if not atoms:
            return "exact"
        shown = ", ".join(self.origin[a] for a in atoms[:2])
        return f"decoded from {shown}" + (f" and {len(atoms) - 2} more" if len(atoms) > 2 else "")

    def encoded(self, encoding: Encoding, cells: Sequence[Cell], origin: str) -> list[Cell]:
        """What a message (or rounding copy) of ``cells`` delivers under ``encoding``."""
        spec_ = encoding.spec
        if encoding.elementwise:
            out = []
            for key, lineage in cells:
                found = self.single_atom(lineage)
                if found is not None and found[:2] == (spec_, key):
                    out.append((key, lineage))  # idempotent: an atom of this encoding stays itself
                else:
                    out.append((key, self.atom((spec_, key, lineage), origin)))
            return out
        whole = tuple(cells)
        atoms = [self.single_atom(lineage) for _, lineage in cells]
        first = atoms[0] if atoms else None
        if (first is not None and first[0] == spec_ and len(first[1]) == len(whole)
                and all(a == (spec_, first[1], i) for i, a in enumerate(atoms))):
            return list(whole)  # the same message encoded again: idempotent
        return [(key, self.atom((spec_, whole, i), origin)) for i, (key, _) in enumerate(cells)]


def _encodings(schedule: Schedule, dtype: tuple[str, int] | None) -> dict[str, Encoding]:
    """Every encoding the schedule names, parsed; the two ends of every message alike, and each able to carry
    ``dtype`` (name, item size) if one is given."""
    found: dict[str, Encoding] = {}
    for rank, program in enumerate(schedule.programs):
        for k, op in enumerate(program):
            if op.encoding is None:
                continue
            if op.encoding not in found:
                try:
                    found[op.encoding] = parse_encoding(op.encoding)
                except ScheduleFormatError as exc:
                    raise _fail(schedule, f"rank {rank} op {k}: {exc.message}", exc.fix) from None
            if dtype is not None and not found[op.encoding].carries(*dtype):
                raise _fail(schedule, f"rank {rank} op {k}: {op.encoding} cannot carry {dtype[0]} data",
                            fix="the runtime sends such data exact; compress float data only")
    for (src, dst, _), stream in streams(schedule).items():
        for ks, kr in stream.messages():
            sent, got = schedule.programs[src][ks].encoding, schedule.programs[dst][kr].encoding
            if sent != got:
                raise _fail(schedule, f"rank {dst} op {kr} receives {got or 'exact'} but its send (rank {src} op "
                                      f"{ks}) sends {sent or 'exact'}", fix="give both ends of a message one encoding")
    return found


class _Memory:
    """One rank's chunks, by (buffer, index) after in-place aliasing, each holding a :data:`Cell`."""

    def __init__(self, schedule: Schedule, sp: CollectiveSpec, rank: int, lineages: Lineages) -> None:
        self.schedule, self.sp, self.rank = schedule, sp, rank
        self.cells: dict[tuple[str, int], Cell] = {}
        for j, (key, _) in enumerate(sp.initial(rank)):
            self.cells[self.place("i", j)] = (key, lineages.of(frozenset(((key, rank),))))

    def place(self, buffer: str, index: int) -> tuple[str, int]:
        return self.sp.alias(self.rank, buffer, index) if self.schedule.inplace else (buffer, index)

    def read(self, ref: Chunk) -> list[Cell]:
        return [self.cells[self.place(ref.buffer, ref.index + j)] for j in range(ref.count)]

    def write(self, ref: Chunk, cells: Sequence[Cell]) -> None:
        for j, cell in enumerate(cells):
            self.cells[self.place(ref.buffer, ref.index + j)] = cell


def check_encodings(schedule: Schedule, dtype: tuple[str, int] | None = None) -> EncodingReport:
    """Prove that an encoded schedule ends with the same bits on every rank; say which chunks are approximate.

    Call it on a schedule :func:`~topocc.planner.analysis.verify.verify` proved (it assumes the exact
    dataflow is correct: no deadlock, no race, every reduction well formed).  ``dtype`` (a runtime dtype
    name and its item size) also refuses an encoding that cannot carry that data.  Raises
    :class:`~topocc.planner.errors.VerificationError` naming the output chunk and the two ranks whose
    values differ, with how each came to hold it.
    """
    codecs = _encodings(schedule, dtype)
    sp = spec(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks, schedule.root)
    trace = trace_lineages(schedule, codecs)
    lineages, outputs = trace.lineages, trace.outputs
    if describe(schedule.collective).replicates:
        _check_agreement(schedule, outputs, lineages)
    expected = [sp.expected(r) for r in range(schedule.ranks)]
    approximate = tuple(
        tuple(c for c, cell in enumerate(cells) if want[c] is not None and cell is not None
              and lineages.approximate(cell[1]))
        for cells, want in zip(outputs, expected))
    messages = sum(1 for program in schedule.programs for op in program if op.kind == "send" and op.encoding)
    copies = sum(1 for program in schedule.programs for op in program if op.kind == "copy" and op.encoding)
    return EncodingReport(messages, copies, tuple(sorted(codecs)), approximate)


def trace_lineages(schedule: Schedule, codecs: dict[str, Encoding] | None = None) -> LineageTrace:
    """Run ``schedule`` symbolically, moving lineages (see the module docstring); ``codecs`` are its encodings
    parsed (found here when None).  Assumes the exact dataflow verified."""
    codecs = _encodings(schedule, None) if codecs is None else codecs
    sp = spec(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks, schedule.root)
    lineages = Lineages()
    memories = [_Memory(schedule, sp, r, lineages) for r in range(schedule.ranks)]
    seen: dict[tuple[int, int], list[Cell]] = {}
    _execute(schedule, memories, lineages, codecs, seen)
    outputs = [[mem.cells.get(mem.place("o", c)) for c in range(schedule.output_chunks)] for mem in memories]
    return LineageTrace(lineages, outputs, seen)


def _execute(schedule: Schedule, memories: list[_Memory], lineages: Lineages, codecs: dict[str, Encoding],
             seen: dict[tuple[int, int], list[Cell]]) -> None:
    """Run every operation once its dependencies (and, for a receive, its send) have run, moving lineages;
    ``seen`` gets what each encoded send and rounding copy read."""
    programs = schedule.programs
    send_of = {(b, kr): (a, ks) for (a, b, _), stream in streams(schedule).items() for ks, kr in stream.messages()}
    waiting = [[len(op.deps) for op in program] for program in programs]
    dependents: list[list[list[int]]] = [[[] for _ in program] for program in programs]
    for r, program in enumerate(programs):
        for k, op in enumerate(program):
            for d in op.deps:
                dependents[r][d].append(k)
    sent: dict[tuple[int, int], list[Cell]] = {}
    parked: dict[tuple[int, int], tuple[int, int]] = {}  # receives whose send has not run, by that send
    work = [(r, k) for r, w in enumerate(waiting) for k, n in enumerate(w) if not n]
    while work:
        r, k = work.pop()
        op = programs[r][k]
        mem = memories[r]
        if isinstance(op, Receive):
            send = send_of[(r, k)]
            if send not in sent:
                parked[send] = (r, k)
                continue
            _receive(mem, op, sent.pop(send), lineages)
        elif op.kind == "send":
            cells = mem.read(op.src)
            if op.encoding is not None:
                seen[(r, k)] = cells
                cells = lineages.encoded(codecs[op.encoding], cells, f"{op.encoding} message rank {r} op {k}")
            sent[(r, k)] = cells
            if (r, k) in parked:
                work.append(parked.pop((r, k)))
        else:
            if op.encoding is not None:
                seen[(r, k)] = mem.read(op.src)
            _local(mem, op, lineages, codecs, f"rank {r} op {k}")
        for j in dependents[r][k]:
            waiting[r][j] -= 1
            if not waiting[r][j]:
                work.append((r, j))


def _receive(mem: _Memory, op: Receive, cells: list[Cell], lineages: Lineages) -> None:
    """A receive stores what came; a ``recv_reduce`` reduces it into its left operand."""
    if op.kind == "recv_reduce":
        left = mem.read(op.src if op.src is not None else op.dst)
        cells = [(key, lineages.union(a, b)) for (key, a), (_, b) in zip(left, cells)]
    mem.write(op.dst, cells)


def _local(mem: _Memory, op: Copy | Reduce, lineages: Lineages, codecs: dict[str, Encoding], where: str) -> None:
    """A copy (rounding, with an encoding) or a local reduction."""
    cells = mem.read(op.src)
    if op.kind == "reduce":
        cells = [(key, lineages.union(a, b)) for (key, a), (_, b) in zip(mem.read(op.dst), cells)]
    elif op.encoding is not None:
        cells = lineages.encoded(codecs[op.encoding], cells, f"{op.encoding} rounding copy {where}")
    mem.write(op.dst, cells)


def _check_agreement(schedule: Schedule, outputs: list[list[Cell | None]], lineages: Lineages) -> None:
    """Every rank's output chunk c holds one lineage (so the same bits)."""
    first = outputs[0]
    for rank, cells in enumerate(outputs[1:], 1):
        for c, (mine, theirs) in enumerate(zip(first, cells)):
            if mine is not None and theirs is not None and mine != theirs:
                raise _fail(
                    schedule,
                    f"output chunk {c} differs between ranks: rank 0 holds it {lineages.describe(mine[1])}, "
                    f"rank {rank} {lineages.describe(theirs[1])}",
                    fix="a rank that sends a chunk encoded must keep the decoded value (a rounding copy before "
                        "anything reads it; topocc compile --compress adds them)")
