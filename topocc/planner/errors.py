"""The planner's errors; all derive from :class:`topocc.runtime.errors.TopoccError`.

The CLI turns any of them into one line on stderr and the class's exit code.
Every exit code ``topocc`` can return (``tests/planner/test_errors.py`` checks this table
against the classes, ``topocc --help`` prints it):

====  ========================================  ==================================================================
code  raised as                                 meaning
====  ========================================  ==================================================================
0                                               success (``verify``: the schedule is proved; ``run``: PASS)
1     TopoccError                               another expected failure (no root for emulation, a missing tool)
2     UsageError                                a bad argument: a size, a name, a rank count the schedule lacks
3     TopologyError ScheduleFormatError         a topology or schedule file that is malformed or unusable
4     VerificationError SimulationError         a schedule that is wrong, or does not fit the topology
5     CommunicatorError                         a replay failed: ranks refused, died or timed out
6     NotApplicableError InfeasibleError        no algorithm applies, or a solver found no schedule
7     WrongResultError                          a replay ran but its result is wrong (``run``/``bench``: FAIL)
70                                              an internal error: a bug in topocc (rerun with TOPOCC_DEBUG=1)
130                                             interrupted (Ctrl-C)
141                                             stdout closed early (a broken pipe, e.g. ``| head``)
====  ========================================  ==================================================================

A :class:`TopoccWarning` (a figure implausible for its link, a calibration far from its file) changes no
exit code: the CLI prints it as one ``topocc: warning: ...`` line on stderr, a library caller gets it through
Python's :mod:`warnings`.
"""

from __future__ import annotations

import re

from topocc.runtime.errors import CommunicatorError, ScheduleFormatError, TopoccError, UsageError, WrongResultError

__all__ = [
    "CommunicatorError",
    "InfeasibleError",
    "NotApplicableError",
    "ScheduleFormatError",
    "SimulationError",
    "TopoccError",
    "TopoccWarning",
    "TopologyError",
    "UsageError",
    "VerificationError",
    "WrongResultError",
    "exit_codes",
]


class TopologyError(TopoccError):
    """A topology file that is malformed or describes an unusable cluster."""

    exit_code = 3


class TopoccWarning(UserWarning):
    """Something that works but is likely not what was meant: one line, naming the place and the reading."""


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


def exit_codes() -> list[tuple[int, tuple[str, ...], str]]:
    """The rows of this module's exit-code table: (code, error class names, meaning).

    Parsed from the docstring, so the table people read, ``topocc --help`` and
    the test that checks the classes all use one text.
    """
    rows = []
    for line in (__doc__ or "").splitlines():
        match = re.match(r"(\d+)\s{2,}(.*)$", line)
        if match:
            code, rest = match.groups()
            names, _, meaning = rest.rpartition("  ")
            rows.append((int(code), tuple(names.split()), meaning.strip()))
    return rows
