"""Topology YAML -> :class:`~topocc.planner.topology.model.Topology`, checked: every error names the file, the
line and the fix.  Loading never executes code (safe YAML)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from topocc.planner._yaml import Source, load_yaml, parse_yaml
from topocc.planner.errors import TopologyError
from topocc.planner.topology._fields import (
    LinkDefaults,
    check_keys,
    choice,
    close_match,
    name_string,
    parse_link,
    positive_int,
    quantity,
)
from topocc.planner.topology.calibration import apply_calibration, parse_calibration
from topocc.planner.topology.model import (
    DEFAULT_ROUTING,
    DEVICE_KINDS,
    ROUTING_MODES,
    UNLABELLED,
    Device,
    Link,
    Topology,
    build_topology,
    unlabelled,
)
from topocc.planner.topology.templates import expand_cluster
from topocc.planner.units import parse_bandwidth, parse_time

__all__ = ["load_topology", "parse_topology", "parse_topology_text"]

_TOP_KEYS = ("name", "description", "defaults", "routing", "devices", "links", "cluster", "calibration")
_DEVICE_KEYS = ("name", "type", "host", "rack", "count")


def load_topology(path: str | Path) -> Topology:
    """Load and validate a topology YAML file.

    >>> topo = load_topology("topologies/dgx1-v100.yaml")  # doctest: +SKIP
    >>> topo.size  # doctest: +SKIP
    8
    """
    return parse_topology(load_yaml(path), str(path))


def parse_topology_text(text: str, name: str = "<topology>") -> Topology:
    """Parse topology YAML given as text (``name`` is used in messages)."""
    return parse_topology(parse_yaml(text, name), name)


def parse_topology(doc: Any, source: str = "<topology>") -> Topology:
    """Validate a decoded topology document and build the :class:`Topology`."""
    src = Source(source, doc)
    if doc is None:
        raise TopologyError("empty topology file", where=source, fix="see docs/topology-format.md")
    top = check_keys(src, doc, "the topology", _TOP_KEYS, ("name",))
    name = name_string(src, top, "name")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise src.error(top, "description", "description must be text")
    defaults = LinkDefaults()
    if "defaults" in top:
        d = check_keys(src, top["defaults"], "defaults", ("latency", "bandwidth"))
        defaults = LinkDefaults(
            quantity(src, d, "latency", parse_time, 0.0),
            quantity(src, d, "bandwidth", parse_bandwidth) if "bandwidth" in d else None,
            place=d,
        )
    if "devices" not in top and "cluster" not in top:
        raise src.error(top, None, "the topology declares no devices", fix="add 'devices:' and 'links:' or 'cluster:'")
    routing = choice(src, top, "routing", ROUTING_MODES, None, "routing") if "routing" in top else None

    devices: list[Device] = []
    places: dict[str, str] = {}  # device name -> where it was declared
    links: list[Link] = []
    link_places: dict[tuple[str, str], str] = {}

    def add_device(device: Device, where: str) -> None:
        if device.name in places:
            raise TopologyError(f"duplicate device name {device.name!r} (first declared at {places[device.name]})",
                                where=where, fix="give every device a unique name")
        places[device.name] = where
        devices.append(device)

    def add_links(new: Iterable[Link], where: str) -> None:
        for link in new:
            key = (link.src, link.dst)
            if key in link_places:
                raise TopologyError(
                    f"link {link.src} -> {link.dst} is declared twice (first at {link_places[key]})",
                    where=where, fix="declare it once; use count: N for parallel links",
                )
            link_places[key] = where
            links.append(link)

    if "cluster" in top:
        t_devices, t_links, routing = expand_cluster(src, top["cluster"], defaults, routing)
        where = src.at(top, "cluster")
        for device in t_devices:
            add_device(device, where)
        add_links(t_links, where)

    device_list = top.get("devices", [])
    if not isinstance(device_list, list):
        raise src.error(top, "devices", "devices must be a list")
    for i, item in enumerate(device_list):
        where = src.at(device_list, i)
        check_keys(src, item, "a device", _DEVICE_KEYS, ("name", "type"))
        base = name_string(src, item, "name")
        kind = item["type"]
        if kind not in DEVICE_KINDS:
            hint = close_match(str(kind), DEVICE_KINDS)
            raise src.error(item, "type", f"unknown device type {kind!r}",
                            fix=f"did you mean {hint!r}?" if hint else f"use one of {', '.join(DEVICE_KINDS)}")
        host = item.get("host")
        rack = item.get("rack")
        for key, value in (("host", host), ("rack", rack)):
            if value is not None and (not isinstance(value, (str, int)) or isinstance(value, bool)):
                raise src.error(item, key, f"{key} must be a name")
        count = positive_int(src, item, "count", 0, minimum=0) if "count" in item else None
        names = [base] if count is None else [f"{base}{j}" for j in range(count)]
        for n in names:
            add_device(Device(n, kind, None if host is None else str(host), None if rack is None else str(rack)), where)

    link_list = top.get("links", [])
    if not isinstance(link_list, list):
        raise src.error(top, "links", "links must be a list")
    types = {d.name: d.kind for d in devices}
    for i, item in enumerate(link_list):
        new, a, b = parse_link(src, item, defaults, types)
        for end in (a, b):
            if end not in places:
                hint = close_match(end, places)
                raise src.error(item, "ends", f"link names unknown device {end!r}",
                                fix=f"did you mean {hint!r}?" if hint else "declare it under devices:")
        add_links(new, src.at(link_list, i))

    if unlabelled(top.get("routing"), links):
        raise src.error(top, "routing", UNLABELLED,
                        fix="use a torus or mesh network under cluster:, or give the grid's links dim: 0, 1, ...")
    topology = build_topology(name, devices, links, description=description, source=source,
                              routing=routing or DEFAULT_ROUTING)
    if "calibration" in top:
        topology = apply_calibration(topology, parse_calibration(src, top["calibration"]), src, top["calibration"])
    return topology
