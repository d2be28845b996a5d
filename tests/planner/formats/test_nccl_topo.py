"""NCCL topology XML import: the cloud reference files and full-dump fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import existing_link
from topocc.planner.errors import TopologyError
from topocc.planner.formats.nccl_topo import convert_nccl_topo, import_nccl_topo, pcie_bandwidth
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text

REF = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "nccl-topo"
DATA = Path(__file__).resolve().parents[2] / "data" / "nccl_topo"
needs_ref = pytest.mark.skipif(not REF.is_dir(), reason=f"reference NCCL topology files not found at {REF}")


def load(path: Path) -> Topology:
    return parse_topology_text(import_nccl_topo(path), path.name)


def kinds(topo: Topology, kind: str) -> list[str]:
    return [d.name for d in topo.devices if d.kind == kind]


@needs_ref
@pytest.mark.parametrize(("name", "gpus", "nics", "cpus", "switches"), [
    ("azure-ndv2-topo.xml", 8, 1, 2, 0), ("azure-ndv4-topo.xml", 8, 8, 4, 4), ("azure-ndv5-topo.xml", 8, 8, 2, 8),
    ("azure-ncv4-topo.xml", 4, 1, 4, 0), ("aws-p4d-24xl-topo.xml", 8, 4, 2, 4),
])
def test_cloud_files_import_as_pci_trees(name: str, gpus: int, nics: int, cpus: int, switches: int) -> None:
    result = convert_nccl_topo(REF / name)
    topo = parse_topology_text(result.yaml, name)
    net = Network(topo)
    assert topo.size == gpus
    assert (len(kinds(topo, "nic")), len(kinds(topo, "cpu")), len(kinds(topo, "pcie"))) == (nics, cpus, switches)
    assert all(net.has_route(0, r) for r in range(1, gpus))
    assert not kinds(topo, "nvswitch") and not any(ln.kind == "nvlink" for ln in topo.links)
    assert any("NVLink" in n for n in result.notes)


@needs_ref
def test_p4d_gpus_and_nic_share_switches() -> None:
    topo = load(REF / "aws-p4d-24xl-topo.xml")
    net = Network(topo)
    # GPU 0, GPU 1 and NIC 0 sit behind the first switch, at 8 GT/s x16
    assert existing_link(topo, "gpu0", "pcie0").bandwidth == pytest.approx(pcie_bandwidth("8 GT/s", 16))
    assert topo.link("gpu1", "pcie0") and topo.link("nic0", "pcie0")
    assert net.route_latency(0, 4) > net.route_latency(0, 1)  # across sockets costs more hops


@needs_ref
def test_ncv4_defaults_are_reported() -> None:
    result = convert_nccl_topo(REF / "azure-ncv4-topo.xml")
    assert any("link speed missing" in n for n in result.notes)
    assert any("NVLink to itself ignored" in n for n in result.notes)
    assert result.yaml.startswith("# ")


def test_pcie_bandwidth_units() -> None:
    assert pcie_bandwidth("16.0 GT/s PCIe", 16) == pytest.approx(31.5e9, rel=1e-3)
    assert pcie_bandwidth("8 GT/s", 16) == pytest.approx(15.75e9, rel=1e-3)
    assert pcie_bandwidth("5 GT/s", 8) == pytest.approx(4e9)


def test_full_dump_with_nvswitch_and_nics() -> None:
    topo = load(DATA / "dgx_a100_dump.xml")
    net = Network(topo)
    assert topo.size == 4 and kinds(topo, "nvswitch") == ["nvswitch"]
    for g in kinds(topo, "gpu"):
        assert existing_link(topo, g, "nvswitch").count == 12  # six NVSwitches x 2 lanes, merged
    assert net.route_bandwidth(0, 3) == pytest.approx(300e9)
    # the NIC's link is capped by its port speed (200 Gb/s = 25 GB/s)
    assert existing_link(topo, "nic0", "pcie0").bandwidth == pytest.approx(25e9)


def test_invisible_nvswitch_target() -> None:
    result = convert_nccl_topo(DATA / "vm_nvswitch_dump.xml")
    topo = parse_topology_text(result.yaml)
    assert existing_link(topo, "gpu0", "nvswitch").count == 18
    assert existing_link(topo, "nic0", "cpu0").bandwidth == pytest.approx(12.5e9)  # speed 100000 Mb/s
    assert "nic0 is eth0" in result.notes


def test_direct_nvlinks_keep_their_lane_counts() -> None:
    topo = load(DATA / "dgx1_dump.xml")
    lanes = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2}
    for (a, b), k in lanes.items():
        assert existing_link(topo, f"gpu{a}", f"gpu{b}").count == k
        assert existing_link(topo, f"gpu{b}", f"gpu{a}").bandwidth == pytest.approx(k * 25e9)


@pytest.mark.parametrize(("text", "pattern"), [
    ('<!DOCTYPE system [<!ENTITY x "y">]><system version="1"/>', "DOCTYPE"),
    ("<algo/>", "not <system>"),
    ('<system version="2"><cpu/></system>', "unsupported <system version='2'>"),
    ('<system version="1"><cpu numaid="0"/></system>', "no GPUs"),
    ('<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0"/></cpu></system>', "no readable class"),
    ('<system version="1"><cpu>', "invalid XML"),
])
def test_malformed_files(tmp_path: Path, text: str, pattern: str) -> None:
    path = tmp_path / "topo.xml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=pattern) as info:
        import_nccl_topo(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
