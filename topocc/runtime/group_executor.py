"""Replay one rank's lowered program (:mod:`topocc.runtime.lowering`) over a group transport, for NCCL and MPI alike.

The replay is written once against :class:`~topocc.runtime.transports.GroupTransport`:
for each group in order, copy the sends that need packing into their staging
buffers, post the group's messages, then unpack staged receives, apply each
``recv_reduce``'s reduction, and run the group's local copies and reductions.
On NCCL (``topocc.runtime.transports.nccl``) all of it is enqueued on one CUDA stream
and the call returns at once (stream-ordered, no host round trip per
operation); on MPI (``topocc.runtime.transports.mpi.MPIGroupTransport``) each group is
waited for on the host, with NCCL's matching and rendezvous, so the CPU tests
exercise the very order NCCL runs.

Set-up reuses the dataflow executor's :class:`~topocc.runtime.executor.Program`
(chunk layout, staging, views), so both executors agree on every byte; what
differs is only when operations run.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topocc.runtime.arrays import same_memory
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.executor import REDUCE, SEND, Binding, Program
from topocc.runtime.lowering import RankLowering
from topocc.runtime.transports import GroupTransport, PeerFailure, PeerTimeout

__all__ = ["Bundles", "GroupBinding", "GroupProgram", "Work", "bundle"]


@dataclass(frozen=True, slots=True)
class _Step:
    """One group, bound to buffers: what runs before, during and after its messages."""

    packs: tuple[tuple[Any, Any], ...]  # (staging slice, source view): copied before posting
    messages: tuple[Any, ...]  # the transport's messages, in issue order
    unpacks: tuple[tuple[Any, Any], ...]  # (destination view, staging slice)
    folds: tuple[tuple[Any, Any, Any], ...]  # (destination, left operand, staging slice): dst = left (+) received
    local: tuple[tuple[bool, tuple[tuple[Any, Any], ...]], ...]  # (is a reduction, [(dst, src), ...]) in order
    # the same packs, unpacks and in-place folds as (destinations, sources) for one multi-tensor call each,
    # where no destination overlaps another or a source (else None: one call per piece, in order)
    pack_lists: tuple[list[Any], list[Any]] | None = None
    unpack_lists: tuple[list[Any], list[Any]] | None = None
    fold_lists: tuple[list[Any], list[Any]] | None = None


def _lists(ops: Any, pairs: Sequence[tuple[Any, Any]]) -> tuple[list[Any], list[Any]] | None:
    """``pairs`` as (destinations, sources) if there are several and they are independent: no destination
    overlaps another destination or any source, so doing them all at once equals doing them in order."""
    if len(pairs) < 2:
        return None

    def span(a: Any) -> tuple[int, int]:
        start = ops.address(a)
        return start, start + ops.count(a) * ops.itemsize(a)

    dsts = sorted(span(d) for d, _ in pairs if ops.count(d))
    if any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(dsts)):
        return None
    starts = [a for a, _ in dsts]
    for _, src in pairs:
        lo, hi = span(src)
        j = max(bisect.bisect_right(starts, lo) - 1, 0)
        while j < len(dsts) and dsts[j][0] < hi:
            if dsts[j][1] > lo and hi > lo:
                return None
            j += 1
    return [d for d, _ in pairs], [s for _, s in pairs]


def _in_place_folds(ops: Any, folds: Sequence[tuple[Any, Any, Any]]) -> tuple[list[Any], list[Any]] | None:
    """Folds that all reduce into their left operand (``d = d (op) s``), as independent lists, or None."""
    if not all(same_memory(ops, d, left) for d, left, _ in folds):
        return None
    return _lists(ops, [(d, s) for d, _, s in folds])


@dataclass(frozen=True, slots=True)
class Bundles:
    """A rank's messages joined per group, peer and direction, and the buffer each bundle moves.

    Both ends of a message sit in groups of the same round (:mod:`topocc.runtime.lowering`) and a rank issues a
    pair's messages in the schedule's (channel, sequence) order, so the sends of a rank to a peer in one
    group are exactly the receives the peer posts from it in its group of that round, in the same order:
    each end joins them into one message of the same length on its own.  NCCL's cost is per message and
    group (a handshake through its proxy), not per byte, so a pipelined schedule's many chunks of one step
    then cost one message, not one each.

    A bundle of several messages moves the pieces it covers where they lie end to end in one buffer
    unstaged (``spans``: a pipelined step's chunks of a block), else a staging buffer of its own
    (``shared``), of which each message's staging is a slice (packed before the group, unpacked or
    folded after it).  Both are made once per program, so every binding, and every call in flight on
    the stream, uses the same staging, as with the program's own.
    """

    groups: tuple[tuple[tuple[int, ...], ...], ...]  # per group, its bundles (operation indices, issue order)
    spans: Mapping[int, tuple[str, int, int]]  # by first operation: (buffer, element offset, element count)
    shared: Mapping[int, Any]  # by first operation: the bundle's staging buffer


def bundle(program: Program, lowering: RankLowering) -> Bundles:
    """Join ``program``'s messages as :class:`Bundles` says; gives their operations staging where needed.

    Empty messages are left out (both ends know the sizes).  The staging of a message in a shared
    bundle becomes a slice of the bundle's buffer (``program.staging``).
    """
    groups = []
    spans: dict[int, tuple[str, int, int]] = {}
    shared: dict[int, Any] = {}
    for group in lowering.groups:
        by: dict[tuple[Any, bool], list[int]] = {}
        for k in group.p2p:
            if program.msg_len[k]:
                by.setdefault((program.peers[k], program.kinds[k] == SEND), []).append(k)
        groups.append(tuple(tuple(ks) for ks in by.values()))
        for ks in by.values():
            if len(ks) < 2:
                continue
            span = _span(program, ks)
            if span is not None:
                spans[ks[0]] = span
                continue
            buf = shared[ks[0]] = program.ops.empty(sum(program.msg_len[k] for k in ks), program.dtype)
            at = 0
            for k in ks:
                program.staging[k] = buf[at:at + program.msg_len[k]]
                at += program.msg_len[k]
    return Bundles(tuple(groups), spans, shared)


def _span(program: Program, ks: list[int]) -> tuple[str, int, int] | None:
    """(buffer, offset, count) where messages ``ks`` lie end to end in one buffer unstaged, else None."""
    name, start, end = None, 0, 0
    for k in ks:
        if k in program.staging:
            return None
        pieces = program.src_pieces[k] if program.kinds[k] == SEND else program.dst_pieces[k]
        (buf, off, count), = pieces  # unstaged: one contiguous piece
        if name is None:
            name, start, end = buf, off, off + count
        elif buf != name or off != end:
            return None
        else:
            end += count
    assert name is not None
    return name, start, end - start


class GroupBinding:
    """One set of buffers bound to a lowered program: views and one persistent message per bundle, by group."""

    def __init__(self, grouped: GroupProgram, transport: GroupTransport, buffers: Mapping[str, Any]) -> None:
        program, lowering, bundles = grouped.program, grouped.lowering, grouped.bundles
        self.transport = transport
        self._base = base = Binding(program, transport, buffers, skip_empty=True, requests=False)
        steps = []
        messages: list[Any] = []
        for group, posted in zip(lowering.groups, bundles.groups):
            mine = []
            for ks in posted:
                k = ks[0]
                if k in bundles.spans:
                    name, off, count = bundles.spans[k]
                    buf = buffers[name][off:off + count]
                else:
                    buf = bundles.shared.get(k, base.buffers[k])
                init = transport.send_init if program.kinds[k] == SEND else transport.recv_init
                peer = program.peers[k]
                assert peer is not None  # bundles hold messages only, and every message has a peer
                mine.append(init(buf, peer, k))  # named by its first operation
            messages += mine
            p2p = group.p2p
            packs = tuple(p for k in p2p for p in base.packs.get(k, ()))
            unpacks = tuple(u for k in p2p for u in base.unpacks.get(k, ()))
            folds = tuple(f for k in p2p for f in base.folds.get(k, ()))
            ops = grouped.ops
            steps.append(_Step(
                packs=packs,
                messages=tuple(mine),
                unpacks=unpacks,
                folds=folds,
                local=tuple((program.kinds[k] == REDUCE, tuple(base.local[k])) for k in group.local),
                pack_lists=_lists(ops, packs),
                unpack_lists=_lists(ops, unpacks),
                fold_lists=_in_place_folds(ops, folds),
            ))
        self.steps = tuple(steps)
        self._messages = messages

    def free(self) -> None:
        self.transport.free(self._messages)
        self._messages = []


class GroupProgram:
    """A :class:`~topocc.runtime.executor.Program` (layout, staging) replayed group by group as ``lowering`` says.

    It offers what a replay uses of a Program (``schedule``, ``dtype``,
    ``writes``, ``owned``, ``bind``, ``free``), and runs in two halves
    (:class:`~topocc.runtime.replay.LoweredReplay`): :meth:`start` posts
    everything (returns a fence), the transport's ``wait`` or ``join`` completes it.
    """

    def __init__(self, program: Program, lowering: RankLowering) -> None:
        self.program = program
        self.lowering = lowering
        self.bundles = bundle(program, lowering)
        self.schedule = program.schedule
        self.dtype = program.dtype
        self.writes = program.writes
        self.ops = program.ops

    def owned(self, buffer: str) -> Any:
        return self.program.owned(buffer)

    def bind(self, transport: GroupTransport, buffers: Mapping[str, Any]) -> GroupBinding:
        """Views and persistent messages for these buffers, cached as the program caches its bindings."""
        binding: GroupBinding = self.program.bind(
            transport, buffers, make=lambda _, t, full: GroupBinding(self, t, full))
        return binding

    def free(self) -> None:
        self.program.free()

    def start(self, binding: GroupBinding, reduce: Callable[..., Any], deadline: float, *, join: bool = True,
              epilogue: Callable[[], None] | None = None) -> Any:
        """Post every group and local operation in order; returns the transport's fence after the last one.

        ``epilogue`` runs last, in the same order (the communicator's division of an average).  With
        ``join``, the caller's stream (CUDA) is ordered after the collective when this returns.  Raises
        :class:`~topocc.runtime.transports.PeerFailure` from a transport that waits for groups (MPI).
        """
        transport = binding.transport
        ops = self.ops
        copyto = ops.copyto
        group = transport.group
        with transport.ordered(join=join):
            for step in binding.steps:
                if step.pack_lists is not None:
                    ops.copy_many(*step.pack_lists)
                else:
                    for d, s in step.packs:
                        copyto(d, s)
                if step.messages:
                    group(step.messages, deadline)
                if step.unpack_lists is not None:
                    ops.copy_many(*step.unpack_lists)
                else:
                    for d, s in step.unpacks:
                        copyto(d, s)
                if step.fold_lists is not None:
                    ops.reduce_many(reduce, *step.fold_lists)
                else:
                    for d, left, s in step.folds:
                        reduce(left, s, out=d)
                for is_reduce, pairs in step.local:
                    if is_reduce:
                        for d, s in pairs:
                            reduce(d, s, out=d)
                    else:
                        for d, s in pairs:
                            copyto(d, s)
            if epilogue is not None:
                epilogue()
            return transport.fence()

    def failure(self, exc: PeerFailure, timeout: float, what: str) -> CommunicatorError:
        """The one-line error for a transport failure, naming the messages still pending (as the dataflow replay)."""
        reason = f"timed out after {timeout:g} s" if isinstance(exc, PeerTimeout) else str(exc)
        return self.program.failure(reason, exc.pending, exc.peers, what)


class Work:
    """A collective in flight (what ``async_op=True`` returns), as ``torch.distributed``'s ``Work``.

    :meth:`wait` orders the caller's current stream after the collective (on the
    host it returns at once, as NCCL's ``Work.wait`` does); :meth:`synchronize`
    blocks the host until it has completed, failing after the communicator's
    timeout; :meth:`is_completed` polls.  A failure found later (a dead peer) is
    raised by these methods, and by the communicator's next call.
    """

    def __init__(self, transport: GroupTransport, fence: Any, timeout: float,
                 fail: Callable[[PeerFailure], CommunicatorError]) -> None:
        self._transport = transport
        self._fence = fence
        self._timeout = timeout
        self._fail = fail

    def wait(self) -> bool:
        """Order the caller's current stream after the collective; True (as torch's ``Work.wait``)."""
        try:
            self._transport.join(self._fence)
        except PeerFailure as exc:
            raise self._fail(exc) from None
        return True

    def synchronize(self) -> None:
        """Block until the collective has completed on this rank, or raise after the timeout."""
        try:
            self._transport.wait(self._fence, time.monotonic() + self._timeout)
        except PeerFailure as exc:
            raise self._fail(exc) from None

    def get_future(self, value: Any) -> Any:
        """A ``torch.futures.Future`` holding ``value`` once the collective is done (as torch's ``Work.get_future``).

        On CUDA it is complete at once for the host and ordered on the GPU: its ``wait()`` orders the
        caller's current stream after the collective, so a DDP hook that returns it lets backward go on
        while the bucket is reduced.  On the host it is returned completed.
        """
        import torch  # optional dependency: only torch callers ask for a future

        device = getattr(value, "device", None)
        if device is None or device.type != "cuda":
            self.synchronize()
            done: Any = torch.futures.Future()
            done.set_result(value)
            return done
        future: Any = torch.futures.Future(devices=[device])
        with torch.cuda.device(device), torch.cuda.stream(_side_stream(device)):
            self.wait()  # the side stream waits for the collective; set_result records an event after that
            future.set_result(value)
        return future

    def is_completed(self) -> bool:
        try:
            return self._transport.query(self._fence)
        except PeerFailure as exc:
            raise self._fail(exc) from None


_SIDE_STREAMS: dict[Any, Any] = {}


def _side_stream(device: Any) -> Any:
    """One stream per device on which :meth:`Work.get_future` marks completions (never the caller's)."""
    import torch  # optional dependency: only reached from get_future on CUDA

    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]
