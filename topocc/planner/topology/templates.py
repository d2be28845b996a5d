"""Compact cluster templates: ``cluster:`` in a topology file, expanded into devices and links.

An engineer describes one host (GPUs, their fabric, PCIe, NICs) and the network
that joins the hosts; :func:`expand_cluster` replicates the host and builds the
network, so a 1024-GPU cluster is a dozen lines::

    cluster:
      hosts: 128
      host:
        gpus: 8
        fabric: nvswitch
        gpu_link: {bandwidth: 25 GB/s, count: 12, latency: 0.35 us}
        nics: 8
        nic: {bandwidth: 200 Gbit/s, latency: 0.5 us, attach_bandwidth: 32 GB/s}
      network: {type: fat-tree, hosts_per_leaf: 4, spines: 16, oversubscription: 2}

The network's ``routing`` defaults by type (torus and mesh: ``dimension-order``;
switched networks: ``ecmp``, see ``docs/topology-format.md`` for why).

Names: host ``h`` holds ``h{h}.gpu{i}``, ``h{h}.nvsw0``, ``h{h}.pcie{k}``,
``h{h}.cpu{c}``, ``h{h}.nic{j}`` and its extra local devices; the network adds
``sw0``, ``leaf{l}``/``spine{s}``, ``rail{r}`` or per-host routers ``r{h}``.
GPUs are declared host by host, so GPU ``i`` of host ``h`` is rank ``h*G + i``.
The format is documented in ``docs/topology-format.md``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from topocc.planner._yaml import Source, YDict
from topocc.planner.topology._fields import (
    LinkDefaults,
    check_figures,
    check_keys,
    choice,
    close_match,
    name_string,
    parse_link,
    positive_int,
    quantity,
)
from topocc.planner.topology.model import DEFAULT_ROUTING, DEVICE_KINDS, ROUTING_MODES, Device, Link
from topocc.planner.topology.plausible import gpu_fabric
from topocc.planner.units import parse_bandwidth, parse_time

__all__ = ["FABRICS", "HYBRID_CUBE_MESH_LANES", "MAX_DEVICES", "MAX_LINKS", "NETWORKS", "NETWORK_ROUTING",
           "expand_cluster"]

FABRICS = ("nvswitch", "hybrid-cube-mesh", "pcie-tree", "fully-connected", "none")
NETWORKS = ("single-switch", "fat-tree", "rail-optimized", "torus", "mesh", "none")

#: NVLink lanes between GPU pairs of a DGX-1 (V100), from ``nvidia-smi topo -m`` on a DGX-1V
#: (NV1/NV2 entries); every GPU has 6 lanes.
HYBRID_CUBE_MESH_LANES: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}

#: Guards against a typo (``hosts: 100000``) that would build a graph nobody meant.
MAX_DEVICES = 1_000_000
MAX_LINKS = 4_000_000

_CLUSTER_KEYS = ("hosts", "host", "network", "hosts_per_rack")
_HOST_KEYS = ("gpus", "fabric", "gpu_link", "pcie", "nics", "nic", "devices", "links")
_SPEC_KEYS = ("bandwidth", "latency", "count", "kind")
_PCIE_KEYS = ("bandwidth", "latency", "kind", "gpus_per_switch", "cpus", "uplink", "cpu_link")
_NIC_KEYS = ("bandwidth", "latency", "kind", "attach", "attach_bandwidth", "attach_latency")
_HOST_DEVICE_KEYS = ("name", "type", "count")
_NETWORK_KEYS = {
    "none": ("type", "routing"),
    "single-switch": ("type", "routing"),
    "fat-tree": ("type", "hosts_per_leaf", "spines", "oversubscription", "latency", "routing"),
    "rail-optimized": ("type", "hosts_per_rail", "hosts_per_pod", "spines", "cores", "oversubscription",
                       "core_oversubscription", "latency", "routing"),
    "torus": ("type", "dims", "link", "routing"),
    "mesh": ("type", "dims", "link", "routing"),
}
#: Routing of each network type unless ``routing:`` says otherwise: grids route in dimension order (their
#: routers do; MultiTree and TACOS model it so); switched networks hash each flow onto one path (RoCE's ECMP;
#: InfiniBand's subnet manager also fixes one path per destination unless adaptive routing is on).
NETWORK_ROUTING = {
    "none": DEFAULT_ROUTING,
    "single-switch": "ecmp",
    "fat-tree": "ecmp",
    "rail-optimized": "ecmp",
    "torus": "dimension-order",
    "mesh": "dimension-order",
}
_RATIO = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*:\s*([0-9]*\.?[0-9]+)\s*$")


@dataclass(frozen=True, slots=True)
class _Spec:
    """Figures of one kind of link: ``bandwidth`` per lane, ``count`` lanes."""

    bandwidth: float
    latency: float
    count: int
    kind: str

    def links(self, a: str, b: str, lanes: int | None = None, dim: int | None = None) -> list[Link]:
        """Both directions of a full-duplex link ``a <-> b`` (with ``dim``: a grid link, ``a -> b`` ascending)."""
        n = self.count if lanes is None else lanes
        bw = self.bandwidth * n
        return [Link(a, b, bw, self.latency, n, self.kind, dim),
                Link(b, a, bw, self.latency, n, self.kind, dim, ascending=False)]


@dataclass(slots=True)
class _Host:
    """One host in local names (``gpu0``, ``nic1``, ...), to be replicated per host."""

    gpus: int
    devices: list[tuple[str, str]]  # (local name, kind), GPUs first
    links: list[Link]
    nics: int
    nic: _Spec | None  # the NIC's port to the network


def expand_cluster(src: Source, section: Any, defaults: LinkDefaults,
                   routing: str | None = None) -> tuple[list[Device], list[Link], str]:
    """Expand a ``cluster:`` mapping into devices (GPUs host by host), directed links and the routing.

    ``routing`` is the topology's own ``routing:`` (None: not given); the
    network's must agree with it, and without either the network type decides
    (:data:`NETWORK_ROUTING`).  Raises :class:`topocc.planner.errors.TopologyError`
    pointing at the offending key.
    """
    cluster = check_keys(src, section, "cluster", _CLUSTER_KEYS, ("hosts", "host"))
    hosts = positive_int(src, cluster, "hosts")
    host = _parse_host(src, cluster["host"], defaults)
    if hosts * len(host.devices) > MAX_DEVICES or hosts * len(host.links) > MAX_LINKS:
        raise src.error(cluster, "hosts", f"{hosts} hosts of {len(host.devices)} devices each is too large a model",
                        fix=f"at most {MAX_DEVICES} devices and {MAX_LINKS} links")

    network = cluster.get("network")
    net_type = _network_type(src, cluster, network, hosts)
    net = check_keys(src, network, f"network ({net_type})", _NETWORK_KEYS[net_type]) if network else YDict()
    if net_type != "none" and host.nic is None:
        raise src.error(net, "type", f"a {net_type} network joins hosts through NICs, but each host has none",
                        fix="add nics: and nic: {bandwidth: ...} under host:")

    routing = _network_routing(src, net, net_type, routing)
    racks = _racks(src, cluster, net, net_type, hosts)
    devices: list[Device] = []
    links: list[Link] = []
    for h in range(hosts):
        prefix = f"h{h}."
        label = f"h{h}"
        rack = None if racks is None else f"rack{h // racks}"
        devices.extend(Device(prefix + name, kind, label, rack) for name, kind in host.devices)
        links.extend(Link(prefix + ln.src, prefix + ln.dst, ln.bandwidth, ln.latency, ln.count, ln.kind)
                     for ln in host.links)

    if net_type != "none" and host.nic is not None:
        _NETWORK_BUILDERS[net_type](src, net, hosts, host.nics, host.nic, devices, links)
    return devices, links, routing


# --------------------------------------------------------------------------- the host


def _parse_host(src: Source, section: Any, defaults: LinkDefaults) -> _Host:
    """Validate ``host:`` and build one host in local names."""
    host = check_keys(src, section, "host", _HOST_KEYS, ("gpus",))
    gpus = positive_int(src, host, "gpus")
    if gpus > MAX_DEVICES:
        raise src.error(host, "gpus", f"gpus: {gpus} is too many for one host")
    fabric = choice(src, host, "fabric", FABRICS, "none", "fabric")

    devices: list[tuple[str, str]] = [(f"gpu{i}", "gpu") for i in range(gpus)]
    links: list[Link] = []

    if fabric in ("nvswitch", "hybrid-cube-mesh", "fully-connected"):
        if "gpu_link" not in host:
            raise src.error(host, "fabric", f"fabric {fabric} needs gpu_link: {{bandwidth: ..., latency: ...}}")
        lanes_fixed = fabric == "hybrid-cube-mesh"
        gpu_link = _spec(src, host, "gpu_link", "gpu_link", defaults, "nvlink", count=not lanes_fixed)
        if fabric == "nvswitch":
            devices.append(("nvsw0", "nvswitch"))
            for i in range(gpus):
                links += gpu_link.links(f"gpu{i}", "nvsw0")
        elif fabric == "hybrid-cube-mesh":
            if gpus != 8:
                raise src.error(host, "gpus", f"fabric hybrid-cube-mesh has 8 GPUs (DGX-1), got gpus: {gpus}")
            for (a, b), lanes in HYBRID_CUBE_MESH_LANES.items():
                links += gpu_link.links(f"gpu{a}", f"gpu{b}", lanes)
        else:
            if gpus * (gpus - 1) > MAX_LINKS:
                raise src.error(host, "gpus", f"fully-connected {gpus} GPUs is too many links")
            for a in range(gpus):
                for b in range(a + 1, gpus):
                    links += gpu_link.links(f"gpu{a}", f"gpu{b}")
    elif "gpu_link" in host:
        raise src.error(host, "gpu_link", f"gpu_link is not used by fabric {fabric}",
                        fix="remove it, or choose fabric: nvswitch, hybrid-cube-mesh or fully-connected")

    gpu_switch: list[int] = []  # PCIe switch of each GPU
    switch_cpu: list[int] = []  # CPU of each PCIe switch
    if "pcie" in host:
        gpu_switch, switch_cpu = _pcie(src, host, gpus, defaults, devices, links)
    elif fabric == "pcie-tree":
        raise src.error(host, "fabric", "fabric pcie-tree needs pcie: {bandwidth: ..., gpus_per_switch: ...}")

    _extra_devices(src, host, devices)  # before the NICs: a NIC may attach to one of them
    nics, nic = _nics(src, host, gpus, defaults, devices, links, gpu_switch, switch_cpu)
    _extra_links(src, host, defaults, devices, links)
    return _Host(gpus, devices, links, nics, nic)


def _pcie(src: Source, host: YDict, gpus: int, defaults: LinkDefaults, devices: list[tuple[str, str]],
          links: list[Link]) -> tuple[list[int], list[int]]:
    """PCIe switches, CPUs and the links among them; returns each GPU's switch and each switch's CPU."""
    pcie = check_keys(src, host["pcie"], "pcie", _PCIE_KEYS)
    gpu_spec = _spec_of(src, pcie, "pcie", defaults, "pcie")
    per_switch = positive_int(src, pcie, "gpus_per_switch", gpus)
    if gpus % per_switch:
        raise src.error(pcie, "gpus_per_switch", f"gpus_per_switch: {per_switch} does not divide gpus: {gpus}")
    switches = gpus // per_switch
    cpus = positive_int(src, pcie, "cpus", 1)
    if switches % cpus:
        raise src.error(pcie, "cpus", f"cpus: {cpus} does not divide the {switches} PCIe switches",
                        fix="each CPU gets the same number of PCIe switches")
    uplink = _spec(src, pcie, "uplink", "pcie uplink", defaults, "pcie") if "uplink" in pcie else gpu_spec
    devices.extend((f"pcie{k}", "pcie") for k in range(switches))
    devices.extend((f"cpu{c}", "cpu") for c in range(cpus))
    gpu_switch = [i // per_switch for i in range(gpus)]
    switch_cpu = [k * cpus // switches for k in range(switches)]
    for i in range(gpus):
        links += gpu_spec.links(f"gpu{i}", f"pcie{gpu_switch[i]}")
    for k in range(switches):
        links += uplink.links(f"pcie{k}", f"cpu{switch_cpu[k]}")
    if cpus > 1:
        if "cpu_link" not in pcie:
            raise src.error(pcie, "cpus", f"cpus: {cpus} needs cpu_link: {{bandwidth: ..., latency: ...}}",
                            fix="give the CPU-CPU link (QPI/UPI/X-bus)")
        cpu_link = _spec(src, pcie, "cpu_link", "cpu_link", defaults, "qpi")
        for a in range(cpus):
            for b in range(a + 1, cpus):
                links += cpu_link.links(f"cpu{a}", f"cpu{b}")
    elif "cpu_link" in pcie:
        raise src.error(pcie, "cpu_link", "cpu_link needs cpus: 2 or more")
    return gpu_switch, switch_cpu


def _nics(src: Source, host: YDict, gpus: int, defaults: LinkDefaults, devices: list[tuple[str, str]],
          links: list[Link], gpu_switch: list[int], switch_cpu: list[int]) -> tuple[int, _Spec | None]:
    """NICs and their attach links; NIC ``j`` serves GPUs ``j*G/nics .. (j+1)*G/nics - 1``."""
    nics = positive_int(src, host, "nics", 1 if "nic" in host else 0, minimum=0)
    if nics == 0:
        if "nic" in host:
            raise src.error(host, "nic", "nic: is given but nics: is 0")
        return 0, None
    if "nic" not in host:
        raise src.error(host, "nics", f"nics: {nics} needs nic: {{bandwidth: ..., latency: ...}}")
    if gpus % nics:
        raise src.error(host, "nics", f"nics: {nics} does not divide gpus: {gpus}",
                        fix="each NIC serves the same number of GPUs")
    nic = check_keys(src, host["nic"], "nic", _NIC_KEYS)
    port = _spec_of(src, nic, "nic", defaults, "ib", count=False)
    attach_bw = quantity(src, nic, "attach_bandwidth", parse_bandwidth, port.bandwidth)
    attach_lat = quantity(src, nic, "attach_latency", parse_time, defaults.latency)
    check_figures(src, nic, defaults, attach_bw, attach_lat, False, ("attach_bandwidth", "attach_latency"))
    attach_spec = _Spec(attach_bw, attach_lat, 1, "pcie")
    local = {name for name, _ in devices}
    attach = nic.get("attach", "pcie" if gpu_switch else "gpu")
    if not isinstance(attach, str) or (attach not in ("gpu", "pcie", "cpu") and attach not in local):
        hint = close_match(str(attach), ["gpu", "pcie", "cpu", *sorted(local)])
        raise src.error(nic, "attach", f"unknown NIC attach point {attach!r}",
                        fix=f"did you mean {hint!r}?" if hint else "use gpu, pcie, cpu or a local device name")
    if attach in ("pcie", "cpu") and not gpu_switch:
        raise src.error(nic, "attach", f"attach: {attach} needs pcie: under host")
    per_nic = gpus // nics
    for j in range(nics):
        served = range(j * per_nic, (j + 1) * per_nic)
        if attach == "gpu":
            ends = [f"gpu{i}" for i in served]
        elif attach == "pcie":
            ends = [f"pcie{k}" for k in dict.fromkeys(gpu_switch[i] for i in served)]
        elif attach == "cpu":
            ends = [f"cpu{c}" for c in dict.fromkeys(switch_cpu[gpu_switch[i]] for i in served)]
        else:
            ends = [attach]
        for end in ends:
            links += attach_spec.links(end, f"nic{j}")
    devices.extend((f"nic{j}", "nic") for j in range(nics))
    return nics, port


def _extra_devices(src: Source, host: YDict, devices: list[tuple[str, str]]) -> None:
    """``host: devices:``, local names replicated per host (not GPUs: those come from ``gpus:``)."""
    items = host.get("devices", [])
    if not isinstance(items, list):
        raise src.error(host, "devices", "host devices must be a list")
    known = {name for name, _ in devices}
    for item in items:
        check_keys(src, item, "a host device", _HOST_DEVICE_KEYS, ("name", "type"))
        base = name_string(src, item, "name")
        kind = item["type"]
        if kind == "gpu":
            raise src.error(item, "type", "GPUs of a host come from gpus:, not host devices")
        if kind not in DEVICE_KINDS:
            hint = close_match(str(kind), DEVICE_KINDS)
            raise src.error(item, "type", f"unknown device type {kind!r}",
                            fix=f"did you mean {hint!r}?" if hint else f"use one of {', '.join(DEVICE_KINDS)}")
        count = positive_int(src, item, "count", 0, minimum=0) if "count" in item else None
        if count is not None and count > MAX_DEVICES:
            raise src.error(item, "count", f"count: {count} is too many devices")
        for name in [base] if count is None else [f"{base}{j}" for j in range(count)]:
            if name in known or "." in name:
                raise src.error(item, "name", f"host device {name!r} clashes with a generated name or has a '.'",
                                fix="generated names are gpuI, nvsw0, pcieK, cpuC, nicJ; pick another")
            known.add(name)
            devices.append((name, kind))


def _extra_links(src: Source, host: YDict, defaults: LinkDefaults, devices: list[tuple[str, str]],
                 links: list[Link]) -> None:
    """``host: links:`` between local names, replicated per host."""
    items = host.get("links", [])
    if not isinstance(items, list):
        raise src.error(host, "links", "host links must be a list")
    known = [name for name, _ in devices]
    taken = {(ln.src, ln.dst) for ln in links}
    types = dict(devices)
    for item in items:
        new, a, b = parse_link(src, item, defaults, types)
        for end in (a, b):
            if end not in known:
                hint = close_match(end, known)
                raise src.error(item, "ends", f"host link names unknown local device {end!r}",
                                fix=f"did you mean {hint!r}?" if hint else "use local names: gpu0, nic0, cpu0, ...")
        for link in new:
            if (link.src, link.dst) in taken:
                raise src.error(item, "ends", f"host link {link.src} -> {link.dst} already exists",
                                fix="the fabric, pcie: or nic: settings already made it")
            taken.add((link.src, link.dst))
        links += new


# --------------------------------------------------------------------------- the network


def _network_type(src: Source, cluster: YDict, network: Any, hosts: int) -> str:
    """The network's ``type``, checked against the host count."""
    if network is None:
        if hosts > 1:
            raise src.error(cluster, "hosts", f"{hosts} hosts need a network to join them",
                            fix="add network: {type: single-switch} (or fat-tree, rail-optimized, torus, mesh)")
        return "none"
    if not isinstance(network, dict):
        raise src.error(cluster, "network", "network must be a mapping, e.g. {type: single-switch}")
    net_type = choice(src, network, "type", NETWORKS, None, "network type")
    if net_type == "none" and hosts > 1:
        raise src.error(network, "type", f"{hosts} hosts cannot share network type none")
    return net_type


def _network_routing(src: Source, net: YDict, net_type: str, topology_routing: str | None) -> str:
    """The network's ``routing:``, checked against its type and the topology's; else the type's default."""
    if "routing" not in net:
        return topology_routing or NETWORK_ROUTING[net_type]
    routing = choice(src, net, "routing", ROUTING_MODES, None, "routing")
    if routing == "dimension-order" and net_type not in ("torus", "mesh"):
        raise src.error(net, "routing", f"dimension-order routing needs a torus or mesh network, not {net_type}",
                        fix="use ecmp, source or spray")
    if topology_routing is not None and topology_routing != routing:
        raise src.error(net, "routing", f"the network's routing {routing!r} contradicts the topology's "
                        f"routing {topology_routing!r}", fix="give the routing once")
    return routing


def _racks(src: Source, cluster: YDict, net: YDict, net_type: str, hosts: int) -> int | None:
    """Hosts per rack: ``hosts_per_rack`` if given, else a fat-tree's hosts per leaf or a rail-optimized
    network's scalable unit, else no racks."""
    if "hosts_per_rack" in cluster:
        return positive_int(src, cluster, "hosts_per_rack")
    if net_type == "fat-tree":
        return positive_int(src, net, "hosts_per_leaf")
    if net_type == "rail-optimized" and "hosts_per_rail" in net:
        return positive_int(src, net, "hosts_per_rail")  # a scalable unit's hosts share its rail switches
    return None


def _single_switch(src: Source, net: YDict, hosts: int, nics: int, nic: _Spec, devices: list[Device],
                   links: list[Link]) -> None:
    """Every NIC on one switch ``sw0``."""
    devices.append(Device("sw0", "switch"))
    for h in range(hosts):
        for j in range(nics):
            links += nic.links(f"h{h}.nic{j}", "sw0")


def _fat_tree(src: Source, net: YDict, hosts: int, nics: int, nic: _Spec, devices: list[Device],
              links: list[Link]) -> None:
    """Two levels: leaf ``l`` serves hosts ``l*k .. l*k+k-1`` (the last leaf fewer where ``k`` does not divide
    the hosts: a cluster grown by a partial leaf); every leaf links to every spine.

    A leaf's uplinks carry its downlink bandwidth (all ``k`` hosts' worth: a
    switch's ports do not shrink with the hosts plugged in) divided by
    ``oversubscription``.
    """
    per_leaf = positive_int(src, net, "hosts_per_leaf")
    leaves = -(-hosts // per_leaf)
    for leaf in range(leaves):
        devices.append(Device(f"leaf{leaf}", "switch", rack=f"rack{leaf}"))
        for h in range(leaf * per_leaf, min(hosts, (leaf + 1) * per_leaf)):
            for j in range(nics):
                links += nic.links(f"h{h}.nic{j}", f"leaf{leaf}")
    down = per_leaf * nics * nic.bandwidth * nic.count
    _spines(src, net, [f"leaf{leaf}" for leaf in range(leaves)], down, nic, devices, links, leaves > 1)


def _rail_optimized(src: Source, net: YDict, hosts: int, nics: int, nic: _Spec, devices: list[Device],
                    links: list[Link]) -> None:
    """Rail switches join NIC ``r`` of the hosts of a scalable unit; spines join the rails, cores the pods.

    Without ``hosts_per_rail``, ``rail{r}`` joins NIC ``r`` of every host and
    optional ``spines`` join the rails.  With it, the hosts come in scalable
    units of that many (``su{u}``, a rack), each with its own rail switches
    ``su{u}-rail{r}``; with ``hosts_per_pod`` too, the units come in pods, each
    pod's rails under its own ``spines`` (``pod{p}-spine{s}``) and every pod
    spine under every core ``core{c}``: the three tiers of a large cluster.
    """
    per_rail = positive_int(src, net, "hosts_per_rail", hosts)
    if hosts % per_rail:
        raise src.error(net, "hosts_per_rail", f"hosts_per_rail {per_rail} does not divide hosts: {hosts}",
                        fix="give a divisor of the host count (scalable units are whole)")
    units = hosts // per_rail
    if "hosts_per_pod" in net and "hosts_per_rail" not in net:
        raise src.error(net, "hosts_per_pod", "pods are made of scalable units, and hosts_per_rail is not given",
                        fix="add hosts_per_rail: the hosts that share a unit's rail switches")
    per_pod = positive_int(src, net, "hosts_per_pod", hosts)
    if per_pod % per_rail or hosts % per_pod:
        raise src.error(net, "hosts_per_pod", f"hosts_per_pod {per_pod} must be a multiple of hosts_per_rail "
                        f"{per_rail} and divide hosts: {hosts}", fix="pods are whole scalable units")
    if per_pod < hosts and "cores" not in net:
        raise src.error(net, "hosts_per_pod", f"{hosts // per_pod} pods need cores to join them",
                        fix="add cores: 1 or more (the third tier)")
    for key in ("cores", "core_oversubscription"):
        if key in net and per_pod == hosts:
            raise src.error(net, key, f"{key} applies to pods, and all hosts are one pod", fix="add hosts_per_pod")

    def rail(u: int, r: int) -> str:
        return f"rail{r}" if units == 1 else f"su{u}-rail{r}"

    for u in range(units):
        for r in range(nics):
            devices.append(Device(rail(u, r), "switch", rack=None if units == 1 else f"rack{u}"))
            for h in range(u * per_rail, (u + 1) * per_rail):
                links += nic.links(f"h{h}.nic{r}", rail(u, r))
    down = per_rail * nic.bandwidth * nic.count
    if per_pod == hosts:
        _spines(src, net, [rail(u, r) for u in range(units) for r in range(nics)], down, nic, devices, links,
                units > 1)
        return
    pods, units_per_pod = hosts // per_pod, per_pod // per_rail
    spine_names: list[str] = []
    for p in range(pods):
        rails = [rail(u, r) for u in range(p * units_per_pod, (p + 1) * units_per_pod) for r in range(nics)]
        spine_names += _spines(src, net, rails, down, nic, devices, links, True, f"pod{p}-")
    # a pod spine's downlinks: one from each of its pod's rails, each carrying that rail's share of its uplinks
    spines_per_pod = len(spine_names) // pods
    spine_down = units_per_pod * nics * down / _ratio(src, net, "oversubscription") / spines_per_pod
    _tier(src, net, "cores", "core_oversubscription", spine_names, spine_down, nic, devices, links, "core",
          default=1, minimum=1)


def _spines(src: Source, net: YDict, lower: list[str], down: float, nic: _Spec, devices: list[Device],
            links: list[Link], required: bool, prefix: str = "") -> list[str]:
    """Spine switches above ``lower`` switches whose downlinks total ``down`` bytes/s each; their names."""
    return _tier(src, net, "spines", "oversubscription", lower, down, nic, devices, links, prefix + "spine",
                 default=1 if required else 0, minimum=0)


def _tier(src: Source, net: YDict, key: str, ratio_key: str, lower: list[str], down: float, nic: _Spec,
          devices: list[Device], links: list[Link], name: str, *, default: int, minimum: int) -> list[str]:
    """``net[key]`` switches ``{name}{i}`` above ``lower``, each lower switch linked to each of them; a lower
    switch's uplinks together carry its downlinks' ``down`` bytes/s divided by ``net[ratio_key]``."""
    count = positive_int(src, net, key, default, minimum=minimum)
    if count == 0:
        if ratio_key in net:
            raise src.error(net, ratio_key, f"{ratio_key} needs {key}: 1 or more")
        return []
    ratio = _ratio(src, net, ratio_key)
    latency = quantity(src, net, "latency", parse_time, nic.latency)
    check_figures(src, net, LinkDefaults(), None, latency, False)
    spec = _Spec(down / ratio / count, latency, 1, nic.kind)
    names = [f"{name}{i}" for i in range(count)]
    devices.extend(Device(n, "switch") for n in names)
    for low in lower:
        for up in names:
            links += spec.links(low, up)
    return names


def _grid(src: Source, net: YDict, hosts: int, nics: int, nic: _Spec, devices: list[Device],
          links: list[Link]) -> None:
    """A router ``r{h}`` per host, routers in a torus or mesh; hosts laid out row-major over ``dims``."""
    dims_value = net.get("dims")
    if (not isinstance(dims_value, list) or not dims_value
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims_value)):
        raise src.error(net, "dims" if "dims" in net else None,
                        f"dims must be a list of whole numbers >= 1, e.g. [4, 4], got {dims_value!r}")
    dims: list[int] = list(dims_value)
    if math.prod(dims) != hosts:
        raise src.error(net, "dims", f"dims {dims} hold {math.prod(dims)} hosts, but hosts: {hosts}",
                        fix="the product of dims must equal hosts")
    if "link" not in net:
        raise src.error(net, None, f"a {net['type']} network needs link: {{bandwidth: ..., latency: ...}}")
    spec = _spec(src, net, "link", "network link", LinkDefaults(nic.latency), nic.kind)
    wrap = net["type"] == "torus"
    strides = [math.prod(dims[k + 1:]) for k in range(len(dims))]
    for h in range(hosts):
        devices.append(Device(f"r{h}", "switch"))
        for j in range(nics):
            links += nic.links(f"h{h}.nic{j}", f"r{h}")
    for h in range(hosts):
        for dim, (size, stride) in enumerate(zip(dims, strides)):
            coord = (h // stride) % size
            if coord + 1 < size:
                links += spec.links(f"r{h}", f"r{h + stride}", dim=dim)
            elif wrap and size > 2:  # a ring of 2 already has its one link; a ring of 1 has none
                links += spec.links(f"r{h}", f"r{h - coord * stride}", dim=dim)


_NETWORK_BUILDERS = {
    "single-switch": _single_switch,
    "fat-tree": _fat_tree,
    "rail-optimized": _rail_optimized,
    "torus": _grid,
    "mesh": _grid,
}


# --------------------------------------------------------------------------- helpers


def _spec(src: Source, parent: YDict, key: str, what: str, defaults: LinkDefaults, kind: str,
          count: bool = True) -> _Spec:
    """A link-figures mapping ``parent[key]``: bandwidth (per lane), latency, count, kind."""
    obj = check_keys(src, parent[key], what, _SPEC_KEYS if count else ("bandwidth", "latency", "kind"))
    return _spec_of(src, obj, what, defaults, kind, count)


def _spec_of(src: Source, obj: YDict, what: str, defaults: LinkDefaults, kind: str, count: bool = True) -> _Spec:
    """Link figures read from ``obj`` itself (which may hold other keys too)."""
    bandwidth = quantity(src, obj, "bandwidth", parse_bandwidth, defaults.bandwidth)
    latency = quantity(src, obj, "latency", parse_time, defaults.latency)
    lanes = positive_int(src, obj, "count", 1) if count else 1
    label = _kind_name(src, obj, kind)
    check_figures(src, obj, defaults, bandwidth, latency, gpu_fabric(label))
    return _Spec(bandwidth, latency, lanes, label)


def _kind_name(src: Source, obj: YDict, default: str) -> str:
    value = obj.get("kind", default)
    if not isinstance(value, str) or not value.strip():
        raise src.error(obj, "kind", f"kind must be a name such as nvlink, pcie or ib, got {value!r}")
    return value


def _ratio(src: Source, net: YDict, key: str) -> float:
    """An oversubscription ratio: ``2``, ``1.5`` or ``"2:1"``; 1 when absent."""
    value = net.get(key, 1)
    ratio: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ratio = float(value)
    elif isinstance(value, str) and (m := _RATIO.match(value)) and float(m.group(2)) > 0:
        ratio = float(m.group(1)) / float(m.group(2))
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        raise src.error(net, key, f"{key} must be a positive number or a ratio like 2:1, got {value!r}")
    return ratio
