"""What ``topocc calibrate`` measures on a topology: the tests :mod:`topocc.runtime.harness.probe` runs.

Per signature (:class:`~topocc.planner.calibration.classes.PairProbe`): messages of a few sizes alone
(ping-pong: latency and bandwidth of the path) and one stream split into more and more messages (the
cost of each message on a connection).  Per class measured, ranks sending across it at once, as a step of
a collective does: one flow per link and direction with every such link busy both ways (``load``: what
one of a collective's streams gets), and every rank to every peer across it (``spread``: what many flows
through one link get in all).  On every rank at once, reductions and copies per dtype.  Sizes
follow the topology's own figures, so each test takes a fraction of a second on a cluster that is near
them, and the whole run is bounded (:func:`probe_budget_s`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from topocc.planner.calibration.classes import LinkClasses
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology

__all__ = ["DTYPES", "MESSAGE_COUNTS", "probe_budget_s", "probe_tests"]

#: Seconds the largest message of a test should take at the topology's figure for its path.
TARGET_S = 0.15
#: Seconds a loaded link should be busy in a load test: long enough that the flows' start (TCP's slow start,
#: a burst into a shallow queue) weighs as little as in a collective's steady stream.
LOAD_S = 1.2
#: Messages each flow of a load test is split into, as a pipelined collective sends them.
LOAD_MESSAGES = 4
#: Largest and smallest test message.
MAX_BYTES = 16 << 20
MIN_BYTES = 64 << 10
#: Sizes of a ping-pong, as fractions of its largest message (the smallest is a small message: latency).
PING_FRACTIONS = (1 / 64, 1 / 8, 1 / 2, 1)
PING_SMALL = 1024
#: How many messages a stream is split into, to separate the cost of a message from its bytes.
MESSAGE_COUNTS = (1, 4, 16, 64)
#: The dtypes whose reduction is timed (bfloat16 where the ranks have ml_dtypes).
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32")
#: Bytes per reduction test, and repetitions of every test.
LOCAL_BYTES = 4 << 20
REPS = 3
#: Repetitions of a load test: what many flows get varies more from run to run than a lone message.
LOAD_REPS = 5
#: Peers each rank sends to in a ``spread`` test (every peer across the class, up to this many).
SPREAD_PEERS = 16
#: Ranks after its own (in rank order, wrapping round) a rank looks among for peers of a signature: the
#: regular fabrics put them near, and a scan of every rank from every rank is quadratic in the cluster.
SCAN_RANKS = 256


def _largest(bandwidth: float, seconds: float = TARGET_S) -> int:
    """The largest message of a test on a path of ``bandwidth`` bytes/s, a multiple of 64 KiB."""
    size = min(MAX_BYTES, max(MIN_BYTES, int(bandwidth * seconds)))
    return size // MIN_BYTES * MIN_BYTES


def one_per_link(classes: LinkClasses, pairs: list[tuple[int, int]], cls: str) -> list[tuple[int, int]]:
    """The pairs, in order, that cross no link of class ``cls`` an earlier one crosses: one flow per link
    and direction (from a shift, a ring over the hosts, or over the racks)."""
    used: set[object] = set()
    kept = []
    for a, b in pairs:
        links = [lk for lk in classes.path(a, b) if classes.of(lk) == cls]
        if not used.intersection(links):
            used.update(links)
            kept.append((a, b))
    return kept


def load_pairs(classes: LinkClasses, signature: tuple[str, ...]) -> list[tuple[int, int]]:
    """Every rank sending to one whose path has ``signature``, as a collective's step loads a class: the
    same shift for all where one fits (``s -> s + k``: every NIC, or every rack's uplink, both ways at once),
    else each rank's nearest such peer (within :data:`SCAN_RANKS`)."""
    n = classes.topology.size
    for k in range(1, n):
        if all(classes.signature(s, (s + k) % n) == signature for s in range(n)):
            return [(s, (s + k) % n) for s in range(n)]
    pairs = []
    for s in range(n):
        d = next((d for k in range(1, min(n, SCAN_RANKS + 1)) if classes.signature(s, d := (s + k) % n) == signature),
                 None)
        if d is not None:
            pairs.append((s, d))
    return pairs


def spread_pairs(classes: LinkClasses, signature: tuple[str, ...]) -> list[tuple[int, int]]:
    """Every rank sending to each peer whose path has ``signature`` (the nearest :data:`SPREAD_PEERS` within
    :data:`SCAN_RANKS`)."""
    n = classes.topology.size
    pairs = []
    for s in range(n):
        peers = 0
        for k in range(1, min(n, SCAN_RANKS + 1)):
            if classes.signature(s, d := (s + k) % n) == signature:
                pairs.append((s, d))
                peers += 1
                if peers == SPREAD_PEERS:
                    break
    return pairs


def probe_tests(topology: Topology | Network) -> list[dict[str, Any]]:
    """The tests for ``topology`` as it runs (an emulated one: its scaled figures), in the order to run them."""
    classes = LinkClasses(topology)
    tests: list[dict[str, Any]] = []
    for probe in classes.pairs:
        path = classes.path(probe.src, probe.dst)
        largest = _largest(min(link.bandwidth for link in path))
        name = f"{probe.src}-{probe.dst}"
        tests.append({"id": f"ping {name}", "kind": "pingpong", "pairs": [[probe.src, probe.dst]],
                      "sizes": [PING_SMALL, *(max(MIN_BYTES // 16, int(largest * f)) for f in PING_FRACTIONS)],
                      "reps": REPS})
        tests.append({"id": f"stream {name}", "kind": "stream", "pairs": [[probe.src, probe.dst]],
                      "bytes": largest, "messages": list(MESSAGE_COUNTS), "reps": REPS})
        if probe.link is None:
            continue
        shift = load_pairs(classes, probe.signature)
        for what, pairs in (("load", one_per_link(classes, shift, probe.link)),
                            ("spread", spread_pairs(classes, probe.signature))):
            # the link of the class that most of the pairs cross: what the test loads
            crossed = Counter(lk for a, b in pairs for lk in classes.path(a, b) if classes.of(lk) == probe.link)
            link, flows = max(crossed.items(), key=lambda kv: (kv[1], -kv[0].bandwidth))
            tests.append({"id": f"{what} {probe.link}", "kind": "stream", "pairs": [list(p) for p in pairs],
                          "bytes": _largest(link.bandwidth / flows, LOAD_S), "messages": [LOAD_MESSAGES],
                          "reps": LOAD_REPS, "link": [link.src, link.dst], "flows": flows})
    tests.append({"id": "local", "kind": "local", "bytes": LOCAL_BYTES, "dtypes": list(DTYPES), "reps": 4 * REPS})
    return tests


def probe_budget_s(tests: list[dict[str, Any]], topology: Topology | Network) -> float:
    """A bound on the tests' time if the cluster runs at a tenth of its figures (a hung test fails it)."""
    classes = LinkClasses(topology)
    total = 30.0
    for test in tests:
        if test["kind"] == "local":
            total += 10.0
            continue
        slowest = min(min(lk.bandwidth for lk in classes.path(a, b)) for a, b in test["pairs"])
        per_rep = (2 * sum(test["sizes"]) if test["kind"] == "pingpong"
                   else len(test["messages"]) * test["bytes"] * len(test["pairs"]))
        total += 10 * test["reps"] * per_rep / slowest + 1.0
    return total
