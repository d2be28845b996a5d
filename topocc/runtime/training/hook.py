"""A DistributedDataParallel communication hook that averages each gradient bucket with a compiled plan.

``model.register_comm_hook(TopoccHookState(plan), topocc_allreduce_hook)``:
every DDP bucket is averaged with the plan's schedule for the bucket's byte
size, through one :class:`~topocc.runtime.communicator.Communicator`.  Its transport
decides the device: MPI (the default) averages CPU buckets in place through a
numpy view, with no copy; :class:`~topocc.runtime.transports.nccl.NCCLTransport`
averages CUDA buckets with the lowered replay, enqueued on NCCL's stream with
DDP's stream ordered after it, as DDP's own NCCL allreduce is;
:class:`~topocc.runtime.transports.gloo.GlooTransport` averages CPU tensors over gloo.

With an encoded plan (``topocc compile --compress``), ``error_feedback="ef"`` (or the environment variable
``TOPOCC_ERROR_FEEDBACK=ef``) keeps on each rank, per bucket, what the encoded messages dropped and sends it
with the bucket's next gradient (:mod:`topocc.runtime.feedback`; ``step-ahead``, ``error-avg:K`` and
``threshold:N`` are its variants); an exact plan, and CUDA buckets (NCCL replays exact), run as without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topocc.runtime.collective import ALLREDUCE
from topocc.runtime.collective import collective as describe
from topocc.runtime.communicator import Communicator
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.feedback import FeedbackOptions, feedback_from_env, parse_feedback
from topocc.runtime.plan import PlanSource, as_plan
from topocc.runtime.training.bucket_feedback import BucketFeedback, StepAhead

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
    error_feedback:
        Error feedback for an encoded plan: ``ef``, ``step-ahead``, ``error-avg[:K]``, ``threshold:N``
        (comma-separated; :func:`~topocc.runtime.feedback.parse_feedback`), ``off``; default the
        ``TOPOCC_ERROR_FEEDBACK`` environment variable, else off.  Step ahead also needs
        :meth:`step_ahead` with the optimizer.

    Construction is collective (a handshake checks that every rank loaded the
    same plan), so build it on every rank.

    >>> state = TopoccHookState("plan.json", transport=NCCLTransport())   # doctest: +SKIP
    >>> ddp.register_comm_hook(state, topocc_allreduce_hook)                # doctest: +SKIP
    """

    def __init__(self, plan_or_path: PlanSource, *, mpi_comm: Any = None, timeout: float = 60.0,
                 transport: Any = None, error_feedback: str | FeedbackOptions | None = None) -> None:
        self.plan = as_plan(plan_or_path)
        if describe(self.plan.collective) is not ALLREDUCE:
            raise CommunicatorError(f"the DDP hook needs an allreduce plan, got {self.plan.collective}")
        self.timeout = timeout
        self.comm = Communicator(self.plan, mpi_comm, timeout=timeout, transport=transport)
        self._tensors = self.comm.ops.name == "torch"  # else numpy: CPU buckets through a numpy view
        self.calls = 0
        self.bytes = 0
        options = feedback_from_env() if error_feedback is None else parse_feedback(error_feedback, "error_feedback")
        #: The buckets' residuals (None: error feedback is off).
        self.feedback = BucketFeedback(options) if options is not None else None
        self._ahead: StepAhead | None = None

    def step_ahead(self, optimizer: torch.optim.Optimizer) -> StepAhead:
        """Hook ``optimizer`` so that each gradient is computed at the step-ahead point
        (:class:`~topocc.runtime.training.bucket_feedback.StepAhead`); error feedback must be on."""
        if self.feedback is None:
            raise CommunicatorError("step ahead moves the parameters by their error-feedback residual, and error "
                                    "feedback is off", fix="build the hook state with error_feedback='step-ahead' "
                                                           "or set TOPOCC_ERROR_FEEDBACK=step-ahead")
        if self._ahead is None:
            self._ahead = StepAhead(optimizer, self.feedback.located)
        return self._ahead

    @property
    def world_size(self) -> int:
        return self.plan.ranks

    def _counted(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` flat, counted as one more call of its bytes."""
        flat = tensor.view(-1)
        self.calls += 1
        self.bytes += flat.numel() * flat.element_size()
        return flat

    def allreduce_avg_(self, tensor: torch.Tensor, bucket: Any = None) -> torch.Tensor:
        """Average a contiguous tensor over all ranks in place (DDP's semantics: sum, then divide by size);
        with error feedback on, ``bucket`` (the ``GradBucket`` whose buffer ``tensor`` is) finds its residual.

        On CUDA (NCCL) this only enqueues: the caller's current stream is ordered after the average.
        """
        flat = self._counted(tensor)
        if self._tensors:
            array: Any = flat.detach()
        elif flat.is_cuda:
            raise CommunicatorError(f"a CUDA bucket reached the {self.comm.transport.name} transport, which "
                                    "replays on the host", fix="build the hook state with transport=NCCLTransport()")
        else:
            array = flat.detach().numpy()
        if self.feedback is not None and bucket is not None:
            self.feedback.allreduce(self.comm, bucket, array, "avg")
        else:
            self.comm.allreduce(array, op="avg")
        return tensor

    def average(self, tensor: torch.Tensor, bucket: Any = None) -> torch.futures.Future[torch.Tensor]:
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
        self.allreduce_avg_(tensor, bucket)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(tensor)
        return done

    def close(self) -> None:
        """Release the communicator (collective), settling a step ahead's parameters first."""
        if self._ahead is not None:
            self._ahead.remove()
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
    With error feedback on, the bucket's residual goes with it (:class:`TopoccHookState`).
    """
    return state.average(bucket.buffer(), bucket)
