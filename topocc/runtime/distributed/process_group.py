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

A planned call on CPU tensors is queued to the group's progress thread
(:mod:`~topocc.runtime.distributed.progress`), which replays the group's calls in
call order while the caller goes on (DDP's backward computes the next buckets),
and returns a ``Work`` that completes when the call has run; on CUDA it is
enqueued on NCCL's stream with the caller's stream ordered after it, and
returns a completed ``Work``.  Either future holds the outputs, so
``async_op=True`` and DDP's ``get_future()`` work unchanged.  A call the plan is
not predicted to speed up (below the bundle's ``native_below`` for the plan, on
CPU) goes native.  Plans are read, and the communicators that replay them made,
at their first call; gloo connects the private group's ranks pair by pair as a
plan first talks between them.

A compressed bundle's encodings carry gradients only: all-reduces and reduce-scatters of float CPU tensors
issued during backward (DDP's buckets, FSDP2's gradient shards) run encoded; every other planned call
(parameters gathered or broadcast, a loss or a metric) replays its plan exact, and ``counters()`` counts
which ran which way.

Method names follow the PyTorch release: the pybind trampoline asks for
``all_gather_single`` or ``_allgather_base`` and so on, so each is defined
under every name a supported release dispatches to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # private: not in the stub

from topocc.runtime.bundle import ROOTED, BundlePlan, group_label
from topocc.runtime.calls import Call, CallLog
from topocc.runtime.collective import BY_NAME, Collective
from topocc.runtime.distributed.counters import Counters
from topocc.runtime.distributed.debug import CallReport, debug_level, note_failure
from topocc.runtime.distributed.job import Job
from topocc.runtime.distributed.lost import LostRanks
from topocc.runtime.distributed.progress import Progress
from topocc.runtime.distributed.residuals import BackwardOrder, bucket_key, carries_residual
from topocc.runtime.distributed.tuning import Arm, CallClass, NativeCalls, Tuner, call_class, tuning_enabled
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.transports.gloo import GlooTransport
from topocc.runtime.transports.store import StoreControl
from topocc.runtime.transports.torch_ops import TORCH_DTYPES

if TYPE_CHECKING:
    from topocc.runtime.communicator import Communicator
    from topocc.runtime.feedback import ErrorFeedback

__all__ = ["TopoccProcessGroup"]

log = logging.getLogger("topocc.distributed")

#: What names a plan of a group and the device it runs on: (collective, root or None, device type).
_Key = tuple[str, int | None, str]
#: A call being timed as a trial: its class, which arm it tries, and its tensors' device.
_Trial = tuple[CallClass, Arm, torch.device]

#: torch's reduction ops the plans replay, by the runtime's names (``ReduceOp`` objects do not hash by value).
_OPS: tuple[tuple[Any, str], ...] = (
    (dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.PRODUCT, "prod"),
    (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.MAX, "max"),
)


def _op_name(op: Any) -> str | None:
    return next((name for known, name in _OPS if op == known), None)


def _not_a_gradient(collective: Collective, tensor: torch.Tensor) -> str | None:
    """Why a call of ``collective`` on ``tensor`` runs a compressed plan exact though its encodings carry the data
    (None: it runs encoded).  Only gradients are encoded: all-reduces and reduce-scatters of float CPU data during
    backward (DDP's buckets, FSDP's gradient shards); gathered or broadcast parameters, a loss, a metric stay
    exact.  Decided on the calling thread: the progress thread is never inside backward."""
    if not collective.carries_gradients:
        return f"not a gradient ({collective.name} runs exact)"
    if not carries_residual(tensor):
        return "not a gradient (outside backward)"
    return None


def _native_name(device: torch.device) -> str:
    """The native backend that serves ``device``'s tensors, by name."""
    return "gloo" if device.type == "cpu" else "nccl"


def _nbytes(*tensors: torch.Tensor) -> int:
    """The bytes of ``tensors`` together."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _completed(result: Any) -> Any:
    """A ``Work`` that is already done, its future holding ``result`` (what DDP and FSDP read)."""
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _future(work: Any) -> torch.futures.Future[Any] | None:
    """``work``'s future; None for a native work that has none (gloo's reduce-scatter), once it has completed."""
    try:
        return work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented": wait for it here instead
        work.wait()
        return None


def _joined(works: Sequence[Any], result: Any) -> Any:
    """One ``Work`` finishing when every one of ``works`` has (coalesced calls; some may be native)."""
    futures = [f for f in map(_future, works) if f is not None]
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
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stub lacks the binding's (rank, size) overload
        self._rank, self._size = rank, size
        self.group = group
        self.job = job
        self.timeout_s = job.timeout_s or max(1.0, timeout.total_seconds())
        self.stats = Counters(group)
        #: This group's error-feedback residuals (None: off; :mod:`~topocc.runtime.distributed.residuals`).
        self.feedback: ErrorFeedback | None = None
        if job.feedback is not None:
            from topocc.runtime.feedback import ErrorFeedback  # loaded where error feedback is on

            self.feedback = ErrorFeedback(job.feedback)
        self._backward_order = BackwardOrder()
        self._encodings: dict[int, frozenset[str]] = {}  # the encodings each schedule names, by id
        self._store = store
        self._name = ""
        self._desc = ""
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("native-cpu/", store), rank, size, timeout)
        self._native: dict[str, Any] = {"cpu": NativeCalls(gloo, self._native_work)}
        # planned calls are measured against the native backend's before a call class keeps its plan (tuning.py)
        self._tuner = Tuner() if tuning_enabled() else None
        self._trial: _Trial | None = None  # the call being routed is this trial
        # no CPU call of this group is in flight: none made yet, or the last was a trial, waited for.  Every rank
        # makes the same calls in the same order, so every rank finds the same here, and a trial skips the
        # drain's barrier alike (consecutive first calls, a job's set-up, meet no barrier between them)
        self._idle = True
        # a plan is read at its first call; the private gloo group connects a pair of ranks when a plan first
        # talks between them (a group the bundle has no plan for needs none)
        self._plans: dict[tuple[str, int | None], BundlePlan] = {
            (e.collective, e.root): e for e in job.bundle.plans_for(group)}
        self._transports: dict[str, Any] = {}
        if self._plans:  # made with the group: a rank lost before the first planned call is then a peer that
            # resets its connections, which the communicator's handshake names, not a store key never written
            self._transports["cpu"] = GlooTransport.over_store(dist.PrefixStore("topocc-cpu/", store), rank, size,
                                                               timeout=self.timeout_s, lazy=True)
        label = group_label(group, job.bundle.world)
        self._progress = Progress(f"topocc-progress-{label}")
        self._report = CallReport(rank, "world" if label == "world" else f"ranks {label}", debug_level() == "INFO")
        self._comms: dict[tuple[str, int | None, str], Communicator] = {}
        self._unavailable: dict[str, str] = {}  # device type -> why its planned transport could not be made
        self._timeout = timeout
        self._log = CallLog(job.record) if job.record is not None and rank == 0 else None
        # a failed planned call names the rank the job lost, agreed with the other ranks through the store
        self._lost = LostRanks(store, rank, group, window_s=min(5.0, self.timeout_s))

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
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore("native-cuda/", self._store), self._rank, self._size,
                                         options)
            backend = self._native[kind] = NativeCalls(nccl, self._native_work)
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
               root: int | None = None) -> _Key | None:
        """The plan that runs this call (its key, for :meth:`_planned`), or None (then the caller delegates it),
        counted and logged."""
        first = tensors[0]
        dtype = TORCH_DTYPES.get(first.dtype, str(first.dtype))
        if self._log is not None:
            self._log.add(Call(collective, self.group, nbytes, dtype, _op_name(op) if op is not None else None,
                               root if collective in ROOTED else None, first.device.type))
        why = self._refusal(collective, tensors, op, root) or self._unavailable.get(first.device.type)
        key = (collective, root if collective in ROOTED else None, first.device.type)
        if why is None:
            why = self._no_gain(self._plans[key[:2]], nbytes, first.device)
        if why is None and key not in self._comms:
            try:
                self._transport(first.device)
            except CommunicatorError as exc:  # e.g. no CuPy: every rank finds the same, so all go native
                why = self._unavailable[first.device.type] = f"no {first.device.type} transport ({exc.message})"
        if why is None and self._tuner is not None:
            why = self._measured(call_class(collective, key[1], first.device.type, nbytes), first.device)
        self._tally(collective, nbytes, why, first.device, provisional=self._trial is not None)
        if why is not None:
            self._report.native(collective, nbytes, dtype, first.device.type,
                                _native_name(first.device), why)
            return None
        if self._report.enabled:  # reads the plan now, not at the first call's replay
            plan = self._plans[key[:2]].plan
            bucket = plan.bucket(nbytes)
            self._report.planned(collective, nbytes, dtype, first.device.type, plan.schedule(bucket), bucket,
                                 plan.bucket_count)
        self._count_encoding(key, first, nbytes, op)
        return key

    def _count_encoding(self, key: _Key, first: torch.Tensor, nbytes: int, op: Any) -> None:
        """Count a planned call whose schedule names encodings: run encoded, or exact and why (an integer dtype,
        a min, max or product, bfloat16 on the host, NCCL: what the encodings cannot carry)."""
        schedule = self._plans[key[:2]].plan.select(nbytes)
        specs = self._encodings.get(id(schedule))
        if specs is None:
            specs = self._encodings[id(schedule)] = frozenset(
                o.encoding for o in schedule.written_ops() if o.encoding)
        if not specs:
            return
        if key[2] != "cpu":
            why: str | None = "NCCL replays exact"
        elif first.dtype == torch.bfloat16:
            why = "bfloat16 tensors (no numpy view for the encodings)"
        else:
            from topocc.runtime.encoding import why_exact  # loaded with the first encoded plan

            why = why_exact(specs, TORCH_DTYPES[first.dtype], first.element_size(),
                            _op_name(op) if op is not None else None)
            why = why or _not_a_gradient(BY_NAME[key[0]], first)
        self.stats.encoding(key[0], why)

    @staticmethod
    def _no_gain(entry: BundlePlan, nbytes: int, device: torch.device) -> str | None:
        """Why a CPU call of ``nbytes`` goes native though a plan serves it: the compiler predicts it no faster
        than gloo's own algorithm (the bundle's ``native_below``); None when the plan runs it.  The threshold is
        found against gloo's algorithms, not NCCL's, so CUDA calls leave the choice to the trials against NCCL."""
        if device.type != "cpu" or entry.native_below == 0:
            return None
        if entry.native_below is None:
            return "model predicts no gain at any size"
        if nbytes < entry.native_below:
            return f"model predicts no gain at {nbytes} bytes (the plan runs from {entry.native_below})"
        return None

    def _measured(self, cls: CallClass, device: torch.device) -> str | None:
        """Why a call of ``cls`` goes native by measurement (None: the plan runs it); a trial drains the group's
        calls in flight first, so that it is timed alone, and is timed by :meth:`_planned` or the native call."""
        assert self._tuner is not None
        arm = self._tuner.arm(cls)
        if arm is Arm.PLAN:
            return None
        if arm is Arm.NATIVE:
            return self._tuner.choices[cls].why(_native_name(device))
        self._drain()
        self._settle(device)
        self._trial = (cls, arm, device)
        return None if arm is Arm.TRY_PLAN else "a trial against the plan"

    @staticmethod
    def _settle(device: torch.device) -> None:
        """Wait until ``device`` has run all the work queued on it (nothing to wait for on the host): a CUDA
        call returns with its work queued, so a CUDA trial is timed between two settled devices."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _drain(self) -> None:
        """Wait for this group's planned and native calls in flight: the progress thread's queue, then a gloo
        barrier, which completes after every gloo call made before it (gloo's barrier waits for prior work).
        No work is held here: one held at exit would be freed at finalization (see communicator's exit guard)."""
        if self._idle:
            return
        self._progress.drain()
        self._native["cpu"].backend.barrier(dist.BarrierOptions()).wait()

    def _native_work(self, result: Any, start: float) -> None:
        """A native call was made at ``start``: if it is a trial, wait for it and record its time."""
        if self._trial is not None and self._trial[1] is Arm.TRY_NATIVE and isinstance(result, dist.Work):
            trial, self._trial = self._trial, None
            result.wait()  # on CUDA it orders the caller's stream after the call; the clock needs the device settled
            self._settle(trial[2])
            self._idle = True
            self._recorded(trial, time.perf_counter() - start)
        else:
            self._idle = False

    def _recorded(self, trial: _Trial, seconds: float) -> None:
        assert self._tuner is not None
        choice = self._tuner.record(trial[0], trial[1], seconds, self._agree)
        if choice is not None:
            self._report.measured(trial[0], _native_name(trial[2]), choice.plan_s, choice.native_s, choice.planned)

    def _agree(self, figures: list[float]) -> list[float]:
        """The MIN over the group's ranks of each of ``figures`` (a small native all-reduce)."""
        t = torch.tensor(figures, dtype=torch.float64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN  # type: ignore[assignment]  # the stub types the enum value apart from ReduceOp
        self._native["cpu"].backend.allreduce([t], opts).wait()
        return [float(x) for x in t.tolist()]

    def _comm(self, key: _Key) -> Communicator:
        """The communicator of the plan ``key`` names, made at its first call (a handshake with the peers: on CPU
        it runs on the progress thread, in call order with the group's other planned calls)."""
        comm = self._comms.get(key)
        if comm is None:
            # the replay's modules load here, at the first planned call: init_process_group loads only what
            # routing a call needs, so a job's set-up costs about what gloo's does
            from topocc.runtime.communicator import Communicator

            comm = self._comms[key] = Communicator(self._plans[key[:2]].plan, transport=self._transports[key[2]],
                                                   timeout=self.timeout_s, on_failure=self._lost.restate)
        return comm

    def _planned(self, key: _Key, run: Callable[[Communicator], Any], result: Any) -> Any:
        """Run a planned call, ``run(communicator)``: on CPU by the group's progress thread (the caller gets its
        ``Work`` at once), on CUDA now (NCCL's stream orders it); the work's future holds ``result``."""
        trial, self._trial = self._trial, None
        if key[2] != "cpu":
            comm = self._comm(key)  # made (NCCL communicator, peers met) before the clock starts
            start = time.perf_counter()
            run(comm)
            if trial is not None:  # the device settled before the trial; timed to its settling after
                self._settle(trial[2])
                self._recorded(trial, time.perf_counter() - start)
            return _completed(result)
        took: list[float] = []

        def call() -> None:
            try:
                comm = self._comm(key)  # made (plan read, peers met) before the clock starts
                start = time.perf_counter()
                run(comm)
                took.append(time.perf_counter() - start)
            except CommunicatorError as exc:  # the excepthook names it last, however torch re-raises it
                note_failure(exc)
                raise

        work = self._progress.submit(call, result)
        self._idle = trial is not None
        if trial is not None:  # a trial of the plan: waited for here, so that the next call is timed alone
            work.wait()
            self._recorded(trial, took[0])
        return work

    def _tally(self, collective: str, nbytes: int, why: str | None, device: torch.device,
               provisional: bool = False) -> None:
        """Count a call (planned when ``why`` is None) and log why one goes to the native backend."""
        self.stats.count(collective, nbytes, why, provisional)
        if why is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("rank %d of %s: %s of %d bytes goes to native %s: %s", self._rank, list(self.group),
                      collective, nbytes, _native_name(device), why)

    def _delegate(self, collective: str, device: torch.device, nbytes: int, why: str, names: Sequence[str],
                  *args: Any) -> Any:
        """Count and run a call the plans never serve (point-to-point, barrier, gather, scatter) natively."""
        self._tally(collective, nbytes, why, device)
        return _native_call(self.native(device), names, *args)

    # ------------------------------------------------------------------ planned collectives
    # Each method takes the list form the C++ trampoline calls; torch's stub declares the Python-side
    # overloads too, so the overrides differ from it (ignore[override]).

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]  # list form: see above
        opts = opts if opts is not None else dist.AllreduceOptions()
        comm = (self._route("allreduce", tensors, _nbytes(tensors[0]), opts.reduceOp)
                if len(tensors) == 1 else self._count_many("allreduce", tensors))
        if comm is None:
            return self.native(tensors[0].device).allreduce(tensors, opts)
        x, op = tensors[0].detach(), _op_name(opts.reduceOp) or "sum"
        # a compressed plan encodes gradients only (float, CPU, during backward): a loss or metric runs exact
        gradient = carries_residual(x)
        if self.feedback is not None and gradient:  # a gradient bucket: with its residual
            feedback, key = self.feedback, bucket_key(x)
            return self._planned(comm, lambda c: feedback.allreduce(c, key, x, op), tensors)
        return self._planned(comm, lambda c: c.allreduce(x, op=op, exact=not gradient), tensors)

    def _count_many(self, collective: str, tensors: Sequence[torch.Tensor]) -> _Key | None:
        """Count a call of several tensors, which goes native: None, as :meth:`_route` for a native call."""
        self._tally(collective, _nbytes(*tensors), "several tensors per call",
                    tensors[0].device)
        return None

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """One planned all-reduce of the tensors laid end to end (as NCCL's coalescing does, one call)."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        nbytes = _nbytes(*tensors)
        comm = self._route("allreduce", tensors, nbytes, opts.reduceOp) if tensors else None
        if comm is None:
            return self.native(tensors[0].device).allreduce_coalesced(tensors, opts)
        flat, op = torch.cat([t.detach().reshape(-1) for t in tensors]), _op_name(opts.reduceOp) or "sum"
        exact = not carries_residual(flat)

        def run(c: Communicator) -> None:
            c.allreduce(flat, op=op, exact=exact)
            offset = 0
            for t in tensors:
                t.detach().view(-1).copy_(flat[offset:offset + t.numel()])
                offset += t.numel()

        return self._planned(comm, run, tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]  # list form: see above
        opts = opts if opts is not None else dist.BroadcastOptions()
        comm = (self._route("broadcast", tensors, _nbytes(tensors[0]), root=opts.rootRank)
                if len(tensors) == 1 else self._count_many("broadcast", tensors))
        if comm is None:
            return self.native(tensors[0].device).broadcast(tensors, opts)
        x = tensors[0].detach()
        return self._planned(comm, lambda c: c.broadcast(x, exact=True), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]  # list form: see above
        opts = opts if opts is not None else dist.ReduceOptions()
        comm = (self._route("reduce", tensors, _nbytes(tensors[0]), opts.reduceOp,
                            opts.rootRank) if len(tensors) == 1 else self._count_many("reduce", tensors))
        if comm is None:
            return self.native(tensors[0].device).reduce(tensors, opts)
        x, op = tensors[0].detach(), _op_name(opts.reduceOp) or "sum"
        return self._planned(comm, lambda c: c.reduce(x, op=op, exact=True), tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllgatherOptions()  # type: ignore[attr-defined]  # not in the stub
        fits = output.numel() == input.numel() * self._size and output.dtype == input.dtype
        comm = self._route("allgather", [output, input], _nbytes(output)) if fits else None
        if comm is None:
            if not fits:
                self._tally("allgather", _nbytes(output), "sizes do not fit", input.device)
            return _native_call(self.native(input.device), ("all_gather_single", "_allgather_base"), output, input,
                                opts)
        send, recv = input.detach(), output.detach()
        return self._planned(comm, lambda c: c.allgather(send, recv, exact=True), [output])

    _allgather_base = all_gather_single

    def allgather(  # type: ignore[override]  # list form: see above
            self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllgatherOptions()  # type: ignore[attr-defined]  # not in the stub
        first = inputs[0]
        fits = (len(inputs) == 1 and len(outputs[0]) == self._size
                and all(o.shape == first.shape and o.dtype == first.dtype for o in outputs[0]))
        nbytes = _nbytes(first) * self._size
        comm = self._route("allgather", [first], nbytes) if fits else None
        if comm is None:
            if not fits:
                self._tally("allgather", nbytes, "a list form that is not one tensor per rank", first.device)
            return self.native(first.device).allgather(outputs, inputs, opts)
        mine = first.detach()

        def run(c: Communicator) -> None:
            flat = c.allgather(mine, exact=True)
            for r, out in enumerate(outputs[0]):
                out.detach().view(-1).copy_(flat[r * mine.numel():(r + 1) * mine.numel()])

        return self._planned(comm, run, outputs)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> Any:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]  # an alias: see the module doc

    def allgather_coalesced(
            self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """``all_gather_coalesced``: ``outputs[r][i]`` gets rank r's ``inputs[i]``, by one planned all-gather of
        the inputs laid end to end (as :meth:`allreduce_coalesced`), else by the native backend."""
        opts = opts if opts is not None else dist.AllgatherOptions()  # type: ignore[attr-defined]  # not in the stub
        fits = bool(inputs) and len(outputs) == self._size and all(
            len(row) == len(inputs) and all(o.numel() == i.numel() and o.dtype == i.dtype == inputs[0].dtype
                                            for o, i in zip(row, inputs)) for row in outputs)
        flat = torch.cat([i.detach().reshape(-1) for i in inputs]) if fits else None
        nbytes = _nbytes(*inputs) * self._size
        comm = self._route("allgather", [flat], nbytes) if flat is not None and flat.numel() else None
        if comm is None:
            if flat is None or not flat.numel():
                self._tally("allgather", nbytes, "a coalesced list form that is not one tensor per input and rank"
                            if flat is None else "an empty tensor", inputs[0].device if inputs else torch.device("cpu"))
            return self.native(inputs[0].device).allgather_coalesced(outputs, inputs, opts)

        def run(c: Communicator) -> None:
            assert flat is not None  # a call with no tensor to gather went native above
            gathered = c.allgather(flat, exact=True)
            for r, row in enumerate(outputs):
                pieces = gathered[r * flat.numel():(r + 1) * flat.numel()].split([i.numel() for i in inputs])
                for out, piece in zip(row, pieces):
                    out.detach().view(-1).copy_(piece)

        return self._planned(comm, run, outputs)

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
        send, recv, op = input.detach(), output.detach(), _op_name(opts.reduceOp) or "sum"
        return self._planned(comm, self._reduce_scatter(send, recv, op), [output])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # an alias: see the module doc

    def reduce_scatter(  # type: ignore[override]  # list form: see above
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
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
        return self._planned(comm, self._reduce_scatter(flat, out.detach(), _op_name(opts.reduceOp) or "sum"),
                             outputs)

    def _reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor, op: str) -> Callable[[Communicator], Any]:
        """What a planned reduce-scatter runs: encoded, with its residual where error feedback is on, for a
        gradient (FSDP's shards, during backward); exact otherwise.  Decided and keyed on the calling thread."""
        if not carries_residual(send):
            return lambda c: c.reduce_scatter(send, recv, op=op, exact=True)
        if self.feedback is None:
            return lambda c: c.reduce_scatter(send, recv, op=op)
        feedback, key = self.feedback, self._backward_order.key(send)
        return lambda c: feedback.reduce_scatter(c, key, send, recv, op)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]  # an alias: see the module doc

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
        send, recv = input.detach(), output.detach()
        return self._planned(comm, lambda c: c.alltoall(send, recv, exact=True), [output])

    alltoall_base = all_to_all_single  # type: ignore[assignment]  # an alias: see the module doc

    # ------------------------------------------------------------------ always native

    def barrier(self, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._delegate("barrier", torch.device("cpu"), 0, "not a planned collective", ("barrier",), opts)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's barrier that names the ranks that did not arrive within ``timeout``, on the native group.

        ``dist.monitored_barrier`` itself refuses every backend but gloo by name; torch code that holds the
        process group (``group.monitored_barrier(...)``) reaches this."""
        self._tally("barrier", 0, "not a planned collective", torch.device("cpu"))
        native = self.native(torch.device("cpu"))
        if timeout is None:
            native.monitored_barrier(wait_all_ranks=wait_all_ranks)
        else:
            native.monitored_barrier(timeout, wait_all_ranks)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        nbytes = _nbytes(*inputs)
        return self._delegate("alltoall", inputs[0].device, nbytes, "the list form", ("alltoall",), outputs, inputs,
                              opts if opts is not None else dist.AllToAllOptions())

    def gather(  # type: ignore[override]  # list form: see above
            self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        return self._delegate("gather", inputs[0].device, _nbytes(inputs[0]),
                              "not a planned collective", ("gather",), outputs, inputs,
                              opts if opts is not None else dist.GatherOptions())

    def scatter(  # type: ignore[override]  # list form: see above
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
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
        """Close the communicators and transports (collective: every rank of the group, while healthy), once the
        planned calls queued so far have run."""
        self._progress.close()
        for comm in self._comms.values():
            comm.close()
        self._comms.clear()
