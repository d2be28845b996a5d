"""Bundles: every plan a training job needs (one per collective, process group and root), compiled together.

What to compile is a list of :class:`BundleRequest`: the collectives a framework issues on the world and on
given groups (:func:`requests_for`), or the calls a job recorded (:func:`requests_from_calls`, read by
:func:`topocc.runtime.calls.read_calls`).  :func:`compile_bundle` compiles each as a plan of size buckets
(:func:`~topocc.planner.compiler.size_buckets.compile_plan`) on its group's topology
(:meth:`~topocc.planner.topology.model.Topology.subset`), finds the size below which gloo's own algorithm
is predicted as fast (:func:`~topocc.planner.compiler.thresholds.native_threshold`: the runtime hands those
calls to the native backend) and returns the :class:`~topocc.runtime.bundle.Bundle` the runtime loads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from topocc.planner.compiler.compile import Compiled
from topocc.planner.compiler.compress import CompressReport, Policy, compress_all, parse_policy
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.race import Progress, ProgressFn
from topocc.planner.compiler.size_buckets import compile_plan
from topocc.planner.compiler.symmetrize import symmetric_plan
from topocc.planner.compiler.thresholds import Threshold, native_threshold
from topocc.planner.errors import NotApplicableError, ScheduleFormatError, UsageError
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology
from topocc.runtime.bundle import ROOTED, Bundle, BundlePlan, group_label, rank_ranges
from topocc.runtime.calls import Call
from topocc.runtime.collective import collective as describe
from topocc.runtime.plan import Plan
from topocc.runtime.schedule import COLLECTIVES, canonical_collective

__all__ = ["BundleRequest", "CompiledPlan", "compile_bundle", "requests_for", "requests_from_calls"]


def _canonical(collective: str) -> str:
    """The stored name of ``collective`` (``all-gather`` is ``allgather``); an unknown name is a usage error."""
    try:
        return canonical_collective(collective)
    except ScheduleFormatError:
        raise UsageError(f"unknown collective {collective!r}", fix=f"use one of {', '.join(COLLECTIVES)}") from None


@dataclass(frozen=True, slots=True)
class BundleRequest:
    """One plan to compile: ``collective`` on the process group ``group`` (global ranks, in group-rank order),
    tuned over ``low`` to ``high`` bytes; ``root`` (a group rank) for broadcast and reduce only.

    The collective is stored by its canonical name, and a rooted one without a root gets root 0, so two
    requests for the same plan compare equal.
    """

    collective: str
    group: tuple[int, ...]
    low: int
    high: int
    root: int | None = None

    def __post_init__(self) -> None:
        collective = _canonical(self.collective)
        group = tuple(self.group)
        root = self.root
        if collective in ROOTED:
            root = 0 if root is None else root
            if not 0 <= root < len(group):
                raise UsageError(f"root {root} is not a rank of the {len(group)}-rank group {rank_ranges(group)}",
                                 fix="give the root as a rank of the group (0 is its first rank)")
        elif root is not None:
            raise UsageError(f"{collective} has no root", fix="give a root for broadcast and reduce only")
        if len(group) < 2:
            raise UsageError(f"{collective} on the group [{rank_ranges(group)}] moves no data, so it needs no plan",
                             fix="list groups of two or more ranks")
        if not 1 <= self.low <= self.high:
            raise UsageError(f"the size range {self.low}:{self.high} is empty or starts below 1 byte",
                             fix="give sizes with 1 <= LOW <= HIGH")
        object.__setattr__(self, "collective", collective)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "root", root)

    def key(self) -> tuple[str, tuple[int, ...], int | None]:
        """What the bundle finds the plan by: the same key as :meth:`BundlePlan.key`."""
        return (self.collective, self.group, self.root)


@dataclass(frozen=True, slots=True)
class CompiledPlan:
    """A request's plan with each of its buckets' compilation (algorithm, prediction, bound), where it is
    predicted to beat the native backend (``native``; None where thresholds were not asked for), and, compiled
    with a compression policy, each bucket's compression report."""

    request: BundleRequest
    plan: Plan
    buckets: tuple[Compiled, ...]
    native: Threshold | None = None
    compression: tuple[CompressReport, ...] = ()


def requests_for(world: int, collectives: Iterable[str], low: int, high: int, groups: Iterable[Sequence[int]] = (),
                 root: int = 0) -> list[BundleRequest]:
    """Each of ``collectives`` on the world of ``world`` ranks and on each of ``groups`` (global ranks), tuned
    over ``low`` to ``high`` bytes; ``root`` (a group rank) for broadcast and reduce.

    A collective or group named twice (the world among ``groups``, ``allgather`` and ``all-gather``) is
    compiled once.
    """
    names = list(dict.fromkeys(_canonical(c) for c in collectives))
    every = list(dict.fromkeys([tuple(range(world)), *(tuple(g) for g in groups)]))
    return [BundleRequest(c, g, low, high, root if c in ROOTED else None) for g in every for c in names]


def requests_from_calls(calls: Sequence[Call], world: int) -> list[BundleRequest]:
    """One request per (collective, group, root) the calls made, over the sizes they passed (at least 1 byte).

    Calls on one rank move no data and need no plan; a call on a rank the topology lacks means the record
    is from another cluster.
    """
    spans: dict[tuple[str, tuple[int, ...], int | None], tuple[int, int]] = {}
    for call in calls:
        bad = next((r for r in call.group if r >= world), None)
        if bad is not None:
            raise UsageError(f"a recorded {call.collective} call on ranks {rank_ranges(call.group)} names rank {bad}, "
                             f"but the topology has {world} ranks",
                             fix="compile the bundle for the topology the job ran on")
        if len(call.group) < 2:
            continue
        collective = _canonical(call.collective)
        root = (call.root or 0) if collective in ROOTED else None
        key = (collective, call.group, root)
        size = max(call.size_bytes, 1)
        low, high = spans.get(key, (size, size))
        spans[key] = (min(low, size), max(high, size))
    return [BundleRequest(c, g, low, high, root) for (c, g, root), (low, high) in spans.items()]


def compile_bundle(topology: Topology, requests: Sequence[BundleRequest], algorithm: str = "auto", *,
                   progress: ProgressFn | None = None, thresholds: bool = True, compress: str | Policy | None = None,
                   exact_if_none: bool = False) -> tuple[Bundle, list[CompiledPlan]]:
    """Compile a plan for each request on ``topology`` (the world) or its group's subset; the bundle of them.

    Requests on one group share that group's network (its routes are found once).  ``progress`` gets the
    plans' events (:class:`Progress`), each labelled with its plan and bucket.  With ``thresholds`` each plan
    records the size below which the native backend is predicted as fast (:func:`native_threshold`);
    without, every call runs the plan.  With ``compress`` (a policy,
    :mod:`~topocc.planner.compiler.compress`) each plan's buckets are compressed with it
    (:func:`~topocc.planner.compiler.compress.compress_all`) where its collective carries gradients (all-reduce,
    reduce-scatter: what the backend runs encoded; gathered and broadcast parameters stay exact); a plan the
    policy selects nothing of is refused, or with ``exact_if_none`` stays exact.  Without it no plan changes.
    """
    if not requests:
        raise UsageError("nothing to compile: no collective on two or more ranks was asked for",
                         fix="name collectives with -c, or record calls of a job that makes some")
    seen: set[tuple[str, tuple[int, ...], int | None]] = set()
    for request in requests:
        if request.key() in seen:
            raise UsageError(f"{request.collective} on ranks {rank_ranges(request.group)} is asked for twice",
                             fix="ask for each collective, group and root once")
        seen.add(request.key())
    policy = parse_policy(compress) if isinstance(compress, str) else compress  # refused before any compiling
    # every group checked before the first plan is compiled; a network finds its routes only when asked
    networks = {group: Network(topology.subset(group)) for group in dict.fromkeys(r.group for r in requests)}
    compiled: list[CompiledPlan] = []
    for i, request in enumerate(requests, 1):
        root = f" root {request.root}" if request.root is not None else ""
        label = f"plan {i}/{len(requests)} ({request.collective} on {group_label(request.group, topology.size)}{root})"

        def report(event: Progress, label: str = label) -> None:
            if progress is not None:
                progress(replace(event, bucket=f"{label} {event.bucket}"))

        net = networks[request.group]
        plan, buckets = compile_plan(net, request.collective, request.low, request.high,
                                     algorithm, Options(root=request.root or 0), progress=report)
        reports: tuple[CompressReport, ...] = ()
        if policy is not None and describe(request.collective).carries_gradients:
            try:
                done = compress_all(net, buckets, policy, exact_if_none=exact_if_none)
            except NotApplicableError as exc:
                raise NotApplicableError(exc.message, where=label, fix="name a link class this group crosses, or "
                                         "keep its plans exact with --compress-else exact") from None
            buckets = [d.compiled for d in done]
            plan, reports = Plan(tuple(b.schedule for b in buckets)), tuple(d.report for d in done)
        native = native_threshold(net, plan, request.low, request.high, request.root or 0) if thresholds else None
        compiled.append(CompiledPlan(request, plan, tuple(buckets), native, reports))
    written = [symmetric_plan(c.plan, networks[c.request.group].topology) for c in compiled]
    bundle = Bundle(topology.size, tuple(BundlePlan(plan, c.request.group, c.native.native_below if c.native else 0)
                                         for plan, c in zip(written, compiled)), topology.name, topology.fingerprint)
    return bundle, compiled
