"""Inspecting plans: an HTML report, a Graphviz drawing and terminal tables.

``render_html`` and ``render_topology_html`` write one self-contained page;
``render_dot`` a DOT graph of the topology with the plan overlaid;
``terminal_summary`` the plain-text view of ``topocc inspect``.
"""

from topocc.planner.report.dot import render_dot as render_dot
from topocc.planner.report.html import render_html as render_html
from topocc.planner.report.html import render_topology_html as render_topology_html
from topocc.planner.report.text import terminal_summary as terminal_summary

__all__ = ["render_dot", "render_html", "render_topology_html", "terminal_summary"]
