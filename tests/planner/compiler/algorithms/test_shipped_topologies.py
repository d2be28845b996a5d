"""Every baseline on every shipped topology it applies to verifies (and sends only over routes).

Large topologies run only the constructions with few operations per rank
(ring and direct make about a million operations on ``ibm-s822lc-48x4`` and
millions on ``fattree-1024``), and ``fattree-1024`` only hierarchical allreduce.
``fattree-16384`` (4.6 million operations, minutes to build) is left to the
scale benchmark (``benchmarks/planner_bench.py``).
"""

from __future__ import annotations

import pytest

from tests.conftest import TOPOLOGIES
from tests.planner.compiler.algorithms.test_baselines import BASELINES, ROOTED, compile_checked
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import SCHEDULED_MAX_RANKS
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import load_topology

SHIPPED = sorted(TOPOLOGIES.glob("*.yaml"))
#: Rank count above which only the cheap constructions run.
LARGE = 128
CHEAP_ON_LARGE = {("hierarchical", "allreduce"), ("halving-doubling", "allreduce")}
#: Ranks above which a topology is left to the one cheapest construction (1024 ranks: 20 s of routing).
HUGE = 512

_cache: dict[str, Topology] = {}


def shipped(path_name: str) -> Topology:
    if path_name not in _cache:
        _cache[path_name] = load_topology(TOPOLOGIES / path_name)
    return _cache[path_name]


def _cases() -> list[object]:
    """(topology file, algorithm) pairs; those on topologies above :data:`HUGE` ranks are marked slow."""
    cases: list[object] = []
    for path in SHIPPED:
        if shipped(path.name).size > SCHEDULED_MAX_RANKS:
            continue
        huge = shipped(path.name).size > HUGE
        for algorithm in BASELINES:
            marks = [pytest.mark.slow] if huge else []
            cases.append(pytest.param(path.name, algorithm, marks=marks, id=f"{path.stem}-{algorithm}"))
    return cases


@pytest.mark.skipif(not SHIPPED, reason="no shipped topologies in this checkout")
@pytest.mark.parametrize(("path_name", "algorithm"), _cases())
def test_shipped(path_name: str, algorithm: str) -> None:
    topology = shipped(path_name)
    applied = 0
    for collective in ALGORITHMS[algorithm].collectives:
        if topology.size > LARGE and (algorithm, collective) not in CHEAP_ON_LARGE:
            continue
        if topology.size > HUGE and (algorithm, collective) != ("hierarchical", "allreduce"):
            continue
        roots = (0, topology.size - 1) if collective in ROOTED else (0,)
        for root in roots:
            applied += compile_checked(topology, algorithm, collective, Options(root=root)) is not None
    if algorithm == "ring" and topology.size <= LARGE:
        assert applied, f"ring applies to no collective on {path_name}"


@pytest.mark.skipif(not (TOPOLOGIES / "dgx1-v100.yaml").exists(), reason="dgx1-v100.yaml not shipped")
def test_shipped_dgx1_has_several_channels() -> None:
    schedule = ALGORITHMS["ring"].load()(Network(shipped("dgx1-v100.yaml")), "allreduce", Options())
    assert schedule.metadata.options["channels"] >= 2


@pytest.mark.skipif(not (TOPOLOGIES / "ndv2-2chassis.yaml").exists(), reason="ndv2-2chassis.yaml not shipped")
def test_shipped_ndv2_ring_follows_one_way_links() -> None:
    topology = shipped("ndv2-2chassis.yaml")
    net = Network(topology)
    schedule = ALGORITHMS["ring"].load()(net, "allreduce", Options())
    for ring in schedule.metadata.options["rings"]:
        assert all(net.has_route(a, b) for a, b in zip(ring, [*ring[1:], ring[0]]))
