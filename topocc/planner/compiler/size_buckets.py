"""Plans: one schedule per message-size bucket (as NCCL's tuner and MSCCL's minBytes/maxBytes choose by
size), and the shipped schedules of ``schedules/``."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from topocc.planner.compiler.compile import Compiled, compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.race import Candidate, Progress, ProgressFn
from topocc.planner.compiler.symmetrize import symmetric_form
from topocc.planner.routing.network import Network, network_of
from topocc.planner.topology.catalogue import resolve_topology, scheduled_topologies
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_size
from topocc.runtime.plan import Plan
from topocc.runtime.schedule import save_schedule

__all__ = ["bucket_sizes", "compile_plan", "compile_shipped"]


def bucket_sizes(low: int, high: int, factor: int = 4) -> list[int]:
    """Representative sizes from ``low`` to ``high``, ``factor`` apart (both ends included)."""
    sizes = [low]
    while sizes[-1] * factor < high:
        sizes.append(sizes[-1] * factor)
    if sizes[-1] != high:
        sizes.append(high)
    return sizes


def compile_plan(where: Topology | Network, collective: str, low: int, high: int, algorithm: str = "auto",
                 options: Options | None = None, *, progress: ProgressFn | None = None) -> tuple[Plan, list[Compiled]]:
    """Compile one schedule per size bucket over ``[low, high]`` and merge buckets that chose the same one.

    Each representative size is compiled (and, for ``auto``, raced) on its own;
    bucket edges lie at the geometric mean of neighbouring sizes.  The first
    bucket starts at 0 and the last is open-ended, so every size has a schedule.
    ``progress`` gets each bucket's start and end, and the race's events labelled
    with their bucket (see :class:`Progress`).
    """
    net = network_of(where)  # one network for every bucket: routes, cuts and trees are found once
    options = options or Options()
    sizes = bucket_sizes(low, high)
    edges = [0] + [int((a * b) ** 0.5) for a, b in itertools.pairwise(sizes)] + [None]
    compiled: list[Compiled] = []
    start = time.perf_counter()
    for i, (size, lo, hi) in enumerate(zip(sizes, edges, edges[1:]), 1):
        label = f"bucket {i}/{len(sizes)} ({format_size(size)})"

        def report(event: Progress, label: str = label) -> None:
            if progress is not None:
                progress(replace(event, bucket=label))

        bucket_start = time.perf_counter()
        report(Progress(algorithm, "bucket", i, len(sizes), bucket_start - start))
        result = compile_schedule(net, collective, algorithm, replace(options, size_bytes=size),
                                  size_range=(lo, hi), progress=report)  # type: ignore[arg-type]  # lo is never None
        report(Progress(result.schedule.metadata.algorithm, "bucket done", i, len(sizes), time.perf_counter() - start,
                        Candidate(result.schedule.metadata.algorithm, result.sim.time_s,
                                  time.perf_counter() - bucket_start, result.schedule.op_count)))
        previous = compiled[-1].schedule if compiled else None
        if previous is not None and previous.programs == result.schedule.programs and (
                previous.metadata.algorithm == result.schedule.metadata.algorithm):
            compiled[-1] = replace(compiled[-1], schedule=previous.with_metadata(max_bytes=hi))
            continue
        compiled.append(result)
    return Plan(tuple(c.schedule for c in compiled)), compiled


def compile_shipped(out_dir: str | Path, names: Iterable[str] | None = None, *, collective: str = "allreduce",
                    algorithm: str = "auto", size_bytes: int = 64 << 20) -> list[tuple[Path, Compiled]]:
    """Compile ``collective`` for the shipped topologies ``names`` (default: :func:`scheduled_topologies`) into
    ``out_dir`` (the ``schedules/`` folder)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for topology in (resolve_topology(name) for name in names) if names else scheduled_topologies():
        compiled = compile_schedule(topology, collective, algorithm, Options(size_bytes=size_bytes))
        # the recorded topology file is the shipped name, so the schedule resolves on any checkout
        schedule = compiled.schedule.with_metadata(topology_file=None)
        large = schedule.op_count > 50_000
        path = out / f"{topology.name}-{collective}{'.json.gz' if large else '.json'}"
        save_schedule(symmetric_form(schedule, topology), path)
        # the other spelling, from an earlier run, would be a second, stale schedule for the topology
        (out / f"{topology.name}-{collective}{'.json' if large else '.json.gz'}").unlink(missing_ok=True)
        written.append((path, replace(compiled, schedule=schedule)))
    return written
