"""The vector progressive filling against the scalar one, and the simulator's two paths against each other."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import fairshare
from planner.fairshare import fair_rates, fair_rates_vector
from planner.simulate import simulate
from tests.planner.test_simulate import random_fabric, random_topology


@st.composite
def flow_sets(draw: st.DrawFn) -> tuple[list[float], list[tuple[int, ...]]]:
    """Link bandwidths and flows' paths (distinct links each), with repeated bandwidths so that shares tie."""
    links = draw(st.integers(1, 12))
    bandwidth = draw(st.lists(st.sampled_from([1.0, 2.0, 3.3, 5.0, 10.0]), min_size=links, max_size=links))
    paths = draw(st.lists(st.lists(st.integers(0, links - 1), min_size=1, max_size=5, unique=True).map(tuple),
                          min_size=1, max_size=40))
    return bandwidth, paths


@settings(max_examples=300, deadline=None)
@given(flow_sets())
def test_vector_filling_matches_the_scalar_one(case: tuple[list[float], list[tuple[int, ...]]]) -> None:
    bandwidth, paths = case
    flow_links = dict(enumerate(paths))
    link_flows: dict[int, list[int]] = {}
    for f, path in flow_links.items():
        for link in path:
            link_flows.setdefault(link, []).append(f)
    scalar = fair_rates(list(flow_links), list(link_flows), flow_links, link_flows, bandwidth,
                        [0.0] * len(bandwidth), [0] * len(bandwidth))
    rows = np.full((len(paths), 5), -1, dtype=np.int32)
    for f, path in enumerate(paths):
        rows[f, :len(path)] = path
    vector = fair_rates_vector(rows, np.asarray(bandwidth))
    assert list(vector) == pytest.approx([scalar[f] for f in range(len(paths))], rel=1e-12)
    for link, users in link_flows.items():  # feasible: no link carries more than its bandwidth
        assert sum(vector[f] for f in users) <= bandwidth[link] * (1 + 1e-12)


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
    from planner.builder import ScheduleBuilder
    from runtime.schedule import Chunk

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
    rows = np.full((len(paths), 5), -1, dtype=np.int32)
    for f, path in enumerate(paths):
        rows[f, :len(path)] = path
    weighted = fair_rates_vector(rows, np.asarray(bandwidth), np.asarray(weights))
    spelled = fair_rates_vector(np.repeat(rows, weights, axis=0), np.asarray(bandwidth))
    assert list(np.repeat(weighted, weights)) == pytest.approx(list(spelled), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_instants_that_keep_the_paths_on_the_wire_keep_the_rates(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams of messages on few connections (the next message of a connection replaces the last on its
    path at the same instant): timed with the shortcut that keeps every rate when the multiset of paths is
    unchanged, and with every such instant recomputed; the shortcut must be taken and change nothing."""
    from planner.builder import ScheduleBuilder
    from runtime.schedule import Chunk

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
