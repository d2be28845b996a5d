"""Schedules from algorithms: the algorithms themselves and the front door that picks, proves and times them.

``compile`` (:func:`~topocc.planner.compiler.compile.compile_schedule`: one named algorithm or ``auto``),
``race`` (``auto``: every applicable algorithm, tier by tier), ``build`` (one algorithm's schedule fitted to
the fabric's routing), ``evaluate`` (link time, the simulator for one compilation), ``proof`` (the verifier in
a forked process beside the race), ``plans`` (one schedule per size bucket; the shipped schedules), ``bundle``
(a training job's plans, one per collective, process group and root), ``options`` (what a caller may ask of an
algorithm), ``builder`` (rank programs without hand-written dependencies) and ``algorithms/`` (one module or
package per algorithm, in one table).
Imports topology, routing, analysis and solvers.
"""
