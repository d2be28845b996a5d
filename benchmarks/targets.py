"""The planner's quality targets for ``auto`` as data, and the judge of one measured compile against them.

* bandwidth: from :data:`LARGE_BYTES` up, ``auto`` reaches :data:`BANDWIDTH_SHARE`
  of the lower bound (97% on all-gather and reduce-scatter, 95% on all-reduce),
  on every fabric;
* latency: at :data:`SMALL_BYTES`, on switch-based fabrics, ``auto``'s time is
  within :data:`LATENCY_RATIO` times the bound (bandwidth plus latency term);
* compile: ``auto`` compiles within :data:`COMPILE_SECONDS` (10 s up to 64
  ranks, 60 s up to 512, on 2 idle cores), at any size.

``benchmarks/planner_bench.py --suite`` measures the fabric suite
(:mod:`benchmarks.fabrics`) and judges every compile with :func:`judge`.

:data:`ANCHORS` are the cases where a published plan led topocc's, each with the share of the bound ``auto``
must reach there; ``benchmarks/planner_bench.py --anchors`` measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANCHORS", "BANDWIDTH_SHARE", "COMPILE_SECONDS", "LARGE_BYTES", "LATENCY_RATIO", "SMALL_BYTES", "Anchor",
           "Measured", "Verdict", "compile_limit", "judge"]

LARGE_BYTES = 256 << 20
SMALL_BYTES = 1 << 20
BANDWIDTH_SHARE = {"allgather": 0.97, "reducescatter": 0.97, "allreduce": 0.95}
LATENCY_RATIO = 1.3
#: (up to this many ranks, at most this many seconds), smallest first; no target above the last.
COMPILE_SECONDS = ((64, 10.0), (512, 60.0))
_UNITS = {"bandwidth": "points", "latency": "x", "compile": "s"}


@dataclass(frozen=True, slots=True)
class Anchor:
    """A case where a published plan led topocc's: a shipped topology, a collective and size, what the
    publication reports there (None: a share of the bound only), and the share of the lower bound ``auto`` must
    reach."""

    topology: str
    collective: str
    size_bytes: int
    source: str
    reported_GBps: float | None
    share: float


ANCHORS = (
    # a 3D mesh's corner routers have three links: an all-reduce whose ranks all do the same work (rings, the
    # bucket algorithm) reaches at most 77.5% of the bound there; trees that make the corners leaves can do more
    Anchor("mesh-4x4x4", "allreduce", LARGE_BYTES, "all-reduce on a 3D mesh", None, 0.95),
    # TE-CCL (Liu et al., SIGCOMM 2024) reports its all-gather of 1 GB on two DGX-2 at the bound, 129.0 GB/s
    Anchor("dgx2-2chassis", "allgather", 10**9, "TE-CCL, two DGX-2", 129.0, 0.99),
)


@dataclass(frozen=True, slots=True)
class Measured:
    """One ``auto`` compile: its wall time and, when it produced a schedule, its predicted time and bound.

    ``timed_out`` marks a compile abandoned after ``compile_s`` seconds (its compile verdict is unknown
    when that is within the target).
    """

    ranks: int
    switch_based: bool
    collective: str
    size_bytes: int
    compile_s: float
    predicted_s: float | None
    bound_s: float | None
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """One measurement against one target: ``kind`` is bandwidth, latency or compile; ``shortfall`` is how far
    it misses, in percentage points, times the bound, or seconds (0 or less: met)."""

    kind: str
    goal: str
    measured: str
    shortfall: float

    @property
    def met(self) -> bool:
        return self.shortfall <= 0

    def describe(self) -> str:
        """``met``, or ``missed by 2.1 points`` / ``by 0.12x`` / ``by 3.4 s``."""
        if self.met:
            return "met"
        if self.shortfall == float("inf"):
            return "missed (no schedule)"
        unit = _UNITS[self.kind]
        return f"missed by {self.shortfall:.2f}x" if unit == "x" else f"missed by {self.shortfall:.1f} {unit}"


def compile_limit(ranks: int) -> float | None:
    """The compile-time target for ``ranks`` ranks (None above the largest)."""
    return next((seconds for up_to, seconds in COMPILE_SECONDS if ranks <= up_to), None)


def judge(m: Measured) -> tuple[Verdict, ...]:
    """Every target that applies to ``m``, judged; a compile without a schedule misses its quality target."""
    verdicts: list[Verdict] = []
    produced = m.predicted_s is not None and m.bound_s is not None and m.predicted_s > 0
    if m.size_bytes >= LARGE_BYTES and m.collective in BANDWIDTH_SHARE:
        goal = BANDWIDTH_SHARE[m.collective]
        if produced:
            share = m.bound_s / m.predicted_s  # type: ignore[operator]
            verdicts.append(Verdict("bandwidth", f">= {goal:.0%}", f"{share:.1%}", 100 * (goal - share)))
        else:
            verdicts.append(Verdict("bandwidth", f">= {goal:.0%}", "no schedule", float("inf")))
    if m.size_bytes == SMALL_BYTES and m.switch_based:
        if produced:
            ratio = m.predicted_s / m.bound_s  # type: ignore[operator]
            verdicts.append(Verdict("latency", f"<= {LATENCY_RATIO}x", f"{ratio:.2f}x", ratio - LATENCY_RATIO))
        else:
            verdicts.append(Verdict("latency", f"<= {LATENCY_RATIO}x", "no schedule", float("inf")))
    limit = compile_limit(m.ranks)
    if limit is not None and not (m.timed_out and m.compile_s <= limit):  # abandoned early: unknown
        measured = f"> {m.compile_s:.0f} s" if m.timed_out else f"{m.compile_s:.1f} s"
        verdicts.append(Verdict("compile", f"<= {limit:.0f} s", measured, m.compile_s - limit))
    return tuple(verdicts)
