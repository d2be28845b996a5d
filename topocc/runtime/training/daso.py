"""DASO (Coquelin et al., "Accelerating neural network training with distributed asynchronous and selective
optimization", J. Big Data 2022): gradients averaged inside each node every step, parameters averaged across
nodes every ``B`` steps without blocking, the stale global average blended in ``S`` steps later.
"""

from __future__ import annotations

import struct
import threading
from typing import TYPE_CHECKING, Any

from topocc.runtime.communicator import Communicator, PlanSource
from topocc.runtime.errors import CommunicatorError

if TYPE_CHECKING:
    import torch

__all__ = ["DASO"]


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
        Plan or schedule for an allreduce over all ranks, replayed over MPI; or a
        :class:`~topocc.runtime.communicator.Communicator` over all ranks on any transport
        (``NCCLTransport`` for a CUDA model: the global average then runs on NCCL's
        stream while the next local steps compute, and nothing here touches MPI).
    group_size:
        Ranks per node; nodes are consecutive rank ranges.
    local_plan:
        Plan for an allreduce over one node's ranks; without one, the node's
        gradients are averaged with MPI's own allreduce on the node communicator.
        With a global communicator, a communicator over this rank's node (needed where
        nodes have more than one rank).
    adapt:
        False keeps ``B = max_skip`` after warm-up (for tests and ablations).

    >>> daso = DASO(model, opt, "plan4.json", group_size=2, local_plan="plan2.json")   # doctest: +SKIP
    >>> loss.backward(); daso.step(loss.item())                                        # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 global_plan: PlanSource | Communicator, *, group_size: int,
                 local_plan: PlanSource | Communicator | None = None, mpi_comm: Any = None,
                 warmup_steps: int = 4, max_skip: int = 8, window: int = 8, stability: float = 0.05,
                 adapt: bool = True, timeout: float = 60.0) -> None:
        import torch  # torch is optional: loaded by the code that trains

        if isinstance(global_plan, Communicator):
            size, rank = global_plan.size, global_plan.rank
        else:
            from mpi4py import MPI  # importing mpi4py starts MPI: only where MPI is used

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
        self._node_mpi: Any = None
        self._ctl: Any = None
        if isinstance(global_plan, Communicator):
            if group_size > 1 and not isinstance(local_plan, Communicator):
                raise CommunicatorError("with a global communicator, DASO needs one over the node's ranks too",
                                        fix="pass local_plan=Communicator(node plan, transport=...)")
            if isinstance(local_plan, Communicator) and local_plan.size != group_size:
                raise CommunicatorError(f"the node communicator has {local_plan.size} ranks; group_size is "
                                        f"{group_size}")
            self.global_comm = global_plan
            # a Communicator whenever group_size > 1 (checked above)
            self.local_comm = local_plan if group_size > 1 and isinstance(local_plan, Communicator) else None
            self.threaded = False  # a stream-ordered global average needs no thread; a host one runs when due
        else:
            if isinstance(local_plan, Communicator):
                raise CommunicatorError("with a global plan, DASO makes the node's communicator itself",
                                        fix="pass local_plan as a plan, or global_plan as a Communicator too")
            from mpi4py import MPI  # importing mpi4py starts MPI: only where MPI is used

            self.global_comm = Communicator(global_plan, base, timeout=timeout)
            self._node_mpi = base.Split(rank // group_size, rank)
            self._ctl = base.Dup()
            self.local_comm = (Communicator(local_plan, self._node_mpi, timeout=timeout)
                               if local_plan is not None else None)
            self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._tensors = self.global_comm.ops.name == "torch"
        self._work: Any = None  # the global average in flight on a stream (NCCL)
        numel = sum(p.numel() for p in self.params)
        self._grads = torch.zeros(numel, dtype=self.params[0].dtype, device=self.params[0].device)
        self._sending = torch.zeros(numel, dtype=self.params[0].dtype, device=self.params[0].device)
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
        import torch  # torch is optional: loaded by the code that trains

        at = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                self._grads[at:at + n].zero_()
            else:
                self._grads[at:at + n].copy_(p.grad.view(-1))
            at += n
        if self.local_comm is not None:
            self.local_comm.allreduce(self._array(self._grads), op="avg")
        elif self._node_mpi is not None and self._node_mpi.Get_size() > 1:
            from mpi4py import MPI  # importing mpi4py starts MPI: only where MPI is used

            buf = self._grads.numpy()
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

    def _array(self, t: torch.Tensor) -> Any:
        """What the communicators take: the tensor itself (torch transports) or its numpy view (MPI)."""
        return t if self._tensors else t.numpy()

    def _blend(self, sent: int) -> None:
        """Merge the global average of the parameters sent at step ``sent`` (DASO's weighted merge)."""
        import torch  # torch is optional: loaded by the code that trains

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
        buf = self._array(self._sending)
        thread = None
        if stale and self.global_comm.grouped:  # enqueued on NCCL's stream; the local steps go on meanwhile
            self._work = self.global_comm.allreduce(buf, op="avg", async_op=True)
        elif stale and self.threaded:
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
        elif self._work is not None:
            self._work.wait()  # the current stream (the blend) waits for the average
            self._work = None
        elif self.step_count != sent:  # no MPI_THREAD_MULTIPLE: the allreduce runs now, same semantics
            self.global_comm.allreduce(self._array(self._sending), op="avg")
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
        mean = self._agree(sum(self._losses) / len(self._losses))
        self._losses = []
        previous, self._previous = self._previous, mean
        if previous is None or not self.adapt or self.step_count < self.warmup_steps:
            return
        gain = (previous - mean) / max(abs(previous), 1e-12)
        new = max(1, self.skip // 2) if gain < self.stability else min(self.max_skip, self.skip * 2)
        if new != self.skip:
            self.skip = new
            self.skip_history.append((self.step_count, new))

    def _agree(self, value: float) -> float:
        """The mean of ``value`` over all ranks, through the control plane (MPI's communicator, or the
        transport's own: a store or gloo), never through NCCL's stream, where it would wait for the global
        average in flight."""
        if self._ctl is not None:
            return float(self._ctl.allreduce(value)) / self._ctl.Get_size()
        bits = struct.unpack("<q", struct.pack("<d", value))[0]
        rows = self.global_comm.transport.allgather_ints([bits], self.global_comm.timeout)
        if rows is None:
            raise CommunicatorError(f"the ranks did not agree on the loss within {self.global_comm.timeout:g} s",
                                    fix="every rank must pass its loss to DASO.step")
        return sum(struct.unpack("<d", struct.pack("<q", row[0]))[0] for row in rows) / len(rows)

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
        self.global_comm.allreduce(self._array(self._sending), op="avg")
        self._blend(self.step_count)

    def close(self) -> None:
        """Release the communicators (collective)."""
        if self._inflight is not None and self._inflight[2] is not None:
            self._inflight[2].join(self.global_comm.timeout)
        self.global_comm.close()
        if self.local_comm is not None:
            self.local_comm.close()
        if self._node_mpi is not None:
            self._node_mpi.Free()
            self._ctl.Free()
