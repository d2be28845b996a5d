"""The torch.distributed transport: point-to-point over gloo (CPU tensors) or NCCL (CUDA tensors).

The executor replays a schedule on torch tensors exactly as on numpy arrays; this
module supplies the two things that differ: :class:`TorchOps` (allocation,
copies and in-place reductions with torch ops, bfloat16 included) and
:class:`TorchTransport` (``isend``/``irecv`` on private process groups).

Backend notes:

* **gloo** matches messages by (peer, tag), so any issue order works.  Its
  point-to-point ``Work`` objects cannot be polled (``is_completed()`` stays
  False until ``wait()``), so each started message is waited on by a daemon
  thread that flags it done; the executor's loop sees the flag.
* **NCCL** ignores tags and matches the k-th send of a pair with the k-th
  receive, and runs a pair's operations in issue order on one stream.  So each
  direction of a pair uses its own process group (messages to higher ranks on
  one, to lower ranks on the other: a pending receive never blocks a send), and
  a pair's messages in one direction are issued in tag order (sequence-major,
  channel-minor: the same order on both sides).  This relies on torch's lazily
  created per-pair NCCL communicators (process groups made without
  ``device_id``).

Timeouts: the process groups get gloo/NCCL timeouts well above the
communicator's, so the executor's deadline fires first and fails with its
one-line :class:`~runtime.errors.CommunicatorError` naming the peer.

>>> dist.init_process_group("gloo", init_method="tcp://10.0.0.1:29500", rank=r, world_size=n)  # doctest: +SKIP
>>> comm = Communicator("ring.json", transport=TorchTransport(timeout=30.0))                   # doctest: +SKIP
>>> comm.allreduce(torch.ones(1001, dtype=torch.bfloat16))                                      # doctest: +SKIP
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from runtime.errors import CommunicatorError
from runtime.executor import ArrayOps
from runtime.transports import PeerFailure

__all__ = ["TorchOps", "TorchTransport"]

#: Element types replayed on torch, by the names of :data:`runtime.executor.DTYPE_NAMES`.
TORCH_DTYPES: Mapping[torch.dtype, str] = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int32: "int32", torch.int64: "int64", torch.int8: "int8", torch.uint8: "uint8",
}

#: gloo tags are 32-bit; stay well inside.
TAG_UB = (1 << 24) - 1
#: The process groups' own timeout is this many times the communicator's (and at least a minute).
BACKEND_TIMEOUT_FACTOR = 4.0

_IDLE, _ACTIVE, _DONE, _FAILED = range(4)


class TorchOps(ArrayOps):
    """Array operations on torch tensors of one device (CPU for gloo, a CUDA device for NCCL)."""

    name = "torch"
    reductions: Mapping[str, Callable[..., Any]] = {
        "sum": torch.add, "avg": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum,
    }

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def dtype_of(self, array: Any) -> Any:
        if not isinstance(array, torch.Tensor):
            raise CommunicatorError(f"the torch transport replays torch tensors, got {type(array).__name__}")
        if array.dtype not in TORCH_DTYPES:
            raise CommunicatorError(f"unsupported dtype {array.dtype}",
                                    fix=f"use one of {', '.join(TORCH_DTYPES.values())}")
        return array.dtype

    def dtype_name(self, dtype: Any) -> str:
        return TORCH_DTYPES[dtype]

    def is_integer(self, dtype: Any) -> bool:
        return not (dtype.is_floating_point or dtype.is_complex)

    def empty(self, count: int, dtype: Any) -> Any:
        return torch.empty(count, dtype=dtype, device=self.device)

    def empty_like(self, array: Any, count: int | None = None) -> Any:
        return torch.empty(array.numel() if count is None else count, dtype=array.dtype, device=array.device)

    def copyto(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    def divide(self, array: Any, n: int) -> None:
        array.div_(n)

    def count(self, array: Any) -> int:
        return int(array.numel())

    def itemsize(self, array: Any) -> int:
        return int(array.element_size())

    def address(self, array: Any) -> int:
        return int(array.data_ptr())

    def check(self, array: Any, what: str) -> Any:
        if not isinstance(array, torch.Tensor):
            raise CommunicatorError(f"{what} must be a torch tensor, got {type(array).__name__}")
        if array.device != self.device:
            raise CommunicatorError(f"{what} is on {array.device} but the communicator runs on {self.device}",
                                    fix="move the tensor, or make the transport on that device")
        if not array.is_contiguous():
            raise CommunicatorError(f"{what} is not contiguous", fix="pass tensor.contiguous()")
        if array.requires_grad and array.is_leaf:
            raise CommunicatorError(f"{what} requires grad; the runtime writes it in place",
                                    fix="pass tensor.detach() (or call under torch.no_grad())")
        return array.view(-1)


class _Request:
    """One persistent message: a byte view of its buffer, the peer (group rank), tag, direction and state."""

    __slots__ = ("buf", "error", "lane", "peer", "send", "state", "tag", "work")

    def __init__(self, buf: torch.Tensor, peer: int, tag: int, send: bool) -> None:
        self.buf = buf
        self.peer = peer
        self.tag = tag
        self.send = send
        self.work: Any = None
        self.state = _IDLE
        self.error = ""
        self.lane: _Lane | None = None


class _Lane:
    """NCCL only: one direction of one pair within a binding; its messages are issued in tag order."""

    __slots__ = ("members", "next", "ready")

    def __init__(self, members: list[_Request]) -> None:
        self.members = sorted(members, key=lambda r: r.tag)
        self.next = 0
        self.ready: set[int] = set()


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


def _byte_view(buf: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (gloo and NCCL then move any dtype, bfloat16 included, unchanged)."""
    return buf.view(torch.uint8) if buf.numel() else buf


class TorchTransport:
    """Point-to-point and small collectives over torch.distributed (gloo or NCCL).

    Parameters
    ----------
    group:
        The process group to run on (default: the world); private groups over the same ranks are
        made from it, so the runtime's messages never meet the application's.  Collective: every
        rank of the world must construct the transport (``torch.distributed.new_group``).
    device:
        Where the tensors live: CPU for gloo (default), the current CUDA device for NCCL.
    timeout:
        The communicator's timeout, used to set the backend's own (longer) timeout.
    """

    name = "torch"

    def __init__(self, group: Any = None, *, device: torch.device | str | None = None, timeout: float = 30.0) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise CommunicatorError("torch.distributed is not initialized",
                                    fix="call torch.distributed.init_process_group(...) first")
        self.backend = str(dist.get_backend(group)).lower()
        if self.backend not in ("gloo", "nccl"):
            raise CommunicatorError(f"the torch transport runs on gloo or nccl, not {self.backend}")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else "cpu"
        self.device = torch.device(device)
        if (self.device.type == "cuda") != (self.backend == "nccl"):
            raise CommunicatorError(f"{self.backend} cannot move tensors on {self.device}",
                                    fix="use gloo for CPU tensors and nccl for CUDA tensors")
        self.ranks: list[int] = (dist.get_process_group_ranks(group) if group is not None
                                 else list(range(dist.get_world_size())))
        pg_timeout = timedelta(seconds=max(60.0, BACKEND_TIMEOUT_FACTOR * timeout))
        self.group = dist.new_group(self.ranks, timeout=pg_timeout, backend=self.backend)
        # NCCL: messages towards lower ranks get their own groups (see the module notes)
        self._down = (dist.new_group(self.ranks, timeout=pg_timeout, backend=self.backend)
                      if self.backend == "nccl" else self.group)
        self.rank = dist.get_rank(self.group)
        self.size = len(self.ranks)
        self.tag_ub = TAG_UB
        self.array_ops = TorchOps(self.device)
        self._wake = threading.Event()
        self._waiters = _Waiters(self._wake) if self.backend == "gloo" else None
        self._new: list[_Request] = []

    # ------------------------------------------------------------------ point-to-point

    def send_init(self, buf: Any, peer: int, tag: int) -> Any:
        req = _Request(_byte_view(buf), peer, tag, True)
        self._new.append(req)
        return req

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any:
        req = _Request(_byte_view(buf), peer, tag, False)
        self._new.append(req)
        return req

    def _make_lanes(self) -> None:
        """Group the requests made since the last start (one binding's) by pair direction (NCCL)."""
        lanes: dict[tuple[int, bool], list[_Request]] = {}
        for req in self._new:
            lanes.setdefault((req.peer, req.send), []).append(req)
        for members in lanes.values():
            lane = _Lane(members)
            for req in members:
                req.lane = lane
        self._new = []

    def _issue(self, req: _Request) -> None:
        peer = self.ranks[req.peer]
        if self._waiters is not None:
            group = self.group
        else:  # NCCL: the direction of the message picks the group
            upward = (self.rank < req.peer) if req.send else (req.peer < self.rank)
            group = self.group if upward else self._down
        try:
            if req.send:
                req.work = dist.isend(req.buf, dst=peer, group=group, tag=req.tag)
            else:
                req.work = dist.irecv(req.buf, src=peer, group=group, tag=req.tag)
        except Exception as exc:
            raise PeerFailure(f"{self.backend}: {_first_line(exc)}", [req.peer]) from None
        if self._waiters is not None:
            self._waiters.submit(req)

    def start(self, requests: list[Any]) -> None:
        if self._new and self._waiters is None:
            self._make_lanes()
        for req in requests:
            if not req.buf.numel():  # both sides know the sizes: nothing to move
                req.state = _DONE
                continue
            req.state = _ACTIVE
            req.work = None
            lane = req.lane
            if lane is None:
                self._issue(req)
                continue
            lane.ready.add(id(req))
            while lane.next < len(lane.members) and id(lane.members[lane.next]) in lane.ready:
                nxt = lane.members[lane.next]
                lane.ready.discard(id(nxt))
                self._issue(nxt)
                lane.next += 1
            if lane.next == len(lane.members):
                lane.next = 0  # every message of this call issued: the next call starts over

    def _done(self, req: _Request) -> bool:
        if req.state == _ACTIVE and self._waiters is None and req.work is not None:
            try:
                if req.work.is_completed():
                    req.state = _DONE
            except Exception as exc:
                req.error, req.state = _first_line(exc), _FAILED
        return req.state >= _DONE

    def test_some(self, requests: list[Any]) -> list[int]:
        finished = [j for j, req in enumerate(requests) if self._done(req)]
        if not finished and self._waiters is not None:
            self._wake.wait(0.001)  # a waiter thread sets it on any completion
            self._wake.clear()
            finished = [j for j, req in enumerate(requests) if req.state >= _DONE]
        failed = [requests[j] for j in finished if requests[j].state == _FAILED]
        if failed:
            raise PeerFailure(f"{self.backend}: {failed[0].error}", [r.peer for r in failed])
        return finished

    def free(self, requests: Sequence[Any]) -> None:
        for req in requests:
            req.work = None
            req.lane = None

    # ------------------------------------------------------------------ small collectives

    def _within(self, work: Any, timeout: float) -> bool:
        """Poll a collective's work until it completes (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while not work.is_completed():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0002)
        try:
            work.wait()
        except Exception as exc:
            raise PeerFailure(f"{self.backend}: {_first_line(exc)}") from None
        return True

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None:
        mine = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        rows = [torch.empty_like(mine) for _ in range(self.size)]
        if not self._within(dist.all_gather(rows, mine, group=self.group, async_op=True), timeout):
            return None
        return [tuple(int(v) for v in row.tolist()) for row in rows]

    def barrier(self, timeout: float) -> bool:
        token = torch.zeros(1, dtype=torch.int32, device=self.device)
        return self._within(dist.all_reduce(token, group=self.group, async_op=True), timeout)

    def max_float(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def native(self, collective: str, send: Any, recv: Any, op: str, root: int) -> None:
        """torch.distributed's own collective of the same kind (benchmark baseline): blocking."""
        rop = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        g, r = self.group, self.ranks[root]
        if collective == "allreduce":
            dist.all_reduce(recv, op=rop, group=g)
        elif collective == "reduce":
            dist.reduce(send, r, op=rop, group=g)
        elif collective == "broadcast":
            dist.broadcast(recv, r, group=g)
        elif collective == "allgather":
            dist.all_gather(list(recv.chunk(self.size)), send, group=g)
        elif collective == "reducescatter":
            dist.reduce_scatter_tensor(recv, send, op=rop, group=g)
        elif collective == "alltoall":
            dist.all_to_all_single(recv, send, group=g)
        else:
            raise ValueError(collective)

    def close(self) -> None:
        """Destroy the private process groups (call on every rank, while healthy)."""
        for group in {id(self.group): self.group, id(self._down): self._down}.values():
            dist.destroy_process_group(group)
