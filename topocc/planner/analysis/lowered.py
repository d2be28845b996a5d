"""The program NCCL runs for a lowered schedule, as a schedule the simulator times.

A lowering (:mod:`topocc.runtime.lowering`) runs each rank's operations group by group: a group's sends and
receives are posted together, the group ends when the slowest of them has, then its local operations run,
and only then does the next group start.  The dataflow model of :func:`~topocc.planner.analysis.simulate
.simulate` lets each operation start as soon as its own dependencies are met, so it predicts a lowered
schedule too early wherever a group waits for a message it does not need.  :func:`as_lowered` writes those
waits in: every rank's operations in group order, each group's sends and receives after the previous
group's end, its local work after all of its messages.  Messages keep their order on each connection, so they
match as they do in the schedule.

>>> simulate(topology, as_lowered(schedule, lower(schedule, 4)), size)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from topocc.runtime.lowering import Lowering, RankLowering
from topocc.runtime.schedule import Op, Schedule

__all__ = ["as_lowered"]


def as_lowered(schedule: Schedule, lowering: Lowering) -> Schedule:
    """``schedule`` with each rank's program in its lowering's group order and every group after the last."""
    return replace(schedule.expanded(), programs=tuple(_in_groups(program, ranked)
                                            for program, ranked in zip(schedule.programs, lowering.ranks)))


def _in_groups(program: Sequence[Op], lowered: RankLowering) -> tuple[Op, ...]:
    """One rank's program group by group: a group's messages after the last group's end, its local work after
    all of its messages, one operation after another; a group ends with its last local operation, or, with
    none, when all of its messages have."""
    out: list[Op] = []
    where: dict[int, int] = {}  # the schedule's index of an operation -> its index here
    end: tuple[int, ...] = ()  # the last group's end

    def add(k: int, after: tuple[int, ...]) -> int:
        op = program[k]
        where[k] = len(out)
        out.append(replace(op, deps=tuple(sorted({where[d] for d in op.deps}.union(after)))))
        return len(out) - 1

    for group in lowered.groups:
        posted = tuple(add(k, end) for k in group.p2p)
        if posted:
            end = posted
        for k in group.local:
            end = (add(k, end),)
    return tuple(out)
