"""Linear programs behind one small interface, solved by OR-Tools or PuLP.

A :class:`LinearProgram` is built with integer variable handles and sparse rows;
``solve(lp, SolverOptions(backend=...))`` hands it to a backend module
(``ortools.py``, ``pulp.py``), each exposing ``BACKENDS`` and ``solve``.  Solver
settings live in :class:`SolverOptions`, never as literals in model code.  Default
backend: OR-Tools' GLOP, fastest on the small LPs the planner builds; it and
HiGHS are far ahead of CBC on LPs of this shape.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from topocc.planner.errors import InfeasibleError, NotApplicableError, UsageError

__all__ = ["BACKENDS", "LinearProgram", "Solution", "SolverOptions", "available_backends", "solve"]

#: backend name -> module implementing it (imported only when used).
BACKENDS: dict[str, str] = {
    "glop": "topocc.planner.solvers.ortools",
    "pdlp": "topocc.planner.solvers.ortools",
    "highs": "topocc.planner.solvers.ortools",
    "clp": "topocc.planner.solvers.ortools",
    "cbc": "topocc.planner.solvers.ortools",
    "scip": "topocc.planner.solvers.ortools",
    "cp-sat": "topocc.planner.solvers.ortools",
    "pulp-cbc": "topocc.planner.solvers.pulp",
    "pulp-highs": "topocc.planner.solvers.pulp",
}


@dataclass(frozen=True, slots=True)
class SolverOptions:
    """How to solve: backend, wall-clock limit, threads, relative MIP gap."""

    backend: str = "glop"
    time_limit_s: float = 60.0
    threads: int = 2
    gap: float = 1e-4


@dataclass
class LinearProgram:
    """minimise c.x subject to sparse rows lo <= a.x <= hi and bounds on x (integrality optional)."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[Sequence[int], Sequence[float], float, float]] = field(default_factory=list)

    def var(self, lower: float = 0.0, upper: float = math.inf, cost: float = 0.0, integer: bool = False) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.lower) - 1

    def add(self, index: Sequence[int], coef: Sequence[float], lower: float = -math.inf,
            upper: float = math.inf) -> None:
        """Add the row ``lower <= sum(coef[i] * x[index[i]]) <= upper``."""
        self.rows.append((index, coef, lower, upper))

    def add_le(self, terms: Iterable[tuple[int, float]], rhs: float) -> None:
        index, coef = _split(terms)
        self.add(index, coef, upper=rhs)

    def add_eq(self, terms: Iterable[tuple[int, float]], rhs: float) -> None:
        index, coef = _split(terms)
        self.add(index, coef, rhs, rhs)

    @property
    def size(self) -> tuple[int, int]:
        """(variables, rows)."""
        return len(self.lower), len(self.rows)


def _split(terms: Iterable[tuple[int, float]]) -> tuple[list[int], list[float]]:
    index: list[int] = []
    coef: list[float] = []
    for i, c in terms:
        index.append(i)
        coef.append(c)
    return index, coef


@dataclass(frozen=True, slots=True)
class Solution:
    """Variable values, objective, and whether the solver proved optimality or stopped at its limit."""

    values: np.ndarray
    objective: float
    optimal: bool
    backend: str
    seconds: float


def available_backends() -> list[str]:
    """Backends whose solver library is importable here."""
    found = []
    for name, module in BACKENDS.items():
        try:
            if importlib.import_module(module).available(name):
                found.append(name)
        except ImportError:
            continue
    return found


def solve(lp: LinearProgram, options: SolverOptions | None = None) -> Solution:
    """Solve ``lp``; raises :class:`InfeasibleError` when no feasible point was found in time, and
    :class:`NotApplicableError` when the backend's library is not installed."""
    options = options or SolverOptions()
    module_name = BACKENDS.get(options.backend)
    if module_name is None:
        raise UsageError(f"unknown solver backend {options.backend!r}", fix=f"use one of {', '.join(BACKENDS)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # not a bad argument but a missing optional library: the algorithm that needs it does not apply here,
        # so ``auto`` races the others and the bounds drop the refinement that needs it
        raise NotApplicableError(f"solver backend {options.backend!r} is not installed ({exc.name})",
                                 fix="pip install ortools pulp") from None
    solution: Solution | None = module.solve(lp, options)
    if solution is None:
        raise InfeasibleError(f"{options.backend} found no feasible solution within {options.time_limit_s:g} s",
                              fix="raise the solver time limit or use a smaller model")
    return solution
