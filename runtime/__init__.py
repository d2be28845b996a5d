"""topocc's runtime: replays compiled collective schedules (imports numpy and its transport only).

>>> from runtime import Communicator          # doctest: +SKIP
>>> comm = Communicator("ring_allreduce.json")  # doctest: +SKIP
>>> comm.allreduce(x)                          # doctest: +SKIP
"""

from __future__ import annotations

from runtime.communicator import Communicator as Communicator
from runtime.communicator import select_schedule as select_schedule
from runtime.errors import CommunicatorError as CommunicatorError
from runtime.errors import ScheduleFormatError as ScheduleFormatError
from runtime.errors import TopoccError as TopoccError
from runtime.executor import DTYPES as DTYPES
from runtime.executor import REDUCTIONS as REDUCTIONS
from runtime.schedule import Schedule as Schedule
from runtime.schedule import load_schedule as load_schedule

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
