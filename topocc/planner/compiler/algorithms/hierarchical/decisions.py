"""The decisions behind one schedule, each made once: buffer order, slices, methods, window, slice shape.

:func:`plan_slicing` starts from the slices the collective wants and the
methods timed for them, and then revisits that pass where the message budget
changes the premise: a reduce-scatter of whole blocks left too few slices
turns to virtual-block order; one whose methods were timed for slices the
budget does not allow times them again for one; one left few slices runs them
in waves; and one that the cap on contending messages leaves a single slice
tries again without the cap.  Each revision is one named rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from topocc.planner.compiler.algorithms._order import Send
from topocc.planner.compiler.algorithms.hierarchical.estimates import DIRECT_MAX_SHARING, uncapped
from topocc.planner.compiler.algorithms.hierarchical.levels import Phase, Stage, phases_of, spans
from topocc.planner.compiler.algorithms.hierarchical.methods import stage_methods, windowed
from topocc.planner.compiler.algorithms.hierarchical.ownership import ownership
from topocc.planner.compiler.algorithms.hierarchical.slicing import (
    DOUBLING,
    EQUAL_SLICES,
    FEW_SLICES,
    MIDDLE_AHEAD,
    MIN_SLICE_BYTES,
    WAVE_SLICES,
    WINDOW_BYTES,
    Wanted,
    budget_slices,
    slice_shape,
    wanted_slices,
)
from topocc.planner.compiler.algorithms.hierarchical.split import class_members
from topocc.planner.compiler.algorithms.hierarchical.steps import level_steps
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import builds_by_class
from topocc.planner.routing.network import Network
from topocc.runtime.collective import ALLREDUCE, Collective
from topocc.runtime.collective import collective as describe

__all__ = ["Job", "SliceShape", "Slicing", "job_of", "plan_shape", "plan_slicing"]

#: Slices of a reduce-scatter's or all-reduce's first phase a rank may have in flight, where the first level
#: is not direct (all-reduce: a ring, or halving-doubling on slices of :data:`WINDOW_BYTES`; see
#: :func:`_window`; ``options.hierarchical.window``, 0: no limit).  Posted all at once, the first step of
#: every slice takes the links from the later steps that complete slices, and the next level starves; a
#: windowed ring keeps its one link busy with the oldest slice.
_WINDOW = 1


@dataclass(frozen=True, slots=True)
class Job:
    """The collective to build on these levels, and what every decision about it reads."""

    net: Network
    collective: str
    options: Options
    levels: tuple[Stage, ...]
    #: the buffer order forced (``virtual`` or ``blocks``), None where free (always for all-gather)
    layout: str | None
    phases: tuple[Phase, ...]
    spans: tuple[int, ...]
    #: an all-reduce's ownership of its last level (see :func:`ownership`), where it runs direct
    weighted: Mapping[int, int] | None
    #: a reduce-scatter (or an all-reduce's first half) of whole blocks may reduce its lower levels in waves
    waved: bool
    #: a rank's share is large enough for bandwidth to rule (:data:`MIN_SLICE_BYTES`)
    bulk: bool
    #: a reduce-scatter or all-gather below :data:`MIN_SLICE_BYTES` a rank, where latency rules
    small: bool
    #: a small collective (below :data:`MIN_SLICE_BYTES` a rank) built one rank per class or not at all, so that
    #: in virtual order its slices cost one rank's messages, not every rank's (see wanted_slices)
    per_class: bool = False

    @property
    def p(self) -> int:
        return self.net.topology.size

    @property
    def kind(self) -> Collective:
        """What the collective means."""
        return describe(self.collective)

    def wanted(self, contiguous: bool) -> Wanted:
        """The slices wanted in that buffer order, before the message budget."""
        return wanted_slices(self.collective, self.p, self.options.size_bytes, len(self.levels),
                             self.options.pipeline, contiguous, self.per_class)


def job_of(net: Network, collective: str, options: Options, levels: Sequence[Stage], layout: str | None,
           per_class: bool = False) -> Job:
    """The :class:`Job` of ``collective`` on ``levels``, ``layout`` forced where not None; ``per_class``: built
    one rank per class or not at all."""
    p = net.topology.size
    bulk = options.size_bytes / p >= MIN_SLICE_BYTES
    kind = describe(collective)
    return Job(
        net, collective, options, tuple(levels),
        layout=layout if not kind.gathers else None,
        phases=tuple(phases_of(collective, levels)),
        spans=tuple(spans(levels, p)),
        # all-reduce may let the ranks of fast hosts reduce more of the last level (where that runs direct)
        weighted=ownership(net, levels[-1], len(levels) - 1) if kind is ALLREDUCE else None,
        waved=kind.reduces and len(levels) > 1 and options.hierarchical.waves,
        bulk=bulk,
        small=not bulk and kind is not ALLREDUCE,
        per_class=per_class and not bulk,
    )


@dataclass(frozen=True, slots=True)
class Slicing:
    """One pass's decision: buffer order, slices, each level's method, the flow control's window and the
    message budget's verdict."""

    #: the buffer in virtual-block order (a part is one run of chunks), else each rank's block whole
    contiguous: bool
    #: few slices of whole blocks pipelined mostly in waves: methods for waves, no window
    in_waves: bool
    slices: int
    #: the slices raised to the minimum (equal ones, see :func:`~.slicing.wanted_slices`)
    raised: bool
    methods: tuple[str, ...]
    #: the last level's ownership where it is uneven and runs direct
    weights: Mapping[int, int] | None
    window: int
    steps: Mapping[Phase, list[list[Send]]]
    #: slices the message budget allows in this order (0: not even one)
    fit: int
    #: slices allowed after the budget's exceptions (at least 1)
    most: int


def plan_slicing(job: Job) -> Slicing:
    """The slicing of ``job``: under the sharing cap, and without it where the cap leaves a single slice."""
    plan = _under_cap(job, DIRECT_MAX_SHARING)
    if job.options.pipeline is None and not plan.contiguous and plan.most <= 1 and not uncapped(job.net, job.levels):
        # The cap bounds the messages that contend on a link at once, a step's per slice in flight; where the
        # budget leaves a reduce-scatter or all-gather one slice anyway, they contend once, so the methods
        # are chosen again without it (a small one then takes more slices; an all-reduce keeps its slices).
        plan = _under_cap(job, math.inf)
    return plan


def _under_cap(job: Job, cap: float) -> Slicing:
    """The slicing with direct levels kept to ``cap`` messages on a link: a first pass, revised by the rules
    below where the message budget changes its premise."""
    layout, pipeline = job.layout, job.options.pipeline
    contiguous = (job.kind is ALLREDUCE and layout != "blocks") or layout == "virtual"
    if pipeline is not None:  # the slices pinned: no budget to revise them by
        few = job.waved and job.bulk and pipeline <= WAVE_SLICES
        return _attempt(job, cap, contiguous, few, job.wanted(contiguous))
    plan = _attempt(job, cap, contiguous, False, job.wanted(contiguous))
    if _turns_virtual(job, plan):
        return _settled(_attempt(job, cap, True, False, job.wanted(True)))
    if _times_again_for_one(job, plan):
        return _settled(_attempt(job, cap, contiguous, False, Wanted(1, plan.raised)))
    plan = _settled(plan)
    if _pipelines_in_waves(job, plan):
        plan = _attempt(job, cap, contiguous, True, job.wanted(contiguous))
        if _turns_virtual(job, plan):
            return _settled(_attempt(job, cap, True, False, job.wanted(True)))
        plan = _settled(plan)
    return plan


def _settled(plan: Slicing) -> Slicing:
    """``plan`` with no more slices than the message budget allows."""
    return replace(plan, slices=min(plan.slices, plan.most))


def _turns_virtual(job: Job, plan: Slicing) -> bool:
    """Whether a reduce-scatter of whole blocks runs as an all-reduce's first half in virtual-block order.

    Whole blocks make a part of k virtual blocks k messages, p^2 a slice in
    all.  Where that leaves a reduce-scatter fewer slices than it wants, its
    blocks are large enough for bandwidth to matter, and not one slice fits in
    waves (without waves, wherever virtual order allows more slices), it runs
    in virtual order instead, and each rank sends its sums on to the ranks they
    belong to at the end: 1/p of the data more on the network, and one path
    latency, for slices.  Where latency rules, whole blocks stay.
    """
    return (job.kind.scatters and job.layout is None and not plan.contiguous
            and plan.most < plan.slices and not (job.waved and plan.fit) and job.bulk
            and budget_slices(job.levels, job.phases, plan.steps, job.spans, True) > plan.most)


def _pipelines_in_waves(job: Job, plan: Slicing) -> bool:
    """Whether the budget leaves a reduce-scatter (or an all-reduce's first half) of whole blocks, where
    bandwidth rules, so few slices that they pipeline mostly in waves: its levels then take the methods that
    pipeline waves (see stage_methods), and it runs without a window."""
    return job.waved and job.bulk and not plan.contiguous and plan.slices <= WAVE_SLICES


def _times_again_for_one(job: Job, plan: Slicing) -> bool:
    """Whether a small reduce-scatter's methods, timed for slices the budget does not allow, are timed again
    for the one it does: the first level's window penalty (see stage_methods) is for slices it cannot have."""
    return (plan.most == 1 < plan.slices and job.small and not plan.contiguous
            and job.kind.scatters)


def _attempt(job: Job, cap: float, contiguous: bool, few: bool, wanted: Wanted) -> Slicing:
    """One pass: the methods timed for the slices wanted, the window, and what the message budget allows;
    ``few``: whole blocks in few slices, pipelined mostly in waves."""
    net, levels, options = job.net, job.levels, job.options
    slices = wanted.slices
    in_waves = few and not contiguous
    weights = job.weighted if contiguous else None
    methods = stage_methods(net, levels, options.size_bytes / slices, slices, options.hierarchical.stage_method,
                            weights, fed=job.kind.reduces and not contiguous, spread=contiguous,
                            sharing_cap=cap, waved=in_waves, contend=not (job.small and cap == math.inf),
                            class_members=class_members(net, job.collective, options))
    if methods[-1] != "direct":
        weights = None
    window = _window(job, methods, slices, contiguous, in_waves)
    if window and options.hierarchical.stage_method is None and not contiguous:
        methods = windowed(net, levels, methods, options.size_bytes / slices, slices)
    by_class = builds_by_class(net)
    steps = {phase: level_steps(methods[phase.level], levels[phase.level].size, phase.gather, by_class)
             for phase in job.phases}
    plan = Slicing(contiguous, in_waves, slices, wanted.raised, tuple(methods), weights, window, steps,
                   fit=0, most=slices)
    return plan if options.pipeline is not None else _budgeted(job, plan, cap)


def _window(job: Job, methods: Sequence[str], slices: int, contiguous: bool, in_waves: bool) -> int:
    """The flow control's window on the first phase (0: none).

    A direct first level needs none, so there it is off and direct levels stay
    (see :func:`~.methods.windowed`).  In virtual order the levels keep their
    methods.  An all-reduce takes it behind a ring, or behind halving-doubling
    on slices of :data:`WINDOW_BYTES` or more: on small ones a slice's log n
    dependent steps each wait out a latency before the next slice may start.
    In waves it is off: they need slices to work on.
    """
    if in_waves:
        return 0
    if job.options.hierarchical.window is not None:
        return job.options.hierarchical.window
    if job.kind is ALLREDUCE and contiguous:
        gated = methods[0] == "ring" or (methods[0] == "halving-doubling"
                                         and job.options.size_bytes / slices >= WINDOW_BYTES)
    else:
        gated = job.kind.reduces and methods[0] != "direct"
    return _WINDOW if gated else 0


def _budgeted(job: Job, plan: Slicing, cap: float) -> Slicing:
    """``plan`` with the slices the message budget allows (:func:`~.slicing.budget_slices`) and its
    exceptions."""
    levels, phases, spans_, steps = job.levels, job.phases, job.spans, plan.steps
    fit = budget_slices(levels, phases, steps, spans_, plan.contiguous, per_class=job.per_class and plan.contiguous)
    most = max(1, fit)
    lifted = job.small and cap == math.inf
    if (fit <= 1 and plan.raised and job.small and not plan.contiguous
            and (lifted or uncapped(job.net, levels))):
        # a small reduce-scatter or all-gather that the budget leaves one slice, its levels one after the
        # other, may send more messages (see SMALL_BUDGET)
        most = max(1, budget_slices(levels, phases, steps, spans_, False, small=True))
    if (job.waved and job.bulk and not plan.contiguous
            and budget_slices(levels, phases[:len(levels)], steps, spans_, False)):
        # in waves a few slices of whole blocks pipeline the levels (see WAVE_SLICES)
        most = max(fit, WAVE_SLICES)
    return replace(plan, fit=fit, most=most)


@dataclass(frozen=True, slots=True)
class SliceShape:
    """The slices' sizes in chunks (of a rank's block, or of a virtual block in virtual order), and how many
    slices ahead a rank may run a slice's middle phases (0: no limit; see :data:`~.slicing.MIDDLE_AHEAD`)."""

    sizes: tuple[int, ...]
    ahead: int = 0

    @property
    def slices(self) -> int:
        return len(self.sizes)

    @property
    def units(self) -> int:
        """Chunks of one rank's block (or virtual block) over all slices."""
        return sum(self.sizes)

    @property
    def offsets(self) -> list[int]:
        return [sum(self.sizes[:j]) for j in range(len(self.sizes))]


def plan_shape(job: Job, plan: Slicing) -> SliceShape:
    """The slices' sizes.

    A reduce-scatter or all-gather of whole blocks shapes them small at both
    ends (:func:`~.slicing.slice_shape`) unless raised to the minimum.  An
    all-reduce keeps equal slices, but doubles few large ones from both ends
    (:data:`~.slicing.FEW_SLICES`), and shapes many over up to twice the
    chunks of equal ones (:data:`~.slicing.EQUAL_SLICES`): as fast, with a
    fraction of the slices, so of the operations.
    """
    slices, options = plan.slices, job.options
    if not plan.contiguous:
        return SliceShape((1,) * slices if plan.raised else slice_shape(slices))
    if options.pipeline is not None or plan.raised:
        return SliceShape((1,) * slices)
    doubled = slice_shape(slices, DOUBLING)
    if (len(job.levels) > 1 and 3 <= slices <= FEW_SLICES and plan.weights is None
            and options.size_bytes / sum(doubled) >= WINDOW_BYTES):
        return SliceShape(doubled, MIDDLE_AHEAD)
    if slices > EQUAL_SLICES:
        n = 1
        while n < plan.most and sum(slice_shape(n + 1)) <= 2 * slices:
            n += 1
        return SliceShape(slice_shape(n))
    return SliceShape((1,) * slices)
