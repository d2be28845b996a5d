"""Figures implausible for their link are loaded with one warning each, naming the place and the reading; the
shipped files have none."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from topocc.planner.cli import main
from topocc.planner.errors import TopoccWarning
from topocc.planner.topology.catalogue import shipped_topologies
from topocc.planner.topology.parse import load_topology, parse_topology_text
from topocc.planner.topology.plausible import gpu_fabric

EXPLICIT = """\
name: nvswitch-box
defaults: {latency: 0.7 us}
devices:
  - {name: gpu, type: gpu, count: 2, host: a}
  - {name: sw, type: nvswitch, host: a}
  - {name: nic, type: nic, host: a}
  - {name: tor, type: switch}
links:
  - {ends: [gpu0, sw], bandwidth: 300 GB/s}
  - {ends: [gpu1, sw], bandwidth: 300 GB/s, latency: 0.7 ms}
  - {ends: [gpu0, nic], bandwidth: 300 MB/s, kind: pcie}
  - {ends: [gpu1, nic], bandwidth: 32 GB/s, kind: pcie}
  - {ends: [nic, tor], bandwidth: 50 GB/s, latency: 20 ms}
"""

TEMPLATE = """\
name: nvlink-hosts
defaults: {latency: 0.5 ms}
cluster:
  hosts: 2
  host:
    gpus: 4
    fabric: fully-connected
    gpu_link: {bandwidth: 300 MB/s, count: 4}
    nics: 2
    nic: {bandwidth: 100 Gbit/s, latency: 2 us, attach_bandwidth: 32 GB/s}
  network: {type: single-switch}
"""


def warned(text: str, name: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parse_topology_text(text, name)
    assert all(issubclass(w.category, TopoccWarning) for w in caught)
    return [str(w.message) for w in caught]


def test_explicit_links_warn_where_the_figure_is_written_with_the_reading() -> None:
    assert warned(EXPLICIT, "box.yaml") == [
        "box.yaml:10: links[1].latency: 0.7 ms is read as 700 us: over 100 us for an NVLink/NVSwitch hop, which "
        "takes about 1 us (check its unit)",
        "box.yaml:13: links[4].latency: 20 ms is read as 20 ms: over 10 ms for a link, where a network hop takes "
        "microseconds (check its unit)",
    ]  # a PCIe link at 300 MB/s is slow but possible: no word


def test_template_figures_and_defaults_warn_once_at_their_place() -> None:
    messages = warned(TEMPLATE, "hosts.yaml")
    assert messages[0] == ("hosts.yaml:8: cluster.host.gpu_link.bandwidth: 300 MB/s is read as 300 MB/s: under "
                           "1 GB/s for an NVLink/NVSwitch lane, which carries 20-50 GB/s (check its unit)")
    assert messages[1].startswith("hosts.yaml:2: defaults.latency: 0.5 ms is read as 500 us: over 100 us for an "
                                  "NVLink/NVSwitch hop")
    assert len(messages) == 2  # the 12 fabric links of each host share the one defaults line


def test_a_gpu_fabric_link_is_told_by_kind_or_by_its_ends() -> None:
    assert gpu_fabric("nvlink") and gpu_fabric("NVLink4") and gpu_fabric("xgmi") and not gpu_fabric("pcie")
    assert gpu_fabric("", ("gpu", "nvswitch")) and gpu_fabric("", ("gpu", "gpu"))
    assert not gpu_fabric("", ("gpu", "switch")) and not gpu_fabric("shm", ("gpu", "gpu"))


@pytest.mark.parametrize("name", sorted(shipped_topologies()))
def test_shipped_topologies_are_plausible(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", TopoccWarning)
        load_topology(shipped_topologies()[name])


def test_the_cli_prints_each_warning_as_one_line_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "box.yaml"
    path.write_text(EXPLICIT)
    for _ in range(2):  # each run says it again
        assert main(["topo", "show", str(path)]) == 0
        out, err = capsys.readouterr()
        lines = err.splitlines()
        assert len(lines) == 2 and all(line.startswith(f"topocc: warning: {path}:") for line in lines)
        assert "0.7 ms is read as 700 us" in lines[0] and "nvswitch-box: 2 ranks" in out
