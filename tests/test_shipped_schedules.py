"""The compiled schedules in schedules/ load, verify, and match the shipped topologies they name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from topocc.planner.analysis.verify_symmetric import prove
from topocc.planner.topology.catalogue import schedule_topology, scheduled_topologies
from topocc.runtime.schedule import load_schedule

SCHEDULES = sorted((REPO / "schedules").glob("*.json*"))


def test_every_shipped_topology_has_a_schedule() -> None:
    names = {p.name.split("-allreduce")[0] for p in SCHEDULES}
    missing = sorted({t.name for t in scheduled_topologies()} - names)
    assert not missing, f"regenerate with `topocc compile-shipped`: missing {missing}"


@pytest.mark.parametrize("path", SCHEDULES, ids=lambda p: p.name)
def test_shipped_schedule_verifies(path: Path) -> None:
    schedule = load_schedule(path)
    assert schedule.collective == "allreduce"
    prove(schedule)  # one rank per orbit where the symmetric form allows, else every rank
    topology = schedule_topology(schedule, path)  # also checks the fingerprint
    assert topology.size == schedule.ranks
    assert schedule.metadata.predicted_time_s and schedule.metadata.predicted_time_s > 0
