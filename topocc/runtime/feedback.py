"""Error feedback for encoded all-reduces and reduce-scatters: each rank keeps what its encoded messages dropped
and adds it back.

An encoded plan (``topocc compile --compress``) replaces the value ``x`` an encoded message carries by
``decode(encode(x))``, and a rounding copy does the same to a value its owner keeps and sends.  Here each
rank keeps, per bucket (a :class:`Residual`, found by a key such as the gradient bucket a call reduces), the
*residual* ``e``: at the positions of the chunks a message carries
(:meth:`~topocc.runtime.executor.Program.positions`), the error ``x - decode(encode(x))`` of every encoded
message this rank sends and of every rounding copy it makes.  An encoded schedule approximates each value
once, on one rank (a value decoded once passes every later encoding unchanged, bit for bit), and every
approximated value enters the all-reduce's sum once, so after a call::

    sum over ranks of e  ==  sum over ranks of the inputs  -  the result      (up to float rounding)

A reduce-scatter's residual covers its whole input (chunk ``x`` of every rank's input is one piece of the
sum), and the same holds with the result read as the ranks' output blocks laid end to end.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019, "EF-SGD") adds ``e`` to the same bucket's next
input and starts ``e`` afresh, so the encodings delay what they drop but lose none of it: over ``T`` calls
the results add up to the inputs less the last residuals.  Options (:func:`parse_feedback`: the
``TOPOCC_ERROR_FEEDBACK`` environment variable, a hook or backend option; comma-separated):

* ``ef``: plain error feedback, as above.
* ``error-avg`` or ``error-avg:K``: every ``K`` calls of a bucket (default :data:`DEFAULT_AVERAGE_EVERY`),
  each rank's residual becomes the mean of all ranks' (one exact all-reduce of the residual): the total is
  unchanged, and every rank then holds the average error, so no rank keeps mass that only it would ever send
  (Xu, Huo and Huang, "Step-Ahead Error Feedback for Distributed Training with Compressed Gradient", AAAI
  2021: *error averaging*).  All-reduces only: a reduce-scatter's communicator has no all-reduce plan to
  average with.
* ``step-ahead``: between optimizer steps the parameters sit at ``w - lr * s * e`` (``s``:
  :attr:`Residual.shift_scale`), the point error feedback's virtual iterate ``w - lr * s * mean(e)`` says the
  model is at (exactly that point where the residuals agree, as ``error-avg:1`` makes them), so each rank's
  next gradient is computed there; the parameters return bit for bit before the optimizer steps (Xu et al.,
  *step ahead*).  It needs the optimizer (:mod:`topocc.runtime.training.bucket_feedback`); alone it implies ``ef``.
* ``threshold:N``: for top-k encodings, DCT's refreshed threshold (Gupta et al., "Training Recommender
  Systems at Scale: Communication-Efficient Model and Data Parallelism", KDD 2021): every ``N`` calls of a
  bucket each top-k message is selected exactly and its k-th largest magnitude kept; in between it sends
  the elements at least that large, ``k`` at most (:meth:`~topocc.runtime.encoding.TopK.encode_above`), a
  pass over the data instead of a selection.  Every rank refreshes at the same calls and computes each
  threshold from the value its message carries, so ranks encoding the same value still agree bit for bit.

Calls whose plan is exact (no encoding, or one the dtype, op or transport cannot carry) leave the residual
untouched.  This module is numpy-only: the torch side is :mod:`topocc.runtime.training.bucket_feedback`.

>>> feedback = ErrorFeedback(parse_feedback("ef"))                           # doctest: +SKIP
>>> feedback.allreduce(comm, "bucket0", grads, op="avg")                     # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from topocc.runtime.encoding import Encoding, TopK
from topocc.runtime.errors import CommunicatorError

if TYPE_CHECKING:  # the executor is loaded by the replay that calls this, not by a job's set-up
    from topocc.runtime.executor import Program

__all__ = ["DEFAULT_AVERAGE_EVERY", "FEEDBACK_ENV", "ErrorFeedback", "FeedbackOptions", "Residual",
           "feedback_from_env", "parse_feedback"]

#: The environment variable that turns error feedback on for the DDP hook and the ``topocc`` backend.
FEEDBACK_ENV = "TOPOCC_ERROR_FEEDBACK"
#: Calls between two error averagings when ``error-avg`` names no period.
DEFAULT_AVERAGE_EVERY = 8

_FIX = "write ef, step-ahead, error-avg[:K] and threshold:N, comma-separated (e.g. step-ahead,error-avg:4), or off"


@dataclass(frozen=True, slots=True)
class FeedbackOptions:
    """How error feedback runs (see the module docstring): step ahead or not, the error-averaging period and
    the top-k threshold's refresh period (0: never)."""

    step_ahead: bool = False
    average_every: int = 0
    threshold_every: int = 0

    @property
    def spec(self) -> str:
        """The options as :func:`parse_feedback` reads them."""
        parts = ["step-ahead"] if self.step_ahead else []
        if self.average_every:
            parts.append(f"error-avg:{self.average_every}")
        if self.threshold_every:
            parts.append(f"threshold:{self.threshold_every}")
        return ",".join(parts) or "ef"


def parse_feedback(text: str | FeedbackOptions | None, where: str = FEEDBACK_ENV) -> FeedbackOptions | None:
    """The options ``text`` names, None for none (empty, ``off``, ``none``); a one-line
    :class:`~topocc.runtime.errors.CommunicatorError` naming ``where`` for anything else.

    >>> parse_feedback("step-ahead, error-avg:4, threshold:16").spec
    'step-ahead,error-avg:4,threshold:16'
    """
    if text is None or isinstance(text, FeedbackOptions):
        return text
    if text.strip().lower() in ("", "off", "none", "0", "false"):
        return None
    step_ahead, average, threshold = False, 0, 0
    for part in text.split(","):
        name, colon, arg = part.strip().lower().partition(":")
        if name == "ef" and not colon:
            continue
        if name == "step-ahead" and not colon:
            step_ahead = True
        elif name == "error-avg":
            average = _period(text, where, arg) if colon else DEFAULT_AVERAGE_EVERY
        elif name == "threshold" and colon:
            threshold = _period(text, where, arg)
        else:
            raise CommunicatorError(f"{where}={text!r}: {part.strip()!r} is not an error-feedback option", fix=_FIX)
    return FeedbackOptions(step_ahead, average, threshold)


def _period(text: str, where: str, arg: str) -> int:
    """A positive number of calls, or the one-line refusal."""
    if not arg.strip().isdigit() or int(arg) < 1:
        raise CommunicatorError(f"{where}={text!r}: {arg.strip()!r} is not a positive number of calls", fix=_FIX)
    return int(arg)


def feedback_from_env() -> FeedbackOptions | None:
    """The options :data:`FEEDBACK_ENV` names (None where it is unset or off)."""
    return parse_feedback(os.environ.get(FEEDBACK_ENV))


class Residual:
    """One bucket's error feedback on this rank: its residual and the top-k thresholds of its messages.

    ``buffer`` is the residual in the communicator's array type (what an exact all-reduce averages), ``values``
    the same memory as numpy.  As the replay's :class:`~topocc.runtime.executor.Feedback` it encodes the
    encoded sends and rounding copies of a call and adds what each dropped to ``values``.
    """

    def __init__(self, options: FeedbackOptions, buffer: Any, values: np.ndarray, op: str, ranks: int) -> None:
        self.options = options
        self.buffer = buffer
        self.values = values
        self.values[:] = 0
        #: What one unit of residual moves the parameters by, per unit of learning rate, under error feedback's
        #: virtual iterate: the update is ``lr * result / ranks`` for ``avg``, ``lr * result`` for ``sum``.
        self.shift_scale = 1.0 if op == "avg" else float(ranks)
        self.calls = 0  # calls that ran encoded
        self._refresh = True
        self._thresholds: dict[tuple[Program, int], float] = {}
        self._work = np.empty(0, values.dtype)

    def inject(self, data: np.ndarray) -> None:
        """Before an encoded call: add the residual to its input ``data`` (this bucket) and start it afresh."""
        np.add(data, self.values, out=data)
        self.values[:] = 0
        every = self.options.threshold_every
        self._refresh = not every or self.calls % every == 0
        self.calls += 1

    def send(self, program: Program, k: int, codec: Encoding, data: np.ndarray, wire: np.ndarray) -> None:
        """Encode send ``k``'s ``data`` into ``wire``; keep ``data - decode(wire)``."""
        self._encode(program, k, codec, data, wire)
        error = self._scratch(data.size)
        codec.decode(wire, error)
        np.subtract(data, error, out=error)
        self._keep(program.positions(k), error)

    def round(self, program: Program, k: int, codec: Encoding, data: np.ndarray, wire: np.ndarray) -> None:
        """Round copy ``k``'s ``data`` through ``wire`` in place; keep what the rounding took off."""
        before = self._scratch(data.size)
        np.copyto(before, data)
        self._encode(program, k, codec, data, wire)
        codec.decode(wire, data)
        np.subtract(before, data, out=before)
        self._keep(program.positions(k), before)

    def _encode(self, program: Program, k: int, codec: Encoding, data: np.ndarray, wire: np.ndarray) -> None:
        """Encode with the threshold rule for top-k when ``threshold:N`` is on, else as the codec does."""
        if not self.options.threshold_every or not isinstance(codec, TopK):
            codec.encode(data, wire)
            return
        key = (program, k)
        if self._refresh or key not in self._thresholds:
            self._thresholds[key] = codec.encode_refreshed(data, wire)
        else:
            codec.encode_above(data, wire, self._thresholds[key])

    def _scratch(self, n: int) -> np.ndarray:
        """A work array of ``n`` elements (grown as needed, reused)."""
        if self._work.size < n:
            self._work = np.empty(n, self.values.dtype)
        return self._work[:n]

    def _keep(self, runs: list[tuple[int, int]], error: np.ndarray) -> None:
        """Add ``error`` (in the message's order) to the residual at ``runs``."""
        at = 0
        for start, count in runs:
            target = self.values[start:start + count]
            np.add(target, error[at:at + count], out=target)
            at += count


class ErrorFeedback:
    """This rank's residuals, one per key (a bucket), and the all-reduce that applies them.

    Not thread-safe: one caller (a hook, a process group's progress thread) runs a bucket's calls in order.
    """

    def __init__(self, options: FeedbackOptions) -> None:
        self.options = options
        self.residuals: dict[Hashable, Residual] = {}

    def residual(self, comm: Any, key: Hashable, array: Any, op: str) -> Residual:
        """The residual of ``key`` for ``array`` (a new one, zero, where it has none of that size and type)."""
        found = self.residuals.get(key)
        ops = comm.ops
        if found is not None and ops.count(found.buffer) == ops.count(array) and found.buffer.dtype == array.dtype:
            return found
        buffer = ops.empty(ops.count(array), ops.dtype_of(array))
        host = ops.host(buffer)
        values = host if host is not None else np.empty(0, np.float32)
        self.residuals[key] = made = Residual(self.options, buffer, values, op, comm.size)
        return made

    def allreduce(self, comm: Any, key: Hashable, array: Any, op: str = "sum") -> Any:
        """``comm.allreduce(array, op)`` with this key's residual: added to the input where the call runs
        encoded, refilled by the call, and averaged over the ranks every ``error-avg`` calls.  A group transport
        (NCCL) replays exact: its calls need no residual."""
        if comm.grouped:
            return comm.allreduce(array, op)
        res = self.residual(comm, key, array, op)
        before = res.calls
        comm.allreduce(array, op, feedback=res)
        every = self.options.average_every
        if every and res.calls != before and res.calls % every == 0:
            comm.allreduce(res.buffer, "avg", exact=True)
        return array

    def reduce_scatter(self, comm: Any, key: Hashable, sendbuf: Any, recvbuf: Any, op: str = "sum") -> Any:
        """``comm.reduce_scatter(sendbuf, recvbuf, op)`` with this key's residual (as large as ``sendbuf``), added
        to a copy of the input where the call runs encoded and refilled by the call (FSDP's gradient shards).
        A group transport replays exact, as for :meth:`allreduce`."""
        if comm.grouped:
            return comm.reduce_scatter(sendbuf, recvbuf, op)
        return comm.reduce_scatter(sendbuf, recvbuf, op, feedback=self.residual(comm, key, sendbuf, op))
