"""Error feedback in the ``topocc`` backend: which all-reduces carry a residual, and step ahead through DDP's buckets.

With ``TOPOCC_ERROR_FEEDBACK`` set (or ``BackendOptions(error_feedback=...)``), a planned CPU all-reduce of
float data that torch issues *during backward* (DDP's gradient buckets, HSDP's replicated gradients) runs
with the residual of the tensor it reduces (:mod:`topocc.runtime.feedback`), found by the tensor's memory,
size and dtype: DDP reduces each bucket from the same buffer every step.  A call outside backward (a loss or
metric someone averages) runs without one, so error feedback never adds gradient error to it.  DDP rebuilds
its buckets after the first step; the residuals of the first step's buffers are dropped then.  A gradient
reduce-scatter (FSDP2's) runs with the residual of its position in the backward pass
(:class:`BackwardOrder`), as its input is a new buffer each step; error averaging applies to all-reduces only.

Step ahead needs the optimizer: :func:`step_ahead` finds each parameter's residual through its gradient,
which must be a view of DDP's bucket (``DistributedDataParallel(..., gradient_as_bucket_view=True)``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterator

import torch

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.feedback import ErrorFeedback
from topocc.runtime.training.bucket_feedback import Located, StepAhead

__all__ = ["BackwardOrder", "bucket_key", "carries_residual", "step_ahead_over"]


def in_backward() -> bool:
    """Whether this thread runs autograd's backward now (torch's graph-task id; True where torch has none)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is None or current() != -1


def carries_residual(tensor: torch.Tensor) -> bool:
    """Whether an all-reduce of ``tensor`` runs with a residual: float data on the CPU, during backward."""
    return tensor.device.type == "cpu" and tensor.is_floating_point() and in_backward()


def bucket_key(tensor: torch.Tensor) -> Hashable:
    """The residual's key of an all-reduced tensor: its memory, size and dtype."""
    return (tensor.data_ptr(), tensor.numel(), tensor.dtype)


class BackwardOrder:
    """Residual keys for gradients whose buffers are new each step (FSDP2's reduce-scatter inputs): a call's
    position among this backward pass's keyed calls, with its size and dtype.  FSDP2 reduces its parameter
    groups in the same order every backward, so a position names the same shard each step."""

    def __init__(self) -> None:
        self._task: int | None = None
        self._position = 0

    def key(self, tensor: torch.Tensor) -> Hashable:
        """The key of ``tensor``'s call (caller's thread, during backward); its memory where torch cannot say
        which backward pass runs."""
        current = getattr(torch._C, "_current_graph_task_id", None)
        if current is None:
            return bucket_key(tensor)
        task = current()
        if task != self._task:
            self._task, self._position = task, 0
        else:
            self._position += 1
        return ("backward", self._position, tensor.numel(), tensor.dtype)


def _located(feedback: ErrorFeedback, optimizer: torch.optim.Optimizer) -> Iterator[Located]:
    """Each of ``optimizer``'s parameters whose gradient lies in a residual's bucket, with its piece of it."""
    # the buckets keyed by their memory (bucket_key); those keyed by their place in backward have no span
    spans = sorted((key[0], key[0] + res.values.size * res.values.itemsize, res)  # type: ignore[index]
                   for key, res in feedback.residuals.items()
                   if res.calls and res.values.size and isinstance(key[0], int))  # type: ignore[index]
    starts = [start for start, _, _ in spans]
    for group in optimizer.param_groups:
        for p in group["params"]:
            grad = p.grad
            if grad is None or grad.device.type != "cpu" or not spans:
                continue
            at = bisect_right(starts, grad.data_ptr()) - 1
            if at < 0:
                continue
            start, end, res = spans[at]
            if grad.data_ptr() + grad.numel() * grad.element_size() <= end and grad.dtype == res.buffer.dtype:
                first = (grad.data_ptr() - start) // grad.element_size()
                yield p, res.values[first:first + grad.numel()], res.shift_scale


class _BucketStepAhead(StepAhead):
    """Step ahead that refuses, in one line, a model whose gradients are not views of DDP's buckets."""

    def __init__(self, optimizer: torch.optim.Optimizer, feedback: ErrorFeedback) -> None:
        super().__init__(optimizer, lambda: _located(feedback, optimizer))
        self._feedback = feedback

    def shift(self) -> int:
        moved = super().shift()
        if not moved and any(res.calls and res.values.size for res in self._feedback.residuals.values()):
            raise CommunicatorError("step ahead finds no parameter whose gradient lies in an all-reduced bucket",
                                    fix="wrap the model as DistributedDataParallel(..., gradient_as_bucket_view=True)")
        return moved


def step_ahead_over(feedback: ErrorFeedback | None, optimizer: torch.optim.Optimizer) -> StepAhead:
    """:class:`~topocc.runtime.training.bucket_feedback.StepAhead` on ``optimizer`` with the backend's residuals."""
    if feedback is None:
        raise CommunicatorError("step ahead moves the parameters by their error-feedback residual, and error "
                                "feedback is off in this process group",
                                fix="set TOPOCC_ERROR_FEEDBACK=step-ahead (or BackendOptions(error_feedback=...))")
    return _BucketStepAhead(optimizer, feedback)
