"""A generated suite of fabrics: the yardstick of the planner's generality.

Each :class:`Fabric` is topology YAML, read by the normal loader, so the suite
also exercises the file format.  Families:

* ``multi-chassis`` (TE-CCL / TACCL style): 2 or 4 chassis of 8 GPUs (NDv2-like
  hybrid cube-mesh NVLink) or 16 GPUs (DGX-2-like NVSwitch), joined either by
  one-way links from a GPU of chassis c to a GPU of chassis c+1 (closing the
  loop), or by two-way NIC links on only a subset of the GPUs.  Both need GPU
  relays: GPUs of different chassis mostly have no GPU-free route.
* ``heterogeneous-nics``: hosts alike but for their NICs (8 x 200, 4 x 200 or
  2 x 100 Gbit/s), all on one switch; written as explicit YAML since the
  template replicates one host.
* ``rail-optimized``: DGX A100 hosts on rails joined by spines (4-32 hosts),
  a rail-only network without spines (traffic between rails relays over
  NVLink, as NCCL's PXN does), and, in the small suite, three tiers (rails,
  pod spines, cores) in miniature.
* ``torus`` and ``mesh``: 3D grids of single-accelerator nodes, a router each,
  up to 8x8x8 = 512 ranks.
* ``fat-tree``: two switch tiers, 2:1 and 4:1 oversubscribed, 16-256 GPUs, one with its last leaf half full.

``switch_based`` marks the fabrics whose ranks meet through an indirect,
switched network (every rank pair has a route that crosses no other GPU, and
no torus or mesh): the 1 MiB latency target applies to those.
:func:`suite` lists the full suite (16-512 ranks), :func:`small_suite` one or
two instances of at most 16 ranks per family, for tests, and
:func:`shipped_fabrics` the shipped topologies in the same form.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from topocc.planner.errors import UsageError
from topocc.planner.topology.catalogue import shipped_topologies
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.planner.topology.templates import HYBRID_CUBE_MESH_LANES

__all__ = [
    "FAMILIES",
    "SHIPPED_SWITCH_BASED",
    "Fabric",
    "fat_tree",
    "grid",
    "heterogeneous_nics",
    "multi_chassis",
    "rail_optimized",
    "shipped_fabrics",
    "small_suite",
    "suite",
]

FAMILIES = ("multi-chassis", "heterogeneous-nics", "rail-optimized", "torus", "mesh", "fat-tree")

#: Which shipped topologies are switch-based (see the module docstring); every shipped file must be listed.
SHIPPED_SWITCH_BASED: dict[str, bool] = {
    "dgx-a100-4node": True, "dgx1-v100": False, "dgx2": True, "dgx2-2chassis": False, "emu-racks": True,
    "emu-uniform": True, "fattree-1024": True, "fattree-16384": True, "ibm-s822lc-48x4": True, "mesh-4x4": False,
    "mesh-4x4x4": False, "ndv2-2chassis": False, "pcie-4x4-10gbe": True, "rail-65536": True, "torus-4x4": False,
}


@dataclass(frozen=True, slots=True)
class Fabric:
    """One fabric of the suite: its name, family, rank count, whether it is switch-based, and its YAML."""

    name: str
    family: str
    ranks: int
    switch_based: bool
    yaml: str

    def topology(self) -> Topology:
        """Parse the YAML with the normal loader (a fresh topology each call: nothing cached is shared)."""
        return parse_topology_text(self.yaml, f"{self.name}.yaml")


# --------------------------------------------------------------------------- explicit YAML


def _gpus(name: str, count: int, host: str) -> str:
    return f"  - {{name: {name}, type: gpu, count: {count}, host: {host}}}"


def _link(a: str, b: str, bandwidth: str, kind: str, latency: str | None = None, forward: bool = False) -> str:
    extra = (f", latency: {latency}" if latency else "") + (", direction: forward" if forward else "")
    return f"  - {{ends: [{a}, {b}], bandwidth: {bandwidth}, kind: {kind}{extra}}}"


def multi_chassis(chassis: int, gpus: int, inter: str) -> Fabric:
    """``chassis`` chassis of ``gpus`` GPUs; ``inter`` is ``one-way`` or ``subset`` (see the module docstring).

    Inside a chassis: with 8 GPUs the DGX-1V / NDv2 hybrid cube-mesh (25 GB/s
    per NVLink 2.0 lane, 0.7 us, no PCIe, as TE-CCL models NDv2), otherwise an
    NVSwitch (DGX-2: 6 lanes x 25 GB/s per GPU, 0.35 us per hop).  Between
    chassis, TE-CCL's NDv2 figures (12.5 GB/s = 100 Gbit/s, 1.3 us):
    ``one-way``: GPU 8k of chassis c sends to GPU 8k+1 of chassis c+1 (one
    link per 8 GPUs, the last chassis feeding the first); ``subset``: GPUs
    0, 4, 8, ... each own a GPUDirect NIC on one InfiniBand switch, full duplex.
    """
    if inter not in ("one-way", "subset"):
        raise UsageError(f"multi_chassis: unknown inter-chassis wiring {inter!r}", fix="use one-way or subset")
    name = f"chassis-{chassis}x{gpus}-{inter}"
    inside = "NDv2 hybrid cube-mesh" if gpus == 8 else "NVSwitch"
    between = ("one-way 12.5 GB/s links from chassis c to c+1" if inter == "one-way"
               else "100 Gbit/s NICs on every 4th GPU, one switch")
    lines = [
        f"# {chassis} chassis of {gpus} GPUs in the style of TE-CCL/TACCL's multi-chassis models",
        f"# (NDv2 when 8 GPUs, else DGX-2-like); {between}.",
        f"name: {name}",
        f"description: {chassis} x {gpus} GPUs ({inside}), {between}",
        "defaults: {latency: 0.7 us}",
        "devices:",
    ]
    links = ["links:"]
    for c in range(chassis):
        lines.append(_gpus(f"c{c}.gpu", gpus, f"c{c}"))
        if gpus == 8:
            links += [_link(f"c{c}.gpu{a}", f"c{c}.gpu{b}", f"{25 * lanes} GB/s", "nvlink")
                      for (a, b), lanes in HYBRID_CUBE_MESH_LANES.items()]
        else:
            lines.append(f"  - {{name: c{c}.nvsw, type: nvswitch, host: c{c}}}")
            links += [_link(f"c{c}.gpu{i}", f"c{c}.nvsw", "150 GB/s", "nvlink", "0.35 us") for i in range(gpus)]
    if inter == "one-way":
        for c in range(chassis):
            nxt = (c + 1) % chassis
            links += [_link(f"c{c}.gpu{k}", f"c{nxt}.gpu{k + 1}", "12.5 GB/s", "ib", "1.3 us", forward=True)
                      for k in range(0, gpus, 8)]
    else:
        lines.append("  - {name: ib, type: switch}")
        links += [_link(f"c{c}.gpu{k}", "ib", "100 Gbit/s", "ib", "0.65 us")
                  for c in range(chassis) for k in range(0, gpus, 4)]
    return Fabric(name, "multi-chassis", chassis * gpus, False, "\n".join(lines + links) + "\n")


def heterogeneous_nics(nics: tuple[tuple[int, int], ...], gpus: int = 8) -> Fabric:
    """Hosts of ``gpus`` A100s on an NVSwitch whose NICs differ: ``nics[h]`` = (count, Gbit/s) of host h.

    Each NIC shares a PCIe gen4 switch (25 GB/s, 0.5 us) with ``gpus / count``
    GPUs; every NIC port joins one switch (0.5 us).  Resembles a cluster grown
    over hardware generations: DGX A100 hosts (8 x 200 Gbit/s HDR) beside
    servers with 4 x 200 or 2 x 100 Gbit/s (EDR) adapters.
    """
    kinds = ", ".join(f"{n} x {speed}G" for n, speed in dict.fromkeys(nics))
    name = f"hetero-nics-{len(nics)}x{gpus}"
    lines = [
        f"# {len(nics)} hosts of {gpus} A100 on NVSwitch whose NICs differ ({kinds}), on one switch: a",
        "# cluster grown over hardware generations.",
        f"name: {name}",
        f"description: {len(nics)} hosts x {gpus} GPUs, NICs per host {kinds}, one switch",
        "defaults: {latency: 0.5 us}",
        "devices:",
        "  - {name: sw, type: switch}",
    ]
    links = ["links:"]
    for h, (count, speed) in enumerate(nics):
        if gpus % count:
            raise UsageError(f"heterogeneous_nics: host {h} has {count} NICs for {gpus} GPUs",
                             fix="give each host a NIC count that divides its GPU count")
        lines += [_gpus(f"h{h}.gpu", gpus, f"h{h}"), f"  - {{name: h{h}.nvsw, type: nvswitch, host: h{h}}}",
                  f"  - {{name: h{h}.pcie, type: pcie, count: {count}, host: h{h}}}",
                  f"  - {{name: h{h}.nic, type: nic, count: {count}, host: h{h}}}"]
        links += [_link(f"h{h}.gpu{i}", f"h{h}.nvsw", "300 GB/s", "nvlink", "0.35 us") for i in range(gpus)]
        links += [_link(f"h{h}.gpu{i}", f"h{h}.pcie{i * count // gpus}", "25 GB/s", "pcie") for i in range(gpus)]
        for j in range(count):
            links += [_link(f"h{h}.pcie{j}", f"h{h}.nic{j}", "25 GB/s", "pcie"),
                      _link(f"h{h}.nic{j}", "sw", f"{speed} Gbit/s", "ib")]
    return Fabric(name, "heterogeneous-nics", len(nics) * gpus, True, "\n".join(lines + links) + "\n")


# --------------------------------------------------------------------------- cluster templates


def _nvswitch_host(gpus: int, nics: int) -> str:
    """A DGX A100-like ``host:`` block: NVLink 3 (12 x 25 GB/s, 0.35 us), ``nics`` HDR NICs on the GPUs."""
    return f"""  host:
    gpus: {gpus}
    fabric: nvswitch
    gpu_link: {{bandwidth: 25 GB/s, count: 12, latency: 0.35 us}}   # NVLink 3 (A100 datasheet)
    nics: {nics}
    nic: {{bandwidth: 200 Gbit/s, latency: 0.5 us, kind: ib, attach_bandwidth: 25 GB/s, attach_latency: 0.5 us}}
"""


def rail_optimized(hosts: int, gpus: int = 8, spines: int = 2, pods: int = 1) -> Fabric:
    """``hosts`` DGX A100-like hosts, NIC r of each on rail switch r; ``spines`` non-blocking spines join the rails.

    With spines it is the DGX SuperPOD design scaled down; without (``spines=0``)
    the rail-only network of Wang et al., "How to Build Low-cost Networks for
    Large Language Models" (2023), where traffic between rails relays over NVLink.
    With ``pods`` > 1 it is the three tiers of a large SuperPOD in miniature: each
    host is a scalable unit with its own rails, each pod's units under its own
    ``spines``, and two non-blocking cores joining the pods' spines.
    """
    if pods > 1:
        name = f"rail3-{hosts}x{gpus}"
        shape = f"three tiers, {pods} pods of {hosts // pods} units under {spines} spines each, 2 cores"
        network = (f"{{type: rail-optimized, hosts_per_rail: 1, hosts_per_pod: {hosts // pods}, spines: {spines}, "
                   "cores: 2, latency: 0.5 us}")
    else:
        name = f"rail-{hosts}x{gpus}" if spines else f"rail-only-{hosts}x{gpus}"
        shape = f"{spines} non-blocking spines" if spines else "no spines (rail-only)"
        network = f"{{type: rail-optimized, spines: {spines}, latency: 0.5 us}}"
    text = f"""# {hosts} DGX A100-like hosts on a rail-optimized InfiniBand network, {shape}.
name: {name}
description: {hosts} hosts x {gpus} GPUs (NVSwitch), {gpus} x 200 Gbit/s NICs, rails with {shape}
cluster:
  hosts: {hosts}
{_nvswitch_host(gpus, gpus)}  network: {network}
"""
    return Fabric(name, "rail-optimized", hosts * gpus, spines > 0, text)


def grid(kind: str, dims: tuple[int, ...]) -> Fabric:
    """A ``torus`` or ``mesh`` of single-accelerator nodes, a router each (MultiTree's setting, in 3D).

    25 GB/s and 0.5 us per router link as the shipped ``torus-4x4``; a 100 GB/s
    port from the accelerator into its router, so injection never binds.  A 3D
    torus of this kind is how TPU v4 slices and Cray-style machines are wired.
    """
    shape = "x".join(map(str, dims))
    name = f"{kind}-{shape}"
    ranks = math.prod(dims)
    text = f"""# A {shape} {kind} of single-accelerator nodes, one router each (MultiTree's setting in {len(dims)}D).
name: {name}
description: {ranks} accelerators, routers in a {shape} {kind}, 25 GB/s links
cluster:
  hosts: {ranks}
  host:
    gpus: 1
    nics: 1
    nic: {{bandwidth: 100 GB/s, latency: 0 us, kind: noc, attach_latency: 0 us}}
  network:
    type: {kind}
    dims: [{", ".join(map(str, dims))}]
    link: {{bandwidth: 25 GB/s, latency: 0.5 us}}
"""
    return Fabric(name, kind, ranks, False, text)


def fat_tree(hosts: int, per_leaf: int, spines: int, oversubscription: int, gpus: int = 8) -> Fabric:
    """A two-tier fat-tree of DGX A100-like hosts (8 x 200 Gbit/s each), leaves ``oversubscription``:1 to spines.

    With ``gpus`` other than 8 the hosts are commodity PCIe servers instead:
    GPUs in pairs on PCIe gen4 switches (25 GB/s) and one 100 Gbit/s Ethernet
    NIC (RoCE), as in many cloud and university clusters.
    """
    ratio = oversubscription
    name = f"fattree-{hosts * gpus}-{ratio}to1" + ("" if gpus == 8 else "-pcie")
    if gpus == 8:
        host = _nvswitch_host(gpus, gpus)
        what = "DGX A100-like hosts (8 GPUs on NVSwitch, 8 x 200 Gbit/s NICs)"
    else:
        host = f"""  host:
    gpus: {gpus}
    fabric: pcie-tree
    pcie: {{bandwidth: 25 GB/s, latency: 1 us, gpus_per_switch: 2}}   # PCIe gen4 x16
    nics: 1
    nic: {{bandwidth: 100 Gbit/s, latency: 2 us, kind: ethernet, attach: cpu, attach_bandwidth: 25 GB/s}}
"""
        what = f"PCIe servers ({gpus} GPUs, one 100 Gbit/s RoCE NIC)"
    leaves = f"{hosts // per_leaf} leaves of {per_leaf} hosts" + (f" and one of {hosts % per_leaf} (a cluster grown by "
                                                                  "part of a leaf)" if hosts % per_leaf else "")
    text = f"""# A leaf-spine (two-tier Clos) cluster of {what}:
# {leaves} under {spines} spines, {ratio}:1 oversubscribed.
name: {name}
description: {hosts} {what}; two-tier fat-tree, {ratio}:1
cluster:
  hosts: {hosts}
{host}  network:
    type: fat-tree
    hosts_per_leaf: {per_leaf}
    spines: {spines}
    oversubscription: {ratio}
    latency: 0.5 us
"""
    return Fabric(name, "fat-tree", hosts * gpus, True, text)


# --------------------------------------------------------------------------- the suites


def suite() -> tuple[Fabric, ...]:
    """The full suite, 16 to 512 ranks, smallest first within each family."""
    return (
        *(multi_chassis(c, g, inter) for c, g in ((2, 8), (2, 16), (4, 8), (4, 16)) for inter in ("one-way", "subset")),
        heterogeneous_nics(((4, 200), (4, 200), (2, 100), (2, 100))),
        heterogeneous_nics(((8, 200), (8, 200), (4, 200), (4, 200), (4, 100), (4, 100), (2, 100), (2, 100))),
        *(rail_optimized(hosts) for hosts in (4, 8, 16, 32)),
        rail_optimized(4, spines=0),
        grid("torus", (4, 4, 4)), grid("torus", (8, 8, 8)),
        grid("mesh", (4, 4, 4)), grid("mesh", (8, 8, 8)),
        fat_tree(2, 1, 2, 2), fat_tree(8, 2, 4, 4), fat_tree(10, 4, 4, 2), fat_tree(32, 8, 2, 4, gpus=4),
        fat_tree(32, 4, 8, 2),
    )


def small_suite() -> tuple[Fabric, ...]:
    """Every family in miniature (8-16 ranks), for the property tests."""
    return (
        multi_chassis(2, 4, "one-way"), multi_chassis(2, 4, "subset"), multi_chassis(2, 8, "one-way"),
        heterogeneous_nics(((2, 200), (1, 100)), gpus=4),
        rail_optimized(2, gpus=4, spines=1), rail_optimized(2, gpus=4, spines=0), rail_optimized(4, 2, 2, pods=2),
        grid("torus", (4, 2, 1)), grid("mesh", (2, 2, 2)),  # a 3x2x2 torus costs treepack 10-20 s
        fat_tree(4, 2, 1, 2, gpus=2),
    )


@functools.cache
def shipped_fabrics() -> tuple[Fabric, ...]:
    """The shipped topologies as fabrics of family ``shipped`` (ranks read by loading each, once a process: the
    largest takes seconds)."""
    fabrics = []
    for name, path in shipped_topologies().items():
        text = path.read_text()
        ranks = parse_topology_text(text, str(path)).size
        fabrics.append(Fabric(name, "shipped", ranks, SHIPPED_SWITCH_BASED.get(name, False), text))
    return tuple(fabrics)
