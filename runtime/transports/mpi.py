"""The MPI transport: mpi4py persistent requests on numpy (or CUDA-aware) buffers.

The transport works on a private duplicate of the caller's communicator, so its
messages never match the application's, and sets ``MPI.ERRORS_RETURN`` on it,
so a broken connection surfaces as an exception (turned into
:class:`~runtime.transports.PeerFailure`) rather than aborting the job.

Buffers are passed to MPI as raw bytes (``MPI.BYTE``): the runtime never asks MPI
to reduce, so any dtype works, bfloat16 included.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from runtime.transports import PeerFailure

__all__ = ["MPITransport"]

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

    def native(self, collective: str, send: Any, recv: Any, op: str, root: int) -> None:
        """Run MPI's own collective of the same kind (for benchmarks): blocking, no timeout."""
        mop = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
        c = self.comm
        if collective == "allreduce":
            c.Allreduce(MPI.IN_PLACE, recv, op=mop)
        elif collective == "reduce":
            c.Reduce(send, recv if self.rank == root else None, op=mop, root=root)
        elif collective == "broadcast":
            c.Bcast(recv, root=root)
        elif collective == "allgather":
            c.Allgather(send, recv)
        elif collective == "reducescatter":
            c.Reduce_scatter_block(send, recv, op=mop)
        elif collective == "alltoall":
            c.Alltoall(send, recv)
        else:
            raise ValueError(collective)

    def close(self) -> None:
        """Free the duplicated communicator (collective; only call when every rank is healthy)."""
        if not MPI.Is_finalized() and self.comm != MPI.COMM_NULL:
            self.comm.Free()


def _describe(exc: Any) -> str:
    try:
        return f"MPI error: {exc.Get_error_string().strip()}"
    except Exception:  # pragma: no cover - defensive: the message is all we want
        return f"MPI error: {exc}"
