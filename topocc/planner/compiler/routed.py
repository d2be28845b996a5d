"""One named algorithm's schedule, made ready to time: its connections' paths and channels fitted to the
fabric's routing."""

from __future__ import annotations

from topocc.planner.compiler.algorithms import ALGORITHMS, get_algorithm
from topocc.planner.compiler.evaluate import link_time
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.routing.paths import assign_paths, spread_channels
from topocc.runtime.schedule import Schedule

__all__ = ["routed_schedule"]


def routed_schedule(net: Network, collective: str, name: str, options: Options) -> Schedule:
    """Algorithm ``name``'s schedule of ``collective`` on ``net``, unverified.

    On a source-routed fabric every connection is given its path before the schedule is timed; under ECMP
    its channels are renumbered to spread the connections over the paths, where that unloads the busiest
    link (an algorithm's own channels may hash onto the same uplinks of a leaf while others idle).
    """
    algorithm = get_algorithm(name)
    if collective not in algorithm.collectives:
        others = [a.name for a in ALGORITHMS.values() if collective in a.collectives]
        raise NotApplicableError(
            f"{name} does not implement {collective}", fix=f"algorithms for {collective}: {', '.join(others)}"
        )
    schedule = assign_paths(net, algorithm.load()(net, collective, options))
    spread = spread_channels(net, schedule)
    if spread is not schedule and (link_time(net, spread, options.size_bytes)
                                   < link_time(net, schedule, options.size_bytes) * (1 - 1e-9)):
        return spread
    return schedule
