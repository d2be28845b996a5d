"""Source routing: the path each connection of a schedule takes, where the fabric lets the sender choose.

On a ``source``-routed topology (InfiniBand with several LIDs per port, RoCE
with a steerable source port) a schedule may record, per connection (sender,
receiver, channel), which of the pair's equal-cost paths it takes
(:class:`runtime.schedule.PathChoice`).  :func:`assign_paths` makes those
choices for a built schedule, greedily, heaviest connection first, each on the
path whose busiest link would then carry the least (the weight
:class:`planner.algorithms._order.LinkLoads` gives a ring hop);
:func:`recorded_paths` is how the simulator and :func:`planner.compile.link_time`
see them: a connection with a record takes it where the fabric honours it, any
other the topology's routing (:meth:`planner.topology.Topology.connection_paths`).
"""

from __future__ import annotations

from planner.errors import SimulationError
from planner.topology import Link, Topology
from runtime.schedule import PathChoice, Schedule

__all__ = ["assign_paths", "connection_chunks", "recorded_paths"]


def connection_chunks(schedule: Schedule) -> dict[tuple[int, int, int], int]:
    """Chunks sent on each connection ``(src, dst, channel)`` of ``schedule``, in order of first use."""
    volume: dict[tuple[int, int, int], int] = {}
    for rank, program in enumerate(schedule.programs):
        for op in program:
            if op.kind == "send":
                key = (rank, op.peer, op.channel)  # type: ignore[arg-type]  # a send has a peer
                volume[key] = volume.get(key, 0) + op.count  # type: ignore[index]
    return volume


def recorded_paths(topology: Topology, schedule: Schedule) -> dict[tuple[int, int, int], tuple[Link, ...]]:
    """The schedule's recorded path of each connection as links, where ``topology`` is source-routed.

    Other fabrics cannot steer a connection, so their schedules' records are
    ignored.  Raises :class:`SimulationError` for a record that is not one of
    the pair's cheapest paths on this topology.
    """
    if topology.routing != "source" or not schedule.paths:
        return {}
    found: dict[tuple[int, int, int], tuple[Link, ...]] = {}
    for choice in schedule.paths:
        if not all(0 <= r < topology.size for r in (choice.src, choice.dst)):
            raise SimulationError(f"a recorded path joins rank {choice.src} to rank {choice.dst}, but the topology "
                                  f"has {topology.size} ranks", where=topology.name, fix="recompile the schedule")
        path = topology.path_through(choice.src, choice.dst, choice.via)
        if path is None:
            raise SimulationError(
                f"the recorded path of rank {choice.src} -> rank {choice.dst} on channel {choice.channel} "
                f"(via {', '.join(choice.via) or 'nothing'}) is not one of the pair's cheapest paths",
                where=topology.name, fix="recompile the schedule for this topology")
        found[(choice.src, choice.dst, choice.channel)] = path
    return found


def assign_paths(topology: Topology, schedule: Schedule) -> Schedule:
    """``schedule`` with a path recorded for every connection that has a choice, on a source-routed topology.

    Connections with one path load their links first; then, heaviest first
    (ties in connection order), each connection takes the equal-cost path
    (of :meth:`Topology.routes`) whose busiest link, counting the connection's
    own bytes, would carry the least per byte/s, then the least loaded one
    overall.  Greedy, not optimal: it balances total bytes per link, not bytes
    in flight at each instant.  Other topologies get the schedule unchanged.
    """
    if topology.routing != "source":
        return schedule
    load: dict[tuple[str, str], float] = {}
    choosable: list[tuple[int, tuple[int, int, int], tuple[tuple[Link, ...], ...]]] = []
    for key, chunks in connection_chunks(schedule).items():
        paths = topology.routes(key[0], key[1])
        if len(paths) > 1:
            choosable.append((chunks, key, paths))
            continue
        for link in paths[0] if paths else ():
            load[(link.src, link.dst)] = load.get((link.src, link.dst), 0.0) + chunks
    choices: list[PathChoice] = []
    choosable.sort(key=lambda item: (-item[0], item[1]))
    for chunks, (src, dst, channel), paths in choosable:

        def cost(path: tuple[Link, ...], chunks: int = chunks) -> tuple[float, float]:
            after = [(load.get((link.src, link.dst), 0.0) + chunks) / link.bandwidth for link in path]
            return max(after), sum(after)

        best = min(paths, key=cost)
        for link in best:
            load[(link.src, link.dst)] = load.get((link.src, link.dst), 0.0) + chunks
        choices.append(PathChoice(src, dst, channel, tuple(link.dst for link in best[:-1])))
    return schedule.with_paths(choices)
