"""BlueConnect, pipelined: reduce-scatter level by level up the hierarchy, all-gather back down.

Cho et al., "BlueConnect: Decomposing all-reduce for deep learning on
heterogeneous network hierarchy", SysML 2019, section 3: factor ``p = p1 x p2 x
p3`` along the hierarchy (GPUs in a host, hosts in a rack, racks), then run a
reduce-scatter among the ranks that differ only in the level-1 coordinate,
then among those that differ only in the level-2 coordinate on the part each
now owns, and so on; the all-gather retraces the stages in reverse.  Each level
runs on its own fabric, so each level's links carry only that level's share of
the data.  The steps, one module each:

1. :mod:`.levels`: the hierarchy's levels (host, rack, cluster) and the virtual
   blocks that number the ranks across them; :mod:`.split` splits a large last
   level in two on small messages;
2. :mod:`.methods`: each level's method (ring, halving-doubling or direct) from
   the link-load :mod:`.estimates`, the steps of each in :mod:`.steps`;
   :mod:`.ownership` gives the ranks of hosts behind slower NICs fewer parts of
   a direct last level;
3. :mod:`.slicing` and :mod:`.plan`: the buffer's order, the slices and their
   shapes within the chunk and message budgets, the flow control's window;
   :mod:`.layout` chooses an all-reduce's order by simulation where no rule does;
4. :mod:`.emit`: the phases written into the schedule, slice after slice, in
   :mod:`.waves` where a reduce-scatter has few slices, on the channels of
   :mod:`.channels`;
5. :mod:`.rooted`: broadcast and reduce, over the hosts' rails instead.

Run one stage after the other and the fast intra-host fabric idles while the
NICs work, and the other way round.  So the buffer is cut into *slices*, each
a complete BlueConnect all-reduce of its own (chunk ``j * p + v`` is virtual
block ``v`` of slice ``j``): while slice ``j`` crosses the hosts, slice
``j + 1`` is reduced inside them (section 4's pipelining, applied across the
stages).  Reduce-scatter and all-gather are sliced the same way, every rank's
block cut into slices that are small at both ends of the pipeline (its fill
and drain), and a reduce-scatter's first ring phase is flow-controlled so that
it works on its oldest slices first.  A reduce-scatter or all-gather keeps
every rank's block whole in its buffer, so a part of k virtual blocks is k
messages, and the message budget leaves few slices on hundreds of ranks.  An
all-gather's lower levels pass each block on as it arrives, so even one slice
keeps every level busy; a reduce-scatter's lower levels reduce first the
blocks that the levels above pass on first, in *waves*, to the same effect.
Where not even one slice of whole blocks fits (a thousand ranks), a
reduce-scatter runs as an all-reduce's first half in virtual-block order
instead, and each rank then sends its sums to the ranks they belong to.  Even
a small collective gets a few (equal) slices: unsliced, its levels would run
one after the other.
"""

from __future__ import annotations

from typing import Literal, overload

from topocc.planner.compiler.algorithms._order import single_rank
from topocc.planner.compiler.algorithms.hierarchical.emit import build_schedule
from topocc.planner.compiler.algorithms.hierarchical.layout import (
    allreduce_layout,
    blocks_may_help,
    blocks_may_win,
    class_layout,
    class_layout_free,
)
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage, stages
from topocc.planner.compiler.algorithms.hierarchical.methods import stage_methods
from topocc.planner.compiler.algorithms.hierarchical.ownership import ownership
from topocc.planner.compiler.algorithms.hierarchical.rooted import rooted_hierarchical
from topocc.planner.compiler.algorithms.hierarchical.split import split_last
from topocc.planner.compiler.algorithms.hierarchical.steps import METHODS
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import builds_by_class
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.runtime.collective import ALLREDUCE, Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Schedule

__all__ = ["Stage", "hierarchical", "ownership", "rooted_hierarchical", "stage_methods", "stages"]


def hierarchical(net: Network, collective: str, options: Options) -> Schedule:
    """Pipelined BlueConnect schedule for allreduce, reducescatter or allgather; broadcast and reduce run
    over the hosts' rails instead (:func:`~.rooted.rooted_hierarchical`).

    ``options.pipeline`` sets the number of slices (all-reduce: equal ones;
    reduce-scatter and all-gather: shaped; by default see :mod:`.slicing`).
    ``options.hierarchical.window`` sets the flow control's window (0 turns it
    off); ``options.hierarchical.layout`` (``virtual`` or ``blocks``) forces a
    reduce-scatter's or all-reduce's buffer order (by default an all-reduce
    chooses, and on a fabric built by class both try whole blocks by
    halving-doubling first, see :mod:`.layout`); ``options.hierarchical.waves`` (default
    true) lets a reduce-scatter of whole blocks reduce its lower levels in
    waves; ``options.hierarchical.stage_method`` (``ring``,
    ``halving-doubling`` or ``direct``) forces the method of every level whose
    size allows it.  An all-reduce whose direct last level splits unevenly
    (:func:`~.ownership.ownership`) records each virtual block's parts as
    ``ownership``.
    """
    kind = describe(collective)
    collective = kind.name
    if kind.rooted:
        return rooted_hierarchical(net, collective, options)
    if kind.exchanges:
        raise NotApplicableError(
            f"hierarchical does not implement {collective} (it builds allreduce, reducescatter, allgather, "
            "broadcast, reduce)"
        )
    if net.topology.size == 1:
        return single_rank(collective, 1, 1, "hierarchical", options.as_dict())
    levels = stages(net)
    _check(kind, options)
    if kind.reduces and builds_by_class(net) and class_layout_free(levels, options):
        return class_layout(net, collective, levels, options,
                            lambda opts, every_rank: _own(net, collective, levels, opts, every_rank))
    return _own(net, collective, levels, options)


@overload
def _own(net: Network, collective: str, levels: list[Stage], options: Options,
         every_rank: Literal[True] = True) -> Schedule: ...


@overload
def _own(net: Network, collective: str, levels: list[Stage], options: Options,
         every_rank: bool) -> Schedule | None: ...


def _own(net: Network, collective: str, levels: list[Stage], options: Options,
         every_rank: bool = True) -> Schedule | None:
    """Hierarchical's own choice of buffer order, methods and slices; None where it is not one class on a
    fabric built by class and not ``every_rank`` (an all-reduce that times both its orders builds each
    whole)."""
    if collective == ALLREDUCE.name and options.hierarchical.layout is None:
        if blocks_may_win(net, levels, options):
            return allreduce_layout(net, levels, options, "blocks", "virtual")
        if blocks_may_help(net, levels, options):
            return allreduce_layout(net, split_last(net, collective, levels, options, large=False), options,
                                    "virtual", "blocks")
    return build_schedule(net, collective, options, split_last(net, collective, levels, options),
                          options.hierarchical.layout,
                          every_rank)


def _check(kind: Collective, options: Options) -> None:
    """Decline a stage method or layout hierarchical does not know."""
    force = options.hierarchical.stage_method
    if force is not None and force not in METHODS:
        raise NotApplicableError(f"hierarchical: unknown stage_method {force!r} (use {', '.join(METHODS)})")
    layout = options.hierarchical.layout
    if not kind.gathers and layout not in (None, "virtual", "blocks"):
        raise NotApplicableError(f"hierarchical: unknown layout {layout!r} (use virtual or blocks)")
