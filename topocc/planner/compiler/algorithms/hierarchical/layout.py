"""An all-reduce's buffer order: virtual-block order, or each rank's block whole (a reduce-scatter in waves
and an all-gather), chosen by simulation where neither wins by rule; on fabrics built by class, an
all-reduce's or reduce-scatter's order and methods.

In virtual-block order a part of a level is one run of chunks, so a slice
costs few messages and an all-reduce keeps many slices.  With each rank's
block whole, a part of k virtual blocks is k messages, so the message budget
leaves few slices on hundreds of ranks, but the reduce-scatter half reduces
its lower levels in waves, which pipelines the levels within a slice.
Neither wins everywhere, and the estimates do not see the waves, so where
either may win both are built and simulated (see docs/algorithms.md).

On a fabric built by class (thousands of ranks), whole blocks by
halving-doubling at every level are one class however many ranks there are,
and at scale near the bound, so they are built first (:func:`class_layout`).
Hierarchical's own choices may not be one class (a reduce-scatter's sums
handed on to their owners, a ring's ``(i - 1) mod n``: no formula of the
rank's digits) and are then built rank by rank, which only a thousand ranks
afford.  A small one's own choice is also built with its direct levels free of
the caps on their messages, which bound the work of building and timing every
rank, not of one rank per class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from topocc.planner.compiler.algorithms._order import ring_steps
from topocc.planner.compiler.algorithms.hierarchical.emit import build_schedule
from topocc.planner.compiler.algorithms.hierarchical.levels import Phase, Stage, spans
from topocc.planner.compiler.algorithms.hierarchical.methods import stage_methods
from topocc.planner.compiler.algorithms.hierarchical.slicing import MIN_SLICE_BYTES, WAVE_SLICES, budget_slices
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.runtime.schedule import Schedule

__all__ = ["allreduce_layout", "blocks_may_help", "blocks_may_win", "class_layout", "class_layout_free"]

#: An all-reduce that may run as a reduce-scatter in waves and an all-gather takes that where it comes this
#: near the bound, without building the other (see :func:`allreduce_layout`).
BLOCKS_GOOD = 0.97
#: Up to this many ranks an all-reduce short of :data:`BLOCKS_GOOD` in virtual order also tries whole
#: blocks: there two builds and simulations take seconds.
BLOCKS_TRIED_RANKS = 128
#: Below :data:`~.slicing.MIN_SLICE_BYTES` a rank, up to this many ranks (a slice of whole blocks sends p^2
#: messages a phase, so beyond it the second build costs more than it can gain).
BLOCKS_SMALL_RANKS = 256
#: Up to this many ranks hierarchical's own choice is built rank by rank where it is not one class, to be timed
#: against whole blocks by halving-doubling (see :func:`class_layout`); beyond it only as one class (rank by
#: rank it takes minutes and gigabytes from a few thousand ranks).
EVERY_RANK_MAX = 1024
#: Up to this many ranks a small collective also tries direct levels uncapped (see :func:`class_layout`): the
#: largest shipped fabric, whose such plan takes minutes to build (its proof, by blocks, seconds).
UNCAPPED_MAX_RANKS = 65536


def blocks_may_win(net: Network, levels: Sequence[Stage], options: Options) -> bool:
    """Whether an all-reduce may run faster with each rank's block whole, as a reduce-scatter in waves and an
    all-gather, than in virtual-block order: where the message budget leaves its reduce-scatter half a few
    slices of whole blocks (hundreds of ranks), bandwidth rules, and the levels between the first and the
    last run direct in waves, so that the waves stay fine (a middle level of halving-doubling cuts them
    coarse)."""
    if not _layouts_free(levels, options) or options.size_bytes / net.topology.size < MIN_SLICE_BYTES:
        return False
    halves = [Phase(si, False) for si in range(len(levels))]
    # a slice of whole blocks sends one message per virtual block of a part, whatever the methods
    steps = {phase: ring_steps(levels[phase.level].size, False) for phase in halves}
    if not 1 <= budget_slices(levels, halves, steps, spans(levels, net.topology.size), False) <= WAVE_SLICES:
        return False
    methods = stage_methods(net, levels, options.size_bytes / WAVE_SLICES, WAVE_SLICES, fed=True, waved=True)
    return all(m == "direct" or s.size == 2 for s, m in zip(levels[1:-1], methods[1:-1]))


def blocks_may_help(net: Network, levels: Sequence[Stage], options: Options) -> bool:
    """Whether an all-reduce should also try whole blocks where its virtual-block order falls short: up to
    :data:`BLOCKS_TRIED_RANKS` ranks, and on small messages up to :data:`BLOCKS_SMALL_RANKS`."""
    if not _layouts_free(levels, options):
        return False
    small = options.size_bytes / net.topology.size < MIN_SLICE_BYTES
    return net.topology.size <= (BLOCKS_SMALL_RANKS if small else BLOCKS_TRIED_RANKS)


def class_layout_free(levels: Sequence[Stage], options: Options) -> bool:
    """Whether the layout and methods are open to :func:`class_layout`: as :func:`_layouts_free`, and neither
    the layout nor a method forced."""
    pinned = options.hierarchical
    return _layouts_free(levels, options) and pinned.layout is None and pinned.stage_method is None


def _layouts_free(levels: Sequence[Stage], options: Options) -> bool:
    """Whether an all-reduce's layout is open to choice: two levels or more, slices not forced, waves allowed."""
    return len(levels) >= 2 and options.pipeline is None and options.hierarchical.waves


def allreduce_layout(net: Network, levels: Sequence[Stage], options: Options, first: str,
                     second: str) -> Schedule:
    """The all-reduce in layout ``first`` where it comes within :data:`BLOCKS_GOOD` of the bound, else the
    faster of it and the all-reduce in layout ``second`` (``virtual`` or ``blocks``), as simulated.

    They are timed by the compilation's evaluator (``options.evaluator``),
    which remembers the one it timed last, so the compiler timing the chosen
    schedule again costs nothing (unless its channel spreading replaces it).
    """
    taken = build_schedule(net, "allreduce", options, levels, first)
    return _near_or_faster(net, "allreduce", options, taken,
                           lambda: build_schedule(net, "allreduce", options, levels, second))


def class_layout(net: Network, collective: str, levels: Sequence[Stage], options: Options,
                 own: Callable[[Options, bool], Schedule | None]) -> Schedule:
    """An all-reduce or reduce-scatter on a fabric built by class: whole blocks by halving-doubling at every
    level where that is one class and comes within :data:`BLOCKS_GOOD` of the bound, else the fastest of it and
    hierarchical's own choice (``own``), as simulated.  ``own(options, every_rank)`` may build rank by rank
    where ``every_rank``: up to :data:`EVERY_RANK_MAX` ranks, or where whole blocks by halving-doubling are not
    one class either.

    A small collective of up to :data:`UNCAPPED_MAX_RANKS` ranks first tries
    its own choice with direct levels free of the caps on their messages
    (``direct_uncapped``), as one class: the caps bound the work of building
    and timing every rank, which a schedule built and timed one rank per class
    does not do, and they keep a large level from one direct step (or two,
    split), where halving-doubling waits out a path latency per digit.  Its own
    choice within the caps is then tried only up to :data:`EVERY_RANK_MAX`
    ranks, where it may pipeline better; between the two it did not win on the
    shipped fabrics and cost minutes.
    """
    pinned = replace(options, hierarchical=replace(options.hierarchical, stage_method="halving-doubling"))
    taken = build_schedule(net, collective, pinned, levels, "blocks", every_rank=False)
    if taken is None:
        found = own(options, True)
        assert found is not None  # rank by rank, always built
        return found
    p = net.topology.size
    every_rank = p <= EVERY_RANK_MAX
    if options.size_bytes / p >= MIN_SLICE_BYTES or options.hierarchical.direct_uncapped or p > UNCAPPED_MAX_RANKS:
        return _near_or_faster(net, collective, options, taken, lambda: own(options, every_rank))
    uncapped = replace(options, hierarchical=replace(options.hierarchical, direct_uncapped=True))
    # the one-class try first, so that the other's simulation may stop at its time; ties go to the other
    tries = [lambda: own(uncapped, False)] + ([lambda: own(options, True)] if every_rank else [])
    return _near_or_faster(net, collective, options, taken, *tries)


def _near_or_faster(net: Network, collective: str, options: Options, taken: Schedule,
                    *others: Callable[[], Schedule | None]) -> Schedule:
    """``taken`` where it comes within :data:`BLOCKS_GOOD` of the bound, else the fastest of it and what
    ``others`` build (if anything), as simulated by the compilation's evaluator (``options.evaluator``), which
    remembers the one it timed last (a tie goes to the later)."""
    evaluator = options.evaluator or Evaluator(net, options.size_bytes)
    time_s = evaluator.simulate(taken).time_s
    if evaluator.lower_bound(collective).time_s >= BLOCKS_GOOD * time_s:
        return taken
    for other in others:
        found = other()
        if found is not None and (timed := evaluator.within(found, time_s)) is not None:
            taken, time_s = found, timed.time_s
    return taken
