"""The algorithm table: every schedule construction, by name, with the collectives it supports.

Each algorithm is a function ``(network, collective, options) -> Schedule`` in
its own module.  It raises :class:`~topocc.planner.errors.NotApplicableError` when the
topology or collective does not suit it; :func:`topocc.planner.compiler.compile.compile_schedule`
is the front door that picks one, verifies and times the result.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from topocc.planner.compiler.options import Options
from topocc.planner.errors import UsageError
from topocc.planner.routing.network import Network
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Schedule

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmFn", "get_algorithm"]


AlgorithmFn = Callable[[Network, str, Options], Schedule]


@dataclass(frozen=True, slots=True)
class Algorithm:
    """A registered construction: its name, the collectives it builds, and a one-line summary."""

    name: str
    module: str
    function: str
    collectives: tuple[str, ...]
    summary: str
    #: ``auto`` skips this algorithm above this many ranks: its schedule grows as p^2 operations (or its
    #: solver as a model of that size, or its rank order, a ring searched over every rank), so at scale it
    #: loses to the hierarchical ones and costs minutes.
    auto_max_ranks: int | None = None
    #: ``auto`` races the algorithms tier by tier, cheapest to build first, and stops before the next tier
    #: once its best reaches :data:`topocc.planner.compiler.race.GOOD_ENOUGH` of the lower bound (the costly
    #: builders, tree packing, MultiTree and the flow LP, take seconds to minutes where the others take well
    #: under one).
    auto_tier: int = 0
    #: ``(collective, ranks) -> n``: every schedule it builds has a chain of at least n dependent
    #: messages (each waits for the previous one to arrive), so it takes at least n times the least
    #: rank-to-rank latency; ``auto`` builds it last, and not at all when that already loses.
    min_chain: Callable[[str, int], int] | None = None
    #: Name of a function of :attr:`module`, ``(topology, collective, options) -> seconds``: a lower bound
    #: of :func:`topocc.planner.compiler.evaluate.link_time` of its schedule, found without building it (whose
    #: cost grows with the pipelined pieces); ``auto`` builds it after the others of its tier, and not at all
    #: when that bound already loses, which skips the builds that cost most and cannot win.
    link_floor: str | None = None

    def load(self) -> AlgorithmFn:
        fn: AlgorithmFn = getattr(importlib.import_module(self.module), self.function)
        return fn

    def load_link_floor(self) -> Callable[[Network, str, Options], float] | None:
        """The :attr:`link_floor` function, or None when the algorithm has none."""
        if self.link_floor is None:
            return None
        fn: Callable[[Network, str, Options], float] = getattr(importlib.import_module(self.module), self.link_floor)
        return fn


_ALL = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce")


def _ring_chain(collective: str, p: int) -> int:
    """Dependent messages in every ring schedule: a block passes p - 1 ranks in turn (reduce-scatter,
    all-gather, the chains of broadcast and reduce), an all-reduce block p - 1 to be reduced, then p - 1
    more to be spread; pieces and channels run several such chains side by side, never shorter ones."""
    return max(0, p - 1) * describe(collective).passes

#: The one table of algorithms (imported lazily so a solver-backed one costs nothing until used).
ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("ring", "topocc.planner.compiler.algorithms.ring", "ring", _ALL,
                  "topology-aware rings (one or more channels), bandwidth-optimal for large messages",
                  auto_max_ranks=256, min_chain=_ring_chain, link_floor="ring_link_floor"),
        # the tree and halving-doubling order ranks by the ring over all of them: a search that takes
        # minutes above 16,384 ranks (about 9 on 65,536), where both lose to the hierarchical schedules
        Algorithm("tree", "topocc.planner.compiler.algorithms.tree", "double_binary_tree",
                  ("allreduce", "broadcast", "reduce"),
                  "double binary tree (NCCL's tree), logarithmic latency", auto_max_ranks=16384,
                  link_floor="tree_link_floor"),
        Algorithm("halving-doubling", "topocc.planner.compiler.algorithms.halving_doubling", "halving_doubling",
                  ("allreduce", "reducescatter", "allgather"),
                  "recursive halving-doubling (Rabenseifner), log p steps", auto_max_ranks=16384),
        Algorithm("direct", "topocc.planner.compiler.algorithms.direct", "direct", (*_ALL, "alltoall"),
                  "all-pairs exchange in one step, for small messages and all-to-all", auto_max_ranks=64),
        Algorithm("hierarchical", "topocc.planner.compiler.algorithms.hierarchical", "hierarchical", _ALL,
                  "BlueConnect: reduce-scatter level by level up the hierarchy, all-gather back down; "
                  "broadcast and reduce on chains or trees per rail across the hosts"),
        Algorithm("bucket", "topocc.planner.compiler.algorithms.bucket", "bucket",
                  ("allreduce", "reducescatter", "allgather"),
                  "bucket algorithm on a torus or mesh: rotated dimension orders keep every link busy"),
        Algorithm("multitree", "topocc.planner.compiler.algorithms.multitree", "multitree",
                  ("allreduce", "reducescatter", "allgather", "broadcast"),
                  "MultiTree: one contention-free spanning tree per root, grown in lock-step", auto_max_ranks=64,
                  auto_tier=2, link_floor="multitree_link_floor"),
        Algorithm("treepack", "topocc.planner.compiler.algorithms.treepack", "treepack", _ALL,
                  "throughput-optimal spanning-tree packing (ForestColl), for large messages",
                  # beyond 256 ranks the p (p-1) transfers per phase it needs at the least make a schedule
                  # that takes the simulator too long to time within a compile
                  auto_max_ranks=256, auto_tier=1, link_floor="treepack_link_floor"),
        Algorithm("mcf", "topocc.planner.compiler.algorithms.mcf", "mcf", _ALL,
                  "min-cost multi-commodity flow over time (DDL, TE-CCL): LP/MILP over epochs, rounded",
                  auto_max_ranks=8, auto_tier=3),
    )
}


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm called ``name``, or a :class:`UsageError` listing the choices."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UsageError(f"unknown algorithm {name!r}", fix=f"use one of {', '.join(ALGORITHMS)}") from None
