"""How many slices, and their shapes: the pipeline's grain, within a chunk budget and a message budget.

Every slice is a complete run of the phases of its own, so while one slice
crosses the hosts the next is reduced inside them.  More slices overlap the
levels better and fill and drain the pipeline faster, but every slice
multiplies the messages, whose count sets the cost of building, proving and
simulating the schedule: the budgets here bound that cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from topocc.planner.compiler.algorithms._order import PIECE_BYTES, Send
from topocc.planner.compiler.algorithms.hierarchical.estimates import DIRECT_MAX_MEMBERS
from topocc.planner.compiler.algorithms.hierarchical.levels import Phase, Stage
from topocc.runtime.collective import ALLREDUCE
from topocc.runtime.collective import collective as describe

__all__ = [
    "CLASS_SLICE_BYTES",
    "CLASS_TRANSFERS_PER_RANK",
    "DOUBLING",
    "EQUAL_SLICES",
    "FEW_SLICES",
    "LARGE_BYTES",
    "MAX_CHUNKS",
    "MAX_TRANSFERS",
    "MIDDLE_AHEAD",
    "MIN_CHUNK_BYTES",
    "MIN_SLICE_BYTES",
    "SLICE_BYTES",
    "SMALL_BUDGET",
    "TRANSFERS_PER_RANK",
    "WAVE_SLICES",
    "WINDOW_BYTES",
    "Wanted",
    "budget_slices",
    "chunk_budget",
    "class_direct_members",
    "slice_shape",
    "stage_slices",
    "wanted_slices",
]

#: At most this many chunks (ranks x slices), but never fewer than :data:`MIN_SLICES` per rank's block:
#: the cost of the builder, the proof (which holds runs of chunks) and the simulator grows with the
#: messages, which more slices multiply, and this bounds it on thousands of ranks.
MAX_CHUNKS = 8192
#: From this size on, twice the chunks: such a collective runs for milliseconds, every step of
#: training, so a compile twice as long buys the last of the pipeline's fill and drain.
LARGE_BYTES = 512 << 20
#: Target bytes per slice of an all-reduce in virtual-block order: the first slice's intra-host
#: reduce-scatter is the pipeline's fill, and the last one's all-gather its drain.
SLICE_BYTES = PIECE_BYTES
#: An all-reduce's first phase is flow-controlled behind halving-doubling only on slices this large (on
#: smaller ones a slice's log n dependent steps each wait out a latency before the next slice may start);
#: and it shapes few slices by doubling only where the smallest is this large (see :data:`FEW_SLICES`).
WINDOW_BYTES = 4 << 20
#: Largest slice of a reduce-scatter or all-gather, relative to its first (see :func:`slice_shape`).
_PLATEAU = 8
#: An all-reduce that the message budget leaves this few slices shapes them by doubling (1, 2, 4, 8, 8, 4,
#: 2, 1; see :data:`DOUBLING`), where its smallest is still :data:`WINDOW_BYTES`: equal slices leave the
#: network idle while the first slice's intra-host reduce-scatter fills the pipeline and the last one's
#: all-gather drains it.  Not where faster hosts own more of the last level (uneven parts), where shaped
#: slices timed slower than equal ones (see docs/algorithms.md).
FEW_SLICES = 16
#: With few shaped slices a rank starts a slice's middle phases (those between the first level's
#: reduce-scatter and its all-gather) only once it has finished the middle phases of the slice this many
#: before it.  Otherwise the slices share the NICs fairly, so the large ones end last and their first
#: level's all-gather drains the pipeline after all; one slice ahead would make each slice wait out the
#: dependent steps of the last.
MIDDLE_AHEAD = 2
#: Sizes of the first slices of a reduce-scatter or all-gather, relative to the first (then the plateau).
_RAMP = (1, 2, 3, 4, 6, 8)
#: The ramp of an all-reduce left few slices (see :data:`FEW_SLICES`): doubling, which reaches the
#: plateau in fewer slices than :data:`_RAMP`, so more of the few are large.
DOUBLING = (1, 2, 4, 8)
#: Reduce-scatter and all-gather slices average at least this much of a rank's block; below it a rank's
#: share is small enough for latency to rule (the collective is "small").
MIN_SLICE_BYTES = 64 << 10
#: No chunk smaller than this (a float32 element): a smaller one would be empty on most buffers, and the time
#: predicted for it wrong.
MIN_CHUNK_BYTES = 4
#: A small all-reduce in virtual order built as one class takes slices of this size, as many as
#: :data:`EQUAL_SLICES` and :data:`MIN_CHUNK_BYTES` allow: each of its slices waits out a path latency per
#: level (halving-doubling: per step), which slices overlap, and built one rank per class, a slice costs
#: that rank's messages, not every rank's (see :data:`CLASS_TRANSFERS_PER_RANK`).
CLASS_SLICE_BYTES = 64 << 10
#: Messages a rank may send over all slices where the schedule is built one rank per class (where the
#: whole schedule's messages are not what the build, the proof and the simulation cost).
CLASS_TRANSFERS_PER_RANK = 8192
#: At least this many slices where there are two or more levels (within the message budget): with fewer,
#: a small collective would run its stages one after the other, the fast intra-host fabric idle while the
#: NICs work.
_MIN_SLICES = 8
#: All-reduce keeps up to this many equal slices; only more are shaped (fewer, over twice the chunks):
#: as fast within a point, with a fraction of the operations.
EQUAL_SLICES = 64
#: Fewer slices where slices x messages per slice would exceed this (the build, the proof and the
#: simulation grow with it).
MAX_TRANSFERS = 1 << 16
#: ... or this many per rank, where that is more, so that a thousand ranks keep enough slices to pipeline.
TRANSFERS_PER_RANK = 160
#: A small reduce-scatter or all-gather of whole blocks that the budget leaves one slice, so that its levels
#: run one after the other, may send this many times the budget's messages: on small messages the slices
#: are cheap to build and time, and the overlap of the levels is most of the time.  (Not an all-reduce of
#: whole blocks, which builds and times both layouts: there it gained nothing for twice the compile.)
SMALL_BUDGET = 4
#: A reduce-scatter in waves gets at least this many slices wherever the message budget fits one, so up to
#: this many times the budget: its waves keep few flows in contention, so they simulate fast.  Up to this
#: many slices pipeline mostly in waves: their levels take methods for them, and no window.
WAVE_SLICES = 4


def slice_shape(slices: int, ramp: tuple[int, ...] = _RAMP) -> tuple[int, ...]:
    """Relative sizes of the ``slices`` slices of a reduce-scatter or all-gather: small at both ends.

    The first slice's first stage is the pipeline's fill and the last slice's
    last stage its drain; the slices in between keep every level busy.  Sizes
    grow from 1 up to :data:`_PLATEAU` by ``ramp`` and halve again towards the
    end, so fill and drain cost a small fraction of a slice (1, 2, 3, 4, 6, 8,
    8, ..., 4, 2, 1).  The ramp grows by about 1.5, not 2: the stage that binds
    is fed by the one before it, which on small slices runs at its latency, and
    a slice twice the last one leaves the binding stage waiting for it.  An
    all-reduce left few slices doubles instead (:data:`DOUBLING`, see
    :data:`FEW_SLICES`).
    """
    return tuple(min(ramp[min(j, len(ramp) - 1)], 2 ** (slices - 1 - j), _PLATEAU) for j in range(slices))


def chunk_budget(p: int, size_bytes: int) -> int:
    """Chunks per rank's block that :data:`MAX_CHUNKS` allows (twice from :data:`LARGE_BYTES`), at least
    :data:`_MIN_SLICES`."""
    return max(MAX_CHUNKS * (2 if size_bytes >= LARGE_BYTES else 1) // p, _MIN_SLICES)


def stage_slices(p: int, size_bytes: int) -> int:
    """Slices for a reduce-scatter or all-gather: as many as keep the chunks of :func:`slice_shape` within
    :func:`chunk_budget` and its pieces at least :data:`MIN_SLICE_BYTES` on average."""
    budget = chunk_budget(p, size_bytes)
    most = size_bytes / p / MIN_SLICE_BYTES
    slices = 1
    while sum(slice_shape(slices + 1)) <= min(budget, most):
        slices += 1
    return slices


class Wanted(NamedTuple):
    """The slices a collective asks for before the message budget, and whether raised to the minimum."""

    slices: int
    raised: bool


def wanted_slices(collective: str, p: int, size_bytes: int, levels: int, pipeline: int | None,
                  virtual: bool, per_class: bool = False) -> Wanted:
    """Slices before the message budget: ``pipeline`` where set; in virtual order (all-reduce) about
    :data:`SLICE_BYTES` each (a small one built one rank per class, ``per_class``: :data:`CLASS_SLICE_BYTES`),
    else as many as :func:`stage_slices` allows; at least a few wherever there are levels to overlap (no
    per-message cost is charged, and without them a small collective runs its levels one after the other).
    Raised to the minimum, the slices are equal ones (see :func:`slice_shape`): on small messages shaped ones
    would leave the middle slices too big to overlap."""
    budget = chunk_budget(p, size_bytes)
    if virtual and per_class and size_bytes / p < MIN_SLICE_BYTES:
        most = max(1, min(EQUAL_SLICES, size_bytes // (p * MIN_CHUNK_BYTES)))
        least = min(_MIN_SLICES, most)
        slices = max(1, min(most, round(size_bytes / CLASS_SLICE_BYTES)))
    elif virtual:
        # a reduce-scatter sends half an all-reduce's messages a slice, so twice the slices cost as much
        least = _MIN_SLICES
        most = budget * (2 if describe(collective).scatters else 1)
        slices = max(1, min(most, round(size_bytes / SLICE_BYTES)))
    else:
        least = max((n for n in range(1, _MIN_SLICES + 1) if sum(slice_shape(n)) <= budget), default=1)
        slices = stage_slices(p, size_bytes)
    if pipeline is not None:
        return Wanted(max(1, pipeline), False)
    if levels > 1 and slices < least:
        return Wanted(least, True)
    return Wanted(slices, False)


def class_direct_members(collective: str, p: int, size_bytes: int) -> int:
    """The most members a direct level may have in a ``collective`` built one rank per class: in a small
    all-reduce (below :data:`MIN_SLICE_BYTES` a rank) as many as keep its messages, ``2 (n - 1)`` a rank and
    slice, within :data:`CLASS_TRANSFERS_PER_RANK` at the slices it wants (so a 1 MiB all-reduce on 16,384
    ranks, 16 slices, runs a level of 256 in one step, where halving-doubling waits out eight path
    latencies), at least :data:`~.estimates.DIRECT_MAX_MEMBERS`; else, as in a reduce-scatter, whose slices
    every rank's budget sizes, that many."""
    if describe(collective) is not ALLREDUCE or size_bytes / p >= MIN_SLICE_BYTES:
        return DIRECT_MAX_MEMBERS
    slices = wanted_slices(collective, p, size_bytes, 2, None, True, per_class=True).slices
    return max(DIRECT_MAX_MEMBERS, CLASS_TRANSFERS_PER_RANK // (2 * slices) + 1)


def budget_slices(levels: Sequence[Stage], phases: Sequence[Phase], steps: Mapping[Phase, list[list[Send]]],
                  spans: Sequence[int], contiguous: bool, small: bool = False, per_class: bool = False) -> int:
    """Slices the message budget allows (:data:`MAX_TRANSFERS`, or :data:`TRANSFERS_PER_RANK` per rank;
    :data:`SMALL_BUDGET` times that for a ``small`` collective left one slice; built one rank per class,
    ``per_class``, :data:`CLASS_TRANSFERS_PER_RANK` a rank; 0 where not even one fits): one message per part
    where the buffer is in virtual-block order (``contiguous``), else one per virtual block of the part."""
    p = spans[0]
    per_slice = 0
    for phase in phases:
        si = phase[0]
        sub = spans[si] // levels[si].size
        per_slice += len(levels[si].groups) * sum(1 if contiguous else (e - a) * sub
                                                  for step in steps[phase] for _, _, a, e in step)
    if per_class:
        return CLASS_TRANSFERS_PER_RANK * p // per_slice
    return (SMALL_BUDGET if small else 1) * max(MAX_TRANSFERS, TRANSFERS_PER_RANK * p) // per_slice
