"""nvidia-smi topo -m import on samples in the real format (tests/data/nvidia_smi)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import existing_link
from topocc.planner.errors import TopologyError
from topocc.planner.formats.nvidia_smi import convert_nvidia_smi, import_nvidia_smi
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text

DATA = Path(__file__).resolve().parents[2] / "data" / "nvidia_smi"
DGX1_LANES = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
              (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}


def load(name: str, **options: object) -> Topology:
    return parse_topology_text(import_nvidia_smi(DATA / name, **options), name)  # type: ignore[arg-type]


def kinds(topo: Topology, kind: str) -> list[str]:
    return [d.name for d in topo.devices if d.kind == kind]


@pytest.mark.parametrize(("name", "ranks", "nics", "cpus"), [
    ("dgx1_v100.txt", 8, 4, 2), ("dgx1_v100_spaces.txt", 8, 4, 2), ("dgx1_p100_old_driver.txt", 8, 4, 2),
    ("dgx2.txt", 16, 8, 2), ("dgx_a100.txt", 8, 10, 5), ("h100_sxm.txt", 8, 8, 2),
])
def test_samples_load_with_their_ranks(name: str, ranks: int, nics: int, cpus: int) -> None:
    topo = load(name)
    net = Network(topo)
    assert topo.size == ranks
    assert len(kinds(topo, "nic")) == nics
    assert len(kinds(topo, "cpu")) == cpus
    assert all(net.has_route(0, r) for r in range(1, ranks))
    assert len(topo.hosts) == 1


@pytest.mark.parametrize("name", ["dgx1_v100.txt", "dgx1_v100_spaces.txt"])
def test_dgx1_cube_mesh_lanes(name: str) -> None:
    topo = load(name)
    assert not kinds(topo, "nvswitch")
    for a in range(8):
        for b in range(8):
            link = topo.link(f"gpu{a}", f"gpu{b}")
            want = DGX1_LANES.get((min(a, b), max(a, b)))
            if want is None:
                assert link is None
            else:
                assert link is not None and link.count == want and link.bandwidth == pytest.approx(want * 25e9)


def test_space_padded_copy_gives_the_same_topology() -> None:
    assert load("dgx1_v100.txt").fingerprint == load("dgx1_v100_spaces.txt").fingerprint


@pytest.mark.parametrize(("name", "lanes"), [("dgx2.txt", 6), ("dgx_a100.txt", 12), ("h100_sxm.txt", 18)])
def test_switched_systems_get_an_nvswitch(name: str, lanes: int) -> None:
    topo = load(name)
    net = Network(topo)
    assert kinds(topo, "nvswitch") == ["nvswitch"]
    for g in kinds(topo, "gpu"):
        link = topo.link(g, "nvswitch")
        assert link is not None and link.count == lanes
    assert net.route_bandwidth(0, 1) == pytest.approx(lanes * 25e9)


def test_nvswitch_rule_can_be_overridden_and_bandwidths_set() -> None:
    topo = load("dgx_a100.txt", nvswitch=False, nvlink_bandwidth="20 GB/s", pcie_bandwidth="24 GB/s")
    assert not kinds(topo, "nvswitch")
    nvlink = existing_link(topo, "gpu0", "gpu5")
    assert nvlink.count == 12 and nvlink.bandwidth == pytest.approx(240e9)
    assert {ln.bandwidth for ln in topo.links if ln.kind == "pcie"} == {24e9}


def test_dgx_a100_nic_legend_names_and_numa() -> None:
    result = convert_nvidia_smi(DATA / "dgx_a100.txt")
    topo = parse_topology_text(result.yaml)
    assert kinds(topo, "nic") == [f"mlx5_{i}" for i in range(10)]
    # GPU0/1 and NIC0/1 share a PCIe switch; GPU2 sits under another CPU
    assert topo.link("gpu0", "cpu0_sw0") and topo.link("mlx5_0", "cpu0_sw0") and topo.link("gpu2", "cpu1_sw0")
    assert any("NV12" in n for n in result.notes)


def test_old_driver_soc_is_read_as_sys() -> None:
    result = convert_nvidia_smi(DATA / "dgx1_p100_old_driver.txt")
    topo = parse_topology_text(result.yaml)
    assert any("SOC" in n for n in result.notes)
    assert topo.link("cpu0", "cpu1") is not None and existing_link(topo, "gpu0", "gpu4").count == 1
    assert topo.link("gpu0", "gpu5") is None


def test_text_input_and_two_gpu_bridge_is_direct() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV12\t0-7\nGPU1\tNV12\t X \t0-7\n\nLegend:\n"
    topo = parse_topology_text(import_nvidia_smi(text))
    assert topo.size == 2 and existing_link(topo, "gpu0", "gpu1").count == 12


HEADER = "\tGPU0\tGPU1\tCPU Affinity\n"


@pytest.mark.parametrize(("text", "pattern"), [
    ("Legend:\n  X = Self\n", "no header row"),
    ("\tNIC0\tNIC1\nNIC0\t X \tPIX\nNIC1\tPIX\t X \n", "no header row"),
    (HEADER + "GPU0\t X \tNV1\t0-7\nGPU1\tNV1\n", r":3: ragged row"),
    (HEADER + "GPU0\t X \tNV1\t0-7\nGPU1\tQPI\t X \t0-7\n", r":3: unknown cell 'QPI' in column GPU0"),
    (HEADER + "GPU0\t X \tNV1\t0-7\nGPU1\tNV2\t X \t0-7\n", "GPU0-GPU1 is NV1 but GPU1-GPU0 is NV2"),
    (HEADER + "GPU0\t X \tNV1\t0-7\n", "1 rows for 2 header columns"),
    (HEADER + "GPU1\t X \tNV1\t0-7\nGPU0\tNV1\t X \t0-7\n", r":2: row 'GPU1' where the header says 'GPU0'"),
    (HEADER + "GPU0\tNV1\tNV1\t0-7\nGPU1\tNV1\t X \t0-7\n", "'X' belongs on the diagonal"),
])
def test_malformed_tables_give_one_line_errors(text: str, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern) as info:
        import_nvidia_smi(text)
    assert "\n" not in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(TopologyError, match="no such file"):
        import_nvidia_smi(DATA / "absent.txt")
