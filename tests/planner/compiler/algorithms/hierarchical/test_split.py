"""Splitting a large last level in two on small messages, both halves direct."""

from __future__ import annotations

import pytest

import topocc.planner.compiler.algorithms.hierarchical as package
from benchmarks.fabrics import fat_tree
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.compiler.algorithms.hierarchical import hierarchical, layout, stages
from topocc.planner.compiler.algorithms.hierarchical.emit import build_schedule
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage, split
from topocc.planner.compiler.algorithms.hierarchical.split import split_last
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology


def test_small_reduce_scatters_split_a_large_last_level() -> None:
    """At 1 MiB fattree-1024's 32 racks run as 4 x 8, direct twice, where halving-doubling's five steps each
    wait out a path latency; at 16 MiB, where bandwidth rules, they stay one level."""
    net = Network(resolve_topology("fattree-1024"))
    levels = stages(net)
    halves = split_last(net, "reducescatter", levels, Options(size_bytes=1 << 20))
    assert [s.size for s in halves] == [8, 4, 4, 8]
    for level in halves[-2:]:  # each a partition of the ranks, within the racks' groups
        assert sorted(r for g in level.groups for r in g) == list(range(1024))
        assert all(any(set(g) <= set(whole) for whole in levels[-1].groups) for g in level.groups)
    assert split_last(net, "reducescatter", levels, Options(size_bytes=16 << 20)) == levels


@pytest.mark.parametrize("collective", ["allgather", "allreduce"])
def test_a_last_level_kept_from_direct_by_the_sharing_cap_splits_on_small_messages(collective: str) -> None:
    """Ten hosts on leaves of four (the last half full) put 48 messages of a direct host level on an uplink,
    over the cap, and its ring of ten waits out nine path latencies; at 1 MiB the hosts run as 2 x 5; at
    256 MiB as one level."""
    net = Network(fat_tree(10, 4, 4, 2).topology())
    levels = stages(net)
    assert [s.size for s in levels] == [8, 10]
    assert split_last(net, "reducescatter", levels, Options(size_bytes=256 << 20)) == levels
    evaluator = Evaluator(net, 1 << 20)
    schedule = hierarchical(net, collective, Options(size_bytes=1 << 20, evaluator=evaluator))
    assert schedule.metadata.options["levels"] == ["host:8", "rack:2", "rack:5"]
    check_schedule(net, schedule, collective, "hierarchical")
    ratio = evaluator.simulate(schedule).time_s / evaluator.lower_bound(collective).time_s
    assert ratio < {"allgather": 1.45, "allreduce": 1.65}[collective]


@pytest.mark.parametrize("collective", ["reducescatter", "allgather", "allreduce"])
def test_a_split_last_level_verifies(collective: str) -> None:
    """A schedule over a last level split in two (16 hosts of 2 GPUs, the hosts as 4 x 4) passes the
    verifier."""
    net = Network(fat_tree(16, 1, 2, 1, gpus=2).topology())
    levels = stages(net)
    assert [s.size for s in levels] == [2, 16]
    halves = [levels[0], *split(levels[1], 4)]
    schedule = build_schedule(net, collective, Options(size_bytes=1 << 20), halves, None)
    assert schedule.metadata.options["levels"] == ["host:2", "cluster:4", "cluster:4"]
    check_schedule(net, schedule, collective, "hierarchical")


def test_an_all_reduce_splits_its_last_level_only_where_it_builds_one_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """An all-reduce that builds and times both layouts (up to 256 ranks on small messages) keeps a last
    level too large for direct, as a split's direct steps made those two simulations the whole compile;
    with one layout it splits as a reduce-scatter does."""
    net = Network(fat_tree(16, 1, 2, 1, gpus=2).topology())
    asked: list[bool] = []

    def split_hosts(net: Network, collective: str, levels: list[Stage], options: Options,
                    large: bool = True) -> list[Stage]:
        asked.append(large)
        return [levels[0], *split(levels[1], 4)] if large else levels

    monkeypatch.setattr(package, "split_last", split_hosts)
    both = hierarchical(net, "allreduce", Options(size_bytes=1 << 20))
    assert asked == [False] and both.metadata.options["levels"] == ["host:2", "cluster:16"]
    monkeypatch.setattr(layout, "BLOCKS_SMALL_RANKS", 16)
    one = hierarchical(net, "allreduce", Options(size_bytes=1 << 20))
    assert asked[-1] and one.metadata.options["levels"] == ["host:2", "cluster:4", "cluster:4"]
    check_schedule(net, one, "allreduce", "hierarchical")
