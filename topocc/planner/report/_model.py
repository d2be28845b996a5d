"""What the reports draw, computed once in Python: a deterministic layout and the plan's traffic, aggregated.

Views stay readable at any size by choosing a *level*: up to
:data:`DEVICE_LEVEL_RANKS` ranks every device is drawn; above that hosts are
boxes (devices inside a host merge into it), and above :data:`HOST_LEVEL_HOSTS`
hosts racks are.  Devices outside every host (network switches) are drawn in
tiers above, ordered by the mean position of their neighbours below.  Links
between the same two drawn nodes merge into one edge whose bandwidth is the sum
of one direction's links.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from topocc.planner.analysis.simulate import OpEvent
from topocc.planner.topology.model import Device, Topology
from topocc.runtime.schedule import Schedule

#: Draw every device up to this many ranks (and devices); hosts as boxes above.
DEVICE_LEVEL_RANKS = 64
DEVICE_LEVEL_DEVICES = 256
#: Draw hosts up to this many; racks above.
HOST_LEVEL_HOSTS = 256
#: Hosts stacked in one rack column before another column starts.
HOSTS_PER_COLUMN = 8

_GPU_R = 13.0
_SWITCH_W, _SWITCH_H = 30.0, 16.0
_HOST_W, _HOST_H = 70.0, 34.0
_TIER_GAP = 90.0
_MARGIN = 30.0
_TOP = _MARGIN + 6.0  # the hosts' top edge before the tiers above push them down


@dataclass(frozen=True, slots=True)
class Node:
    """A drawn node: a device, a host or a rack; ``shape`` is ``circle`` (ranks) or ``rect``."""

    id: str
    label: str
    sub: str
    kind: str
    shape: str
    x: float
    y: float
    w: float
    h: float
    tip: str


@dataclass(frozen=True, slots=True)
class Box:
    """A grouping rectangle (a host or rack around its devices)."""

    label: str
    kind: str
    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True, slots=True)
class Edge:
    """Physical links between two drawn nodes, both directions merged; ``bandwidth`` is the larger direction's."""

    a: str
    b: str
    bandwidth: float
    links: int
    kind: str


@dataclass
class View:
    """A laid-out topology at one level of detail."""

    level: str
    nodes: dict[str, Node]
    boxes: list[Box]
    edges: list[Edge]
    width: float
    height: float
    group: dict[str, str]  # device name -> drawn node id
    edge_index: dict[tuple[str, str], int] = field(default_factory=dict)

    def rank_node(self, topology: Topology, rank: int) -> str:
        return self.group[topology.ranks[rank]]

    def edge_of(self, a: str, b: str) -> int | None:
        """Index of the merged edge between drawn nodes ``a`` and ``b`` (either order)."""
        return self.edge_index.get((a, b) if a <= b else (b, a))


def choose_level(topology: Topology) -> str:
    """``device``, ``host`` or ``rack``: the finest level that keeps a view to a few hundred elements."""
    if topology.size <= DEVICE_LEVEL_RANKS and len(topology.devices) <= DEVICE_LEVEL_DEVICES:
        return "device"
    return "host" if len(topology.hosts) <= HOST_LEVEL_HOSTS else "rack"


def _group_of(d: Device, level: str) -> str:
    if level == "device" or d.host is None:
        return d.name
    if level == "host":
        return d.host
    return d.rack or d.host


def build_view(topology: Topology, level: str | None = None) -> View:
    """Lay ``topology`` out: racks left to right, hosts inside them, switches in tiers above."""
    level = level or choose_level(topology)
    group = {d.name: _group_of(d, level) for d in topology.devices}
    nodes: dict[str, Node] = {}
    boxes: list[Box] = []
    if level == "device":
        x, bottom = _place_devices(topology, nodes, boxes)
    elif level == "host":
        x, bottom = _place_hosts(topology, group, nodes, boxes)
    else:
        x, bottom = _place_racks(topology, group, nodes)
    width = max(x + _MARGIN, 300.0)
    free = [d for d in topology.devices if d.host is None]
    if free:
        tier = _tiers(topology, free)
        shift = max(tier.values()) * _TIER_GAP  # the hosts move down below the tiers
        nodes = {k: _moved(v, shift) for k, v in nodes.items()}
        boxes = [Box(b.label, b.kind, b.x, b.y + shift, b.w, b.h) for b in boxes]
        bottom += shift
        _place_tiers(topology, free, tier, group, nodes, width)
    edges = _merged_edges(topology, group)
    view = View(level, nodes, boxes, edges, width, bottom + _MARGIN, group)
    view.edge_index = {(e.a, e.b): i for i, e in enumerate(edges)}
    return view


def _racks(topology: Topology) -> dict[str, dict[str, list[Device]]]:
    """Hosted devices by rack and host, racks and hosts in order of their first rank (then other devices)."""
    racks: dict[str, dict[str, list[Device]]] = {}
    for d in sorted(topology.devices, key=lambda d: (topology.rank_of(d.name) is None, _order(topology, d))):
        if d.host is None:
            continue
        racks.setdefault(d.rack or "", {}).setdefault(d.host, []).append(d)
    return racks


def _rank_count(topology: Topology, group: dict[str, str]) -> dict[str, int]:
    """Ranks per drawn node."""
    count: dict[str, int] = defaultdict(int)
    for r in topology.ranks:
        count[group[r]] += 1
    return count


def _place_devices(topology: Topology, nodes: dict[str, Node], boxes: list[Box]) -> tuple[float, float]:
    """Every hosted device, in host boxes within rack boxes; returns the right edge and the bottom."""
    x, bottom = _MARGIN, _TOP
    for rack, hosts in _racks(topology).items():
        rack_x = x
        pad = 14.0 if rack else 0.0
        x += pad
        rack_bottom = _TOP
        for host, devices in hosts.items():
            w, h = _place_host(topology, host, devices, x, _TOP + pad + 16.0, nodes)
            boxes.append(Box(host, "host", x, _TOP + pad, w, h + 16.0))
            x += w + 16.0
            rack_bottom = max(rack_bottom, _TOP + pad + h + 16.0)
        if rack:
            boxes.append(Box(rack, "rack", rack_x, _TOP, x - rack_x - 16.0 + pad, rack_bottom - _TOP + pad))
            x += pad + 8.0
        bottom = max(bottom, rack_bottom + pad)
    return x, bottom


def _place_hosts(topology: Topology, group: dict[str, str], nodes: dict[str, Node],
                 boxes: list[Box]) -> tuple[float, float]:
    """Hosts as boxes in columns of :data:`HOSTS_PER_COLUMN` per rack; returns the right edge and the bottom."""
    rank_count = _rank_count(topology, group)
    x, bottom = _MARGIN, _TOP
    for rack, hosts in _racks(topology).items():
        names = list(hosts)
        columns = max(1, math.ceil(len(names) / HOSTS_PER_COLUMN))
        show_rack = bool(rack) and not (len(names) == 1 and names[0] == rack)
        pad = 8.0 if show_rack else 0.0
        top = _TOP + (18.0 if show_rack else 0.0)
        for i, host in enumerate(names):
            col, row = divmod(i, HOSTS_PER_COLUMN)
            hx = x + pad + col * (_HOST_W + 6.0)
            hy = top + row * (_HOST_H + 6.0)
            n = rank_count.get(host, 0)
            nodes[host] = Node(host, host, f"{n} rank{'s' * (n != 1)}", "host", "rect", hx + _HOST_W / 2,
                               hy + _HOST_H / 2, _HOST_W, _HOST_H, f"host {host}: {n} ranks")
        rows = min(len(names), HOSTS_PER_COLUMN)
        w = columns * (_HOST_W + 6.0) - 6.0 + 2 * pad
        h = top - _TOP + rows * (_HOST_H + 6.0) - 6.0 + pad
        if show_rack:
            boxes.append(Box(rack, "rack", x, _TOP, w, h))
        x += w + 12.0
        bottom = max(bottom, _TOP + h)
    return x, bottom


def _place_racks(topology: Topology, group: dict[str, str], nodes: dict[str, Node]) -> tuple[float, float]:
    """Racks as single nodes in a row; returns the right edge and the bottom."""
    rank_count = _rank_count(topology, group)
    members: dict[str, set[str]] = defaultdict(set)
    for d in topology.devices:
        if d.host is not None:
            members[group[d.name]].add(d.host)
    x = _MARGIN
    for gid in dict.fromkeys(group[r] for r in topology.ranks):
        n = rank_count[gid]
        nodes[gid] = Node(gid, gid, f"{len(members[gid])} hosts, {n} ranks", "rack", "rect", x + _HOST_W / 2,
                          _TOP + _HOST_H / 2, _HOST_W + 20.0, _HOST_H, f"{gid}: {len(members[gid])} hosts, "
                          f"{n} ranks")
        x += _HOST_W + 30.0
    return x, _TOP + _HOST_H


def _tiers(topology: Topology, free: Sequence[Device]) -> dict[str, int]:
    """Each unhosted device's tier: its hop distance from the hosted devices (1 where it reaches none)."""
    neighbours = _neighbours(topology)
    tier: dict[str, int] = {}
    seen = {d.name for d in topology.devices if d.host is not None}
    frontier = sorted(seen)
    depth = 0
    while True:
        depth += 1
        nxt = sorted({m for n in frontier for m in neighbours[n] if m not in seen})
        if not nxt:
            break
        for m in nxt:
            tier[m] = depth
            seen.add(m)
        frontier = nxt
    for d in free:
        tier.setdefault(d.name, 1)
    return tier


def _neighbours(topology: Topology) -> dict[str, set[str]]:
    neighbours: dict[str, set[str]] = defaultdict(set)
    for link in topology.links:
        neighbours[link.src].add(link.dst)
        neighbours[link.dst].add(link.src)
    return neighbours


def _place_tiers(topology: Topology, free: Sequence[Device], tier: dict[str, int], group: dict[str, str],
                 nodes: dict[str, Node], width: float) -> None:
    """The unhosted devices (switches, standalone GPUs) in tiers above the hosts, by hop distance from them
    (``tier``), each tier ordered by the mean position of its devices' neighbours."""
    neighbours = _neighbours(topology)
    top_tier = max(tier.values())
    shift = top_tier * _TIER_GAP
    pos = {k: v.x for k, v in nodes.items()}
    for t in range(1, top_tier + 1):
        row = [d for d in free if tier[d.name] == t]
        y = _TOP + shift - t * _TIER_GAP + 20.0

        def bary(d: Device) -> float:
            xs = [pos[group[m]] for m in neighbours[d.name] if group[m] in pos]
            return sum(xs) / len(xs) if xs else width / 2

        row.sort(key=lambda d: (bary(d), _order(topology, d)))
        step = (width - 2 * _MARGIN) / max(1, len(row))
        w = min(_SWITCH_W, max(6.0, step - 4.0))
        for i, d in enumerate(row):
            cx = _MARGIN + step * (i + 0.5)
            rank = topology.rank_of(d.name)
            if rank is not None:
                nodes[d.name] = Node(d.name, str(rank), "", "gpu", "circle", cx, y, 2 * _GPU_R, 2 * _GPU_R,
                                     f"rank {rank}: {d.name}")
            else:
                nodes[d.name] = Node(d.name, _short(d.name) if step >= 34 else "", "", d.kind, "rect", cx, y, w,
                                     _SWITCH_H, f"{d.kind} {d.name}")
            pos[d.name] = cx


def _merged_edges(topology: Topology, group: dict[str, str]) -> list[Edge]:
    """The links between distinct drawn nodes, merged per pair (see :class:`Edge`), sorted by pair."""
    merged: dict[tuple[str, str], list[float]] = {}
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for link in topology.links:
        a, b = group[link.src], group[link.dst]
        if a == b:
            continue
        key = (a, b) if a <= b else (b, a)
        entry = merged.setdefault(key, [0.0, 0.0, 0])
        entry[0 if (a, b) == key else 1] += link.bandwidth
        entry[2] += 1
        kinds[key].add(link.kind or "link")
    return [Edge(a, b, max(v[0], v[1]), int(v[2]), "/".join(sorted(kinds[(a, b)]))) for (a, b), v in
            sorted(merged.items())]


def _order(topology: Topology, d: Device) -> tuple[int, str]:
    rank = topology.rank_of(d.name)
    return (rank if rank is not None else 1 << 30, d.name)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _moved(n: Node, dy: float) -> Node:
    return Node(n.id, n.label, n.sub, n.kind, n.shape, n.x, n.y + dy, n.w, n.h, n.tip)


def _place_host(topology: Topology, host: str, devices: Sequence[Device], x: float, y: float,
                nodes: dict[str, Node]) -> tuple[float, float]:
    """GPUs on a circle, NICs in a row above it, other devices (NVSwitch, PCIe, CPU) on an inner circle."""
    gpus = [d for d in devices if d.kind == "gpu"]
    nics = [d for d in devices if d.kind == "nic"]
    inner = [d for d in devices if d.kind not in ("gpu", "nic")]
    r_in = 0.0 if len(inner) <= 1 else len(inner) * (_SWITCH_W + 22.0) / (2 * math.pi)
    radius = max(48.0, len(gpus) * 2.6 * _GPU_R / (2 * math.pi), r_in + 3 * _GPU_R + 10.0)
    nic_row = 34.0 if nics else 0.0
    w = max(2 * radius + 4 * _GPU_R + 16.0, len(nics) * (_SWITCH_W + 4.0) + 16.0)
    h = nic_row + 2 * radius + 4 * _GPU_R
    cx, cy = x + w / 2, y + nic_row + radius + 2 * _GPU_R
    for i, d in enumerate(gpus):
        angle = -math.pi / 2 + 2 * math.pi * i / max(1, len(gpus))
        rank = topology.rank_of(d.name)
        nodes[d.name] = Node(d.name, str(rank), "", "gpu", "circle", cx + radius * math.cos(angle),
                             cy + radius * math.sin(angle), 2 * _GPU_R, 2 * _GPU_R, f"rank {rank}: {d.name}")
    for i, d in enumerate(nics):
        nx_ = x + w / 2 + (i - (len(nics) - 1) / 2) * (_SWITCH_W + 4.0)
        nodes[d.name] = Node(d.name, _short(d.name), "", d.kind, "rect", nx_, y + 12.0, _SWITCH_W, _SWITCH_H,
                             f"{d.kind} {d.name}")
    for i, d in enumerate(inner):
        angle = -math.pi / 2 + math.pi / max(1, len(inner)) + 2 * math.pi * i / max(1, len(inner))
        nodes[d.name] = Node(d.name, _short(d.name), "", d.kind, "rect", cx + r_in * math.cos(angle),
                             cy + r_in * math.sin(angle), _SWITCH_W + 8.0, _SWITCH_H, f"{d.kind} {d.name}")
    return w, h


# --------------------------------------------------------------------------- the plan's traffic


def transfer_starts(schedule: Schedule, events: Iterable[OpEvent]) -> dict[tuple[int, int], float]:
    """When each send/receive's data started to move: the later of the two posts (rendezvous).

    Matches the k-th send a -> b on channel c with the k-th receive, as the simulator does.
    """
    posted: dict[tuple[int, int], float] = {(e.rank, e.index): e.start_s for e in events}
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for rank, program in enumerate(schedule.programs):
        for i, op in enumerate(program):
            if op.kind == "send":
                sends[(rank, op.peer, op.channel)].append(i)
            elif op.kind in ("recv", "recv_reduce"):
                recvs[(op.peer, rank, op.channel)].append(i)
    out: dict[tuple[int, int], float] = {}
    for key, ss in sends.items():
        src, dst, _ = key
        for s, r in zip(ss, recvs.get(key, ())):
            a, b = posted.get((src, s)), posted.get((dst, r))
            if a is None or b is None:
                continue
            out[(src, s)] = out[(dst, r)] = max(a, b)
    return out


@dataclass(frozen=True, slots=True)
class Message:
    """Messages between two ranks on one channel, summed: how many and how many chunks."""

    src: int
    dst: int
    channel: int
    messages: int
    chunks: int
    first_step: int
    last_step: int


def messages(schedule: Schedule) -> list[Message]:
    """Every (sender, receiver, channel) of the plan with its message and chunk counts, sorted."""
    acc: dict[tuple[int, int, int], list[int]] = {}
    for rank, program in enumerate(schedule.programs):
        for op in program:
            if op.kind != "send" or op.peer is None:
                continue
            key = (rank, op.peer, op.channel)
            e = acc.get(key)
            if e is None:
                acc[key] = [1, op.count, op.step, op.step]
            else:
                e[0] += 1
                e[1] += op.count
                e[2] = min(e[2], op.step)
                e[3] = max(e[3], op.step)
    return [Message(s, d, c, *v) for (s, d, c), v in sorted(acc.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1]))]


def step_buckets(steps: Iterable[int], limit: int) -> tuple[int, list[tuple[int, int]]]:
    """Group sorted steps into at most ``limit`` consecutive ranges: (bucket width, [(first, last)])."""
    ordered = sorted(set(steps))
    if not ordered:
        return 1, []
    span = ordered[-1] - ordered[0] + 1
    width = max(1, math.ceil(span / limit))
    ranges = sorted({(ordered[0] + (s - ordered[0]) // width * width,
                      ordered[0] + (s - ordered[0]) // width * width + width - 1) for s in ordered})
    return width, ranges


