"""Hypothesis strategies for random, valid topologies (explicit devices and links, as YAML text).

A topology is 1-4 hosts of 1-4 GPUs each.  Inside a host the GPUs hang off a
switch, form a full mesh or a chain (sometimes one-way, closed into a directed
ring); each host has a NIC that every GPU reaches, or only its first GPU does
(then some pairs have no GPU-free route).  Hosts are joined by a top switch or
a ring of NICs or two spine switches (two equal-cost paths between any two
hosts), optionally grouped into racks, or, as chassis are in TE-CCL's and
TACCL's multi-chassis models, by GPU-to-GPU links: host h's first GPU to host
h+1's second, one-way or both ways (no NICs then).  Bandwidths and latencies
are random, and so is the routing (links between hosts are labelled dimension
0, links inside a host dimension 1, so that dimension-order routing applies).

:func:`chassis_yaml` writes such multi-chassis boxes at full size, for the
tests that need one fixed shape.
"""

from __future__ import annotations

from hypothesis import strategies as st

from topocc.planner.topology.model import ROUTING_MODES, Topology
from topocc.planner.topology.parse import parse_topology_text

__all__ = ["TopologySpec", "chassis_yaml", "topologies", "topology_specs", "topology_yaml"]

_BANDWIDTHS = (10, 25, 50, 100)  # GB/s
_LATENCIES = (0.5, 1, 2, 5)  # us

TopologySpec = dict


@st.composite
def topology_specs(draw: st.DrawFn, max_hosts: int = 4, max_gpus: int = 4) -> TopologySpec:
    """The random choices behind a topology, as plain data (shown by Hypothesis on failure)."""
    hosts = draw(st.integers(1, max_hosts))
    uniform = draw(st.booleans())
    first = draw(st.integers(1, max_gpus))
    gpus = [first if uniform else draw(st.integers(1, max_gpus)) for _ in range(hosts)]
    return {
        "gpus": gpus,
        "fabric": [draw(st.sampled_from(("switch", "mesh", "chain"))) for _ in range(hosts)],
        "directed_chain": draw(st.booleans()),
        "nic_attach": draw(st.sampled_from(("all", "first"))),
        "join": draw(st.sampled_from(("switch", "ring", "spines", "chassis"))),
        "one_way_join": draw(st.booleans()),
        "racks": draw(st.sampled_from((0, 1, 2))),
        "bandwidth": draw(st.lists(st.sampled_from(_BANDWIDTHS), min_size=4, max_size=4)),
        "latency": draw(st.lists(st.sampled_from(_LATENCIES), min_size=4, max_size=4)),
        "routing": draw(st.sampled_from(ROUTING_MODES)),
    }


def topology_yaml(spec: TopologySpec) -> str:
    """Render a :func:`topology_specs` draw as topology YAML with explicit devices and links."""
    intra_bw, nic_bw, net_bw, sw_bw = spec["bandwidth"]
    intra_lat, nic_lat, net_lat, sw_lat = spec["latency"]
    devices: list[str] = []
    links: list[str] = []

    def link(a: str, b: str, bw: float, lat: float, forward: bool = False, between_hosts: bool = False) -> None:
        extra = ", direction: forward" if forward else ""
        dim = 0 if between_hosts or a.endswith("nic") else 1  # a link between hosts starts at a NIC or joins chassis
        links.append(f"  - {{ends: [{a}, {b}], bandwidth: {bw} GB/s, latency: {lat} us, dim: {dim}{extra}}}")

    n_hosts = len(spec["gpus"])
    racks = spec["racks"]
    for h, (n, fabric) in enumerate(zip(spec["gpus"], spec["fabric"])):
        place = f"host: h{h}" + (f", rack: r{h * racks // n_hosts}" if racks else "")
        gpus = [f"h{h}g{i}" for i in range(n)]
        for g in gpus:
            devices.append(f"  - {{name: {g}, type: gpu, {place}}}")
        if fabric == "switch" and n > 1:
            devices.append(f"  - {{name: h{h}sw, type: nvswitch, {place}}}")
            for g in gpus:
                link(g, f"h{h}sw", sw_bw, sw_lat)
        elif fabric == "mesh":
            for i in range(n):
                for j in range(i + 1, n):
                    link(gpus[i], gpus[j], intra_bw, intra_lat)
        elif n > 1:
            directed = spec["directed_chain"] and n > 2
            for i in range(n - 1):
                link(gpus[i], gpus[i + 1], intra_bw, intra_lat, forward=directed)
            if directed:
                link(gpus[-1], gpus[0], intra_bw, intra_lat, forward=True)
        if spec["join"] == "chassis":
            continue
        devices.append(f"  - {{name: h{h}nic, type: nic, {place}}}")
        for g in gpus if spec["nic_attach"] == "all" else gpus[:1]:
            link(g, f"h{h}nic", nic_bw, nic_lat)
    if n_hosts > 1:
        if spec["join"] == "chassis":
            joined: set[object] = set()  # two hosts of one GPU each would declare one link twice
            for h in range(n_hosts):
                nxt = (h + 1) % n_hosts
                a, b = f"h{h}g0", f"h{nxt}g{1 % spec['gpus'][nxt]}"
                key = (a, b) if spec["one_way_join"] else frozenset((a, b))
                if key not in joined:
                    joined.add(key)
                    link(a, b, net_bw, net_lat, forward=spec["one_way_join"], between_hosts=True)
        elif spec["join"] in ("switch", "spines"):
            tops = ["top"] if spec["join"] == "switch" else ["top0", "top1"]
            for top in tops:
                devices.append(f"  - {{name: {top}, type: switch}}")
                for h in range(n_hosts):
                    link(f"h{h}nic", top, net_bw, net_lat)
        else:
            for h in range(n_hosts if n_hosts > 2 else 1):
                link(f"h{h}nic", f"h{(h + 1) % n_hosts}nic", net_bw, net_lat)
    # a lone GPU has no links to label, so dimension-order routing would be refused: it has nothing to route
    routing = [f"routing: {spec['routing']}"] if links else []
    return "\n".join(["name: random", *routing, "devices:", *devices,
                      *(["links:", *links] if links else ["links: []"])]) + "\n"


@st.composite
def topologies(draw: st.DrawFn, max_hosts: int = 4, max_gpus: int = 4) -> Topology:
    """A random valid :class:`Topology` (see the module docstring)."""
    return parse_topology_text(topology_yaml(draw(topology_specs(max_hosts, max_gpus))), "random")


#: NDv2's NVLink hybrid cube-mesh (as ndv2-2chassis.yaml): GPU pairs and GB/s.
_CUBE_MESH = ((0, 1, 50), (0, 2, 25), (0, 3, 25), (0, 4, 50), (1, 2, 25), (1, 3, 50), (1, 5, 25), (2, 3, 50),
              (2, 6, 50), (3, 7, 25), (4, 5, 50), (4, 6, 25), (4, 7, 25), (5, 6, 25), (5, 7, 50), (6, 7, 50))


def chassis_yaml(chassis: int, gpus: int, inside: str = "nvswitch", one_way: bool = True) -> str:
    """A multi-chassis box as TE-CCL and TACCL model one: ``chassis`` chassis of ``gpus`` GPUs each.

    Inside a chassis the GPUs hang off one NVSwitch (150 GB/s each) or, with
    ``inside="cube-mesh"`` (8 GPUs), form NDv2's hybrid cube-mesh.  Chassis
    ``c``'s GPU 0 has a 12.5 GB/s link to chassis ``c+1``'s GPU 1, closing the
    loop; one-way (ndv2-2chassis.yaml is the 2 x 8 cube-mesh case) or both ways.
    """
    devices, links = [], []
    for c in range(chassis):
        devices.append(f"  - {{name: c{c}g, type: gpu, count: {gpus}, host: c{c}}}")
        if inside == "cube-mesh":
            links += [f"  - {{ends: [c{c}g{a}, c{c}g{b}], bandwidth: {bw} GB/s}}" for a, b, bw in _CUBE_MESH]
        else:
            devices.append(f"  - {{name: c{c}sw, type: nvswitch, host: c{c}}}")
            links += [f"  - {{ends: [c{c}g{g}, c{c}sw], bandwidth: 150 GB/s}}" for g in range(gpus)]
    for c in range(chassis):
        way = ", direction: forward" if one_way else ""
        links.append(f"  - {{ends: [c{c}g0, c{(c + 1) % chassis}g1], bandwidth: 12.5 GB/s, latency: 1.3 us{way}}}")
    name = f"chassis-{chassis}x{gpus}-{inside}-{'one-way' if one_way else 'two-way'}"
    return "\n".join([f"name: {name}", "defaults: {latency: 0.7 us}", "devices:", *devices, "links:", *links]) + "\n"
