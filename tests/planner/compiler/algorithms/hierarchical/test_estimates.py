"""The link-load estimates, and what may run direct at all."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.fabrics import heterogeneous_nics, rail_optimized
from tests.planner.analysis.test_automorphisms import small_fattree
from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from topocc.planner.compiler.algorithms.hierarchical import estimates
from topocc.planner.compiler.algorithms.hierarchical.estimates import alike, direct_fits, estimate, sharing
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage, stages
from topocc.planner.compiler.algorithms.hierarchical.steps import METHODS
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology


def test_direct_across_the_network_may_send_twice_the_messages() -> None:
    """A level across the network runs direct up to twice the messages a host level may (a step there waits
    out microseconds): 32 rail-optimized hosts (8 rails of 32, 7,936 messages) may run direct across the
    hosts; 128 hosts of 8 GPUs (7,168) not inside them, where direct doubles the operations."""

    def level(name: str, groups: int, size: int) -> Stage:
        return Stage(name, tuple(tuple(range(g * size, (g + 1) * size)) for g in range(groups)))

    assert direct_fits(level("cluster", 8, 32))
    assert not direct_fits(level("host", 128, 8))
    assert not direct_fits(level("cluster", 16, 32))  # 15,872 messages
    # a small collective on a fabric built by class builds and times one rank per class: only members count
    assert direct_fits(level("host", 128, 8), 32) and direct_fits(level("cluster", 16, 32), 32)
    assert not direct_fits(level("cluster", 1, 64), 32) and direct_fits(level("cluster", 64, 256), 257)


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


@pytest.mark.parametrize("name", ["small-fattree", "rail-8x8", "emu-racks", "hetero-nics-4x8", "dgx2-2chassis"])
def test_a_step_summed_one_pair_per_orbit_loads_the_links_as_pair_by_pair(name: str) -> None:
    """Every level's estimate by every method, and its direct step's sharing, summed one pair per orbit of
    the translations that keep the step (the large fabrics' way) equal those summed pair by pair; where no
    translation keeps a step (hosts behind unequal NICs) it is summed pair by pair."""
    topo = {"small-fattree": small_fattree, "rail-8x8": lambda: rail_optimized(8).topology(),
            "hetero-nics-4x8": lambda: heterogeneous_nics(((4, 200), (4, 200), (2, 100), (2, 100))).topology()
            }.get(name, lambda: resolve_topology(name))()
    by_orbit, by_pair = Network(topo), Network(topo)
    orbit_steps = 0
    for si, stage in enumerate(stages(by_orbit)):
        methods = ["ring", "direct"] + (["halving-doubling"] if stage.size & (stage.size - 1) == 0 else [])
        for method, spread in itertools.product(methods, (False, True)):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(estimates, "BY_ORBIT_MIN_RANKS", 1)
                fast = estimate(by_orbit, stage, method, 1e6, 4, si, spread)
                shared = sharing(by_orbit, stage, si)
            assert fast == pytest.approx(estimate(by_pair, stage, method, 1e6, 4, si, spread), rel=1e-12)
            assert shared == pytest.approx(sharing(by_pair, stage, si), rel=1e-12)
        for step in METHODS["ring"](stage.size, False):
            src, dst, amount = (np.array(column) for column in zip(*(
                (g[i], g[j], float(b - a)) for g in stage.groups for i, j, a, b in step)))
            orbit_steps += estimates._load_by_orbit(by_orbit, src, dst, amount, si, False, True) is not None
    assert (orbit_steps > 0) == (name != "hetero-nics-4x8")
