"""The HTML report: self-contained, escaped, deterministic, and bounded in size at 1024 ranks."""

from __future__ import annotations

import base64
import json
import re

import pytest

from tests.conftest import must_search
from topocc.planner.report import render_html, render_topology_html
from topocc.planner.report._model import build_view, messages
from topocc.planner.report._run import link_step_bytes
from topocc.planner.topology.parse import parse_topology_text

from .conftest import SIZE, Plan


def _json(html: str, name: str) -> dict:
    found = re.search(rf'<script id="{name}" type="application/json">(.*?)</script>', html, re.S)
    assert found, f"{name} missing"
    return json.loads(found.group(1))


def timeline(html: str) -> dict:
    """The timeline's data, checked for what every page needs: views, a default among them, strips of BINS bytes."""
    doc = _json(html, "timeline-data")
    assert doc["default"] in {v["id"] for v in doc["views"]}
    strips = [r[side] for v in doc["views"] for r in v.get("rows", []) for side in ("out", "in")]
    strips += [r["v"] for r in doc["links"]["rows"] + doc["steps"]["rows"]]
    assert all(len(base64.b64decode(strip)) == doc["bins"] for strip in strips)
    return doc


def check_self_contained(html: str) -> None:
    """No fetches: no external scripts, styles, images or imports (the SVG namespace is not a fetch)."""
    assert html.startswith("<!DOCTYPE html>")
    for pattern in (r'src="', r'<link\b', r"@import", r'href="(?!#)', r"url\((?!#)"):
        assert not re.search(pattern, html), pattern
    assert html.count("<svg") == html.count("</svg>")


def test_dgx1_report_has_every_view(dgx1_ring: Plan) -> None:
    p = dgx1_ring
    html = render_html(p.topology, p.schedule, SIZE, baselines=p.baselines, run=p.run)
    check_self_contained(html)
    for anchor in ('id="svg-topo"', 'id="svg-structure"', 'id="svg-steps"', 'id="tl-canvas"', 'id="comparison"',
                   'id="bottlenecks"', 'id="chan-select"', 'id="step-select"', 'id="tl-rows"'):
        assert anchor in html
    # one drawn group per channel, one arrow per sender -> receiver pair of that channel
    channels = sorted({m.channel for m in messages(p.schedule)})
    assert channels == list(range(6))
    for ch in channels:
        group = must_search(rf'<g class="chan" data-ch="{ch}".*?</g>', html, re.S).group(0)
        assert group.count("<path") == sum(1 for m in messages(p.schedule) if m.channel == ch) == 8
    # the comparison names both schedules with their predicted times
    table = must_search(r'<table id="comparison">.*?</table>', html, re.S).group(0)
    assert "ring (this plan)" in table and "<td>tree</td>" in table
    # step data: one entry per step, indices of drawn links, bytes adding up to what the links carried
    data = _json(html, "step-data")
    steps = {s for _, _, s in link_step_bytes(p.run)}
    assert set(data["steps"]) == {str(s) for s in steps}
    n_lines = html.count('class="se"')
    assert n_lines == len(build_view(p.topology).edges)
    total = sum(b for pairs in data["steps"].values() for _, b in pairs)
    assert all(0 <= i < n_lines for pairs in data["steps"].values() for i, _ in pairs)
    assert total == pytest.approx(sum(p.result.link_bytes.values()), rel=1e-3)
    # timeline: every message on its sender's and its receiver's row, a row per rank and channel by default
    doc = timeline(html)
    assert [v["id"] for v in doc["views"]] == ["lanes", "ranks"] and doc["default"] == "lanes"
    assert doc["views"][0]["n"] == 8 * 6
    iv = doc["intervals"]
    assert len(iv) == 7 * 2 * 168 * 8  # 8 ranks x 168 messages, both ends, 7 numbers each
    ends = [iv[i:i + 7] for i in range(0, len(iv), 7)]
    assert all(0 <= t0 <= t1 <= doc["ticks"] for _, _, t0, t1, *_ in ends)
    assert sum(1 for e in ends if e[6] & 1) == len(ends) // 2  # as many sends as receives
    assert len(doc["steps"]["rows"]) == 14 and not doc["steps"]["pipelined"]  # 2 (n - 1) steps, one after another
    assert len(doc["links"]["rows"]) == 16 and doc["links"]["candidates"] == 32
    assert doc["links"]["rows"][0]["mean"] == pytest.approx(max(p.result.link_utilisation.values()), abs=1e-4)


def test_deterministic(dgx1_ring: Plan) -> None:
    p = dgx1_ring
    first = render_html(p.topology, p.schedule, SIZE, baselines=p.baselines, run=p.run)
    assert render_html(p.topology, p.schedule, SIZE, baselines=p.baselines) == first  # simulates again


def test_names_are_escaped() -> None:
    topo = parse_topology_text(
        """
name: "<script>alert(1)</script>"
devices:
  - {name: "g<b>0", type: gpu, host: "h&1"}
  - {name: "g\\"1", type: gpu, host: "h&1"}
links:
  - {ends: ["g<b>0", "g\\"1"], bandwidth: 10 GB/s, latency: 1 us}
"""
    )
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.compiler.options import Options

    schedule = compile_schedule(topo, "allreduce", "ring", Options(size_bytes=1 << 20)).schedule
    for html in (render_html(topo, schedule, 1 << 20), render_topology_html(topo)):
        assert "<script>alert" not in html and "<b>" not in html and 'g"1' not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "h&amp;1" in html
        check_self_contained(html)


def test_hosts_and_racks_are_boxes(racks_plan: Plan) -> None:
    p = racks_plan
    html = render_html(p.topology, p.schedule, SIZE, baselines=p.baselines, run=p.run)
    check_self_contained(html)
    topo_svg = must_search(r'<svg id="svg-topo".*?</svg>', html, re.S).group(0)
    assert topo_svg.count('class="box-rack"') == 3 and topo_svg.count('class="box-host"') == 6
    assert '<td>ring</td>' in html


def test_topology_page_at_1024_ranks_is_aggregated() -> None:
    from topocc.planner.topology.catalogue import resolve_topology

    topo = resolve_topology("fattree-1024")
    html = render_topology_html(topo)
    check_self_contained(html)
    svg = must_search(r'<svg id="svg-topo".*?</svg>', html, re.S).group(0)
    # 128 hosts + 48 switches drawn, not 2224 devices; links merged per host/switch pair
    assert svg.count('class="n-host"') == 128
    assert svg.count('class="n-switch"') == 48
    assert svg.count("<line") < 800
    assert "h0.gpu0" not in svg


@pytest.mark.slow
def test_1024_rank_report_is_bounded(fattree_plan: Plan) -> None:
    p = fattree_plan
    html = render_html(p.topology, p.schedule, SIZE, run=p.run)
    check_self_contained(html)
    assert len(html.encode()) < 5_000_000
    for name in ("svg-topo", "svg-structure", "svg-steps"):
        svg = must_search(rf'<svg id="{name}".*?</svg>', html, re.S).group(0)
        shapes = len(re.findall(r"<(?:rect|line|path|circle)\b", svg))
        assert shapes < 5000, (name, shapes)
    # per host and per rack past 64 ranks, never per message
    doc = timeline(html)
    assert "intervals" not in doc
    assert [(v["id"], v["n"]) for v in doc["views"]] == [("host", 128), ("rack", 32)] and doc["default"] == "rack"
    assert doc["views"][0]["rows"][0]["label"] == "h0" and doc["views"][0]["rows"][0]["n"] == 8




