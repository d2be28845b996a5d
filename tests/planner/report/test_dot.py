"""Graphviz output: well-formed DOT (checked here, and by ``dot`` itself where installed)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import must_search
from topocc.planner.report import render_dot
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text

from .conftest import Plan

_ID = r'"(?:[^"\\]|\\.)*"'


def check_dot(text: str) -> tuple[set[str], list[tuple[str, str, str]]]:
    """Balanced braces outside strings, and every edge between declared nodes; returns (nodes, edges)."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            assert depth >= 0, "closing brace without an opening one"
    assert depth == 0 and not in_string
    assert text.startswith("digraph ")
    nodes = set(re.findall(rf"^\s*({_ID}) \[label=", text, re.M))
    edges = re.findall(rf"^\s*({_ID}) -> ({_ID}) \[(.*)\];$", text, re.M)
    assert edges, "no edges"
    for a, b, _ in edges:
        assert a in nodes and b in nodes, (a, b)
    return nodes, edges


def _graphviz(text: str) -> None:
    if shutil.which("dot") is None:
        return
    done = subprocess.run(["dot", "-Tsvg"], input=text.encode(), capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"<svg" in done.stdout


def test_topology_only(dgx1_ring: Plan) -> None:
    text = render_dot(dgx1_ring.topology)
    nodes, edges = check_dot(text)
    assert len(nodes) == 14  # 8 GPUs, 4 PCIe switches, 2 CPUs
    assert len(edges) == 29  # 58 directed links, both directions merged
    assert "label=" not in "".join(attrs for *_, attrs in edges if "GB/s" in attrs.split("label=")[-1])
    _graphviz(text)


def test_bytes_overlay_labels_busy_links(dgx1_ring: Plan) -> None:
    p = dgx1_ring
    text = render_dot(p.topology, p.schedule, result=p.result)
    _, edges = check_dot(text)
    labelled = [attrs for *_, attrs in edges if "label=" in attrs]
    busy_pairs = {tuple(sorted(k)) for k, v in p.result.link_bytes.items() if v > 0}
    assert len(labelled) == len(busy_pairs) == 16  # the NVLink pairs the rings use
    assert any('color="#f01e14"' in attrs for attrs in labelled)  # the busiest link is red
    _graphviz(text)


def test_channel_overlay(dgx1_tree: Plan) -> None:
    p = dgx1_tree
    text = render_dot(p.topology, p.schedule, overlay="channel")
    _, edges = check_dot(text)
    plan_edges = [e for e in edges if "style=dashed" in e[2]]
    assert {must_search(r'label="(ch\d+)"', e[2]).group(1) for e in plan_edges} == {"ch0", "ch1"}
    assert len(plan_edges) == 28  # two trees over 8 ranks, each edge both ways
    _graphviz(text)
    with pytest.raises(ValueError):
        render_dot(p.topology, p.schedule, overlay="colour")


def test_quotes_and_clusters() -> None:
    topo: Topology = parse_topology_text(
        """
name: 'a "quoted" {name}'
devices:
  - {name: 'g"0', type: gpu, host: "h{1}", rack: "r}1"}
  - {name: "g1", type: gpu, host: "h{1}", rack: "r}1"}
links:
  - {ends: ['g"0', g1], bandwidth: 10 GB/s}
"""
    )
    text = render_dot(topo)
    check_dot(text)
    assert text.count("subgraph cluster_") == 2  # the rack and the host inside it
    _graphviz(text)


def test_racks_aggregate_at_1024_ranks() -> None:
    from topocc.planner.topology.catalogue import resolve_topology

    text = render_dot(resolve_topology("fattree-1024"))
    nodes, edges = check_dot(text)
    assert len(nodes) == 128 + 48 and text.count("subgraph cluster_") == 32
    assert len(edges) == 128 + 32 * 16
