"""The communicator's two ways of replaying a program, chosen once from the kind of its transport.

:class:`DataflowReplay` runs a rank's :class:`~topocc.runtime.executor.Program` over a
:class:`~topocc.runtime.transports.Transport` (MPI, gloo): operations start as their dependencies complete,
and the call returns with the result in place.  :class:`LoweredReplay` runs the program's lowering
(:mod:`topocc.runtime.lowering`) group by group over a :class:`~topocc.runtime.transports.GroupTransport`
(NCCL, or MPI with NCCL's semantics): everything is posted in order and the caller's stream, or the
returned :class:`~topocc.runtime.group_executor.Work`, waits for it.  Each knows its transport's exact type,
so the communicator never asks which one it has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.executor import Feedback, Program
from topocc.runtime.group_executor import GroupProgram, Work
from topocc.runtime.lowering import RankLowering, chunks_per_round_for, lower
from topocc.runtime.transports import GroupTransport, PeerFailure, Transport

__all__ = ["DataflowReplay", "Events", "LoweredReplay", "Replay"]

#: Message tags of a lowered replay name operations, never match messages: any range does.
_GROUP_TAG_UB = (1 << 31) - 1

#: ``(op index, start, end)`` per traced operation, in ``time.perf_counter()`` seconds.
Events = list[tuple[int, float, float]]


class Replay(Protocol):
    """What the communicator asks of a replay mode.

    ``run`` replays ``program`` once on ``buffers``: ``fail`` records an error that ends the communicator
    (it returns the error, for the caller to raise), ``fail_later`` one that a transport's watchdog found
    after the call returned (raised at the next call).
    """

    @property
    def grouped(self) -> bool:
        """Whether it replays a lowering group by group (stream-ordered, async-capable, not traceable)."""
        ...

    @property
    def grouping(self) -> int:
        """The group size every rank must lower with (0 for dataflow): checked by the set-up handshake."""
        ...

    @property
    def tag_ub(self) -> int:
        """The largest message tag programs may use."""
        ...

    def adopt(self, program: Program) -> None:
        """Prepare a new program for replay (before its first binding)."""
        ...

    def input_in_place(self, program: Program) -> bool:
        """Whether ``program`` may read its input from the output's memory (``Program.input_copied_in_place``)."""
        ...

    def run(self, program: Program, buffers: dict[str, Any], reduce: Any, what: str, *, async_op: bool,
            epilogue: Callable[[], None] | None, events: Events | None,
            fail: Callable[[CommunicatorError], CommunicatorError],
            fail_later: Callable[[CommunicatorError], None], feedback: Feedback | None = None) -> Work | None:
        """Replay ``program`` once; ``epilogue`` runs after it, in order with it; ``feedback`` encodes the encoded
        messages (error feedback), where the replay encodes any."""
        ...

    def drain(self, deadline: float) -> None:
        """Wait until everything posted has completed (a stream-ordered transport may still use the buffers)."""
        ...

    def forget(self) -> None:
        """Drop what :meth:`adopt` prepared (the communicator has freed its programs)."""
        ...


class DataflowReplay:
    """A rank's program replayed as dataflow over a point-to-point :class:`Transport`."""

    grouped = False
    grouping = 0

    def __init__(self, transport: Transport, timeout: float) -> None:
        self.transport = transport
        self.timeout = timeout

    @property
    def tag_ub(self) -> int:
        return self.transport.tag_ub

    def adopt(self, program: Program) -> None:
        pass

    def input_in_place(self, program: Program) -> bool:
        return program.input_copied_in_place

    def run(self, program: Program, buffers: dict[str, Any], reduce: Any, what: str, *, async_op: bool,
            epilogue: Callable[[], None] | None, events: Events | None,
            fail: Callable[[CommunicatorError], CommunicatorError],
            fail_later: Callable[[CommunicatorError], None], feedback: Feedback | None = None) -> Work | None:
        """Replay on the host; returns once the result is in place (``async_op`` is refused before this)."""
        try:
            binding = program.bind(self.transport, buffers)
            program.run(binding, reduce, self.timeout, what, events, feedback)
        except CommunicatorError as err:
            raise fail(err) from None
        if epilogue is not None:
            epilogue()
        return None

    def drain(self, deadline: float) -> None:
        pass

    def forget(self) -> None:
        pass


class LoweredReplay:
    """A rank's program lowered into groups (``group_bytes`` per stream and group) over a :class:`GroupTransport`."""

    grouped = True
    tag_ub = _GROUP_TAG_UB

    def __init__(self, transport: GroupTransport, timeout: float, group_bytes: int) -> None:
        self.transport = transport
        self.timeout = timeout
        self.grouping = group_bytes
        self._grouped: dict[Program, GroupProgram] = {}
        self._lowerings: dict[tuple[int, int], RankLowering] = {}

    def adopt(self, program: Program) -> None:
        """Lower ``program``'s schedule for its chunk size and bundle its messages (every rank derives the same)."""
        chunk_bytes = program.layout.cap * program.dtype.itemsize  # numpy's and torch's dtypes both know their size
        self._grouped[program] = GroupProgram(program, self._lowering(program, chunk_bytes))

    def _lowering(self, program: Program, chunk_bytes: int) -> RankLowering:
        """This rank's groups of the program's schedule for chunks of ``chunk_bytes``, lowered once per cap."""
        cap = chunks_per_round_for(chunk_bytes, self.grouping)
        key = (id(program.schedule), cap)
        mine = self._lowerings.get(key)
        if mine is None:
            mine = self._lowerings[key] = lower(program.schedule, cap).ranks[program.rank]
        return mine

    def input_in_place(self, program: Program) -> bool:
        return False  # the lowered replay binds its buffers itself

    def run(self, program: Program, buffers: dict[str, Any], reduce: Any, what: str, *, async_op: bool,
            epilogue: Callable[[], None] | None, events: Events | None,
            fail: Callable[[CommunicatorError], CommunicatorError],
            fail_later: Callable[[CommunicatorError], None], feedback: Feedback | None = None) -> Work | None:
        """Post everything in order; the caller's stream (or the returned :class:`Work`) waits for it (the
        lowering replays exact: no ``feedback`` to give)."""
        grouped = self._grouped[program]
        timeout = self.timeout

        def failed(exc: PeerFailure) -> CommunicatorError:
            return fail(grouped.failure(exc, timeout, what))

        def failed_later(exc: PeerFailure) -> None:
            fail_later(grouped.failure(exc, timeout, what))

        try:
            binding = grouped.bind(self.transport, buffers)
            fence = grouped.start(binding, reduce, time.monotonic() + timeout, join=not async_op, epilogue=epilogue)
        except PeerFailure as exc:
            raise failed(exc) from None
        self.transport.watch(fence, failed_later)
        return Work(self.transport, fence, timeout, failed) if async_op else None

    def drain(self, deadline: float) -> None:
        self.transport.wait(self.transport.fence(), deadline)

    def forget(self) -> None:
        self._grouped.clear()
