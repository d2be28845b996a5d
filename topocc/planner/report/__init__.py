"""Views of plans and runs for people and scripts: an HTML report, a Graphviz drawing, a Chrome trace, tables.

``html`` (``render_html``, ``render_topology_html``: one self-contained page), ``dot`` (``render_dot``: the
topology with the plan overlaid), ``trace`` (a simulated run for Perfetto), ``text`` (``terminal_summary``:
``topocc inspect`` without files), ``inspect`` (all of these from one simulated run), ``summary`` (what
``compile``, ``simulate``, ``verify``, ``topo show`` print, as dicts for ``--json`` and as text), ``runs``
(``run`` and ``bench``: measured rows beside predictions), ``torchbench`` (nccl-tests' table of a
torch.distributed sweep), ``table`` (text tables).  ``_model``, ``_run``
and ``_timeline`` compute what the views draw.  Imports the topology, routing, analysis and compiler.
"""

from topocc.planner.report.dot import render_dot as render_dot
from topocc.planner.report.html import render_html as render_html
from topocc.planner.report.html import render_topology_html as render_topology_html
from topocc.planner.report.text import terminal_summary as terminal_summary

__all__ = ["render_dot", "render_html", "render_topology_html", "terminal_summary"]
