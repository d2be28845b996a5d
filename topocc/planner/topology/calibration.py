"""A topology's ``calibration:`` block: what ``topocc calibrate`` measured, and how the model uses it.

A calibrated topology file is the user's file with this block added at the end.  Its link classes
(:mod:`topocc.planner.calibration.classes`) carry measured figures that replace the file's for every link of
the class (the file's own figures stay written above, the datasheet); its host costs (each message's fixed
cost on a connection, reduction and copy throughput) are what the simulator charges the runtime for work
the datasheet model leaves out.  The topology keeps the datasheet's fingerprint, so plans compiled for
either file run on both.

.. code-block:: yaml

    calibration:
      measured: 2026-11-29T01:02:03Z
      how: topocc calibrate, 3 repetitions per test
      transport: MPI (MPICH 4.3.0), emulated at x0.001
      scale: 0.001                  # measured on an emulated cluster at this scale: its figures
      message_cost: 40 us           # per message on a connection
      copy: 12 GB/s
      reduce: {float32: 4.4 GB/s, float16: 130 MB/s}
      links:
        host-switch: {bandwidth: 12.1 GB/s, latency: 60 us, shared: 0.8, file: 12.5 GB/s}
        host:nvlink: {source: "file (not measurable over MPI between CPU processes)"}
      residuals: {host-switch: 0.04}  # per class: the largest error of its figures on its tests

Every figure carries its unit, as everywhere in the file (``topocc calibrate`` has always written them so);
a bare number is refused with the fix, like any other.  A class with ``source: file (why)`` was not
measured: its links keep the file's figures (``topocc calibrate`` says why, e.g. a GPU fabric it cannot
reach over MPI between CPU processes); a class without ``source`` was measured.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from topocc.planner._yaml import Source
from topocc.planner.topology._fields import check_keys, quantity
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_bandwidth, format_time, parse_bandwidth, parse_time

__all__ = ["Calibration", "ClassFigures", "HostCosts", "apply_calibration", "calibration_yaml", "datasheet_topology",
           "link_classes_of", "parse_calibration", "strip_calibration"]

_KEYS = ("measured", "how", "transport", "scale", "message_cost", "copy", "reduce", "links", "residuals")
_LINK_KEYS = ("bandwidth", "latency", "shared", "alone", "file")
#: ``source:`` of a class kept at the file's figures: ``file (WHY)``.
FILE_SOURCE = "file"
_FILE_SOURCE = re.compile(r"file(?: \((.*)\))?")


@dataclass(frozen=True, slots=True)
class ClassFigures:
    """One link class as measured: ``bandwidth`` for one flow with every link of the class busy (a
    collective's streams), ``latency`` per link, ``shared`` the part of the bandwidth that many flows
    through one link get in all (``k`` flows get ``bandwidth * (shared + (1 - shared) / k)``); ``alone`` a
    lone message's bandwidth and ``file`` the topology file's, at the calibration's scale (to compare)."""

    bandwidth: float
    latency: float
    shared: float = 1.0
    alone: float | None = None
    file: float | None = None

    def under(self, flows: int) -> float:
        """What ``flows`` flows through one link of the class get in all."""
        return self.bandwidth * (self.shared + (1.0 - self.shared) / max(flows, 1))


@dataclass(frozen=True, slots=True)
class HostCosts:
    """What the runtime spends outside the links: a fixed cost per message on its connection, and the
    throughput of local copies and reductions (bytes/s, per dtype)."""

    message_s: float = 0.0
    copy_Bps: float = float("inf")
    reduce_Bps: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def reduce_rate(self, dtype: str = "float32") -> float:
        """Reduction throughput for ``dtype`` (float32's where it was not measured; unlimited if none was)."""
        return self.reduce_Bps.get(dtype, self.reduce_Bps.get("float32", float("inf")))


@dataclass(frozen=True, slots=True)
class Calibration:
    """The block as data; ``links`` (measured) by class name, ``kept`` (at the file's figures) by class name with
    why they were not measured."""

    measured: str
    how: str
    transport: str
    host: HostCosts
    links: Mapping[str, ClassFigures]
    residuals: Mapping[str, float]
    scale: float = 1.0
    kept: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def parse_calibration(src: Source, doc: Any) -> Calibration:
    """The ``calibration:`` mapping of a topology file, checked (errors name the line and the fix)."""
    top = check_keys(src, doc, "calibration", _KEYS, ("links",))
    text = {}
    for key in ("measured", "how", "transport"):
        value = top.get(key, "")
        if not isinstance(value, str):
            raise src.error(top, key, f"calibration {key} must be text")
        text[key] = value
    scale = top.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise src.error(top, "scale", f"calibration scale must be a positive number, got {scale!r}")
    reduce: dict[str, float] = {}
    if "reduce" in top:
        rates = top["reduce"]
        if not isinstance(rates, dict):
            raise src.error(top, "reduce", "calibration reduce must map dtypes to throughputs",
                            fix="write e.g. reduce: {float32: 4 GB/s}")
        for dtype in rates:
            reduce[str(dtype)] = quantity(src, rates, dtype, parse_bandwidth)
    host = HostCosts(message_s=quantity(src, top, "message_cost", parse_time, 0.0),
                     copy_Bps=quantity(src, top, "copy", parse_bandwidth) if "copy" in top else float("inf"),
                     reduce_Bps=MappingProxyType(reduce))
    classes = top["links"]
    if not isinstance(classes, dict):
        raise src.error(top, "links", "calibration links must map link classes to figures",
                        fix="write e.g. links: {host-switch: {bandwidth: 10 GB/s, latency: 20 us}}")
    links = {}
    kept = {}
    for name, figures in classes.items():
        if isinstance(figures, dict) and "source" in figures:
            source = _FILE_SOURCE.fullmatch(str(figures["source"]))
            if source is None or len(figures) > 1:
                raise src.error(figures, "source", f"link class {name!r}: source must be 'file (WHY)' and stand "
                                "alone", fix="leave out source: for a measured class")
            kept[str(name)] = source[1] or "not measured"
            continue
        entry = check_keys(src, figures, f"link class {name!r}", _LINK_KEYS, ("bandwidth",))
        shared = entry.get("shared", 1.0)
        if isinstance(shared, bool) or not isinstance(shared, (int, float)) or not 0 < shared <= 1:
            raise src.error(entry, "shared", f"shared must be a number in (0, 1], got {shared!r}",
                            fix="1 when many flows through a link get all of it, less where they lose some")
        links[str(name)] = ClassFigures(
            bandwidth=quantity(src, entry, "bandwidth", parse_bandwidth),
            latency=quantity(src, entry, "latency", parse_time, 0.0), shared=float(shared),
            alone=quantity(src, entry, "alone", parse_bandwidth) if "alone" in entry else None,
            file=quantity(src, entry, "file", parse_bandwidth) if "file" in entry else None)
    residuals = top.get("residuals", {})
    if not isinstance(residuals, dict) or not all(isinstance(v, (int, float)) for v in residuals.values()):
        raise src.error(top, "residuals", "calibration residuals must map names to numbers")
    return Calibration(text["measured"], text["how"], text["transport"], host, MappingProxyType(links),
                       MappingProxyType({str(k): float(v) for k, v in residuals.items()}), float(scale),
                       MappingProxyType(kept))


def calibration_yaml(cal: Calibration) -> str:
    """The block as YAML text (to append to the user's file), figures in the file's units."""
    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["calibration:", f"  measured: {q(cal.measured)}", f"  how: {q(cal.how)}",
             f"  transport: {q(cal.transport)}"]
    if cal.scale != 1.0:
        lines.append(f"  scale: {cal.scale:g}  # measured on an emulated cluster at this scale: these are its figures")
    lines.append(f"  message_cost: {format_time(cal.host.message_s)}  # fixed cost of a message on its connection")
    if cal.host.copy_Bps != float("inf"):
        lines.append(f"  copy: {format_bandwidth(cal.host.copy_Bps)}")
    if cal.host.reduce_Bps:
        lines.append("  reduce: {" + ", ".join(f"{k}: {format_bandwidth(v)}" for k, v in cal.host.reduce_Bps.items())
                     + "}")
    lines.append("  links:  # per link class: measured figures replace those above for every link of the class")
    for name, f in cal.links.items():
        parts = [f"bandwidth: {format_bandwidth(f.bandwidth)}", f"latency: {format_time(f.latency)}",
                 f"shared: {f.shared:.3g}"]
        if f.alone is not None:
            parts.append(f"alone: {format_bandwidth(f.alone)}")
        if f.file is not None:
            parts.append(f"file: {format_bandwidth(f.file)}")
        lines.append(f"    {name}: {{{', '.join(parts)}}}")
    for name, why in cal.kept.items():
        lines.append(f"    {name}: {{source: {q(f'{FILE_SOURCE} ({why})')}}}  # the figures above stand")
    if cal.residuals:
        lines.append("  residuals: {" + ", ".join(f"{k}: {v:.4g}" for k, v in cal.residuals.items()) + "}")
    return "\n".join(lines) + "\n"


def link_classes_of(topology: Topology) -> dict[tuple[str, str], str]:
    """The class of every link (by its ends): ``host:KIND`` inside a host, ``host-host`` between hosts directly,
    ``host-switch`` from a host to the network, ``switch-N`` between a level-N switch and the level above (a
    switch next to hosts is level 1)."""
    domain = {d.name: d.domain for d in topology.devices}
    level: dict[str, int] = {}
    frontier = [d for d, h in domain.items() if h is not None]
    seen = set(frontier)
    depth = 0
    while frontier:  # breadth first from the hosts' devices over network devices
        depth += 1
        nxt = []
        for node in frontier:
            for peer in topology.graph.successors(node):
                if peer not in seen and domain[peer] is None:
                    seen.add(peer)
                    level[peer] = depth
                    nxt.append(peer)
        frontier = nxt
    out = {}
    for link in topology.links:
        a, b = domain[link.src], domain[link.dst]
        if a is not None and a == b:
            kind = link.kind or "-".join(sorted({topology.device(link.src).kind, topology.device(link.dst).kind}))
            name = f"host:{kind}"
        elif a is not None and b is not None:
            name = "host-host"
        elif a is not None or b is not None:
            name = "host-switch"
        else:
            name = f"switch-{min(level.get(link.src, 1), level.get(link.dst, 1))}"
        out[(link.src, link.dst)] = name
    return out


def apply_calibration(topology: Topology, cal: Calibration, src: Source | None = None, at: Any = None) -> Topology:
    """``topology`` with every link of a calibrated class at its measured figures; it keeps the file's links as
    its datasheet (and fingerprint).  A class the topology does not have is an error naming it."""
    classes = link_classes_of(topology)
    unknown = sorted((set(cal.links) | set(cal.kept)) - set(classes.values()))
    if unknown and src is not None:
        raise src.error(at, "links", f"calibration names link class {unknown[0]!r}, which this topology lacks",
                        fix="calibrate this topology (topocc calibrate), or remove the class; its classes: "
                            + ", ".join(sorted(set(classes.values()))))
    links = tuple(replace(link, bandwidth=f.bandwidth, latency=f.latency)
                  if (f := cal.links.get(classes[(link.src, link.dst)])) is not None else link
                  for link in topology.links)
    return replace(topology, links=links, calibration=cal, datasheet=topology.datasheet or topology.links)


def datasheet_topology(topology: Topology) -> Topology:
    """``topology`` at its file's figures (itself when it is not calibrated)."""
    if topology.calibration is None:
        return topology
    return replace(topology, links=topology.datasheet or topology.links, calibration=None, datasheet=None)


def strip_calibration(text: str) -> str:
    """A topology file's text without its ``calibration:`` block (the lines from that top-level key up to the
    next top-level key), so that a file calibrated again gets one block."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("calibration:"):
            inside = True
            continue
        if inside and line.strip() and not line[0].isspace() and not line.startswith("#"):
            inside = False
        if not inside:
            out.append(line)
    return "".join(out).rstrip("\n") + "\n"
