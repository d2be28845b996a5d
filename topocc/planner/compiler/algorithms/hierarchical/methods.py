"""Each level's method: ring, recursive halving-doubling (Rabenseifner) or direct, whichever times fastest.

A level runs as a ring, as recursive halving / doubling (``log2 n`` steps
instead of ``n - 1``) when its size is a power of two, or direct (one step:
every member sends every other its part at once, as on a switch every port
can; one path latency), whichever the link-load estimate
(:mod:`~topocc.planner.compiler.algorithms.hierarchical.estimates`) times
fastest, ties to the fewer steps: that keeps the latency of a large
cross-leaf level at a few hops, not one per member, and of an NVSwitch host or
a rail at one.  The rules below correct the estimate where it is known to
mislead: contention it does not see, and latencies the pipeline's flow control
exposes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topocc.planner.compiler.algorithms.hierarchical.estimates import (
    DIRECT_MAX_SHARING,
    alike,
    direct_fits,
    estimate,
    relayed,
    round_trip,
    sharing,
)
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage
from topocc.planner.compiler.algorithms.hierarchical.slicing import MIN_SLICE_BYTES
from topocc.planner.compiler.algorithms.hierarchical.steps import power_of_two
from topocc.planner.routing.network import Network

__all__ = ["stage_methods", "windowed"]

#: Direct runs only where the estimate times it this much faster than the others: the estimate sees its
#: lower latency but not its contention, every member receiving from all others at once.
_DIRECT_GAIN = 0.02
#: In waves a level above the first takes the method that pipelines them best unless the estimate times
#: it this much slower than the fastest (where latency rules: a small collective's ring steps each wait
#: out a path).
_WAVE_SLACK = 1.25


@dataclass(frozen=True, slots=True)
class _Query:
    """What one call of :func:`stage_methods` asks, the same for every level."""

    slices: int
    force: str | None
    weights: Mapping[int, int] | None
    fed: bool
    spread: bool
    sharing_cap: float
    waved: bool
    contend: bool
    small: bool
    #: on a small collective on a fabric built by class, asked for without the caps on a direct level's
    #: messages, the most members of one (see direct_fits); None: the caps
    class_members: int | None
    last: int


def stage_methods(net: Network, levels: Sequence[Stage], slice_bytes: float, slices: int,
                  force: str | None = None, weights: Mapping[int, int] | None = None,
                  fed: bool = False, spread: bool = False, sharing_cap: float = DIRECT_MAX_SHARING,
                  waved: bool = False, contend: bool = True, class_members: int | None = None) -> list[str]:
    """Ring, halving-doubling or direct for each level: the one the estimate times fastest (ties: fewer
    steps; direct only where it is :data:`_DIRECT_GAIN` faster, or, with ``fed``, above the first level
    where it is no slower).

    ``force`` (``options.hierarchical.stage_method``) picks one for every level it
    fits; halving-doubling fits a level whose size is a power of two and whose
    partners have routes (:func:`~topocc.planner.compiler.algorithms.hierarchical.estimates.relayed`),
    direct one small enough (:func:`~topocc.planner.compiler.algorithms.hierarchical.estimates.direct_fits`)
    whose one step shares no link among more than ``sharing_cap`` messages.  A level of two members has
    one step whatever the method.  ``weights``
    (:func:`~topocc.planner.compiler.algorithms.hierarchical.ownership.ownership`) times a direct last level
    with that ownership.  ``fed``: a reduce-scatter, whose levels above the first get their slices one at a
    time from its flow-controlled first level, so that on the pipeline's small first slices a ring's
    ``n - 1`` dependent steps show their latency in full, which the estimate, counting it once, does not
    see.  ``spread``: an all-reduce (see
    :func:`~topocc.planner.compiler.algorithms.hierarchical.estimates.spread_shares`).  ``waved``: a
    reduce-scatter (or an all-reduce's first half) of few slices in waves (see
    :func:`~topocc.planner.compiler.algorithms.hierarchical.waves.waves`), whose levels take the methods
    that pipeline waves, where the estimate allows.  ``contend``: a direct level over the usual sharing cap
    must also beat the others' step latencies (see :func:`_without_slow_direct`); a small collective in a
    few slices lifts that.  ``class_members`` (None unless the fabric builds by class, see
    :func:`~topocc.planner.compiler.algorithms.hierarchical.split.class_members`): on a small collective,
    direct fits a level of up to that many members whatever its messages
    (:func:`~topocc.planner.compiler.algorithms.hierarchical.estimates.direct_fits`) and the sharing cap does
    not apply.
    """
    small = slice_bytes * slices < MIN_SLICE_BYTES * math.prod(s.size for s in levels)
    query = _Query(slices, force, weights, fed, spread, sharing_cap, waved, contend, small,
                   class_members=class_members if small else None, last=len(levels) - 1)
    out: list[str] = []
    part = slice_bytes
    for si, s in enumerate(levels):
        part /= s.size  # bytes of one part of this level, per slice
        out.append(_method(net, query, si, s, part))
    return out


def _method(net: Network, q: _Query, si: int, s: Stage, part: float) -> str:
    """The method of level ``si``, whose parts are ``part`` bytes a slice."""
    if s.size == 2:
        return "halving-doubling"
    load = sharing(net, s, si) if direct_fits(s, q.class_members) else math.inf
    # fewest steps first, so that ties go to the lower latency
    fits = [m for m, ok in (("direct", load <= q.sharing_cap or (q.class_members is not None and load < math.inf)),
                            ("halving-doubling", power_of_two(s.size) and not relayed(net, s)),
                            ("ring", True)) if ok]
    if q.force is not None and q.force in fits:
        return q.force
    times = _timed(net, q, si, s, part, fits)
    fits, times = _without_slow_direct(net, q, si, s, part, load, fits, times)
    best = min(times)
    choice = next(m for m, t in zip(fits, times) if t <= best * (1 + 1e-9))
    return _for_waves(q, si, fits, times, best, choice)


def _timed(net: Network, q: _Query, si: int, s: Stage, part: float, fits: list[str]) -> list[float]:
    """The estimate of each method in ``fits``, timed on the channel of the level's reduce-scatter phase
    (all-reduce and reduce-scatter: its index)."""
    if q.weights is not None and si == q.last:  # uneven ownership, where direct runs it
        times = [round_trip(net, s, m, part, q.slices, si, q.weights if m == "direct" else None) for m in fits]
    else:
        times = [estimate(net, s, m, part, q.slices, si, q.spread) for m in fits]
    if q.fed and not q.waved and si == 0 and q.small:
        # behind a first level that is not direct the flow control lets in a slice at a time, so its steps'
        # latencies are waited out once a slice, which the estimate counts once: on small messages that
        # decides (on large ones bandwidth does, and the window's ring keeps its link busy)
        times = [t if m == "direct" else t + (q.slices - 1) * estimate(net, s, m, 0.0, q.slices, si, q.spread)
                 for m, t in zip(fits, times)]
    return times


def _without_slow_direct(net: Network, q: _Query, si: int, s: Stage, part: float, load: float,
                         fits: list[str], times: list[float]) -> tuple[list[str], list[float]]:
    """``fits`` and ``times`` without direct where it does not gain enough for the contention the estimate
    does not see."""
    # Where a reduce-scatter's first level is not direct, its flow control (see windowed) makes it a ring,
    # which the estimate does not time: where every pair meets alike (an NVSwitch) direct wins even so, so
    # it needs no margin there, but where pairs differ (a hybrid cube-mesh) it does.
    gain = 0.0 if q.fed and (si > 0 or alike(net, s)) else _DIRECT_GAIN
    if fits[0] == "direct" and len(fits) > 1 and times[0] > min(times[1:]) * (1 - gain):
        return fits[1:], times[1:]
    if (q.contend and fits[0] == "direct" and len(fits) > 1 and load > DIRECT_MAX_SHARING
            and estimate(net, s, "direct", part, q.slices, si, True) > min(
                estimate(net, s, m, 0.0, q.slices, si, True) for m in fits[1:])):
        # Over the usual cap its many flows contend, which the estimate does not see, while the others'
        # hashed collisions flatter it.  So it runs only where, its messages spread evenly over the paths,
        # it is over before the others' step latencies alone: where latency rules.
        return fits[1:], times[1:]
    return fits, times


def _for_waves(q: _Query, si: int, fits: list[str], times: list[float], best: float, choice: str) -> str:
    """``choice``, or in waves the method that pipelines them (see the comments)."""
    if q.waved and si > 0:
        # In waves the levels below work in the order this one needs their blocks, so the last level's
        # steps set the waves' grain: a ring's n - 1 steps each need 1/n of the blocks, halving-doubling's
        # first needs half and direct's all of them.  A level in between runs direct where it may, its one
        # step keeping the waves whole.  Unless latency rules the estimate.
        want = "ring" if si == q.last else "direct"
        if want in fits and times[fits.index(want)] <= best * _WAVE_SLACK:
            return want
        return choice
    if q.waved and choice == "ring" and len(fits) > 1:
        # the first level's waves queue on a ring's one connection in the order they become ready, every
        # wave's first step before any wave's second, so the waves mix; halving-doubling or direct sends
        # each step to another member
        return min((m for m in fits if m != "ring"), key=lambda m: times[fits.index(m)])
    return choice


def windowed(net: Network, levels: Sequence[Stage], methods: Sequence[str], slice_bytes: float,
             slices: int) -> list[str]:
    """The methods of a flow-controlled reduce-scatter: a ring on every level of more than two members that
    does not run direct, since a windowed ring keeps its one link busy with the oldest slice; but a level
    keeps the method it was timed fastest with where a ring's step latencies alone take longer than that
    method's whole estimate, as on small messages.

    A ring's ``n - 1`` dependent steps each wait out a path latency, which on
    a large level and small messages outweighs everything else, while
    elsewhere the estimate may time a ring too slow, so the rule asks for the
    latencies alone.
    """
    out: list[str] = []
    part = slice_bytes
    for si, (s, m) in enumerate(zip(levels, methods)):
        part /= s.size
        keep = (s.size <= 2 or m in ("direct", "ring")
                or estimate(net, s, "ring", 0.0, 1, si) > estimate(net, s, m, part, slices, si))
        out.append(m if keep else "ring")
    return out
