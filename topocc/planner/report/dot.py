"""Graphviz DOT of a topology, with a plan's traffic overlaid.

Devices sit in clusters per rack and host; on large topologies hosts (or
racks) are single nodes, as in the HTML report (:mod:`topocc.planner.report._model`).
With a plan, physical links are labelled with the bytes they carry and
coloured from grey (idle) to red (the busiest link), or, with
``overlay="channel"``, the plan's sender -> receiver pairs are added as dashed
edges coloured by channel.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from topocc.planner.analysis.simulate import SimResult, simulate
from topocc.planner.report._model import View, build_view, messages
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_bandwidth, format_size
from topocc.runtime.schedule import Schedule

__all__ = ["render_dot"]

#: At most this many plan (logical) edges are drawn with ``overlay="channel"``.
MAX_PLAN_EDGES = 400
_CHANNEL_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                    "#bcbd22", "#17becf")
_SHAPES = {"gpu": "circle", "host": "box3d", "rack": "box3d", "switch": "box", "nic": "box", "nvswitch": "hexagon",
           "pcie": "box", "cpu": "octagon"}


def _q(text: str) -> str:
    """A DOT quoted string (backslashes and quotes escaped)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _heat(fraction: float) -> str:
    """Grey for idle, through orange to red for the busiest link."""
    f = max(0.0, min(1.0, fraction))
    r, g, b = int(170 + 70 * f), int(170 - 140 * f), int(170 - 150 * f)
    return f"#{r:02x}{g:02x}{b:02x}"


def _node_lines(view: View, ids: list[str], indent: str) -> Iterator[str]:
    for nid in ids:
        n = view.nodes[nid]
        label = f"{n.label}\n{n.sub}" if n.sub else (n.label or nid)
        yield f"{indent}{_q(nid)} [label={_q(label)}, shape={_SHAPES.get(n.kind, 'box')}, tooltip={_q(n.tip)}];"


def render_dot(topology: Topology, schedule: Schedule | None = None, *, size_bytes: int | None = None,
               result: SimResult | None = None, overlay: str = "bytes") -> str:
    """DOT text for ``topology``; with ``schedule``, its traffic (``overlay``: ``bytes`` or ``channel``).

    The bytes come from ``result`` or from simulating ``schedule`` at
    ``size_bytes`` (default: the size it was compiled for, else 64 MiB).

    >>> print(render_dot(topology, schedule))  # doctest: +SKIP
    """
    if overlay not in ("bytes", "channel"):
        raise ValueError(f"overlay must be 'bytes' or 'channel', not {overlay!r}")
    view = build_view(topology)
    lines = [f"digraph {_q(topology.name)} {{", "  graph [rankdir=TB, compound=true, fontname=Helvetica, "
             f"label={_q(_title(topology, schedule))}, labelloc=t];",
             "  node [fontname=Helvetica, fontsize=10];", "  edge [fontname=Helvetica, fontsize=8, arrowsize=0.5];"]
    lines.extend(_cluster_lines(topology, view))
    carried: dict[int, float] = {}
    if schedule is not None and overlay == "bytes":
        if result is None:
            size = size_bytes or schedule.metadata.size_bytes or (64 << 20)
            result = simulate(topology, schedule, size)
        carried = _carried(view, result)
    lines.extend(_link_lines(view, carried, dimmed=schedule is not None and overlay == "bytes"))
    if schedule is not None and overlay == "channel":
        lines.extend(_plan_edge_lines(topology, view, schedule))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _cluster_lines(topology: Topology, view: View) -> Iterator[str]:
    """The drawn nodes, in clusters per rack and host (rack -> host -> nodes), then those outside every host."""
    members: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    loose: list[str] = []
    for nid in view.nodes:
        device = topology.device(nid) if view.level == "device" else None
        if view.level == "device" and device is not None and device.host is not None:
            members[device.rack or ""][device.host].append(nid)
        elif view.level == "host" and nid in topology.hosts:
            rack = topology.rank_device(topology.hosts[nid][0]).rack or ""
            members[rack][""].append(nid)
        else:
            loose.append(nid)
    n_cluster = 0
    for rack in sorted(members):
        indent = "  "
        if rack:
            yield f"  subgraph cluster_{n_cluster} {{ label={_q(rack)}; style=rounded; color=\"#b7a8d9\";"
            n_cluster += 1
            indent = "    "
        for host in sorted(members[rack]):
            ids = sorted(members[rack][host])
            if host:
                yield f"{indent}subgraph cluster_{n_cluster} {{ label={_q(host)}; style=rounded; color=\"#9cbad6\";"
                n_cluster += 1
                yield from _node_lines(view, ids, indent + "  ")
                yield f"{indent}}}"
            else:
                yield from _node_lines(view, ids, indent)
        if rack:
            yield "  }"
    yield from _node_lines(view, sorted(loose), "  ")


def _carried(view: View, result: SimResult) -> dict[int, float]:
    """Bytes the simulation moved over each merged edge of ``view`` (by edge index)."""
    carried: dict[int, float] = defaultdict(float)
    for (src, dst), nbytes in result.link_bytes.items():
        a, b = view.group[src], view.group[dst]
        idx = view.edge_of(a, b) if a != b else None
        if idx is not None:
            carried[idx] += nbytes
    return carried


def _link_lines(view: View, carried: dict[int, float], *, dimmed: bool) -> Iterator[str]:
    """The physical links (merged per drawn pair), those that carried bytes labelled and coloured by how many;
    with ``dimmed`` (a bytes overlay), the idle ones pale."""
    top = max(carried.values(), default=0.0)
    for i, e in enumerate(view.edges):
        attrs = [f"dir=none, penwidth={1.0 + 3.0 * (e.bandwidth / max(x.bandwidth for x in view.edges)):.2f}",
                 f"tooltip={_q(f'{e.a} - {e.b}: {format_bandwidth(e.bandwidth)} ({e.kind})')}"]
        if carried.get(i):
            attrs.append(f"color={_q(_heat(carried[i] / top))}")
            attrs.append(f"label={_q(format_size(carried[i]))}")
        elif dimmed:
            attrs.append('color="#dddddd"')
        else:
            attrs.append('color="#888888"')
        yield f"  {_q(e.a)} -> {_q(e.b)} [{', '.join(attrs)}];"


def _plan_edge_lines(topology: Topology, view: View, schedule: Schedule) -> Iterator[str]:
    """The plan's sender -> receiver pairs between drawn nodes, dashed and coloured by channel (the
    :data:`MAX_PLAN_EDGES` that carry the most chunks)."""
    pairs: dict[tuple[str, str, int], int] = defaultdict(int)
    for m in messages(schedule):
        a, b = view.rank_node(topology, m.src), view.rank_node(topology, m.dst)
        if a != b:
            pairs[(a, b, m.channel)] += m.chunks
    kept = sorted(sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_PLAN_EDGES])
    for (a, b, ch), chunks in kept:
        colour = _CHANNEL_COLOURS[ch % len(_CHANNEL_COLOURS)]
        yield (f"  {_q(a)} -> {_q(b)} [style=dashed, constraint=false, color={_q(colour)}, "
               f"label={_q(f'ch{ch}')}, fontcolor={_q(colour)}, tooltip={_q(f'{chunks} chunks')}];")


def _title(topology: Topology, schedule: Schedule | None) -> str:
    if schedule is None:
        return f"{topology.name} ({topology.size} ranks)"
    return f"{schedule.collective} ({schedule.metadata.algorithm}) on {topology.name} ({topology.size} ranks)"
