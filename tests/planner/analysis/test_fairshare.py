"""The vector progressive filling against the scalar one, and the simulator's two paths against each other."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.planner.analysis.test_simulate import random_fabric, random_topology
from topocc.planner.analysis import fairshare
from topocc.planner.analysis.fairshare import fair_rates, fair_rates_vector
from topocc.planner.analysis.simulate import simulate
from topocc.planner.routing.network import Network


@st.composite
def flow_sets(draw: st.DrawFn) -> tuple[list[float], list[tuple[int, ...]]]:
    """Link bandwidths and flows' paths (distinct links each), with repeated bandwidths so that shares tie."""
    links = draw(st.integers(1, 12))
    bandwidth = draw(st.lists(st.sampled_from([1.0, 2.0, 3.3, 5.0, 10.0]), min_size=links, max_size=links))
    paths = draw(st.lists(st.lists(st.integers(0, links - 1), min_size=1, max_size=5, unique=True).map(tuple),
                          min_size=1, max_size=40))
    return bandwidth, paths


def _flows(paths: list[tuple[int, ...]]) -> tuple[dict[int, tuple[int, ...]], dict[int, list[int]]]:
    """The scalar filling's view of flows on ``paths``: each flow's links, each link's flows."""
    flow_links = dict(enumerate(paths))
    link_flows: dict[int, list[int]] = {}
    for f, path in flow_links.items():
        for link in path:
            link_flows.setdefault(link, []).append(f)
    return flow_links, link_flows


def _rows(paths: list[tuple[int, ...]]) -> np.ndarray:
    """The vector filling's view: a row of link indices per path, -1 after its last."""
    rows = np.full((len(paths), 5), -1, dtype=np.int32)
    for f, path in enumerate(paths):
        rows[f, :len(path)] = path
    return rows


@settings(max_examples=300, deadline=None)
@given(flow_sets())
def test_vector_filling_matches_the_scalar_one(case: tuple[list[float], list[tuple[int, ...]]]) -> None:
    bandwidth, paths = case
    flow_links, link_flows = _flows(paths)
    scalar = fair_rates(list(flow_links), list(link_flows), flow_links, link_flows, bandwidth,
                        [0.0] * len(bandwidth), [0] * len(bandwidth))
    rows = _rows(paths)
    vector = fair_rates_vector(rows, np.asarray(bandwidth))
    assert list(vector) == pytest.approx([scalar[f] for f in range(len(paths))], rel=1e-12)
    for link, users in link_flows.items():  # feasible: no link carries more than its bandwidth
        assert sum(vector[f] for f in users) <= bandwidth[link] * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(flow_sets(), st.data())
def test_flows_with_fractions_fill_alike_both_ways_and_fit_the_links(
        case: tuple[list[float], list[tuple[int, ...]]], data: st.DataObject) -> None:
    """Flows that put a fraction of their rate on each link (a message sprayed over many paths as one flow):
    the vector filling equals the scalar one, no link carries more than its bandwidth, every flow has a
    saturated link, and fractions of 1 give the plain filling bit for bit."""
    bandwidth, paths = case
    fractions = [tuple(data.draw(st.sampled_from([1.0, 0.5, 0.25, 1 / 3, 0.05]), label=f"f{f}.{i}")
                       for i in range(len(path))) for f, path in enumerate(paths)]
    flow_links, link_flows = _flows(paths)
    scalar = fair_rates(list(flow_links), list(link_flows), flow_links, link_flows, bandwidth,
                        [0.0] * len(bandwidth), [0.0] * len(bandwidth), dict(enumerate(fractions)))
    rows = _rows(paths)
    coefs = np.zeros((len(paths), 5))
    for f, path in enumerate(paths):
        coefs[f, :len(path)] = fractions[f]
    vector = fair_rates_vector(rows, np.asarray(bandwidth), coefs=coefs)
    assert list(vector) == pytest.approx([scalar[f] for f in range(len(paths))], rel=1e-9)
    used = dict.fromkeys(link_flows, 0.0)
    for f, path in enumerate(paths):
        for link, c in zip(path, fractions[f]):
            used[link] += c * vector[f]
    assert all(used[link] <= bandwidth[link] * (1 + 1e-9) for link in used)
    for path in paths:  # max-min: each flow is held by a full link
        assert any(used[link] >= bandwidth[link] * (1 - 1e-9) for link in path)
    ones = fair_rates_vector(rows, np.asarray(bandwidth), coefs=(rows >= 0).astype(float))
    assert list(ones) == list(fair_rates_vector(rows, np.asarray(bandwidth)))


def random_messages(seed: int, ranks: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return [(a, b, rng.randint(1, 5)) for a, b in
            rng.sample([(a, b) for a in range(ranks) for b in range(ranks) if a != b], rng.randint(3, 20))]


@pytest.mark.parametrize("routing", ["spray", "ecmp"])
@pytest.mark.parametrize("seed", range(8))
def test_the_simulators_scalar_and_vector_paths_agree(seed: int, routing: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same schedule timed with every component filled by the scalar code, then by the vector code
    (and with the component search giving up at once, so that every flow is reallocated each time)."""
    from topocc.planner.compiler.builder import ScheduleBuilder
    from topocc.runtime.schedule import Chunk

    topo = random_fabric(seed, routing) if seed % 2 else random_topology(seed)
    msgs = random_messages(seed, topo.size)
    total = sum(n for _, _, n in msgs)
    b = ScheduleBuilder("allreduce", ranks=topo.size, input_chunks=total, output_chunks=total)
    at = 0
    for src, dst, n in msgs:
        b.transfer(src, dst, Chunk("i", at, n), Chunk("o", at, n))
        at += n
    schedule = b.build("random")
    results = []
    for scalar, search in ((10**9, 10**9), (0, 10**9), (0, 0)):
        monkeypatch.setattr(fairshare, "SCALAR_FLOWS", scalar)
        monkeypatch.setattr(fairshare, "SEARCH_LINKS", search)
        r = simulate(topo, schedule, total * 10**7, record=True)
        results.append((r.time_s, sorted((e.rank, e.index, e.end_s) for e in r.op_events)))
    for time_s, ends in results[1:]:
        assert time_s == pytest.approx(results[0][0], rel=1e-9)
        assert [e[2] for e in ends] == pytest.approx([e[2] for e in results[0][1]], rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(flow_sets(), st.data())
def test_weighted_vector_filling_matches_the_flows_spelled_out(case: tuple[list[float], list[tuple[int, ...]]],
                                                               data: st.DataObject) -> None:
    """A path given once with weight k gets the rate of k flows on that path given one by one."""
    bandwidth, paths = case
    weights = data.draw(st.lists(st.integers(1, 6), min_size=len(paths), max_size=len(paths)))
    rows = _rows(paths)
    weighted = fair_rates_vector(rows, np.asarray(bandwidth), np.asarray(weights))
    spelled = fair_rates_vector(np.repeat(rows, weights, axis=0), np.asarray(bandwidth))
    assert list(np.repeat(weighted, weights)) == pytest.approx(list(spelled), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_instants_that_keep_the_paths_on_the_wire_keep_the_rates(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams of messages on few connections (the next message of a connection replaces the last on its
    path at the same instant): timed with the shortcut that keeps every rate when the multiset of paths is
    unchanged, and with every such instant recomputed; the shortcut must be taken and change nothing."""
    from topocc.planner.compiler.builder import ScheduleBuilder
    from topocc.runtime.schedule import Chunk

    rng = random.Random(seed)
    topo = random_fabric(seed, "spray") if seed % 2 else random_topology(seed)
    pairs = rng.sample([(a, b) for a in range(topo.size) for b in range(topo.size) if a != b], 5)
    msgs = [(src, dst, rng.randint(1, 4), rng.randint(0, 1)) for src, dst in pairs for _ in range(rng.randint(2, 6))]
    total = sum(n for _, _, n, _ in msgs)
    b = ScheduleBuilder("allreduce", ranks=topo.size, input_chunks=total, output_chunks=total)
    at = 0
    for src, dst, n, channel in msgs:
        b.transfer(src, dst, Chunk("i", at, n), Chunk("o", at, n), channel=channel)
        at += n
    schedule = b.build("random")
    same_paths = fairshare.Fabric._same_paths
    taken = []

    def recompute(self: fairshare.Fabric) -> bool:
        taken.append(same_paths(self))
        return False

    results = []
    for patch in (False, True):
        if patch:
            monkeypatch.setattr(fairshare.Fabric, "_same_paths", recompute)
        r = simulate(topo, schedule, total * 10**7, record=True)
        results.append((r.time_s, [e.end_s for e in sorted(r.op_events, key=lambda e: (e.rank, e.index))]))
    assert any(taken)
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-12)
    assert results[1][1] == pytest.approx(results[0][1], rel=1e-12)


def _filled_from_scratch(self: fairshare.Fabric, paths: np.ndarray, weight: np.ndarray,
                         delta: dict[int, int]) -> np.ndarray:
    return fair_rates_vector(self.path_rows[paths], self.bandwidth_np, weight[paths], self.path_coefs[paths])


def relayed_walks(seed: int, ranks: int) -> tuple[int, list[tuple[int, int, list[int]]]]:
    """Chunks (first, count) relayed along random walks of ranks (each hop waits for the last), so that flows
    start as others end."""
    rng = random.Random(seed)
    walks, at = [], 0
    for _ in range(rng.randint(4, 12)):
        count = rng.randint(1, 5)
        walks.append((at, count, rng.sample(range(ranks), rng.randint(2, min(ranks, 5)))))
        at += count
    return at, walks


@pytest.mark.parametrize("routing", ["spray", "ecmp"])
@pytest.mark.parametrize("seed", range(10))
def test_refilling_above_the_changes_matches_filling_from_scratch(seed: int, routing: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Unchanged flows below the level theta keep their rates and only the others are refilled: the same
    times as a filling of every flow at every instant, and the shortcut is taken."""
    from topocc.planner.compiler.builder import ScheduleBuilder
    from topocc.runtime.schedule import Chunk

    topo = random_fabric(seed, routing) if seed % 2 else random_topology(seed)
    total, walks = relayed_walks(seed, topo.size)
    b = ScheduleBuilder("allreduce", ranks=topo.size, input_chunks=total, output_chunks=total)
    for at, count, hops in walks:
        b.transfer(hops[0], hops[1], Chunk("i", at, count), Chunk("o", at, count))
        for src, dst in itertools.pairwise(hops[1:]):
            b.transfer(src, dst, Chunk("o", at, count), Chunk("o", at, count))
    schedule = b.build("random")
    monkeypatch.setattr(fairshare, "SCALAR_FLOWS", 0)  # every instant through the vector filling
    monkeypatch.setattr(fairshare, "SEARCH_LINKS", 0)
    rows: list[tuple[int, int]] = []
    refill, vector = fairshare.Fabric._refill, fairshare.fair_rates_vector

    def spy_refill(self: fairshare.Fabric, paths: np.ndarray, weight: np.ndarray,
                   delta: dict[int, int]) -> np.ndarray:
        rows.append((paths.size, -1))
        return refill(self, paths, weight, delta)

    def spy_vector(paths: np.ndarray, bandwidth: np.ndarray, weights: np.ndarray | None = None,
                   coefs: np.ndarray | None = None) -> np.ndarray:
        rows[-1] = (rows[-1][0], paths.shape[0])
        return vector(paths, bandwidth, weights, coefs)

    monkeypatch.setattr(fairshare.Fabric, "_refill", spy_refill)
    monkeypatch.setattr(fairshare, "fair_rates_vector", spy_vector)
    warm = simulate(topo, schedule, total * 10**7, record=True)
    monkeypatch.setattr(fairshare.Fabric, "_refill", _filled_from_scratch)
    monkeypatch.setattr(fairshare, "fair_rates_vector", vector)
    cold = simulate(topo, schedule, total * 10**7, record=True)
    assert warm.time_s == pytest.approx(cold.time_s, rel=1e-9)
    ends = [[e.end_s for e in sorted(r.op_events, key=lambda e: (e.rank, e.index))] for r in (warm, cold)]
    assert ends[0] == pytest.approx(ends[1], rel=1e-9)
    assert any(refilled < paths for paths, refilled in rows)  # some flows kept their rates


@pytest.mark.parametrize(("topology", "algorithm"), [("torus-4x4", "multitree"), ("dgx1-v100", "treepack"),
                                                     ("dgx-a100-4node", "hierarchical")])
def test_refilling_matches_filling_from_scratch_on_shipped_schedules(topology: str, algorithm: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on schedules the planner emits, at a size where their pieces pipeline."""
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.options import Options
    from topocc.planner.topology.catalogue import resolve_topology

    topo = resolve_topology(topology)
    net = Network(topo)
    schedule = ALGORITHMS[algorithm].load()(net, "allreduce", Options(size_bytes=64 << 20))
    warm = simulate(topo, schedule, 64 << 20)
    monkeypatch.setattr(fairshare.Fabric, "_refill", _filled_from_scratch)
    assert simulate(topo, schedule, 64 << 20).time_s == pytest.approx(warm.time_s, rel=1e-9)
