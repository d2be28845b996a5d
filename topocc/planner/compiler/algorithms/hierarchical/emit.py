"""Writing the planned phases into a :class:`~topocc.planner.compiler.builder.ScheduleBuilder`.

Reduce-scatter up the levels, all-gather back down, slice by slice as a
wavefront (slice ``j``'s phase ``f`` in round ``j + f``), so each rank posts
its messages roughly in the order their data becomes ready; any order that
follows the data is deadlock-free.  Every phase has channels of its own, so
messages of different phases never queue behind each other on one connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

from topocc.planner.compiler.algorithms._order import Send, chunk_runs
from topocc.planner.compiler.algorithms.hierarchical.channels import CHANNEL_CHOICES, spread_channels
from topocc.planner.compiler.algorithms.hierarchical.decisions import (
    Job,
    SliceShape,
    Slicing,
    job_of,
    plan_shape,
    plan_slicing,
)
from topocc.planner.compiler.algorithms.hierarchical.levels import Stage, VirtualBlocks, virtual_blocks
from topocc.planner.compiler.algorithms.hierarchical.waves import waves
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import builds_by_class, fitting_ranks, grid_shapes
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import relays
from topocc.runtime.collective import ALLREDUCE
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["build_schedule"]


@overload
def build_schedule(net: Network, collective: str, options: Options, levels: Sequence[Stage],
                   layout: str | None, every_rank: Literal[True] = True) -> Schedule: ...


@overload
def build_schedule(net: Network, collective: str, options: Options, levels: Sequence[Stage],
                   layout: str | None, every_rank: bool) -> Schedule | None: ...


def build_schedule(net: Network, collective: str, options: Options, levels: Sequence[Stage],
                   layout: str | None, every_rank: bool = True) -> Schedule | None:
    """The pipelined BlueConnect ``collective`` (all-reduce, reduce-scatter, all-gather) on ``levels``,
    ``layout`` (``virtual`` or ``blocks``) forced where not None: planned, then emitted.  Where the fabric
    builds by class and the schedule is not one class, every rank's program is built, or with ``every_rank``
    false None."""
    by_class = builds_by_class(net)
    job = job_of(net, collective, options, levels, layout, per_class=by_class and not every_rank)
    plan = plan_slicing(job)
    shape = plan_shape(job, plan)
    blocks = virtual_blocks(job.levels, job.p)
    meta = _metadata(job, plan, shape, blocks)
    # a reduce-scatter in the virtual layout hands its sums on to their owners: many classes, never one
    if by_class and not (job.kind.scatters and plan.contiguous):
        # the finest grid: a formula affine in a level's position is affine in the position's factors too
        grid = grid_shapes(net.topology)[0]
        emitter = _Emitter(job, plan, shape, blocks, fitting_ranks(grid))
        form = emitter.build_class(meta, grid) if emitter.routed() else None
        if form is not None:
            return form
    if by_class and not every_rank:
        return None
    return _Emitter(job, plan, shape, blocks).build(meta)


def _metadata(job: Job, plan: Slicing, shape: SliceShape, blocks: VirtualBlocks) -> dict[str, Any]:
    """What the schedule records of its options and of the decisions taken."""
    meta = job.options.as_dict()
    meta["levels"] = [f"{s.level}:{s.size}" for s in job.levels]
    meta.update(pipeline=shape.slices, slice_shape=":".join(map(str, shape.sizes)), methods=list(plan.methods))
    if job.kind is ALLREDUCE and not plan.contiguous:
        meta["layout"] = "blocks"
    if plan.contiguous and job.kind.scatters:
        meta["layout"] = "virtual"
    if plan.contiguous and plan.weights is not None:
        meta["ownership"] = ":".join(str(plan.weights[blocks.owner[v]]) for v in range(job.p))
    return meta


def piece_runs(buffer: str, owners: Sequence[int], units: int, offset: int, count: int) -> list[Chunk]:
    """Chunks ``offset .. offset + count`` of each owner's block of ``units`` chunks in ``buffer``, as runs
    (neighbouring owners' pieces merge only when a piece is the whole block)."""
    if count == units:
        return chunk_runs(buffer, owners) if units == 1 else [
            Chunk(buffer, c.index * units, c.count * units) for c in chunk_runs(buffer, owners)]
    return [Chunk(buffer, o * units + offset, count) for o in sorted(owners)]


class _Emitter:
    """The builder of one schedule and the state its phases share: slots, channels, what each rank finished.

    Flow control (reduce-scatter, all-reduce): a rank starts sending slice
    ``j`` of the first phase only once it has finished slice ``j - window`` of
    it.  With ``ahead`` (see :data:`~.slicing.MIDDLE_AHEAD`) a slice's middle
    phases are emitted in one round, after the middle phases of the slices
    before it, which they wait for.  In waves, with few slices, a rank starts
    on a wave of the first phase only once it has the last one's sums: all at
    once, a later wave's first step would share the links with the earlier
    waves' later steps, and the level above would wait; with many slices, the
    window keeps the order, and this would only stall it.
    """

    def __init__(self, job: Job, plan: Slicing, shape: SliceShape, blocks: VirtualBlocks,
                 focus: frozenset[int] | None = None) -> None:
        self.job, self.plan, self.shape, self.blocks = job, plan, shape, blocks
        self.focus = focus  # the ranks whose programs are written (None: all)
        self.p, self.units, self.offsets = job.p, shape.units, shape.offsets
        phases, levels = job.phases, job.levels
        first_step, at = [], 0
        for phase in phases:
            first_step.append(at)
            at += len(plan.steps[phase])
        self.first_step, self.steps_total = first_step, at
        waved = job.waved and not plan.contiguous
        # A direct reduce-scatter receives every peer's part into a scratch slot of its own and reduces it in
        # locally: reducing receives into one chunk would wait for each other, a path latency per peer.
        self.slotted = [not gather and (plan.methods[si] == "direct" or (waved and f > 0))
                        for f, (si, gather) in enumerate(phases)]
        # reduce-scatter works on a scratch copy of its input (and its direct levels' slots after it),
        # all-reduce in its output; all-gather puts each rank's block in place
        self.buffer = "s" if job.kind.scatters else "o"
        self.slot_base = self.p * self.units if job.kind.scatters else 0
        self.next_slot = [self.slot_base] * self.p
        self.channels = spread_channels(job.net, levels, phases, plan.steps, job.spans)
        self.finished: dict[tuple[int, int, int], int] = {}  # (rank, phase, slice) -> its last operation there
        self.order = (waves(levels, phases[:len(levels)], plan.steps, job.spans, blocks.position, blocks.block,
                            plan.in_waves, focus) if waved else {})
        self.waited = waved and plan.in_waves
        self.wave_done: dict[tuple[int, int, int], int] = {}  # (rank, slice, wave) -> its last op of phase 0
        self.start = self._starts()
        self.b = self._builder()

    def _slot_chunks(self) -> int:
        """Scratch chunks the slotted phases take per rank: a slot per peer's part of every slice."""
        job, weights = self.job, self.plan.weights
        last = len(job.levels) - 1
        return sum((job.levels[si].size - 1) * (job.spans[si] // job.levels[si].size) * self.units
                   * (max(weights.values()) if weights is not None and si == last else 1)
                   for f, (si, gather) in enumerate(job.phases) if self.slotted[f])

    def _builder(self) -> ScheduleBuilder:
        """The builder, every rank's input copied into the buffer the phases work in."""
        kind, p, units = self.job.kind, self.p, self.units
        relay = relays(self.job.net)  # a stage's pairs without a GPU-free route go through other GPUs
        if kind.gathers:
            b = ScheduleBuilder(kind.name, p, units, p * units, relay=relay, focus=self.focus)
            for r in range(p):
                b.copy(r, Chunk("i", 0, units), Chunk("o", r * units, units))
            return b
        b = ScheduleBuilder(kind.name, p, p * units, p * units if kind is ALLREDUCE else units,
                            scratch_chunks=self.slot_base + self._slot_chunks(), relay=relay, focus=self.focus)
        for r in range(p):
            b.copy(r, Chunk("i", 0, p * units), Chunk(self.buffer, 0, p * units))
        return b

    def _starts(self) -> list[int]:
        """In virtual order: where virtual block ``v`` starts within a slice, in units of the slice's size
        (``v``, or the ownership weights of the blocks before it)."""
        start = list(range(self.p + 1))
        weights = self.plan.weights
        if self.plan.contiguous and weights is not None:
            for v in range(self.p):
                start[v + 1] = start[v] + weights[self.blocks.owner[v]]
        return start

    def refs(self, j: int, lo: int, hi: int, wave: set[int] | None = None) -> list[Chunk]:
        """Slice ``j`` of virtual blocks ``lo .. hi`` (those of ``wave`` where given) in the buffer."""
        sizes, offsets = self.shape.sizes, self.offsets
        if wave is not None or not self.plan.contiguous:
            # that piece of each of their owners' blocks
            owners = [self.blocks.owner[v] for v in range(lo, hi) if wave is None or v in wave]
            return piece_runs(self.buffer, owners, self.units, offsets[j], sizes[j])
        # slice j holds chunks p * offsets[j] ... of every virtual block, sizes[j] per unit, block-major
        count = (self.start[hi] - self.start[lo]) * sizes[j]
        return [Chunk(self.buffer, self.p * offsets[j] + self.start[lo] * sizes[j], count)] if count else []

    def send(self, src: int, dst: int, ref: Chunk, reduce: bool, slotted: bool, step: int, channel: int,
             after: tuple[int, ...]) -> int:
        """One message of a phase; returns the receiver's last operation for it.  ``slotted``: a reduction
        received into a scratch slot of its own and reduced in locally, so that the transfer need not wait
        for the receiver's own part to be final."""
        b = self.b
        if not (reduce and slotted):
            return b.transfer(src, dst, ref, ref, reduce=reduce, step=step, channel=channel, after=after)[1]
        slot = Chunk("s", self.next_slot[dst], ref.count)
        self.next_slot[dst] += ref.count
        b.transfer(src, dst, ref, slot, step=step, channel=channel, after=after)
        return b.reduce(dst, slot, ref, step=step)

    def build(self, meta: dict[str, Any]) -> Schedule:
        """Every phase of every slice, then a reduce-scatter's results into place."""
        self.emit_all()
        return self.b.build("hierarchical", meta)

    def routed(self) -> bool:
        """Whether every pair of ranks that a phase joins has a route, so that no message is relayed through a
        third rank (a focused build skips the groups without a focus rank, and any relaying for them)."""
        job, has_route = self.job, self.job.net.has_route
        for phase in job.phases:
            groups = job.levels[phase.level].groups
            for step in self.plan.steps[phase]:
                for i, k, _, _ in step:
                    if not all(has_route(g[i], g[k]) for g in groups):
                        return False
        return True

    def build_class(self, meta: dict[str, Any], grid: tuple[int, ...]) -> Schedule | None:
        """:meth:`build` for the focus ranks, fitted as one class over ``grid`` (None where they are not)."""
        self.emit_all()
        return self.b.build_class("hierarchical", grid, meta)

    def emit_all(self) -> None:
        """Every phase's operations, then where each rank's result lands: a reduce-scatter's sums handed on
        to their owners (contiguous) or copied to the output."""
        self.emit_phases()
        if self.job.kind.scatters and self.plan.contiguous:
            self.hand_on_sums()
        elif self.job.kind.scatters:
            for r in range(self.p):
                self.b.copy(r, Chunk("s", r * self.units, self.units), Chunk("o", 0, self.units),
                            step=self.steps_total)

    def emit_phases(self) -> None:
        """The phases as a wavefront: slice ``j``'s phase ``f`` in round ``j + delay[f]``."""
        phases = self.job.phases
        ahead = self.shape.ahead
        delay = list(range(len(phases))) if not ahead else [0] + [1] * (len(phases) - 2) + [2]
        for rnd in range(self.shape.slices + delay[-1]):
            for f in range(len(phases)):
                j = rnd - delay[f]
                if 0 <= j < self.shape.slices:
                    self._phase_slice(f, j)

    def _phase_slice(self, f: int, j: int) -> None:
        """Slice ``j`` of phase ``f``: wave by wave, step by step, every group."""
        phase = self.job.phases[f]
        s = self.job.levels[phase.level]
        group_waves = [self.order.get((f, g[0]), [None]) for g in s.groups]
        focus = self.focus
        for w in range(max(map(len, group_waves))):
            for t, step in enumerate(self.plan.steps[phase]):
                for g, gw in zip(s.groups, group_waves):
                    if w < len(gw) and (focus is None or not focus.isdisjoint(g)):
                        self._group_step(f, j, w, t, step, g, gw[w])

    def _group_step(self, f: int, j: int, w: int, t: int, step: list[Send], g: tuple[int, ...],
                    wave: set[int] | None) -> None:
        """Step ``t`` of wave ``w`` of slice ``j`` of phase ``f`` in group ``g``."""
        si, gather = self.job.phases[f]
        span = self.job.spans[si]
        sub = span // self.job.levels[si].size  # virtual blocks per part
        base = self.blocks.block[g[0]] // span * span
        focus = self.focus
        for i, k, a, e in step:
            if focus is not None and g[i] not in focus and g[k] not in focus:
                continue  # neither end's program is written
            gate = self._gate(g[i], f, j, w, t)
            channel = self.channels(f, g[i], g[k])
            refs = self.refs(j, base + a * sub, base + e * sub, wave)
            if not self.plan.contiguous:
                # Each owner's piece in the order of its owner relative to the sender (owner XOR sender): the
                # sender's own data first, and every rank of a halving-doubling level sending alike, as a
                # relabelling of the others (so their programs are one class: runtime/symmetric.py).
                refs.sort(key=lambda ref: (ref.index // self.units) ^ g[i])
            for ref in refs:
                self.finished[g[k], f, j] = self.send(g[i], g[k], ref, not gather, self.slotted[f],
                                                      self.first_step[f] + t, channel, () if gate < 0 else (gate,))
                if self.waited and f == 0:
                    self.wave_done[g[k], j, w] = self.finished[g[k], f, j]

    def _gate(self, src: int, f: int, j: int, w: int, t: int) -> int:
        """The operation of ``src`` that its message of phase ``f``, slice ``j``, wave ``w``, step ``t`` waits
        for (the flow control, the middle phases' lead, the waves; -1: none)."""
        window, ahead = self.plan.window, self.shape.ahead
        gate = self.finished.get((src, f, j - window), -1) if window and f == 0 else -1
        if ahead and f == 1:
            gate = self.finished.get((src, len(self.job.phases) - 2, j - ahead), -1)
        if self.waited and f == 0 and w and t == 0:
            gate = self.wave_done.get((src, j, w - 1), -1)
        return gate

    def hand_on_sums(self) -> None:
        """A reduce-scatter in virtual order: each rank's sums to the ranks whose blocks they are.

        On a channel of their own, once it has its last slice's: one slice's
        sums all belong to a few ranks, and sent at once they would swamp those
        ranks' links while the later slices still need them.
        """
        p, units, sizes, offsets = self.p, self.units, self.shape.sizes, self.offsets
        channel = len(self.job.phases) * CHANNEL_CHOICES
        last = [self.finished.get((r, len(self.job.phases) - 1, self.shape.slices - 1), -1) for r in range(p)]
        for j in range(self.shape.slices):
            for r in range(p):
                a = p * offsets[j] + self.blocks.block[r] * sizes[j]
                for q in range(a // units, (a + sizes[j] - 1) // units + 1):
                    lo, hi = max(a, q * units), min(a + sizes[j], (q + 1) * units)
                    piece, dst = Chunk("s", lo, hi - lo), Chunk("o", lo - q * units, hi - lo)
                    if q == r:
                        self.b.copy(r, piece, dst, step=self.steps_total)
                    else:
                        self.b.transfer(r, q, piece, dst, step=self.steps_total, channel=channel,
                                        after=() if last[r] < 0 else (last[r],))
