"""OR-Tools backends through ``pywraplp``: GLOP, PDLP, HiGHS, CLP for LPs; CBC, SCIP, CP-SAT for MILPs.

Imported only when one of its backends is used (:data:`topocc.planner.solvers.BACKENDS`), so OR-Tools loads
then, and a missing library makes the backend unavailable rather than the planner fail to import.
"""

from __future__ import annotations

import math
import time

import numpy as np
from ortools.linear_solver import pywraplp

from topocc.planner.solvers import LinearProgram, Solution, SolverOptions

_IDS = {"glop": "GLOP", "pdlp": "PDLP", "highs": "HIGHS_LP", "clp": "CLP", "cbc": "CBC", "scip": "SCIP",
        "cp-sat": "CP_SAT"}


def available(name: str) -> bool:
    return pywraplp.Solver.CreateSolver(_IDS[name]) is not None


def solve(lp: LinearProgram, options: SolverOptions) -> Solution | None:
    solver = pywraplp.Solver.CreateSolver(_IDS[options.backend])
    if solver is None:
        return None
    inf = solver.infinity()
    started = time.perf_counter()
    mip = any(lp.integer)
    xs = [
        (solver.IntVar if (mip and lp.integer[i]) else solver.NumVar)(
            -inf if math.isinf(lo) else lo, inf if math.isinf(hi) else hi, "")
        for i, (lo, hi) in enumerate(zip(lp.lower, lp.upper))
    ]
    for index, coef, lo, hi in lp.rows:
        row = solver.RowConstraint(-inf if math.isinf(lo) else lo, inf if math.isinf(hi) else hi, "")
        for i, c in zip(index, coef):
            row.SetCoefficient(xs[i], c)
    objective = solver.Objective()
    for x, c in zip(xs, lp.cost):
        if c:
            objective.SetCoefficient(x, c)
    objective.SetMinimization()
    solver.SuppressOutput()
    solver.SetTimeLimit(int(options.time_limit_s * 1000))
    if options.backend in ("scip", "cp-sat", "pdlp"):  # CBC and the simplex codes reject a thread count here
        solver.SetNumThreads(options.threads)
    params = pywraplp.MPSolverParameters()
    if mip:
        params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, options.gap)
    status = solver.Solve(params)
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return None
    values = np.fromiter((x.solution_value() for x in xs), dtype=float, count=len(xs))
    return Solution(values, objective.Value(), status == pywraplp.Solver.OPTIMAL, options.backend,
                    time.perf_counter() - started)
