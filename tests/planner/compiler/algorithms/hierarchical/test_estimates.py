"""The link-load estimates, and what may run direct at all."""

from __future__ import annotations

import pytest

from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from topocc.planner.compiler.algorithms.hierarchical.estimates import alike, direct_fits, estimate
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage, stages
from topocc.planner.routing.network import Network


def test_direct_across_the_network_may_send_twice_the_messages() -> None:
    """A level across the network runs direct up to twice the messages a host level may (a step there waits
    out microseconds): 32 rail-optimized hosts (8 rails of 32, 7,936 messages) may run direct across the
    hosts; 128 hosts of 8 GPUs (7,168) not inside them, where direct doubles the operations."""

    def level(name: str, groups: int, size: int) -> Stage:
        return Stage(name, tuple(tuple(range(g * size, (g + 1) * size)) for g in range(groups)))

    assert direct_fits(level("cluster", 8, 32))
    assert not direct_fits(level("host", 128, 8))
    assert not direct_fits(level("cluster", 16, 32))  # 15,872 messages


def test_estimates_count_latency_per_step_and_bytes_over_the_busiest_link() -> None:
    """A ring of four hosts' NICs takes three steps, direct one: with no bytes, three path latencies against
    one; with bytes, the same part over each step's busiest link."""
    net = Network(cluster([1] * 4))
    (level,) = stages(net)
    assert alike(net, level)
    ring, direct = (estimate(net, level, m, 0.0, 1, 0) for m in ("ring", "direct"))
    assert ring == pytest.approx(3 * direct) and direct > 0
    part = 1 << 20
    # every member sends its three parts at once through its one NIC link (10 GB/s), against one a step
    loaded = {m: estimate(net, level, m, part, 1, 0) - estimate(net, level, m, 0.0, 1, 0)
              for m in ("ring", "direct")}
    assert loaded["direct"] == pytest.approx(3 * part / 10e9) and loaded["ring"] == pytest.approx(3 * part / 10e9)
