"""Prophet-style gradient block planning: which gradients travel together, and in what order.

Input: a :class:`~topocc.runtime.training.profile.Profile` of one training iteration (each
parameter's size and the moment its gradient is ready in backward, each
layer's forward time) and an allreduce cost model (seconds for a block of B
bytes, from the compiled plan's simulated times).  Output: a
:class:`BlockPlan`: blocks (pieces of parameters), their planned order and
start times, and the predicted iteration time next to two baselines.

The time model (Prophet, Bao et al., INFOCOM 2020, section III): one allreduce
at a time on the network; a block can start once all of its gradients are
ready and the previous block has finished; the next iteration's forward pass
runs layer by layer, and layer ``l`` starts once layer ``l - 1`` is done and
every block holding its parameters has arrived (the per-layer update is
charged zero time).  The iteration time is the end of that next forward
pass, measured from the start of backward: backward + forward + exposed
communication.

Baselines:

* DDP's default: buckets of up to 25 MiB filled in reverse parameter order,
  sent first-in first-out, and the optimizer step (so the whole next forward
  pass) waits for every bucket.
* ByteScheduler (Peng et al., SOSP 2019) simplified to per-tensor priority:
  one message per parameter, the lowest layer first among those ready, each
  paying the cost model's per-message overhead alpha, forward gated per layer.

The planner (:func:`plan_blocks`) builds candidate plans with the Prophet
rule (whenever the network frees up, send the highest-priority ready
gradients as one block of at most C bytes, large gradients split into chunks
of C so a low-priority one never holds the network longer than one chunk:
preemption), for a range of C, plus the two baselines' groupings run in
planned order with per-layer gating, and keeps the fastest: its prediction is
never worse than either baseline under the model.

>>> from topocc.planner.gradblocks.profile_file import load_profile
>>> plan = plan_blocks(load_profile("examples/profile_example.yaml"), LinearCost(20e-6, 1.25e9))
>>> plan.predicted_time_s <= plan.ddp_time_s
True
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from topocc.planner.errors import UsageError
from topocc.planner.gradblocks.cost import Cost, LinearCost
from topocc.planner.units import format_bandwidth, format_size, format_time
from topocc.runtime.training.profile import Profile

__all__ = [
    "DDP_BUCKET_BYTES",
    "Block",
    "BlockPlan",
    "Piece",
    "Timeline",
    "block_plan_to_dict",
    "ddp_blocks",
    "format_block_plan",
    "plan_blocks",
    "prophet_blocks",
    "simulate_blocks",
]

#: DDP's default ``bucket_cap_mb`` (25 MiB): what DDP itself calls a bucket.
DDP_BUCKET_BYTES = 25 << 20

#: Chunk boundaries are multiples of this many bytes (any element size up to 8 divides it).
_ALIGN = 64

Piece = tuple[int, int, int]  # parameter index, first byte, end byte


# --------------------------------------------------------------------------- the time model


@dataclass(frozen=True, slots=True)
class Block:
    """One allreduce: pieces of parameters sent together, and when the model says it runs."""

    pieces: tuple[Piece, ...]
    nbytes: int
    ready_s: float
    start_s: float
    end_s: float

    @property
    def params(self) -> tuple[int, ...]:
        """Parameter indices in the block (each once, in piece order)."""
        return tuple(dict.fromkeys(p for p, _, _ in self.pieces))


@dataclass(frozen=True, slots=True)
class Timeline:
    """A block order run through the time model."""

    blocks: tuple[Block, ...]
    iteration_s: float
    comm_end_s: float


def simulate_blocks(profile: Profile, cost: Cost, blocks: Sequence[Sequence[Piece]], *, policy: str = "order",
                    gating: str = "layer") -> Timeline:
    """Run blocks through the time model (module docstring).

    ``policy``: when the network frees up, send the ready block that comes
    first in ``blocks`` (``order``: priority), or the one ready earliest
    (``fifo``).  ``gating``: the next forward pass waits per layer for its own
    blocks (``layer``) or for every block (``global``, DDP's optimizer step).
    Returned blocks are in the order they were sent.
    """
    if policy not in ("order", "fifo") or gating not in ("layer", "global"):
        raise UsageError(f"unknown policy {policy!r} or gating {gating!r}")
    ready = [max(profile.params[p].ready_time_s for p, _, _ in b) for b in blocks]
    nbytes = [sum(hi - lo for _, lo, hi in b) for b in blocks]
    left = set(range(len(blocks)))
    t = 0.0
    sent: list[Block] = []
    while left:
        avail = [j for j in left if ready[j] <= t]
        if not avail:
            t = min(ready[j] for j in left)
            continue
        j = min(avail) if policy == "order" else min(avail, key=lambda j: (ready[j], j))
        left.remove(j)
        end = t + cost(nbytes[j])
        sent.append(Block(tuple(blocks[j]), nbytes[j], ready[j], t, end))
        t = end
    return _finish(profile, sent, gating)


def _finish(profile: Profile, sent: Sequence[Block], gating: str) -> Timeline:
    arrive = [0.0] * len(profile.params)
    for b in sent:
        for p in b.params:
            arrive[p] = max(arrive[p], b.end_s)
    comm_end = max((b.end_s for b in sent), default=0.0)
    t = profile.backward_time_s
    if gating == "global":
        t = max(t, comm_end) + profile.forward_total_s
    else:
        needed = [0.0] * len(profile.layers)
        for i, param in enumerate(profile.params):
            needed[param.layer] = max(needed[param.layer], arrive[i])
        for layer, f in enumerate(profile.forward_time_s):
            t = max(t, needed[layer]) + f
    return Timeline(tuple(sent), t, comm_end)


def ddp_blocks(profile: Profile, cap_bytes: int = DDP_BUCKET_BYTES) -> list[list[Piece]]:
    """DDP's buckets: parameters in reverse order, a new bucket once adding one would pass ``cap_bytes``."""
    buckets: list[list[Piece]] = []
    size = 0
    for i in reversed(range(len(profile.params))):
        n = profile.params[i].nbytes
        if not buckets or size + n > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((i, 0, n))
        size += n
    return buckets


def _chunks(profile: Profile, cap: int) -> list[Piece]:
    """Every parameter cut into pieces of at most ``cap`` bytes (aligned), in priority (forward) order."""
    out: list[Piece] = []
    for i, p in enumerate(profile.params):
        lo = 0
        while lo < p.nbytes:
            hi = min(p.nbytes, lo + cap)
            out.append((i, lo, hi))
            lo = hi
    return out


def prophet_blocks(profile: Profile, cost: Cost, cap: int) -> Timeline:
    """Prophet's rule: when the network frees up, send the highest-priority ready pieces, at most ``cap`` bytes.

    Pieces are parameters cut into chunks of ``cap`` bytes; priority is forward
    order (layer 0 first).  O(pieces log pieces).
    """
    pieces = _chunks(profile, cap)
    ready = [profile.params[p].ready_time_s for p, _, _ in pieces]
    by_ready = sorted(range(len(pieces)), key=lambda k: (ready[k], k))
    waiting: list[int] = []  # heap of ready piece indices: the index is the priority
    nxt = 0
    t = 0.0
    sent: list[Block] = []
    while waiting or nxt < len(by_ready):
        while nxt < len(by_ready) and ready[by_ready[nxt]] <= t:
            heapq.heappush(waiting, by_ready[nxt])
            nxt += 1
        if not waiting:
            t = ready[by_ready[nxt]]
            continue
        take: list[int] = []
        size = 0
        while waiting:
            n = pieces[waiting[0]][2] - pieces[waiting[0]][1]
            if take and size + n > cap:
                break
            take.append(heapq.heappop(waiting))
            size += n
        end = t + cost(size)
        sent.append(Block(tuple(pieces[k] for k in take), size, max(ready[k] for k in take), t, end))
        t = end
    return _finish(profile, sent, "layer")


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """The chosen blocks (in planned order) and the predicted iteration times."""

    blocks: tuple[Block, ...]
    predicted_time_s: float
    ddp_time_s: float
    bytescheduler_time_s: float
    strategy: str
    chunk_bytes: int | None
    cost: Any = None

    @property
    def speedup_vs_ddp(self) -> float:
        return self.ddp_time_s / self.predicted_time_s if self.predicted_time_s > 0 else 1.0


def _candidate_caps(profile: Profile) -> list[int]:
    total = profile.total_bytes
    caps = []
    cap = 16 << 10
    while cap < total:
        caps.append(cap)
        cap *= 2
    caps.append(-(-total // _ALIGN) * _ALIGN)
    return caps


def plan_blocks(profile: Profile, cost: Cost, *, chunk_bytes: Sequence[int] | None = None,
                 ddp_bucket_bytes: int = DDP_BUCKET_BYTES) -> BlockPlan:
    """Plan gradient blocks for ``profile`` under ``cost`` (Prophet) and predict the iteration time.

    Candidates: Prophet's rule for every block cap in ``chunk_bytes`` (default
    16 KiB doubling up to the model size), DDP's buckets and per-tensor
    messages, each in planned order with per-layer gating; the fastest under
    the model wins (ties: fewer blocks).  Baselines use their own policies
    (module docstring).
    """
    if not profile.params:
        raise UsageError("the profile has no parameters")
    caps = [c for c in (chunk_bytes or _candidate_caps(profile))]
    if any(c <= 0 or c % _ALIGN for c in caps):
        raise UsageError(f"block caps must be positive multiples of {_ALIGN} bytes")
    ddp = ddp_blocks(profile, ddp_bucket_bytes)
    per_tensor = [[(i, 0, p.nbytes)] for i, p in enumerate(profile.params)]
    ddp_default = simulate_blocks(profile, cost, ddp, policy="fifo", gating="global")
    bytesched = simulate_blocks(profile, cost, per_tensor, policy="order", gating="layer")
    candidates: list[tuple[Timeline, str, int | None]] = [
        (simulate_blocks(profile, cost, ddp, policy="fifo", gating="layer"), "ddp-buckets, layer-gated", None),
        (bytesched, "per-tensor priority", None),
    ]
    candidates += [(prophet_blocks(profile, cost, c), "prophet", c) for c in caps]
    best, strategy, cap = min(candidates, key=lambda c: (round(c[0].iteration_s, 12), len(c[0].blocks)))
    return BlockPlan(best.blocks, best.iteration_s, ddp_default.iteration_s, bytesched.iteration_s,
                      strategy, cap, cost)


# --------------------------------------------------------------------------- output


def block_plan_to_dict(plan: BlockPlan, profile: Profile | None = None) -> dict[str, Any]:
    """JSON form read by :func:`topocc.runtime.training.blocks.load_block_plan`."""
    return {
        "format": "topocc-bucket-plan",
        "version": 1,
        "profile": profile.name if profile else None,
        "strategy": plan.strategy,
        "chunk_bytes": plan.chunk_bytes,
        "predicted_time_s": plan.predicted_time_s,
        "ddp_time_s": plan.ddp_time_s,
        "bytescheduler_time_s": plan.bytescheduler_time_s,
        "blocks": [{"pieces": [list(p) for p in b.pieces], "size_bytes": b.nbytes, "start_s": b.start_s,
                    "end_s": b.end_s} for b in plan.blocks],
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _params_label(profile: Profile, block: Block) -> str:
    parts = []
    for p, lo, hi in block.pieces:
        name = profile.params[p].name
        parts.append(name if (lo, hi) == (0, profile.params[p].nbytes) else f"{name}[{lo}:{hi}]")
    text = ", ".join(parts)
    return text if len(text) <= 48 else text[:45] + "..."


def format_block_plan(plan: BlockPlan, profile: Profile) -> str:
    """A table of the blocks and the predicted iteration times (what ``topocc plan-buckets`` prints)."""
    rows = [("block", "parameters", "bytes", "ready ms", "start ms", "end ms")]
    for j, b in enumerate(plan.blocks):
        rows.append((str(j), _params_label(profile, b), format_size(b.nbytes), _ms(b.ready_s), _ms(b.start_s),
                     _ms(b.end_s)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if c == 1 else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    cap = f", block cap {format_size(plan.chunk_bytes)}" if plan.chunk_bytes else ""
    cost = plan.cost
    model = (f"; cost {format_time(cost.alpha_s)} + B / {format_bandwidth(cost.bytes_per_s)}"
             if isinstance(cost, LinearCost) else "")
    lines += [
        "",
        f"profile {profile.name}: {len(profile.params)} parameters, {format_size(profile.total_bytes)}, "
        f"backward {_ms(profile.backward_time_s)} ms, forward {_ms(profile.forward_total_s)} ms{model}",
        f"plan: {plan.strategy}{cap}, {len(plan.blocks)} blocks",
        "predicted iteration time:",
        f"  topocc blocks (Prophet)          {_ms(plan.predicted_time_s):>10} ms",
        f"  DDP default (25 MiB, FIFO)       {_ms(plan.ddp_time_s):>10} ms   x{plan.speedup_vs_ddp:.2f}",
        f"  per-tensor priority (ByteSched.) {_ms(plan.bytescheduler_time_s):>10} ms",
    ]
    return "\n".join(lines)
