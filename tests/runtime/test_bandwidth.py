"""Bus bandwidth factors as nccl-tests defines them."""

from __future__ import annotations

import pytest

from topocc.runtime.bandwidth import bus_factor
from topocc.runtime.errors import ScheduleFormatError


def test_bus_factor_follows_nccl_tests() -> None:
    assert bus_factor("allreduce", 8) == 1.75
    assert bus_factor("allgather", 4) == bus_factor("reducescatter", 4) == bus_factor("alltoall", 4) == 0.75
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0


def test_bus_factor_refuses_an_unknown_collective() -> None:
    with pytest.raises(ScheduleFormatError, match=r"unknown collective .all-reduce.*fix: use one of allreduce"):
        bus_factor("all-reduce", 8)  # a stored name only, not a spelling to normalise
