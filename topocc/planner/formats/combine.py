"""Replicate one imported host N times and join the hosts' NICs by a network.

``network`` (a mapping, or YAML text of one) says how:

* ``type: switch`` (default; also ``single-switch``, as in topology templates): every NIC to one switch;
* ``type: fat_tree``: ``hosts_per_leaf`` hosts (default 4) per leaf switch,
  ``spines`` spine switches (default 2), each leaf's uplink capacity its NIC
  capacity divided by ``oversubscription`` (default 1), spread over the spines;
  a leaf is a rack (``rack: r<j>``);
* ``type: rail``: rail-optimised, NIC ``j`` of every host on switch ``rail<j>``
  (a message between rails crosses inside a host, over PCIe or NVLink, then one rail).

``bandwidth`` (per NIC port) defaults to each NIC's own link in the host
topology, ``latency`` (per network hop) to 1 us.  Devices of host ``i`` are
renamed ``h<i>.<name>`` and get ``host: h<i>``; ranks are host-major.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topocc.planner._yaml import parse_yaml
from topocc.planner.errors import TopologyError
from topocc.planner.formats._emit import TopologyText
from topocc.planner.topology.model import Link, Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.planner.units import UnitError, parse_bandwidth, parse_time

__all__ = ["NETWORK_TYPES", "combine_hosts"]

NETWORK_TYPES = ("switch", "fat_tree", "rail")
#: The names the topology templates use for the same networks (topocc/planner/topology/templates.py) are accepted too.
_SAME_AS_TEMPLATES = {"single-switch": "switch", "fat-tree": "fat_tree", "rail-optimized": "rail"}
_KEYS = ("type", "bandwidth", "latency", "hosts_per_leaf", "spines", "oversubscription", "name")


def _fail(message: str, fix: str | None = None) -> TopologyError:
    return TopologyError(message, where="network", fix=fix)


def _number(net: Mapping[str, Any], key: str, default: float, integer: bool = True) -> float:
    value = net.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
            integer and value != int(value)):
        raise _fail(f"{key} must be a positive {'whole ' if integer else ''}number, got {value!r}")
    return value


def combine_hosts(host_yaml_text: str, hosts: int, network: Mapping[str, Any] | str | None = None) -> str:
    """Cluster topology YAML: ``hosts`` copies of one host joined by ``network`` (module docstring).

    >>> cluster = combine_hosts(import_nvidia_smi("dgx_a100.txt"), 4, {"type": "rail"})  # doctest: +SKIP
    """
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise _fail(f"hosts must be a whole number >= 1, got {hosts!r}")
    net: Any = parse_yaml(network, "network") if isinstance(network, str) else dict(network or {})
    if not isinstance(net, Mapping):
        raise _fail("the network description must be a mapping", fix="e.g. {type: fat_tree, oversubscription: 2}")
    for key in net:
        if key not in _KEYS:
            raise _fail(f"unknown network key {key!r}", fix=f"allowed keys: {', '.join(_KEYS)}")
    kind = _SAME_AS_TEMPLATES.get(net.get("type", "switch"), net.get("type", "switch"))
    if kind not in NETWORK_TYPES:
        raise _fail(f"unknown network type {kind!r}", fix=f"use one of {', '.join(NETWORK_TYPES)}")
    host = parse_topology_text(host_yaml_text, "host topology")
    nics = [d.name for d in host.devices if d.kind == "nic"]
    if not nics:
        raise TopologyError("the host topology has no NIC, so hosts cannot be joined", where="host topology",
                            fix="import a topology that lists NICs (nvidia-smi NIC rows, NCCL <nic>)")
    try:
        port_bw = parse_bandwidth(net["bandwidth"]) if "bandwidth" in net else None
        latency = parse_time(net.get("latency", "1 us"))
    except UnitError as exc:
        raise _fail(str(exc), fix=exc.fix or "write e.g. bandwidth: 25 GB/s, latency: 1 us") from None
    nic_bw = {n: port_bw if port_bw is not None else _own_bandwidth(host, n) for n in nics}

    out = TopologyText(str(net.get("name", f"{host.name}-x{hosts}")),
                       f"{hosts} x {host.name} joined by a {kind.replace('_', ' ')} network")
    per_leaf = int(_number(net, "hosts_per_leaf", 4))
    for i in range(hosts):
        rack = f"r{i // per_leaf}" if kind == "fat_tree" else None
        for d in host.devices:
            out.device(f"h{i}.{d.name}", d.kind, f"h{i}", rack)
    for i in range(hosts):
        _copy_links(out, host, f"h{i}.")
    if kind == "switch":
        out.device("switch", "switch")
        for i in range(hosts):
            for n in nics:
                out.link(f"h{i}.{n}", "switch", nic_bw[n], latency, kind="network")
    elif kind == "rail":
        for j, n in enumerate(nics):
            out.device(f"rail{j}", "switch")
            for i in range(hosts):
                out.link(f"h{i}.{n}", f"rail{j}", nic_bw[n], latency, kind="network")
    else:
        spines = int(_number(net, "spines", 2))
        over = float(_number(net, "oversubscription", 1, integer=False))
        leaves = (hosts + per_leaf - 1) // per_leaf
        for s in range(spines):
            out.device(f"spine{s}", "switch")
        for leaf in range(leaves):
            out.device(f"leaf{leaf}", "switch")
            members = range(leaf * per_leaf, min(hosts, (leaf + 1) * per_leaf))
            for i in members:
                for n in nics:
                    out.link(f"h{i}.{n}", f"leaf{leaf}", nic_bw[n], latency, kind="network")
            if leaves > 1:
                down = sum(nic_bw.values()) * len(members)
                for s in range(spines):
                    out.link(f"leaf{leaf}", f"spine{s}", down / over / spines, latency, kind="network")
        if leaves > 1:
            out.note(f"fat tree: {leaves} leaves of {per_leaf} hosts, {spines} spines, "
                     f"oversubscription {over:g}:1")
    return out.text()


def _own_bandwidth(host: Topology, nic: str) -> float:
    """A NIC's port speed by default: the fastest link it has in the host topology."""
    speeds = [ln.bandwidth for ln in host.links if nic in (ln.src, ln.dst)]
    if not speeds:
        raise TopologyError(f"NIC {nic} has no link in the host topology", where="host topology",
                            fix="connect it, or give the network a bandwidth")
    return max(speeds)


def _copy_links(out: TopologyText, host: Topology, prefix: str) -> None:
    """The host's links under new names, a pair of equal opposite links written once as full duplex."""
    pending: dict[tuple[str, str], list[Link]] = {}
    for ln in host.links:
        pending.setdefault((ln.src, ln.dst), []).append(ln)
    done: set[tuple[str, str]] = set()
    for ln in host.links:
        key = (ln.src, ln.dst)
        if key in done:
            continue
        done.add(key)
        back = host.link(ln.dst, ln.src)
        both = back is not None and (back.bandwidth, back.latency, back.count, back.kind) == (
            ln.bandwidth, ln.latency, ln.count, ln.kind) and (ln.dst, ln.src) not in done
        if both:
            done.add((ln.dst, ln.src))
        out.link(prefix + ln.src, prefix + ln.dst, ln.bandwidth / ln.count, ln.latency, count=ln.count,
                 kind=ln.kind, direction="both" if both else "forward")
