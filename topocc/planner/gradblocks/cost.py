"""The all-reduce cost model gradient blocks are planned with: seconds for a block of B bytes.

The alpha-beta model (a fixed cost per message plus bytes over a bandwidth), fitted to a compiled plan's own
simulated times (:func:`plan_cost`) or to measured ones (:func:`fit_cost`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from topocc.planner.analysis.simulate import simulate
from topocc.planner.errors import UsageError
from topocc.planner.topology.catalogue import schedule_topology
from topocc.planner.topology.model import Topology
from topocc.runtime.plan import Plan

__all__ = ["Cost", "LinearCost", "fit_cost", "plan_cost"]

#: Seconds to all-reduce a block of this many bytes.
Cost = Callable[[int], float]


@dataclass(frozen=True, slots=True)
class LinearCost:
    """Allreduce time of a block: ``alpha_s + nbytes / bytes_per_s`` (the alpha-beta model)."""

    alpha_s: float
    bytes_per_s: float

    def __call__(self, nbytes: int) -> float:
        return self.alpha_s + nbytes / self.bytes_per_s


def fit_cost(points: Sequence[tuple[int, float]]) -> LinearCost:
    """Least-squares alpha-beta fit of ``(bytes, seconds)`` points (alpha >= 0, bandwidth > 0).

    >>> fit_cost([(0, 1e-5), (1_000_000, 1.01e-3)])
    LinearCost(alpha_s=1e-05, bytes_per_s=1000000000.0)
    """
    if len(points) < 2 or len({b for b, _ in points}) < 2:
        raise UsageError("fitting a cost model needs at least two distinct sizes")
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    slope = sum((b - mx) * (t - my) for b, t in points) / sxx
    if slope <= 0:
        raise UsageError("the measured times do not grow with size; cannot fit a bandwidth")
    alpha = max(0.0, my - slope * mx)
    return LinearCost(round(alpha, 15), round(1.0 / slope, 6))


def plan_cost(plan: Plan, topology: Topology | None = None, sizes: Sequence[int] | None = None, *,
              plan_path: str | None = None) -> LinearCost:
    """Fit the cost model to the plan's own predictions: each size simulated with the schedule it selects.

    ``topology`` defaults to the one the plan's first schedule records (a file it names is also looked for
    beside ``plan_path``, the plan's own file).
    """
    topo = topology if topology is not None else schedule_topology(plan.schedules[0], plan_path)
    sizes = list(sizes) if sizes else [1 << k for k in range(12, 27, 2)]
    return fit_cost([(s, simulate(topo, plan.select(s), s).time_s) for s in sizes])
