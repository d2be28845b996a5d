"""Plans shared by the report tests: compiled once per session (compiling and simulating is the slow part)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from topocc.planner.analysis.simulate import SimResult, simulate
from topocc.planner.compiler.algorithms import get_algorithm
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.report._run import Run, record_run
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.model import Topology
from topocc.runtime.schedule import Schedule

SIZE = 64 << 20


@dataclass(frozen=True)
class Plan:
    """A topology, a schedule on it, its simulation with one row per message, and baseline simulations."""

    topology: Topology
    schedule: Schedule
    run: Run
    baselines: dict[str, SimResult]

    @property
    def result(self) -> SimResult:
        return self.run.result


@pytest.fixture(scope="session")
def dgx1_ring() -> Plan:
    """8 ranks: a multi-channel ring on DGX-1, with the double binary tree as a baseline."""
    topo = resolve_topology("dgx1-v100")
    ring = compile_schedule(topo, "allreduce", "ring", Options(size_bytes=SIZE))
    tree = compile_schedule(topo, "allreduce", "tree", Options(size_bytes=SIZE))
    return Plan(topo, ring.schedule, record_run(topo, ring.schedule, SIZE), {"tree": tree.sim})


@pytest.fixture(scope="session")
def dgx1_tree() -> Plan:
    topo = resolve_topology("dgx1-v100")
    tree = compile_schedule(topo, "allreduce", "tree", Options(size_bytes=SIZE))
    return Plan(topo, tree.schedule, record_run(topo, tree.schedule, SIZE), {})


@pytest.fixture(scope="session")
def racks_plan() -> Plan:
    """12 ranks in 3 racks of 2 hosts: small, but with hosts, racks and switches."""
    topo = resolve_topology("emu-racks")
    c = compile_schedule(topo, "allreduce", "hierarchical", Options(size_bytes=SIZE))
    return Plan(topo, c.schedule, record_run(topo, c.schedule, SIZE), {"ring": simulate(
        topo, compile_schedule(topo, "allreduce", "ring", Options(size_bytes=SIZE)).schedule, SIZE)})


@pytest.fixture(scope="session")
def fattree_plan() -> Plan:
    """1024 ranks on a fat-tree: a pipelined double-binary-tree broadcast (the quickest to build and simulate there).

    Built with the algorithm directly (the verifier and lower bound at this size belong to their own tests).
    """
    topo = resolve_topology("fattree-1024")
    net = Network(topo)
    schedule = get_algorithm("tree").load()(net, "broadcast", Options(size_bytes=SIZE))
    return Plan(topo, schedule, record_run(topo, schedule, SIZE), {})


def shipped(name: str) -> Plan:
    """The shipped allreduce schedule of topology ``name`` (``schedules/``), simulated at the size it was built for."""
    from pathlib import Path

    from topocc.runtime.plan import as_plan

    found = sorted((Path(__file__).resolve().parents[3] / "schedules").glob(f"{name}-allreduce.json*"))
    schedule = as_plan(found[0]).schedules[0]
    topo = resolve_topology(name)
    return Plan(topo, schedule, record_run(topo, schedule, schedule.metadata.size_bytes or SIZE), {})


@pytest.fixture(scope="session")
def a100_shipped() -> Plan:
    """32 ranks on 4 DGX A100: the shipped hierarchical allreduce (4 pipelined channels)."""
    return shipped("dgx-a100-4node")


@pytest.fixture(scope="session")
def fattree_shipped() -> Plan:
    """1024 ranks: the shipped hierarchical allreduce of fattree-1024 (328,704 operations)."""
    return shipped("fattree-1024")
