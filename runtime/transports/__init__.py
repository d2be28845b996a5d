"""Transports: the small interface the executor replays a schedule over.

A transport moves bytes between ranks with non-blocking, persistent
point-to-point requests and runs a few small collectives for set-up checks and
timing.  The executor never sees MPI or torch directly, so a new backend is one
module implementing :class:`Transport`: ``mpi.py`` (mpi4py, numpy or CUDA-aware
buffers) and ``torch_dist.py`` (torch.distributed over gloo or NCCL, torch
tensors).  A backend whose buffers are not numpy arrays also exposes an
``array_ops`` attribute (a :class:`runtime.executor.ArrayOps`) saying how to
allocate, copy and reduce them.  Backends import their library lazily:
``from runtime.transports import mpi`` costs nothing until a communicator is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["PeerFailure", "Transport"]


class PeerFailure(Exception):
    """A transport-level failure (connection lost, truncated message), with the peers involved if known."""

    def __init__(self, message: str, peers: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.peers = tuple(peers)


@runtime_checkable
class Transport(Protocol):
    """What the executor needs from a backend.

    Requests are opaque objects; ``send_init``/``recv_init`` create them once per
    buffer binding (persistent), ``start`` activates a batch and ``test_some``
    returns the positions of completed ones in the list it is given (empty when
    none completed yet).  Transport errors are raised as :class:`PeerFailure`.
    """

    rank: int
    size: int
    tag_ub: int
    name: str

    def send_init(self, buf: Any, peer: int, tag: int) -> Any: ...

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any: ...

    def start(self, requests: list[Any]) -> None: ...

    def test_some(self, requests: list[Any]) -> list[int]: ...

    def free(self, requests: Sequence[Any]) -> None: ...

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None:
        """Every rank's ``values`` (same length everywhere), or None if not all ranks joined in time."""
        ...

    def barrier(self, timeout: float) -> bool:
        """Wait for every rank; False if they did not all arrive within ``timeout`` seconds."""
        ...

    def max_float(self, value: float) -> float:
        """The maximum of ``value`` over ranks (for timing)."""
        ...
