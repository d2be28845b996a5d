"""mcf: verifies on small directed and heterogeneous topologies, MILP and LP agree, backends and limits."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import TOPOLOGIES
from tests.planner.compiler.algorithms.test_baselines import check_schedule, switch_cluster
from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.algorithms.mcf import mcf
from topocc.planner.compiler.options import McfOptions, Options
from topocc.planner.errors import InfeasibleError, NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.solvers import available_backends
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import load_topology, parse_topology_text

COLLECTIVES = ALGORITHMS["mcf"].collectives
SIZE = 16 << 20

#: A one-way ring with one slow hop and a slow two-way chord: directed links, mixed bandwidths.
DIRECTED = """name: directed4
devices:
  - {name: g, type: gpu, count: 4}
links:
  - {ends: [g0, g1], bandwidth: 50 GB/s, latency: 1 us, direction: forward}
  - {ends: [g1, g2], bandwidth: 25 GB/s, latency: 1 us, direction: forward}
  - {ends: [g2, g3], bandwidth: 50 GB/s, latency: 1 us, direction: forward}
  - {ends: [g3, g0], bandwidth: 50 GB/s, latency: 1 us, direction: forward}
  - {ends: [g0, g2], bandwidth: 10 GB/s, latency: 2 us}
"""
#: Two hosts of three GPUs (a full NVLink mesh each) joined through NICs and a switch.
TWO_HOSTS = """name: twohosts
devices:
  - {name: a, type: gpu, count: 3, host: a}
  - {name: b, type: gpu, count: 3, host: b}
  - {name: nica, type: nic, host: a}
  - {name: nicb, type: nic, host: b}
  - {name: sw, type: switch}
links:
  - {ends: [a0, a1], bandwidth: 100 GB/s, latency: 1 us}
  - {ends: [a0, a2], bandwidth: 50 GB/s, latency: 1 us}
  - {ends: [a1, a2], bandwidth: 100 GB/s, latency: 1 us}
  - {ends: [b0, b1], bandwidth: 100 GB/s, latency: 1 us}
  - {ends: [b0, b2], bandwidth: 50 GB/s, latency: 1 us}
  - {ends: [b1, b2], bandwidth: 100 GB/s, latency: 1 us}
  - {ends: [a0, nica], bandwidth: 25 GB/s, latency: 1 us}
  - {ends: [b0, nicb], bandwidth: 25 GB/s, latency: 1 us}
  - {ends: [nica, sw], bandwidth: 12.5 GB/s, latency: 2 us}
  - {ends: [nicb, sw], bandwidth: 12.5 GB/s, latency: 2 us}
"""
TOPOLOGIES_SMALL = {
    "directed4": lambda: parse_topology_text(DIRECTED),
    "twohosts": lambda: parse_topology_text(TWO_HOSTS),
    "switch2": lambda: switch_cluster(2),
    "switch8": lambda: switch_cluster(4, hosts=2),
}


def run(topology: Topology, collective: str, pipeline: int | None = None,
        **extra: Any) -> tuple[float, dict[str, Any]]:
    """Build, check and simulate one mcf schedule; (predicted time, metadata options)."""
    net = Network(topology)
    options = Options(size_bytes=SIZE, root=topology.size - 1, pipeline=pipeline, mcf=McfOptions(**extra))
    schedule = mcf(net, collective, options)
    check_schedule(topology, schedule, collective, "mcf")
    time_s = simulate(topology, schedule, SIZE).time_s
    assert time_s >= lower_bound(topology, collective, SIZE, topology.size - 1).time_s * (1 - 1e-9)
    return time_s, dict(schedule.metadata.options)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("name", TOPOLOGIES_SMALL)
def test_lp_schedules_verify(name: str, collective: str) -> None:
    _, meta = run(TOPOLOGIES_SMALL[name](), collective, exact=False)
    assert meta["mode"] == "lp" and meta["solver"] == "clp" and meta["optimal"] is True


@pytest.mark.parametrize("collective", ["allgather", "reduce"])
def test_milp_schedules_verify(collective: str) -> None:
    _, meta = run(parse_topology_text(DIRECTED), collective, exact=True, pieces=1)
    assert meta["mode"] == "milp" and meta["solver"] == "scip"


def test_exact_and_lp_agree_on_a_tiny_instance() -> None:
    topology = switch_cluster(3)
    # whole pieces on both sides: the LP's rounding then moves the same units the MILP does
    exact, meta = run(topology, "allgather", exact=True, pieces=1)
    relaxed, _ = run(topology, "allgather", pipeline=1, exact=False, pieces=1)
    assert meta["optimal"] is True
    assert relaxed == pytest.approx(exact, rel=0.15)


@pytest.mark.skipif("pulp-cbc" not in available_backends(), reason="PuLP's CBC is not installed")
def test_backends_are_interchangeable() -> None:
    topology = parse_topology_text(TWO_HOSTS)
    glop, meta_glop = run(topology, "allgather", solver="glop")
    cbc, meta_cbc = run(topology, "allgather", solver="pulp-cbc")
    assert (meta_glop["solver"], meta_cbc["solver"]) == ("glop", "pulp-cbc")
    assert meta_glop["variables"] == meta_cbc["variables"]
    assert cbc == pytest.approx(glop, rel=0.15)


def test_time_limit_is_respected_and_reported() -> None:
    topology = parse_topology_text(DIRECTED)
    try:
        _, meta = run(topology, "allgather", exact=True, pieces=3, time_limit_s=0.05)
    except InfeasibleError as exc:
        assert "\n" not in str(exc) and "0.05 s" in str(exc)
        return
    assert meta["optimal"] is False and meta["solve_s"] < 5.0


def test_declines_large_clusters_with_a_reason() -> None:
    with pytest.raises(NotApplicableError, match="hierarchical"):
        mcf(Network(switch_cluster(3, hosts=11)), "allgather", Options())


@pytest.mark.slow
@pytest.mark.skipif(not (TOPOLOGIES / "ndv2-2chassis.yaml").exists(), reason="ndv2-2chassis.yaml not shipped")
def test_ndv2_allgather_beats_te_ccl() -> None:
    topology = load_topology(TOPOLOGIES / "ndv2-2chassis.yaml")
    net = Network(topology)
    size = 1 << 30
    schedule = mcf(net, "allgather", Options(size_bytes=size))
    check_schedule(topology, schedule, "allgather", "mcf")
    assert simulate(topology, schedule, size).algbw_GBps >= 24.0
