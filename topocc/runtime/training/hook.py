"""A DistributedDataParallel communication hook that averages each gradient bucket with a compiled plan.

``model.register_comm_hook(TopoccHookState(plan), topocc_allreduce_hook)``:
every DDP bucket is averaged with the plan's schedule for the bucket's byte
size, through one :class:`~topocc.runtime.communicator.Communicator`.  Its transport
decides the device: MPI (the default) averages CPU buckets in place through a
numpy view, with no copy; :class:`~topocc.runtime.transports.nccl.NCCLTransport`
averages CUDA buckets with the lowered replay, enqueued on NCCL's stream with
DDP's stream ordered after it, as DDP's own NCCL allreduce is;
:class:`~topocc.runtime.transports.gloo.GlooTransport` averages CPU tensors over gloo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topocc.runtime.communicator import Communicator
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.plan import PlanSource, as_plan

if TYPE_CHECKING:
    import torch

__all__ = ["TopoccHookState", "topocc_allreduce_hook"]


class TopoccHookState:
    """State for :func:`topocc_allreduce_hook`: the plan and the communicator that replays it.

    Parameters
    ----------
    plan_or_path:
        A plan or schedule file, a :class:`~topocc.runtime.plan.Plan` or a schedule
        (anything :class:`~topocc.runtime.communicator.Communicator` accepts).
    mpi_comm:
        The mpi4py communicator (default ``COMM_WORLD``) when no ``transport`` is given; its rank
        order must be the process group's.
    timeout:
        Seconds a collective may wait for peers.
    transport:
        The communicator's transport: ``NCCLTransport(...)`` for CUDA buckets, ``GlooTransport(...)``
        for CPU tensors over gloo; default MPI on CPU buckets.

    Construction is collective (a handshake checks that every rank loaded the
    same plan), so build it on every rank.

    >>> state = TopoccHookState("plan.json", transport=NCCLTransport())   # doctest: +SKIP
    >>> ddp.register_comm_hook(state, topocc_allreduce_hook)                # doctest: +SKIP
    """

    def __init__(self, plan_or_path: PlanSource, *, mpi_comm: Any = None, timeout: float = 60.0,
                 transport: Any = None) -> None:
        self.plan = as_plan(plan_or_path)
        if self.plan.collective != "allreduce":
            raise CommunicatorError(f"the DDP hook needs an allreduce plan, got {self.plan.collective}")
        self.timeout = timeout
        self.comm = Communicator(self.plan, mpi_comm, timeout=timeout, transport=transport)
        self._tensors = self.comm.ops.name == "torch"  # else numpy: CPU buckets through a numpy view
        self.calls = 0
        self.bytes = 0

    @property
    def world_size(self) -> int:
        return self.plan.ranks

    def _counted(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` flat, counted as one more call of its bytes."""
        flat = tensor.view(-1)
        self.calls += 1
        self.bytes += flat.numel() * flat.element_size()
        return flat

    def allreduce_avg_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average a contiguous tensor over all ranks in place (DDP's semantics: sum, then divide by size).

        On CUDA (NCCL) this only enqueues: the caller's current stream is ordered after the average.
        """
        flat = self._counted(tensor)
        if self._tensors:
            self.comm.allreduce(flat.detach(), op="avg")
        elif flat.is_cuda:
            raise CommunicatorError(f"a CUDA bucket reached the {self.comm.transport.name} transport, which "
                                    "replays on the host", fix="build the hook state with transport=NCCLTransport()")
        else:
            self.comm.allreduce(flat.detach().numpy(), op="avg")
        return tensor

    def average(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Average ``tensor`` in place like :meth:`allreduce_avg_`; a ``torch.futures.Future`` of it.

        On CUDA (NCCL) the future is complete for the host at once and ordered on the GPU (its ``wait()``
        orders the current stream after the average), as ``dist.all_reduce(..., async_op=True).get_future()``:
        the caller's stream is not held, so DDP's backward computes the next buckets while this one is
        reduced.  On the host the future is returned completed.
        """
        import torch  # torch is optional: loaded by the code that trains

        if self._tensors and tensor.is_cuda and self.comm.grouped:
            flat = self._counted(tensor)
            return self.comm.allreduce(flat.detach(), op="avg", async_op=True).get_future(tensor)
        self.allreduce_avg_(tensor)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(tensor)
        return done

    def close(self) -> None:
        """Release the communicator (collective)."""
        self.comm.close()


def topocc_allreduce_hook(state: TopoccHookState, bucket):  # unannotated on purpose: see below
    """DDP communication hook: average the bucket with the compiled plan; returns a completed future.

    ``bucket`` is a ``torch.distributed.GradBucket``; the result a
    ``torch.futures.Future[torch.Tensor]``.  Neither is annotated because DDP's
    ``register_comm_hook`` compares the annotations with the real classes, and
    this module defers annotations (torch is imported lazily).

    The plan's schedule is chosen by the bucket's byte size.  On the host the
    average is computed inside the hook (DDP calls hooks as buckets fill during
    backward, so later buckets still overlap with the rest of backward); on CUDA
    it is enqueued on NCCL's stream and the returned future orders DDP's stream
    after it only where DDP reads the result (:meth:`TopoccHookState.average`).
    """
    return state.average(bucket.buffer())
