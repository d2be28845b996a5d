"""Prophet block scheduling (Bao et al., "Preemptive all-reduce scheduling for expediting distributed DNN
training", INFOCOM 2020): gradient blocks reduced as soon as they are ready, in planned order.

Per-parameter post-accumulate-grad hooks launch a block once all its gradients
exist; a background thread sends ready blocks in planned order; each layer's
optimizer step waits, in the next forward pass, only for the blocks holding that
layer's parameters, so communication of late layers overlaps the forward pass of
early ones.  The blocks come from ``topocc.planner.gradblocks.block_plan`` (:func:`load_block_plan`).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topocc.runtime.communicator import Communicator, PlanSource
from topocc.runtime.documents import read_json_document
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.training.profile import owners

if TYPE_CHECKING:
    import torch

__all__ = ["BlockScheduler", "Piece", "load_block_plan"]

#: One piece of a block: (parameter index in ``model.parameters()`` order, first byte, end byte).
Piece = tuple[int, int, int]


def load_block_plan(source: str | Path | Mapping[str, Any]) -> list[list[Piece]]:
    """The blocks of a bucket plan (``topocc.planner.gradblocks.block_plan.block_plan_to_dict`` JSON) in planned order.

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
        A :class:`~topocc.runtime.communicator.Communicator` (or plan source, replayed over MPI) for the
        allreduces; for a CUDA model, one on ``NCCLTransport``: the blocks are then reduced on a side
        stream, ordered by CUDA events, and neither thread waits for the GPU.
    make_optimizer:
        Builds one optimizer over a list of parameters; one is made per layer
        (module owning parameters), so each layer can step on its own.
    overlap_forward:
        If true (Prophet), :meth:`step` returns at once and each layer's update
        is applied in the next forward pass, just before the layer runs, after
        waiting only for its own blocks.  If false, :meth:`step` waits for
        every block, then updates (what DDP does).

    A background thread sends the blocks in the plan's order, each as soon as
    it is ready: every rank must start the same collective next, and a rank
    that sent whichever ready block came first in the plan could start another
    than its peers when their gradients arrive in another order (seen under
    load: one rank reducing 300 floats while its peer reduced 16384).  A plan
    lists its blocks in the order its time model sends them, each once ready
    (:func:`topocc.planner.gradblocks.block_plan.plan_blocks`), so this is the order it predicted.

    >>> sched = BlockScheduler(model, load_block_plan("b.json"), comm, lambda ps: SGD(ps, lr=0.1))  # doctest: +SKIP
    >>> loss_fn(model(x), y).backward(); sched.step()                                                   # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, blocks: Sequence[Sequence[Piece]], comm: Communicator | PlanSource,
                 make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], *,
                 overlap_forward: bool = True, timeout: float = 60.0) -> None:
        import torch  # torch is optional: loaded by the code that trains

        self.comm = comm if isinstance(comm, Communicator) else Communicator(comm, timeout=timeout)
        self.params = list(model.parameters())
        self.overlap_forward = overlap_forward
        self.timeout = timeout
        names, modules, layer_of = owners(model)
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
            first = self.params[b[0][0]]
            self._buffers.append(torch.empty(sum(hi - lo for _, lo, hi in pieces), dtype=first.dtype,
                                             device=first.device))
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
        self._queue: list[tuple[int, int]] = []  # (iteration, block) of the ready blocks not yet sent
        self._next = 0  # the block every rank sends next
        self.iteration = 0
        self._outstanding = 0
        self._error: BaseException | None = None
        self._stop = False
        self.sent: list[tuple[int, int]] = []  # (iteration, block) in the order sent, for tests and reports
        self._handles = [p.register_post_accumulate_grad_hook(self._grad_ready(i)) for i, p in enumerate(self.params)]
        self._handles += [m.register_forward_pre_hook(self._before_layer(k)) for k, m in enumerate(modules)]
        self._layer_names = names
        # on CUDA nothing here waits for the GPU: a block's copies and reduction run on a side stream after an
        # event recorded when its last gradient was computed, and a layer's update waits (on the GPU) for an
        # event recorded after its blocks came back, so reductions overlap backward and the next forward
        self._tensors = self.comm.ops.name == "torch"
        self._cuda = self.params[0].is_cuda
        if self._cuda and not self._tensors:
            raise CommunicatorError(f"CUDA gradients reached the {self.comm.transport.name} transport, which "
                                    "replays on the host", fix="build the communicator with NCCLTransport()")
        if self._cuda:
            self._side = torch.cuda.Stream(self.params[0].device)
            self._ready = [torch.cuda.Event() for _ in self.blocks]
            self._done = [torch.cuda.Event() for _ in self.blocks]
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
                                        "bytes) exactly once", fix="re-plan for this model (plan_blocks)")

    # hooks -----------------------------------------------------------------

    def _grad_ready(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            with self._cond:
                for j in self._param_blocks[i]:
                    self._missing[j] -= 1
                    if self._missing[j] == 0:
                        if self._cuda:
                            self._ready[j].record()  # on autograd's stream, after the gradient's kernels
                        heapq.heappush(self._queue, (self.iteration, j))
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
        if self._cuda:
            import torch  # torch is optional: loaded by the code that trains

            stream = torch.cuda.current_stream(self.params[0].device)
            for i in self._layer_params[k]:
                for j in self._param_blocks[i]:
                    stream.wait_event(self._done[j])
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
        import torch  # torch is optional: loaded by the code that trains

        while True:
            with self._cond:
                while not self._stop and not (self._queue and self._queue[0][1] == self._next):
                    self._cond.wait()
                if self._stop:
                    return
                iteration, j = heapq.heappop(self._queue)
            try:
                with torch.no_grad(), self._on_side_stream(j):
                    self._reduce(j)
            except BaseException as exc:  # handed to the training thread, which raises it
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self.sent.append((iteration, j))
                self._next = (j + 1) % len(self.blocks)
                self._missing[j] = len(self._block_params[j])
                self._outstanding -= 1
                for i in self._block_params[j]:
                    self._param_left[i] -= 1
                self._cond.notify_all()

    def _reduce(self, j: int) -> None:
        """Average block ``j``: its gradient pieces joined into its buffer, reduced, and put back."""
        buf = self._buffers[j]
        at = 0
        for i, lo, hi in self.blocks[j]:
            buf[at:at + hi - lo].copy_(self.params[i].grad.view(-1)[lo:hi])  # type: ignore[union-attr]  # block ready
            at += hi - lo
        self.comm.allreduce(buf if self._tensors else buf.numpy(), op="avg")
        at = 0
        for i, lo, hi in self.blocks[j]:
            self.params[i].grad.view(-1)[lo:hi].copy_(buf[at:at + hi - lo])  # type: ignore[union-attr]  # block ready
            at += hi - lo

    @contextlib.contextmanager
    def _on_side_stream(self, j: int) -> Iterator[None]:
        """On CUDA: block ``j``'s work on the side stream, after its gradients, with an event after it."""
        if not self._cuda:
            yield
            return
        import torch  # torch is optional: loaded by the code that trains

        with torch.cuda.stream(self._side):
            self._side.wait_event(self._ready[j])
            yield
            self._done[j].record(self._side)

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
