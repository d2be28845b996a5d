"""Hierarchical (BlueConnect): stage structure from hosts and racks, uniformity checks."""

from __future__ import annotations

import pytest

from planner.algorithms import Options
from planner.algorithms.hierarchical import hierarchical, stages
from planner.errors import NotApplicableError
from planner.topology import Topology, parse_topology_text
from tests.planner.algorithms.test_baselines import check_schedule


def cluster(gpus: list[int], racks: int = 0) -> Topology:
    """Hosts of ``gpus[h]`` GPUs on a switch, NICs on a top switch, ``racks`` racks (0: no rack info)."""
    devices, links = ["devices:"], ["links:"]
    for h, n in enumerate(gpus):
        place = f"host: h{h}" + (f", rack: r{h * racks // len(gpus)}" if racks else "")
        devices += [f"  - {{name: h{h}g, type: gpu, count: {n}, {place}}}",
                    f"  - {{name: h{h}sw, type: nvswitch, {place}}}"]
        links += [f"  - {{ends: [h{h}g{i}, h{h}sw], bandwidth: 100 GB/s, latency: 1 us}}" for i in range(n)]
        links.append(f"  - {{ends: [h{h}sw, top], bandwidth: 10 GB/s, latency: 5 us}}")
    devices.append("  - {name: top, type: switch}")
    return parse_topology_text("\n".join(["name: cluster", *devices, *links]))


def test_three_levels() -> None:
    topology = cluster([2] * 8, racks=2)  # 2 racks x 4 hosts x 2 GPUs
    levels = stages(topology)
    assert [(s.level, s.size, len(s.groups)) for s in levels] == [("host", 2, 8), ("rack", 4, 4), ("cluster", 2, 8)]
    host_of = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    rack_of = {r: k for k, ranks in enumerate(topology.racks.values()) for r in ranks}
    for g in levels[0].groups:
        assert len({host_of[r] for r in g}) == 1
    for g in levels[1].groups:  # one GPU from each host of one rack
        assert len({host_of[r] for r in g}) == 4 and len({rack_of[r] for r in g}) == 1
    for g in levels[2].groups:  # one GPU from each rack
        assert len({rack_of[r] for r in g}) == 2
    # every rank is in exactly one group per level
    for s in levels:
        assert sorted(r for g in s.groups for r in g) == list(range(16))


def test_trivial_levels_are_skipped() -> None:
    assert [s.level for s in stages(cluster([4, 4, 4]))] == ["host", "cluster"]
    assert [s.level for s in stages(cluster([1, 1, 1]))] == ["cluster"]
    assert [s.level for s in stages(cluster([6]))] == ["host"]


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("shape", [([2] * 8, 2), ([3] * 4, 0), ([4] * 3, 3), ([1] * 5, 0)])
def test_schedules_verify(collective: str, shape: tuple[list[int], int]) -> None:
    topology = cluster(*shape)
    schedule = hierarchical(topology, collective, Options(pipeline=2))
    check_schedule(topology, schedule, collective, "hierarchical")


def test_intra_host_stage_stays_in_host() -> None:
    topology = cluster([4, 4])
    schedule = hierarchical(topology, "allreduce", Options(pipeline=1))
    host_of = {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}
    cross = [op for r, p in enumerate(schedule.programs) for op in p
             if op.kind == "send" and host_of[op.peer] != host_of[r]]
    # only the cross-host stage leaves the host: one block (1/8 of the data) each way per rank
    assert all(op.count == 1 for op in cross) and len(cross) == 2 * 8


def test_unequal_hosts_decline() -> None:
    with pytest.raises(NotApplicableError, match="equal-sized hosts"):
        hierarchical(cluster([2, 3]), "allreduce", Options())


def test_unequal_racks_decline() -> None:
    with pytest.raises(NotApplicableError, match="same number of hosts"):
        hierarchical(cluster([2, 2, 2], racks=2), "allreduce", Options())
