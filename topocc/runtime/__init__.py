"""topocc's runtime: replays compiled collective schedules (imports numpy and its transport only).

>>> from topocc.runtime import Communicator   # doctest: +SKIP
>>> comm = Communicator("ring_allreduce.json")  # doctest: +SKIP
>>> comm.allreduce(x)                          # doctest: +SKIP
"""

from __future__ import annotations

from topocc.runtime.communicator import Communicator as Communicator
from topocc.runtime.communicator import select_schedule as select_schedule
from topocc.runtime.errors import CommunicatorError as CommunicatorError
from topocc.runtime.errors import ScheduleFormatError as ScheduleFormatError
from topocc.runtime.errors import TopoccError as TopoccError
from topocc.runtime.executor import DTYPES as DTYPES
from topocc.runtime.executor import REDUCTIONS as REDUCTIONS
from topocc.runtime.schedule import Schedule as Schedule
from topocc.runtime.schedule import load_schedule as load_schedule

__all__ = [
    "DTYPES",
    "REDUCTIONS",
    "Communicator",
    "CommunicatorError",
    "Schedule",
    "ScheduleFormatError",
    "TopoccError",
    "load_schedule",
    "select_schedule",
]
