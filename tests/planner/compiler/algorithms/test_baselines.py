"""Property tests: every baseline algorithm, on random topologies, verifies or declines for a stated reason.

One checker (:func:`check_schedule`) runs every schedule through the verifier
and the model rule (a rank sends only to ranks it has a GPU-free route to).
Pairs without a route are relayed through other GPUs, so no baseline declines
a topology for want of routes: only hierarchical declines, for uneven hosts.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import chassis_yaml, topologies
from topocc.planner.analysis.verify_symmetric import prove
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.evaluate import link_time
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network, network_of
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.schedule import Schedule

BASELINES = ("ring", "tree", "halving-doubling", "direct", "hierarchical")
ROOTED = ("broadcast", "reduce")
#: The only reasons a baseline may give for declining a topology (hierarchical's, on uneven hosts, and for
#: broadcast and reduce on one GPU a host).
REASONS = re.compile(r"equal-sized hosts|hosts of several GPUs")


def check_schedule(where: Topology | Network, schedule: Schedule, collective: str, algorithm: str) -> None:
    """The schedule verifies (one rank per orbit where it is built as a class), matches the topology, and only
    sends over routes."""
    net = network_of(where)
    topology = net.topology
    assert schedule.collective == collective
    assert schedule.ranks == topology.size
    assert schedule.metadata.algorithm == algorithm
    prove(schedule)
    for rank, program in enumerate(schedule.programs):
        for op in program:
            if op.kind == "send":
                assert op.peer is not None and net.has_route(rank, op.peer), \
                    f"rank {rank} sends to {op.peer} without a route"


def check_link_floor(where: Topology | Network, floor: float, schedule: Schedule, size_bytes: int) -> None:
    """A link floor ``auto`` checks before building never exceeds the built schedule's link time, and is that
    time where every pair has one path (the same bytes on the same links)."""
    net = network_of(where)
    topology = net.topology

    actual = link_time(net, schedule, size_bytes)
    assert 0 < floor <= actual * (1 + 1e-9)
    if all(len(net.routes(a, b)) == 1 for a in range(topology.size) for b in range(topology.size) if a != b):
        assert floor == pytest.approx(actual, rel=1e-9)


def compile_checked(where: Topology | Network, algorithm: str, collective: str,
                    options: Options) -> Schedule | None:
    """Build and check a schedule; None when the algorithm declines for an allowed reason."""
    net = network_of(where)
    fn = ALGORITHMS[algorithm].load()
    try:
        schedule = fn(net, collective, options)
    except NotApplicableError as exc:
        assert REASONS.search(exc.message), f"{algorithm} declined {collective} for no stated reason: {exc}"
        return None
    check_schedule(net, schedule, collective, ALGORITHMS[algorithm].name)
    return schedule


def switch_cluster(gpus: int, hosts: int = 1) -> Topology:
    """``hosts`` hosts of ``gpus`` GPUs on an NVSwitch each, joined by a network switch."""
    lines = ["name: switched", "devices:"]
    links = ["links:"]
    for h in range(hosts):
        lines += [f"  - {{name: h{h}g, type: gpu, host: h{h}, count: {gpus}}}",
                  f"  - {{name: h{h}sw, type: nvswitch, host: h{h}}}"]
        links += [f"  - {{ends: [h{h}g{i}, h{h}sw], bandwidth: 100 GB/s, latency: 1 us}}" for i in range(gpus)]
        if hosts > 1:
            links.append(f"  - {{ends: [h{h}sw, net], bandwidth: 10 GB/s, latency: 5 us}}")
    if hosts > 1:
        lines.append("  - {name: net, type: switch}")
    return parse_topology_text("\n".join(lines + links))


@pytest.mark.parametrize("algorithm", BASELINES)
@settings(max_examples=25, deadline=None)
@given(topology=topologies(), data=st.data())
def test_random_topologies(algorithm: str, topology: Topology, data: st.DataObject) -> None:
    entry = ALGORITHMS[algorithm]
    collective = data.draw(st.sampled_from(entry.collectives), label="collective")
    root = data.draw(st.integers(0, topology.size - 1), label="root") if collective in ROOTED else 0
    pipeline = data.draw(st.sampled_from((None, 1, 3)), label="pipeline")
    options = Options(size_bytes=data.draw(st.sampled_from((1 << 10, 8 << 20, 64 << 20))), root=root,
                      pipeline=pipeline)
    schedule = compile_checked(topology, algorithm, collective, options)
    assert schedule is not None or algorithm == "hierarchical", f"{algorithm} declined {collective}"


@pytest.mark.parametrize("ranks", range(2, 10))
@pytest.mark.parametrize("algorithm", BASELINES)
def test_rank_counts(algorithm: str, ranks: int) -> None:
    topology = switch_cluster(ranks)
    roots = (0, ranks - 1)
    for collective in ALGORITHMS[algorithm].collectives:
        for root in roots if collective in ROOTED else (0,):
            schedule = compile_checked(topology, algorithm, collective, Options(root=root))
            assert schedule is not None


@pytest.mark.parametrize("algorithm", BASELINES)
def test_single_rank(algorithm: str) -> None:
    topology = switch_cluster(1)
    for collective in ALGORITHMS[algorithm].collectives:
        assert compile_checked(topology, algorithm, collective, Options()) is not None


@pytest.mark.parametrize("algorithm", BASELINES)
def test_unsupported_collective_declines(algorithm: str) -> None:
    missing = [c for c in ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall")
               if c not in ALGORITHMS[algorithm].collectives]
    for collective in missing:
        with pytest.raises(NotApplicableError, match="does not implement"):
            ALGORITHMS[algorithm].load()(Network(switch_cluster(4)), collective, Options())


@pytest.mark.parametrize("algorithm", BASELINES)
def test_options_are_recorded(algorithm: str) -> None:
    schedule = ALGORITHMS[algorithm].load()(Network(switch_cluster(4, hosts=2)), "allreduce", Options(pipeline=2))
    assert schedule.metadata.options["pipeline"] == 2
    assert schedule.metadata.options["size_bytes"] == Options().size_bytes


@pytest.mark.parametrize("shape", [(2, 4, "nvswitch"), (4, 4, "nvswitch"), (2, 8, "cube-mesh")])
@pytest.mark.parametrize("one_way", [True, False], ids=["one-way", "two-way"])
@pytest.mark.parametrize("algorithm", [*BASELINES, "multitree"])
def test_multi_chassis_boxes(algorithm: str, shape: tuple[int, int, str], one_way: bool) -> None:
    """TE-CCL's and TACCL's multi-chassis models: only one GPU of a chassis reaches the next; all apply by relaying."""
    topology = parse_topology_text(chassis_yaml(*shape, one_way))
    for collective in ALGORITHMS[algorithm].collectives:
        options = Options(size_bytes=1 << 20, root=topology.size - 1)
        assert compile_checked(topology, algorithm, collective, options) is not None
