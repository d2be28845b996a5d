"""The NCCL transport: the lowered replay on CUDA tensors, over one NCCL communicator, on one CUDA stream.

Set-up (collective, once per transport): rank 0 makes an NCCL unique id and the
control plane hands it to every rank (MPI's ``COMM_WORLD`` through
:class:`~topocc.runtime.transports.mpi.MPITransport` by default, or any
``torch.distributed`` store through
:class:`~topocc.runtime.transports.store.StoreControl`); each rank then creates its
one communicator (``ncclCommInitRank``), bounded by the timeout.  No other
communicator is ever created: no lazily created per-pair ones, no second
process group per direction (communicators that ranks create at different
moments, each waiting for all of its ranks, can wait for each other forever).
Control (set-up handshakes, barriers, timing maxima, the exit check) stays on
the control plane; data moves only over NCCL.

A call (:class:`~topocc.runtime.group_executor.GroupProgram`) enqueues everything at
once on this transport's stream: each group of the lowering
(:mod:`topocc.runtime.lowering`) as ``ncclGroupStart``, one ``ncclSend``/``ncclRecv`` per
peer and direction (the group's pieces joined: :class:`~topocc.runtime.group_executor.Bundles`;
as bytes, so any dtype moves), ``ncclGroupEnd``; its local copies and
reductions as torch kernels on the same stream.  The stream first waits for the
caller's current stream, and the caller's stream waits for it afterwards (or
the returned handle does that in ``wait()``): what ``torch.distributed``'s
``all_reduce`` does, and no host round trip per operation.

Failures: an event after each group lets a watchdog thread see progress.  When
the oldest pending group has made no progress for the timeout, or NCCL reports
an asynchronous error (``ncclCommGetAsyncError``, a dead peer's closed socket),
the watchdog aborts the communicator (``ncclCommAbort``, which releases the
kernels waiting on the stream), writes the communicator's one-line
``topocc:`` error naming that group's peers, and every later call raises it.
A wrong rank count, dtype, device or size is refused by the communicator before
anything is enqueued.

Library: CuPy's ``cupy.cuda.nccl`` binds ``ncclSend``/``ncclRecv``,
``ncclGroupStart/End``, ``ncclCommGetAsyncError`` and ``ncclCommAbort`` on raw
pointers and streams, and runs one communicator bootstrapped over any control
plane, also on several ranks sharing one GPU (each with its own
``NCCL_HOSTID``).  ``torch.distributed.batch_isend_irecv`` on an eagerly
initialised group is the alternative, but its groups run on torch's internal
stream and its failures are torch's watchdog's, which tears the process down
rather than naming the peer; it is also no faster per group.
``benchmarks/gpu_bench.py --probe`` times one group of sends and receives both
ways.  The libraries' own collectives, to compare a replay with, are in
:mod:`topocc.runtime.harness.baselines` (through :meth:`NCCLTransport.enqueue`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.transports import PeerFailure, PeerTimeout
from topocc.runtime.transports.torch_ops import TorchOps

__all__ = ["NCCL_TYPES", "P2P_TUNING", "NCCLTransport"]

#: ``ncclDataType_t`` values (NCCL's stable ABI) by the runtime's dtype names; messages move as ncclUint8.
NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7, "float64": 8,
              "bfloat16": 9}
_UINT8 = NCCL_TYPES["uint8"]
#: NCCL's point-to-point tuning over the network, set unless the user set it (or ``TOPOCC_NCCL_TUNE=0``): a
#: replay moves everything as sends and receives, which NCCL gives fewer channels per peer than its own
#: collectives (the usual advice for send/recv over sockets and RoCE: 4 channels per net peer, larger chunks)
P2P_TUNING = {"NCCL_NCHANNELS_PER_NET_PEER": "4", "NCCL_P2P_NET_CHUNKSIZE": str(512 << 10)}
#: bytes of an NCCL unique id (``NCCL_UNIQUE_ID_BYTES``)
_UNIQUE_ID_BYTES = 128
#: the watchdog polls the oldest pending group this often, and NCCL's asynchronous error this often
_POLL_S = 0.002
_ASYNC_CHECK_S = 0.05


@dataclass(frozen=True, slots=True)
class _Message:
    """One persistent send or receive: its buffer (kept alive), address, size, peer, direction and operation."""

    buf: Any
    ptr: int
    nbytes: int
    peer: int
    send: bool
    tag: int


@dataclass(frozen=True, slots=True)
class _Posted:
    """A group on the stream: the event recorded after it (None while enqueuing), its messages, and when."""

    event: Any
    messages: tuple[_Message, ...]
    at: float


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


class NCCLTransport:
    """Groups of NCCL sends and receives on one stream, one communicator per transport (a GroupTransport).

    Parameters
    ----------
    control:
        The control plane: anything with ``rank``, ``size``, ``allgather_ints``, ``barrier`` and
        ``max_float`` (default: :class:`~topocc.runtime.transports.mpi.MPITransport` over ``COMM_WORLD``).
    device:
        The CUDA device of this rank's tensors (default: the current device).
    timeout:
        Seconds the set-up may take, and a pending group may go without progress, before failing.

    Construction is collective over the control plane.  Several ranks may share one GPU when
    each has its own ``NCCL_HOSTID`` (NCCL then connects them through sockets).

    >>> torch.cuda.set_device(local_rank)                                        # doctest: +SKIP
    >>> comm = Communicator("plan.json", transport=NCCLTransport(timeout=30.0))   # doctest: +SKIP
    >>> work = comm.allreduce(grads, async_op=True); work.wait()                  # doctest: +SKIP
    """

    name = "nccl"

    def __init__(self, control: Any = None, *, device: torch.device | str | int | None = None,
                 timeout: float = 30.0) -> None:
        try:
            from cupy.cuda import nccl  # optional dependency
        except ImportError:
            raise CommunicatorError("the NCCL transport needs CuPy's NCCL bindings (cupy.cuda.nccl)",
                                    fix="install the cupy-cuda12x or cupy-cuda13x wheel matching torch's CUDA"
                                    ) from None
        if not torch.cuda.is_available():
            raise CommunicatorError("the NCCL transport needs a CUDA device; torch sees none",
                                    fix="use the MPI or gloo transport on CPU")
        if control is None:
            # mpi4py, loaded only for this default: importing it starts MPI, which a store-based job must not
            from topocc.runtime.transports.mpi import MPITransport

            control = MPITransport()
        if isinstance(device, int):
            device = torch.device("cuda", device)
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if self.device.type != "cuda":
            raise CommunicatorError(f"the NCCL transport moves CUDA tensors, not {self.device}",
                                    fix="use the gloo or MPI transport for CPU tensors")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.control = control
        self.rank: int = control.rank
        self.size: int = control.size
        self.timeout = float(timeout)
        self.array_ops = TorchOps(self.device)
        self._nccl = nccl
        if os.environ.get("TOPOCC_NCCL_TUNE", "1") != "0":
            for key, value in P2P_TUNING.items():  # NCCL reads them when its first communicator starts
                os.environ.setdefault(key, value)
        mine = list(nccl.get_unique_id()) if self.rank == 0 else [0] * _UNIQUE_ID_BYTES
        rows = control.allgather_ints(mine, self.timeout)
        if rows is None:
            raise CommunicatorError(f"not every rank came to set up the NCCL communicator within {self.timeout:g} s",
                                    where=f"rank {self.rank}", fix="every rank must construct the transport")
        self.comm = self._connect(tuple(rows[0]))
        with torch.cuda.device(self.device):
            self.stream = torch.cuda.Stream(self.device)
        self._stream_ptr = int(self.stream.cuda_stream)
        self._posted: collections.deque[_Posted] = collections.deque()
        self._watchers: collections.deque[tuple[Any, Callable[[PeerFailure], None]]] = collections.deque()
        self._failure: PeerFailure | None = None
        self._enqueuing: _Posted | None = None  # the group inside groupStart..groupEnd, if any
        self._enqueue = threading.Lock()  # held while enqueuing, so an abort waits for NCCL calls to return
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        #: a list to profile groups: each appends (event before, event after, its messages)
        self.group_events: list[tuple[Any, Any, tuple[_Message, ...]]] | None = None
        self._watchdog = threading.Thread(target=self._watch_groups, name="topocc-nccl-watchdog", daemon=True)
        self._watchdog.start()

    def _connect(self, unique_id: tuple[int, ...]) -> Any:
        """``ncclCommInitRank`` in a helper thread: it blocks until every rank joins, so bound it by the timeout."""
        made: dict[str, Any] = {}

        def init() -> None:
            try:
                with torch.cuda.device(self.device):
                    try:  # CuPy 14 takes the id as bytes, earlier versions as a tuple of C chars
                        made["comm"] = self._nccl.NcclCommunicator(self.size, bytes(v & 0xFF for v in unique_id),
                                                                   self.rank)
                    except TypeError:
                        made["comm"] = self._nccl.NcclCommunicator(
                            self.size, tuple(v - 256 if v > 127 else v for v in unique_id), self.rank)
            except Exception as exc:  # reported by the constructing thread
                made["error"] = exc

        thread = threading.Thread(target=init, name="topocc-nccl-init", daemon=True)
        thread.start()
        thread.join(self.timeout)
        hint = ("several ranks on one GPU need a distinct NCCL_HOSTID each; NCCL_SOCKET_IFNAME picks the network "
                "interface")
        if thread.is_alive():
            raise CommunicatorError(f"NCCL's communicator set-up did not finish within {self.timeout:g} s",
                                    where=f"rank {self.rank}", fix=f"a peer died during set-up, or {hint}")
        if "error" in made:
            raise CommunicatorError(f"NCCL's communicator set-up failed: {_first_line(made['error'])}",
                                    where=f"rank {self.rank}", fix=hint)
        return made["comm"]

    # ------------------------------------------------------------------ groups

    def send_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Message(buf, int(buf.data_ptr()), int(buf.numel() * buf.element_size()), peer, True, tag)

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Message(buf, int(buf.data_ptr()), int(buf.numel() * buf.element_size()), peer, False, tag)

    def group(self, messages: Sequence[Any], deadline: float) -> None:
        """Enqueue one NCCL group on the stream and an event after it for the watchdog.

        It returns at once, except the first time a pair is used: NCCL then connects the two ranks
        inside ``ncclGroupEnd``, and the watchdog bounds that wait too (``_enqueuing``).
        """
        self._raise_if_failed()
        nccl, comm, stream = self._nccl, self.comm, self._stream_ptr
        posted = _Posted(None, tuple(messages), time.monotonic())
        timed = self.group_events is not None
        before = torch.cuda.Event(enable_timing=True) if timed else None
        if before is not None:
            before.record(self.stream)
        with self._enqueue:
            self._enqueuing = posted
            try:
                nccl.groupStart()
                try:
                    for m in messages:
                        if m.send:
                            comm.send(m.ptr, m.nbytes, _UINT8, m.peer, stream)
                        else:
                            comm.recv(m.ptr, m.nbytes, _UINT8, m.peer, stream)
                finally:
                    nccl.groupEnd()
            except Exception as exc:  # NcclError, or a call on a communicator the watchdog aborted
                self._raise_if_failed()
                raise PeerFailure(f"nccl: {_first_line(exc)}", sorted({m.peer for m in messages}),
                                  [m.tag for m in messages]) from None
            finally:
                self._enqueuing = None
        event = torch.cuda.Event(enable_timing=timed)
        event.record(self.stream)
        if timed and self.group_events is not None:
            self.group_events.append((before, event, posted.messages))
        self._posted.append(_Posted(event, posted.messages, posted.at))
        self._wake.set()

    @contextlib.contextmanager
    def ordered(self, join: bool = True) -> Iterator[None]:
        """Run on the transport's stream, after the caller's current stream; with ``join``, the caller's after it."""
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield
        if join:
            caller.wait_stream(self.stream)

    def fence(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def query(self, fence: Any) -> bool:
        self._raise_if_failed()
        return bool(fence.query())

    def join(self, fence: Any) -> None:
        self._raise_if_failed()
        torch.cuda.current_stream(self.device).wait_event(fence)

    def wait(self, fence: Any, deadline: float) -> None:
        """Block the host until ``fence`` is reached; past ``deadline``, abort and raise naming the pending group."""
        pause = 1e-5
        while not fence.query():
            self._raise_if_failed()
            if time.monotonic() > deadline:
                self._declare(self._stalled())
                self._raise_if_failed()
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S)
        self._raise_if_failed()

    def watch(self, fence: Any, on_failure: Callable[[PeerFailure], None]) -> None:
        """Call ``on_failure`` (from the watchdog thread) if the work up to ``fence`` fails."""
        with self._lock:
            while self._watchers and self._watchers[0][0].query():
                self._watchers.popleft()  # completed calls need no watching
            failure = self._failure
            if failure is None:
                self._watchers.append((fence, on_failure))
        if failure is not None:
            on_failure(failure)

    def free(self, messages: Sequence[Any]) -> None:
        """Nothing to release: a message is an address; its buffer is freed with the program."""

    # ------------------------------------------------------------------ failures

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _stalled(self) -> PeerTimeout:
        """The timeout failure, naming the oldest group that has not completed (or the one being enqueued)."""
        pending = next((p for p in list(self._posted) if not p.event.query()), None) or self._enqueuing
        messages = pending.messages if pending is not None else ()
        return PeerTimeout(sorted({m.peer for m in messages}), [m.tag for m in messages])

    def _declare(self, failure: PeerFailure) -> None:
        """Record the first failure, abort the communicator (releasing the stream), tell the first open call."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = failure
            watchers = list(self._watchers)
            self._watchers.clear()
        # NCCL supports aborting from another thread to release a call blocked inside it (a connection to a
        # dead peer); otherwise wait for the enqueuing thread to leave NCCL, so the handle is not freed under it
        waited = self._enqueue.acquire(timeout=1.0)
        try:
            with contextlib.suppress(Exception):  # aborting a broken communicator may itself report an error
                self.comm.abort()
        finally:
            if waited:
                self._enqueue.release()
        for fence, on_failure in watchers:
            if not fence.query():
                on_failure(failure)
                break

    def _watch_groups(self) -> None:
        """The watchdog: progress of the oldest pending group, and NCCL's asynchronous errors."""
        progress = checked = time.monotonic()
        while not self._closing and self._failure is None:
            posted = self._posted
            while posted and posted[0].event.query():
                posted.popleft()
                progress = time.monotonic()
            now = time.monotonic()
            entering = self._enqueuing
            if entering is not None and now - entering.at > self.timeout:
                self._declare(self._stalled())  # stuck connecting to a peer inside ncclGroupEnd
                return
            if not posted:
                self._wake.wait(0.1)
                self._wake.clear()
                progress = time.monotonic()
                continue
            head = posted[0]
            if now - max(head.at, progress) > self.timeout:
                self._declare(self._stalled())
                return
            if now - checked > _ASYNC_CHECK_S:
                checked = now
                try:
                    self.comm.check_async_error()
                except Exception as exc:  # NCCL's asynchronous error: a peer's connection broke
                    self._declare(PeerFailure(f"nccl: {_first_line(exc)}", sorted({m.peer for m in head.messages}),
                                              [m.tag for m in head.messages]))
                    return
            time.sleep(_POLL_S)

    # ------------------------------------------------------------------ control plane

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None:
        result: list[tuple[int, ...]] | None = self.control.allgather_ints(values, timeout)
        return result

    def barrier(self, timeout: float) -> bool:
        return bool(self.control.barrier(timeout))

    def max_float(self, value: float) -> float:
        return float(self.control.max_float(value))

    def enqueue(self, launch: Callable[[Any, int], None]) -> None:
        """Run ``launch(communicator, stream)``: the caller's own NCCL calls on this transport's communicator and
        stream (a library collective to compare with, for one), ordered as a group is (:meth:`ordered`) and
        bounded by the watchdog like one."""
        with self.ordered():
            launch(self.comm, self._stream_ptr)
        self._posted.append(_Posted(self.fence(), (), time.monotonic()))
        self._wake.set()

    def close(self) -> None:
        """Finish what is enqueued and destroy the communicator (every rank, while healthy); stop the watchdog."""
        try:
            if self._failure is None:
                self.wait(self.fence(), time.monotonic() + self.timeout)
                self.comm.destroy()
        finally:
            self._closing = True
            self._wake.set()
            self._watchdog.join(1.0)
