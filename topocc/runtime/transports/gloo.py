"""The gloo transport: the dataflow replay on CPU torch tensors, point-to-point over torch.distributed's gloo.

The executor replays a schedule on torch tensors exactly as on numpy arrays;
this module supplies :class:`GlooTransport` (``isend``/``irecv`` on a private
process group) and uses :class:`~topocc.runtime.transports.torch_ops.TorchOps` for
allocation, copies and reductions (bfloat16 included).

gloo matches messages by (peer, tag), so any issue order works.  Its
point-to-point ``Work`` objects cannot be polled (``is_completed()`` stays False
until ``wait()``), so each started message is waited on by a daemon thread that
flags it done; the executor's loop sees the flag.  CUDA tensors go through NCCL
instead, with the lowered replay (``nccl.py``).

Timeouts: the process group gets a gloo timeout well above the communicator's,
so the executor's deadline fires first and fails with its one-line
:class:`~topocc.runtime.errors.CommunicatorError` naming the peer.

>>> dist.init_process_group("gloo", init_method="tcp://10.0.0.1:29500", rank=r, world_size=n)  # doctest: +SKIP
>>> comm = Communicator("ring.json", transport=GlooTransport(timeout=30.0))                    # doctest: +SKIP
>>> comm.allreduce(torch.ones(1001, dtype=torch.bfloat16))                                      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.transports import PeerFailure
from topocc.runtime.transports.torch_ops import TorchOps

__all__ = ["GlooTransport"]

#: gloo tags are 32-bit; stay well inside.
TAG_UB = (1 << 24) - 1
#: The process group's own timeout is this many times the communicator's (and at least a minute).
BACKEND_TIMEOUT_FACTOR = 4.0
#: Seconds gloo's worker thread may take to let go of a finished collective's tensors: microseconds once it gets
#: a core; the bound only keeps a release that never shows (another torch) from hanging the caller.
RELEASE_S = 5.0

_IDLE, _ACTIVE, _DONE, _FAILED = range(4)


class _Request:
    """One persistent message: a byte view of its buffer, the peer (group rank), tag, direction and state."""

    __slots__ = ("buf", "error", "peer", "send", "state", "tag", "work")

    def __init__(self, buf: torch.Tensor, peer: int, tag: int, send: bool) -> None:
        self.buf = buf
        self.peer = peer
        self.tag = tag
        self.send = send
        self.work: Any = None
        self.state = _IDLE
        self.error = ""


class _Waiters:
    """Daemon threads blocking in gloo's ``Work.wait()``: at least one per outstanding message, reused."""

    def __init__(self, wake: threading.Event) -> None:
        self._jobs: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()
        self._wake = wake

    def submit(self, req: _Request) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        if spawn:
            threading.Thread(target=self._loop, name="topocc-gloo-wait", daemon=True).start()
        self._jobs.put(req)

    def _loop(self) -> None:
        while True:
            req = self._jobs.get()
            try:
                req.work.wait()
                req.state = _DONE
            except Exception as exc:  # gloo reports a lost peer as RuntimeError; keep its first line
                req.error = _first_line(exc)
                req.state = _FAILED
            self._wake.set()
            with self._lock:
                self._idle += 1


def _first_line(exc: BaseException) -> str:
    """An exception's message in one short line (gloo prefixes ``[file.cc:LINE]`` and adds advice)."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip()) or type(exc).__name__
    return text.splitlines()[0].split(". ")[0][:160]


def _gloo_timeout(timeout: float) -> timedelta:
    """gloo's own timeout: well above the communicator's, so the communicator's one-line failure comes first."""
    return timedelta(seconds=max(60.0, BACKEND_TIMEOUT_FACTOR * timeout))


def _lazy_devices() -> list[Any]:
    """gloo devices that connect on first use, on the interfaces ``GLOO_SOCKET_IFNAME`` lists (as torch picks
    them for its own groups), else the default one."""
    names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    if names:
        return [dist.ProcessGroupGloo.create_device(interface=n, lazy_init=True) for n in names]
    return [dist.ProcessGroupGloo.create_default_device(lazy_init=True)]


def _held_elsewhere(tensor: torch.Tensor) -> bool:
    """Whether anything besides the caller holds ``tensor`` (torch's private ``Tensor._use_count``; without
    it nothing is known, and nothing waits)."""
    use_count = getattr(tensor, "_use_count", None)
    return use_count is not None and use_count() > 1


def _released(tensors: Sequence[torch.Tensor]) -> None:
    """Wait until gloo's worker thread has let go of ``tensors`` (each held by the caller alone again).

    A worker drops a finished collective's tensors a moment after the caller saw it complete. Dropping the
    last hold on a tensor whose Python object is gone takes the GIL, and a thread taking the GIL once the
    interpreter finalizes ends the process in std::terminate ("terminate called without an active
    exception"): so a collective that may be a process's last (the exit guard's barrier) returns once let go.
    """
    deadline = time.monotonic() + RELEASE_S
    while any(_held_elsewhere(t) for t in tensors) and time.monotonic() < deadline:
        time.sleep(0.0002)


def _byte_view(buf: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (gloo then moves any dtype, bfloat16 included, unchanged)."""
    return buf.view(torch.uint8) if buf.numel() else buf


class GlooTransport:
    """Point-to-point and small collectives over torch.distributed's gloo, on CPU tensors.

    Parameters
    ----------
    group:
        The process group to run on (default: the world); a private gloo group over the same ranks
        is made from it, so the runtime's messages never meet the application's.  Collective: every
        rank of the world must construct the transport (``torch.distributed.new_group``).
    timeout:
        The communicator's timeout, used to set gloo's own (longer) timeout.

    :meth:`over_store` builds one without ``torch.distributed`` being initialized (inside a process
    group's own construction).
    """

    name = "gloo"

    def __init__(self, group: Any = None, *, timeout: float = 30.0) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise CommunicatorError("torch.distributed is not initialized",
                                    fix="call torch.distributed.init_process_group(...) first")
        ranks: list[int] = (dist.get_process_group_ranks(group) if group is not None
                            else list(range(dist.get_world_size())))
        self.group = dist.new_group(ranks, timeout=_gloo_timeout(timeout), backend="gloo")
        self._attach(self.group._get_backend(torch.device("cpu")), dist.get_rank(self.group), ranks)

    @classmethod
    def over_store(cls, store: Any, rank: int, size: int, *, timeout: float = 30.0,
                   lazy: bool = False) -> GlooTransport:
        """A transport on a new gloo group of ``size`` ranks that meet through ``store`` (collective).

        With ``lazy`` gloo connects each pair of ranks when it first exchanges a message (gloo's lazy init,
        ``TORCH_GLOO_LAZY_INIT``), not all pairs now: construction costs nothing, and a plan that talks to two
        neighbours opens two connections, not ``size - 1``.
        """
        transport = cls.__new__(cls)
        transport.group = None
        if lazy:
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # the binding has it, not the stub
            options._timeout = _gloo_timeout(timeout)
            options._devices = _lazy_devices()
            options._threads = 2 * len(options._devices)  # torch's own default
            backend = dist.ProcessGroupGloo(store, rank, size, options)
        else:
            backend = dist.ProcessGroupGloo(store, rank, size, _gloo_timeout(timeout))
        transport._attach(backend, rank, list(range(size)))
        return transport

    def _attach(self, backend: Any, rank: int, ranks: list[int]) -> None:
        """Run on gloo ``backend`` (a ``ProcessGroupGloo``) as ``rank`` of the group of global ``ranks``."""
        self._gloo = backend
        self.rank = rank
        self.ranks = ranks
        self.size = len(ranks)
        self.device = torch.device("cpu")
        self.tag_ub = TAG_UB
        self.array_ops = TorchOps(self.device)
        self._wake = threading.Event()
        self._waiters = _Waiters(self._wake)

    # ------------------------------------------------------------------ point-to-point

    def send_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Request(_byte_view(buf), peer, tag, True)

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Request(_byte_view(buf), peer, tag, False)

    def _issue(self, req: _Request) -> None:
        try:
            if req.send:
                req.work = self._gloo.send([req.buf], req.peer, req.tag)
            else:
                req.work = self._gloo.recv([req.buf], req.peer, req.tag)
        except Exception as exc:
            raise PeerFailure(f"gloo: {_first_line(exc)}", [req.peer]) from None
        self._waiters.submit(req)

    def start(self, requests: list[Any]) -> None:
        for req in requests:
            if not req.buf.numel():  # both sides know the sizes: nothing to move
                req.state = _DONE
                continue
            req.state = _ACTIVE
            req.work = None
            self._issue(req)

    def test_some(self, requests: list[Any]) -> list[int]:
        finished = [j for j, req in enumerate(requests) if req.state >= _DONE]
        if not finished:
            self._wake.wait(0.001)  # a waiter thread sets it on any completion
            self._wake.clear()
            finished = [j for j, req in enumerate(requests) if req.state >= _DONE]
        failed = [requests[j] for j in finished if requests[j].state == _FAILED]
        if failed:
            raise PeerFailure(f"gloo: {failed[0].error}", [r.peer for r in failed])
        return finished

    def free(self, requests: Sequence[Any]) -> None:
        for req in requests:
            req.work = None

    # ------------------------------------------------------------------ small collectives

    def _within(self, issue: Callable[[], Any], tensors: Sequence[torch.Tensor], timeout: float) -> bool:
        """Start a collective on ``tensors`` (``issue()`` returns its work) and poll it until it completes (True)
        or ``timeout`` passes (False); completed, return once gloo let go of the tensors (:func:`_released`)."""
        deadline = time.monotonic() + timeout
        work = issue()
        while not work.is_completed():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0002)
        try:
            work.wait()
        except Exception as exc:
            raise PeerFailure(f"gloo: {_first_line(exc)}") from None
        del work  # the work holds the tensors too
        _released(tensors)
        return True

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None:
        mine = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        rows = [torch.empty_like(mine) for _ in range(self.size)]
        if not self._within(lambda: self._gloo.allgather([rows], [mine]), [mine, *rows], timeout):
            return None
        return [tuple(int(v) for v in row.tolist()) for row in rows]

    def barrier(self, timeout: float) -> bool:
        token = torch.zeros(1, dtype=torch.int32, device=self.device)
        return self._within(lambda: self._gloo.allreduce([token]), [token], timeout)

    def max_float(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX  # type: ignore[assignment]  # the binding converts the enum member
        work = self._gloo.allreduce([t], opts)
        work.wait()
        del work  # the work holds the tensor too
        _released([t])
        return float(t.item())

    def close(self) -> None:
        """Destroy the private process group (call on every rank, while healthy); one over a store stays
        with its owner."""
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(ValueError):  # torch destroyed it already: destroy_process_group() takes all
                dist.destroy_process_group(group)
