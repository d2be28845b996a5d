"""The serialized schedule: the contract between the planner and the runtime.

A schedule says, for every rank, an ordered program of operations on chunks of
its input, output and scratch buffers.  The planner writes it (and proves it with
``topocc.planner.analysis.verify``); the runtime reads it and replays it.  It is plain, immutable
data and is stored as versioned JSON (optionally gzip-compressed); the format is
documented in ``docs/schedule-format.md``.

Execution model (what the verifier proves and the runtime relies on):

* an operation may start once every operation listed in its ``deps`` (indices of
  earlier operations of the same rank) has completed;
* the k-th send from rank a to rank b on channel c matches the k-th receive
  posted by b from a on channel c, counted in program order (MPI's non-overtaking
  order, per channel).  A runtime gets this either by tagging each message with
  its sequence number (topocc's executor) or by posting the sends to one peer on
  one channel, and the receives from one peer on one channel, in program order;
  the verifier proves deadlock freedom under the stricter of the two, in-order
  posting (a later one waits until the earlier one is posted, not completed);
* a send and its receive complete together (rendezvous), the strictest model, so
  a schedule that cannot deadlock under it cannot deadlock under eager sends.

A schedule for a source-routed fabric may also record, per connection, which of
the pair's equal-cost network paths it takes (:class:`PathChoice`); replaying it
does not depend on them.  A message (a send and its receive) may travel encoded (``encoding``, one of
:mod:`topocc.runtime.encoding`): the receiver gets an approximation of the chunks; a ``copy`` may name one to
round its destination the same way.
"""

from __future__ import annotations

import enum
import gzip
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from topocc.runtime.collective import NAMES, ROOTED, Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.documents import read_json_document
from topocc.runtime.encoding import parse_encoding
from topocc.runtime.errors import ScheduleFormatError

if TYPE_CHECKING:
    from topocc.runtime.symmetric import Symmetry, TemplateOp

__all__ = [
    "BUFFERS",
    "COLLECTIVES",
    "ENCODABLE",
    "FORMAT",
    "OP_RULES",
    "ROOTED",
    "VERSION",
    "VERSIONS",
    "Chunk",
    "Copy",
    "Message",
    "Metadata",
    "Op",
    "OpFault",
    "OpRule",
    "PathChoice",
    "Receive",
    "Recv",
    "RecvReduce",
    "Reduce",
    "Ref",
    "Schedule",
    "Send",
    "build_schedule",
    "canonical_collective",
    "chunking_problem",
    "dump_schedule",
    "load_schedule",
    "operation",
    "parse_schedule",
    "save_schedule",
    "schedule_to_dict",
    "without_encoding",
]

FORMAT = "topocc-schedule"
#: The newest format version (2 added ``paths``, 3 ``enc``, 4 the symmetric form of
#: :mod:`topocc.runtime.symmetric`); a schedule is written with the oldest that holds it.
VERSION = 4
VERSIONS = (1, 2, 3, 4)

#: Buffer names as stored (MSCCL's letters): input, output, scratch.
BUFFERS = ("i", "o", "s")
#: The collectives' stored names (:mod:`topocc.runtime.collective` describes each; ``ROOTED``: those with a root).
COLLECTIVES = NAMES


def canonical_collective(name: str) -> str:
    """Normalise ``all-reduce``, ``reduce_scatter``, ``AllGather`` ... to the stored names."""
    return describe(name).name


@dataclass(frozen=True, slots=True)
class Chunk:
    """``count`` consecutive chunks of one buffer, starting at ``index``."""

    buffer: str
    index: int
    count: int = 1

    def __str__(self) -> str:
        span = f"{self.index}" if self.count == 1 else f"{self.index}:{self.index + self.count}"
        return f"{self.buffer}[{span}]"


class Ref(enum.Enum):
    """Whether an operation of a kind takes a chunk reference (``src`` or ``dst``)."""

    ABSENT = "absent"
    OPTIONAL = "optional"
    REQUIRED = "required"


#: Read as module globals by the checks that run on every operation: an enum member's lookup costs several times more.
_ABSENT, _REQUIRED = Ref.ABSENT, Ref.REQUIRED


class OpFault(enum.Enum):
    """Why an operation does not fit its kind's :class:`OpRule`; each reader of operations words it its own way."""

    NO_PEER = "no peer"
    PEER_OUT_OF_RANGE = "peer out of range"
    SELF_PEER = "peer is the rank itself"
    STRAY_PEER = "a peer on a local operation"
    NO_SRC = "no src"
    NO_DST = "no dst"
    STRAY_SRC = "a src it does not take"
    STRAY_DST = "a dst it does not take"
    COUNTS_DIFFER = "src and dst counts differ"


@dataclass(frozen=True, slots=True)
class OpRule:
    """What an operation of one kind, written as data, must name (its class, :data:`Op`, holds just that).

    ``peer``: it exchanges a message with another rank (named by ``peer``), else it is local.
    ``src``/``dst``: whether it takes that chunk reference.  A ``src`` and a ``dst`` given together span as
    many chunks.  The loader's two parsers and the verifier check operations by these rules
    (:meth:`peer_fault`, :meth:`refs_fault`), each with its own messages.
    """

    peer: bool
    src: Ref
    dst: Ref

    def peer_fault(self, given: bool, peer: int | None, rank: int, ranks: int) -> OpFault | None:
        """What is wrong with the peer of an operation of rank ``rank`` (``given``: it names one), if anything."""
        if not self.peer:
            return OpFault.STRAY_PEER if given else None
        if not given or peer is None:
            return OpFault.NO_PEER
        if not 0 <= peer < ranks:
            return OpFault.PEER_OUT_OF_RANGE
        return OpFault.SELF_PEER if peer == rank else None

    def refs_fault(self, src: Chunk | None, dst: Chunk | None) -> OpFault | None:
        """What is wrong with an operation's chunk references, if anything: a missing one, then one it does not
        take, then unequal counts."""
        if src is None and self.src is _REQUIRED:
            return OpFault.NO_SRC
        if dst is None and self.dst is _REQUIRED:
            return OpFault.NO_DST
        if src is not None and self.src is _ABSENT:
            return OpFault.STRAY_SRC
        if dst is not None and self.dst is _ABSENT:
            return OpFault.STRAY_DST
        if src is not None and dst is not None and src.count != dst.count:
            return OpFault.COUNTS_DIFFER
        return None


#: The operation kinds and their rules.
OP_RULES: Mapping[str, OpRule] = {
    "send": OpRule(peer=True, src=Ref.REQUIRED, dst=Ref.ABSENT),
    "recv": OpRule(peer=True, src=Ref.ABSENT, dst=Ref.REQUIRED),
    # dst := dst (+) received; a src, if given, replaces dst as the left operand
    "recv_reduce": OpRule(peer=True, src=Ref.OPTIONAL, dst=Ref.REQUIRED),
    "copy": OpRule(peer=False, src=Ref.REQUIRED, dst=Ref.REQUIRED),
    # dst := dst (+) src
    "reduce": OpRule(peer=False, src=Ref.REQUIRED, dst=Ref.REQUIRED),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Operation:
    """What every operation of a rank's program has.

    ``deps`` are indices of earlier operations of the same rank that must have
    completed before this one starts.  ``step`` is the algorithm's logical step
    (for display and tracing); ``channel`` separates independent FIFO streams
    between a pair of ranks.  Every kind also says how many chunks it moves (``count``) and the chunk
    references it reads (``reads``: its ``src``, then its ``dst`` where it reduces into it); it writes its
    ``dst``, if it has one.
    """

    deps: tuple[int, ...] = ()
    step: int = 0
    channel: int = 0


# Each kind holds only the fields it has; those it lacks read as None on the class, so code that handles any
# operation reads ``op.peer``, ``op.src`` or ``op.dst`` and tests for None, and ``op.kind == "send"`` narrows
# the type.  ``encoding`` (a canonical spec of :mod:`topocc.runtime.encoding`, None: exact) is what a message
# carries, named alike by its send and its receive; on a copy, the destination gets ``decode(encode(src))``.


@dataclass(frozen=True, slots=True)
class Send(_Operation):
    """Send chunks ``src`` to rank ``peer``."""

    kind: ClassVar[Literal["send"]] = "send"
    dst: ClassVar[None] = None
    peer: int
    src: Chunk
    encoding: str | None = None

    @property
    def count(self) -> int:
        return self.src.count

    @property
    def reads(self) -> tuple[Chunk, ...]:
        return (self.src,)


@dataclass(frozen=True, slots=True)
class Recv(_Operation):
    """Receive chunks from rank ``peer`` into ``dst``."""

    kind: ClassVar[Literal["recv"]] = "recv"
    src: ClassVar[None] = None
    peer: int
    dst: Chunk
    encoding: str | None = None

    @property
    def count(self) -> int:
        return self.dst.count

    @property
    def reads(self) -> tuple[Chunk, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class RecvReduce(_Operation):
    """Receive chunks from rank ``peer`` and reduce them: ``dst := (src or dst) (+) received``."""

    kind: ClassVar[Literal["recv_reduce"]] = "recv_reduce"
    peer: int
    dst: Chunk
    src: Chunk | None = None
    encoding: str | None = None

    @property
    def count(self) -> int:
        return self.dst.count

    @property
    def reads(self) -> tuple[Chunk, ...]:
        return (self.dst,) if self.src is None else (self.src, self.dst)


@dataclass(frozen=True, slots=True)
class Copy(_Operation):
    """Copy chunks ``src`` to ``dst`` on the rank itself."""

    kind: ClassVar[Literal["copy"]] = "copy"
    peer: ClassVar[None] = None
    src: Chunk
    dst: Chunk
    encoding: str | None = None

    @property
    def count(self) -> int:
        return self.src.count

    @property
    def reads(self) -> tuple[Chunk, ...]:
        return (self.src,)


@dataclass(frozen=True, slots=True)
class Reduce(_Operation):
    """Reduce chunks ``src`` into ``dst`` on the rank itself: ``dst := dst (+) src``."""

    kind: ClassVar[Literal["reduce"]] = "reduce"
    peer: ClassVar[None] = None
    encoding: ClassVar[None] = None
    src: Chunk
    dst: Chunk

    @property
    def count(self) -> int:
        return self.src.count

    @property
    def reads(self) -> tuple[Chunk, ...]:
        return (self.src, self.dst)


#: One operation of a rank's program, of any kind.
Op = Send | Recv | RecvReduce | Copy | Reduce
#: The operations that exchange a message with a peer, and those of them that receive.
Message = Send | Recv | RecvReduce
Receive = Recv | RecvReduce


def without_encoding(op: Op) -> Op:
    """``op`` exact: its encoding, if it names one, dropped."""
    return op if isinstance(op, Reduce) or op.encoding is None else replace(op, encoding=None)


def operation(kind: str, peer: int | None = None, src: Chunk | None = None, dst: Chunk | None = None,
              deps: tuple[int, ...] = (), step: int = 0, channel: int = 0, encoding: str | None = None) -> Op:
    """The operation of ``kind`` with these fields, for code that has the kind as data (a reader, an emitter).

    Raises ValueError where the fields do not fit the kind (:data:`OP_RULES`: a peer, src or dst it lacks or
    does not take; an encoding on a reduce).
    """
    if kind == "send" and peer is not None and src is not None and dst is None:
        return Send(peer, src, encoding, deps=deps, step=step, channel=channel)
    if kind == "recv" and peer is not None and dst is not None and src is None:
        return Recv(peer, dst, encoding, deps=deps, step=step, channel=channel)
    if kind == "recv_reduce" and peer is not None and dst is not None:
        return RecvReduce(peer, dst, src, encoding, deps=deps, step=step, channel=channel)
    if kind == "copy" and peer is None and src is not None and dst is not None:
        return Copy(src, dst, encoding, deps=deps, step=step, channel=channel)
    if kind == "reduce" and peer is None and src is not None and dst is not None and encoding is None:
        return Reduce(src, dst, deps=deps, step=step, channel=channel)
    raise ValueError(f"no {kind!r} operation has peer {peer}, src {src}, dst {dst} and encoding {encoding}")


@dataclass(frozen=True, slots=True)
class PathChoice:
    """The network path that connection ``(src, dst, channel)`` takes: the devices strictly between the two
    ranks, in order (a source-routed fabric lets the sender choose among the pair's equal-cost paths)."""

    src: int
    dst: int
    channel: int
    via: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Metadata:
    """Provenance and prediction: what compiled this schedule, for which topology and sizes."""

    algorithm: str = "unknown"
    options: Mapping[str, Any] = field(default_factory=dict)
    topology: str | None = None
    topology_file: str | None = None
    fingerprint: str | None = None
    min_bytes: int = 0
    max_bytes: int | None = None
    size_bytes: int | None = None
    predicted_time_s: float | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A complete collective schedule: chunking plus one program per rank.

    A symmetric schedule (``symmetry``, :mod:`topocc.runtime.symmetric`) holds one program per class of
    ranks; its ``programs`` builds a rank's program from its class's when first read.
    """

    collective: str
    ranks: int
    input_chunks: int
    output_chunks: int
    programs: Sequence[tuple[Op, ...]]
    scratch_chunks: int = 0
    root: int | None = None
    inplace: bool = False
    metadata: Metadata = field(default_factory=Metadata)
    #: Recorded path choices, sorted by connection (one per connection at most); empty for most fabrics.
    paths: tuple[PathChoice, ...] = ()
    #: The classes of a symmetric schedule, or None for one written rank by rank.
    symmetry: Symmetry | None = None

    def chunk_count(self, buffer: str) -> int:
        return {"i": self.input_chunks, "o": self.output_chunks, "s": self.scratch_chunks}[buffer]

    def __post_init__(self) -> None:
        # the two forms agree by construction: a symmetric schedule's programs are built from its classes (a
        # copy that replaces them goes through expanded(), or it would write the old classes)
        if self.symmetry is not None and getattr(self.programs, "symmetry", None) is not self.symmetry:
            raise ValueError("a symmetric schedule's programs are built from its classes: expand it to replace them")

    @property
    def op_count(self) -> int:
        if self.symmetry is not None:
            sizes = self.symmetry.class_sizes()
            return sum(n * len(t) for n, t in zip(sizes, self.symmetry.templates))
        return sum(len(p) for p in self.programs)

    def written_ops(self) -> Iterable[Op | TemplateOp]:
        """Each operation as the file holds it: every rank's, or each class's template once.  Enough for what
        is the same on every rank of a class (kinds, channels, encodings) without building every program."""
        if self.symmetry is not None:
            return (op for template in self.symmetry.templates for op in template)
        return (op for program in self.programs for op in program)

    def expanded(self) -> Schedule:
        """This schedule with every rank's program written out: itself unless it is in the symmetric form."""
        if self.symmetry is None:
            return self
        return Schedule(self.collective, self.ranks, self.input_chunks, self.output_chunks, tuple(self.programs),
                        self.scratch_chunks, self.root, self.inplace, self.metadata, self.paths)

    def with_metadata(self, **changes: Any) -> Schedule:
        """A copy with some metadata fields replaced."""
        meta = {name: getattr(self.metadata, name) for name in Metadata.__slots__}
        meta.update(changes)
        return Schedule(
            self.collective, self.ranks, self.input_chunks, self.output_chunks, self.programs,
            self.scratch_chunks, self.root, self.inplace, Metadata(**meta), self.paths, self.symmetry,
        )

    def with_paths(self, paths: Iterable[PathChoice]) -> Schedule:
        """A copy recording ``paths`` (sorted by connection) instead of its own."""
        return Schedule(
            self.collective, self.ranks, self.input_chunks, self.output_chunks, self.programs,
            self.scratch_chunks, self.root, self.inplace, self.metadata, _by_connection(paths), self.symmetry,
        )


def _by_connection(paths: Iterable[PathChoice]) -> tuple[PathChoice, ...]:
    return tuple(sorted(paths, key=lambda c: (c.src, c.dst, c.channel)))


# --------------------------------------------------------------------------- serialisation


def _chunk_to_json(chunk: Chunk) -> list[Any]:
    return [chunk.buffer, chunk.index] if chunk.count == 1 else [chunk.buffer, chunk.index, chunk.count]


def _op_to_json(op: Op) -> dict[str, Any]:
    return _fields_to_json(op, op.peer, None if op.src is None else _chunk_to_json(op.src),
                           None if op.dst is None else _chunk_to_json(op.dst))


def _fields_to_json(op: Op | TemplateOp, peer: Any, src: Any, dst: Any) -> dict[str, Any]:
    """An operation's JSON object, its peer and chunk references given as JSON (a symmetric schedule's may be
    formulas)."""
    out: dict[str, Any] = {"op": op.kind}
    if peer is not None:
        out["peer"] = peer
    if src is not None:
        out["src"] = src
    if dst is not None:
        out["dst"] = dst
    if op.deps:
        out["deps"] = list(op.deps)
    out["step"] = op.step
    if op.channel:
        out["ch"] = op.channel
    if op.encoding is not None:
        out["enc"] = op.encoding
    return out


def _program_json(program: Sequence[Op]) -> str:
    """``json.dumps`` of the program's :func:`_op_to_json` dicts, compact, written directly: no dict per
    operation, which is most of the cost of writing a large schedule.  Every field is an int but the op kind and
    the buffer names, which go through ``json.dumps`` (once each) so that any string is escaped as it would be."""
    quoted: dict[str, str] = {}

    def quote(text: str) -> str:
        found = quoted.get(text)
        if found is None:
            found = quoted[text] = json.dumps(text)
        return found

    def chunk(ref: Chunk) -> str:
        if ref.count == 1:
            return f"[{quote(ref.buffer)},{int(ref.index)}]"
        return f"[{quote(ref.buffer)},{int(ref.index)},{int(ref.count)}]"

    ops = []
    for op in program:
        text = '{"op":' + quote(op.kind)
        if op.peer is not None:
            text += f',"peer":{int(op.peer)}'
        if op.src is not None:
            text += ',"src":' + chunk(op.src)
        if op.dst is not None:
            text += ',"dst":' + chunk(op.dst)
        if op.deps:
            text += ',"deps":[' + ",".join(map(str, map(int, op.deps))) + "]"
        text += f',"step":{int(op.step)}'
        if op.channel:
            text += f',"ch":{int(op.channel)}'
        if op.encoding is not None:
            text += ',"enc":' + quote(op.encoding)
        ops.append(text + "}")
    return "[" + ",".join(ops) + "]"


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    """The JSON document for ``schedule`` (see docs/schedule-format.md)."""
    doc = _header(schedule)
    symmetry = _symmetric_form(schedule)
    if symmetry is not None:
        from topocc.runtime.symmetric import symmetry_to_json  # the symmetric form, with the first such schedule

        doc["symmetry"] = symmetry_to_json(symmetry)
        return doc
    doc["programs"] = [[_op_to_json(op) for op in program] for program in schedule.programs]
    if schedule.paths:
        doc["paths"] = [_path_to_json(c) for c in schedule.paths]
    return doc


def _symmetric_form(schedule: Schedule) -> Symmetry | None:
    """The classes ``schedule`` is written by, or None where it is written rank by rank (as one that records
    paths is)."""
    return None if schedule.paths else schedule.symmetry


def _header(schedule: Schedule) -> dict[str, Any]:
    """The document's fields before the programs."""
    meta = schedule.metadata
    return {
        "format": FORMAT,
        "version": _version(schedule),
        "collective": schedule.collective,
        "ranks": schedule.ranks,
        "root": schedule.root,
        "inplace": schedule.inplace,
        "chunks": {
            "input": schedule.input_chunks,
            "output": schedule.output_chunks,
            "scratch": schedule.scratch_chunks,
        },
        "metadata": {
            "algorithm": meta.algorithm,
            "options": dict(meta.options),
            "topology": meta.topology,
            "topology_file": meta.topology_file,
            "fingerprint": meta.fingerprint,
            "min_bytes": meta.min_bytes,
            "max_bytes": meta.max_bytes,
            "size_bytes": meta.size_bytes,
            "predicted_time_s": meta.predicted_time_s,
        },
    }


def _version(schedule: Schedule) -> int:
    """The oldest format version that holds ``schedule``."""
    if _symmetric_form(schedule) is not None:
        return 4
    return 3 if _encoded(schedule) else 2 if schedule.paths else 1


def _encoded(schedule: Schedule) -> bool:
    """Whether some operation names an encoding (the schedule then needs format version 3)."""
    return any(op.encoding is not None for op in schedule.written_ops())


def _path_to_json(choice: PathChoice) -> dict[str, Any]:
    out: dict[str, Any] = {"src": choice.src, "dst": choice.dst}
    if choice.channel:
        out["ch"] = choice.channel
    out["via"] = list(choice.via)
    return out


def dump_schedule(schedule: Schedule) -> str:
    """Compact JSON text: one line per rank program keeps diffs readable."""
    try:
        head = json.dumps(_header(schedule), indent=1, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ScheduleFormatError(
            f"cannot store the schedule's metadata as JSON ({exc})",
            fix="metadata options must be JSON values and numbers finite",
        ) from None
    symmetry = _symmetric_form(schedule)
    if symmetry is not None:
        from topocc.runtime.symmetric import symmetry_to_json  # the symmetric form, with the first such schedule

        section = symmetry_to_json(symmetry)
        lines = [f'  "shape": {json.dumps(section["shape"])}', f'  "ranks": {json.dumps(section["ranks"])}']
        classes = ",\n".join("   " + json.dumps(c, separators=(",", ":")) for c in section["classes"])
        body = ",\n".join(lines) + ',\n  "classes": [\n' + classes + "\n  ]"
        return head[:-2] + ',\n "symmetry": {\n' + body + "\n }\n}\n"
    body = ",\n".join("  " + _program_json(p) for p in schedule.programs)
    text = head[:-2] + ',\n "programs": [\n' + body + "\n ]"
    if schedule.paths:
        paths = (json.dumps(_path_to_json(c), separators=(",", ":")) for c in schedule.paths)
        text += ',\n "paths": [\n' + ",\n".join("  " + c for c in paths) + "\n ]"
    return text + "\n}\n"


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    """Write ``schedule`` to ``path``; a ``.gz`` suffix writes gzip-compressed JSON."""
    text = dump_schedule(schedule)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), compresslevel=6, mtime=0))
    else:
        path.write_text(text)


def load_schedule(path: str | Path) -> Schedule:
    """Read and structurally validate a schedule file (JSON or gzip JSON).

    Structural validation covers the format, version, types, ranges and
    dependency order; whether the schedule computes its collective is the
    verifier's job (``topocc.planner.analysis.verify``).
    """
    return parse_schedule(read_json_document(path, "schedule"), source=str(path))


class _Reader:
    """Typed field access over a JSON document that reports the exact place of a fault."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, place: str, message: str, fix: str | None = None) -> ScheduleFormatError:
        return ScheduleFormatError(message, where=f"{self.source}: {place}" if place else self.source, fix=fix)

    def obj(self, value: Any, place: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(place, f"expected an object, got {_type_name(value)}")
        required = tuple(required)
        allowed = set(required) | set(optional)
        for key in value:
            if key not in allowed:
                raise self.fail(
                    place, f"unknown field {_short(key)}", fix=f"allowed fields are {', '.join(sorted(allowed))}"
                )
        for key in required:
            if key not in value:
                raise self.fail(place, f"missing field {key!r}")
        return value

    def integer(self, value: Any, place: str, low: int | None = None, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(place, f"expected an integer, got {_type_name(value)}")
        if low is not None and value < low:
            raise self.fail(place, f"{value} is below the minimum {low}")
        if high is not None and value > high:
            raise self.fail(place, f"{value} is above the maximum {high}")
        return value

    def number(self, value: Any, place: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(place, f"expected a finite number, got {_type_name(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(place, f"expected a finite number, got {value}")
        if value < 0:
            raise self.fail(place, f"{value} is negative")
        return float(value)

    def string(self, value: Any, place: str) -> str:
        if not isinstance(value, str):
            raise self.fail(place, f"expected a string, got {_type_name(value)}")
        return value

    def array(self, value: Any, place: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(place, f"expected an array, got {_type_name(value)}")
        return value


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters for one-line messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def parse_schedule(doc: Any, source: str = "<schedule>") -> Schedule:
    """Build a :class:`Schedule` from a decoded JSON document, validating every field."""
    r = _Reader(source)
    top = r.obj(
        doc, "", ("format", "version", "collective", "ranks", "chunks"),
        ("root", "inplace", "metadata", "paths", "programs", "symmetry"),
    )
    if top["format"] != FORMAT:
        raise r.fail("format", f"not a topocc schedule (format {_short(top['format'])})", fix=f"expected {FORMAT!r}")
    version = r.integer(top["version"], "version")
    if version not in VERSIONS:
        newer = "upgrade topocc to read it, or " if version > VERSION else ""
        raise r.fail(
            "version",
            f"unsupported schedule format version {version} (this topocc reads versions "
            f"{', '.join(map(str, VERSIONS))})",
            fix=f"{newer}recompile the schedule with this version of topocc",
        )
    if "paths" in top and version < 2:
        raise r.fail("paths", "paths need format version 2", fix="set version to 2")
    body = "symmetry" if version == 4 else "programs"
    if body not in top:
        raise r.fail("", f"missing field {body!r}")
    for stray in ("programs", "paths") if version == 4 else ("symmetry",):
        if stray in top:
            raise r.fail(stray, f"a version-{version} schedule has no {stray}",
                         fix="write programs and paths rank by rank (versions 1-3) or classes (version 4)")
    try:
        collective = canonical_collective(r.string(top["collective"], "collective"))
    except ScheduleFormatError as exc:
        raise r.fail("collective", exc.message, exc.fix) from None
    ranks = r.integer(top["ranks"], "ranks", 1, 1 << 20)
    root = top.get("root")
    if describe(collective).rooted:
        root = r.integer(root, "root", 0, ranks - 1) if root is not None else 0
    elif root is not None:
        raise r.fail("root", f"{collective} has no root", fix="set root to null")
    inplace = top.get("inplace", False)
    if not isinstance(inplace, bool):
        raise r.fail("inplace", f"expected a boolean, got {_type_name(inplace)}")
    chunks = r.obj(top["chunks"], "chunks", ("input", "output"), ("scratch",))
    n_in = r.integer(chunks["input"], "chunks.input", 1, 1 << 24)
    n_out = r.integer(chunks["output"], "chunks.output", 1, 1 << 24)
    n_scratch = r.integer(chunks.get("scratch", 0), "chunks.scratch", 0, 1 << 24)
    problem = chunking_problem(collective, ranks, n_in, n_out)
    if problem:
        raise r.fail("chunks", problem)
    metadata = _parse_metadata(r, top.get("metadata", {}))
    limits = {"i": n_in, "o": n_out, "s": n_scratch}
    if version == 4:
        # the symmetric form, loaded with the first such schedule
        from topocc.runtime.symmetric import SymmetricPrograms, parse_symmetry

        symmetry = parse_symmetry(r, top["symmetry"], ranks, limits)
        return Schedule(collective, ranks, n_in, n_out, SymmetricPrograms(symmetry, source), n_scratch, root, inplace,
                        metadata, (), symmetry)
    programs_doc = r.array(top["programs"], "programs")
    if len(programs_doc) != ranks:
        raise r.fail("programs", f"{len(programs_doc)} rank programs for {ranks} ranks", fix="one program per rank")
    programs = tuple(
        tuple(_quick_op(op, rank, k, ranks, limits)
              or _parse_op(r, op, f"programs[{rank}][{k}]", rank, k, ranks, limits)
              for k, op in enumerate(r.array(program, f"programs[{rank}]")))
        for rank, program in enumerate(programs_doc)
    )
    _check_encodings(r, version, programs)
    paths = _parse_paths(r, top.get("paths", []), ranks, programs)
    return Schedule(collective, ranks, n_in, n_out, programs, n_scratch, root, inplace, metadata, paths)


def _parse_paths(r: _Reader, doc: Any, ranks: int, programs: Sequence[Sequence[Op]]) -> tuple[PathChoice, ...]:
    """``paths``: at most one choice per connection, each naming a connection the programs use."""
    items = r.array(doc, "paths")
    if not items:
        return ()
    connections = {(rank, op.peer, op.channel) for rank, program in enumerate(programs) for op in program
                   if op.kind == "send"}
    seen: set[tuple[int, int, int]] = set()
    choices: list[PathChoice] = []
    for j, item in enumerate(items):
        place = f"paths[{j}]"
        entry = r.obj(item, place, ("src", "dst", "via"), ("ch",))
        src = r.integer(entry["src"], f"{place}.src", 0, ranks - 1)
        dst = r.integer(entry["dst"], f"{place}.dst", 0, ranks - 1)
        channel = r.integer(entry.get("ch", 0), f"{place}.ch", 0, 1 << 16)
        key = (src, dst, channel)
        if key not in connections:
            raise r.fail(place, f"no message goes from rank {src} to rank {dst} on channel {channel}",
                         fix="record paths only for connections the programs use")
        if key in seen:
            raise r.fail(place, f"a second path for rank {src} -> rank {dst} on channel {channel}",
                         fix="record one path per connection")
        seen.add(key)
        via = tuple(r.string(name, f"{place}.via[{k}]") for k, name in enumerate(r.array(entry["via"], f"{place}.via")))
        choices.append(PathChoice(src, dst, channel, via))
    return _by_connection(choices)


def _check_encodings(r: _Reader, version: int, programs: Sequence[Sequence[Op]]) -> None:
    """Encodings need format version 3, and both ends of a message name the same one (the k-th send of a
    connection meets its k-th receive)."""
    encoded = [(rank, k) for rank, program in enumerate(programs) for k, op in enumerate(program)
               if op.encoding is not None]
    if not encoded:
        return
    if version < 3:
        rank, k = encoded[0]
        raise r.fail(f"programs[{rank}][{k}].enc", "encodings need format version 3", fix="set version to 3")
    ends: dict[tuple[int, int, int], tuple[list[int], list[int]]] = {}
    for rank, program in enumerate(programs):
        for k, op in enumerate(program):
            if op.kind == "send":
                ends.setdefault((rank, op.peer, op.channel), ([], []))[0].append(k)
            elif op.kind in ("recv", "recv_reduce"):
                ends.setdefault((op.peer, rank, op.channel), ([], []))[1].append(k)
    for (src, dst, _), (sends, recvs) in ends.items():
        for ks, kr in zip(sends, recvs):
            sent, got = programs[src][ks].encoding, programs[dst][kr].encoding
            if sent != got:
                raise r.fail(f"programs[{dst}][{kr}]",
                             f"receives {got or 'exact'} but its send programs[{src}][{ks}] sends {sent or 'exact'}",
                             fix="give both ends of a message the same enc")


def chunking_problem(collective: str | Collective, ranks: int, n_in: int, n_out: int) -> str | None:
    """Why the input/output chunk counts do not fit the collective's shape, or None if they do."""
    return describe(collective).chunking_problem(ranks, n_in, n_out)


def _parse_metadata(r: _Reader, doc: Any) -> Metadata:
    fields = ("algorithm", "options", "topology", "topology_file", "fingerprint", "min_bytes", "max_bytes",
              "size_bytes", "predicted_time_s")
    meta = r.obj(doc, "metadata", (), fields)

    def opt(name: str, parse: Any) -> Any:
        value = meta.get(name)
        return None if value is None else parse(value, f"metadata.{name}")

    options = meta.get("options", {})
    if not isinstance(options, dict):
        raise r.fail("metadata.options", f"expected an object, got {_type_name(options)}")
    return Metadata(
        algorithm=r.string(meta.get("algorithm", "unknown"), "metadata.algorithm"),
        options=options,
        topology=opt("topology", r.string),
        topology_file=opt("topology_file", r.string),
        fingerprint=opt("fingerprint", r.string),
        min_bytes=r.integer(meta.get("min_bytes", 0), "metadata.min_bytes", 0),
        max_bytes=opt("max_bytes", lambda v, p: r.integer(v, p, 0)),
        size_bytes=opt("size_bytes", lambda v, p: r.integer(v, p, 0)),
        predicted_time_s=opt("predicted_time_s", r.number),
    )


_OP_FIELDS = frozenset(("op", "peer", "src", "dst", "deps", "step", "ch", "enc"))

#: Operation kinds that may name an encoding: a message's two ends, and a rounding copy.
ENCODABLE = frozenset(("send", "recv", "recv_reduce", "copy"))


def _canonical_encoding(text: Any) -> bool:
    """Whether ``text`` is an encoding as the format writes it (anything else goes to :func:`_parse_op`)."""
    if type(text) is not str:
        return False
    try:
        return parse_encoding(text).spec == text
    except ScheduleFormatError:
        return False


def _quick_op(doc: Any, rank: int, k: int, ranks: int, limits: Mapping[str, int]) -> Op | None:
    """:func:`_parse_op` of a well-formed operation, checked without building the places its errors name
    (building them is much of the cost of loading a large schedule); None for anything that :func:`_parse_op`
    might refuse, so that it says why.  As strict as it: the same :class:`OpRule`, and every check of the
    format there has its twin here."""
    if type(doc) is not dict or not _OP_FIELDS.issuperset(doc):
        return None
    kind = doc.get("op")
    if type(kind) is not str:
        return None
    rule = OP_RULES.get(kind)
    if rule is None:
        return None
    given = "peer" in doc
    peer = doc.get("peer")
    if (given and type(peer) is not int) or rule.peer_fault(given, peer, rank, ranks) is not None:
        return None
    src = _quick_chunk(doc["src"], limits) if "src" in doc else None
    dst = _quick_chunk(doc["dst"], limits) if "dst" in doc else None
    if ("src" in doc and src is None) or ("dst" in doc and dst is None) or rule.refs_fault(src, dst) is not None:
        return None
    deps = doc.get("deps", [])
    if type(deps) is not list or not all(type(d) is int and 0 <= d < k for d in deps):
        return None
    step, channel = doc.get("step", 0), doc.get("ch", 0)
    if type(step) is not int or step < 0 or type(channel) is not int or not 0 <= channel <= 1 << 16:
        return None
    encoding = doc.get("enc")
    if "enc" in doc and (kind not in ENCODABLE or not _canonical_encoding(encoding)):
        return None
    return operation(kind, peer, src, dst, tuple(deps), step, channel, encoding)


def _quick_chunk(doc: Any, limits: Mapping[str, int]) -> Chunk | None:
    """:func:`_parse_chunk` of a well-formed chunk reference, or None (see :func:`_quick_op`)."""
    if type(doc) is not list or not 2 <= len(doc) <= 3:
        return None
    buffer, index = doc[0], doc[1]
    count = doc[2] if len(doc) == 3 else 1
    limit = limits.get(buffer) if type(buffer) is str else None
    if limit is None or type(index) is not int or type(count) is not int or index < 0 or count < 1:
        return None
    return Chunk(buffer, index, count) if index + count <= limit else None


def _parse_chunk(r: _Reader, doc: Any, place: str, limits: Mapping[str, int]) -> Chunk:
    items = r.array(doc, place)
    if len(items) not in (2, 3):
        raise r.fail(place, f"a chunk reference is [buffer, index] or [buffer, index, count], got {len(items)} items")
    buffer = items[0]
    if not isinstance(buffer, str) or buffer not in BUFFERS:
        raise r.fail(f"{place}[0]", f"unknown buffer {_short(buffer)}",
                     fix="use 'i' (input), 'o' (output) or 's' (scratch)")
    limit = limits[buffer]
    index = r.integer(items[1], f"{place}[1]", 0)
    count = r.integer(items[2], f"{place}[2]", 1) if len(items) == 3 else 1
    if index + count > limit:
        raise r.fail(
            place,
            f"chunks {index}..{index + count - 1} of buffer {buffer!r} are out of range (it has {limit} chunks)",
        )
    return Chunk(buffer, index, count)


def _parse_op(r: _Reader, doc: Any, place: str, rank: int, k: int, ranks: int, limits: Mapping[str, int]) -> Op:
    op = r.obj(doc, place, ("op",), ("peer", "src", "dst", "deps", "step", "ch", "enc"))
    kind = op["op"]
    if not isinstance(kind, str) or kind not in OP_RULES:
        raise r.fail(f"{place}.op", f"unknown operation {_short(kind)}", fix=f"use one of {', '.join(OP_RULES)}")
    rule = OP_RULES[kind]
    given = "peer" in op
    peer = r.integer(op["peer"], f"{place}.peer", 0, ranks - 1) if given and rule.peer else None
    fault = rule.peer_fault(given, peer, rank, ranks)
    if fault is OpFault.SELF_PEER:
        raise r.fail(f"{place}.peer", f"rank {rank} {kind}s to itself", fix="use copy or reduce for local data")
    if fault is not None:  # a peer out of range was refused above, with its bounds
        raise r.fail(place, f"{kind} needs a peer" if fault is OpFault.NO_PEER else f"{kind} takes no peer")
    src = _parse_chunk(r, op["src"], f"{place}.src", limits) if "src" in op else None
    dst = _parse_chunk(r, op["dst"], f"{place}.dst", limits) if "dst" in op else None
    fault = rule.refs_fault(src, dst)
    if fault is not None:
        raise r.fail(place, _REF_FAULTS[fault].format(kind=kind, src=src, dst=dst))
    deps_doc = r.array(op.get("deps", []), f"{place}.deps")
    deps = tuple(r.integer(d, f"{place}.deps[{j}]", 0) for j, d in enumerate(deps_doc))
    for d in deps:
        if d >= k:
            raise r.fail(
                f"{place}.deps", f"depends on operation {d}, which is not earlier in the program",
                fix="dependencies must point to earlier operations of the same rank",
            )
    step = r.integer(op.get("step", 0), f"{place}.step", 0)
    channel = r.integer(op.get("ch", 0), f"{place}.ch", 0, 1 << 16)
    return operation(kind, peer, src, dst, deps, step, channel, _parse_encoding(r, op, kind, f"{place}.enc"))


def _parse_encoding(r: _Reader, op: Mapping[str, Any], kind: str, place: str) -> str | None:
    """An operation's ``enc``, as its canonical spec (None: exact)."""
    if "enc" not in op:
        return None
    if kind not in ENCODABLE:
        raise r.fail(place, f"a {kind} carries no encoding", fix="name enc on sends, receives and copies only")
    try:
        return parse_encoding(r.string(op["enc"], place)).spec
    except ScheduleFormatError as exc:
        if exc.where:  # r.string's own failure names the place already
            raise
        raise r.fail(place, exc.message, exc.fix) from None


#: How the loader words a fault of an operation's chunk references (``src``/``dst``: the references).
_REF_FAULTS = {
    OpFault.NO_SRC: "{kind} needs a src chunk",
    OpFault.NO_DST: "{kind} needs a dst chunk",
    OpFault.STRAY_SRC: "{kind} takes no src",
    OpFault.STRAY_DST: "{kind} takes no dst",
    OpFault.COUNTS_DIFFER: "src has {src.count} chunks but dst has {dst.count}",
}


def build_schedule(
    collective: str,
    ranks: int,
    input_chunks: int,
    output_chunks: int,
    programs: Sequence[Sequence[Op]],
    *,
    scratch_chunks: int = 0,
    root: int | None = None,
    inplace: bool = False,
    metadata: Metadata | None = None,
    paths: Iterable[PathChoice] = (),
) -> Schedule:
    """Freeze programs built as lists into a :class:`Schedule`."""
    return Schedule(
        canonical_collective(collective), ranks, input_chunks, output_chunks,
        tuple(tuple(p) for p in programs), scratch_chunks, root, inplace, metadata or Metadata(),
        _by_connection(paths),
    )
