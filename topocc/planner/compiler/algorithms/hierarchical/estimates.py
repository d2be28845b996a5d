"""How long a level's phase takes by each method (a link-load model), and what may run direct at all.

A coarse model, used only to choose between methods: per step the path
latency plus the step's bytes over its busiest link, every group of the level
loading the links at once (no overlap between steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from topocc.planner.analysis.automorphisms import pair_key, pair_orbits
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage
from topocc.planner.compiler.algorithms.hierarchical.steps import METHODS, halving_doubling_steps
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Memo, Network
from topocc.planner.routing.relay import path_latency, path_shares

__all__ = [
    "BY_ORBIT_MIN_RANKS",
    "DIRECT_MAX_MEMBERS",
    "DIRECT_MAX_SHARING",
    "alike",
    "direct_fits",
    "estimate",
    "relayed",
    "round_trip",
    "sharing",
    "uncapped",
]

#: A level of more members never runs direct: its n^2 messages per group would swamp the schedule.
DIRECT_MAX_MEMBERS = 32
#: Nor one whose phase sends more messages than this per slice (ranks x (members - 1)) inside hosts, or
#: twice as many across the network: inside a host a step waits out a fraction of a microsecond, so direct
#: saves little latency there for its extra operations, while across the network each step saved is a path
#: latency, worth the messages of a rail-optimized cluster's hosts.
_DIRECT_MAX_SENDS = 4096
#: A level across the network runs direct only where its one step puts at most this many messages on a
#: link (route shares summed): more make many flows contend at the leaves and spines, which the estimate
#: does not see, and which is the simulator's worst case (timing such a schedule takes minutes where the
#: other methods' take seconds).  Rails and small fat-trees stay under it.
DIRECT_MAX_SHARING = 32.0
#: From this many ranks a step's load is summed one pair per orbit of the fabric's symmetries (the same
#: load up to rounding); below it pair by pair, the sums the plans of smaller fabrics were chosen by.
BY_ORBIT_MIN_RANKS = 1024


def spread_shares(net: Network, src: int, dst: int, channel: int,
                  spread: bool) -> Mapping[tuple[str, str], float]:
    """:func:`~topocc.planner.routing.relay.path_shares` as the estimates see them: with ``spread`` (all-reduce),
    where the routing hashes a pair's channels onto different paths (ECMP), the message split evenly over the
    pair's equal-cost paths.

    The emitted schedule gives each pair the channel that unloads the busiest
    link (:func:`~topocc.planner.compiler.algorithms.hierarchical.channels.spread_channels`),
    which over a level's many pairs comes near that even split; one channel's
    hashes are luck instead, and their collisions can time a good method slow.
    Only for an all-reduce, which sends a part as one message and keeps its
    slices: the message budget may leave a reduce-scatter or all-gather one
    slice, whose levels then overlap only as a ring's parts arrive, and there
    the hashed shares, which time a ring no slower, choose better.
    """
    if not spread or not net.channels_change_path(src, dst):
        return path_shares(net, src, dst, channel)
    return net.even_shares(src, dst)


def estimate(net: Network, stage: Stage, method: str, part_bytes: float, slices: int, channel: int,
             spread: bool = False) -> float:
    """Seconds one phase of ``stage`` takes with ``method`` on ``channel``: per step the path latency plus the
    step's bytes over its busiest link, every group of the stage loading the links at once, ``slices`` times
    (a relayed pair loads and waits for all its hops).

    ``spread``: ECMP routes as :func:`spread_shares` sees them for an all-reduce.
    """
    total = 0.0
    seen: dict[tuple[tuple[int, int, int], ...], float] = {}  # a ring's steps all cost the same
    for step in METHODS[method](stage.size, False):
        shape = tuple((i, j, b - a) for i, j, a, b in step)
        cost = seen.get(shape)
        if cost is None:
            latency, busiest = _step_load(net, stage, shape, channel, spread, True)
            cost = seen[shape] = latency + slices * part_bytes * busiest
        total += cost
    return total


#: Each step's load (:func:`_step_load`) per (stage, step shape, channel, spread, timed): a compilation times
#: the same steps for several methods and options.
_STEP_LOADS: Memo[dict[tuple[Stage, tuple[tuple[int, int, int], ...], int, bool, bool], tuple[float, float]]] = \
    Memo("hierarchical: step loads", lambda net: {})


def _step_load(net: Network, stage: Stage, shape: tuple[tuple[int, int, int], ...], channel: int, spread: bool,
               timed: bool) -> tuple[float, float]:
    """The slowest path latency of one step of ``stage``, every group sending ``parts`` from its member ``i``
    to its member ``j`` for each ``(i, j, parts)`` of ``shape``, and its busiest link's load: ``timed``, in
    seconds a part (:meth:`~topocc.planner.routing.load.LinkLoad.busiest` over the links' bandwidths), else
    the most parts on a link, and no latency, 0 (cached per network).

    From :data:`BY_ORBIT_MIN_RANKS` ranks summed one pair per orbit where the fabric's symmetries allow
    (:func:`_load_by_orbit`), else pair by pair."""
    cache = net.memo(_STEP_LOADS)
    key = (stage, shape, channel, spread, timed)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _summed_load(net, stage, shape, channel, spread, timed)
    return found


def _summed_load(net: Network, stage: Stage, shape: tuple[tuple[int, int, int], ...], channel: int,
                 spread: bool, timed: bool) -> tuple[float, float]:
    """:func:`_step_load`, computed."""
    groups = np.array(stage.groups, dtype=np.int64)
    i, j, parts = (np.array(column, dtype=np.int64) for column in zip(*shape))
    src, dst = groups[:, i].ravel(), groups[:, j].ravel()
    amount = np.tile(parts.astype(float), len(groups))
    bandwidth = net.topology.bandwidth
    if net.topology.size >= BY_ORBIT_MIN_RANKS:
        found = _load_by_orbit(net, src, dst, amount, channel, spread, timed)
        if found is not None:
            return found
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    pairs = list(zip(src.tolist(), dst.tolist(), amount.tolist()))
    for a, b, n in pairs:
        load.add_shares(spread_shares(net, a, b, channel, spread), n)
    if not timed:
        return 0.0, load.busiest()
    return (max(path_latency(net, a, b, channel) for a, b, _ in pairs),
            load.busiest(lambda link: bandwidth(*link)))


def _load_by_orbit(net: Network, src: np.ndarray, dst: np.ndarray, amount: np.ndarray, channel: int,
                   spread: bool, timed: bool) -> tuple[float, float] | None:
    """:func:`_summed_load` of the messages ``src[i] -> dst[i]`` of ``amount[i]`` parts from one pair of each
    orbit of the fabric's translations that keep them
    (:func:`~topocc.planner.analysis.automorphisms.pair_orbits`): every link of a link orbit then carries the
    orbit's load over its link count.  None where no translation keeps them, or some pair's paths are not
    carried onto its image's (a relay, a hash or a cap picks them)."""
    orbits = pair_orbits(net, src, dst, amount)
    if orbits is None:
        return None
    rep_src, rep_dst = orbits.key.many(src, dst)
    codes, first, inverse = np.unique(rep_src * net.topology.size + rep_dst, return_index=True,
                                      return_inverse=True)
    summed = np.bincount(inverse.ravel(), weights=amount)
    load: dict[int, float] = {}
    link_of: dict[int, tuple[str, str]] = {}  # one link of each orbit loaded, for its bandwidth
    latency = 0.0
    bandwidth = net.topology.bandwidth
    for k in np.argsort(first, kind="stable").tolist():  # the pairs' order, so that the sums are too
        a, b = divmod(int(codes[k]), net.topology.size)
        parts = float(summed[k])
        if not (net.has_route(a, b) and net.routed_by_shape(a, b)):
            return None
        if timed:
            latency = max(latency, path_latency(net, a, b, channel))
        for link, share in spread_shares(net, a, b, channel, spread).items():
            o = orbits.orbit(link)
            load[o] = load.get(o, 0.0) + share * parts
            link_of.setdefault(o, link)
    per_link = ((v / orbits.count[o], link_of[o]) for o, v in load.items())
    busiest = max((v / bandwidth(*link) if timed else v for v, link in per_link), default=0.0)
    return latency, float(busiest)


def round_trip(net: Network, stage: Stage, method: str, part_bytes: float, slices: int, channel: int,
               weights: Mapping[int, int] | None) -> float:
    """Seconds the last level of an all-reduce takes with ``method``, reduce-scatter and all-gather pooled:
    every step's path latency plus all the bytes of both phases over the busiest link.

    Pooled since the pipeline runs both phases at once, on different slices:
    with uneven ownership (``weights``, see
    :func:`~topocc.planner.compiler.algorithms.hierarchical.ownership.ownership`; by default one
    part each) a small owner's links carry mostly outgoing bytes in the
    reduce-scatter and incoming ones in the all-gather, which a phase-by-phase
    :func:`estimate` would count as if they queued.
    """
    bandwidth = net.topology.bandwidth
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    latency = 0.0
    for gather in (False, True):
        for step in METHODS[method](stage.size, gather):
            for g in stage.groups:
                for i, j, a, b in step:
                    parts = b - a if weights is None else sum(weights[g[x]] for x in range(a, b))
                    load.add_shares(spread_shares(net, g[i], g[j], channel, True), parts)
            latency += max(path_latency(net, g[i], g[j], channel) for g in stage.groups for i, j, _, _ in step)
    return latency + slices * part_bytes * load.busiest(lambda key: bandwidth(*key))


def relayed(net: Network, stage: Stage) -> bool:
    """Whether some halving-doubling partners of ``stage`` have no GPU-free route (their messages relay).

    Such a level runs a ring or direct instead: a relayed partner changes with
    every step, so the gateways' queues change with it, which the estimate,
    timing all three methods alike, does not see.
    """
    return any(not net.has_route(g[i], g[j]) for g in stage.groups
               for step in halving_doubling_steps(stage.size, False) for i, j, _, _ in step)


def direct_fits(stage: Stage, class_members: int | None = None) -> bool:
    """Whether ``stage`` is small enough to run direct at all (:data:`DIRECT_MAX_MEMBERS`,
    :data:`_DIRECT_MAX_SENDS`); ``class_members``: on a small collective on a fabric built by class, which is
    built and timed one rank per class, so that a step's messages cost what one rank's do, the most members
    (see :func:`~topocc.planner.compiler.algorithms.hierarchical.slicing.class_direct_members`), and only
    they count."""
    if class_members is not None:
        return stage.size <= class_members
    return stage.size <= DIRECT_MAX_MEMBERS and (
        len(stage.groups) * stage.size * (stage.size - 1) <= _DIRECT_MAX_SENDS * (1 if stage.level == "host" else 2))


def alike(net: Network, stage: Stage) -> bool:
    """Whether every pair of every group of ``stage`` has a route of one and the same cost (members on one
    switch), so that a direct step loads them alike."""
    key = pair_key(net)  # a route's cost is its orbit's: asked once per orbit
    costs = [net.route_cost(*pair) for pair in {(a, b) if key is None else key(a, b)
                                                 for g in stage.groups for a in g for b in g if a != b}]
    return bool(costs) and max(costs) < math.inf and max(costs) <= min(costs) * (1 + 1e-9)


def sharing(net: Network, stage: Stage, channel: int) -> float:
    """The most messages (route shares summed) one link carries in a direct step of ``stage``; 0 for a
    host level, which the cap on it never limits."""
    if stage.level == "host":
        return 0.0
    shape = tuple((i, j, 1) for i in range(stage.size) for j in range(stage.size) if i != j)
    return _step_load(net, stage, shape, channel, False, False)[1]


def uncapped(net: Network, levels: Sequence[Stage]) -> bool:
    """Whether the sharing cap leaves every level that may run direct free to."""
    return all(sharing(net, s, si) <= DIRECT_MAX_SHARING for si, s in enumerate(levels) if direct_fits(s))
