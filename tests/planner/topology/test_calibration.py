"""The ``calibration:`` block: parsed, applied per link class, written back, refused when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from topocc.planner.errors import TopologyError
from topocc.planner.topology.calibration import (
    calibration_yaml,
    datasheet_topology,
    link_classes_of,
    strip_calibration,
)
from topocc.planner.topology.catalogue import resolve_topology, shipped_topologies
from topocc.planner.topology.parse import parse_topology_text

EMU = Path(shipped_topologies()["emu-racks"]).read_text()

BLOCK = """
calibration:
  measured: "2026-11-29T00:00:00Z"
  how: "by hand"
  transport: "MPI (test)"
  scale: 0.001
  message_cost: 40 us
  copy: 4 GB/s
  reduce: {float32: 3 GB/s, float16: 100 MB/s}
  links:
    host-switch: {bandwidth: 12 MB/s, latency: 50 us, shared: 0.75, file: 12.5 MB/s}
    switch-1: {bandwidth: 6 MB/s, latency: 20 us}
  residuals: {host-switch: 0.04, switch-1: 0.1}
"""


def test_link_classes_follow_where_links_sit() -> None:
    racks = resolve_topology("emu-racks")
    assert sorted(set(link_classes_of(racks).values())) == ["host-switch", "host:pcie", "host:shm", "switch-1"]
    assert "switch-1" in set(link_classes_of(resolve_topology("fattree-1024")).values())
    assert "host-host" in set(link_classes_of(resolve_topology("ndv2-2chassis")).values())
    assert "host:nvlink" in set(link_classes_of(resolve_topology("dgx1-v100")).values())


def test_a_calibrated_file_replaces_its_classes_figures_and_keeps_its_fingerprint() -> None:
    plain = parse_topology_text(EMU, "emu-racks.yaml")
    cal = parse_topology_text(EMU + BLOCK, "cal.yaml")
    assert cal.fingerprint == plain.fingerprint  # the same cluster: plans compiled for one run on the other
    assert cal.calibration is not None and cal.calibration.host.message_s == pytest.approx(40e-6)
    assert cal.calibration.host.reduce_rate("float16") == pytest.approx(1e8)
    assert cal.calibration.host.reduce_rate("int8") == pytest.approx(3e9)  # float32's where not measured
    classes = link_classes_of(cal)
    for before, after in zip(plain.links, cal.links):
        cls = classes[(after.src, after.dst)]
        if cls == "host-switch":
            assert (after.bandwidth, after.latency) == pytest.approx((12e6, 50e-6))
        elif cls == "switch-1":
            assert (after.bandwidth, after.latency) == pytest.approx((6e6, 20e-6))
        else:
            assert after == before
    assert cal.calibration.links["host-switch"].under(4) == pytest.approx(12e6 * (0.75 + 0.25 / 4))
    assert datasheet_topology(cal).links == plain.links and datasheet_topology(cal).calibration is None
    sub = cal.subset([0, 1, 2, 3])
    assert sub.calibration is cal.calibration and sub.fingerprint == plain.subset([0, 1, 2, 3]).fingerprint


def test_the_block_written_reads_back_the_same() -> None:
    cal = parse_topology_text(EMU + BLOCK, "cal.yaml").calibration
    assert cal is not None
    again = parse_topology_text(EMU + "\n" + calibration_yaml(cal), "again.yaml").calibration
    assert again is not None
    assert again.links.keys() == cal.links.keys()
    for name, f in cal.links.items():
        g = again.links[name]
        assert (g.bandwidth, g.latency, g.shared) == pytest.approx((f.bandwidth, f.latency, f.shared), rel=1e-3)
    assert again.host.message_s == pytest.approx(cal.host.message_s, rel=1e-3)
    assert dict(again.residuals) == pytest.approx(dict(cal.residuals), rel=1e-3)
    assert again.scale == cal.scale and again.transport == cal.transport


def test_strip_calibration_leaves_one_block() -> None:
    text = EMU + BLOCK + "# a comment\n"
    stripped = strip_calibration(text)
    assert "calibration:" not in stripped and stripped.startswith(EMU.rstrip("\n"))
    assert strip_calibration(EMU) == EMU.rstrip("\n") + "\n"


@pytest.mark.parametrize(("change", "message"), [
    ("host-switch: {bandwidth: 12 MB/s", "nvlink: {bandwidth: 12 MB/s"),
    ("shared: 0.75", "shared: 1.5"),
    ("reduce: {float32: 3 GB/s, float16: 100 MB/s}", "reduce: 3 GB/s"),
    ("scale: 0.001", "scale: -1"),
    ("message_cost: 40 us", "message_cost: fast"),
    ("message_cost: 40 us", "message_cost: 0.00004"),  # the block's figures carry units as the file's do
    ("switch-1: {bandwidth: 6 MB/s, latency: 20 us}", "switch-1: {bandwidth: 6 MB/s, source: measured}"),
    ("switch-1: {bandwidth: 6 MB/s, latency: 20 us}", "host:nvlink: {source: file}"),
])
def test_a_bad_block_is_one_line_naming_the_place(change: str, message: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse_topology_text(EMU + BLOCK.replace(change, message), "cal.yaml")
    text = info.value.one_line()
    assert "cal.yaml" in text and "\n" not in text


def test_a_class_kept_at_the_files_figures_says_why_and_reads_back() -> None:
    """A class ``topocc calibrate`` cannot measure is written with ``source: file (why)``: its links keep the
    file's figures, and the block written again says the same."""
    kept = BLOCK.replace("    switch-1: {bandwidth: 6 MB/s, latency: 20 us}\n",
                         '    host:shm: {source: "file (not measurable over MPI between CPU processes)"}\n')
    plain = parse_topology_text(EMU, "emu-racks.yaml")
    cal = parse_topology_text(EMU + kept, "cal.yaml")
    assert cal.calibration is not None
    assert dict(cal.calibration.kept) == {"host:shm": "not measurable over MPI between CPU processes"}
    classes = link_classes_of(cal)
    for before, after in zip(plain.links, cal.links):
        if classes[(after.src, after.dst)] != "host-switch":
            assert after == before
    text = calibration_yaml(cal.calibration)
    assert 'host:shm: {source: "file (not measurable over MPI between CPU processes)"}' in text
    again = parse_topology_text(EMU + "\n" + text, "again.yaml").calibration
    assert again is not None and again.kept == cal.calibration.kept
