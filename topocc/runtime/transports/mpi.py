"""The MPI transports: mpi4py persistent requests on numpy (or CUDA-aware) buffers.

:class:`MPITransport` serves the dataflow executor (messages matched by tag,
started one by one); :class:`MPIGroupTransport` serves the replay of a lowered
schedule with NCCL's semantics, so that CI runs on CPU exactly what NCCL runs:
every message carries the same tag, so MPI matches a pair's messages in the
order they are posted (its non-overtaking rule), as NCCL does; a group's
messages are started in issue order and waited for together before anything
after them; and sends are *synchronous* (``MPI_Ssend_init``: a send completes
only once its receive has started), NCCL's rendezvous.  A lowering whose
groups did not line up across ranks would deadlock here (and fail after the
timeout, naming the peers) or pair the wrong messages (and fail the result
check), as it would on NCCL.

Each transport works on a private duplicate of the caller's communicator, so its
messages never match the application's, and sets ``MPI.ERRORS_RETURN`` on it,
so a broken connection surfaces as an exception (turned into
:class:`~topocc.runtime.transports.PeerFailure`) rather than aborting the job.

Buffers are passed to MPI as raw bytes (``MPI.BYTE``): the runtime never asks MPI
to reduce, so any dtype works, bfloat16 included.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from topocc.runtime.transports import PeerFailure, PeerTimeout

__all__ = ["MPIGroupTransport", "MPITransport"]

#: MPI guarantees tags up to 32767; MPICH allows far more.
_MIN_TAG_UB = 32767


def _raw(buf: Any) -> list[Any]:
    """An mpi4py buffer spec sending ``buf`` as bytes (works for numpy and CUDA arrays)."""
    return [buf, buf.nbytes, MPI.BYTE] if hasattr(buf, "__cuda_array_interface__") else [buf.view(np.uint8), MPI.BYTE]


class MPITransport:
    """Point-to-point and small collectives over an mpi4py communicator."""

    name = "mpi"

    def __init__(self, comm: Any = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        self.comm = base.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        ub = self.comm.Get_attr(MPI.TAG_UB)
        self.tag_ub = int(ub) if ub else _MIN_TAG_UB
        self._poll = MPI.Request.Testsome
        self._start = MPI.Prequest.Startall

    def send_init(self, buf: Any, peer: int, tag: int) -> Any:
        return self.comm.Send_init(_raw(buf), peer, tag)

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any:
        return self.comm.Recv_init(_raw(buf), peer, tag)

    def start(self, requests: list[Any]) -> None:
        try:
            self._start(requests)
        except MPI.Exception as exc:
            raise PeerFailure(_describe(exc)) from None

    def test_some(self, requests: list[Any]) -> list[int]:
        try:
            return self._poll(requests) or []
        except MPI.Exception as exc:
            raise PeerFailure(_describe(exc)) from None

    def free(self, requests: Sequence[Any]) -> None:
        for req in requests:
            with contextlib.suppress(MPI.Exception):  # an active request after a failure: nothing more to do
                req.Free()

    def _wait(self, req: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        try:
            while not req.Test():
                if time.monotonic() > deadline:
                    return False
                os.sched_yield()
        except MPI.Exception as exc:
            raise PeerFailure(_describe(exc)) from None
        return True

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None:
        send = np.asarray(values, dtype=np.int64)
        recv = np.empty((self.size, len(send)), dtype=np.int64)
        req = self.comm.Iallgather(send, recv)
        if not self._wait(req, timeout):
            return None
        return [tuple(int(v) for v in row) for row in recv]

    def barrier(self, timeout: float) -> bool:
        return self._wait(self.comm.Ibarrier(), timeout)

    def max_float(self, value: float) -> float:
        return float(self.comm.allreduce(value, op=MPI.MAX))

    def close(self) -> None:
        """Free the duplicated communicator (collective; only call when every rank is healthy)."""
        if not MPI.Is_finalized() and self.comm != MPI.COMM_NULL:
            self.comm.Free()


@dataclass(slots=True)
class _Message:
    """A persistent request of the group transport, with what error messages name."""

    request: Any
    peer: int
    tag: int


class MPIGroupTransport(MPITransport):
    """NCCL's group semantics over MPI (see the module notes): for the lowered replay, and its tests on CPU."""

    name = "mpi-groups"

    #: every message's MPI tag: matching goes by posting order per pair, as in NCCL
    TAG = 0

    def send_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Message(self.comm.Ssend_init(_raw(buf), peer, self.TAG), peer, tag)

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Message(self.comm.Recv_init(_raw(buf), peer, self.TAG), peer, tag)

    def group(self, messages: Sequence[Any], deadline: float) -> None:
        """Start the messages in issue order (MPI_Startall leaves the order open), then wait for all of them."""
        requests = [m.request for m in messages]
        try:
            for req in requests:
                req.Start()
            while not MPI.Request.Testall(requests):
                if time.monotonic() > deadline:
                    pending = [m for m, req in zip(messages, requests) if not req.Test()]
                    raise PeerTimeout(sorted({m.peer for m in pending}), [m.tag for m in pending])
                os.sched_yield()  # let a peer sharing this core run (ranks often outnumber cores)
        except MPI.Exception as exc:
            raise PeerFailure(_describe(exc), sorted({m.peer for m in messages}),
                              [m.tag for m in messages]) from None

    @contextlib.contextmanager
    def ordered(self, join: bool = True) -> Iterator[None]:
        """Array operations on the host run in program order already."""
        yield

    def fence(self) -> None:
        """Nothing to mark: :meth:`group` returns only once its messages have completed."""
        return None

    def query(self, fence: Any) -> bool:
        return True

    def join(self, fence: Any) -> None:
        return None

    def wait(self, fence: Any, deadline: float) -> None:
        return None

    def watch(self, fence: Any, on_failure: Callable[[PeerFailure], None]) -> None:
        """Nothing to watch: a failure was raised by :meth:`group` already."""

    def free(self, messages: Sequence[Any]) -> None:
        super().free([m.request for m in messages])


def _describe(exc: Any) -> str:
    try:
        return f"MPI error: {exc.Get_error_string().strip()}"
    except Exception:  # pragma: no cover - defensive: the message is all we want
        return f"MPI error: {exc}"
