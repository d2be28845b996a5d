"""From the probe's measurements to a :class:`~topocc.planner.topology.calibration.Calibration`.

Per measured class: its bandwidth alone from the largest message of its ping-pong, its bandwidth from the
``load`` stream (one flow per link with every link busy: bytes that crossed the link over the time less the
path's fixed cost), the part of that that many flows get in all (``shared``) from the ``spread`` stream
against the number of flows, its latency per link from the ping-pong's intercept less what the path's other links and
the message's fixed cost already explain.  The fixed cost of a message on a connection is the slope of a
stream's time over the number of messages it was split into (the median over pairs, at least zero).
Reduction and copy throughput are the median rank's, with every rank at work.  On an emulated cluster
the figures are that cluster's (inter-host links at its scale), and so is the file's figure beside them.  The
residuals compare each test a class's figures stand for with what they predict for it.  A class the probe
cannot measure (:attr:`~topocc.planner.calibration.classes.LinkClasses.unmeasurable`: a host's GPU fabric,
over MPI between CPU processes) is ``kept`` at the file's figures, with why.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

import numpy as np

from topocc.planner.calibration.classes import LinkClasses, bottleneck
from topocc.planner.routing.network import Network
from topocc.planner.topology.calibration import Calibration, ClassFigures, HostCosts
from topocc.planner.topology.model import Topology

__all__ = ["fit_calibration", "line_fit"]

#: Classes whose links the emulation shapes (its scale applies to them).
INTER_HOST = ("host-switch", "host-host")


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``: returns ``(a, b)`` (a single point: ``(y, 0)``)."""
    if len(set(xs)) < 2:
        return (float(statistics.mean(ys)), 0.0)
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def _scaled(cls: str) -> bool:
    return cls in INTER_HOST or cls.startswith("switch-")


def fit_calibration(topology: Topology | Network, file_topology: Topology, tests: Sequence[dict[str, Any]],
                    rows: Sequence[dict[str, Any]], *, scale: float = 1.0, how: str = "", transport: str = ""
                    ) -> Calibration:
    """Fit the measurements ``rows`` of ``tests``, run on ``topology`` (the cluster as it ran: an emulated
    one scaled), into the calibration of ``file_topology`` (the user's file)."""
    classes = LinkClasses(topology)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_id.setdefault(row["id"], []).append(row)
    slopes = []
    for probe in classes.pairs:
        stream = by_id.get(f"stream {probe.src}-{probe.dst}", [])
        if len(stream) > 1:
            slopes.append(line_fit([r["messages"] for r in stream], [r["time_s"] for r in stream])[1])
    message_s = max(0.0, statistics.median(slopes)) if slopes else 0.0

    figures: dict[str, ClassFigures] = {}
    latency: dict[str, float] = {}  # fitted per-link latency of each class measured so far
    residuals: dict[str, float] = {}  # per class: the largest relative error of its figures on its tests
    for probe in classes.pairs:
        if probe.link is None:
            continue
        path = classes.path(probe.src, probe.dst)
        ping = sorted(by_id.get(f"ping {probe.src}-{probe.dst}", []), key=lambda r: r["size"])
        if len(ping) < 2:
            continue
        # a small message alone is all fixed cost; the largest, all but that, bytes over the bandwidth
        fixed = ping[0]["one_way_s"]
        alone = ping[-1]["size"] / max(ping[-1]["one_way_s"] - fixed, 1e-12)
        own = [lk for lk in path if classes.of(lk) == probe.link]
        known = sum(latency.get(classes.of(lk), lk.latency) for lk in path if classes.of(lk) != probe.link)
        latency[probe.link] = max(0.0, fixed - message_s - known) / len(own)
        rates = {}  # per load test: (flows through its link, bytes/s they got in all, bytes, seconds)
        for what in ("load", "spread"):
            test = next((t for t in tests if t["id"] == f"{what} {probe.link}"), None)
            measured = next(iter(by_id.get(f"{what} {probe.link}", [])), None)
            took = measured["time_s"] - fixed if measured is not None else 0.0
            if test is not None and measured is not None and took > 0 and test["flows"]:
                nbytes = test["flows"] * measured["bytes"]
                rates[what] = (test["flows"], nbytes / took, nbytes, measured["time_s"])
        # one flow per link with every link busy: the class's bandwidth (a lone message may get more)
        bandwidth = min(alone, rates["load"][1] / rates["load"][0]) if "load" in rates else alone
        points = [(k, min(1.0, rate / bandwidth)) for k, rate, _, _ in rates.values()]
        shared = _shared(points)
        # the two largest ping-pongs: smaller messages may pass in a burst that a shaped link lets through
        errors = [abs((fixed + r["size"] / alone) / r["one_way_s"] - 1) for r in ping[-2:]]
        figure = ClassFigures(bandwidth, latency[probe.link], shared, alone=alone)
        errors += [abs((fixed + nbytes / figure.under(k)) / took - 1) for k, _, nbytes, took in rates.values()]
        residuals[probe.link] = max(errors)
        file_link = bottleneck(file_topology.datasheet or file_topology.links, probe.link, classes)
        factor = scale if _scaled(probe.link) else 1.0
        figures[probe.link] = replace(figure, file=file_link.bandwidth * factor)

    local = by_id.get("local", [])
    reduce = {r["dtype"]: r["bytes"] / r["time_s"] for r in local if r["op"] == "reduce" and r["time_s"] > 0}
    copies = [r["bytes"] / r["time_s"] for r in local if r["op"] == "copy" and r["time_s"] > 0]
    host = HostCosts(message_s, statistics.median(copies) if copies else float("inf"), MappingProxyType(reduce))
    return Calibration(measured=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), how=how,
                       transport=transport, host=host, links=MappingProxyType(figures),
                       residuals=MappingProxyType(residuals), scale=scale,
                       kept=MappingProxyType(dict(classes.unmeasurable)))


def _shared(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares ``shared`` of ``e = shared + (1 - shared) / k`` over the points ``(k, e)`` with ``k > 1``
    (1.0 without any), within (0.05, 1]."""
    many = [(k, e) for k, e in points if k > 1]
    if not many:
        return 1.0
    num = sum((e - 1 / k) * (1 - 1 / k) for k, e in many)
    den = sum((1 - 1 / k) ** 2 for k, _ in many)
    return min(1.0, max(0.05, num / den))
