"""Error feedback over DDP's gradient buckets, and step ahead: the next gradient computed where its iterate is.

:class:`BucketFeedback` runs each DDP bucket's all-reduce with that bucket's residual
(:mod:`topocc.runtime.feedback`): a residual per bucket index, carried parameter by parameter when DDP
rebuilds its buckets after the first step (so no error is lost then), and found per parameter for step ahead.

Error feedback (:mod:`topocc.runtime.feedback`) keeps on each rank the residual ``e`` its encoded messages
dropped and sends it with the next gradient; the model's parameters ``w`` are then behind the iterate error
feedback follows, ``w - lr * s * mean_ranks(e)`` (``s``: :attr:`~topocc.runtime.feedback.Residual.shift_scale`),
and the gradient computed at ``w`` mismatches it (Xu, Huo and Huang, AAAI 2021, "gradient mismatch").
:class:`StepAhead` hooks an optimizer so that between two of its steps each rank's parameters sit at
``w - lr * s * e`` (each parameter with its group's ``lr``): after ``optimizer.step()`` it saves ``w`` and moves
the parameters there, and before the next step it puts ``w`` back, bit for bit, so the replicas stay equal
and the optimizer updates ``w`` itself.  With error averaging every call (``error-avg:1``) every rank's ``e``
is the mean and the point is the iterate exactly; otherwise it approximates it with this rank's residual.
For optimizers other than plain SGD, ``lr * s * e`` is the SGD step the residual stands for (momentum and
Adam rescale it).

Between steps the parameters hold the shifted point: call :meth:`StepAhead.settle` before evaluating or
saving the model (the next step shifts again), or :meth:`StepAhead.remove` to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from topocc.runtime.feedback import ErrorFeedback, FeedbackOptions

if TYPE_CHECKING:
    import torch

__all__ = ["BucketFeedback", "Located", "StepAhead"]

#: A parameter, the residual of its gradient's elements (numpy, in the parameter's element order), and the
#: residual's shift scale.
Located = tuple["torch.Tensor", np.ndarray, float]


class BucketFeedback:
    """Error feedback over a DDP model's gradient buckets (a ``torch.distributed.GradBucket`` per call).

    A bucket's buffer holds its parameters' gradients end to end, in ``bucket.parameters()`` order; the
    residual of bucket ``i`` has the same layout.  Where a bucket's parameters change (DDP rebuilds its
    buckets once, after the first step), every residual is cut into its parameters' pieces and each new
    bucket starts from its parameters' pieces.
    """

    def __init__(self, options: FeedbackOptions) -> None:
        self.feedback = ErrorFeedback(options)
        self._layouts: dict[int, tuple[tuple[int, ...], list[tuple[Any, int]]]] = {}
        self._carried: dict[int, np.ndarray] = {}  # a parameter's residual across a rebuild, by id

    def allreduce(self, comm: Any, bucket: Any, array: Any, op: str) -> None:
        """``comm.allreduce(array, op)`` of ``bucket``'s buffer (``array``: it, or its numpy view) with its
        residual."""
        if not comm.grouped:
            params = bucket.parameters()
            index, signature = bucket.index(), tuple(id(p) for p in params)
            if index in self._layouts and self._layouts[index][0] != signature:
                self._retire()
            if index not in self._layouts:
                self._place(comm, index, signature, params, array, op)
        self.feedback.allreduce(comm, bucket.index(), array, op)

    def _place(self, comm: Any, index: int, signature: tuple[int, ...], params: list[Any], array: Any,
               op: str) -> None:
        """A new bucket's layout and residual, from what its parameters carried."""
        placed, offset = [], 0
        for p in params:
            placed.append((p, offset))
            offset += p.numel()
        self._layouts[index] = (signature, placed)
        self.feedback.residuals.pop(index, None)
        residual = self.feedback.residual(comm, index, array, op)
        for p, at in placed:
            piece = self._carried.pop(id(p), None)
            if piece is not None and piece.size == p.numel() and residual.values.size:
                residual.values[at:at + piece.size] = piece

    def _retire(self) -> None:
        """Cut every bucket's residual into its parameters' pieces and forget the layouts."""
        for index, (_, placed) in self._layouts.items():
            residual = self.feedback.residuals.pop(index, None)
            if residual is None or not residual.values.size:
                continue
            for p, at in placed:
                self._carried[id(p)] = residual.values[at:at + p.numel()].copy()
        self._layouts.clear()

    def located(self) -> Iterator[Located]:
        """Each parameter of a bucket that has a residual, with its piece of it (for :class:`StepAhead`)."""
        for index, (_, placed) in self._layouts.items():
            residual = self.feedback.residuals.get(index)
            if residual is None or not residual.calls or not residual.values.size:
                continue
            for p, at in placed:
                yield p, residual.values[at:at + p.numel()], residual.shift_scale


class StepAhead:
    """SAEF's step ahead on ``optimizer``'s parameters; ``locate()`` yields each parameter with its residual.

    >>> ahead = StepAhead(optimizer, state.located)   # doctest: +SKIP
    """

    def __init__(self, optimizer: torch.optim.Optimizer, locate: Callable[[], Iterable[Located]]) -> None:
        self.optimizer = optimizer
        self._locate = locate
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.shifted = 0  # parameters the last shift moved
        self._handles = [optimizer.register_step_pre_hook(self._before_step),
                         optimizer.register_step_post_hook(self._after_step)]

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:  # the optimizer's hook signature
        self.settle()

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.shift()

    def shift(self) -> int:
        """Save the parameters and move each by ``-lr * scale * residual``; how many moved."""
        import torch  # optional: loaded by the code that trains

        self.settle()
        rates = {id(p): float(group["lr"]) for group in self.optimizer.param_groups for p in group["params"]}
        with torch.no_grad():
            for param, residual, scale in self._locate():
                lr = rates.get(id(param))
                if not lr or residual.size != param.numel():
                    continue
                self._saved.append((param, param.detach().clone()))
                step = torch.from_numpy(residual).view(param.shape).to(param.dtype)
                param.sub_(step, alpha=lr * scale)
        self.shifted = len(self._saved)
        return self.shifted

    def settle(self) -> None:
        """Put back the parameters a shift moved, bit for bit."""
        import torch  # optional: loaded by the code that trains

        with torch.no_grad():
            for param, saved in self._saved:
                param.copy_(saved)
        self._saved.clear()

    def remove(self) -> None:
        """Settle and unhook the optimizer."""
        self.settle()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
