"""Python's cyclic garbage collector, tuned for the millions of small objects a large schedule is made of."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: The young generation's threshold while schedules are built, written or read (Python's default: 700).
YOUNG_THRESHOLD = 20_000


@contextlib.contextmanager
def rare_collections() -> Iterator[None]:
    """The collector with a young generation 30x its default, restored on exit.

    A 1024-rank compile allocates millions of operations, chunks and tuples, none
    of them garbage, and at the default threshold the collector re-scans them
    again and again, a third of a large build's time and of writing its schedule.
    """
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], YOUNG_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off, restored on exit: for walking millions of small, acyclic objects (a simulation,
    a report of a recorded one), which every collection would rescan, for several times the work itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
