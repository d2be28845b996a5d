"""Bus bandwidth as nccl-tests reports it (doc/PERFORMANCE.md there): the simulator and the benchmarks agree on it.

algbw is the buffer size over the time; busbw is algbw times :func:`bus_factor`, the share of the data each rank
must move over its links in an optimal algorithm, so that busbw compares with the links' bandwidth whatever the
rank count.
"""

from __future__ import annotations

from topocc.runtime.collective import BY_NAME, NAMES
from topocc.runtime.errors import ScheduleFormatError

__all__ = ["bus_factor"]


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for ``collective`` (a stored name, as in a schedule) on ``ranks`` ranks
    (:meth:`Collective.bus_factor <topocc.runtime.collective.Collective.bus_factor>`).

    >>> bus_factor("allreduce", 8)
    1.75
    """
    described = BY_NAME.get(collective)
    if described is None:
        raise ScheduleFormatError(f"unknown collective {collective!r}", fix=f"use one of {', '.join(NAMES)}")
    return described.bus_factor(ranks)
