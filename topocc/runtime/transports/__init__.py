"""Transports: the small interfaces the executors replay a schedule over.

Two kinds, one per executor:

* :class:`Transport` (``topocc.runtime.executor``, dataflow replay): non-blocking,
  persistent point-to-point requests matched by tag, started as their
  operations become ready.  ``mpi.py`` (mpi4py: numpy or CUDA-aware buffers)
  and ``gloo.py`` (torch.distributed over gloo: CPU tensors).
* :class:`GroupTransport` (``topocc.runtime.group_executor``, the replay of a lowered
  schedule, ``topocc.runtime.lowering``): whole groups of sends and receives matched by
  their order per pair, as NCCL runs them.  ``mpi.py``'s
  :class:`~topocc.runtime.transports.mpi.MPIGroupTransport` (the same semantics on CPU,
  with synchronous sends: the proof's evidence in CI) and ``nccl.py`` (CUDA).

Both also run a few small collectives for set-up checks and timing (the
*control plane*).  The executors never see MPI, torch or NCCL directly, so a
new backend is one module.  A backend whose buffers are not numpy arrays also
exposes an ``array_ops`` attribute (a :class:`topocc.runtime.arrays.ArrayOps`) saying
how to allocate, copy and reduce them.  Backends import their library lazily:
``from topocc.runtime.transports import mpi`` costs nothing until a communicator is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["GroupTransport", "PeerFailure", "PeerTimeout", "Transport"]


class PeerFailure(Exception):
    """A transport-level failure (connection lost, truncated message, timeout), with what it involved if known.

    ``peers`` are the ranks involved; ``pending`` the tags (operation indices, for group transports) of
    the messages that had not completed, so the executor can name them.
    """

    def __init__(self, message: str, peers: Sequence[int] = (), pending: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.peers = tuple(peers)
        self.pending = tuple(pending)


class PeerTimeout(PeerFailure):
    """The deadline passed with messages still pending (a peer died, hangs, or runs something else)."""

    def __init__(self, peers: Sequence[int] = (), pending: Sequence[int] = ()) -> None:
        super().__init__("timed out", peers, pending)


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


@runtime_checkable
class GroupTransport(Protocol):
    """What the lowered replay needs from a backend: groups of messages, matched in order per pair.

    ``send_init``/``recv_init`` make a persistent message once per buffer
    binding; ``tag`` is the operation's index, for error messages only (the
    k-th send to a peer meets the k-th receive posted there, counted over all
    groups).  ``group`` posts messages as one group: it may wait for them (MPI)
    or only enqueue them on a stream (NCCL); either way, array operations done
    after it inside :meth:`ordered` happen after the group completed.

    ``fence`` marks everything posted so far; ``query`` says whether a fence is
    reached, ``join`` orders the caller's current stream after it (nothing to do
    on the host), ``wait`` blocks until it is reached.  A failure (a peer died,
    or ``deadline``, a ``time.monotonic()`` value, passed first) is raised as
    :class:`PeerFailure` naming the messages still pending.  ``watch`` asks a
    transport that completes work behind the caller's back (NCCL) to call
    ``on_failure`` if the work up to ``fence`` fails; one that waits for each
    group (MPI) has raised already.
    """

    rank: int
    size: int
    name: str

    def send_init(self, buf: Any, peer: int, tag: int) -> Any: ...

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any: ...

    def group(self, messages: Sequence[Any], deadline: float) -> None: ...

    def ordered(self, join: bool = True) -> contextlib.AbstractContextManager[Any]:
        """Where array operations run in order with the groups (a CUDA stream after the caller's, or the host).

        With ``join``, the caller's current stream is ordered after everything done inside on exit.
        """
        ...

    def fence(self) -> Any: ...

    def query(self, fence: Any) -> bool: ...

    def join(self, fence: Any) -> None: ...

    def wait(self, fence: Any, deadline: float) -> None: ...

    def watch(self, fence: Any, on_failure: Callable[[PeerFailure], None]) -> None: ...

    def free(self, messages: Sequence[Any]) -> None: ...

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None: ...

    def barrier(self, timeout: float) -> bool: ...

    def max_float(self, value: float) -> float: ...
