"""topocc's runtime: replays compiled collective schedules (imports numpy and its transport only).

The names below are loaded on first use (PEP 562), so a module of the runtime that
needs none of them (the ``topocc`` torch backend's set-up, :mod:`topocc._autoload`)
does not pay for the executor's import:

>>> from topocc.runtime import Communicator   # doctest: +SKIP
>>> comm = Communicator("ring_allreduce.json")  # doctest: +SKIP
>>> comm.allreduce(x)                          # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "DTYPES": "topocc.runtime.arrays",
    "REDUCTIONS": "topocc.runtime.arrays",
    "Communicator": "topocc.runtime.communicator",
    "CommunicatorError": "topocc.runtime.errors",
    "Schedule": "topocc.runtime.schedule",
    "ScheduleFormatError": "topocc.runtime.errors",
    "TopoccError": "topocc.runtime.errors",
    "load_schedule": "topocc.runtime.schedule",
    "select_schedule": "topocc.runtime.communicator",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from topocc.runtime.arrays import DTYPES as DTYPES
    from topocc.runtime.arrays import REDUCTIONS as REDUCTIONS
    from topocc.runtime.communicator import Communicator as Communicator
    from topocc.runtime.communicator import select_schedule as select_schedule
    from topocc.runtime.errors import CommunicatorError as CommunicatorError
    from topocc.runtime.errors import ScheduleFormatError as ScheduleFormatError
    from topocc.runtime.errors import TopoccError as TopoccError
    from topocc.runtime.schedule import Schedule as Schedule
    from topocc.runtime.schedule import load_schedule as load_schedule


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'topocc.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
