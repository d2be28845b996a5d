"""The topology model: the shipped files, the explicit format, the malformed corpus, and a fuzz test."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topocc.planner.errors import TopologyError
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import ROUTING_MODES, Topology
from topocc.planner.topology.parse import load_topology, parse_topology_text
from topocc.runtime.errors import TopoccError

ROOT = Path(__file__).resolve().parents[3]
TOPOLOGIES = ROOT / "topologies"
BAD = ROOT / "tests" / "data" / "bad_topologies"

#: file -> (ranks, hosts, racks)
SHIPPED = {
    "dgx1-v100.yaml": (8, 1, 1),
    "ndv2-2chassis.yaml": (16, 2, 2),
    "dgx2.yaml": (16, 1, 1),
    "dgx2-2chassis.yaml": (32, 2, 2),
    "dgx-a100-4node.yaml": (32, 4, 4),
    "ibm-s822lc-48x4.yaml": (192, 48, 3),
    "pcie-4x4-10gbe.yaml": (16, 4, 4),
    "torus-4x4.yaml": (16, 16, 16),
    "mesh-4x4.yaml": (16, 16, 16),
    "mesh-4x4x4.yaml": (64, 64, 64),
    "fattree-1024.yaml": (1024, 128, 32),
    "fattree-16384.yaml": (16384, 2048, 256),
    "rail-65536.yaml": (65536, 8192, 256),
    "emu-uniform.yaml": (8, 4, 4),
    "emu-racks.yaml": (12, 6, 3),
}


def load(name: str) -> Topology:
    return load_topology(TOPOLOGIES / name)


def check_invariants(topo: Topology) -> None:
    """What every loaded topology must satisfy, whatever file it came from."""
    names = {d.name for d in topo.devices}
    assert len(names) == len(topo.devices)
    assert topo.ranks == tuple(d.name for d in topo.devices if d.kind == "gpu")
    pairs = [(ln.src, ln.dst) for ln in topo.links]
    assert len(set(pairs)) == len(pairs)
    for link in topo.links:
        assert link.src in names and link.dst in names and link.src != link.dst
        assert link.bandwidth > 0 and link.latency >= 0 and link.count >= 1
    assert sorted(r for group in topo.hosts.values() for r in group) == list(range(topo.size))
    assert sorted(r for group in topo.racks.values() for r in group) == list(range(topo.size))


def allgather_cut_bandwidth(topo: Topology, groups: dict[str, tuple[int, ...]]) -> float:
    """Algorithmic bandwidth bound of allgather from the cuts around each group of ranks.

    Every rank outside a group holds 1/N of the output, all of which must enter the group, so a
    message of M bytes takes at least ``M * (N - |S|) / N / bw_in(S)``.
    """
    n = topo.size
    worst = 0.0
    for ranks in groups.values():
        inside = {topo.ranks[r] for r in ranks}
        members = {d.name for d in topo.devices if d.host == topo.device(next(iter(inside))).host} | inside
        bw_in = sum(ln.bandwidth for ln in topo.links if ln.dst in members and ln.src not in members)
        worst = max(worst, (n - len(ranks)) / n / bw_in)
    return 1.0 / worst


# --------------------------------------------------------------------------- shipped files


def test_every_shipped_file_is_listed() -> None:
    assert sorted(p.name for p in TOPOLOGIES.glob("*.yaml")) == sorted(SHIPPED)


@pytest.mark.parametrize(("name", "expected"), sorted(SHIPPED.items()))
def test_shipped_loads(name: str, expected: tuple[int, int, int]) -> None:
    topo = load(name)
    check_invariants(topo)
    assert (topo.size, len(topo.hosts), len(topo.racks)) == expected
    assert topo.name == name.removesuffix(".yaml")
    assert topo.description


def test_dgx1_lanes() -> None:
    topo = load("dgx1-v100.yaml")
    for gpu in topo.ranks:
        nvlinks = [ln for ln in topo.links if ln.src == gpu and ln.kind == "nvlink"]
        assert sum(ln.count for ln in nvlinks) == 6, gpu
        assert all(ln.bandwidth == 25e9 * ln.count for ln in nvlinks)
    assert topo.link("h0.gpu0", "h0.gpu3").count == 2  # type: ignore[union-attr]
    assert topo.link("h0.gpu0", "h0.gpu5") is None


def test_ndv2_nvlink_matrix() -> None:
    topo = load("ndv2-2chassis.yaml")
    for gpu in topo.ranks:
        out = [ln for ln in topo.links if ln.src == gpu and ln.kind == "nvlink"]
        assert sum(ln.bandwidth for ln in out) == pytest.approx(150e9), gpu
        for ln in out:
            back = topo.link(ln.dst, ln.src)
            assert back is not None and back.bandwidth == ln.bandwidth
            assert ln.latency == pytest.approx(0.7e-6)


def test_ndv2_inter_chassis_links_one_way() -> None:
    topo = load("ndv2-2chassis.yaml")
    net = Network(topo)
    cross = sorted((ln.src, ln.dst) for ln in topo.links if ln.src[:2] != ln.dst[:2])
    assert cross == [("c0.gpu0", "c1.gpu1"), ("c1.gpu0", "c0.gpu1")]
    for src, dst in cross:
        link = topo.link(src, dst)
        assert link is not None and link.bandwidth == pytest.approx(12.5e9) and link.latency == pytest.approx(1.3e-6)
        assert topo.link(dst, src) is None
    assert net.has_route(0, 9) and net.has_route(8, 1)
    assert not net.has_route(9, 0) and not net.has_route(1, 8) and not net.has_route(0, 8)
    # inside a chassis only NVLink neighbours are direct (no switch, no PCIe)
    assert not net.has_route(0, 5) and net.has_route(0, 4)


def test_ndv2_allgather_cut_bound() -> None:
    """TE-CCL's NDv2 pair is limited by 12.5 GB/s each way: 1 GB allgather is bounded at 25 GB/s."""
    topo = load("ndv2-2chassis.yaml")
    assert allgather_cut_bandwidth(topo, topo.hosts) == pytest.approx(25e9)
    bounds = pytest.importorskip("topocc.planner.analysis.bounds")
    assert 1e9 / bounds.lower_bound(topo, "allgather", 10**9).bandwidth_s == pytest.approx(25e9)


def leaf_ratio(topo: Topology, leaf: str) -> float:
    down = sum(ln.bandwidth for ln in topo.links if ln.dst == leaf and topo.device(ln.src).kind == "nic")
    up = sum(ln.bandwidth for ln in topo.links if ln.src == leaf and ln.dst.startswith("spine"))
    return down / up


@pytest.mark.parametrize(
    ("name", "ratio"), [("fattree-1024.yaml", 2), ("emu-racks.yaml", 4), ("ibm-s822lc-48x4.yaml", 1)]
)
def test_fat_tree_oversubscription(name: str, ratio: float) -> None:
    topo = load(name)
    leaves = [d.name for d in topo.devices if d.name.startswith("leaf")]
    assert leaves
    for leaf in leaves:
        assert leaf_ratio(topo, leaf) == pytest.approx(ratio)


def test_fattree_1024_shape() -> None:
    topo = load("fattree-1024.yaml")
    switches = [d.name for d in topo.devices if d.kind == "switch"]
    assert len([s for s in switches if s.startswith("leaf")]) == 32
    assert len([s for s in switches if s.startswith("spine")]) == 16
    ports = [ln for ln in topo.links if ln.src == "leaf0"]
    assert len(ports) == 32 + 16  # 32 NIC down-ports, one up-port per spine
    assert {ln.bandwidth for ln in ports} == {25e9}
    assert topo.rank_device(8 * 5 + 3).name == "h5.gpu3"


def test_groupings() -> None:
    a100 = load("dgx-a100-4node.yaml")
    assert a100.hosts == {f"h{h}": tuple(range(8 * h, 8 * h + 8)) for h in range(4)}
    ibm = load("ibm-s822lc-48x4.yaml")
    assert ibm.racks == {f"rack{r}": tuple(range(64 * r, 64 * r + 64)) for r in range(3)}
    emu = load("emu-racks.yaml")
    assert emu.racks == {"rack0": (0, 1, 2, 3), "rack1": (4, 5, 6, 7), "rack2": (8, 9, 10, 11)}
    ndv2 = load("ndv2-2chassis.yaml")
    assert ndv2.hosts == {"c0": tuple(range(8)), "c1": tuple(range(8, 16))}


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_stable_and_sensitive() -> None:
    text = (TOPOLOGIES / "dgx2.yaml").read_text()
    first = parse_topology_text(text, "a.yaml").fingerprint
    assert parse_topology_text(text, "b.yaml").fingerprint == first
    assert load("dgx2.yaml").fingerprint == first
    renamed = text.replace("name: dgx2", "name: something-else")
    assert renamed != text and parse_topology_text(renamed).fingerprint == first
    faster = text.replace("bandwidth: 25 GB/s", "bandwidth: 26 GB/s")
    assert faster != text and parse_topology_text(faster).fingerprint != first
    slower_hop = text.replace("latency: 0.35 us", "latency: 0.4 us")
    assert parse_topology_text(slower_hop).fingerprint != first


# --------------------------------------------------------------------------- routing


def grid(kind: str, dims: list[int], routing: str | None = None) -> Topology:
    """One GPU per host, a router per host in a torus or mesh of ``dims`` (fast NIC ports, 25 GB/s grid links)."""
    hosts = 1
    for d in dims:
        hosts *= d
    extra = f", routing: {routing}" if routing else ""
    return parse_topology_text(f"""
name: {kind}
cluster:
  hosts: {hosts}
  host: {{gpus: 1, nic: {{bandwidth: 100 GB/s, latency: 0 us}}}}
  network: {{type: {kind}, dims: {dims}, link: {{bandwidth: 25 GB/s, latency: 1 us}}{extra}}}
""")


def two_paths(routing: str, via_a: tuple[int, int] = (20, 20), via_b: tuple[int, int] = (12, 60)) -> Topology:
    """Two GPUs joined through switch a and through switch b, the GB/s of the hop in and the hop out given.

    The default figures cost the same to route (1/20 + 1/20 = 1/12 + 1/60), so both paths are cheapest,
    but b's bottleneck is narrower.
    """
    return parse_topology_text(f"""
name: two-paths
routing: {routing}
devices: [{{name: g, type: gpu, count: 2}}, {{name: a, type: switch}}, {{name: b, type: switch}}]
links:
  - {{ends: [g0, a], bandwidth: {via_a[0]} GB/s, latency: 1 us}}
  - {{ends: [a, g1], bandwidth: {via_a[1]} GB/s, latency: 1 us}}
  - {{ends: [g0, b], bandwidth: {via_b[0]} GB/s, latency: 1 us}}
  - {{ends: [b, g1], bandwidth: {via_b[1]} GB/s, latency: 1 us}}
""")


def test_routing_defaults_follow_the_network_type() -> None:
    assert load("torus-4x4.yaml").routing == load("mesh-4x4.yaml").routing == "dimension-order"
    for name in ("dgx-a100-4node.yaml", "pcie-4x4-10gbe.yaml", "dgx1-v100.yaml", "emu-racks.yaml"):
        assert load(name).routing == "ecmp", name
    assert load("fattree-1024.yaml").routing == "spray"  # its network says so: InfiniBand, adaptive routing
    assert parse_topology_text(EXPLICIT).routing == "ecmp"
    assert grid("torus", [2, 2], "spray").routing == "spray"
    spray = (TOPOLOGIES / "torus-4x4.yaml").read_text() + "routing: spray\n"
    assert parse_topology_text(spray).routing == "spray"
    agreeing = (TOPOLOGIES / "torus-4x4.yaml").read_text().replace("dims: [4, 4]", "dims: [4, 4]\n    routing: source")
    assert parse_topology_text(agreeing + "routing: source\n").routing == "source"


def test_fingerprint_covers_routing() -> None:
    """Spray keeps the fingerprint topologies had before they had a routing; every mode differs."""
    text = (TOPOLOGIES / "dgx2.yaml").read_text()
    prints = {mode: parse_topology_text(f"{text}routing: {mode}\n").fingerprint
              for mode in ("spray", "ecmp", "source")}
    assert prints["spray"] == "f2a8610c7942ac888513bb7bbdb26cee19cf3edc68eaecf1d73112b30d41c6eb"
    assert len(set(prints.values())) == 3
    assert load("dgx2.yaml").fingerprint == prints["ecmp"]


def test_explicit_links_may_carry_a_dimension() -> None:
    topo = parse_topology_text("""
name: labelled
routing: dimension-order
devices: [{name: g, type: gpu, count: 2}, {name: r, type: switch, count: 2}]
links:
  - {ends: [g0, r0], bandwidth: 10 GB/s}
  - {ends: [g1, r1], bandwidth: 10 GB/s}
  - {ends: [r0, r1], bandwidth: 10 GB/s, dim: 2}
""")
    assert (topo.link("r0", "r1").dim, topo.link("r0", "r1").ascending) == (2, True)  # type: ignore[union-attr]
    assert (topo.link("r1", "r0").dim, topo.link("r1", "r0").ascending) == (2, False)  # type: ignore[union-attr]
    assert topo.link("g0", "r0").dim is None  # type: ignore[union-attr]


# --------------------------------------------------------------------------- explicit format


EXPLICIT = """
name: explicit
defaults: {latency: 2 us}
devices:
  - {name: gpu, type: gpu, count: 2, host: a, rack: r}
  - {name: sw, type: switch}
links:
  - {ends: [gpu0, sw], bandwidth: 10 GB/s, count: 3, kind: nvlink}
  - {ends: [gpu1, sw], bandwidth: 20 GB/s, latency: 1 us}
  - {ends: [gpu0, gpu1], bandwidth: 1 GB/s, direction: forward}
"""


def test_explicit_format() -> None:
    topo = parse_topology_text(EXPLICIT)
    net = Network(topo)
    check_invariants(topo)
    assert topo.ranks == ("gpu0", "gpu1")
    assert topo.device("gpu1").host == "a" and topo.device("gpu1").rack == "r"
    up = topo.link("gpu0", "sw")
    assert up is not None and (up.bandwidth, up.count, up.latency, up.kind) == (30e9, 3, 2e-6, "nvlink")
    assert topo.link("gpu1", "sw").latency == pytest.approx(1e-6)  # type: ignore[union-attr]
    assert topo.link("gpu0", "gpu1") is not None and topo.link("gpu1", "gpu0") is None
    # gpu0 -> gpu1: the 1 GB/s direct link costs more than the switch for a 1 MiB reference message
    assert [ln.dst for ln in net.routes(0, 1)[0]] == ["sw", "gpu1"]


def test_defaults_bandwidth() -> None:
    topo = parse_topology_text(
        "name: d\ndefaults: {bandwidth: 5 GB/s}\ndevices: [{name: g, type: gpu, count: 2}]\nlinks: [{ends: [g0, g1]}]"
    )
    assert topo.link("g0", "g1").bandwidth == 5e9  # type: ignore[union-attr]


def test_examples_in_the_format_doc_load() -> None:
    doc = (ROOT / "docs" / "topology-format.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        check_invariants(parse_topology_text(block, "doc.yaml"))


def test_missing_file() -> None:
    with pytest.raises(TopologyError, match="no such file"):
        load_topology(ROOT / "topologies" / "does-not-exist.yaml")


# --------------------------------------------------------------------------- malformed corpus

EXPECTED = yaml.safe_load((BAD / "expected.yaml").read_text())


def test_corpus_is_complete() -> None:
    assert sorted(p.name for p in BAD.glob("*.yaml") if p.name != "expected.yaml") == sorted(EXPECTED)
    assert len(EXPECTED) >= 18


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_topology(name: str) -> None:
    path = BAD / name
    marker = Path("/tmp/topocc-bad-topology-executed")  # python-tag.yaml would create it if tags ran code
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert not marker.exists()
    assert isinstance(info.value, TopoccError)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert EXPECTED[name]["contains"] in message
    if "line" in EXPECTED[name]:
        assert f"{path}:{EXPECTED[name]['line']}:" in message
    else:
        assert not re.search(re.escape(str(path)) + r":\d", message)


def test_bad_text_names_its_source() -> None:
    with pytest.raises(TopologyError, match=r"^inline\.yaml:2: unknown key 'linkz'"):
        parse_topology_text("name: x\nlinkz: []\n", "inline.yaml")


# --------------------------------------------------------------------------- fuzz

KEYS = ["name", "description", "defaults", "routing", "dim", "devices", "links", "cluster", "type", "count", "ends",
        "bandwidth",
        "latency", "direction", "host", "rack", "hosts", "gpus", "fabric", "gpu_link", "pcie", "nics", "nic",
        "network", "dims", "link", "hosts_per_leaf", "spines", "oversubscription", "attach", "gpus_per_switch",
        "cpus", "cpu_link", "uplink", "kind", "hosts_per_rack", "attach_bandwidth"]
WORDS = ["gpu", "gpu0", "gpu1", "cpu0", "nic0", "sw", "switch", "nvswitch", "none", "torus", "mesh", "fat-tree",
         "single-switch", "rail-optimized", "hybrid-cube-mesh", "fully-connected", "pcie-tree", "pcie", "forward",
         "both", "25 GB/s", "200 Gbit/s", "0 GB/s", "-1 GB/s", "fast", "0.7 us", "1 ms", "2:1", "", *ROUTING_MODES]
SCALARS = st.one_of(st.sampled_from(WORDS), st.integers(-3, 12), st.none(), st.booleans(),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=25,
)


def parses_or_topocc_error(text: str) -> None:
    try:
        topo = parse_topology_text(text, "fuzz.yaml")
    except TopoccError as exc:
        assert "\n" not in str(exc)
    else:
        check_invariants(topo)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_random_text(text: str) -> None:
    parses_or_topocc_error(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), DOCS, max_size=6))
def test_fuzz_yamlish_documents(doc: dict[str, object]) -> None:
    parses_or_topocc_error(yaml.safe_dump(doc, default_flow_style=None))


#: The files that load in milliseconds (the large clusters take seconds a load).
SHIPPED_TEXTS = sorted((TOPOLOGIES / name).read_text() for name, (ranks, _, _) in SHIPPED.items() if ranks <= 256)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SHIPPED_TEXTS), st.integers(0, 10_000), st.integers(0, 40), st.text(max_size=6))
def test_fuzz_mutated_shipped_files(text: str, at: int, cut: int, insert: str) -> None:
    """Real files with a slice replaced: near misses are the inputs users actually produce."""
    at %= len(text)
    parses_or_topocc_error(text[:at] + insert + text[at + cut:])


def test_python_tags_do_not_run() -> None:
    marker = Path(f"/tmp/topocc-fuzz-{os.getpid()}")
    text = f"name: !!python/object/apply:os.system ['touch {marker}']\ndevices: []\n"
    with pytest.raises(TopologyError):
        parse_topology_text(text)
    assert not marker.exists()


def test_symmetric_means_every_link_has_an_equal_reverse() -> None:
    assert load("dgx1-v100.yaml").symmetric
    assert load("fattree-1024.yaml").symmetric
    assert not load("ndv2-2chassis.yaml").symmetric  # one-way links between the chassis


def test_reversed_turns_every_link_round_and_keeps_the_routing() -> None:
    """The reversed fabric (a gather timed on it is the reduction it mirrors) keeps the routing mode, and a
    full-duplex fabric is its own reverse."""
    from benchmarks.fabrics import grid, multi_chassis

    one_way = multi_chassis(2, 8, "one-way").topology().with_routing("spray")
    back = one_way.reversed()
    assert back.routing == "spray"
    assert {(k.src, k.dst, k.bandwidth) for k in back.links} == {(k.dst, k.src, k.bandwidth) for k in one_way.links}
    assert back.ranks == one_way.ranks
    torus = grid("torus", (4, 4)).topology()
    assert torus.reversed() is torus
