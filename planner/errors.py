"""The planner's errors; all derive from :class:`runtime.errors.TopoccError`.

The CLI turns any of them into one line on stderr and the class's exit code.
"""

from __future__ import annotations

from runtime.errors import CommunicatorError, ScheduleFormatError, TopoccError

__all__ = [
    "CommunicatorError",
    "InfeasibleError",
    "NotApplicableError",
    "ScheduleFormatError",
    "SimulationError",
    "TopoccError",
    "TopologyError",
    "UsageError",
    "VerificationError",
]


class UsageError(TopoccError):
    """A bad argument: an unparseable size, an unknown algorithm name."""

    exit_code = 2


class TopologyError(TopoccError):
    """A topology file that is malformed or describes an unusable cluster."""

    exit_code = 3


class VerificationError(TopoccError):
    """The verifier disproved a schedule: wrong result, unmatched message or deadlock."""

    exit_code = 4


class SimulationError(TopoccError):
    """A schedule cannot run on the given topology (no route between two ranks, wrong rank count)."""

    exit_code = 4


class NotApplicableError(TopoccError):
    """An algorithm does not support this topology or collective (for example, hosts of different sizes)."""

    exit_code = 6


class InfeasibleError(TopoccError):
    """A solver found no schedule within its limits."""

    exit_code = 6
