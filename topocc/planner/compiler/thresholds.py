"""Where a plan pays: the call size below which the native backend is predicted at least as fast.

A bundle's plan replaces what ``torch.distributed`` would run anyway, so it runs
only where the model predicts a gain: :func:`native_threshold` times the plan
and gloo's own algorithm (:mod:`topocc.planner.compiler.native`) on the group's
network at sizes from the request's smallest to its largest, and returns the
size from which the plan is predicted faster at every size above.  The runtime
(:mod:`topocc.runtime.distributed`) hands smaller calls to the native backend.

"Faster" asks for a margin (:data:`MIN_PREDICTED_GAIN`): a host-driven replay
spends per message what gloo's C++ loop does not, which a datasheet topology
leaves out, and the model's figures and measured ones on an emulated cluster
lie 10-15% apart from run to run (README, "Calibrate your cluster").  On
emu-uniform (8 ranks, the torch backend over its gloo transport), plans the
model put 14-17% ahead of gloo's ring measured 0.64-0.97x its speed from
256 KiB to 64 MiB, while emu-racks' plans, put 24-35% ahead from 1 MiB,
measured 1.3x (``benchmarks/torch_backend_bench.py``); a gain under a fifth of
gloo's time is no gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.native import native_schedule
from topocc.planner.routing.network import Network
from topocc.runtime.plan import Plan

__all__ = ["MIN_PREDICTED_GAIN", "Threshold", "native_threshold"]

#: The plan must be predicted this much faster than the native algorithm (a fraction of its time).
MIN_PREDICTED_GAIN = 0.20
#: Probe sizes are this factor apart; the crossing is then narrowed by bisection on a log scale.
_PROBE_FACTOR = 4
#: Bisection steps between the last probe that loses and the first that gains (each halves the log-gap).
_BISECT_STEPS = 3


@dataclass(frozen=True, slots=True)
class Threshold:
    """A plan's native threshold: calls of fewer than ``native_below`` bytes go native (None: every call,
    the plan is predicted faster nowhere), with the plan's and the native algorithm's predicted times at the
    sizes probed (bytes, plan seconds, native seconds)."""

    native_below: int | None
    probes: tuple[tuple[int, float, float], ...]


def _probe_sizes(low: int, high: int) -> list[int]:
    sizes = [low]
    while sizes[-1] * _PROBE_FACTOR < high:
        sizes.append(sizes[-1] * _PROBE_FACTOR)
    if sizes[-1] != high:
        sizes.append(high)
    return sizes


def native_threshold(net: Network, plan: Plan, low: int, high: int, root: int = 0) -> Threshold:
    """The smallest size from which ``plan`` is predicted faster than gloo at every probed size up to ``high``.

    0 when it gains already at ``low`` (every call asked for runs the plan); None when it does not gain at
    ``high`` (the plan's last bucket serves every larger call too, so none runs it).  ``root`` is the group
    rank of a broadcast's or reduce's root.
    """
    collective = plan.collective

    def timed(size: int) -> tuple[int, float, float]:
        mine = simulate(net, plan.select(size), size).time_s
        theirs = simulate(net, native_schedule(net, collective, size, root), size).time_s
        return size, mine, theirs

    def gains(probe: tuple[int, float, float]) -> bool:
        return probe[1] < (1 - MIN_PREDICTED_GAIN) * probe[2]

    probes = [timed(size) for size in _probe_sizes(low, high)]
    if not gains(probes[-1]):
        return Threshold(None, tuple(probes))
    first = len(probes) - 1
    while first > 0 and gains(probes[first - 1]):
        first -= 1
    if first == 0:
        return Threshold(0, tuple(probes))
    lose, gain = probes[first - 1][0], probes[first][0]
    extra = []
    for _ in range(_BISECT_STEPS):
        mid = int(math.sqrt(lose * gain))
        if mid in (lose, gain):
            break
        probe = timed(mid)
        extra.append(probe)
        lose, gain = (lose, mid) if gains(probe) else (mid, gain)
    return Threshold(gain, tuple(sorted(probes + extra)))
