"""Training-time integration: a DDP communication hook, Prophet block scheduling and DASO.

Three ways to run a compiled allreduce plan inside a PyTorch training loop:

* :func:`topocc_allreduce_hook` with :class:`TopoccHookState`: a DDP
  communication hook (``model.register_comm_hook(state, hook)``) that averages
  each DDP bucket with the plan's schedule for the bucket's byte size.  CPU
  tensors go through a :class:`~runtime.communicator.Communicator` (MPI) on a
  numpy view of the bucket, so no data is copied; CUDA tensors are replayed
  with torch.distributed point-to-point operations (NCCL) by :class:`TorchReplay`.
* :class:`BlockScheduler`: applies a Prophet block plan (Bao et al., "Preemptive
  all-reduce scheduling for expediting distributed DNN training", INFOCOM 2020).
  Per-parameter post-accumulate-grad hooks launch a block once all its
  gradients exist; a background thread sends ready blocks in planned order;
  each layer's optimizer step waits, in the next forward pass, only for the
  blocks holding that layer's parameters, so communication of late layers
  overlaps the forward pass of early ones.
* :class:`DASO` (Coquelin et al., "Accelerating neural network training with
  distributed asynchronous and selective optimization", J. Big Data 2022):
  gradients averaged inside each node every step, parameters averaged across
  nodes every ``B`` steps without blocking, the stale global average blended
  into the local parameters ``S`` steps later; ``B`` adapts to the loss.

:func:`profile_model` measures what the block planner (``planner.buckets``)
needs: when each parameter's gradient becomes ready in backward, and each
layer's forward time.  :class:`Profile` lives here, with no torch import at
module level, so the planner can read profiles without importing torch and the
runtime never imports the planner.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.communicator import Communicator, PlanSource, load_plan_source
from runtime.errors import CommunicatorError
from runtime.executor import (
    COPY,
    RECV,
    RECV_REDUCE,
    REDUCE,
    SEND,
    Program,
    block_elements,
    message_tag_space,
    pair_pieces,
    resolve_dtype,
)
from runtime.plan import Plan
from runtime.schedule import read_json_document

if TYPE_CHECKING:
    import torch

__all__ = [
    "DASO",
    "BlockScheduler",
    "ParamProfile",
    "Profile",
    "TopoccHookState",
    "TorchReplay",
    "load_block_plan",
    "profile_model",
    "topocc_allreduce_hook",
]

#: One piece of a block: (parameter index in ``model.parameters()`` order, first byte, end byte).
Piece = tuple[int, int, int]


# --------------------------------------------------------------------------- profile


@dataclass(frozen=True, slots=True)
class ParamProfile:
    """One parameter: its size and when its gradient is ready, in seconds after backward starts."""

    name: str
    layer: int
    nbytes: int
    ready_time_s: float
    itemsize: int = 4


@dataclass(frozen=True, slots=True)
class Profile:
    """One training iteration as the block planner sees it (parameters and layers in forward order).

    ``forward_time_s[l]`` is layer ``l``'s forward compute time (including the
    parameter-free modules that follow it); ``backward_time_s`` the length of the
    backward pass, at least the last ready time.
    """

    params: tuple[ParamProfile, ...]
    layers: tuple[str, ...]
    forward_time_s: tuple[float, ...]
    backward_time_s: float
    name: str = "profile"

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def forward_total_s(self) -> float:
        return float(sum(self.forward_time_s))


def _owners(model: torch.nn.Module) -> tuple[list[str], list[torch.nn.Module], list[int]]:
    """Modules owning parameters directly (in order of first parameter) and each parameter's owner index."""
    owner_of: dict[int, tuple[str, torch.nn.Module]] = {}
    for mname, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner_of.setdefault(id(p), (mname, module))
    names: list[str] = []
    modules: list[torch.nn.Module] = []
    layer_of: list[int] = []
    for p in model.parameters():
        mname, module = owner_of[id(p)]
        if not modules or modules[-1] is not module:
            if any(m is module for m in modules):
                layer_of.append(next(i for i, m in enumerate(modules) if m is module))
                continue
            names.append(mname or "<root>")
            modules.append(module)
        layer_of.append(len(modules) - 1)
    return names, modules, layer_of


def profile_model(model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], batch: tuple[Any, Any], *,
                  repeats: int = 5, warmup: int = 2) -> Profile:
    """Measure per-parameter gradient ready times and per-layer forward times (median of ``repeats`` runs).

    Ready times come from ``Tensor.register_post_accumulate_grad_hook``, relative
    to the moment ``backward()`` is called; forward times from forward pre-hooks
    on the modules that own parameters (a layer's time runs until the next such
    module starts, so activations are charged to the layer before them).
    Gradients are zeroed afterwards; the model is otherwise unchanged.

    >>> prof = profile_model(mlp, nn.functional.mse_loss, (x, y))   # doctest: +SKIP
    """

    if repeats < 1:
        raise CommunicatorError(f"repeats must be at least 1, got {repeats}")
    params = list(model.parameters())
    names, modules, layer_of = _owners(model)
    pnames = [n for n, _ in model.named_parameters()]
    ready = np.zeros((repeats, len(params)))
    fwd = np.zeros((repeats, len(modules)))
    bwd = np.zeros(repeats)
    marks: list[float] = []
    stamp: list[float] = [0.0]
    current: list[int] = [-1]

    def on_ready(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if current[0] >= 0:
                ready[current[0], i] = time.perf_counter() - stamp[0]
        return hook

    def on_forward(_: torch.nn.Module, __: Any) -> None:
        marks.append(time.perf_counter())

    handles = [p.register_post_accumulate_grad_hook(on_ready(i)) for i, p in enumerate(params)]
    handles += [m.register_forward_pre_hook(on_forward) for m in modules]
    x, y = batch
    try:
        for r in range(-warmup, repeats):
            current[0] = r
            model.zero_grad(set_to_none=True)
            marks.clear()
            start = time.perf_counter()
            loss = loss_fn(model(x), y)
            end = time.perf_counter()
            stamp[0] = time.perf_counter()
            loss.backward()
            done = time.perf_counter() - stamp[0]
            if r >= 0 and len(marks) == len(modules):
                edges = [*marks, end]
                fwd[r] = np.diff(edges)
                fwd[r, 0] += marks[0] - start
                bwd[r] = done
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
        current[0] = -1
    med_ready = np.median(ready, axis=0)
    entries = tuple(
        ParamProfile(pnames[i], layer_of[i], p.numel() * p.element_size(), float(med_ready[i]), p.element_size())
        for i, p in enumerate(params)
    )
    backward = max(float(np.median(bwd)), max((e.ready_time_s for e in entries), default=0.0))
    return Profile(entries, tuple(names), tuple(float(v) for v in np.median(fwd, axis=0)), backward,
                   name=type(model).__name__)


# --------------------------------------------------------------------------- replay over torch.distributed


class TorchReplay:
    """Replays an allreduce schedule on torch tensors with torch.distributed point-to-point (NCCL or gloo).

    The executor's :class:`~runtime.executor.Program` supplies the indices
    (which element ranges each operation reads and writes, dependencies); this
    class only moves and adds tensors, so it works on CUDA memory where the
    numpy executor cannot.  Operations run as their dependencies complete:
    ready sends and receives are posted together with ``dist.batch_isend_irecv``
    (one NCCL group), waiter threads report each completion, and local copies
    and reductions follow in dependency order.

    NCCL runs a rank's groups one after another on its stream, so on CUDA a
    schedule whose ranks post matching operations in different groups can
    stall (gloo has no such limit); the ``timeout`` turns a stall into a
    :class:`CommunicatorError`.
    """

    def __init__(self, plan: Plan, rank: int, group: Any = None, timeout: float = 60.0) -> None:
        import torch.distributed as dist

        if plan.collective != "allreduce":
            raise CommunicatorError(f"TorchReplay replays allreduce plans, got {plan.collective}")
        self.plan = plan
        self.rank = rank
        self.group = group
        self.timeout = timeout
        self._dist = dist
        self._programs: dict[tuple[int, str, int], Program] = {}
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="topocc-p2p")
        self._peers = [dist.get_global_rank(group, r) if group is not None else r for r in range(plan.ranks)]

    def _program(self, tensor: torch.Tensor) -> Program:
        dtype = resolve_dtype(str(tensor.dtype).replace("torch.", ""))
        schedule = self.plan.select(tensor.numel() * tensor.element_size())
        block = block_elements(schedule, tensor.numel(), tensor.numel())
        key = (id(schedule), dtype.str, block)
        program = self._programs.get(key)
        if program is None:
            program = Program(schedule, self.rank, dtype, block, tag_ub=(1 << 20) - 1,
                              channels=message_tag_space(schedule))
            self._programs[key] = program
        return program

    def allreduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` (1-D, contiguous) over the group's ranks, in place; returns it."""
        import torch

        dist = self._dist
        program = self._program(tensor)
        buffers: dict[str, torch.Tensor] = {"o": tensor}
        if not program.schedule.inplace:
            buffers["i"] = tensor.clone()
        buffers["s"] = torch.empty(len(program.scratch), dtype=tensor.dtype, device=tensor.device)
        staging = {k: torch.empty(len(v), dtype=tensor.dtype, device=tensor.device)
                   for k, v in program.staging.items()}

        def view(p: tuple[str, int, int]) -> torch.Tensor:
            return buffers[p[0]][p[1]:p[1] + p[2]]

        def msg(k: int) -> torch.Tensor:
            if k in staging:
                return staging[k]
            pieces = program.src_pieces[k] if program.kinds[k] == SEND else program.dst_pieces[k]
            return view(pieces[0]) if pieces else tensor[:0]

        remaining = program.ndeps.copy()
        ready = program.roots.copy()
        finished: queue.Queue[tuple[int, BaseException | None]] = queue.Queue()
        active = 0
        done = 0
        deadline = time.monotonic() + self.timeout

        def finish(k: int) -> None:
            nonlocal done
            done += 1
            for s in program.succ[k]:
                remaining[s] -= 1
                if not remaining[s]:
                    ready.append(s)

        while True:
            ops = []
            posted = []
            while ready:
                k = ready.pop()
                kind = program.kinds[k]
                if kind == COPY:
                    for s, d in pair_pieces(program.src_pieces[k], program.dst_pieces[k]):
                        view(d).copy_(view(s))
                    finish(k)
                elif kind == REDUCE:
                    for s, d in pair_pieces(program.src_pieces[k], program.dst_pieces[k]):
                        view(d).add_(view(s))
                    finish(k)
                else:
                    buf = msg(k)
                    peer = self._peers[program.peers[k]]  # type: ignore[index]
                    if kind == SEND:
                        if k in staging:
                            staged = [("@", 0, program.msg_len[k])]
                            for a, b in pair_pieces(program.src_pieces[k], staged):
                                buf[b[1]:b[1] + b[2]].copy_(view(a))
                        ops.append(dist.P2POp(dist.isend, buf, peer, self.group, program.tags[k]))
                    else:
                        ops.append(dist.P2POp(dist.irecv, buf, peer, self.group, program.tags[k]))
                    posted.append(k)
            if ops:
                # posted as one group (one NCCL kernel); each completion is reported by a waiter thread, since
                # gloo's point-to-point works only learn they are complete inside wait()
                for k, w in zip(posted, dist.batch_isend_irecv(ops)):
                    self._pool.submit(self._watch, k, w, finished)
                active += len(posted)
            if done == program.n:
                break
            if not active:
                raise CommunicatorError("the schedule cannot progress: no operation is ready",
                                        where=f"rank {self.rank}: allreduce over torch.distributed")
            try:
                k, error = finished.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise CommunicatorError(f"timed out after {self.timeout:g} s with {active} messages pending",
                                        where=f"rank {self.rank}: allreduce over torch.distributed") from None
            if error is not None:
                raise CommunicatorError(f"a message failed: {error}",
                                        where=f"rank {self.rank}: allreduce over torch.distributed")
            active -= 1
            self._complete(program, k, view, staging)
            finish(k)
        return tensor

    @staticmethod
    def _watch(k: int, work: Any, finished: queue.Queue[tuple[int, BaseException | None]]) -> None:
        try:
            work.wait()
            finished.put((k, None))
        except BaseException as exc:  # reported to the replaying thread
            finished.put((k, exc))

    @staticmethod
    def _complete(program: Program, k: int, view: Callable[[Any], Any], staging: Mapping[int, Any]) -> None:
        """After a receive: unpack a staged message, or add a received operand."""
        import torch

        kind = program.kinds[k]
        if kind == RECV and k in staging:
            staged = [("@", 0, program.msg_len[k])]
            for a, b in pair_pieces(program.dst_pieces[k], staged):
                view(a).copy_(staging[k][b[1]:b[1] + b[2]])
        elif kind == RECV_REDUCE:
            staged = [("@", 0, program.msg_len[k])]
            left = program.src_pieces[k] or program.dst_pieces[k]
            for d, a, s in pair_pieces(program.dst_pieces[k], left, staged):
                torch.add(view(a), staging[k][s[1]:s[1] + s[2]], out=view(d))


# --------------------------------------------------------------------------- DDP communication hook


class TopoccHookState:
    """State for :func:`topocc_allreduce_hook`: the plan, and how to move data on each device.

    Parameters
    ----------
    plan_or_path:
        A plan or schedule file, a :class:`~runtime.plan.Plan` or a schedule
        (anything :class:`~runtime.communicator.Communicator` accepts).
    mpi_comm:
        The mpi4py communicator for CPU buckets (default ``COMM_WORLD``); its
        rank order must be the process group's.
    process_group:
        The torch.distributed group for CUDA buckets (default: the default group).
    timeout:
        Seconds a collective may wait for peers.
    transport:
        A ready :class:`~runtime.transports.Transport` for CPU buckets instead of MPI.

    Construction is collective over the CPU communicator (a handshake checks
    that every rank loaded the same plan), so build it on every rank.

    >>> state = TopoccHookState("plan.json")                         # doctest: +SKIP
    >>> ddp.register_comm_hook(state, topocc_allreduce_hook)          # doctest: +SKIP
    """

    def __init__(self, plan_or_path: PlanSource, *, mpi_comm: Any = None, process_group: Any = None,
                 timeout: float = 60.0, transport: Any = None, cpu: bool = True) -> None:
        self.plan = load_plan_source(plan_or_path)
        if self.plan.collective != "allreduce":
            raise CommunicatorError(f"the DDP hook needs an allreduce plan, got {self.plan.collective}")
        self.timeout = timeout
        self.process_group = process_group
        self.comm = Communicator(self.plan, mpi_comm, timeout=timeout, transport=transport) if cpu else None
        self._replay: TorchReplay | None = None
        self.calls = 0
        self.bytes = 0

    @property
    def world_size(self) -> int:
        return self.plan.ranks

    def allreduce_avg_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average a contiguous tensor over all ranks in place (DDP's semantics: sum, then divide by size)."""
        flat = tensor.view(-1)
        self.calls += 1
        self.bytes += flat.numel() * flat.element_size()
        if flat.is_cuda:
            if self._replay is None:
                import torch.distributed as dist

                group = self.process_group
                rank = dist.get_rank(group) if group is not None else dist.get_rank()
                self._replay = TorchReplay(self.plan, rank, group, self.timeout)
            self._replay.allreduce_(flat)
            flat.div_(self.world_size)
            return tensor
        if self.comm is None:
            raise CommunicatorError("this hook state was built with cpu=False but got a CPU bucket")
        self.comm.allreduce(flat.detach().numpy(), op="avg")
        return tensor

    def close(self) -> None:
        """Release the communicator (collective)."""
        if self.comm is not None:
            self.comm.close()


def topocc_allreduce_hook(state: TopoccHookState, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: average the bucket with the compiled plan; returns a completed future.

    ``bucket`` is a ``torch.distributed.GradBucket``; the result a
    ``torch.futures.Future[torch.Tensor]``.  Neither is annotated because DDP's
    ``register_comm_hook`` compares the annotations with the real classes, and
    this module defers annotations (torch is imported lazily).

    The plan's schedule is chosen by the bucket's byte size.  The allreduce runs
    synchronously inside the hook (DDP calls hooks as buckets fill during
    backward, so later buckets still overlap with the rest of backward).
    """
    import torch

    tensor = bucket.buffer()
    state.allreduce_avg_(tensor)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(tensor)
    return fut


# --------------------------------------------------------------------------- Prophet block scheduling


def load_block_plan(source: str | Path | Mapping[str, Any]) -> list[list[Piece]]:
    """The blocks of a bucket plan (``planner.buckets.bucket_plan_to_dict`` JSON) in planned order.

    Each block is a list of ``(parameter index, first byte, end byte)`` pieces.
    """
    doc = read_json_document(source, "bucket plan") if isinstance(source, (str, Path)) else source
    if not isinstance(doc, Mapping) or doc.get("format") != "topocc-bucket-plan":
        raise CommunicatorError("not a topocc bucket plan", where=str(source)[:80])
    try:
        return [[(int(p[0]), int(p[1]), int(p[2])) for p in b["pieces"]] for b in doc["blocks"]]
    except (KeyError, TypeError, ValueError, IndexError):
        raise CommunicatorError("malformed bucket plan: blocks need pieces [param, start, stop]",
                                where=str(source)[:80]) from None


class BlockScheduler:
    """Runs a Prophet block plan (Bao et al. 2020): blocks launched when ready, sent in planned order.

    Parameters
    ----------
    model:
        The (unwrapped) model; parameter indices are ``model.parameters()`` order.
    blocks:
        Blocks in planned order, each a list of ``(param, first byte, end byte)``
        pieces (:func:`load_block_plan`); together they must cover every
        parameter's bytes exactly once.
    comm:
        A :class:`~runtime.communicator.Communicator` (or plan source) for the allreduces.
    make_optimizer:
        Builds one optimizer over a list of parameters; one is made per layer
        (module owning parameters), so each layer can step on its own.
    overlap_forward:
        If true (Prophet), :meth:`step` returns at once and each layer's update
        is applied in the next forward pass, just before the layer runs, after
        waiting only for its own blocks.  If false, :meth:`step` waits for
        every block, then updates (what DDP does).

    A background thread sends the ready block that comes first in the plan, so
    a high-priority block never waits behind a lower-priority one that is not
    yet on the wire; large low-priority blocks are split into chunks by the
    planner, so one in flight delays a high-priority one by at most a chunk.

    >>> sched = BlockScheduler(model, load_block_plan("b.json"), comm, lambda ps: SGD(ps, lr=0.1))  # doctest: +SKIP
    >>> loss_fn(model(x), y).backward(); sched.step()                                                   # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, blocks: Sequence[Sequence[Piece]], comm: Communicator | PlanSource,
                 make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], *,
                 overlap_forward: bool = True, timeout: float = 60.0) -> None:
        import torch

        self.comm = comm if isinstance(comm, Communicator) else Communicator(comm, timeout=timeout)
        self.params = list(model.parameters())
        self.overlap_forward = overlap_forward
        self.timeout = timeout
        names, modules, layer_of = _owners(model)
        self._check_cover(blocks)
        self.blocks: list[list[tuple[int, int, int]]] = []  # (param, first element, end element)
        self._buffers: list[torch.Tensor] = []
        for b in blocks:
            pieces = []
            for i, lo, hi in b:
                size = self.params[i].element_size()
                if lo % size or hi % size:
                    raise CommunicatorError(f"block piece ({i}, {lo}, {hi}) is not aligned to {size}-byte elements")
                pieces.append((i, lo // size, hi // size))
            self.blocks.append(pieces)
            dtype = self.params[b[0][0]].dtype
            self._buffers.append(torch.empty(sum(hi - lo for _, lo, hi in pieces), dtype=dtype))
        self._block_params = [sorted({i for i, _, _ in b}) for b in self.blocks]
        self._param_blocks: list[list[int]] = [[] for _ in self.params]
        for j, ps in enumerate(self._block_params):
            for i in ps:
                self._param_blocks[i].append(j)
        self._missing = [len(ps) for ps in self._block_params]
        self._param_left = [len(bs) for bs in self._param_blocks]
        self._layer_params = [[i for i, layer in enumerate(layer_of) if layer == m] for m in range(len(modules))]
        self._optimizers = [make_optimizer([self.params[i] for i in ps]) for ps in self._layer_params]
        self._pending_step = [False] * len(modules)
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int]] = []
        self.iteration = 0
        self._outstanding = 0
        self._error: BaseException | None = None
        self._stop = False
        self.sent: list[tuple[int, int]] = []  # (iteration, block) in the order sent, for tests and reports
        self._handles = [p.register_post_accumulate_grad_hook(self._grad_ready(i)) for i, p in enumerate(self.params)]
        self._handles += [m.register_forward_pre_hook(self._before_layer(k)) for k, m in enumerate(modules)]
        self._layer_names = names
        self._thread = threading.Thread(target=self._serve, name="topocc-blocks", daemon=True)
        self._thread.start()

    def _check_cover(self, blocks: Sequence[Sequence[Piece]]) -> None:
        """Every parameter's bytes covered exactly once, by pieces of one dtype per block."""
        spans: dict[int, list[tuple[int, int]]] = {}
        for j, b in enumerate(blocks):
            if not b:
                raise CommunicatorError(f"block {j} is empty")
            if len({self.params[i].dtype for i, _, _ in b if 0 <= i < len(self.params)}) > 1:
                raise CommunicatorError(f"block {j} mixes parameter dtypes")
            for i, lo, hi in b:
                if not 0 <= i < len(self.params):
                    raise CommunicatorError(f"block {j} names parameter {i}; the model has {len(self.params)}")
                spans.setdefault(i, []).append((lo, hi))
        for i, p in enumerate(self.params):
            got = sorted(spans.get(i, []))
            end = 0
            for lo, hi in got:
                if lo != end or hi <= lo:
                    break
                end = hi
            if end != p.numel() * p.element_size() or (got and got[0][0] != 0):
                raise CommunicatorError(f"the block plan does not cover parameter {i} ({p.numel() * p.element_size()} "
                                        "bytes) exactly once", fix="re-plan for this model (plan_buckets)")

    # hooks -----------------------------------------------------------------

    def _grad_ready(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            with self._cond:
                for j in self._param_blocks[i]:
                    self._missing[j] -= 1
                    if self._missing[j] == 0:
                        heapq.heappush(self._queue, (j, self.iteration))
                        self._outstanding += 1
                        self._cond.notify_all()
        return hook

    def _before_layer(self, k: int) -> Callable[[torch.nn.Module, Any], None]:
        def hook(_: torch.nn.Module, __: Any) -> None:
            if self._pending_step[k]:
                self._wait(lambda: all(self._param_left[i] == 0 for i in self._layer_params[k]))
                self._apply(k)
        return hook

    def _apply(self, k: int) -> None:
        self._pending_step[k] = False
        self._optimizers[k].step()
        self._optimizers[k].zero_grad(set_to_none=True)
        with self._cond:
            for i in self._layer_params[k]:
                self._param_left[i] = len(self._param_blocks[i])

    def _wait(self, predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while not predicate():
                if self._error is not None:
                    raise CommunicatorError(f"the block communication thread failed: {self._error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommunicatorError(f"blocks not reduced within {self.timeout:g} s",
                                            fix="every rank must run the same block plan")
                self._cond.wait(left)

    # communication thread --------------------------------------------------

    def _serve(self) -> None:
        import torch

        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                j, iteration = heapq.heappop(self._queue)
            try:
                buf = self._buffers[j]
                at = 0
                with torch.no_grad():
                    for i, lo, hi in self.blocks[j]:
                        buf[at:at + hi - lo].copy_(self.params[i].grad.view(-1)[lo:hi])  # type: ignore[union-attr]
                        at += hi - lo
                    self.comm.allreduce(buf.numpy(), op="avg")
                    at = 0
                    for i, lo, hi in self.blocks[j]:
                        self.params[i].grad.view(-1)[lo:hi].copy_(buf[at:at + hi - lo])  # type: ignore[union-attr]
                        at += hi - lo
            except BaseException as exc:  # handed to the training thread, which raises it
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self.sent.append((iteration, j))
                self._missing[j] = len(self._block_params[j])
                self._outstanding -= 1
                for i in self._block_params[j]:
                    self._param_left[i] -= 1
                self._cond.notify_all()

    # public ------------------------------------------------------------------

    def step(self) -> None:
        """After ``backward()``: update now (``overlap_forward=False``) or layer by layer in the next forward."""
        self.iteration += 1
        self._pending_step = [True] * len(self._optimizers)
        if not self.overlap_forward:
            self.synchronize()

    def synchronize(self) -> None:
        """Wait for the blocks of every pending update and apply it (call before evaluating or saving the model)."""
        pending = [k for k, flag in enumerate(self._pending_step) if flag]
        self._wait(lambda: self._outstanding == 0 and all(
            self._param_left[i] == 0 for k in pending for i in self._layer_params[k]))
        for k in pending:
            self._apply(k)

    def close(self) -> None:
        """Stop the communication thread and remove the hooks (the communicator stays open)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(self.timeout)
        for h in self._handles:
            h.remove()


# --------------------------------------------------------------------------- DASO


class DASO:
    """DASO (Coquelin et al. 2022): node-local averaging every step, stale global averaging every ``B`` steps.

    Each step, :meth:`step` averages gradients inside the node (blocking; the
    fast fabric) and runs the local optimizer.  Every ``B``-th step it starts a
    non-blocking allreduce of the parameters over all ranks (the compiled
    global plan; inside a node parameters are equal, so the all-rank average is
    the average over nodes) and carries on; ``S`` steps later it blends the
    result into the local parameters as DASO does (Heat's
    ``_gs_rcv_update_params``): ``p <- (2 S p_local + P p_global) / (2 S + P)``
    for ``P`` nodes, so the stale average pulls the nodes together without
    discarding the ``S`` local steps taken since.

    ``B`` adapts: ``warmup_steps`` of blocking global averaging every step, then
    ``B = max_skip``; every ``window`` steps the mean loss is compared with the
    previous window's: a plateau (relative gain below ``stability``) halves
    ``B`` (global syncs become frequent), steady progress doubles it (up to
    ``max_skip``).  ``S = max(1, B // 4)`` as in DASO's ``batches_to_wait``.

    Parameters
    ----------
    model, optimizer:
        The local model and its optimizer (the same on every rank).
    global_plan:
        Plan or schedule for an allreduce over all ranks.
    group_size:
        Ranks per node; nodes are consecutive rank ranges.
    local_plan:
        Plan for an allreduce over one node's ranks; without one, the node's
        gradients are averaged with MPI's own allreduce on the node communicator.
    adapt:
        False keeps ``B = max_skip`` after warm-up (for tests and ablations).

    >>> daso = DASO(model, opt, "plan4.json", group_size=2, local_plan="plan2.json")   # doctest: +SKIP
    >>> loss.backward(); daso.step(loss.item())                                        # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, global_plan: PlanSource, *,
                 group_size: int, local_plan: PlanSource | None = None, mpi_comm: Any = None,
                 warmup_steps: int = 4, max_skip: int = 8, window: int = 8, stability: float = 0.05,
                 adapt: bool = True, timeout: float = 60.0) -> None:
        import torch
        from mpi4py import MPI

        base = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        size, rank = base.Get_size(), base.Get_rank()
        if group_size < 1 or size % group_size:
            raise CommunicatorError(f"group_size {group_size} does not divide the {size} ranks into nodes")
        if max_skip < 1 or window < 1 or warmup_steps < 0:
            raise CommunicatorError("max_skip and window must be at least 1 and warmup_steps at least 0")
        self.model = model
        self.optimizer = optimizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.nodes = size // group_size
        self.rank = rank
        self.global_comm = Communicator(global_plan, base, timeout=timeout)
        self._node_mpi = base.Split(rank // group_size, rank)
        self._ctl = base.Dup()
        self.local_comm = Communicator(local_plan, self._node_mpi, timeout=timeout) if local_plan is not None else None
        self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        numel = sum(p.numel() for p in self.params)
        self._grads = torch.zeros(numel, dtype=self.params[0].dtype)
        self._sending = torch.zeros(numel, dtype=self.params[0].dtype)
        self.warmup_steps = warmup_steps
        self.max_skip = max_skip
        self.window = window
        self.stability = stability
        self.adapt = adapt
        self.step_count = 0
        self.skip = 1 if warmup_steps else max_skip
        self._next_sync = 0
        self._inflight: tuple[int, int, threading.Thread | None] | None = None  # (sent step, apply step, thread)
        self._losses: list[float] = []
        self._previous: float | None = None
        self.sync_steps: list[int] = []      # steps at which a global average was started
        self.applied: list[tuple[int, int]] = []  # (sent step, applied step)
        self.skip_history: list[tuple[int, int]] = [(0, self.skip)]

    # helpers ------------------------------------------------------------------

    def _flat_params(self, out: torch.Tensor) -> None:
        at = 0
        for p in self.params:
            out[at:at + p.numel()].copy_(p.detach().view(-1))
            at += p.numel()

    def _average_local_grads(self) -> None:
        import torch

        at = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                self._grads[at:at + n].zero_()
            else:
                self._grads[at:at + n].copy_(p.grad.view(-1))
            at += n
        buf = self._grads.numpy()
        if self.local_comm is not None:
            self.local_comm.allreduce(buf, op="avg")
        elif self._node_mpi.Get_size() > 1:
            from mpi4py import MPI

            self._node_mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            buf /= self._node_mpi.Get_size()
        at = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.view(-1).copy_(self._grads[at:at + n])
                at += n

    def _blend(self, sent: int) -> None:
        """Merge the global average of the parameters sent at step ``sent`` (DASO's weighted merge)."""
        import torch

        stale = self.step_count - sent
        avg = self._sending
        at = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                g = avg[at:at + n].view_as(p)
                if stale <= 0:
                    p.copy_(g)
                else:
                    w = 2.0 * stale
                    p.mul_(w / (w + self.nodes)).add_(g, alpha=self.nodes / (w + self.nodes))
                at += n

    def _start_global(self) -> None:
        self._flat_params(self._sending)
        stale = 0 if self.step_count < self.warmup_steps or self.skip == 1 else max(1, self.skip // 4)
        buf = self._sending.numpy()
        thread = None
        if stale and self.threaded:
            thread = threading.Thread(target=self.global_comm.allreduce, args=(buf, "avg"), daemon=True)
            thread.start()
        elif not stale:
            self.global_comm.allreduce(buf, op="avg")
        self.sync_steps.append(self.step_count)
        self._inflight = (self.step_count, self.step_count + stale, thread)

    def _finish_global(self) -> None:
        assert self._inflight is not None
        sent, _, thread = self._inflight
        if thread is not None:
            thread.join(self.global_comm.timeout)
            if thread.is_alive():
                raise CommunicatorError(f"the global average started at step {sent} did not finish in time")
        elif self.step_count != sent:  # no MPI_THREAD_MULTIPLE: the allreduce runs now, same semantics
            self.global_comm.allreduce(self._sending.numpy(), op="avg")
        self._blend(sent)
        self.applied.append((sent, self.step_count))
        self._inflight = None

    def _adapt(self, loss: float | None) -> None:
        if loss is None:
            return
        self._losses.append(loss)
        if len(self._losses) < self.window:
            return
        # every rank must take the same decision: agree on the mean loss over all ranks (one scalar per window)
        mean = self._ctl.allreduce(sum(self._losses) / len(self._losses)) / self._ctl.Get_size()
        self._losses = []
        previous, self._previous = self._previous, mean
        if previous is None or not self.adapt or self.step_count < self.warmup_steps:
            return
        gain = (previous - mean) / max(abs(previous), 1e-12)
        new = max(1, self.skip // 2) if gain < self.stability else min(self.max_skip, self.skip * 2)
        if new != self.skip:
            self.skip = new
            self.skip_history.append((self.step_count, new))

    # public ---------------------------------------------------------------------

    def step(self, loss: float | None = None) -> None:
        """After ``backward()``: node-average gradients, step, and start/apply global averages on schedule.

        ``loss`` (this rank's loss) drives the adaptation of ``B``; every
        ``window`` steps the ranks agree on the mean (one scalar allreduce), so
        they all take the same decision.  Pass it on every rank or on none.
        """
        self._average_local_grads()
        self.optimizer.step()
        self.step_count += 1
        if self.step_count == self.warmup_steps:
            self.skip = self.max_skip
            self.skip_history.append((self.step_count, self.skip))
            self._next_sync = self.step_count
        if self._inflight is not None and self.step_count >= self._inflight[1]:
            self._finish_global()
        if self.step_count >= self._next_sync and self._inflight is None:
            self._start_global()
            self._next_sync = self.step_count + self.skip
            if self._inflight is not None and self._inflight[1] == self.step_count:
                self._finish_global()
        self._adapt(loss)

    def finish(self) -> None:
        """Complete any global average in flight, then average parameters exactly once more (blocking)."""
        if self._inflight is not None:
            self._finish_global()
        self._flat_params(self._sending)
        self.global_comm.allreduce(self._sending.numpy(), op="avg")
        self._blend(self.step_count)

    def close(self) -> None:
        """Release the communicators (collective)."""
        if self._inflight is not None and self._inflight[2] is not None:
            self._inflight[2].join(self.global_comm.timeout)
        self.global_comm.close()
        if self.local_comm is not None:
            self.local_comm.close()
        self._node_mpi.Free()
        self._ctl.Free()
