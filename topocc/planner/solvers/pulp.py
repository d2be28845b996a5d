"""PuLP backends: its bundled CBC, and HiGHS when ``highspy`` is installed.

PuLP builds models through Python objects, which is slow for large models; it is
here as an interchangeable backend, not the default.  Imported only when one of
its backends is used (:data:`topocc.planner.solvers.BACKENDS`), so PuLP loads then.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pulp

from topocc.planner.solvers import LinearProgram, Solution, SolverOptions


def _solver(name: str, options: SolverOptions) -> pulp.LpSolver:
    if name == "pulp-highs":
        return pulp.HiGHS(msg=False, timeLimit=options.time_limit_s, threads=options.threads,
                          gapRel=options.gap)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=options.time_limit_s, threads=options.threads,
                             gapRel=options.gap)


def available(name: str) -> bool:
    return bool(_solver(name, SolverOptions()).available())


def solve(lp: LinearProgram, options: SolverOptions) -> Solution | None:
    started = time.perf_counter()
    model = pulp.LpProblem("topocc", pulp.LpMinimize)
    xs = [
        pulp.LpVariable(f"x{i}", None if math.isinf(lo) else lo, None if math.isinf(hi) else hi,
                        pulp.LpInteger if lp.integer[i] else pulp.LpContinuous)
        for i, (lo, hi) in enumerate(zip(lp.lower, lp.upper))
    ]
    model += pulp.lpSum(c * x for x, c in zip(xs, lp.cost) if c)
    for k, (index, coef, lo, hi) in enumerate(lp.rows):
        expr = pulp.LpAffineExpression([(xs[i], c) for i, c in zip(index, coef)])
        if lo == hi:
            model += (expr == lo), f"r{k}"
        else:
            if not math.isinf(hi):
                model += (expr <= hi), f"u{k}"
            if not math.isinf(lo):
                model += (expr >= lo), f"l{k}"
    solver = _solver(options.backend, options)
    if not solver.available():
        return None
    model.solve(solver)
    status = pulp.LpStatus[model.status]
    if status not in ("Optimal", "Not Solved") or any(x.varValue is None for x in xs):
        return None
    values = np.array([x.varValue for x in xs], dtype=float)
    return Solution(values, float(pulp.value(model.objective) or 0.0), status == "Optimal", options.backend,
                    time.perf_counter() - started)
