"""The channel of each pair's messages in each phase: phases never share a connection, and under ECMP each
pair takes the channel whose path unloads the busiest link."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from topocc.planner.compiler.algorithms._order import Send
from topocc.planner.compiler.algorithms.hierarchical.levels import Phase, Stage
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import PER_CONNECTION, Network

__all__ = ["CHANNEL_CHOICES", "spread_channels"]

#: Channels a pair's messages may take per phase where ECMP hashes channels onto different paths.
CHANNEL_CHOICES = 8


def spread_channels(net: Network, levels: Sequence[Stage], phases: Sequence[Phase],
                    steps: Mapping[Phase, list[list[Send]]], spans: Sequence[int]) -> Callable[[int, int, int], int]:
    """The channel of each pair's messages in each phase, as a function ``(phase, src, dst) -> channel``.

    Phase ``f`` owns channels ``f, f + len(phases), ...``, so phases still never
    share a connection.  Where the routing hashes connections onto paths (ECMP),
    a fixed channel per phase leaves the hashes to balance the uplinks, and
    their collisions load some spine links well above their share; so each
    pair, in emission order, takes whichever of :data:`CHANNEL_CHOICES`
    channels puts the least load on its busiest link so far (all phases loading
    the links at once, as the pipeline runs them).  This runs before the
    compiler's general pass (:mod:`topocc.planner.routing.paths`), which sees
    the schedule's messages but not the phases that run at once.  Under other routings a channel never
    changes a path, and every phase keeps its first channel (asked of no pair: on a large fabric built one
    rank per class the pairs number tens of millions).
    """
    if net.topology.routing not in PER_CONNECTION:
        return lambda f, src, dst: f
    bandwidth = {(ln.src, ln.dst): ln.bandwidth for ln in net.topology.links}
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    chosen: dict[tuple[int, int, int], int] = {}

    def busiest(shares: Mapping[tuple[str, str], float], weight: float) -> float:
        return max(load.times_after(shares, weight, bandwidth.__getitem__))

    for f, phase in enumerate(phases):
        si = phase[0]
        sub = spans[si] // levels[si].size
        for step in steps[phase]:
            for g in levels[si].groups:
                for i, k, a, e in step:
                    src, dst = g[i], g[k]
                    weight = (e - a) * sub
                    channel = chosen.get((f, src, dst))
                    if channel is None:
                        channel = f
                        if net.channels_change_path(src, dst):
                            options = [f + m * len(phases) for m in range(CHANNEL_CHOICES)]
                            channel = min(options, key=lambda c: busiest(net.route_shares(src, dst, c), weight))
                        chosen[(f, src, dst)] = channel
                    load.add_shares(net.route_shares(src, dst, channel), weight)
    return lambda f, src, dst: chosen[(f, src, dst)]
