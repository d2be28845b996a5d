"""Benchmark a compiled schedule on an emulated cluster, beside MPI's and gloo's allreduce and the simulator.

:func:`bench_emulated` brings up an :class:`~topocc.planner.testbed.emulation.EmulatedCluster`
for the topology (each host a network namespace, inter-host links shaped to
their bandwidth times ``scale``), runs one ``mpiexec`` inside it that times, for
every size, the schedule's replay, native ``MPI_Allreduce`` and torch's gloo
allreduce (its ranks in the same namespaces, meeting at rank 0's address), and
sets each measurement beside the simulator's prediction for the *scaled*
topology.  The schedule is compiled for the real topology; the scaled one has
the same ranks and structure, only slower inter-host links, so it is simulated
there as is.

The regime says whether the figures mean anything: when the measured time is
close to the network-only prediction, the emulated network limits the run
(``network-bound``); when it is far above, the CPUs (ranks busy-polling on few
cores, copies, reductions) or per-message latency do, and ratios between
algorithms say little about the network.

>>> rows = bench_emulated("emu-racks", None, [16 << 20])   # doctest: +SKIP
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.size_buckets import compile_plan
from topocc.planner.errors import UsageError
from topocc.planner.report.runs import bench_progress, bench_verdict
from topocc.planner.report.summary import model_note
from topocc.planner.report.table import RATIO, format_table, opt_cell
from topocc.planner.testbed.emulation import DEFAULT_SCALE, EmulatedCluster, emulation_available
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_size, format_time
from topocc.runtime.collective import ALLREDUCE
from topocc.runtime.collective import collective as describe
from topocc.runtime.errors import TopoccError
from topocc.runtime.harness.launch import BenchRequest, bench_schedule, find_mpiexec, worker_env
from topocc.runtime.plan import Plan, as_plan
from topocc.runtime.schedule import Schedule

__all__ = ["NETWORK_BOUND", "EmulatedRow", "bench_emulated", "format_emulated_table", "iterations_for", "run_emulated"]

#: A size is network-bound when the simulator's (network-only) prediction is at least this share of the
#: measured time: the rest is what the emulation adds (CPU, copies, TCP stacks, scheduling of ranks on cores).
NETWORK_BOUND = 0.8
#: Rendezvous port for torch.distributed, on rank 0's emulated address (the namespace is ours alone).
GLOO_PORT = 29533
#: The progress line as an emulated cluster is removed.
TEARDOWN = "emulate: tearing down the emulated cluster"
#: Wall-clock the timed calls of one size should take, per method (iterations are cut to fit).
CASE_BUDGET_S = 6.0


@dataclass(frozen=True, slots=True)
class EmulatedRow:
    """One size: measured times (slowest rank's mean), the prediction on the scaled topology, the regime."""

    size: int
    algorithm: str
    time_s: float
    native_time_s: float | None
    gloo_time_s: float | None
    predicted_time_s: float
    max_error: float
    wrong: int
    iters: int
    regime: str

    @property
    def ratio(self) -> float | None:
        """Our time over native MPI's (below 1: the compiled schedule is faster), as ``topocc bench`` reports it."""
        return self.time_s / self.native_time_s if self.native_time_s else None

    @property
    def predicted_over_measured(self) -> float:
        """The simulator's prediction over the measured time (1.0: exact; below: the run was slower)."""
        return self.predicted_time_s / self.time_s if self.time_s else math.nan

    @property
    def error(self) -> float:
        """The prediction's error relative to the measured time (+0.1: predicted 10% slower than measured)."""
        return self.predicted_time_s / self.time_s - 1 if self.time_s else math.nan

    def to_json(self) -> dict[str, Any]:
        """The row under the names ``docs/json.md`` lists (those of ``topocc bench --json`` where they meet)."""
        return {"size_bytes": self.size, "algorithm": self.algorithm, "time_s": self.time_s,
                "native_time_s": self.native_time_s, "gloo_time_s": self.gloo_time_s,
                "predicted_time_s": self.predicted_time_s, "wrong": self.wrong, "max_error": self.max_error,
                "iters": self.iters, "regime": self.regime, "ratio": self.ratio,
                "predicted_over_measured": self.predicted_over_measured, "error": self.error}


def regime(predicted_s: float, measured_s: float) -> str:
    """``network-bound`` when the network-only prediction explains most of the time, else ``CPU/latency-bound``."""
    return "network-bound" if predicted_s >= NETWORK_BOUND * measured_s else "CPU/latency-bound"


def iterations_for(predicted_s: float, iters: int, budget_s: float = CASE_BUDGET_S) -> int:
    """Timed iterations for a size: ``iters``, fewer when each call is predicted to be long (at least 1)."""
    return max(1, min(iters, int(budget_s / max(predicted_s, 1e-9))))


def bench_emulated(topology_path: str | Path | Topology, source: str | Path | Schedule | Plan | None,
                   sizes: Sequence[int], *, scale: float = DEFAULT_SCALE, np: int | None = None, iters: int = 5,
                   warmup: int = 1, include_gloo: bool = True, include_native: bool = True, algorithm: str = "auto",
                   trace: str | Path | None = None, timeout: float | None = None, budget_s: float = CASE_BUDGET_S,
                   progress: Callable[[str], None] | None = None) -> list[EmulatedRow]:
    """Time an allreduce schedule (or plan) on the emulated ``topology_path``; one row per size.

    Parameters
    ----------
    topology_path:
        A topology file, a shipped topology's name, or a loaded topology.
    source:
        A schedule or plan (file or object) compiled for that topology; None compiles a plan for
        ``sizes`` with ``algorithm`` (``auto`` by default).
    sizes:
        nccl-tests sizes in bytes (float32 elements).
    scale:
        Multiplies every inter-host bandwidth (see :class:`~topocc.planner.testbed.emulation.EmulatedCluster`).
    np:
        Ranks; must equal the topology's (each rank runs in its host's namespace).  None: the topology's.
    iters, warmup, budget_s:
        Timed and untimed calls per size and method; ``iters`` is cut so that each method's timed
        calls of a size take about ``budget_s`` by the prediction.
    include_gloo, include_native:
        Also time torch.distributed's gloo allreduce (needs torch), and MPI's own.
    trace:
        A ``.json`` path: one call per size is recorded on every rank and written as a Chrome trace.
    timeout:
        Per-call deadline of the replay (default: from the slowest prediction).
    progress:
        Called with a line as the cluster is set up, as each size ends, and as it is torn down.

    Raises :class:`~topocc.runtime.errors.TopoccError` (no root, a failed job, a mismatched schedule).
    """
    why = emulation_available()
    if why is not None:
        raise TopoccError(f"cannot emulate a cluster here: {why}", fix="run as root on Linux with iproute2")
    topology = topology_path if isinstance(topology_path, Topology) else resolve_topology(str(topology_path))
    sizes = sorted(int(s) for s in sizes)
    if not sizes or sizes[0] <= 0:
        raise UsageError("give at least one positive size")
    if np is not None and np != topology.size:
        raise UsageError(f"the emulated {topology.name} runs {topology.size} ranks, not --np {np}",
                         fix=f"pass --np {topology.size} (one rank per GPU of the topology), or leave --np out")
    plan = compile_plan(topology, "allreduce", sizes[0], sizes[-1], algorithm)[0] if source is None else as_plan(source)
    if plan.ranks != topology.size:
        raise UsageError(f"the schedule is for {plan.ranks} ranks but {topology.name} has {topology.size}")
    if describe(plan.collective) is not ALLREDUCE:
        raise UsageError(f"the emulated benchmark compares allreduce, not {plan.collective}")
    if include_gloo:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise TopoccError("the gloo baseline needs torch", fix="pip install torch, or pass include_gloo=False") \
                from None
    say = _announce(topology, scale, progress)
    with EmulatedCluster(topology, scale=scale) as cluster:
        try:
            scaled = cluster.scaled_topology()
            predicted = [simulate(scaled, plan.select(s), s).time_s for s in sizes]
            counts = [iterations_for(p, iters, budget_s) for p in predicted]
            per_call = timeout if timeout is not None else 60.0 + 10 * max(predicted)
            # each size: warm-up and timed calls of 2-3 methods, at most a few times the prediction each
            limit = 120.0 + sum((c + warmup + 1) * (1 + include_gloo + include_native) * 4 * p
                                for c, p in zip(counts, predicted))
            env = {"GLOO_SOCKET_IFNAME": cluster.hosts[0].interface, "OMP_NUM_THREADS": "1"}

            def launcher(argv: Sequence[str]) -> list[str]:
                return cluster.mpiexec_command(argv, env=env)

            gloo = f"{cluster.host_of(0).address}:{GLOO_PORT}" if include_gloo else None
            say(f"emulate: running {len(sizes)} sizes")
            report = bench_progress(say, len(sizes), topology.size) if progress else None
            request = BenchRequest(tuple(sizes), tuple(counts), warmup, timeout=per_call, gloo=gloo, trace=trace,
                                   limit_s=limit, native=include_native)
            measured = bench_schedule(plan, topology.size, request, launcher=launcher, progress=report)
        finally:
            say(TEARDOWN)
    return [EmulatedRow(size=m.size, algorithm=m.algorithm, time_s=m.time_s, native_time_s=m.native_time_s,
                        gloo_time_s=m.gloo_time_s, predicted_time_s=p, max_error=m.max_error, wrong=m.wrong,
                        iters=m.iters, regime=regime(p, m.time_s))
            for m, p in zip(measured, predicted)]


def format_emulated_table(rows: Sequence[EmulatedRow], topology: Topology, scale: float) -> str:
    """The rows as a table: times, ratio to MPI, prediction and its error, wrong elements, each size's regime."""
    head = (f"# allreduce on emulated {topology.name} ({topology.size} ranks, {len(topology.hosts)} hosts, "
            f"inter-host bandwidth x{scale:g}); times: slowest rank's mean; ratio = time / native_time (MPI)\n"
            f"# model: {model_note(topology)}; error = predicted / measured - 1")
    table = format_table(
        [(format_size(r.size), r.algorithm, format_time(r.time_s), opt_cell(r.native_time_s, format_time),
          opt_cell(r.gloo_time_s, format_time), format_time(r.predicted_time_s), opt_cell(r.ratio, RATIO.format),
          f"{r.error:+.1%}", r.wrong, f"{r.max_error:.3g}", r.iters, r.regime) for r in rows],
        ("size", "algorithm", "time", "native_time", "gloo_time", "predicted_time", "ratio", "error", "#wrong",
         "max_error", "iters", "regime"), ">>>>>>>>>>><")
    lines = [head, table, f"# {bench_verdict([r.to_json() for r in rows])}"]
    bound = [r for r in rows if r.regime != "network-bound"]
    if bound:
        lines.append(f"# {len(bound)} of {len(rows)} sizes are not network-bound (measured well above the "
                     "network-only prediction): compare algorithms only where the network limits the run")
    return "\n".join(lines)


def run_emulated(topology_path: str | Path | Topology, argv: Sequence[str], *, scale: float = DEFAULT_SCALE,
                 timeout_s: float = 600.0, env: dict[str, str] | None = None,
                 progress: Callable[[str], None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as every rank of the topology, each in its host's namespace, under one ``mpiexec``.

    The library half of ``topocc emulate TOPO -- cmd``: ``argv[0]`` is any program (``python`` and a
    script, or a binary); the cluster is up only while it runs and is removed afterwards, even on
    failure or timeout (then :class:`~topocc.runtime.errors.TopoccError`).  Output is captured.  ``progress``
    is called with a line as the cluster is set up, as the command starts, and as it is torn down.
    """
    why = emulation_available()
    if why is not None:
        raise TopoccError(f"cannot emulate a cluster here: {why}", fix="run as root on Linux with iproute2")
    if not argv:
        raise UsageError("give the command to run after --")
    topology = topology_path if isinstance(topology_path, Topology) else resolve_topology(str(topology_path))
    say = _announce(topology, scale, progress)
    with EmulatedCluster(topology, scale=scale) as cluster:
        try:
            rank_env = {"GLOO_SOCKET_IFNAME": cluster.hosts[0].interface, **(env or {})}
            cmd = cluster.mpiexec_command(list(argv[1:]), python=argv[0], env=rank_env, mpiexec=find_mpiexec())
            say(f"emulate: running {' '.join(argv)} on {topology.size} ranks")
            return cluster.run(cmd, timeout_s=timeout_s, env=worker_env())
        finally:
            say(TEARDOWN)


def _announce(topology: Topology, scale: float, progress: Callable[[str], None] | None) -> Callable[[str], None]:
    """``progress`` (or a sink), after saying that the emulated cluster is being set up."""
    say = progress or (lambda _line: None)
    say(f"emulate: setting up {topology.name} ({len(topology.hosts)} hosts, {topology.size} ranks, "
        f"inter-host bandwidth x{scale:g})")
    return say


if __name__ == "__main__":  # pragma: no cover - a convenience: python -m topocc.planner.testbed.bench TOPO SIZE...
    _topology = resolve_topology(sys.argv[1])
    print(format_emulated_table(bench_emulated(_topology, None, [int(s) for s in sys.argv[2:]] or [1 << 20]),
                                _topology, DEFAULT_SCALE))
