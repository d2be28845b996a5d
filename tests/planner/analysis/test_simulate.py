"""The contention simulator against closed forms: ring alpha-beta, fair sharing, multipath, latency."""

from __future__ import annotations

import gc
import random
import weakref
from typing import Any

import numpy as np
import pytest

from benchmarks.fabrics import fat_tree
from tests.planner.topology.test_topology import two_paths
from topocc.planner._yaml import Source, parse_yaml
from topocc.planner.analysis.lowered import as_lowered
from topocc.planner.analysis.simulate import SimResult, chunk_bytes, simulate, simulate_within
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.errors import SimulationError
from topocc.planner.routing.network import Network
from topocc.planner.routing.paths import assign_paths
from topocc.planner.topology.calibration import apply_calibration, parse_calibration
from topocc.planner.topology.model import ROUTING_MODES, Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.lowering import lower
from topocc.runtime.schedule import Chunk, PathChoice, Schedule

GB = 1e9


def ring_allreduce(p: int) -> Schedule:
    """In-place ring allreduce (reduce-scatter then all-gather), p chunks, rank r sends to r+1."""
    b = ScheduleBuilder("allreduce", ranks=p, input_chunks=p, output_chunks=p, inplace=True)
    for s in range(p - 1):
        for r in range(p):
            c = (r - s) % p
            b.transfer(r, (r + 1) % p, Chunk("o", c), Chunk("o", c), reduce=True, step=s)
    for s in range(p - 1):
        for r in range(p):
            c = (r + 1 - s) % p
            b.transfer(r, (r + 1) % p, Chunk("o", c), Chunk("o", c), step=p - 1 + s)
    return b.build("ring")


def ring_topology(p: int, bandwidth: str = "10 GB/s", latency: str = "1 us", *, directed: bool = False) -> Topology:
    """p GPUs joined in a ring by direct links (one direction only if ``directed``)."""
    direction = ", direction: forward" if directed else ""
    count = p if p > 2 or directed else 1
    links = "\n".join(
        f"  - {{ends: [g{i}, g{(i + 1) % p}], bandwidth: {bandwidth}, latency: {latency}{direction}}}"
        for i in range(count)
    )
    return parse_topology_text(f"name: ring{p}\ndevices:\n  - {{name: g, type: gpu, count: {p}}}\nlinks:\n{links}\n")


def star_topology(p: int, bandwidth: str = "10 GB/s", latency: str = "1 us") -> Topology:
    """p GPUs on one switch."""
    links = "\n".join(f"  - {{ends: [g{i}, sw], bandwidth: {bandwidth}, latency: {latency}}}" for i in range(p))
    return parse_topology_text(
        f"name: star{p}\ndevices:\n  - {{name: g, type: gpu, count: {p}}}\n  - {{name: sw, type: switch}}\n"
        f"links:\n{links}\n"
    )


def messages(p: int, pairs: list[tuple[int, int]], chunks: list[int] | None = None) -> Schedule:
    """Independent messages ``src -> dst`` (all posted at time 0), ``chunks[i]`` chunks each, out of 12."""
    b = ScheduleBuilder("allreduce", ranks=p, input_chunks=12, output_chunks=12)
    at = 0
    for i, (src, dst) in enumerate(pairs):
        n = chunks[i] if chunks else 1
        b.transfer(src, dst, Chunk("i", at, n), Chunk("o", at, n))
        at += n
    return b.build("messages")


def op_end(result: SimResult, rank: int, kind: str) -> list[float]:
    return [e.end_s for e in result.op_events if e.rank == rank and e.kind == kind]


# --------------------------------------------------------------------------- closed forms


def test_ring_helper_is_a_correct_allreduce() -> None:
    for p in (2, 3, 5):
        verify(ring_allreduce(p))


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("size", [1 << 20, 10**9, 12345])
def test_ring_allreduce_on_a_ring_matches_alpha_beta(p: int, size: int, directed: bool) -> None:
    alpha, bandwidth = 1e-6, 10 * GB
    result = simulate(ring_topology(p, directed=directed), ring_allreduce(p), size)
    expected = 2 * (p - 1) * alpha + 2 * (p - 1) / p * size / bandwidth
    assert result.time_s == pytest.approx(expected, rel=1e-6)
    assert result.algbw_GBps == pytest.approx(size / expected / GB, rel=1e-6)
    assert result.busbw_GBps == pytest.approx(result.algbw_GBps * 2 * (p - 1) / p, rel=1e-9)


@pytest.mark.parametrize("p", [2, 5])
def test_a_simulation_within_a_deadline_gives_up_only_past_it(p: int) -> None:
    """``auto`` times candidates against the best so far: given up (None) exactly when the schedule runs longer
    than the deadline, and otherwise the same result as :func:`simulate`."""
    topology, schedule, size = ring_topology(p), ring_allreduce(p), 1 << 20
    full = simulate(topology, schedule, size)
    assert simulate_within(topology, schedule, size, full.time_s) == full
    assert simulate_within(topology, schedule, size, full.time_s * (1 + 1e-9)) == full
    assert simulate_within(topology, schedule, size, full.time_s * (1 - 1e-6)) is None
    assert simulate_within(topology, schedule, size, 0.0) is None


def test_ring_allreduce_on_a_star_pays_two_hops_of_latency() -> None:
    p, size, alpha = 6, 1 << 24, 2e-6
    result = simulate(star_topology(p, latency="2 us"), ring_allreduce(p), size)
    assert result.time_s == pytest.approx(2 * (p - 1) * (2 * alpha + size / p / (10 * GB)), rel=1e-6)
    # every uplink and downlink carries 2(p-1)/p of the buffer
    for r in range(p):
        assert result.link_bytes[(f"g{r}", "sw")] == pytest.approx(2 * (p - 1) / p * size)
        assert result.link_bytes[("sw", f"g{r}")] == pytest.approx(2 * (p - 1) / p * size)


def test_tiny_messages_cost_latency_only() -> None:
    p = 5
    topo = ring_topology(p, latency="3 us")
    assert simulate(topo, ring_allreduce(p), 0).time_s == pytest.approx(2 * (p - 1) * 3e-6, rel=1e-12)
    assert simulate(topo, ring_allreduce(p), 5).time_s == pytest.approx(2 * (p - 1) * 3e-6, rel=1e-3)


# --------------------------------------------------------------------------- contention


def two_senders_one_receiver() -> Topology:
    return parse_topology_text(
        """
name: incast
devices:
  - {name: g, type: gpu, count: 3}
  - {name: sw, type: switch}
links:
  - {ends: [g0, sw], bandwidth: 10 GB/s}
  - {ends: [g1, sw], bandwidth: 10 GB/s}
  - {ends: [g2, sw], bandwidth: 10 GB/s}
"""
    )


def test_two_flows_on_one_link_each_get_half() -> None:
    topo = two_senders_one_receiver()
    size = 12 * 10**8  # 12 chunks of 1e8 bytes
    alone = simulate(topo, messages(3, [(0, 2)]), size)
    shared = simulate(topo, messages(3, [(0, 2), (1, 2)]), size)
    assert alone.time_s == pytest.approx(1e8 / (10 * GB), rel=1e-9)
    assert shared.time_s == pytest.approx(2 * alone.time_s, rel=1e-9)
    assert shared.link_utilisation[("sw", "g2")] == pytest.approx(1.0)
    [(link, share)] = shared.bottlenecks(1)
    assert link == ("sw", "g2") and share == pytest.approx(1.0)


def test_a_flow_speeds_up_when_its_competitor_finishes() -> None:
    # 1 and 3 chunks share sw->g2: both at B/2 until the small one is done at 2M/B, then the big one at B.
    result = simulate(two_senders_one_receiver(), messages(3, [(0, 2), (1, 2)], [1, 3]), 12 * 10**8, record=True)
    m, b = 1e8, 10 * GB
    assert op_end(result, 0, "send") == [pytest.approx(2 * m / b)]
    assert op_end(result, 1, "send") == [pytest.approx(4 * m / b)]
    assert result.rank_finish_s == pytest.approx((2 * m / b, 4 * m / b, 4 * m / b))


def test_max_min_fairness_gives_the_remainder_to_unconstrained_flows() -> None:
    # Three flows cross trunk s1->s2 (12 GB/s); flow A is held to 2 GB/s by its own uplink,
    # so max-min fairness gives A 2 and B, C (12 - 2) / 2 = 5 each.
    topo = parse_topology_text(
        """
name: maxmin
devices:
  - {name: g, type: gpu, count: 6}
  - {name: s1, type: switch}
  - {name: s2, type: switch}
links:
  - {ends: [g0, s1], bandwidth: 2 GB/s}
  - {ends: [g1, s1], bandwidth: 10 GB/s}
  - {ends: [g2, s1], bandwidth: 10 GB/s}
  - {ends: [s1, s2], bandwidth: 12 GB/s}
  - {ends: [s2, g3], bandwidth: 10 GB/s}
  - {ends: [s2, g4], bandwidth: 10 GB/s}
  - {ends: [s2, g5], bandwidth: 10 GB/s}
"""
    )
    m = 1e8
    result = simulate(topo, messages(6, [(0, 3), (1, 4), (2, 5)]), 12 * int(m), record=True)
    assert op_end(result, 1, "send") == [pytest.approx(m / 5e9)]
    assert op_end(result, 2, "send") == [pytest.approx(m / 5e9)]
    assert op_end(result, 0, "send") == [pytest.approx(m / 2e9)]  # A never gets more than its uplink
    trunk = [e for e in result.link_events if (e.src, e.dst) == ("s1", "s2")]
    assert sorted(e.end_s for e in trunk) == pytest.approx([m / 5e9, m / 5e9, m / 2e9])
    assert sum(e.bytes for e in trunk) == pytest.approx(result.link_bytes[("s1", "s2")])


def test_messages_split_evenly_over_equal_cost_paths() -> None:
    topo = two_paths("spray", (10, 10), (10, 10))
    net = Network(topo)
    assert len(net.routes(0, 1)) == 2
    size = 12 * 10**8
    result = simulate(topo, messages(2, [(0, 1)], [12]), size)
    assert result.time_s == pytest.approx(size / (20 * GB) + 2e-6, rel=1e-9)
    assert result.link_bytes[("g0", "a")] == pytest.approx(size / 2)
    assert result.link_bytes[("b", "g1")] == pytest.approx(size / 2)
    assert result.link_bytes[("g1", "a")] == 0.0


@pytest.mark.parametrize("routing", ["ecmp", "source"])
def test_a_hashed_connection_takes_one_path(routing: str) -> None:
    topo = two_paths(routing, (10, 10), (10, 10))
    net = Network(topo)
    size = 12 * 10**8
    result = simulate(topo, messages(2, [(0, 1)], [12]), size)
    assert result.time_s == pytest.approx(size / (10 * GB) + 2e-6, rel=1e-9)
    (path,) = net.connection_paths(0, 1)
    assert [result.link_bytes[(ln.src, ln.dst)] for ln in path] == pytest.approx([size, size])


def mesh_2x2(routing: str) -> Topology:
    """Four single-GPU hosts on routers in a 2x2 mesh: 100 GB/s ports without latency, 25 GB/s grid links."""
    return parse_topology_text(f"""
name: mesh-2x2
routing: {routing}
cluster:
  hosts: 4
  host: {{gpus: 1, nic: {{bandwidth: 100 GB/s, latency: 0 us}}}}
  network: {{type: mesh, dims: [2, 2], link: {{bandwidth: 25 GB/s, latency: 1 us}}}}
""")


def test_dimension_order_takes_one_of_the_two_diagonal_paths_that_spray_splits_over() -> None:
    size = 12 * 10**9
    schedule = messages(4, [(0, 3)], [12])
    spray = simulate(mesh_2x2("spray"), schedule, size)
    ordered = simulate(mesh_2x2("dimension-order"), schedule, size)
    assert spray.time_s == pytest.approx(size / (50 * GB) + 2e-6, rel=1e-9)
    assert ordered.time_s == pytest.approx(size / (25 * GB) + 2e-6, rel=1e-9)
    assert ordered.link_bytes[("r0", "r2")] == size and ordered.link_bytes[("r0", "r1")] == 0.0
    # the reverse diagonal 1 -> 2 also corrects its row first (r1 -> r3 -> r2): no link in common with 0 -> 3
    both = simulate(mesh_2x2("dimension-order"), messages(4, [(0, 3), (1, 2)], [6, 6]), size)
    assert both.time_s == pytest.approx(size / 2 / (25 * GB) + 2e-6, rel=1e-9)


def two_spines(routing: str) -> Topology:
    """Two leaves of two GPUs (100 GB/s each), each leaf linked to two spines at 10 GB/s."""
    lines = [f"name: two-spines\nrouting: {routing}\ndevices:", "  - {name: g, type: gpu, count: 4}",
             "  - {name: leaf, type: switch, count: 2}", "  - {name: spine, type: switch, count: 2}", "links:"]
    lines += [f"  - {{ends: [g{g}, leaf{g // 2}], bandwidth: 100 GB/s, latency: 1 us}}" for g in range(4)]
    lines += [f"  - {{ends: [leaf{leaf}, spine{s}], bandwidth: 10 GB/s, latency: 1 us}}"
              for leaf in range(2) for s in range(2)]
    return parse_topology_text("\n".join(lines) + "\n")


def colliding_pair(topo: Topology) -> tuple[int, Schedule]:
    """Connections g0 -> g2 (channel 0) and g1 -> g3 on the first channel ECMP hashes onto g0's spine."""
    net = Network(topo)
    spine = net.connection_paths(0, 2)[0][1].dst
    channel = next(c for c in range(64) if net.connection_paths(1, 3, c)[0][1].dst == spine)
    b = ScheduleBuilder("allreduce", ranks=4, input_chunks=12, output_chunks=12)
    b.transfer(0, 2, Chunk("i", 0, 6), Chunk("o", 0, 6))
    b.transfer(1, 3, Chunk("i", 6, 6), Chunk("o", 6, 6), channel=channel)
    return channel, b.build("collide")


def test_ecmp_collides_where_source_routing_does_not() -> None:
    size = 12 * 10**9
    half = size / 2 / (10 * GB)
    ecmp = two_spines("ecmp")
    _, schedule = colliding_pair(ecmp)
    assert simulate(ecmp, schedule, size).time_s == pytest.approx(2 * half + 4e-6, rel=1e-9)
    assert simulate(two_spines("spray"), schedule, size).time_s == pytest.approx(half + 4e-6, rel=1e-9)
    source = two_spines("source")
    source_net = Network(source)
    assert simulate(source, schedule, size).time_s == pytest.approx(2 * half + 4e-6, rel=1e-9)  # no record: hashed
    routed = assign_paths(source_net, schedule)
    assert {c.via[1] for c in routed.paths} == {"spine0", "spine1"}
    assert simulate(source, routed, size).time_s == pytest.approx(half + 4e-6, rel=1e-9)


def test_recorded_paths_count_only_where_the_fabric_is_source_routed() -> None:
    size = 12 * 10**9
    half = size / 2 / (10 * GB)
    channel, schedule = colliding_pair(two_spines("ecmp"))
    apart = schedule.with_paths([PathChoice(0, 2, 0, ("leaf0", "spine0", "leaf1")),
                                 PathChoice(1, 3, channel, ("leaf0", "spine1", "leaf1"))])
    assert simulate(two_spines("source"), apart, size).time_s == pytest.approx(half + 4e-6, rel=1e-9)
    assert simulate(two_spines("ecmp"), apart, size).time_s == pytest.approx(2 * half + 4e-6, rel=1e-9)
    astray = schedule.with_paths([PathChoice(0, 2, 0, ("leaf0", "leaf1"))])
    with pytest.raises(SimulationError, match=r"recorded path of rank 0 -> rank 2 on channel 0 \(via leaf0, leaf1\) "
                       "is not one of the pair's cheapest paths"):
        simulate(two_spines("source"), astray, size)


def reference_finish_times(topo: Topology, msgs: list[tuple[int, int, float]]) -> list[float]:
    """Brute force: every flow alive at t=0, global progressive filling redone after every completion."""
    net = Network(topo)
    flows: list[list[Any]] = []  # [remaining bytes, links, message]
    latency = []
    for i, (src, dst, nbytes) in enumerate(msgs):
        paths = net.routes(src, dst)
        latency.append(max(sum(link.latency for link in path) for path in paths))
        flows += [[nbytes / len(paths), [(link.src, link.dst) for link in path], i] for path in paths]
    now, sent = 0.0, [0.0] * len(msgs)
    active = list(range(len(flows)))
    while active:
        rate: dict[int, float] = {}
        while len(rate) < len(active):
            shares = []
            for link in {key for f in active for key in flows[f][1]}:
                users = [f for f in active if link in flows[f][1]]
                free = [f for f in users if f not in rate]
                if free:
                    left = topo.bandwidth(*link) - sum(rate[f] for f in users if f in rate)
                    shares.append((left / len(free), free))
            share, free = min(shares, key=lambda item: item[0])
            rate.update((f, share) for f in free)
        step = min(flows[f][0] / rate[f] for f in active)
        now += step
        for f in active:
            flows[f][0] -= rate[f] * step
        for f in [f for f in active if flows[f][0] <= 1e-6 * rate[f] * step]:
            active.remove(f)
            sent[flows[f][2]] = now
    return [sent[i] + latency[i] for i in range(len(msgs))]


def random_topology(seed: int) -> Topology:
    """Six GPUs on two switches joined by a trunk, with uneven bandwidths and latencies."""
    rng = random.Random(seed)
    lines = ["name: random", "devices:", "  - {name: g, type: gpu, count: 6}", "  - {name: s0, type: switch}",
             "  - {name: s1, type: switch}", "links:"]
    for g in range(6):
        lines.append(f"  - {{ends: [g{g}, s{g % 2}], bandwidth: {rng.choice([5, 10, 20])} GB/s, "
                     f"latency: {rng.choice([0, 1, 3])} us}}")
    lines.append(f"  - {{ends: [s0, s1], bandwidth: {rng.choice([10, 25])} GB/s, latency: 1 us}}")
    return parse_topology_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("seed", range(6))
def test_fair_sharing_matches_a_brute_force_reference(seed: int) -> None:
    rng = random.Random(seed)
    topo = random_topology(seed)
    # distinct pairs: messages on one connection are serialised (see test_one_connection_is_fifo)
    pairs = rng.sample([(a, b) for a in range(6) for b in range(6) if a != b], 8)
    counts = [rng.randint(1, 4) for _ in pairs]
    b = ScheduleBuilder("allreduce", ranks=6, input_chunks=sum(counts), output_chunks=sum(counts))
    at, sends = 0, []
    for (src, dst), n in zip(pairs, counts):
        sends.append((src, b.transfer(src, dst, Chunk("i", at, n), Chunk("o", at, n))[0]))
        at += n
    size = sum(counts) * 10**8
    result = simulate(topo, b.build("random"), size, record=True)
    ends = {(e.rank, e.index): e.end_s for e in result.op_events}
    expected = reference_finish_times(topo, [(src, dst, n * 1e8) for (src, dst), n in zip(pairs, counts)])
    assert [ends[key] for key in sends] == pytest.approx(expected, rel=1e-9)


def test_one_connection_is_fifo_and_channels_run_in_parallel() -> None:
    """Two messages between one pair share no bandwidth on one channel: the second waits for the first's
    last byte (its latency overlaps); on two channels they share the link fairly and end together."""
    topo = parse_topology_text("""
name: pair
devices: [{name: g, type: gpu, count: 2}]
links: [{ends: [g0, g1], bandwidth: 1 GB/s, latency: 1 us}]
""")
    for channels, expected in ((1, [1.000001, 2.000001]), (2, [2.000001, 2.000001])):
        b = ScheduleBuilder("allgather", ranks=2, input_chunks=2, output_chunks=4)
        for c in range(2):
            b.send(0, 1, Chunk("i", c), channel=c if channels == 2 else 0)
            b.recv(1, 0, Chunk("o", c), channel=c if channels == 2 else 0)
        result = simulate(topo, b.build("fifo"), 4 * 10**9, record=True)
        ends = sorted(e.end_s for e in result.op_events if e.rank == 1 and e.kind == "recv")
        assert ends == pytest.approx(expected, rel=1e-9)


# --------------------------------------------------------------------------- results and recording


def test_recorded_events_cover_every_operation_and_link() -> None:
    p = 4
    schedule = ring_allreduce(p)
    result = simulate(star_topology(p), schedule, 1 << 20, record=True)
    assert len(result.op_events) == schedule.op_count
    assert all(0 <= e.start_s <= e.end_s <= result.time_s for e in result.op_events)
    assert {e.kind for e in result.op_events} == {"send", "recv", "recv_reduce"}
    assert len(result.link_events) == 2 * p * 2 * (p - 1)  # every message crosses an uplink and a downlink
    for key, carried in result.link_bytes.items():
        assert sum(e.bytes for e in result.link_events if (e.src, e.dst) == key) == pytest.approx(carried)
    assert max(result.rank_finish_s) == result.time_s
    plain = simulate(star_topology(p), schedule, 1 << 20)
    assert plain.time_s == result.time_s and plain.op_events == () and plain.link_events == ()


def test_chunk_bytes_follow_nccl_tests() -> None:
    """A chunk is the larger buffer over its chunks (nccl-tests' size is the larger buffer)."""
    b = ScheduleBuilder("allgather", ranks=4, input_chunks=2, output_chunks=8)
    assert chunk_bytes(b.build("x"), 800) == 100.0


# --------------------------------------------------------------------------- errors


def test_wrong_rank_count_says_both_numbers() -> None:
    with pytest.raises(SimulationError, match=r"4 ranks but the topology has 3.*fix"):
        simulate(two_senders_one_receiver(), ring_allreduce(4), 1024)


def test_unroutable_pair_names_the_ranks_and_the_relay() -> None:
    # g0 - g1 - g2 in a line of direct GPU links: g0 cannot reach g2 without g1 forwarding.
    topo = parse_topology_text(
        """
name: line
devices:
  - {name: g, type: gpu, count: 3}
links:
  - {ends: [g0, g1], bandwidth: 10 GB/s}
  - {ends: [g1, g2], bandwidth: 10 GB/s}
"""
    )
    net = Network(topo)
    assert not net.has_route(0, 2)
    with pytest.raises(SimulationError, match=r"rank 0 sends to rank 2.*relay") as info:
        simulate(topo, messages(3, [(0, 2)]), 1024)
    assert "\n" not in str(info.value)


def test_unmatched_send_and_deadlock_are_reported() -> None:
    topo = star_topology(2)
    b = ScheduleBuilder("allreduce", ranks=2, input_chunks=1, output_chunks=1)
    b.send(0, 1, Chunk("i", 0))
    with pytest.raises(SimulationError, match=r"sends 1 message.*receives 0"):
        simulate(topo, b.build("x"), 1024)
    b = ScheduleBuilder("allreduce", ranks=2, input_chunks=1, output_chunks=1)
    for r in range(2):  # each rank receives before it sends: a rendezvous deadlock
        k = b.recv(r, 1 - r, Chunk("o", 0))
        b.send(r, 1 - r, Chunk("i", 0), after=[k])
    with pytest.raises(SimulationError, match="deadlock"):
        simulate(topo, b.build("x"), 1024)


# --------------------------------------------------------------------------- performance


def test_a_large_ring_matches_the_closed_form() -> None:
    p = 64  # 16k operations (speed is measured by benchmarks/planner_bench.py, not asserted here)
    schedule = ring_allreduce(p)
    topo = star_topology(p)
    result = simulate(topo, schedule, 1 << 28)
    assert result.time_s == pytest.approx(2 * (p - 1) * (2e-6 + (1 << 28) / p / (10 * GB)), rel=1e-6)


def test_route_cache_does_not_keep_a_topology_alive() -> None:
    topo = star_topology(3)
    simulate(topo, messages(3, [(0, 1)]), 1024)
    ref = weakref.ref(topo)
    del topo
    gc.collect()
    assert ref() is None


def random_fabric(seed: int, routing: str) -> Topology:
    """Six GPUs on two leaves under two or three spines, with uneven bandwidths: equal-cost paths to choose."""
    rng = random.Random(seed)
    spines = rng.choice([2, 3])
    lines = [f"name: fabric\nrouting: {routing}\ndevices:", "  - {name: g, type: gpu, count: 6}",
             "  - {name: leaf, type: switch, count: 2}", f"  - {{name: spine, type: switch, count: {spines}}}",
             "links:"]
    lines += [f"  - {{ends: [g{g}, leaf{g % 2}], bandwidth: {rng.choice([5, 10, 20])} GB/s, "
              f"latency: {rng.choice([0, 1, 3])} us}}" for g in range(6)]
    up = rng.choice([4, 10])
    # labelled as one dimension, so that dimension-order routing applies (it takes the first spine)
    lines += [f"  - {{ends: [leaf{leaf}, spine{s}], bandwidth: {up} GB/s, latency: 1 us, dim: 0}}"
              for leaf in range(2) for s in range(spines)]
    return parse_topology_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("routing", ROUTING_MODES)
@pytest.mark.parametrize("seed", range(6))
def test_link_time_is_a_lower_bound_of_the_simulated_time(seed: int, routing: str) -> None:
    """``auto`` skips a candidate whose link time exceeds the best simulated time: that needs link <= simulated,
    under every routing (on a source-routed fabric with the paths the planner records)."""
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.evaluate import link_time
    from topocc.planner.compiler.options import Options
    from topocc.planner.errors import NotApplicableError

    topology = random_topology(seed) if routing == "spray" else random_fabric(seed, routing)
    net = Network(topology)
    size = random.Random(seed).choice([1 << 10, 1 << 20, 64 << 20])
    checked = 0
    for name in ("ring", "tree", "halving-doubling", "direct", "hierarchical"):
        try:
            schedule = assign_paths(net, ALGORITHMS[name].load()(net, "allreduce", Options(size_bytes=size)))
            simulated = simulate(topology, schedule, size).time_s
        except (NotApplicableError, SimulationError):
            continue
        assert 0 < link_time(net, schedule, size) <= simulated * (1 + 1e-9)
        checked += 1
    assert checked


@pytest.mark.parametrize("routing", ROUTING_MODES)
def test_link_time_is_the_simulated_time_of_one_message(routing: str) -> None:
    """A lone message's link time is its busiest link's bytes over bandwidth: the simulation less latency,
    so link time sees the very paths the simulator takes (spray's halves, ECMP's one spine)."""
    from topocc.planner.compiler.evaluate import link_time

    topology = two_spines(routing) if routing != "dimension-order" else mesh_2x2(routing)
    net = Network(topology)
    schedule = messages(4, [(0, 3)], [12])
    schedule = assign_paths(net, schedule)
    size = 12 * 10**9
    simulated = simulate(topology, schedule, size)
    latency = max(sum(ln.latency for ln in path) for path in net.connection_paths(0, 3))
    assert link_time(net, schedule, size) == pytest.approx(simulated.time_s - latency, rel=1e-9)


@pytest.mark.parametrize("routing", ROUTING_MODES)
@pytest.mark.parametrize("seed", range(6))
def test_the_run_without_contention_is_a_lower_bound_of_the_simulated_time(seed: int, routing: str) -> None:
    """``simulate_within`` gives a schedule up when its run without contention already passes the deadline: that
    needs the run's time <= the simulated time, for every algorithm and routing, here on random fabrics."""
    from topocc.planner.analysis.simulate import _bound
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.options import Options
    from topocc.planner.errors import NotApplicableError

    topology = random_topology(seed) if routing == "spray" else random_fabric(seed, routing)
    net = Network(topology)
    size = random.Random(seed).choice([1 << 10, 1 << 20, 64 << 20])
    checked = 0
    for name in ("ring", "tree", "halving-doubling", "direct", "hierarchical", "treepack"):
        try:
            schedule = assign_paths(net, ALGORITHMS[name].load()(net, "allreduce", Options(size_bytes=size)))
            simulated = simulate(topology, schedule, size).time_s
        except (NotApplicableError, SimulationError):
            continue
        alone = _bound(net, schedule, size)
        assert alone is not None and 0 < alone.time_s <= simulated * (1 + 1e-9)
        checked += 1
    assert checked


def test_a_deadline_that_the_run_without_contention_passes_skips_the_simulation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a deadline the contention-free run comes first; where it passes the deadline the simulation is not
    run at all, elsewhere it is, with the simulation's own result."""
    from topocc.planner.analysis import fairshare

    topology = random_fabric(3, "ecmp")
    schedule = ring_allreduce(topology.size)
    size = 64 << 20
    full = simulate(topology, copy_of(schedule), size)
    runs: list[str] = []
    for kind in (fairshare.Fabric, fairshare.Unshared):
        def spy(self: object, *args: object, original: object = kind.__init__, name: str = kind.__name__) -> None:
            original(self, *args)  # type: ignore[operator]
            runs.append(name)

        monkeypatch.setattr(kind, "__init__", spy)
    assert simulate_within(topology, copy_of(schedule), size, full.time_s * 1.01) == full
    assert runs == ["Unshared", "Fabric"]
    runs.clear()
    assert simulate_within(topology, copy_of(schedule), size, full.time_s * 1e-3) is None
    assert runs == ["Unshared"]  # the simulation itself is spared


def test_the_suffix_bound_joins_late_starts_and_link_loads() -> None:
    """Per link, any flow's start plus the bytes of the flows that start no earlier, over the bandwidth: two
    flows of 10 bytes at 0 and 5 on a link of 1 byte/s need 20 s (both after 0); with 1 byte at 0, 15 s (the
    second after 5); a second, faster link counts on its own."""
    from topocc.planner.analysis.simulate import _suffix_bound

    def bound(flows: list[tuple[float, int, float]], bandwidth: list[float]) -> float:
        start, link, nbytes = zip(*flows)
        return _suffix_bound(np.array(start), np.array(link), np.array(nbytes), bandwidth)

    assert bound([(0.0, 0, 10.0), (5.0, 0, 10.0)], [1.0]) == 20.0
    assert bound([(5.0, 0, 10.0), (0.0, 0, 1.0)], [1.0]) == 15.0
    assert bound([(0.0, 1, 1.0), (9.0, 0, 2.0), (0.0, 0, 1.0)], [1.0, 2.0]) == 11.0


def copy_of(schedule: Schedule) -> Schedule:
    """An equal schedule, another object (the simulator keeps its latest result per schedule object)."""
    return schedule.with_metadata()


def test_the_bound_does_without_the_link_term_past_its_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contention-free run records its flows' link loads up to ``_LOADS_MAX`` entries (memory: millions on
    a thousand ranks); past it the bound is the run's end alone, still below the simulation, and the link term
    (a 64 MiB ring, bandwidth-bound) lifts it where the entries fit."""
    from topocc.planner.analysis import simulate as module

    topology = random_fabric(5, "ecmp")
    net = Network(topology)
    schedule = ring_allreduce(topology.size)
    size = 64 << 20
    simulated = simulate(topology, copy_of(schedule), size).time_s
    full = module._bound(net, schedule, size).time_s
    monkeypatch.setattr(module, "_LOADS_MAX", 4)
    capped = module._bound(net, schedule, size).time_s
    assert 1.5 * capped < full <= simulated * (1 + 1e-9)


# --------------------------------------------------------------------------- a calibrated topology


def calibrated(topology: Topology, block: str) -> Topology:
    """``topology`` with a calibration block."""
    return apply_calibration(topology, parse_calibration(Source("cal"), parse_yaml(block, "cal")))


@pytest.mark.parametrize("p", [2, 3, 5])
def test_a_calibrated_ring_pays_each_message_and_each_reduction(p: int) -> None:
    """Each message holds its connection for the fixed cost before its bytes go, and each received chunk is
    reduced at the measured rate before the next step may send it on: the ring's closed form with both."""
    size, gamma, rate = 1 << 24, 30e-6, 2 * GB
    topo = calibrated(ring_topology(p), f"links: {{host-host: {{bandwidth: 5 GB/s, latency: 2 us}}}}\n"
                                        f"message_cost: {gamma * 1e6:g} us\nreduce: {{float32: 2 GB/s}}\n")
    chunk = size / p
    expected = 2 * (p - 1) * (gamma + 2e-6 + chunk / (5 * GB)) + (p - 1) * chunk / rate
    assert simulate(topo, ring_allreduce(p), size).time_s == pytest.approx(expected, rel=1e-6)
    plain = simulate(ring_topology(p), ring_allreduce(p), size).time_s
    assert plain == pytest.approx(2 * (p - 1) * (1e-6 + chunk / (10 * GB)), rel=1e-6)  # the datasheet: unchanged


def test_connections_through_a_calibrated_link_share_less_of_it() -> None:
    """k connections across a link of a class with ``shared`` s get bandwidth * (s + (1 - s) / k) in all."""
    size = 12 * 10**8
    topo = calibrated(two_senders_one_receiver(), "links: {host-switch: {bandwidth: 10 GB/s, shared: 0.6}}\n")
    alone = simulate(topo, messages(3, [(0, 2)]), size).time_s
    shared = simulate(topo, messages(3, [(0, 2), (1, 2)]), size).time_s
    assert alone == pytest.approx(1e8 / (10 * GB), rel=1e-9)
    assert shared == pytest.approx(2e8 / (10 * GB * (0.6 + 0.4 / 2)), rel=1e-9)
    # the bound of a run without contention stays below the simulation
    assert simulate_within(topo, messages(3, [(0, 2), (1, 2)]), size, shared * 1.001) is not None


# --------------------------------------------------------------------------- a lowered schedule


def test_a_lowered_ring_in_lock_step_takes_the_dataflow_time() -> None:
    """A ring moves one chunk per step on every link: groups of one step each wait for nothing more."""
    p, size = 5, 1 << 24
    schedule = ring_allreduce(p)
    lowered = as_lowered(schedule, lower(schedule, 1))
    assert simulate(ring_topology(p), lowered, size).time_s == pytest.approx(
        simulate(ring_topology(p), schedule, size).time_s, rel=1e-9)


def test_a_group_waits_for_its_slowest_message() -> None:
    """Rank 0 sends rank 1 a large message on channel 0 and small ones on channel 1; dataflow lets the small
    ones flow beside the large one, but lowered in one group each, every round waits for the large one."""
    b = ScheduleBuilder("allreduce", ranks=2, input_chunks=4, output_chunks=4, inplace=True)
    b.transfer(0, 1, Chunk("o", 0, 3), Chunk("o", 0, 3), channel=0, step=0)
    for c in range(3):
        b.transfer(1, 0, Chunk("o", 3), Chunk("o", 3), channel=1, step=c)
    schedule = b.build("test")
    topo = ring_topology(2)
    dataflow = simulate(topo, schedule, 4 << 20).time_s
    lowered = simulate(topo, as_lowered(schedule, lower(schedule, 1)), 4 << 20).time_s
    assert lowered > dataflow


def test_a_message_sprayed_over_more_paths_than_are_listed_is_one_flow_over_all_of_them() -> None:
    """Behind 20 spines (more than MAX_PATHS) a message alone takes its latency plus its bytes over the
    bandwidth of all 20 paths together; two messages from one leaf to the other take as long as one (their
    NICs, not the spines they share, bind); the links' bytes are each link's share, on all 20 spines
    (16 listed paths would leave 4 idle)."""
    topo = parse_topology_text(fat_tree(4, 2, 20, 1).yaml, "fat-tree").with_routing("spray")
    net = Network(topo)
    size = 1 << 28
    alone = ScheduleBuilder("allgather", ranks=topo.size, input_chunks=1, output_chunks=1)
    alone.transfer(0, 16, Chunk("i", 0, 1), Chunk("o", 0, 1))
    result = simulate(net, alone.build("one"), size)
    assert result.time_s == pytest.approx(net.route_latency(0, 16) + size / net.route_bandwidth(0, 16), rel=1e-9)
    spines = {key: b for key, b in result.link_bytes.items() if key[1].startswith("spine") and b > 0}
    assert len(spines) == 20 and max(spines.values()) == pytest.approx(min(spines.values()), rel=1e-9)
    assert sum(spines.values()) == pytest.approx(size, rel=1e-9)
    two = ScheduleBuilder("allgather", ranks=topo.size, input_chunks=2, output_chunks=2)
    two.transfer(0, 16, Chunk("i", 0, 1), Chunk("o", 0, 1))
    two.transfer(8, 24, Chunk("i", 1, 1), Chunk("o", 1, 1))
    both = simulate(net, two.build("two"), 2 * size)  # a message each of ``size`` bytes
    assert both.time_s == pytest.approx(result.time_s, rel=1e-9)
    assert max(both.link_utilisation[key] for key in spines) < 0.2
