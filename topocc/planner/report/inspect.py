"""``topocc inspect``: one simulated run of a plan, drawn as terminal tables, an HTML report or a DOT graph.

The plan is simulated once, keeping one row of numbers per message (:func:`~topocc.planner.report._run.record_run`),
which every view aggregates; the HTML report compares it with other algorithms' plans for the same collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from topocc.planner.analysis.simulate import SimResult, simulate
from topocc.planner.compiler.algorithms import get_algorithm
from topocc.planner.compiler.evaluate import link_time
from topocc.planner.compiler.options import Options
from topocc.planner.errors import TopoccError
from topocc.planner.report._run import record_run
from topocc.planner.report.dot import render_dot
from topocc.planner.report.html import render_html
from topocc.planner.report.summary import what_if_note
from topocc.planner.report.text import terminal_summary
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import schedule_topology
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_time
from topocc.runtime.plan import as_plan
from topocc.runtime.schedule import Schedule

__all__ = ["BASELINE_SIMULATE_OPS", "inspect_schedule"]


#: A baseline with more operations than this is not simulated for the report; its busiest link's time is shown.
BASELINE_SIMULATE_OPS = 200_000


def _baseline(topology: Topology, schedule: Schedule, name: str, size: int) -> SimResult | str | None:
    """Another algorithm's plan for the report's comparison: its simulation, a sentence why not, or None.

    Baselines are built and simulated, not verified (only compared; every
    algorithm's schedules are verified by its tests and by ``compile``).  An
    algorithm is not built above the rank count where ``auto`` skips it
    (:attr:`Algorithm.auto_max_ranks`: a ring over 1024 ranks is 4.7 million
    operations, minutes to build and simulate), and a schedule of more than
    :data:`BASELINE_SIMULATE_OPS` operations is timed by its busiest link alone,
    a lower bound of its simulated time (:func:`topocc.planner.compiler.compile.link_time`).
    None: the algorithm does not apply here.
    """
    try:
        algorithm = get_algorithm(name)
        if schedule.collective not in algorithm.collectives:
            return None
        if algorithm.auto_max_ranks is not None and topology.size > algorithm.auto_max_ranks:
            return (f"not compared: above {algorithm.auto_max_ranks} ranks it takes minutes to build "
                    "(auto skips it too)")
        net = Network(topology)
        other = algorithm.load()(net, schedule.collective, Options(size_bytes=size, root=schedule.root or 0))
        if other.op_count > BASELINE_SIMULATE_OPS:
            bound = link_time(net, other, size)
            return (f"not simulated ({other.op_count:,} operations): its busiest link alone needs "
                    f"{format_time(bound)}")
        return simulate(net, other, size)
    except TopoccError:
        return None  # a baseline that does not apply here is simply not compared


def inspect_schedule(path: str, topology: str | None = None, size_bytes: int | None = None, *,
                     html: str | None = None, dot: str | None = None, baselines: Sequence[str] = (),
                     what_if: bool = False) -> str:
    """``topocc inspect``: write the HTML report and/or DOT drawing, or return the terminal view.

    ``what_if`` allows a topology other than the schedule's (see
    :func:`~topocc.planner.compiler.compile.schedule_topology`); the text then starts with a
    line that says so.  The plan is simulated once, keeping one row of numbers
    per message (:func:`topocc.planner.report._run.record_run`), which every view
    aggregates; ``baselines`` are compared as :func:`_baseline` says.
    """
    plan = as_plan(path)
    size = size_bytes or plan.schedules[0].metadata.size_bytes or (64 << 20)
    schedule = plan.select(size)
    topo = schedule_topology(schedule, path, topology, what_if=what_if)
    warning = what_if_note(schedule, topo)
    head = f"{warning}\n" if warning else ""
    run = record_run(topo, schedule, size)
    if not html and not dot:
        return head + terminal_summary(topo, schedule, run)
    written = []
    if html:
        compared: dict[str, SimResult | str] = {}
        for name in baselines:
            if name != schedule.metadata.algorithm:
                found = _baseline(topo, schedule, name, size)
                if found is not None:
                    compared[name] = found
        Path(html).write_text(render_html(topo, schedule, size, baselines=compared, run=run))
        written.append(html)
    if dot:
        Path(dot).write_text(render_dot(topo, schedule, size_bytes=size, result=run.result))
        written.append(dot)
    return head + "wrote " + ", ".join(written)
