"""Every baseline on every shipped topology it applies to verifies (and sends only over routes).

``fattree-1024`` is large (1024 ranks): only the constructions with few
operations per rank run on it (ring and direct make millions of operations
there; their op counts are reported by the compile benchmarks instead).
"""

from __future__ import annotations

import pytest

from planner.algorithms import ALGORITHMS, Options
from planner.topology import Topology, load_topology
from tests.conftest import TOPOLOGIES
from tests.planner.algorithms.test_baselines import BASELINES, ROOTED, compile_checked

SHIPPED = sorted(TOPOLOGIES.glob("*.yaml"))
#: Rank count above which only the cheap constructions run.
LARGE = 256
CHEAP_ON_LARGE = {("hierarchical", "allreduce"), ("halving-doubling", "allreduce"), ("tree", "allreduce")}

_cache: dict[str, Topology] = {}


def shipped(path_name: str) -> Topology:
    if path_name not in _cache:
        _cache[path_name] = load_topology(TOPOLOGIES / path_name)
    return _cache[path_name]


@pytest.mark.skipif(not SHIPPED, reason="no shipped topologies in this checkout")
@pytest.mark.parametrize("algorithm", BASELINES)
@pytest.mark.parametrize("path_name", [p.name for p in SHIPPED])
def test_shipped(path_name: str, algorithm: str) -> None:
    topology = shipped(path_name)
    applied = 0
    for collective in ALGORITHMS[algorithm].collectives:
        if topology.size > LARGE and (algorithm, collective) not in CHEAP_ON_LARGE:
            continue
        roots = (0, topology.size - 1) if collective in ROOTED else (0,)
        for root in roots:
            applied += compile_checked(topology, algorithm, collective, Options(root=root)) is not None
    if algorithm == "ring" and topology.size <= LARGE:
        assert applied, f"ring applies to no collective on {path_name}"


@pytest.mark.skipif(not (TOPOLOGIES / "dgx1-v100.yaml").exists(), reason="dgx1-v100.yaml not shipped")
def test_shipped_dgx1_has_several_channels() -> None:
    schedule = ALGORITHMS["ring"].load()(shipped("dgx1-v100.yaml"), "allreduce", Options())
    assert schedule.metadata.options["channels"] >= 2


@pytest.mark.skipif(not (TOPOLOGIES / "ndv2-2chassis.yaml").exists(), reason="ndv2-2chassis.yaml not shipped")
def test_shipped_ndv2_ring_follows_one_way_links() -> None:
    topology = shipped("ndv2-2chassis.yaml")
    schedule = ALGORITHMS["ring"].load()(topology, "allreduce", Options())
    for ring in schedule.metadata.options["rings"]:
        assert all(topology.has_route(a, b) for a, b in zip(ring, [*ring[1:], ring[0]]))
