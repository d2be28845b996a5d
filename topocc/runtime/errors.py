"""The root of topocc's error hierarchy.

It lives in the runtime because the runtime must not import the planner; the
planner's own errors (``topocc.planner.errors``) derive from :class:`TopoccError` too,
so a caller (or the CLI) can catch every expected failure with one clause.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CommunicatorError", "PeerError", "ScheduleFormatError", "TopoccError", "UsageError", "WrongResultError"]


class TopoccError(Exception):
    """An expected failure with a message fit for one line of user output."""

    exit_code = 1

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.where = where
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """``where: message (fix: ...)`` on a single line."""
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.fix:
            text += f" (fix: {self.fix})"
        return " ".join(text.split())


class UsageError(TopoccError):
    """A bad argument: an unparseable size, an unknown algorithm name, a rank count the schedule does not have."""

    exit_code = 2


class ScheduleFormatError(TopoccError):
    """A schedule or plan file that cannot be read: bad JSON, unknown version, wrong fields."""

    exit_code = 3


class CommunicatorError(TopoccError):
    """The runtime refused a call (wrong rank count, dtype, size) or a peer failed."""

    exit_code = 5


class PeerError(CommunicatorError):
    """A call failed on its peers: ``failed`` are the ranks whose link broke (they died or left), ``waiting``
    every rank the call still waited for (communicator ranks); empty ``failed`` means a timeout."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None,
                 failed: Sequence[int] = (), waiting: Sequence[int] = ()) -> None:
        super().__init__(message, where=where, fix=fix)
        self.failed = tuple(failed)
        self.waiting = tuple(waiting)


class WrongResultError(TopoccError):
    """A replay ran to the end but some elements differ from numpy's result by more than the dtype's tolerance."""

    exit_code = 7
