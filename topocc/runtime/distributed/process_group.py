"""``init_process_group("topocc")``: a torch.distributed process group whose collectives replay compiled plans.

DDP, FSDP2, DeviceMesh and functional collectives call a process group's
methods; this one answers each call with the bundle's plan for that collective
and group (:mod:`topocc.runtime.bundle`), replayed by a
:class:`~topocc.runtime.communicator.Communicator`: over a private gloo group
for CPU tensors, over NCCL for CUDA tensors.  A call the plans cannot serve (no
plan for the collective, group or root; a dtype, op or layout the runtime does
not replay; point-to-point, barrier, gather, scatter) goes to the native backend
(gloo or NCCL, made from the same store): always correct, and counted
(:class:`~topocc.runtime.distributed.counters.Counters`) and logged at debug
level on the ``topocc.distributed`` logger (``TOPOCC_LOG=debug`` prints it).

Calls run to completion before they return (the replay is host-driven on CPU;
on CUDA it is enqueued on NCCL's stream with the caller's stream ordered after
it), and return a completed ``Work`` whose future holds the outputs, so
``async_op=True`` and DDP's ``get_future()`` work unchanged.

Method names follow the PyTorch release: the pybind trampoline asks for
``all_gather_single`` or ``_allgather_base`` and so on, so each is defined
under every name a supported release dispatches to.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from topocc.runtime.bundle import ROOTED
from topocc.runtime.calls import Call, CallLog
from topocc.runtime.communicator import Communicator
from topocc.runtime.distributed.counters import Counters
from topocc.runtime.distributed.job import Job
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.transports.gloo import GlooTransport
from topocc.runtime.transports.store import StoreControl
from topocc.runtime.transports.torch_ops import TORCH_DTYPES

__all__ = ["TopoccProcessGroup"]

log = logging.getLogger("topocc.distributed")

#: torch's reduction ops the plans replay, by the runtime's names (``ReduceOp`` objects do not hash by value).
_OPS: tuple[tuple[Any, str], ...] = (
    (dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.PRODUCT, "prod"),
    (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.MAX, "max"),
)


def _op_name(op: Any) -> str | None:
    return next((name for known, name in _OPS if op == known), None)


def _nbytes(*tensors: torch.Tensor) -> int:
    """The bytes of ``tensors`` together."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _completed(result: Any) -> Any:
    """A ``Work`` that is already done, its future holding ``result`` (what DDP and FSDP read)."""
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _joined(works: Sequence[Any], result: Any) -> Any:
    """One ``Work`` finishing when every one of ``works`` has (coalesced calls)."""
    futures = [w.get_future() for w in works]
    if not futures:
        return _completed(result)
    joined = torch.futures.collect_all(futures).then(lambda _: result)
    return _create_work_from_future(joined)


def _native_call(backend: Any, names: Sequence[str], *args: Any) -> Any:
    """Call the first of ``names`` that the native backend has (the names moved between releases)."""
    for name in names:
        method = getattr(backend, name, None)
        if method is not None:
            return method(*args)
    raise CommunicatorError(f"the native {backend.name()} backend has none of {', '.join(names)}",
                            fix="use a PyTorch release topocc supports")


class TopoccProcessGroup(dist.ProcessGroup):
    """A process group of ``size`` ranks (global ranks ``group``) that replays the bundle's plans.

    Made by ``init_process_group("topocc")`` and ``new_group(..., backend="topocc")`` through the
    backend registered in :mod:`topocc.runtime.distributed`; not constructed directly.
    """

    def __init__(self, store: Any, rank: int, size: int, group: tuple[int, ...], timeout: timedelta,
                 job: Job) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.group = group
        self.job = job
        self.timeout_s = job.timeout_s or max(1.0, timeout.total_seconds())
        self.stats = Counters(group)
        self._store = store
        self._name = ""
        self._desc = ""
        self._native: dict[str, Any] = {"cpu": dist.ProcessGroupGloo(dist.PrefixStore("native-cpu/", store),
                                                                     rank, size, timeout)}
        # made now, while every rank is here: a peer that dies later fails a call within the timeout instead
        # of stalling gloo's rendezvous; a group the bundle has no plan for needs none
        self._plans = {(e.collective, e.root): e.plan for e in job.bundle.plans_for(group)}
        self._transports: dict[str, Any] = {}
        if self._plans:
            self._transports["cpu"] = GlooTransport.over_store(dist.PrefixStore("topocc-cpu/", store), rank, size,
                                                               timeout=self.timeout_s)
        self._comms: dict[tuple[str, int | None, str], Communicator] = {}
        self._unavailable: dict[str, str] = {}  # device type -> why its planned transport could not be made
        self._timeout = timeout
        self._log = CallLog(job.record) if job.record is not None and rank == 0 else None

    # ------------------------------------------------------------------ identity

    def getBackendName(self) -> str:
        return "topocc"

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    def __repr__(self) -> str:
        return f"TopoccProcessGroup(rank={self._rank}, size={self._size}, group={list(self.group)})"

    # ------------------------------------------------------------------ routing

    def native(self, device: torch.device) -> Any:
        """The native backend for ``device``'s type: gloo for CPU (made at construction), NCCL for CUDA."""
        kind = device.type
        backend = self._native.get(kind)
        if backend is None:
            if kind != "cuda" or not dist.is_nccl_available():
                raise CommunicatorError(f"the topocc process group has no native backend for {kind} tensors",
                                        fix="use CPU or CUDA tensors")
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            backend = dist.ProcessGroupNCCL(dist.PrefixStore("native-cuda/", self._store), self._rank, self._size,
                                            options)
            self._native[kind] = backend
        return backend

    def _transport(self, device: torch.device) -> Any:
        """This group's transport for planned calls on ``device``: gloo's is made with the group, NCCL's at the
        first planned CUDA call (both collective)."""
        kind = device.type
        transport = self._transports.get(kind)
        if transport is None:
            from topocc.runtime.transports.nccl import NCCLTransport  # CuPy, loaded only for CUDA tensors

            control = StoreControl(dist.PrefixStore("topocc-cuda/", self._store), self._rank, self._size)
            transport = self._transports[kind] = NCCLTransport(control, device=device, timeout=self.timeout_s)
        return transport

    def _refusal(self, collective: str, tensors: Sequence[torch.Tensor], op: Any, root: int | None) -> str | None:
        """Why this call cannot run a plan (None when it can); every rank decides the same from the same call."""
        if self._plans.get((collective, root if collective in ROOTED else None)) is None:
            where = "this group" if self.group != tuple(range(self.job.bundle.world)) else "the world"
            return f"no {collective} plan for {where}" + (f" with root {root}" if collective in ROOTED else "")
        first = tensors[0]
        if any(t.dtype != first.dtype or t.device != first.device for t in tensors):
            return "tensors of mixed dtypes or devices"
        if first.dtype not in TORCH_DTYPES:
            return f"dtype {first.dtype}"
        if first.device.type not in ("cpu", "cuda"):
            return f"device {first.device.type}"
        if op is not None:
            name = _op_name(op)
            if name is None:
                return f"op {op}"
            if name == "avg" and not first.dtype.is_floating_point:
                return f"avg on {first.dtype}"
        if any(not t.is_contiguous() for t in tensors):
            return "a non-contiguous tensor"
        if any(t.numel() == 0 for t in tensors):
            return "an empty tensor"
        return None

    def _route(self, collective: str, tensors: Sequence[torch.Tensor], nbytes: int, op: Any = None,
               root: int | None = None) -> Communicator | None:
        """The communicator that replays this call, or None (then the caller delegates it), counted and logged."""
        first = tensors[0]
        if self._log is not None:
            self._log.add(Call(collective, self.group, nbytes, TORCH_DTYPES.get(first.dtype, str(first.dtype)),
                               _op_name(op) if op is not None else None,
                               root if collective in ROOTED else None, first.device.type))
        why = self._refusal(collective, tensors, op, root) or self._unavailable.get(first.device.type)
        comm = None
        if why is None:
            key = (collective, root if collective in ROOTED else None, first.device.type)
            comm = self._comms.get(key)
            if comm is None:
                try:
                    transport = self._transport(first.device)
                except CommunicatorError as exc:  # e.g. no CuPy: every rank finds the same, so all go native
                    why = self._unavailable[first.device.type] = f"no {first.device.type} transport ({exc.message})"
                else:
                    comm = self._comms[key] = Communicator(self._plans[key[:2]], transport=transport,
                                                           timeout=self.timeout_s)
        self._tally(collective, nbytes, why, first.device)
        return comm

    def _tally(self, collective: str, nbytes: int, why: str | None, device: torch.device) -> None:
        """Count a call (planned when ``why`` is None) and log why one goes to the native backend."""
        self.stats.count(collective, nbytes, why)
        if why is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("rank %d of %s: %s of %d bytes goes to native %s: %s", self._rank, list(self.group),
                      collective, nbytes, "gloo" if device.type == "cpu" else "nccl", why)

    def _delegate(self, collective: str, device: torch.device, nbytes: int, why: str, names: Sequence[str],
                  *args: Any) -> Any:
        """Count and run a call the plans never serve (point-to-point, barrier, gather, scatter) natively."""
        self._tally(collective, nbytes, why, device)
        return _native_call(self.native(device), names, *args)

    # ------------------------------------------------------------------ planned collectives

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceOptions()
        comm = (self._route("allreduce", tensors, _nbytes(tensors[0]), opts.reduceOp)
                if len(tensors) == 1 else self._count_many("allreduce", tensors))
        if comm is None:
            return self.native(tensors[0].device).allreduce(tensors, opts)
        comm.allreduce(tensors[0].detach(), op=_op_name(opts.reduceOp) or "sum")
        return _completed(tensors)

    def _count_many(self, collective: str, tensors: Sequence[torch.Tensor]) -> None:
        self._tally(collective, _nbytes(*tensors), "several tensors per call",
                    tensors[0].device)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """One planned all-reduce of the tensors laid end to end (as NCCL's coalescing does, one call)."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        nbytes = _nbytes(*tensors)
        comm = self._route("allreduce", tensors, nbytes, opts.reduceOp) if tensors else None
        if comm is None:
            return self.native(tensors[0].device).allreduce_coalesced(tensors, opts)
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        comm.allreduce(flat, op=_op_name(opts.reduceOp) or "sum")
        offset = 0
        for t in tensors:
            t.detach().view(-1).copy_(flat[offset:offset + t.numel()])
            offset += t.numel()
        return _completed(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BroadcastOptions()
        comm = (self._route("broadcast", tensors, _nbytes(tensors[0]), root=opts.rootRank)
                if len(tensors) == 1 else self._count_many("broadcast", tensors))
        if comm is None:
            return self.native(tensors[0].device).broadcast(tensors, opts)
        comm.broadcast(tensors[0].detach())
        return _completed(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceOptions()
        comm = (self._route("reduce", tensors, _nbytes(tensors[0]), opts.reduceOp,
                            opts.rootRank) if len(tensors) == 1 else self._count_many("reduce", tensors))
        if comm is None:
            return self.native(tensors[0].device).reduce(tensors, opts)
        comm.reduce(tensors[0].detach(), op=_op_name(opts.reduceOp) or "sum")
        return _completed(tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllgatherOptions()
        fits = output.numel() == input.numel() * self._size and output.dtype == input.dtype
        comm = self._route("allgather", [output, input], _nbytes(output)) if fits else None
        if comm is None:
            if not fits:
                self._tally("allgather", _nbytes(output), "sizes do not fit", input.device)
            return _native_call(self.native(input.device), ("all_gather_single", "_allgather_base"), output, input,
                                opts)
        comm.allgather(input.detach(), output.detach())
        return _completed([output])

    _allgather_base = all_gather_single

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllgatherOptions()
        first = inputs[0]
        fits = (len(inputs) == 1 and len(outputs[0]) == self._size
                and all(o.shape == first.shape and o.dtype == first.dtype for o in outputs[0]))
        nbytes = _nbytes(first) * self._size
        comm = self._route("allgather", [first], nbytes) if fits else None
        if comm is None:
            if not fits:
                self._tally("allgather", nbytes, "a list form that is not one tensor per rank", first.device)
            return self.native(first.device).allgather(outputs, inputs, opts)
        flat = comm.allgather(first.detach())
        for r, out in enumerate(outputs[0]):
            out.detach().view(-1).copy_(flat[r * first.numel():(r + 1) * first.numel()])
        return _completed(outputs)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> Any:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        fits = input.numel() == output.numel() * self._size and output.dtype == input.dtype
        nbytes = _nbytes(input)
        comm = self._route("reducescatter", [output, input], nbytes, opts.reduceOp) if fits else None
        if comm is None:
            if not fits:
                self._tally("reducescatter", nbytes, "sizes do not fit", input.device)
            return _native_call(self.native(input.device), ("reduce_scatter_single", "_reduce_scatter_base"),
                                output, input, opts)
        comm.reduce_scatter(input.detach(), output.detach(), op=_op_name(opts.reduceOp) or "sum")
        return _completed([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out = outputs[0]
        fits = (len(outputs) == 1 and len(inputs[0]) == self._size
                and all(i.shape == out.shape and i.dtype == out.dtype for i in inputs[0]))
        nbytes = _nbytes(out) * self._size
        comm = self._route("reducescatter", [out, *inputs[0]], nbytes, opts.reduceOp) if fits else None
        if comm is None:
            if not fits:
                self._tally("reducescatter", nbytes, "a list form that is not one tensor per rank", out.device)
            return self.native(out.device).reduce_scatter(outputs, inputs, opts)
        flat = torch.cat([i.detach().reshape(-1) for i in inputs[0]])
        comm.reduce_scatter(flat, out.detach(), op=_op_name(opts.reduceOp) or "sum")
        return _completed(outputs)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllToAllOptions()
        even = (not output_splits or len(set(output_splits)) == 1) and (not input_splits or len(set(input_splits)) == 1)
        fits = even and output.numel() == input.numel() and output.dtype == input.dtype \
            and input.numel() % self._size == 0
        nbytes = _nbytes(input)
        comm = self._route("alltoall", [output, input], nbytes) if fits else None
        if comm is None:
            if not fits:
                self._tally("alltoall", nbytes, "uneven splits", input.device)
            return _native_call(self.native(input.device), ("all_to_all_single", "alltoall_base"), output, input,
                                output_splits, input_splits, opts)
        comm.alltoall(input.detach(), output.detach())
        return _completed([output])

    alltoall_base = all_to_all_single

    # ------------------------------------------------------------------ always native

    def barrier(self, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._delegate("barrier", torch.device("cpu"), 0, "not a planned collective", ("barrier",), opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        nbytes = _nbytes(*inputs)
        return self._delegate("alltoall", inputs[0].device, nbytes, "the list form", ("alltoall",), outputs, inputs,
                              opts if opts is not None else dist.AllToAllOptions())

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        return self._delegate("gather", inputs[0].device, _nbytes(inputs[0]),
                              "not a planned collective", ("gather",), outputs, inputs,
                              opts if opts is not None else dist.GatherOptions())

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        return self._delegate("scatter", outputs[0].device, _nbytes(outputs[0]),
                              "not a planned collective", ("scatter",), outputs, inputs,
                              opts if opts is not None else dist.ScatterOptions())

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._delegate("send", tensors[0].device, _nbytes(tensors[0]),
                              "point-to-point", ("send",), tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._delegate("recv", tensors[0].device, _nbytes(tensors[0]),
                              "point-to-point", ("recv",), tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._delegate("recv", tensors[0].device, _nbytes(tensors[0]),
                              "point-to-point", ("recv_anysource",), tensors, tag)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close the communicators and transports (collective: every rank of the group, while healthy)."""
        for comm in self._comms.values():
            comm.close()
        self._comms.clear()
