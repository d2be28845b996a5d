"""Cluster templates (``cluster:``): what each fabric, PCIe tree, NIC and network expands into, and the errors."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from topocc.planner.errors import TopologyError
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.planner.topology.templates import HYBRID_CUBE_MESH_LANES

NVSWITCH_HOST = {"gpus": 4, "fabric": "nvswitch",
                 "gpu_link": {"bandwidth": "25 GB/s", "count": 12, "latency": "0.35 us"}}
NIC = {"bandwidth": "200 Gbit/s", "latency": "0.5 us", "attach_bandwidth": "32 GB/s"}


def build(cluster: dict[str, Any], **top: Any) -> Topology:
    """Parse a topology made of ``cluster`` (plus any other top-level keys)."""
    return parse_topology_text(yaml.safe_dump({"name": "t", "cluster": cluster, **top}), "t.yaml")


def undirected(topo: Topology, prefix: str) -> set[frozenset[str]]:
    """Full-duplex links between devices whose names start with ``prefix``."""
    return {frozenset((ln.src, ln.dst)) for ln in topo.links if ln.src.startswith(prefix) and ln.dst.startswith(prefix)}


def check_template(topo: Topology, hosts: int, gpus: int) -> None:
    """Invariants of any expanded cluster: rank order, host labels, full-duplex template links."""
    assert topo.ranks == tuple(f"h{h}.gpu{i}" for h in range(hosts) for i in range(gpus))
    assert topo.hosts == {f"h{h}": tuple(range(h * gpus, (h + 1) * gpus)) for h in range(hosts)}
    for d in topo.devices:
        assert (d.host == d.name.split(".")[0]) if "." in d.name else d.host is None
    for ln in topo.links:
        back = topo.link(ln.dst, ln.src)
        assert back is not None and back.bandwidth == ln.bandwidth and ln.bandwidth > 0


# --------------------------------------------------------------------------- fabrics


def test_nvswitch_host_and_rank_order() -> None:
    topo = build({"hosts": 2, "host": {**NVSWITCH_HOST, "nics": 2, "nic": NIC},
                  "network": {"type": "single-switch"}})
    check_template(topo, 2, 4)
    up = topo.link("h1.gpu3", "h1.nvsw0")
    assert up is not None and (up.bandwidth, up.count, up.latency, up.kind) == (300e9, 12, 0.35e-6, "nvlink")
    assert topo.device("h1.nvsw0").kind == "nvswitch"
    assert topo.rank_of("h1.gpu2") == 6


def test_fully_connected() -> None:
    topo = build({"hosts": 1, "host": {"gpus": 5, "fabric": "fully-connected", "gpu_link": {"bandwidth": "10 GB/s"}}})
    check_template(topo, 1, 5)
    assert undirected(topo, "h0.gpu") == {frozenset((f"h0.gpu{a}", f"h0.gpu{b}"))
                                          for a, b in itertools.combinations(range(5), 2)}


def test_hybrid_cube_mesh_table() -> None:
    """Each V100 of a DGX-1 has 6 NVLink lanes; the table is symmetric by construction (pairs a < b)."""
    lanes = dict.fromkeys(range(8), 0)
    for (a, b), n in HYBRID_CUBE_MESH_LANES.items():
        assert a < b and n in (1, 2)
        lanes[a] += n
        lanes[b] += n
    assert lanes == dict.fromkeys(range(8), 6)


def test_hybrid_cube_mesh_count_comes_from_the_table() -> None:
    with pytest.raises(TopologyError, match="unknown key 'count' in gpu_link"):
        build({"hosts": 1, "host": {"gpus": 8, "fabric": "hybrid-cube-mesh",
                                    "gpu_link": {"bandwidth": "25 GB/s", "count": 2}}})


def test_fabric_none_rejects_gpu_link() -> None:
    with pytest.raises(TopologyError, match="gpu_link is not used by fabric none"):
        build({"hosts": 1, "host": {"gpus": 2, "fabric": "none", "gpu_link": {"bandwidth": "1 GB/s"}}})


# --------------------------------------------------------------------------- PCIe


PCIE_HOST = {"gpus": 8, "fabric": "pcie-tree",
             "pcie": {"bandwidth": "16 GB/s", "latency": "1 us", "gpus_per_switch": 2, "cpus": 2,
                      "uplink": {"bandwidth": "32 GB/s"}, "cpu_link": {"bandwidth": "6 GB/s", "latency": "1 us"}}}


def test_pcie_tree() -> None:
    topo = build({"hosts": 1, "host": PCIE_HOST})
    net = Network(topo)
    check_template(topo, 1, 8)
    assert topo.link("h0.gpu5", "h0.pcie2").bandwidth == 16e9  # type: ignore[union-attr]
    assert topo.link("h0.pcie1", "h0.cpu0").bandwidth == 32e9  # type: ignore[union-attr]
    assert topo.link("h0.pcie2", "h0.cpu1") is not None and topo.link("h0.pcie2", "h0.cpu0") is None
    assert topo.link("h0.cpu0", "h0.cpu1").kind == "qpi"  # type: ignore[union-attr]
    (path,) = net.routes(0, 7)
    assert [ln.dst for ln in path] == ["h0.pcie0", "h0.cpu0", "h0.cpu1", "h0.pcie3", "h0.gpu7"]
    assert net.route_bandwidth(0, 7) == pytest.approx(6e9)
    assert net.route_bandwidth(0, 1) == pytest.approx(16e9)  # same switch


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus_per_switch": 3}, "gpus_per_switch: 3 does not divide gpus: 8"),
        ({"cpus": 3}, "cpus: 3 does not divide the 4 PCIe switches"),
        ({"cpu_link": None}, "cpus: 2 needs cpu_link"),
        ({"cpus": 1}, "cpu_link needs cpus: 2 or more"),
        ({"bandwidth": "0 GB/s"}, "bandwidth must be positive"),
        ({"gpus_per_swich": 2}, "did you mean 'gpus_per_switch'"),
    ],
)
def test_pcie_errors(change: dict[str, Any], message: str) -> None:
    pcie = {k: v for k, v in {**PCIE_HOST["pcie"], **change}.items() if v is not None}  # type: ignore[dict-item]
    with pytest.raises(TopologyError, match=message.replace("(", r"\(")):
        build({"hosts": 1, "host": {**PCIE_HOST, "pcie": pcie}})


def test_pcie_tree_needs_pcie() -> None:
    with pytest.raises(TopologyError, match="fabric pcie-tree needs pcie:"):
        build({"hosts": 1, "host": {"gpus": 2, "fabric": "pcie-tree"}})


# --------------------------------------------------------------------------- NICs


def nic_ends(topo: Topology, nic: str) -> set[str]:
    return {ln.src for ln in topo.links if ln.dst == nic and topo.device(ln.src).kind != "switch"}


@pytest.mark.parametrize(
    ("attach", "nic0", "nic1"),
    [
        ("gpu", {"h0.gpu0", "h0.gpu1", "h0.gpu2", "h0.gpu3"}, {"h0.gpu4", "h0.gpu5", "h0.gpu6", "h0.gpu7"}),
        ("pcie", {"h0.pcie0", "h0.pcie1"}, {"h0.pcie2", "h0.pcie3"}),
        ("cpu", {"h0.cpu0"}, {"h0.cpu1"}),
        ("cpu1", {"h0.cpu1"}, {"h0.cpu1"}),
    ],
)
def test_nic_attach(attach: str, nic0: set[str], nic1: set[str]) -> None:
    host = {**PCIE_HOST, "nics": 2, "nic": {**NIC, "attach": attach}}
    topo = build({"hosts": 2, "host": host, "network": {"type": "single-switch"}})
    check_template(topo, 2, 8)
    assert nic_ends(topo, "h0.nic0") == nic0
    assert nic_ends(topo, "h0.nic1") == nic1
    attach_link = topo.link(sorted(nic0)[0], "h0.nic0")
    assert attach_link is not None and attach_link.bandwidth == 32e9 and attach_link.kind == "pcie"


def test_nic_defaults() -> None:
    """``nic:`` alone means one NIC; attach defaults to the GPUs without PCIe, and to the port's bandwidth."""
    topo = build({"hosts": 2, "host": {"gpus": 2, "nic": {"bandwidth": "100 Gbit/s"}},
                  "network": {"type": "single-switch"}})
    assert nic_ends(topo, "h1.nic0") == {"h1.gpu0", "h1.gpu1"}
    assert topo.link("h1.gpu0", "h1.nic0").bandwidth == 12.5e9  # type: ignore[union-attr]
    port = topo.link("h1.nic0", "sw0")
    assert port is not None and port.kind == "ib" and port.bandwidth == 12.5e9


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({"gpus": 8, "nics": 3, "nic": NIC}, "nics: 3 does not divide gpus: 8"),
        ({"gpus": 8, "nics": 2}, "nics: 2 needs nic:"),
        ({"gpus": 8, "nics": 0, "nic": NIC}, "nic: is given but nics: is 0"),
        ({"gpus": 8, "nic": {**NIC, "attach": "cpu"}}, "attach: cpu needs pcie: under host"),
        ({"gpus": 8, "nic": {**NIC, "attach": "gpus"}}, "unknown NIC attach point 'gpus' (fix: did you mean 'gpu'?)"),
        ({"gpus": 8, "nic": {**NIC, "count": 2}}, "unknown key 'count' in nic"),
    ],
)
def test_nic_errors(host: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError) as info:
        build({"hosts": 2, "host": host, "network": {"type": "single-switch"}})
    assert message in str(info.value)


# --------------------------------------------------------------------------- networks


def test_single_switch() -> None:
    topo = build({"hosts": 3, "host": {"gpus": 1, "nic": NIC}, "network": {"type": "single-switch"}})
    assert {ln.src for ln in topo.links if ln.dst == "sw0"} == {"h0.nic0", "h1.nic0", "h2.nic0"}
    assert topo.link("h0.nic0", "sw0").latency == pytest.approx(0.5e-6)  # type: ignore[union-attr]


def test_fat_tree() -> None:
    net = {"type": "fat-tree", "hosts_per_leaf": 2, "spines": 3, "oversubscription": "3:2", "latency": "2 us"}
    topo = build({"hosts": 6, "host": {**NVSWITCH_HOST, "nics": 2, "nic": NIC}, "network": net})
    check_template(topo, 6, 4)
    assert {ln.src for ln in topo.links if ln.dst == "leaf1"} == {"h2.nic0", "h2.nic1", "h3.nic0", "h3.nic1",
                                                                  "spine0", "spine1", "spine2"}
    uplinks = [ln for ln in topo.links if ln.src == "leaf0" and ln.dst.startswith("spine")]
    assert len(uplinks) == 3
    # 4 down-ports of 25 GB/s, 3:2 oversubscribed, over 3 spines
    assert all(ln.bandwidth == pytest.approx(4 * 25e9 / 1.5 / 3) and ln.latency == 2e-6 for ln in uplinks)
    assert topo.racks == {f"rack{r}": tuple(range(8 * r, 8 * r + 8)) for r in range(3)}
    assert topo.device("leaf2").rack == "rack2" and topo.device("h5.nic1").rack == "rack2"


def test_fat_tree_single_leaf_has_no_spine() -> None:
    topo = build({"hosts": 4, "host": {"gpus": 1, "nic": NIC}, "network": {"type": "fat-tree", "hosts_per_leaf": 4}})
    assert [d.name for d in topo.devices if d.kind == "switch"] == ["leaf0"]


def test_fat_tree_last_leaf_may_be_partly_filled() -> None:
    """10 hosts, 4 per leaf: the third leaf serves 2, with a full leaf's uplinks (its ports are there)."""
    topo = build({"hosts": 10, "host": {"gpus": 1, "nic": NIC},
                  "network": {"type": "fat-tree", "hosts_per_leaf": 4, "spines": 2}})
    net = Network(topo)
    assert {ln.src for ln in topo.links if ln.dst == "leaf2"} == {"h8.nic0", "h9.nic0", "spine0", "spine1"}
    up = {ln.dst: ln.bandwidth for ln in topo.links if ln.src == "leaf2"}
    assert up["spine0"] == up["spine1"] == pytest.approx(4 * 25e9 / 2)
    assert [len(r) for r in topo.racks.values()] == [4, 4, 2]
    assert all(net.has_route(a, b) for a in range(10) for b in range(10) if a != b)


def test_hosts_per_rack_overrides_leaves() -> None:
    topo = build({"hosts": 4, "hosts_per_rack": 1, "host": {"gpus": 1, "nic": NIC},
                  "network": {"type": "fat-tree", "hosts_per_leaf": 2}})
    assert list(topo.racks) == ["rack0", "rack1", "rack2", "rack3"]


def test_rail_optimized_without_spines() -> None:
    """Rails alone: GPUs on different rails of different hosts have no GPU-free route."""
    topo = build({"hosts": 2, "host": {**NVSWITCH_HOST, "nics": 4, "nic": NIC}, "network": {"type": "rail-optimized"}})
    net = Network(topo)
    check_template(topo, 2, 4)
    assert {ln.src for ln in topo.links if ln.dst == "rail2"} == {"h0.nic2", "h1.nic2"}
    assert net.has_route(0, 4 + 0) and not net.has_route(0, 4 + 1)
    assert net.has_route(0, 1)  # inside the host, through the NVSwitch


def test_rail_optimized_spines() -> None:
    net = {"type": "rail-optimized", "spines": 2, "oversubscription": 2}
    topo = build({"hosts": 4, "host": {**NVSWITCH_HOST, "nics": 4, "nic": NIC}, "network": net})
    topo_net = Network(topo)
    up = [ln for ln in topo.links if ln.src == "rail3" and ln.dst.startswith("spine")]
    assert len(up) == 2 and all(ln.bandwidth == pytest.approx(4 * 25e9 / 2 / 2) for ln in up)
    assert all(topo_net.has_route(0, b) for b in range(1, 16))


def test_rail_optimized_scalable_units_under_spines() -> None:
    """Units of two hosts, each with its own rails (a rack); every rail under every spine."""
    net = {"type": "rail-optimized", "hosts_per_rail": 2, "spines": 2}
    topo = build({"hosts": 4, "host": {**NVSWITCH_HOST, "nics": 2, "nic": NIC}, "network": net})
    check_template(topo, 4, 4)
    assert {ln.src for ln in topo.links if ln.dst == "su1-rail0"} == {"h2.nic0", "h3.nic0", "spine0", "spine1"}
    assert topo.racks == {"rack0": tuple(range(8)), "rack1": tuple(range(8, 16))}
    assert topo.device("su1-rail0").rack == "rack1"
    # a rail's uplinks carry its two hosts' NIC ports, split over the spines
    up = [ln for ln in topo.links if ln.src == "su0-rail1" and ln.dst.startswith("spine")]
    assert len(up) == 2 and all(ln.bandwidth == pytest.approx(2 * 25e9 / 2) for ln in up)
    assert all(Network(topo).has_route(0, b) for b in range(1, 16))


def test_rail_optimized_three_tiers() -> None:
    """Two pods of two units: pod spines join the pod's rails, cores join every pod spine."""
    net = {"type": "rail-optimized", "hosts_per_rail": 1, "hosts_per_pod": 2, "spines": 2, "cores": 4,
           "oversubscription": 2, "core_oversubscription": "4:1"}
    topo = build({"hosts": 4, "host": {**NVSWITCH_HOST, "nics": 2, "nic": NIC}, "network": net})
    check_template(topo, 4, 4)
    names = {d.name for d in topo.devices if d.kind == "switch"}
    assert names == {f"su{u}-rail{r}" for u in range(4) for r in range(2)} | {
        f"pod{p}-spine{s}" for p in range(2) for s in range(2)} | {f"core{c}" for c in range(4)}
    # pod 1's spines sit above units 2 and 3 only
    assert {ln.src for ln in topo.links if ln.dst == "pod1-spine0"} == {
        "su2-rail0", "su2-rail1", "su3-rail0", "su3-rail1", "core0", "core1", "core2", "core3"}
    rail_up = topo.link("su0-rail0", "pod0-spine1")
    assert rail_up is not None and rail_up.bandwidth == pytest.approx(25e9 / 2 / 2)
    # a pod spine takes 4 rails' uplinks (4 x 6.25 GB/s), a quarter of it up, split over 4 cores
    core_up = topo.link("pod0-spine0", "core3")
    assert core_up is not None and core_up.bandwidth == pytest.approx(4 * 6.25e9 / 4 / 4)
    route = Network(topo).routes(0, 12)[0]
    assert [ln.dst for ln in route][1:-2] == ["su0-rail0", "pod0-spine0", "core0", "pod1-spine0", "su3-rail0"]


def test_the_shipped_three_tier_cluster_counts() -> None:
    """rail-65536: the figures its comment gives (256 units of 8 rails, 16 pods of 32 spines, 32 cores)."""
    from topocc.planner.topology.catalogue import resolve_topology

    topo = resolve_topology("rail-65536")
    assert topo.size == 65536 and len(topo.racks) == 256
    switches = [d.name for d in topo.devices if d.kind == "switch"]
    assert len(switches) == 256 * 8 + 16 * 32 + 32
    leaf_up = topo.link("su255-rail7", "pod15-spine31")
    core_up = topo.link("pod15-spine31", "core31")
    assert leaf_up is not None and leaf_up.bandwidth == pytest.approx(50e9)  # 32 x 400G over 32 spines
    assert core_up is not None and core_up.bandwidth == pytest.approx(128 * 50e9 / 32)  # non-blocking


def grid_edges(dims: list[int], wrap: bool) -> int:
    """Router-router links of a mesh or torus, counted independently of the template code."""
    hosts = 1
    for d in dims:
        hosts *= d
    total = 0
    for d in dims:
        per_line = d if wrap and d > 2 else d - 1
        total += hosts // d * per_line
    return total


@pytest.mark.parametrize("dims", [[4, 4], [2, 3], [8], [2, 2, 2], [3, 1, 2], [1]])
@pytest.mark.parametrize("kind", ["torus", "mesh"])
def test_grid_networks(dims: list[int], kind: str) -> None:
    hosts = 1
    for d in dims:
        hosts *= d
    net = {"type": kind, "dims": dims, "link": {"bandwidth": "25 GB/s", "latency": "0.5 us"}}
    topo = build({"hosts": hosts, "host": {"gpus": 1, "nic": NIC}, "network": net})
    check_template(topo, hosts, 1)
    assert len(undirected(topo, "r")) == grid_edges(dims, kind == "torus")
    for h in range(hosts):
        assert topo.link(f"h{h}.nic0", f"r{h}") is not None and topo.device(f"r{h}").kind == "switch"


@pytest.mark.parametrize(("kind", "hops"), [("mesh", 6), ("torus", 2)])
def test_grid_corner_to_corner(kind: str, hops: int) -> None:
    """Row-major layout: host 15 sits at (3, 3); the torus wraps around, the mesh does not."""
    net = {"type": kind, "dims": [4, 4], "link": {"bandwidth": "25 GB/s", "latency": "0.5 us"}}
    topo = build({"hosts": 16, "host": {"gpus": 1, "nic": NIC}, "network": net})
    topo_net = Network(topo)
    path = topo_net.routes(0, 15)[0]
    assert sum(1 for ln in path if ln.src.startswith("r") and ln.dst.startswith("r")) == hops
    assert topo.link("r0", "r3") is (None if kind == "mesh" else topo.link("r0", "r3"))
    assert (topo.link("r0", "r12") is None) == (kind == "mesh")


@pytest.mark.parametrize(
    ("network", "message"),
    [
        ({"type": "torus", "dims": [4, 3], "link": {"bandwidth": "1 GB/s"}},
         "dims [4, 3] hold 12 hosts, but hosts: 16"),
        ({"type": "torus", "dims": [4, 0], "link": {"bandwidth": "1 GB/s"}}, "dims must be a list of whole numbers"),
        ({"type": "mesh", "dims": "4x4", "link": {"bandwidth": "1 GB/s"}}, "dims must be a list of whole numbers"),
        ({"type": "mesh", "dims": [4, 4]}, "a mesh network needs link:"),
        ({"type": "fat-tree"}, "missing hosts_per_leaf"),
        ({"type": "fat-tree", "hosts_per_leaf": 4, "oversubscription": 0}, "oversubscription must be a positive"),
        ({"type": "fat-tree", "hosts_per_leaf": 4, "oversubscription": "2:0"}, "oversubscription must be a positive"),
        ({"type": "rail-optimized", "oversubscription": 2}, "oversubscription needs spines: 1 or more"),
        ({"type": "rail-optimized", "hosts_per_rail": 3}, "hosts_per_rail 3 does not divide hosts: 16"),
        ({"type": "rail-optimized", "hosts_per_rail": 2, "hosts_per_pod": 5, "cores": 1},
         "hosts_per_pod 5 must be a multiple of hosts_per_rail 2"),
        ({"type": "rail-optimized", "hosts_per_rail": 2, "hosts_per_pod": 8}, "2 pods need cores to join them"),
        ({"type": "rail-optimized", "hosts_per_rail": 2, "cores": 2}, "cores applies to pods, and all hosts are one"),
        ({"type": "rail-optimized", "hosts_per_rail": 2, "core_oversubscription": 2},
         "core_oversubscription applies to pods"),
        ({"type": "rail-optimized", "hosts_per_pod": 8, "cores": 1}, "pods are made of scalable units"),
        ({"type": "rail-optimized", "hosts_per_rail": 2, "hosts_per_pod": 8, "cores": 0},
         "cores must be a whole number >= 1"),
        ({"type": "single-switch", "spines": 2}, "unknown key 'spines' in network (single-switch)"),
        ({"type": "none"}, "16 hosts cannot share network type none"),
        ({"type": "ring"}, "unknown network type 'ring'"),
        ({"hosts_per_leaf": 4}, "missing type"),
        ("fat-tree", "network must be a mapping"),
    ],
)
def test_network_errors(network: Any, message: str) -> None:
    with pytest.raises(TopologyError) as info:
        build({"hosts": 16, "host": {"gpus": 1, "nic": NIC}, "network": network})
    assert message in str(info.value)


def test_network_needs_nics() -> None:
    with pytest.raises(TopologyError, match="joins hosts through NICs, but each host has none"):
        build({"hosts": 2, "host": {"gpus": 1}, "network": {"type": "single-switch"}})


# --------------------------------------------------------------------------- extra devices, links, explicit parts


MINSKY = """\
name: minsky
cluster:
  hosts: 2
  host:
    gpus: 2
    devices:
      - {name: cpu, type: cpu, count: 2}
    links:
      - {ends: [gpu0, cpu0], bandwidth: 40 GB/s, kind: nvlink}
      - {ends: [gpu1, cpu1], bandwidth: 40 GB/s, kind: nvlink}
      - {ends: [cpu0, cpu1], bandwidth: 38.4 GB/s, kind: xbus}
    nic: {bandwidth: 10 GB/s, attach: cpu0}
  network: {type: single-switch}
devices:
  - {name: storage, type: switch}
links:
  - {ends: [storage, sw0], bandwidth: 50 GB/s}
"""


def test_host_extra_devices_links_and_explicit_sections() -> None:
    topo = parse_topology_text(MINSKY, "minsky.yaml")
    net = Network(topo)
    check_template(topo, 2, 2)
    assert topo.device("h1.cpu1").host == "h1" and topo.device("h1.cpu1").kind == "cpu"
    assert topo.link("h1.cpu0", "h1.cpu1").kind == "xbus"  # type: ignore[union-attr]
    assert nic_ends(topo, "h1.nic0") == {"h1.cpu0"}
    assert topo.link("storage", "sw0") is not None and topo.device("storage").host is None
    (path,) = net.routes(1, 2)
    assert [ln.dst for ln in path] == ["h0.cpu1", "h0.cpu0", "h0.nic0", "sw0", "h1.nic0", "h1.cpu0", "h1.gpu0"]


@pytest.mark.parametrize(
    ("old", "new", "message", "line"),
    [
        ("ends: [gpu1, cpu1]", "ends: [gpu1, cpu7]", "host link names unknown local device 'cpu7'", 10),
        ("ends: [gpu1, cpu1]", "ends: [gpu1, h0.cpu1]", "host link names unknown local device 'h0.cpu1'", 10),
        ("{name: cpu, type: cpu, count: 2}", "{name: gpu, type: cpu, count: 1}", "clashes with a generated name", 7),
        ("{name: cpu, type: cpu, count: 2}", "{name: cpu, type: gpu, count: 2}", "GPUs of a host come from gpus:", 7),
        ("{name: cpu, type: cpu, count: 2}", "{name: cpu, type: cpux, count: 2}", "did you mean 'cpu'?", 7),
        ("{name: cpu, type: cpu, count: 2}", "{name: cpu, type: cpu, host: h9}", "unknown key 'host' in a host device",
         7),
        ("attach: cpu0", "attach: cpu9", "unknown NIC attach point 'cpu9' (fix: did you mean 'cpu'?)", 12),
        ("{name: storage, type: switch}", "{name: h0.gpu1, type: gpu}", "duplicate device name 'h0.gpu1'", 15),
        ("ends: [storage, sw0]", "ends: [storage, sw1]", "link names unknown device 'sw1'", 17),
        ("ends: [storage, sw0]", "ends: [h0.nic0, sw0]", "link h0.nic0 -> sw0 is declared twice", 17),
        ("hosts: 2", "hosts: two", "hosts must be a whole number >= 1, got 'two'", 3),
        ("gpus: 2", "gpus: 2.5", "gpus must be a whole number >= 1, got 2.5", 5),
        ("host:\n", "hosts_per_rak: 1\n  host:\n", "unknown key 'hosts_per_rak' in cluster (fix: did you mean", 4),
    ],
)
def test_template_errors_point_at_the_line(old: str, new: str, message: str, line: int) -> None:
    assert old in MINSKY
    with pytest.raises(TopologyError) as info:
        parse_topology_text(MINSKY.replace(old, new, 1), "minsky.yaml")
    text = str(info.value)
    assert message in text and text.startswith(f"minsky.yaml:{line}:"), text


def test_host_link_duplicating_a_generated_link() -> None:
    text = MINSKY.replace("kind: xbus}", "kind: xbus}\n      - {ends: [nic0, cpu0], bandwidth: 1 GB/s}")
    with pytest.raises(TopologyError, match="host link nic0 -> cpu0 already exists"):
        parse_topology_text(text)


def test_single_host_needs_no_network_but_several_do() -> None:
    host = {"gpus": 2, "fabric": "fully-connected", "gpu_link": {"bandwidth": "1 GB/s"}}
    assert build({"hosts": 1, "host": host}).size == 2
    with pytest.raises(TopologyError, match="2 hosts need a network"):
        build({"hosts": 2, "host": host})


def test_too_large() -> None:
    with pytest.raises(TopologyError, match="too large a model"):
        build({"hosts": 400_000, "host": {**NVSWITCH_HOST, "nics": 4, "nic": NIC},
               "network": {"type": "single-switch"}})
    with pytest.raises(TopologyError, match="too many links"):
        build({"hosts": 1, "host": {"gpus": 5000, "fabric": "fully-connected", "gpu_link": {"bandwidth": "1 GB/s"}}})


def test_cluster_must_be_a_mapping() -> None:
    with pytest.raises(TopologyError, match=r"^t\.yaml:2: cluster must be a mapping, got a list"):
        parse_topology_text("name: t\ncluster: [1, 2]\n", "t.yaml")


def test_defaults_apply_to_template_links() -> None:
    topo = build({"hosts": 2, "host": {"gpus": 2, "fabric": "fully-connected", "gpu_link": {}, "nic": {}},
                  "network": {"type": "single-switch"}}, defaults={"bandwidth": "3 GB/s", "latency": "4 us"})
    for ln in topo.links:
        assert (ln.bandwidth, ln.latency) == (3e9, 4e-6)


# --------------------------------------------------------------------------- property


@settings(max_examples=60, deadline=None)
@given(
    hosts=st.integers(1, 6),
    gpus=st.sampled_from([1, 2, 4, 8]),
    fabric=st.sampled_from(["nvswitch", "fully-connected", "pcie-tree", "none"]),
    nics=st.sampled_from([1, 2, 4, 8]),
    network=st.sampled_from(["single-switch", "fat-tree", "rail-optimized", "torus", "mesh"]),
)
def test_any_valid_cluster_expands(hosts: int, gpus: int, fabric: str, nics: int, network: str) -> None:
    """Every valid combination loads, with hosts x gpus ranks in host order and every rank reachable."""
    nics = min(nics, gpus)
    host: dict[str, Any] = {"gpus": gpus, "fabric": fabric, "nics": nics, "nic": NIC}
    if fabric in ("nvswitch", "fully-connected"):
        host["gpu_link"] = {"bandwidth": "25 GB/s"}
    if fabric == "pcie-tree":
        host["pcie"] = {"bandwidth": "16 GB/s", "gpus_per_switch": 1}
    net: dict[str, Any] = {"type": network}
    if network == "fat-tree":
        net["hosts_per_leaf"] = 1 if hosts % 2 else 2
    if network in ("torus", "mesh"):
        net |= {"dims": [hosts], "link": {"bandwidth": "25 GB/s"}}
    if network == "rail-optimized" and fabric == "none":
        net["spines"] = 1  # otherwise GPUs of different rails share no device at all
    topo = build({"hosts": hosts, "host": host, "network": net})
    check_template(topo, hosts, gpus)
    assert len([d for d in topo.devices if d.kind == "nic"]) == hosts * nics
