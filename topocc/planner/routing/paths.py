"""Source routing: the path each connection of a schedule takes, where the fabric lets the sender choose.

On a ``source``-routed topology (InfiniBand with several LIDs per port, RoCE
with a steerable source port) a schedule may record, per connection (sender,
receiver, channel), which of the pair's equal-cost paths it takes
(:class:`topocc.runtime.schedule.PathChoice`).  :func:`assign_paths` makes those
choices for a built schedule, greedily, heaviest connection first, each on the
path whose busiest link would then carry the least (the weight
:class:`topocc.planner.compiler.algorithms._order.LinkLoads` gives a ring hop);
:func:`recorded_paths` is how the simulator and :func:`topocc.planner.compiler.compile.link_time`
see them: a connection with a record takes it where the fabric honours it, any
other the topology's routing (:meth:`topocc.planner.topology.model.Topology.connection_paths`).

Under ``ecmp`` the sender cannot name a path, but the switches hash each
connection, channel included, onto one of the pair's equal-cost paths, so
renumbering a pair's channels moves its connections between paths (NCCL's
channels are separate queue pairs, each with its own source port).
:func:`spread_channels` renumbers them with the same greedy, so that the
connections of a schedule do not collide on a few uplinks while others idle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from topocc.planner.errors import SimulationError
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Link
from topocc.runtime.schedule import PathChoice, Schedule

__all__ = ["CHANNEL_CHOICES", "assign_paths", "connection_chunks", "recorded_paths", "spread_channels"]

#: Under ECMP, the channel numbers :func:`spread_channels` tries for a connection: each hashes anew, so a
#: pair with k equal-cost paths finds each of them among a few dozen channels with high probability.
CHANNEL_CHOICES = 32
#: Route lookups :func:`spread_channels` spends at most (each a hashed walk): schedules of many connections
#: (an all-pairs exchange on 64 ranks: 4032) try fewer channels each, so spreading costs well under a second.
SPREAD_LOOKUPS = 20_000


def connection_chunks(schedule: Schedule, ranks: Iterable[int] | None = None) -> dict[tuple[int, int, int], int]:
    """Chunks sent on each connection ``(src, dst, channel)`` of ``schedule`` (from ``ranks`` only, where
    given), in order of first use."""
    volume: dict[tuple[int, int, int], int] = {}
    for rank in range(schedule.ranks) if ranks is None else ranks:
        for op in schedule.programs[rank]:
            if op.kind == "send":
                key: tuple[int, int, int] = (rank, op.peer, op.channel)
                volume[key] = volume.get(key, 0) + op.count
    return volume


def recorded_paths(net: Network, schedule: Schedule) -> dict[tuple[int, int, int], tuple[Link, ...]]:
    """The schedule's recorded path of each connection as links, where ``topology`` is source-routed.

    Other fabrics cannot steer a connection, so their schedules' records are
    ignored.  Raises :class:`SimulationError` for a record that is not one of
    the pair's cheapest paths on this topology.
    """
    topology = net.topology
    if topology.routing != "source" or not schedule.paths:
        return {}
    found: dict[tuple[int, int, int], tuple[Link, ...]] = {}
    for choice in schedule.paths:
        if not all(0 <= r < topology.size for r in (choice.src, choice.dst)):
            raise SimulationError(f"a recorded path joins rank {choice.src} to rank {choice.dst}, but the topology "
                                  f"has {topology.size} ranks", where=topology.name, fix="recompile the schedule")
        path = net.path_through(choice.src, choice.dst, choice.via)
        if path is None:
            raise SimulationError(
                f"the recorded path of rank {choice.src} -> rank {choice.dst} on channel {choice.channel} "
                f"(via {', '.join(choice.via) or 'nothing'}) is not one of the pair's cheapest paths",
                where=topology.name, fix="recompile the schedule for this topology")
        found[(choice.src, choice.dst, choice.channel)] = path
    return found


def assign_paths(net: Network, schedule: Schedule) -> Schedule:
    """``schedule`` with a path recorded for every connection that has a choice, on a source-routed topology.

    Connections with one path load their links first; then, heaviest first
    (ties in connection order), each connection takes the equal-cost path
    (of :meth:`Topology.routes`) whose busiest link, counting the connection's
    own bytes, would carry the least per byte/s, then the least loaded one
    overall.  Greedy, not optimal: it balances total bytes per link, not bytes
    in flight at each instant.  Other topologies get the schedule unchanged.
    """
    topology = net.topology
    if topology.routing != "source":
        return schedule
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    choosable: list[tuple[int, tuple[int, int, int], tuple[tuple[Link, ...], ...]]] = []
    for key, chunks in connection_chunks(schedule).items():
        paths = net.routes(key[0], key[1])
        if len(paths) > 1:
            choosable.append((chunks, key, paths))
            continue
        for link in paths[0] if paths else ():
            load.add((link.src, link.dst), chunks)
    choices: list[PathChoice] = []
    choosable.sort(key=lambda item: (-item[0], item[1]))
    for chunks, (src, dst, channel), paths in choosable:

        def cost(path: tuple[Link, ...], chunks: int = chunks) -> tuple[float, float]:
            after = [(load.get((link.src, link.dst)) + chunks) / link.bandwidth for link in path]
            return max(after), sum(after)

        best = min(paths, key=cost)
        for link in best:
            load.add((link.src, link.dst), chunks)
        choices.append(PathChoice(src, dst, channel, tuple(link.dst for link in best[:-1])))
    return schedule.with_paths(choices)


def spread_channels(net: Network, schedule: Schedule) -> Schedule:
    """``schedule`` with its connections' channels renumbered so that ECMP hashes them onto spread paths.

    Each pair's channels map one to one onto new numbers (below
    :data:`CHANNEL_CHOICES` and a few, or the old one), sends and receives alike, so every
    message still meets its partner in the same order and the schedule computes
    the same thing.  Connections with one path load their links first; then,
    heaviest first, each connection takes the free channel whose hashed path
    would leave its busiest link least loaded, then the least loaded path
    overall, keeping its own channel on a tie.  Other routings, and schedules
    with no pair that has a choice, come back unchanged.
    """
    topology = net.topology
    if topology.routing != "ecmp":
        return schedule
    load: LinkLoad[tuple[str, str]] = LinkLoad()
    choosable: list[tuple[int, tuple[int, int, int]]] = []
    for key, chunks in connection_chunks(schedule).items():
        src, dst, channel = key
        if net.channels_change_path(src, dst):
            choosable.append((chunks, key))
            continue
        load.add_shares(net.route_shares(src, dst, channel), chunks)
    if not choosable:
        return schedule
    bandwidth = {(link.src, link.dst): link.bandwidth for link in topology.links}
    if not _could_gain(net, schedule, load, choosable, bandwidth):
        return schedule
    taken: dict[tuple[int, int], set[int]] = {}
    renumber: dict[tuple[int, int, int], int] = {}
    choosable.sort(key=lambda item: (-item[0], item[1]))
    tries = max(2, min(CHANNEL_CHOICES, SPREAD_LOOKUPS // len(choosable)))
    for chunks, (src, dst, channel) in choosable:
        used = taken.setdefault((src, dst), set())
        best: tuple[tuple[float, float], int, dict[tuple[str, str], float]] | None = None
        # the pair's connections need as many free numbers as there are of them, beyond the tries
        for candidate in (channel, *range(tries + len(used))):
            if candidate in used or (candidate == channel and best is not None):
                continue
            shares = net.route_shares(src, dst, candidate)
            after = load.times_after(shares, chunks, bandwidth.__getitem__)
            cost = (max(after, default=0.0), sum(after))
            if best is None or cost < best[0]:
                best = (cost, candidate, shares)
        assert best is not None  # the old channel is free until some connection of the pair takes it
        _, chosen, shares = best
        used.add(chosen)
        renumber[(src, dst, channel)] = chosen
        load.add_shares(shares, chunks)
    if all(new == key[2] for key, new in renumber.items()):
        return schedule
    programs = []
    for rank, program in enumerate(schedule.programs):
        ops = []
        for op in program:
            if op.kind == "send":
                new = renumber.get((rank, op.peer, op.channel), op.channel)
            elif op.kind in ("recv", "recv_reduce"):
                new = renumber.get((op.peer, rank, op.channel), op.channel)
            else:
                new = op.channel
            ops.append(op if new == op.channel else replace(op, channel=new))
        programs.append(tuple(ops))
    return replace(schedule.expanded(), programs=tuple(programs))


def _could_gain(net: Network, schedule: Schedule, fixed: LinkLoad[tuple[str, str]],
                choosable: list[tuple[int, tuple[int, int, int]]], bandwidth: dict[tuple[str, str], float]) -> bool:
    """Whether spreading might unload the busiest link: with the choosable connections split evenly over
    their paths, the busiest link would carry less than it does with the channels as they are.

    A cheap test (one route lookup per connection, where spreading tries
    :data:`CHANNEL_CHOICES`): a schedule whose busiest link lies on every path
    of its pairs (a NIC, a host's own uplink) is left alone.
    """
    now, even = fixed.copy(), fixed.copy()
    for chunks, (src, dst, channel) in choosable:
        now.add_shares(net.route_shares(src, dst, channel), chunks)
        even.add_shares(net.even_shares(src, dst), chunks)
    return even.busiest(bandwidth.__getitem__) < now.busiest(bandwidth.__getitem__) * (1 - 1e-6)
