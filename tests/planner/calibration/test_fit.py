"""The probe's tests per topology, and the fit recovering known figures from measurements made up by a model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topocc.planner.calibration.classes import LinkClasses, bottleneck
from topocc.planner.calibration.fit import fit_calibration, line_fit
from topocc.planner.calibration.probes import probe_budget_s, probe_tests
from topocc.planner.testbed.emulation import scaled_topology
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.model import Topology

SHIPPED = ["emu-uniform", "emu-racks", "dgx1-v100", "dgx-a100-4node", "ndv2-2chassis", "pcie-4x4-10gbe"]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_class_a_pair_measures_is_loaded_by_its_load_tests(name: str) -> None:
    topology = resolve_topology(name)
    classes = LinkClasses(topology)
    measured = [p.link for p in classes.pairs if p.link is not None]
    assert len(measured) == len(set(measured))  # each class measured once
    for probe in classes.pairs:
        assert classes.signature(probe.src, probe.dst) == probe.signature
    tests = probe_tests(topology)
    ids = [t["id"] for t in tests]
    for cls in measured:
        for what in ("load", "spread"):
            test = tests[ids.index(f"{what} {cls}")]
            link = next(lk for lk in topology.links if [lk.src, lk.dst] == test["link"])
            assert classes.of(link) == cls
            crossing = [p for p in test["pairs"] if link in classes.path(*p)]
            assert len(crossing) == test["flows"] >= 1
    assert ids[-1] == "local"
    assert 0 < probe_budget_s(tests, topology) < 3600


def _measurements(topology: Topology, tests: list[dict[str, Any]], truth: dict[str, tuple[float, float, float]],
                  message_s: float) -> list[dict[str, Any]]:
    """What a cluster whose classes have ``truth`` (bandwidth, per-link latency, shared) would measure."""
    classes = LinkClasses(topology)

    def path_figures(a: int, b: int) -> tuple[float, float]:
        bw, lat = [], message_s
        for link in classes.path(a, b):
            f = truth.get(classes.of(link))
            bw.append(f[0] if f else link.bandwidth)
            lat += f[1] if f else link.latency
        return min(bw), lat

    rows = []
    for t in tests:
        if t["kind"] == "pingpong":
            bw, lat = path_figures(*t["pairs"][0])
            rows += [{"id": t["id"], "size": s, "one_way_s": lat + (s / bw if s > 1024 else 0.0)} for s in t["sizes"]]
        elif t["kind"] == "stream" and len(t["pairs"]) == 1:
            bw, lat = path_figures(*t["pairs"][0])
            rows += [{"id": t["id"], "messages": k, "bytes": t["bytes"], "pairs": 1,
                      "time_s": lat + t["bytes"] / bw + (k - 1) * message_s} for k in t["messages"]]
        elif t["kind"] == "stream":
            link = next(lk for lk in topology.links if [lk.src, lk.dst] == t["link"])
            bw, _, shared = truth[classes.of(link)]
            _, lat = path_figures(*t["pairs"][0])
            k = t["flows"]
            rows.append({"id": t["id"], "messages": 1, "bytes": t["bytes"], "pairs": len(t["pairs"]),
                         "time_s": lat + k * t["bytes"] / (bw * (shared + (1 - shared) / k))})
        else:
            rows += [{"id": "local", "op": op, "dtype": "float32", "bytes": 1 << 22, "time_s": (1 << 22) / rate}
                     for op, rate in (("reduce", 3e9), ("copy", 6e9))]
    return rows


@settings(max_examples=15, deadline=None)
@given(bandwidth=st.floats(0.5, 0.99), shared=st.floats(0.3, 1.0), latency=st.floats(0, 2e-4),
       message=st.floats(0, 1e-4), name=st.sampled_from(["emu-uniform", "emu-racks"]))
def test_the_fit_recovers_the_figures_that_made_the_measurements(bandwidth: float, shared: float, latency: float,
                                                                 message: float, name: str) -> None:
    file = resolve_topology(name)
    ran = scaled_topology(file, 1e-3)
    classes = LinkClasses(ran)
    tests = probe_tests(ran)
    truth = {}
    for probe in classes.pairs:
        if probe.link is not None and probe.link != "host:shm":  # the loopback: see the next test
            link = bottleneck(classes.path(probe.src, probe.dst), probe.link, classes)
            truth[probe.link] = (link.bandwidth * bandwidth, latency, shared)
    truth["host:shm"] = (2e8, latency, 1.0)
    cal = fit_calibration(ran, file, tests, _measurements(ran, tests, truth, message), scale=1e-3)
    assert cal.host.message_s == pytest.approx(message, abs=1e-9)
    assert cal.host.reduce_rate() == pytest.approx(3e9) and cal.host.copy_Bps == pytest.approx(6e9)
    for cls, (bw, lat, sh) in truth.items():
        got = cal.links[cls]
        assert got.bandwidth == pytest.approx(bw, rel=0.02)
        assert got.latency == pytest.approx(lat, rel=0.05, abs=2e-6)
        assert got.shared == pytest.approx(sh, abs=0.03)
    assert set(cal.residuals) == set(truth) and max(cal.residuals.values()) < 0.05


def test_a_class_slower_under_load_with_one_flow_per_link_is_host_bound() -> None:
    file = resolve_topology("emu-uniform")
    ran = scaled_topology(file, 1e-3)
    tests = probe_tests(ran)
    truth = {"host:shm": (6e8, 5e-5, 1.0), "host-switch": (12e6, 5e-5, 0.8)}
    rows = _measurements(ran, tests, truth, 0.0)
    for r in rows:  # every rank at work halves what one loopback flow gets
        if r["id"] in ("load host:shm", "spread host:shm"):
            r["time_s"] = 5e-5 + 2 * (r["time_s"] - 5e-5)
    cal = fit_calibration(ran, file, tests, rows, scale=1e-3)
    assert cal.links["host:shm"].bandwidth == pytest.approx(3e8, rel=0.02)
    assert cal.links["host:shm"].shared == 1.0
    assert cal.links["host-switch"].file == pytest.approx(12.5e6)  # the file's figure as emulated


def test_line_fit() -> None:
    assert line_fit([1, 2, 3], [3, 5, 7]) == pytest.approx((1.0, 2.0))
    assert line_fit([4, 4], [1.0, 3.0]) == (2.0, 0.0)
