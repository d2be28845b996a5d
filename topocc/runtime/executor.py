"""Replay one rank's program of a schedule over a transport.

Set-up happens once per (schedule, rank, dtype, element count) in
:class:`Program` and once per set of user buffers in :class:`Binding`; a call
then only starts persistent requests, polls them, and runs numpy ufuncs with
``out=`` on precomputed views, so the hot path allocates no data buffers.

Chunk layout (the runtime's half of the schedule format's contract): a
collective's buffers are split into rank blocks of ``block`` elements (the whole
buffer for allreduce, broadcast and reduce; one rank's part for allgather,
reducescatter and alltoall), each block into ``k`` chunks, and chunk ``j`` of a
block holds ``block // k + (j < block % k)`` elements.  So allgather output chunk
``o`` has the size of input chunk ``o % k`` and reducescatter input chunk ``i``
the size of output chunk ``i % k``.  Scratch chunk ``j`` is a slot of
``ceil(block / k)`` elements at ``j * ceil(block / k)``; how many of them it
holds is inferred from the data flowing into it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from topocc.runtime.arrays import ITEMSIZES, NUMPY_OPS, ArrayOps, same_memory
from topocc.runtime.collective import collective as describe
from topocc.runtime.encoding import Encoding, parse_encoding
from topocc.runtime.errors import CommunicatorError, PeerError
from topocc.runtime.matching import sequence_numbers, streams
from topocc.runtime.schedule import Chunk, Op, Receive, Schedule
from topocc.runtime.symmetric import TemplateOp
from topocc.runtime.transports import GroupTransport, PeerFailure, Transport

__all__ = [
    "Binding",
    "Feedback",
    "Layout",
    "Program",
    "block_elements",
    "message_tag_space",
    "pair_pieces",
]


COPY, REDUCE, SEND, RECV, RECV_REDUCE = range(5)
_KIND = {"copy": COPY, "reduce": REDUCE, "send": SEND, "recv": RECV, "recv_reduce": RECV_REDUCE}


def block_elements(schedule: Schedule, in_count: int, out_count: int) -> int:
    """The rank-block size in elements for buffers of ``in_count``/``out_count`` elements.

    Raises :class:`CommunicatorError` when the two sizes do not fit the collective.
    """
    c, n = describe(schedule.collective), schedule.ranks
    if c.exchanges and in_count % n:
        raise CommunicatorError(f"{c.name} needs a buffer size divisible by {n} ranks, got {in_count} elements")
    block = c.block(n, in_count, out_count)
    want = c.sizes(n, block)
    if (in_count, out_count) != want:
        raise CommunicatorError(
            f"{c.name} on {n} ranks needs {want[0]} input and {want[1]} output elements, got {in_count} and "
            f"{out_count}"
        )
    return block


@dataclass(frozen=True, slots=True)
class Layout:
    """Element offsets and sizes of chunks for one block size (see the module docstring)."""

    block: int
    k: int

    @property
    def cap(self) -> int:
        """Elements of one scratch slot: the largest chunk."""
        return -(-self.block // self.k)

    def size(self, x: int) -> int:
        j = x % self.k
        return self.block // self.k + (j < self.block % self.k)

    def offset(self, x: int) -> int:
        b, j = divmod(x, self.k)
        return b * self.block + j * (self.block // self.k) + min(j, self.block % self.k)


def _per_rank(schedule: Schedule) -> int:
    """Chunks per rank block (``k``)."""
    return describe(schedule.collective).block(schedule.ranks, schedule.input_chunks, schedule.output_chunks)


def _alias(schedule: Schedule, rank: int, ref: Chunk | None) -> Chunk | None:
    """Where an in-place schedule keeps ``ref`` (:meth:`Collective.alias`: the rule the verifier proves)."""
    if ref is None or not schedule.inplace or ref.buffer == "s":
        return ref
    buffer, index = describe(schedule.collective).alias(rank, ref.buffer, ref.index, _per_rank(schedule))
    return Chunk(buffer, index, ref.count)


def message_tag_space(schedule: Schedule) -> int:
    """How many channels tags must separate: one more than the largest channel used."""
    return 1 + max((op.channel for op in schedule.written_ops()), default=0)


def _chunk_origins(schedule: Schedule, rank: int) -> list[list[int]]:
    """Which chunk each chunk an operation of ``rank`` touches holds (per op, one entry per chunk), by its index
    in the input or output buffer that the chunk's value came from.

    An input or output chunk holds itself; a scratch chunk holds whatever was last put there, so schedules
    using scratch are executed symbolically (all ranks, in dependency order) to learn what each message
    carries.  Sizes (:meth:`Layout.size`) and, for an all-reduce, positions (:meth:`Layout.offset`) follow.
    """
    if schedule.scratch_chunks == 0:
        out = []
        for op in schedule.programs[rank]:
            ref = op.src if op.src is not None else op.dst
            assert ref is not None
            out.append(list(range(ref.index, ref.index + ref.count)))
        return out
    return _infer_with_scratch(schedule)[rank]


def _infer_with_scratch(schedule: Schedule) -> list[list[list[int]]]:
    programs = schedule.programs
    origins: list[list[list[int]]] = [[[] for _ in p] for p in programs]
    content: list[dict[int, int]] = [{} for _ in programs]  # scratch slot -> the chunk it holds
    send_of = {(b, kr): (a, ks) for (a, b, _), stream in streams(schedule).items() for ks, kr in stream.messages()}
    remaining = [[len(op.deps) for op in p] for p in programs]
    succ: list[list[list[int]]] = [[[] for _ in p] for p in programs]
    for r, p in enumerate(programs):
        for k, op in enumerate(p):
            for d in op.deps:
                succ[r][d].append(k)
    sent: dict[tuple[int, int], list[int]] = {}  # what each send carried, by (rank, op), until received
    parked: dict[tuple[int, int], tuple[int, int]] = {}  # receives that came before their sends, by send
    work = [(r, k) for r, p in enumerate(programs) for k, op in enumerate(p) if not op.deps]
    done = 0

    def ref_origins(r: int, ref: Chunk, where: str) -> list[int]:
        if ref.buffer != "s":
            return list(range(ref.index, ref.index + ref.count))
        try:
            return [content[r][x] for x in range(ref.index, ref.index + ref.count)]
        except KeyError:
            raise CommunicatorError(f"{where} reads scratch chunk {ref} before anything is written there") from None

    while work:
        r, k = work.pop()
        op = programs[r][k]
        where = f"rank {r} op {k}"
        if isinstance(op, Receive):
            send = send_of.get((r, k))
            if send is None or send not in sent:  # unmatched (never runs), or its send has not run yet
                if send is not None:
                    parked[send] = (r, k)
                continue
            got = sent.pop(send)
        else:
            got = ref_origins(r, op.src, where)
            if op.kind == "send":
                sent[(r, k)] = got
                if (r, k) in parked:
                    work.append(parked.pop((r, k)))
        if op.dst is not None and op.dst.buffer == "s":
            for t, z in enumerate(got):
                content[r][op.dst.index + t] = z
        origins[r][k] = got
        done += 1
        for s in succ[r][k]:
            remaining[r][s] -= 1
            if remaining[r][s] == 0:
                work.append((r, s))
    if done != schedule.op_count:
        raise CommunicatorError("the schedule cannot complete: some receives have no matching send",
                                fix="verify the schedule with topocc verify")
    return origins


Piece = tuple[str, int, int]  # buffer, element offset, element count


def _pieces(layout: Layout, ref: Chunk, sizes: Sequence[int]) -> list[Piece]:
    """The contiguous element ranges holding ``ref`` (one unless scratch slots are partly filled)."""
    if ref.buffer != "s":
        return [(ref.buffer, layout.offset(ref.index), sum(sizes))]
    out: list[Piece] = []
    cap = layout.cap
    for t, z in enumerate(sizes):
        start = (ref.index + t) * cap
        if out and out[-1][1] + out[-1][2] == start:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + z)
        else:
            out.append(("s", start, z))
    return out


def pair_pieces(*lists: list[Piece]) -> list[tuple[Piece, ...]]:
    """Split piece lists of equal total length at the union of their boundaries, aligned."""
    out = []
    idx = [0] * len(lists)
    used = [0] * len(lists)  # elements consumed of each current piece
    while all(i < len(lst) for i, lst in zip(idx, lists)):
        n = min(lst[i][2] - u for lst, i, u in zip(lists, idx, used))
        if n:
            out.append(tuple((lst[i][0], lst[i][1] + u, n) for lst, i, u in zip(lists, idx, used)))
        for j, lst in enumerate(lists):
            used[j] += n
            if used[j] == lst[idx[j]][2]:
                idx[j], used[j] = idx[j] + 1, 0
    return out


class Program:
    """One rank's program compiled for a dtype and block size: indices, tags, dependency counters, staging.

    Parameters
    ----------
    schedule, rank:
        What to replay, as which rank.
    dtype, block:
        Element type and rank-block size (see :func:`block_elements`).
    tag_ub, channels:
        The transport's largest tag and :func:`message_tag_space` of the schedule;
        a message's tag is ``(sequence * channels + channel) % (tag_ub + 1)``, so
        each message of a (pair, channel) stream has its own tag while it is in
        flight and receives may be posted in any order.
    encode:
        Replay the schedule's encodings (:mod:`topocc.runtime.encoding`) where they can carry ``dtype``
        (every rank must pass the same); False replays every message and copy exact.
    """

    def __init__(self, schedule: Schedule, rank: int, dtype: Any, block: int, *, tag_ub: int,
                 channels: int, ops: ArrayOps = NUMPY_OPS, encode: bool = False) -> None:
        self.schedule = schedule
        self.ops = ops
        self.rank = rank
        self.dtype = dtype
        self.block = block
        self.layout = layout = Layout(block, _per_rank(schedule))
        program = schedule.programs[rank]
        self.n = len(program)
        self.origins = _chunk_origins(schedule, rank)
        sizes = [[layout.size(x) for x in chunks] for chunks in self.origins]
        seqs = sequence_numbers(program)
        self.kinds = [_KIND[op.kind] for op in program]
        self.peers = [op.peer for op in program]
        self.channels = [op.channel for op in program]
        self.tags = [(s * channels + op.channel) % (tag_ub + 1) if s >= 0 else -1 for s, op in zip(seqs, program)]
        self.ndeps = [len(op.deps) for op in program]
        self.succ: list[list[int]] = [[] for _ in program]
        for k, op in enumerate(program):
            for d in op.deps:
                self.succ[d].append(k)
        self.roots = [k for k in range(self.n) if not self.ndeps[k]][::-1]
        src = [_alias(schedule, rank, op.src) for op in program]
        dst = [_alias(schedule, rank, op.dst) for op in program]
        self.src_pieces = [_pieces(layout, s, z) if s is not None else [] for s, z in zip(src, sizes)]
        self.dst_pieces = [_pieces(layout, d, z) if d is not None else [] for d, z in zip(dst, sizes)]
        self.msg_len = [sum(z) for z in sizes]
        self.buffers_used = {p[0] for ps in (*self.src_pieces, *self.dst_pieces) for p in ps}
        self.writes = {p[0] for ps in self.dst_pieces for p in ps}
        # The input is only read by copies onto the same place of the output that nothing precedes: an
        # in-place call may then bind the input to the output's memory (those copies become no work) instead
        # of copying the user's buffer to a private input first.
        self.input_copied_in_place = "i" in self.buffers_used and all(
            self.kinds[k] == COPY and not self.ndeps[k] and all(d[0] == "o" for d in self.dst_pieces[k])
            and [p[1:] for p in self.src_pieces[k]] == [p[1:] for p in self.dst_pieces[k]]
            for k in range(self.n) if any(p[0] == "i" for p in self.src_pieces[k]))
        # staging: a message that is not one contiguous piece, and every received operand of a reduction
        self.staging: dict[int, Any] = {}
        self.codecs = _codecs(program, ops, dtype) if encode else {}
        # whether some rank's program encodes (the same on every rank: what a call's error feedback agrees on)
        self.encoded = bool(encode and _codecs([op for op in schedule.written_ops() if op.encoding is not None],
                                               ops, dtype))
        for k, kind in enumerate(self.kinds):
            pieces = self.src_pieces[k] if kind == SEND else self.dst_pieces[k]
            if kind == RECV_REDUCE or (kind in (SEND, RECV) and len(pieces) > 1) or (kind == COPY and k in self.codecs):
                self.staging[k] = ops.empty(self.msg_len[k], dtype)
        # an encoded message travels as bytes; a rounding copy encodes into them and decodes back
        itemsize = ITEMSIZES[ops.dtype_name(dtype)]
        self.wire = {k: ops.empty_bytes(codec.wire_bytes(self.msg_len[k], itemsize))
                     for k, codec in self.codecs.items()}
        self.scratch = ops.empty(schedule.scratch_chunks * layout.cap, dtype)
        self._bindings: dict[tuple[int, ...], Any] = {}
        self._owned: dict[str, Any] = {}

    def owned(self, buffer: str) -> Any:
        """A buffer of this program's own (allocated on first use), for inputs the caller must not see change."""
        arr = self._owned.get(buffer)
        if arr is None:
            arr = self._owned[buffer] = self.ops.empty(self.elements(buffer), self.dtype)
        return arr

    def elements(self, buffer: str) -> int:
        """Elements a buffer must have (``i`` and ``o``; scratch is owned here)."""
        if buffer == "s":
            return len(self.scratch)
        chunks = self.schedule.chunk_count(buffer)
        return self.layout.offset(chunks - 1) + self.layout.size(chunks - 1)

    def positions(self, k: int) -> list[tuple[int, int]]:
        """Where the elements operation ``k`` moves lie in the input of an all-reduce or a reduce-scatter (whose
        chunk ``x`` is one piece of the sum on every rank), in the operation's order: ``(offset, count)`` runs
        (the chunks it holds, wherever the schedule keeps them)."""
        runs: list[tuple[int, int]] = []
        for x in self.origins[k]:
            start, count = self.layout.offset(x), self.layout.size(x)
            if runs and runs[-1][0] + runs[-1][1] == start:
                runs[-1] = (runs[-1][0], runs[-1][1] + count)
            else:
                runs.append((start, count))
        return runs

    def bind(self, transport: Any, buffers: Mapping[str, Any], cache: int = 4,
             make: Callable[[Program, Any, Mapping[str, Any]], Any] | None = None) -> Any:
        """Views and persistent requests for these buffers, reused while the same buffers come back.

        ``make(program, transport, buffers)`` builds a binding other than :class:`Binding` (the lowered
        replay's); it must have ``free()``.
        """
        key = tuple(self.ops.address(buffers[b]) if buffers.get(b) is not None else 0 for b in ("i", "o"))
        binding = self._bindings.pop(key, None)
        if binding is None:
            binding = (make or Binding)(self, transport, {**buffers, "s": self.scratch})
            if len(self._bindings) >= cache:
                oldest = next(iter(self._bindings))
                self._bindings.pop(oldest).free()
        self._bindings[key] = binding  # most recent last
        return binding

    def free(self) -> None:
        """Free every binding's persistent requests."""
        for binding in self._bindings.values():
            binding.free()
        self._bindings.clear()

    def run(self, binding: Binding[Transport], reduce: Callable[..., Any], timeout: float, what: str,
            events: list[tuple[int, float, float]] | None = None, feedback: Feedback | None = None) -> None:
        """Execute the program once: start ops as their dependencies complete, poll, reduce in place.

        With ``events`` (a list), append ``(op index, start, end)`` in ``time.perf_counter()`` seconds for
        every operation (a message: from its start until this rank saw it complete); None records nothing.
        With ``feedback``, the encoded sends and rounding copies encode through it (:class:`Feedback`).
        """
        replay = _Replay(self, binding, reduce, events, feedback)
        transport = binding.transport
        test_some, idle = transport.test_some, os.sched_yield
        deadline = time.monotonic() + timeout
        while True:
            if replay.ready:
                replay.issue()
            if replay.starting:
                try:
                    transport.start(replay.starting)
                except PeerFailure as exc:
                    raise self.failure(str(exc), replay.active_ops, exc.peers, what) from None
                replay.active.extend(replay.starting)
                replay.starting = []
            if replay.done == self.n:
                return
            try:
                finished = test_some(replay.active)
            except PeerFailure as exc:
                raise self.failure(str(exc), replay.active_ops, exc.peers, what) from None
            if finished:
                replay.retire(finished)
            elif time.monotonic() > deadline:
                raise self.failure(f"timed out after {timeout:g} s", replay.active_ops, (), what)
            else:
                idle()  # let a peer sharing this core run (ranks often outnumber cores)

    def failure(self, reason: str, active_ops: Sequence[int], peers: Sequence[int], what: str) -> PeerError:
        """One line naming the peers this rank was still waiting for (``peers``: those whose link failed)."""
        waiting = sorted({p for k in active_ops if (p := self.peers[k]) is not None} | set(peers))
        detail = []
        for k in active_ops[:4]:
            verb = "send to" if self.kinds[k] == SEND else "receive from"
            detail.append(f"op {k}: {verb} rank {self.peers[k]}" + (f" ch {self.channels[k]}" if self.channels[k]
                                                                      else ""))
        more = f", +{len(active_ops) - 4} more" if len(active_ops) > 4 else ""
        who = ", ".join(map(str, waiting)) if waiting else "none (no message pending)"
        return PeerError(
            f"{reason} waiting for rank(s) {who} ({'; '.join(detail)}{more})",
            where=f"rank {self.rank}: {what}",
            fix="a peer died, hangs, or runs a different schedule; check its output",
            failed=sorted(set(peers)), waiting=waiting,
        )


def _codecs(program: Sequence[Op | TemplateOp], ops: ArrayOps, dtype: Any) -> dict[int, Encoding]:
    """The operations whose encoding can carry ``dtype`` here (both ends of a message decide alike): float data
    an encoding makes smaller, in memory numpy can see (CPU).  ``program`` may be a symmetric schedule's
    templates (:meth:`Schedule.written_ops`): what an operation encodes is the same on every rank of a class."""
    name = ops.dtype_name(dtype)
    itemsize = ITEMSIZES[name]
    if not any(op.encoding for op in program) or ops.host(ops.empty(1, dtype)) is None:
        return {}
    found = {k: parse_encoding(op.encoding) for k, op in enumerate(program) if op.encoding is not None}
    return {k: codec for k, codec in found.items() if codec.carries(name, itemsize)}


class Feedback(Protocol):
    """What an encoded replay tells error feedback (:mod:`topocc.runtime.feedback`): it encodes each encoded
    send's elements (``data``, in message order) into ``wire``, and each rounding copy's, decoding them back
    into ``data``; and it keeps what the encoding dropped at :meth:`Program.positions` of the operation."""

    def send(self, program: Program, k: int, codec: Encoding, data: np.ndarray, wire: np.ndarray) -> None:
        """Encode send ``k``'s elements ``data`` into ``wire``."""

    def round(self, program: Program, k: int, codec: Encoding, data: np.ndarray, wire: np.ndarray) -> None:
        """Replace rounding copy ``k``'s elements ``data`` by their decoded encoding (``wire``: its bytes)."""


class _Replay:
    """One execution of a :class:`Program` (see :meth:`Program.run`): the operations ready to start, the
    requests in flight and their operations, and how many operations are done."""

    __slots__ = ("active", "active_ops", "binding", "done", "events", "feedback", "program", "ready", "reduce",
                 "remaining", "started", "starting")

    def __init__(self, program: Program, binding: Binding[Transport], reduce: Callable[..., Any],
                 events: list[tuple[int, float, float]] | None, feedback: Feedback | None = None) -> None:
        self.program = program
        self.binding = binding
        self.reduce = reduce
        self.events = events
        self.feedback = feedback
        self.remaining = program.ndeps.copy()  # dependencies each operation still waits for
        self.ready = program.roots.copy()
        self.starting: list[Any] = []  # requests to start
        self.active: list[Any] = []  # requests started and not yet complete
        self.active_ops: list[int] = []  # the operations of ``starting`` and ``active``, in that order
        self.started: dict[int, float] = {}  # with events: when each operation in progress started
        self.done = 0

    def issue(self) -> None:
        """Take every ready operation: a send's or receive's request is to start (a staged send packed first),
        a local copy or reduction runs at once (and may make others ready)."""
        program, binding, reduce, events = self.program, self.binding, self.reduce, self.events
        kinds, reqs, local, packs = program.kinds, binding.requests, binding.local, binding.packs
        encodes, rounds = binding.encodes, binding.rounds
        copyto = program.ops.copyto
        ready, starting, active_ops = self.ready, self.starting, self.active_ops
        while ready:
            k = ready.pop()
            kind = kinds[k]
            if events is not None:
                self.started[k] = time.perf_counter()
            if kind >= SEND:
                if kind == SEND and k in packs:
                    for d, s in packs[k]:
                        copyto(d, s)
                if k in encodes:
                    codec, data, wire = encodes[k]
                    if self.feedback is None:
                        codec.encode(data, wire)
                    else:
                        self.feedback.send(program, k, codec, data, wire)
                starting.append(reqs[k])
                active_ops.append(k)
                continue
            if k in rounds:
                rounds[k].run(copyto, self.feedback)
            elif kind == COPY:
                for d, s in local[k]:
                    copyto(d, s)
            else:
                for d, s in local[k]:
                    reduce(d, s, out=d)
            self.finish(k)

    def retire(self, finished: Sequence[int]) -> None:
        """The requests at positions ``finished`` of the active ones completed: unpack or reduce what they
        received, finish their operations, and drop them from the active lists."""
        kinds, unpacks, folds = self.program.kinds, self.binding.unpacks, self.binding.folds
        decodes = self.binding.decodes
        copyto, reduce = self.program.ops.copyto, self.reduce
        active_ops = self.active_ops
        for j in finished:
            k = active_ops[j]
            kind = kinds[k]
            if k in decodes:  # decoded on receipt, before it is stored or reduced
                codec, wire, data = decodes[k]
                codec.decode(wire, data)
            if kind == RECV_REDUCE:
                for d, left, s in folds[k]:
                    reduce(left, s, out=d)
            elif kind == RECV and k in unpacks:
                for d, s in unpacks[k]:
                    copyto(d, s)
            self.finish(k)
        if len(finished) == len(self.active):
            self.active = []
            self.active_ops = []
        else:
            gone = set(finished)
            self.active = [r for j, r in enumerate(self.active) if j not in gone]
            self.active_ops = [k for j, k in enumerate(active_ops) if j not in gone]

    def finish(self, k: int) -> None:
        """Operation ``k`` is done: record its interval, and make ready the operations it was the last wait of."""
        if self.events is not None:
            self.events.append((k, self.started.pop(k), time.perf_counter()))
        self.done += 1
        remaining, ready = self.remaining, self.ready
        for s in self.program.succ[k]:
            remaining[s] -= 1
            if not remaining[s]:
                ready.append(s)


#: The transport a binding's requests live on: a dataflow replay's, or a group transport's (the lowered replay).
_AnyTransport = TypeVar("_AnyTransport", bound="Transport | GroupTransport")


class Binding(Generic[_AnyTransport]):
    """Views of one set of buffers and the persistent requests on them (made once, started every call).

    ``tags`` replaces the program's message tags (a group transport names messages by operation index);
    with ``skip_empty``, messages of no elements get no request (both ends know the sizes).  Without
    ``requests`` no request is made: ``buffers[k]`` is what message ``k`` moves, for a caller that posts
    messages of its own (the lowered replay's bundles).
    """

    def __init__(self, program: Program, transport: _AnyTransport, buffers: Mapping[str, Any], *,
                 tags: Sequence[int] | None = None, skip_empty: bool = False, requests: bool = True) -> None:
        self.transport = transport
        tags = program.tags if tags is None else tags

        def view(p: Piece) -> Any:
            return buffers[p[0]][p[1]:p[1] + p[2]]

        for name in program.buffers_used:
            if buffers.get(name) is None:
                raise CommunicatorError(f"the schedule uses buffer {name!r} but none was given")
        self.requests: dict[int, Any] = {}
        self.buffers: dict[int, Any] = {}
        self.local: dict[int, list[tuple[Any, Any]]] = {}
        self.packs: dict[int, list[tuple[Any, Any]]] = {}
        self.unpacks: dict[int, list[tuple[Any, Any]]] = {}
        self.folds: dict[int, list[tuple[Any, Any, Any]]] = {}
        self.encodes: dict[int, tuple[Encoding, Any, Any]] = {}  # codec, the message's elements, its bytes
        self.decodes: dict[int, tuple[Encoding, Any, Any]] = {}  # codec, the bytes received, where they decode
        self.rounds: dict[int, _Rounding] = {}
        for k, kind in enumerate(program.kinds):
            src, dst = program.src_pieces[k], program.dst_pieces[k]
            stage = program.staging.get(k)
            if kind == COPY and k in program.codecs:
                self.rounds[k] = _Rounding(program, k, view, src, dst)
                continue
            if kind == COPY:  # a piece copied onto itself (the input bound to the output's memory) is no work
                pairs = [(view(d), view(s)) for s, d in pair_pieces(src, dst)]
                self.local[k] = [(d, s) for d, s in pairs if not same_memory(program.ops, d, s)]
                continue
            if kind == REDUCE:
                self.local[k] = [(view(d), view(s)) for s, d in pair_pieces(src, dst)]
                continue
            peer, tag = program.peers[k], tags[k]
            assert peer is not None
            if skip_empty and not program.msg_len[k]:
                continue
            staged = [("@", 0, program.msg_len[k])]
            if kind == SEND:
                if stage is None:
                    buf = view(src[0]) if src else program.ops.empty(0, program.dtype)
                else:
                    buf = stage
                    self.packs[k] = [(stage[b[1]:b[1] + b[2]], view(a)) for a, b in pair_pieces(src, staged)]
            elif kind == RECV:
                if stage is None:
                    buf = view(dst[0]) if dst else program.ops.empty(0, program.dtype)
                else:
                    buf = stage
                    self.unpacks[k] = [(view(a), stage[b[1]:b[1] + b[2]]) for a, b in pair_pieces(dst, staged)]
            else:
                assert stage is not None
                left = src if src else dst
                self.folds[k] = [(view(d), view(a), stage[s[1]:s[1] + s[2]])
                                 for d, a, s in pair_pieces(dst, left, staged)]
                buf = stage
            codec = program.codecs.get(k)
            if codec is not None:  # the message travels as its encoding's bytes
                host = program.ops.host
                if kind == SEND:  # buf: the elements (the source's view, or the staging they are packed into)
                    self.encodes[k] = (codec, host(buf), host(program.wire[k]))
                else:  # buf: where the elements go (the destination's view, or the staging)
                    self.decodes[k] = (codec, host(program.wire[k]), host(buf))
                buf = program.wire[k]
            self.buffers[k] = buf
            if requests:
                init = transport.send_init if kind == SEND else transport.recv_init
                self.requests[k] = init(buf, peer, tag)

    def free(self) -> None:
        self.transport.free(list(self.requests.values()))
        self.requests.clear()


class _Rounding:
    """A rounding copy bound to its buffers: ``dst := decode(encode(src))`` over the copy's elements in order
    (as a message of the same chunks would encode them), through the program's staging and wire bytes."""

    __slots__ = ("codec", "data", "k", "packs", "program", "unpacks", "wire")

    def __init__(self, program: Program, k: int, view: Callable[[Piece], Any], src: list[Piece],
                 dst: list[Piece]) -> None:
        stage, whole = program.staging[k], [("@", 0, program.msg_len[k])]
        self.program, self.k = program, k
        self.codec = program.codecs[k]
        self.packs = [(stage[b[1]:b[1] + b[2]], view(a)) for a, b in pair_pieces(src, whole)]
        self.unpacks = [(view(a), stage[b[1]:b[1] + b[2]]) for a, b in pair_pieces(dst, whole)]
        data, wire = program.ops.host(stage), program.ops.host(program.wire[k])
        assert data is not None and wire is not None  # codecs exist only where the memory has a numpy view
        self.data, self.wire = data, wire

    def run(self, copyto: Callable[[Any, Any], None], feedback: Feedback | None = None) -> None:
        for d, s in self.packs:
            copyto(d, s)
        if feedback is None:
            self.codec.encode(self.data, self.wire)
            self.codec.decode(self.wire, self.data)
        else:
            feedback.round(self.program, self.k, self.codec, self.data, self.wire)
        for d, s in self.unpacks:
            copyto(d, s)
