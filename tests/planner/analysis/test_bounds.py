"""Cut and latency lower bounds: closed forms, and never above what a real schedule achieves."""

from __future__ import annotations

import gc
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fabrics import grid
from tests.conftest import TOPOLOGIES
from tests.planner.topology.test_topology import two_paths
from tests.strategies import chassis_yaml, topologies
from topocc.planner.analysis.bounds import Bound, lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.algorithms import ALGORITHMS
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError, UsageError
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Device, Link, Topology, build_topology
from topocc.planner.topology.parse import load_topology, parse_topology_text
from topocc.runtime.schedule import Chunk, Schedule

GB = 1e9
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")


def star(p: int, bandwidth: str = "10 GB/s", latency: str = "1 us", fast: str | None = None) -> Topology:
    """p GPUs on one switch; with ``fast``, rank 0's link has that bandwidth instead."""
    links = "\n".join(
        f"  - {{ends: [g{i}, sw], bandwidth: {fast if fast and i == 0 else bandwidth}, latency: {latency}}}"
        for i in range(p)
    )
    return parse_topology_text(
        f"name: star{p}\ndevices:\n  - {{name: g, type: gpu, count: {p}}}\n  - {{name: sw, type: switch}}\n"
        f"links:\n{links}\n"
    )


def ring(p: int, bandwidth: str = "10 GB/s", latency: str = "1 us", *, directed: bool = False) -> Topology:
    direction = ", direction: forward" if directed else ""
    links = "\n".join(
        f"  - {{ends: [g{i}, g{(i + 1) % p}], bandwidth: {bandwidth}, latency: {latency}{direction}}}"
        for i in range(p)
    )
    return parse_topology_text(f"name: ring{p}\ndevices:\n  - {{name: g, type: gpu, count: {p}}}\nlinks:\n{links}\n")


def _switched_hosts(name: str, hosts: int, gpus: int) -> list[str]:
    """The YAML lines up to ``links:`` of ``hosts`` hosts of ``gpus`` GPUs, each with an NVSwitch and a NIC
    (devices ``h<i>g<j>``, ``h<i>nvs``, ``h<i>nic``), and a switch ``tor``."""
    lines = [f"name: {name}", "devices:"]
    for h in range(hosts):
        lines += [f"  - {{name: h{h}g, type: gpu, count: {gpus}, host: h{h}}}",
                  f"  - {{name: h{h}nvs, type: nvswitch, host: h{h}}}",
                  f"  - {{name: h{h}nic, type: nic, host: h{h}}}"]
    return [*lines, "  - {name: tor, type: switch}", "links:"]


def two_chassis(gpus: int = 4) -> Topology:
    """An NDv2-like pair of hosts: NVLink inside (an NVSwitch here), one 100 Gbit/s NIC each, one switch."""
    lines = _switched_hosts("two-chassis", 2, gpus)
    for h in range(2):
        for g in range(gpus):
            lines += [f"  - {{ends: [h{h}g{g}, h{h}nvs], bandwidth: 150 GB/s, latency: 1 us}}",
                      f"  - {{ends: [h{h}g{g}, h{h}nic], bandwidth: 16 GB/s, latency: 1 us}}"]
        lines.append(f"  - {{ends: [h{h}nic, tor], bandwidth: 100 Gbit/s, latency: 2 us}}")
    return parse_topology_text("\n".join(lines) + "\n")


def ring_allreduce(p: int) -> Schedule:
    b = ScheduleBuilder("allreduce", ranks=p, input_chunks=p, output_chunks=p, inplace=True)
    for s in range(2 * (p - 1)):
        for r in range(p):
            c = (r - s) % p if s < p - 1 else (r + 1 - (s - p + 1)) % p
            b.transfer(r, (r + 1) % p, Chunk("o", c), Chunk("o", c), reduce=s < p - 1, step=s)
    return b.build("ring")


def ring_allgather(p: int) -> Schedule:
    b = ScheduleBuilder("allgather", ranks=p, input_chunks=1, output_chunks=p)
    for r in range(p):
        b.copy(r, Chunk("i", 0), Chunk("o", r))
    for s in range(p - 1):
        for r in range(p):
            c = (r - s) % p
            b.transfer(r, (r + 1) % p, Chunk("o", c), Chunk("o", c), step=s)
    return b.build("ring")


def hub_allreduce(p: int, chunks: int) -> Schedule:
    """Every rank streams its buffer to rank 0, which reduces and streams the result back, chunk by chunk."""
    b = ScheduleBuilder("allreduce", ranks=p, input_chunks=chunks, output_chunks=chunks, inplace=True,
                        scratch_chunks=chunks * (p - 1))
    last_send: list[int | None] = [None] * p
    for j in range(chunks):
        for r in range(1, p):
            previous = last_send[r]
            after = [previous] if previous is not None else []
            last_send[r] = b.send(r, 0, Chunk("o", j), after=after)
            scratch = Chunk("s", j * (p - 1) + r - 1)
            b.recv(0, r, scratch)
            b.reduce(0, scratch, Chunk("o", j))
        for r in range(1, p):
            b.transfer(0, r, Chunk("o", j), Chunk("o", j))
    return b.build("hub")


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_star_allreduce_bound_is_the_ring_volume(p: int) -> None:
    size = 1 << 30
    bound = lower_bound(star(p), "allreduce", size)
    assert bound.bandwidth_s == pytest.approx(2 * (p - 1) / p * size / (10 * GB), rel=1e-12)
    assert bound.latency_s == pytest.approx(2e-6)  # the last crossing message's path: GPU, switch, GPU
    assert bound.time_s == pytest.approx(bound.bandwidth_s + bound.latency_s)


def test_two_chassis_allgather_is_bound_by_the_nic() -> None:
    size = 10**9
    bound = lower_bound(two_chassis(), "allgather", size)
    assert size / bound.bandwidth_s == pytest.approx(25 * GB)  # half the data in through 12.5 GB/s each way
    assert "12.5 GB/s" in bound.cut and ("h0" in bound.cut or "h1" in bound.cut)
    assert bound.latency_s == pytest.approx(6e-6)  # GPU, NIC, switch, NIC, GPU: 1 + 2 + 2 + 1 us


@pytest.mark.parametrize("p", [3, 6])
def test_ring_topology_bounds(p: int) -> None:
    size = 6 * 10**8
    # a rank takes in (p-1)/p of the data over its two incoming links, half the ring takes in half over two
    both = lower_bound(ring(p), "allgather", size)
    assert both.bandwidth_s == pytest.approx((p - 1) / p / 2 * size / (10 * GB))
    one_way = lower_bound(ring(p, directed=True), "allgather", size)
    assert one_way.bandwidth_s == pytest.approx((p - 1) / p * size / (10 * GB))
    assert lower_bound(ring(p, directed=True), "reducescatter", size).bandwidth_s == pytest.approx(
        one_way.bandwidth_s)


def test_rooted_collectives_bind_at_the_root() -> None:
    size = 10**9
    topo = star(6, fast="40 GB/s")  # rank 0 fast, the others 10 GB/s
    # broadcast: every non-root rank must take in N; from root 3 its own uplink also carries N out
    assert lower_bound(topo, "broadcast", size, root=3).bandwidth_s == pytest.approx(size / (10 * GB))
    assert lower_bound(topo, "reduce", size, root=0).bandwidth_s == pytest.approx(size / (10 * GB))
    bound = lower_bound(star(6, bandwidth="40 GB/s", fast="10 GB/s"), "reduce", size, root=0)
    assert bound.cut == "rank 0 (g0): 10 GB/s in"
    assert bound.bandwidth_s == pytest.approx(size / (10 * GB))
    # latency: a line of GPUs, broadcast from one end must cross every hop
    line = ring(5, latency="2 us", directed=True)
    assert lower_bound(line, "broadcast", 1, root=0).time_s == pytest.approx(4 * 2e-6, rel=1e-6)
    assert lower_bound(line, "reduce", 1, root=0).time_s == pytest.approx(4 * 2e-6, rel=1e-6)
    assert "latency from rank 0 to rank 4" in lower_bound(line, "broadcast", 1, root=0).cut


def test_reducescatter_mirrors_allgather() -> None:
    # rank 0 has a fast link: allgather binds on what slow ranks take in, reducescatter on what they send
    topo = star(4, fast="100 GB/s")
    ag, rs = lower_bound(topo, "allgather", 10**9), lower_bound(topo, "reducescatter", 10**9)
    assert ag.bandwidth_s == pytest.approx(rs.bandwidth_s)
    assert ag.cut.endswith(" in") and rs.cut.endswith(" out")


def test_alltoall_and_trivial_cases() -> None:
    p, size = 8, 8 * 10**8
    assert lower_bound(star(p), "alltoall", size).bandwidth_s == pytest.approx((p - 1) / p * size / (10 * GB))
    assert lower_bound(star(p), "all-reduce", 0) == Bound(0.0, 0.0, 0.0, "nothing has to move")
    single = parse_topology_text("name: one\ndevices:\n  - {name: g0, type: gpu}\n")
    assert lower_bound(single, "allreduce", 1 << 20).time_s == 0.0
    with pytest.raises(UsageError, match="root 9"):
        lower_bound(star(4), "broadcast", 10, root=9)


# --------------------------------------------------------------------------- never above a real schedule


def _topologies() -> list[Topology]:
    return [ring(4), ring(5, directed=True), star(6), star(5, fast="100 GB/s"), two_chassis(2)]


@pytest.mark.parametrize("size", [64, 1 << 20, 1 << 30])
@pytest.mark.parametrize("index", range(5))
def test_bound_never_exceeds_a_simulated_ring(index: int, size: int) -> None:
    topo = _topologies()[index]
    p = topo.size
    for schedule in (ring_allreduce(p), ring_allgather(p)):
        sim = simulate(topo, schedule, size)
        bound = lower_bound(topo, schedule.collective, size)
        assert bound.time_s <= sim.time_s * (1 + 1e-9), (schedule.collective, bound, sim.time_s)
        assert bound.time_s > 0


def assert_no_algorithm_beats_the_bound(topology: Topology, collective: str, size: int,
                                        names: tuple[str, ...]) -> None:
    """Every algorithm of ``names`` that builds ``collective`` here simulates no faster than the bound."""
    net = Network(topology)
    bound = lower_bound(topology, collective, size).time_s
    for name in names:
        if collective not in ALGORITHMS[name].collectives:
            continue
        try:
            schedule = ALGORITHMS[name].load()(net, collective, Options(size_bytes=size))
        except NotApplicableError:
            continue
        assert bound <= simulate(topology, schedule, size).time_s * (1 + 1e-9), name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=topologies(max_hosts=3, max_gpus=4), data=st.data())
def test_bound_never_exceeds_any_algorithm(topology: Topology, data: st.DataObject) -> None:
    """The routed partition LP only tightens the bound, and relayed schedules (the drawn hosts whose NIC only
    GPU 0 reaches, and chassis joined GPU to GPU, need them) do not beat it either."""
    size = data.draw(st.sampled_from((1 << 16, 1 << 24, 1 << 30)))
    collective = data.draw(st.sampled_from(("allreduce", "allreduce", "allgather", "reducescatter")))
    assert_no_algorithm_beats_the_bound(topology, collective, size, (
        "ring", "tree", "halving-doubling", "direct", "hierarchical", "multitree", "treepack"))


@pytest.mark.parametrize("one_way", [True, False], ids=["one-way", "two-way"])
@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter"])
def test_bound_holds_on_a_multi_chassis_box(collective: str, one_way: bool) -> None:
    """Two chassis whose only links between them leave one GPU each: every algorithm relays, none beats the bound."""
    topology = parse_topology_text(chassis_yaml(2, 4, one_way=one_way))
    for size in (1 << 20, 64 << 20):
        assert_no_algorithm_beats_the_bound(topology, collective, size, tuple(ALGORITHMS))


def test_routes_bound_the_dgx1_below_its_link_capacity() -> None:
    """DGX-1: a GPU's PCIe link only carries messages from GPUs it has no NVLink to, which also cross the
    CPUs' interconnect; the routed LP sees that, so its 6-channel ring comes within a few percent."""
    topology = load_topology(TOPOLOGIES / "dgx1-v100.yaml")
    net = Network(topology)
    bound = lower_bound(topology, "allreduce", 1 << 30)
    assert "over the routes" in bound.cut
    sim = simulate(topology, ALGORITHMS["ring"].load()(net, "allreduce", Options(size_bytes=1 << 30)), 1 << 30)
    assert 0.95 <= bound.time_s / sim.time_s <= 1.0


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_routes_bound_every_rank_of_the_dgx1(collective: str) -> None:
    """All-gather (reduce-scatter) needs every rank to receive (send) (p-1)/p N at once; over the
    DGX-1's routes a GPU gets 150 GB/s of NVLink and a share of the 6 GB/s CPU interconnect, not the 16 GB/s
    of its PCIe link the cut counts, so the 6-channel ring is at 98.9% of the bound, not 90.4%."""
    topology = load_topology(TOPOLOGIES / "dgx1-v100.yaml")
    net = Network(topology)
    size = 256 << 20
    bound = lower_bound(topology, collective, size)
    assert "over the routes" in bound.cut
    assert bound.time_s == pytest.approx(size * 7 / 8 / 151.5e9, rel=1e-6)
    sim = simulate(topology, ALGORITHMS["ring"].load()(net, collective, Options(size_bytes=size)), size)
    assert 0.98 <= bound.time_s / sim.time_s <= 1.0


@pytest.mark.parametrize("routing", ["ecmp", "source"])
def test_the_routed_bound_allows_any_split_where_channels_choose_paths(routing: str) -> None:
    """Channels that ECMP hashes onto different paths carry 20:12 of each half: 32 GB/s each way, faster
    than spray's fixed halves allow (24 GB/s: b's 12 GB/s caps its half).  The bound must stay below it,
    so under ECMP and source routing the routed LP lets every pair split its bytes over its paths as it likes."""
    topo = two_paths(routing)
    net = Network(topo)
    via: dict[tuple[int, int, str], int] = {}  # (src, dst, first switch) -> a channel ECMP hashes there
    for src, dst in ((0, 1), (1, 0)):
        for channel in range(64):
            via.setdefault((src, dst, net.connection_paths(src, dst, channel)[0][0].dst), channel)
    b = ScheduleBuilder("allreduce", 2, 32, 32)
    for r in range(2):
        b.copy(r, Chunk("i", 0, 32), Chunk("o", 0, 32))
    for reduce in (True, False):  # reduce-scatter, then all-gather: rank r owns chunks 16 r .. 16 r + 15
        for r in range(2):
            src, dst = (1 - r, r) if reduce else (r, 1 - r)
            for start, count, switch in ((0, 10, "a"), (10, 6, "b")):
                piece = Chunk("o", 16 * r + start, count)
                b.transfer(src, dst, piece, piece, reduce=reduce, channel=via[(src, dst, switch)])
    schedule = b.build("steered")
    verify(schedule)
    size = 32 * 10**9
    sim = simulate(topo, schedule, size).time_s
    assert sim == pytest.approx(size / (32 * GB) + 4e-6, rel=1e-9)
    assert lower_bound(topo, "allreduce", size).time_s <= sim < size / (24 * GB)
    assert lower_bound(two_paths("spray"), "allreduce", size).time_s > sim  # a spray fabric cannot do this


def test_ring_on_a_directed_ring_meets_the_bandwidth_bound() -> None:
    p, size = 5, 1 << 30
    topo = ring(p, latency="0 us", directed=True)
    for schedule in (ring_allreduce(p), ring_allgather(p)):
        verify(schedule)
        sim = simulate(topo, schedule, size)
        assert lower_bound(topo, schedule.collective, size).time_s == pytest.approx(sim.time_s, rel=1e-9)


def test_allreduce_bound_stays_valid_when_one_rank_is_much_faster() -> None:
    # Slow ranks stream to a fast hub and back: about N/B (1 + 1/chunks), below 2(p-1)/p N/B,
    # the per-rank "twice the allgather" figure, which would therefore not be a valid bound here.
    p, size, chunks = 3, 1 << 30, 8
    topo = star(p, latency="0 us", fast="1000 GB/s")
    schedule = hub_allreduce(p, chunks)
    verify(schedule)
    sim = simulate(topo, schedule, size)
    bound = lower_bound(topo, "allreduce", size)
    assert sim.time_s < 2 * (p - 1) / p * size / (10 * GB)
    assert bound.time_s <= sim.time_s
    assert bound.bandwidth_s == pytest.approx(size / (10 * GB))


def test_a_rank_private_router_joins_its_group() -> None:
    # A ring of 4 routers, one GPU on each behind a 100 GB/s port, 25 GB/s between routers.  With each
    # router inside its GPU's group the partition bound is 2(4-1)N over the 8 directed router links,
    # above any single cut (N over a router's 2 links).
    devices = [Device(f"g{i}", "gpu") for i in range(4)] + [Device(f"r{i}", "switch") for i in range(4)]
    links: list[Link] = []
    for i in range(4):
        links += [Link(f"g{i}", f"r{i}", 100 * GB, 0.0), Link(f"r{i}", f"g{i}", 100 * GB, 0.0)]
        j = (i + 1) % 4
        links += [Link(f"r{i}", f"r{j}", 25 * GB, 0.0), Link(f"r{j}", f"r{i}", 25 * GB, 0.0)]
    size = 1 << 30
    bound = lower_bound(build_topology("square", devices, links), "allreduce", size)
    assert bound.bandwidth_s == pytest.approx(6 * size / (8 * 25 * GB))
    assert "nearest" in bound.cut


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_a_mesh_corner_binds_without_the_per_host_max_flow(collective: str) -> None:
    """A rank with its private router is one cut too: on mesh-8x8x8, too large for the per-host max-flow
    cuts, a corner's three 25 GB/s router links bound an all-gather, not its GPU's 100 GB/s port."""
    topology = grid("mesh", (8, 8, 8)).topology()
    size = 256 << 20
    bound = lower_bound(topology, collective, size)
    assert bound.bandwidth_s == pytest.approx(size * 511 / 512 / (75 * GB))
    assert "nearest" in bound.cut


# --------------------------------------------------------------------------- performance


def fat_tree(hosts: int = 128, gpus: int = 8, leaves: int = 32, spines: int = 16) -> Topology:
    """A 1024-GPU rail-less fat tree: NVSwitch per host, one 25 GB/s NIC per GPU, leaves and spines."""
    devices: list[Device] = []
    links: list[Link] = []

    def both(a: str, b: str, bandwidth: float) -> None:
        links.extend((Link(a, b, bandwidth, 1e-6), Link(b, a, bandwidth, 1e-6)))

    per_leaf = hosts // leaves
    for h in range(hosts):
        rack = f"rack{h // per_leaf}"
        devices += [Device(f"h{h}g{g}", "gpu", f"h{h}", rack) for g in range(gpus)]
        devices += [Device(f"h{h}nvs", "nvswitch", f"h{h}", rack)]
        for g in range(gpus):
            devices.append(Device(f"h{h}nic{g}", "nic", f"h{h}", rack))
            both(f"h{h}g{g}", f"h{h}nvs", 300 * GB)
            both(f"h{h}g{g}", f"h{h}nic{g}", 25 * GB)
            both(f"h{h}nic{g}", f"leaf{h // per_leaf}", 25 * GB)
    devices += [Device(f"leaf{i}", "switch", None, f"rack{i}") for i in range(leaves)]
    devices += [Device(f"spine{s}", "switch") for s in range(spines)]
    for i in range(leaves):
        for s in range(spines):
            both(f"leaf{i}", f"spine{s}", 100 * GB)
    return build_topology("fattree", devices, links)


def test_bounds_on_a_1024_rank_fat_tree() -> None:
    topo = fat_tree()
    assert len(topo.devices) > 2200
    bounds = {c: lower_bound(topo, c, 1 << 30) for c in COLLECTIVES}
    # a host's eight 25 GB/s NICs bind: all but its own 8/1024 of the data must enter through them
    assert bounds["allgather"].bandwidth_s == pytest.approx((1 - 8 / 1024) * (1 << 30) / (200 * GB))
    assert bounds["allreduce"].bandwidth_s == pytest.approx(2 * 127 / 128 * (1 << 30) / (200 * GB))
    assert bounds["allreduce"].latency_s == pytest.approx(4e-6)  # GPU, NIC, leaf, NIC, GPU at 1 us each


def test_cut_cache_does_not_keep_a_topology_alive() -> None:
    topo = star(3)
    lower_bound(topo, "allreduce", 1024)
    ref = weakref.ref(topo)
    del topo
    gc.collect()
    assert ref() is None


def test_the_max_flow_cuts_a_host_off_both_ways() -> None:
    """The per-host max-flow finds the cheapest device set around a host's ranks into it and out of it, each
    on its own: host h0 of three takes 50 GB/s in (at its NIC's switch port) and sends 10 GB/s out (its
    NVSwitch's one-way link to the NIC), which binds a reduce-scatter (the out cut was missed before)."""
    from topocc.planner.analysis.bounds import _CutFamily

    lines = _switched_hosts("narrow-out", 3, 2)
    for h in range(3):
        out = "10 GB/s" if h == 0 else "100 GB/s"
        lines += [f"  - {{ends: [h{h}g{g}, h{h}nvs], bandwidth: 100 GB/s, latency: 1 us}}" for g in range(2)]
        lines += [f"  - {{ends: [h{h}nvs, h{h}nic], bandwidth: {out}, latency: 1 us, direction: forward}}",
                  f"  - {{ends: [h{h}nic, h{h}nvs], bandwidth: 100 GB/s, latency: 1 us, direction: forward}}",
                  f"  - {{ends: [h{h}nic, tor], bandwidth: 50 GB/s, latency: 1 us}}"]
    topology = parse_topology_text("\n".join(lines) + "\n")
    net = Network(topology)
    cut = {c.label: c for c in _CutFamily(net).cuts}["min cut out of host h0 (2 ranks)"]
    assert cut.ranks == frozenset({0, 1}) and cut.cap_out == pytest.approx(10 * GB)
    size = 60 << 20
    bound = lower_bound(topology, "reducescatter", size)
    assert bound.cut.startswith("min cut out of host h0")
    assert bound.bandwidth_s == pytest.approx(size * 4 / 6 / (10 * GB))  # the sums of the others' 4 blocks
