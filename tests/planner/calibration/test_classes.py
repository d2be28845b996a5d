"""Which classes a probe over MPI between CPU processes can measure: never a host's GPU fabric."""

from __future__ import annotations

from pathlib import Path

import pytest

from topocc.planner.calibration.classes import NOT_OVER_MPI, LinkClasses
from topocc.planner.calibration.fit import fit_calibration
from topocc.planner.calibration.probes import probe_tests
from topocc.planner.topology.calibration import calibration_yaml
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.parse import parse_topology_text


@pytest.mark.parametrize(("name", "kept"), [
    ("dgx1-v100", {"host:nvlink"}),
    ("dgx-a100-4node", {"host:nvlink"}),
    ("emu-uniform", set()),  # its ranks of a host share memory (kind shm): what MPI measures
    ("pcie-4x4-10gbe", set()),
])
def test_a_hosts_gpu_fabric_is_kept_at_the_files_figures(name: str, kept: set[str]) -> None:
    classes = LinkClasses(resolve_topology(name))
    assert classes.unmeasurable == dict.fromkeys(kept, NOT_OVER_MPI)
    measured = {p.link for p in classes.pairs if p.link is not None}
    assert not measured & kept and measured  # every other class a pair can reach is still measured
    ids = {t["id"] for t in probe_tests(resolve_topology(name))}
    assert not [i for i in ids if i.split(" ", 1)[-1] in kept]  # no load or spread test of a kept class


def test_the_fit_keeps_them_and_the_block_says_so() -> None:
    """With no measurement at all, the fit writes the kept classes with why, and the file reads back."""
    topology = resolve_topology("dgx-a100-4node")
    cal = fit_calibration(topology, topology, probe_tests(topology), [])
    assert dict(cal.kept) == {"host:nvlink": NOT_OVER_MPI}
    text = calibration_yaml(cal)
    assert f'host:nvlink: {{source: "file ({NOT_OVER_MPI})"}}' in text
    assert topology.source is not None
    again = parse_topology_text(Path(topology.source).read_text() + "\n" + text, "cal.yaml")
    assert again.links == topology.links and again.calibration is not None
    assert dict(again.calibration.kept) == {"host:nvlink": NOT_OVER_MPI}
