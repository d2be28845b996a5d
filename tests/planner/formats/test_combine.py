"""Joining copies of one imported host into a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import existing_link
from topocc.planner.errors import TopologyError
from topocc.planner.formats.combine import combine_hosts
from topocc.planner.formats.nvidia_smi import import_nvidia_smi
from topocc.planner.routing.network import Network
from topocc.planner.topology.parse import parse_topology_text

DATA = Path(__file__).resolve().parents[2] / "data" / "nvidia_smi"


@pytest.fixture(scope="module")
def a100() -> str:
    return import_nvidia_smi(DATA / "dgx_a100.txt")


def test_single_switch(a100: str) -> None:
    topo = parse_topology_text(combine_hosts(a100, 3, {"type": "switch", "bandwidth": "25 GB/s"}))
    net = Network(topo)
    assert topo.size == 24 and len(topo.hosts) == 3
    assert topo.device("h2.gpu7").host == "h2" and topo.ranks[8] == "h1.gpu0"
    assert existing_link(topo, "h0.mlx5_0", "switch").bandwidth == pytest.approx(25e9)
    assert net.route_bandwidth(0, 1) == pytest.approx(300e9)  # inside a host: NVSwitch
    assert net.has_route(0, 23)


def test_rail_optimised(a100: str) -> None:
    topo = parse_topology_text(combine_hosts(a100, 2, "type: rail\nlatency: 2 us"))
    rails = [d.name for d in topo.devices if d.kind == "switch"]
    assert rails == [f"rail{j}" for j in range(10)]
    assert existing_link(topo, "h1.mlx5_3", "rail3").latency == pytest.approx(2e-6)
    assert topo.link("h1.mlx5_3", "rail2") is None


def test_fat_tree_with_oversubscription(a100: str) -> None:
    net = {"type": "fat_tree", "hosts_per_leaf": 2, "spines": 2, "oversubscription": 4, "bandwidth": "25 GB/s"}
    topo = parse_topology_text(combine_hosts(a100, 5, net))
    topo_net = Network(topo)
    assert len(topo.racks) == 3 and topo.device("h4.gpu0").rack == "r2"
    # leaf 0 carries 2 hosts x 10 NICs x 25 GB/s, over 4:1 and two spines
    assert existing_link(topo, "leaf0", "spine1").bandwidth == pytest.approx(2 * 10 * 25e9 / 4 / 2)
    assert existing_link(topo, "leaf2", "spine0").bandwidth == pytest.approx(10 * 25e9 / 4 / 2)
    assert topo_net.has_route(0, topo.size - 1)


def test_default_port_speed_is_the_nic_link(a100: str) -> None:
    topo = parse_topology_text(combine_hosts(a100, 2, None))
    assert existing_link(topo, "h0.mlx5_0", "switch").bandwidth == pytest.approx(32e9)


@pytest.mark.parametrize(("network", "pattern"), [
    ({"type": "torus"}, "unknown network type"),
    ({"speed": 1}, "unknown network key"),
    ({"bandwidth": "fast"}, "not a bandwidth"),
    ("{bandwidth: 100}", r"100 has no unit \(fix: write it with one, e.g. 100GB/s or 800Gb/s\)"),
    ({"type": "fat_tree", "spines": 0}, "spines must be a positive"),
    ("- a\n- b\n", "must be a mapping"),
])
def test_bad_networks(a100: str, network: object, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        combine_hosts(a100, 2, network)  # type: ignore[arg-type]


def test_host_without_nics_cannot_be_joined() -> None:
    text = "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n"
    with pytest.raises(TopologyError, match="no NIC"):
        combine_hosts(import_nvidia_smi(text), 2)
    with pytest.raises(TopologyError, match="hosts must be"):
        combine_hosts(import_nvidia_smi(text), 0)
