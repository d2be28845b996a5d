"""What the ``topocc`` backend tells a user, as NCCL does: ``TOPOCC_DEBUG=INFO`` lines, and the last line on failure.

``TOPOCC_DEBUG=INFO`` prints on stderr, once per distinct call of a process group
(collective, size, dtype and device), what ran it: the plan's bucket (its
algorithm and the time the compiler predicted at the size it was tuned for), or
the native backend and why.  ``WARN`` (the default) prints nothing of the kind.

A job that uses the backend gets an excepthook (:func:`install_excepthook`): an
uncaught exception that is, wraps or names a topocc error prints the error's one
line last (after the traceback under ``TOPOCC_DEBUG=INFO``, instead of it
otherwise), so every rank's output under torchrun ends with what went wrong and
the fix, not with torch's frames.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from topocc.runtime.errors import CommunicatorError, TopoccError

if TYPE_CHECKING:
    from topocc.runtime.distributed.tuning import CallClass

__all__ = ["DEBUG_ENV", "CallReport", "debug_level", "format_bytes", "install_excepthook", "note_failure"]

#: ``INFO`` prints a line per distinct call; ``WARN`` (or unset) does not.
DEBUG_ENV = "TOPOCC_DEBUG"
_LEVELS = ("WARN", "INFO")

#: Errors planned calls raised in this process (the last line names the first; torch may wrap it in its own).
_FAILURES: list[TopoccError] = []


def debug_level() -> str:
    """``TOPOCC_DEBUG``'s level, ``WARN`` when unset; another value is refused in one line."""
    text = os.environ.get(DEBUG_ENV, "").strip().upper()
    if not text:
        return "WARN"
    if text not in _LEVELS:
        raise CommunicatorError(f"{DEBUG_ENV}={os.environ[DEBUG_ENV]!r} is not a level",
                                fix=f"set {DEBUG_ENV}=INFO (a line per distinct call) or WARN, or unset it")
    return text


def format_bytes(n: int) -> str:
    """``4 MiB``, ``1.5 KiB``, ``100 B``: a size for one line."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


def _format_time(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


class CallReport:
    """The ``TOPOCC_DEBUG=INFO`` lines of one process group (``label``: its ranks), each distinct call once."""

    def __init__(self, rank: int, label: str, enabled: bool) -> None:
        self.rank = rank
        self.label = label
        self.enabled = enabled
        self._seen: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()

    def _emit(self, key: tuple[Any, ...], text: Callable[[], str]) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        sys.stderr.write(f"topocc INFO rank {self.rank} {self.label}: {text()}\n")
        sys.stderr.flush()

    def planned(self, collective: str, nbytes: int, dtype: str, device: str, schedule: Any, bucket: int,
                buckets: int) -> None:
        """A call a plan runs: the bucket's algorithm, size range and predicted time."""
        if not self.enabled:
            return

        def text() -> str:
            meta = schedule.metadata
            top = "up" if meta.max_bytes is None else f"to {format_bytes(meta.max_bytes)}"
            predicted = (f", predicted {_format_time(meta.predicted_time_s)} at {format_bytes(meta.size_bytes)}"
                         if meta.predicted_time_s is not None and meta.size_bytes else "")
            return (f"{collective} {format_bytes(nbytes)} {dtype} on {device}: plan bucket {bucket + 1}/{buckets} "
                    f"({format_bytes(meta.min_bytes)} {top}), {meta.algorithm}{predicted}")

        self._emit((collective, nbytes, dtype, device, "plan"), text)

    def measured(self, cls: CallClass, native: str, plan_s: float, native_s: float, planned: bool) -> None:
        """A call class decided by its trials against the ``native`` backend: both times and which runs it
        from now on."""
        if self.enabled:
            collective, _, device, bits = cls
            low, high = format_bytes(1 << (bits - 1) if bits else 0), format_bytes(1 << bits)
            self._emit((cls, "measured"), lambda: (
                f"{collective} of {low} to {high} on {device}: measured plan {_format_time(plan_s)}, {native} "
                f"{_format_time(native_s)} (fastest rank, best of its trials): "
                f"{'the plan runs it' if planned else native + ' runs it'}"))

    def native(self, collective: str, nbytes: int, dtype: str, device: str, backend: str, why: str) -> None:
        """A call the native backend runs, and why."""
        if self.enabled:
            self._emit((collective, nbytes, dtype, device, why),
                       lambda: f"{collective} {format_bytes(nbytes)} {dtype} on {device}: native {backend}: {why}")


def note_failure(error: BaseException) -> None:
    """Remember a topocc error a planned call raised (torch may hand it on wrapped in its own exception)."""
    if isinstance(error, TopoccError) and not any(e is error for e in _FAILURES):
        _FAILURES.append(error)


def _topocc_error(exc: BaseException | None) -> TopoccError | None:
    """The topocc error ``exc`` is, was raised from, or names in its message (one torch re-raised)."""
    seen: set[int] = set()
    cause = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, TopoccError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    text = str(exc) if exc is not None else ""
    return next((e for e in _FAILURES if e.message in text), None)


def install_excepthook() -> None:
    """End an uncaught topocc failure's output with its one line (idempotent; other exceptions unchanged)."""
    if getattr(sys.excepthook, "topocc", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        error = _topocc_error(exc)
        if error is None:
            previous(kind, exc, tb)
            return
        if os.environ.get(DEBUG_ENV, "").strip().upper() == "INFO":
            previous(kind, exc, tb)
        else:
            sys.stderr.write(f"topocc: {kind.__name__} (traceback left out; {DEBUG_ENV}=INFO prints it)\n")
        sys.stderr.write(f"topocc: {error.one_line()}\n")
        sys.stderr.flush()

    hook.topocc = True  # type: ignore[attr-defined]
    sys.excepthook = hook
