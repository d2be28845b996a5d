"""Figures no link of its kind has: a one-line :class:`~topocc.planner.errors.TopoccWarning`, not an error.

A unit slip (``0.7 ms`` where ``0.7 us`` was meant, ``300 MB/s`` for an NVLink lane) parses, and the
planner then routes round the "slow" link without a word.  The bounds are loose on purpose, so that a
model that means an odd figure (an emulation, a what-if) only hears of it: a GPU fabric link (NVLink,
NVSwitch, xGMI) takes about a microsecond a hop and carries tens of GB/s a lane; no link of a cluster
takes milliseconds.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from topocc.planner._yaml import Source
from topocc.planner.errors import TopoccWarning
from topocc.planner.units import format_bandwidth, format_time

__all__ = ["FABRIC_KINDS", "FABRIC_MAX_LATENCY", "FABRIC_MIN_BANDWIDTH", "MAX_LATENCY", "gpu_fabric",
           "warn_implausible"]

#: Link ``kind`` labels of a GPU fabric (a label starting with one of them counts: ``nvlink4``).
FABRIC_KINDS = ("nvlink", "nvswitch", "nvl", "xgmi")
#: A GPU fabric hop above this latency, or a lane below this bandwidth, is a unit slip more likely than a fact.
FABRIC_MAX_LATENCY = 100e-6
FABRIC_MIN_BANDWIDTH = 1e9
#: No link of a cluster takes longer than this (a network hop takes microseconds).
MAX_LATENCY = 10e-3


def gpu_fabric(kind: str, end_types: Iterable[str | None] = ()) -> bool:
    """Whether a link of ``kind`` is a GPU fabric link (NVLink, NVSwitch, xGMI); an unlabelled one is where it
    joins only GPUs and NVSwitches (``end_types``: its ends' device types)."""
    label = kind.strip().lower()
    if label:
        return label.startswith(FABRIC_KINDS)
    types = set(end_types)
    return bool(types) and types <= {"gpu", "nvswitch"}


def warn_implausible(src: Source, obj: Any, key: str, value: float, *, fabric: bool) -> None:
    """Warn where ``obj[key]`` (a latency or bandwidth, by its key), read as ``value``, is implausible for its
    link (``fabric``: a GPU fabric link); the warning names the place, the text and the reading taken."""
    if key.endswith("latency"):
        reading = format_time(value)
        if fabric and value > FABRIC_MAX_LATENCY:
            why = f"over {format_time(FABRIC_MAX_LATENCY)} for an NVLink/NVSwitch hop, which takes about 1 us"
        elif value > MAX_LATENCY:
            why = f"over {format_time(MAX_LATENCY)} for a link, where a network hop takes microseconds"
        else:
            return
    else:
        reading = format_bandwidth(value)
        if not (fabric and value < FABRIC_MIN_BANDWIDTH):
            return
        why = (f"under {format_bandwidth(FABRIC_MIN_BANDWIDTH)} for an NVLink/NVSwitch lane, which carries "
               "20-50 GB/s")
    written = obj.get(key) if isinstance(obj, dict) else None
    text = f"{written} is read as {reading}" if written is not None else f"read as {reading}"
    warnings.warn(TopoccWarning(f"{src.at(obj, key)}: {src.path(obj, key)}: {text}: {why} (check its unit)"),
                  stacklevel=2)
