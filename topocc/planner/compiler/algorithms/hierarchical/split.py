"""Splitting a large last level in two on small messages, both halves direct: two path latencies, not many.

On small messages (under :data:`~topocc.planner.compiler.algorithms.hierarchical.slicing.MIN_SLICE_BYTES`
a rank) latency rules, and a last level too large to run direct (or kept from
it by the cap on contending messages) waits out a path latency per step of its
ring or halving-doubling.  Split into groups of ``a`` consecutive members and
then of the members ``a`` apart, each small enough to run direct, it takes two
steps, for as many operations.
"""

from __future__ import annotations

import math

from topocc.planner.compiler.algorithms.hierarchical.estimates import direct_fits, estimate
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage, ringed, split
from topocc.planner.compiler.algorithms.hierarchical.methods import stage_methods
from topocc.planner.compiler.algorithms.hierarchical.slicing import MIN_SLICE_BYTES, class_direct_members
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import builds_by_class
from topocc.planner.routing.network import Network

__all__ = ["class_members", "split_last"]


def split_last(net: Network, collective: str, levels: list[Stage], options: Options,
               large: bool = True) -> list[Stage]:
    """``levels`` with the last one split in two (:func:`~.levels.split`), both direct, where the estimate
    times them faster than the last level's step latencies alone: on small messages, where the last level is
    too large to run direct, or the cap on contending messages keeps it from running direct.

    The split must beat the last level's step latencies alone, not just its
    estimate, which it also beats where bandwidth rules (and there the split's
    extra hop loses).  An all-reduce that builds and times two layouts (see
    :mod:`~topocc.planner.compiler.algorithms.hierarchical.layout`) splits
    only a last level small enough to run direct (``large`` false): a split of
    a larger one, many flows contending at once, would make those two
    simulations most of the compile.
    """
    if not levels or options.size_bytes / net.topology.size >= MIN_SLICE_BYTES or options.pipeline is not None \
            or options.hierarchical.stage_method is not None:
        return levels
    last, members = levels[-1], class_members(net, collective, options)
    method = None  # the last level's, timed only once some split fits where it is too large for direct
    if direct_fits(last, members):
        # small enough to run direct, unless the sharing cap rules that out (a ring across hosts on leaves,
        # too many messages on an uplink for direct, then waits out a path latency per member)
        method = stage_methods(net, levels, options.size_bytes, 1, class_members=members)[-1]
        if method == "direct":
            return levels
    elif not large:
        return levels
    n = last.size
    splits = [(a, *split(last, a)) for a in range(2, n // 2 + 1) if not n % a]
    splits = [(a, inner, outer) for a, inner, outer in splits
              if direct_fits(inner, members) and direct_fits(outer, members)]
    if not splits:  # before timing the levels, which on a huge last level costs more than the whole compile
        return levels
    if method is None:
        method = stage_methods(net, levels, options.size_bytes, 1, class_members=members)[-1]
    chosen = _fastest_split(net, levels, options, method, splits)
    if chosen is None:
        return levels
    return [*levels[:-1], *(ringed(net, s) for s in chosen)]


def class_members(net: Network, collective: str, options: Options) -> int | None:
    """With ``direct_uncapped`` on a fabric built by class, the most members of a direct level
    (:func:`~topocc.planner.compiler.algorithms.hierarchical.slicing.class_direct_members`); else None, the
    caps."""
    if not (options.hierarchical.direct_uncapped and builds_by_class(net)):
        return None
    return class_direct_members(collective, net.topology.size, options.size_bytes)


def _fastest_split(net: Network, levels: list[Stage], options: Options, method: str,
                   splits: list[tuple[int, Stage, Stage]]) -> tuple[Stage, Stage] | None:
    """The split whose two direct steps the estimate times fastest, if faster than the last level's step
    latencies with ``method`` alone (its channel: the last level's index)."""
    last, si = levels[-1], len(levels) - 1
    part = options.size_bytes / math.prod(s.size for s in levels)  # bytes of one part of the last level
    best = estimate(net, last, method, 0.0, 1, si)
    chosen = None
    for a, inner, outer in splits:
        time_s = (estimate(net, inner, "direct", part * (last.size // a), 1, si)
                  + estimate(net, outer, "direct", part, 1, si + 1))
        if time_s < best:
            best, chosen = time_s, (inner, outer)
    return chosen
