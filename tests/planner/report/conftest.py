"""Plans shared by the report tests: compiled once per session (compiling and simulating is the slow part)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner.algorithms import Options, get_algorithm
from planner.compile import compile_schedule, resolve_topology
from planner.simulate import SimResult, simulate
from planner.topology import Topology
from runtime.schedule import Schedule

SIZE = 64 << 20


@dataclass(frozen=True)
class Plan:
    """A topology, a schedule on it, its recorded simulation and baseline simulations."""

    topology: Topology
    schedule: Schedule
    result: SimResult
    baselines: dict[str, SimResult]


@pytest.fixture(scope="session")
def dgx1_ring() -> Plan:
    """8 ranks: a multi-channel ring on DGX-1, with the double binary tree as a baseline."""
    topo = resolve_topology("dgx1-v100")
    ring = compile_schedule(topo, "allreduce", "ring", Options(size_bytes=SIZE))
    tree = compile_schedule(topo, "allreduce", "tree", Options(size_bytes=SIZE))
    return Plan(topo, ring.schedule, simulate(topo, ring.schedule, SIZE, record=True), {"tree": tree.sim})


@pytest.fixture(scope="session")
def dgx1_tree() -> Plan:
    topo = resolve_topology("dgx1-v100")
    tree = compile_schedule(topo, "allreduce", "tree", Options(size_bytes=SIZE))
    return Plan(topo, tree.schedule, simulate(topo, tree.schedule, SIZE, record=True), {})


@pytest.fixture(scope="session")
def racks_plan() -> Plan:
    """12 ranks in 3 racks of 2 hosts: small, but with hosts, racks and switches."""
    topo = resolve_topology("emu-racks")
    c = compile_schedule(topo, "allreduce", "hierarchical", Options(size_bytes=SIZE))
    return Plan(topo, c.schedule, simulate(topo, c.schedule, SIZE, record=True), {"ring": simulate(
        topo, compile_schedule(topo, "allreduce", "ring", Options(size_bytes=SIZE)).schedule, SIZE)})


@pytest.fixture(scope="session")
def fattree_plan() -> Plan:
    """1024 ranks on a fat-tree: a pipelined double-binary-tree broadcast (the quickest to build and simulate there).

    Built with the algorithm directly (the verifier and lower bound at this size belong to their own tests).
    """
    topo = resolve_topology("fattree-1024")
    schedule = get_algorithm("tree").load()(topo, "broadcast", Options(size_bytes=SIZE))
    return Plan(topo, schedule, simulate(topo, schedule, SIZE, record=True), {})
