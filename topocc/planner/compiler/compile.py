"""The front door: compile a collective for a topology into a verified, timed schedule.

:func:`compile_schedule` runs one named algorithm, or ``auto``
(:mod:`topocc.planner.compiler.race`): every algorithm that supports the
collective, each simulated, the fastest kept.  Nothing leaves this module
unverified.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from topocc.planner.analysis.bounds import Bound
from topocc.planner.analysis.collectives import canonical_collective
from topocc.planner.analysis.simulate import SimResult
from topocc.planner.analysis.verify import VerifyReport
from topocc.planner.collector import rare_collections
from topocc.planner.compiler.evaluate import Evaluator
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.proof import Proof
from topocc.planner.compiler.race import Candidate, ProgressFn, race
from topocc.planner.compiler.routed import routed_schedule
from topocc.planner.routing.network import Network, network_of
from topocc.planner.topology.model import Topology
from topocc.runtime.schedule import Schedule

__all__ = ["Compiled", "compile_schedule"]


@dataclass(frozen=True, slots=True)
class Compiled:
    """A verified schedule with its proof summary, simulation and lower bound."""

    schedule: Schedule
    proof: VerifyReport
    sim: SimResult
    bound: Bound
    candidates: tuple[Candidate, ...] = ()

    @property
    def efficiency(self) -> float:
        """Lower bound / predicted time: 1.0 means the schedule meets the bound."""
        return self.bound.time_s / self.sim.time_s if self.sim.time_s > 0 else 1.0


@rare_collections()
def compile_schedule(where: Topology | Network, collective: str, algorithm: str = "auto",
                     options: Options | None = None, *, size_range: tuple[int, int | None] | None = None,
                     progress: ProgressFn | None = None) -> Compiled:
    """Compile ``collective`` on a topology (or its network) with ``algorithm``, or the fastest for ``auto``.

    The result is verified (a :class:`~topocc.planner.errors.VerificationError` here is a
    planner bug, never silently written) and simulated at ``options.size_bytes``;
    ``size_range`` is the range of sizes the schedule is meant for (its metadata's
    ``min_bytes`` and ``max_bytes``).  ``progress`` is called as each of ``auto``'s
    candidates starts a phase and when it is settled.

    >>> compiled = compile_schedule(load_topology("topologies/dgx1-v100.yaml"), "allreduce")  # doctest: +SKIP
    >>> compiled.schedule.metadata.algorithm, compiled.sim.time_s, compiled.efficiency  # doctest: +SKIP
    """
    net = network_of(where)
    collective = canonical_collective(collective)
    options = options or Options()
    evaluator = Evaluator(net, options.size_bytes)
    options = replace(options, evaluator=evaluator)
    if algorithm != "auto":
        schedule = routed_schedule(net, collective, algorithm, options)
        return _finish(net, schedule, options, evaluator, size_range, (), None,
                       Proof(evaluator.form(schedule), schedule))
    outcome = race(net, collective, options, evaluator, progress)
    return _finish(net, outcome.leader.schedule, options, evaluator, size_range, outcome.candidates,
                   outcome.leader.sim, outcome.proof or Proof(outcome.leader.schedule, outcome.leader.built))


def _finish(net: Network, schedule: Schedule, options: Options, evaluator: Evaluator,
            size_range: tuple[int, int | None] | None, candidates: tuple[Candidate, ...], sim: SimResult | None,
            proof: Proof) -> Compiled:
    """The schedule proved, timed and bounded, its metadata saying where, for which sizes, and how fast."""
    try:
        if sim is None:  # a named algorithm's schedule: timed, and kept, in the form the evaluator times
            sim = evaluator.simulate(schedule)
            schedule = evaluator.form(schedule)
    finally:
        report = proof.result()
    bound = evaluator.lower_bound(schedule.collective, options.root)
    topology = net.topology
    low, high = size_range if size_range else (0, None)
    schedule = schedule.with_metadata(
        topology=topology.name,
        topology_file=topology.source,
        fingerprint=topology.fingerprint,
        min_bytes=low,
        max_bytes=high,
        size_bytes=options.size_bytes,
        predicted_time_s=sim.time_s,
    )
    return Compiled(schedule, report, sim, bound, candidates)
