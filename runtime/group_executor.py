"""Replay one rank's lowered program (:mod:`runtime.lowering`) over a group transport, for NCCL and MPI alike.

The replay is written once against :class:`~runtime.transports.GroupTransport`:
for each group in order, copy the sends that need packing into their staging
buffers, post the group's messages, then unpack staged receives, apply each
``recv_reduce``'s reduction, and run the group's local copies and reductions.
On NCCL (``runtime.transports.nccl``) all of it is enqueued on one CUDA stream
and the call returns at once (stream-ordered, no host round trip per
operation); on MPI (``runtime.transports.mpi.MPIGroupTransport``) each group is
waited for on the host, with NCCL's matching and rendezvous, so the CPU tests
exercise the very order NCCL runs.

Set-up reuses the dataflow executor's :class:`~runtime.executor.Program`
(chunk layout, staging, views), so both executors agree on every byte; what
differs is only when operations run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.errors import CommunicatorError
from runtime.executor import REDUCE, Binding, Program
from runtime.lowering import RankLowering
from runtime.transports import GroupTransport, PeerFailure, PeerTimeout

__all__ = ["GroupBinding", "GroupProgram", "Work"]


@dataclass(frozen=True, slots=True)
class _Step:
    """One group, bound to buffers: what runs before, during and after its messages."""

    packs: tuple[tuple[Any, Any], ...]  # (staging slice, source view): copied before posting
    messages: tuple[Any, ...]  # the transport's messages, in issue order
    unpacks: tuple[tuple[Any, Any], ...]  # (destination view, staging slice)
    folds: tuple[tuple[Any, Any, Any], ...]  # (destination, left operand, staging slice): dst = left (+) received
    local: tuple[tuple[bool, tuple[tuple[Any, Any], ...]], ...]  # (is a reduction, [(dst, src), ...]) in order


class GroupBinding:
    """One set of buffers bound to a lowered program: views and persistent messages, group by group."""

    def __init__(self, program: Program, lowering: RankLowering, transport: GroupTransport,
                 buffers: Mapping[str, Any]) -> None:
        self.transport = transport
        # the messages are named by operation index; empty ones are not posted at either end
        self._base = base = Binding(program, transport, buffers, tags=range(program.n), skip_empty=True)
        steps = []
        for group in lowering.groups:
            posted = group.p2p
            steps.append(_Step(
                packs=tuple(p for k in posted for p in base.packs.get(k, ())),
                messages=tuple(base.requests[k] for k in posted if k in base.requests),
                unpacks=tuple(u for k in posted for u in base.unpacks.get(k, ())),
                folds=tuple(f for k in posted for f in base.folds.get(k, ())),
                local=tuple((program.kinds[k] == REDUCE, tuple(base.local[k])) for k in group.local),
            ))
        self.steps = tuple(steps)

    def free(self) -> None:
        self._base.free()


class GroupProgram:
    """A :class:`~runtime.executor.Program` (layout, staging) replayed group by group as ``lowering`` says.

    It offers what the communicator uses of a Program (``schedule``, ``dtype``,
    ``writes``, ``owned``, ``bind``, ``free``), and runs in two halves:
    :meth:`start` posts everything (returns a fence), the transport's ``wait``
    or ``join`` completes it.
    """

    def __init__(self, program: Program, lowering: RankLowering) -> None:
        self.program = program
        self.lowering = lowering
        self.schedule = program.schedule
        self.dtype = program.dtype
        self.writes = program.writes
        self.ops = program.ops

    def owned(self, buffer: str) -> Any:
        return self.program.owned(buffer)

    def bind(self, transport: GroupTransport, buffers: Mapping[str, Any]) -> GroupBinding:
        """Views and persistent messages for these buffers, cached as the program caches its bindings."""
        binding: GroupBinding = self.program.bind(
            transport, buffers, make=lambda program, t, full: GroupBinding(program, self.lowering, t, full))
        return binding

    def free(self) -> None:
        self.program.free()

    def start(self, binding: GroupBinding, reduce: Callable[..., Any], deadline: float, *, join: bool = True,
              epilogue: Callable[[], None] | None = None) -> Any:
        """Post every group and local operation in order; returns the transport's fence after the last one.

        ``epilogue`` runs last, in the same order (the communicator's division of an average).  With
        ``join``, the caller's stream (CUDA) is ordered after the collective when this returns.  Raises
        :class:`~runtime.transports.PeerFailure` from a transport that waits for groups (MPI).
        """
        transport = binding.transport
        copyto = self.ops.copyto
        group = transport.group
        with transport.ordered(join=join):
            for step in binding.steps:
                for d, s in step.packs:
                    copyto(d, s)
                if step.messages:
                    group(step.messages, deadline)
                for d, s in step.unpacks:
                    copyto(d, s)
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

    def is_completed(self) -> bool:
        try:
            return self._transport.query(self._fence)
        except PeerFailure as exc:
            raise self._fail(exc) from None
