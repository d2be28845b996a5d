"""Compress the slow hops of a compiled schedule: wire encodings on the messages that cross chosen links.

A compiled plan knows which links set its time, so it can keep full precision on NVLink and inside the
host and encode only the messages whose route crosses the slow links (ZeRO++'s quantised hierarchical
reduce-scatter does this for one fabric; PyTorch's ``bf16_compress_hook`` compresses every hop alike).
:func:`compress` is a post-pass on a compiled schedule: it marks the messages a :class:`Policy` selects
with their encoding (:mod:`topocc.runtime.encoding`), makes the result consistent (every rank ends with the
same bits: :mod:`topocc.planner.compiler.rounding`), proves it (the exact dataflow, and the consistency:
:mod:`topocc.planner.analysis.encodings`) and times it against the exact plan.

A policy is one or more rules ``ENCODING@SCOPE``, comma-separated, the first that selects a link of a
message's route choosing its encoding:

* ENCODING: ``bf16``, ``fp16``, ``int8`` (``int8:block=N``), ``topk:F`` (``topk:1%``), or ``topk:budget=F``
  (``topk:budget`` for 1%): DLion's per-link budget (Hong et al., HPDC 2021), top-k whose ``k`` is sized
  from the bandwidth of the link class each message crosses: the fastest class the rule selects keeps
  ``F``, a class of bandwidth ``b`` keeps ``F * b / b_fastest`` (half as fast, half as many entries), each
  message by the slowest selected link on its route; the bandwidths are the topology's links as calibrated
  (a ``calibration:`` block replaces the file's figures with measured ones);
* SCOPE: ``slow`` (the links that set the plan's time: the class of the busiest link in the exact plan's
  simulation, when some class the plan crosses is faster; none where every hop is as fast),
  ``links<=BANDWIDTH`` (``links<=25Gb/s``), ``inter-rack`` (links between switches), ``inter-host``
  (every link that leaves a host), or a link class by name (``host-switch``, ``switch-1``,
  ``host:nvlink``: :func:`~topocc.planner.topology.calibration.link_classes_of`).

A policy that selects no message of the plan is refused (:class:`~topocc.planner.errors.NotApplicableError`,
one line naming the classes the plan crosses): compressing nothing is never silent.  Where the user chooses
so (:func:`compress_all`'s ``exact_if_none``: ``topocc bundle --compress-else exact``), such a plan stays
exact instead.  A ``topk:budget`` rule whose owner sends one value over classes of different budgets cannot
round it for both: those messages go exact (the report's ``kept_exact``).

>>> compressed = compress(topology, compile_schedule(topology, "allreduce"), "bf16@slow")  # doctest: +SKIP
>>> compressed.report.predicted_time_s / compressed.report.exact_time_s  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from topocc.planner.analysis.codec_costs import FLOAT32_BYTES
from topocc.planner.analysis.simulate import chunk_bytes, simulate
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.compile import Compiled
from topocc.planner.compiler.rounding import make_consistent
from topocc.planner.errors import NotApplicableError, UsageError, VerificationError
from topocc.planner.routing.network import Network, network_of
from topocc.planner.routing.paths import recorded_paths
from topocc.planner.topology.calibration import link_classes_of
from topocc.planner.topology.model import Topology
from topocc.planner.units import UnitError, format_bandwidth, parse_bandwidth
from topocc.runtime.encoding import TopK, parse_encoding
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.matching import streams
from topocc.runtime.schedule import Schedule, without_encoding

__all__ = ["ClassUse", "CompressReport", "Compressed", "Policy", "Rule", "compress", "compress_all", "describe_encoded",
           "parse_policy"]

#: A link by its ends.
LinkKey = tuple[str, str]
#: A message's paths, each as its links' ends.
Paths = tuple[tuple[LinkKey, ...], ...]

_POLICY_FIX = ("write ENCODING@SCOPE, e.g. bf16@slow, int8@links<=25Gb/s, topk:1%@inter-rack, "
               "topk:budget=1%@inter-host or fp16@host-switch (comma-separated for several)")
#: The kept fraction of the fastest class a bare ``topk:budget`` selects.
DEFAULT_BUDGET = 0.01


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``ENCODING@SCOPE`` rule: the encoding's canonical spec, the scope as written, the bandwidth
    limit of a ``links<=`` scope, and the fastest class's fraction of a ``topk:budget`` rule (then the
    encoding is ``topk:budget=F``, each message's spec made from its link class's bandwidth)."""

    encoding: str
    scope: str
    max_bandwidth: float | None = None
    budget: float | None = None

    def __str__(self) -> str:
        return f"{self.encoding}@{self.scope}"


@dataclass(frozen=True, slots=True)
class Policy:
    """A compression policy: its rules, first match first."""

    text: str
    rules: tuple[Rule, ...]


def parse_policy(text: str) -> Policy:
    """The policy ``text`` writes (see the module docstring); a :class:`UsageError` naming the fault."""
    rules = []
    for part in text.split(","):
        encoding, at, scope = part.strip().rpartition("@")
        if not at or not encoding or not scope:
            raise UsageError(f"compression policy {text!r}: {part.strip()!r} is not ENCODING@SCOPE", fix=_POLICY_FIX)
        budget = _budget(text, encoding)
        try:
            spec_ = f"topk:budget={budget!r}" if budget is not None else parse_encoding(encoding).spec
        except ScheduleFormatError as exc:
            raise UsageError(f"compression policy {text!r}: {exc.message}", fix=exc.fix) from None
        limit = None
        if scope.startswith("links<="):
            try:
                limit = parse_bandwidth(scope.removeprefix("links<="))
            except UnitError as exc:
                raise UsageError(f"compression policy {text!r}: {exc}",
                                 fix="write e.g. links<=25Gb/s or links<=12.5GB/s") from None
        rules.append(Rule(spec_, scope.strip(), limit, budget))
    return Policy(text, tuple(rules))


def _budget(text: str, encoding: str) -> float | None:
    """The fastest class's fraction of a ``topk:budget[=F]`` encoding (None for any other encoding)."""
    name, _, arg = encoding.strip().partition(":")
    key, eq, value = arg.strip().partition("=")
    if name.strip().lower() != "topk" or key.strip().lower() != "budget":
        return None
    if not eq:
        return DEFAULT_BUDGET
    try:
        found = parse_encoding(f"topk:{value.strip()}")
    except ScheduleFormatError as exc:
        raise UsageError(f"compression policy {text!r}: {exc.message}",
                         fix="write topk:budget=F with F in (0, 1], e.g. topk:budget=1%") from None
    assert isinstance(found, TopK)
    return found.fraction


@dataclass(frozen=True, slots=True)
class ClassUse:
    """What one encoding does on the links of one class: how many links and messages, and the bytes those
    links carry for them, exact and encoded (at the schedule's size, float32)."""

    link_class: str
    encoding: str
    links: int
    messages: int
    exact_bytes: float
    wire_bytes: float

    @property
    def saved(self) -> float:
        """The share of the exact bytes not sent."""
        return 1.0 - self.wire_bytes / self.exact_bytes if self.exact_bytes else 0.0


@dataclass(frozen=True, slots=True)
class CompressReport:
    """What compression did to a plan, for the summary, ``--json`` and the HTML report."""

    policy: str
    rules: tuple[tuple[str, tuple[str, ...]], ...]  # each rule and the link classes it selected
    classes: tuple[ClassUse, ...]
    links: tuple[tuple[str, str, str, float, float], ...]  # per link: ends, encoding, exact and wire bytes
    encoded_messages: int
    roundings: int
    kept_exact: int
    approximate_chunks: int
    size_bytes: int
    exact_time_s: float
    predicted_time_s: float

    @property
    def speedup(self) -> float:
        """The exact plan's predicted time over the compressed one's."""
        return self.exact_time_s / self.predicted_time_s if self.predicted_time_s > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        """The report under the names ``docs/json.md`` lists."""
        return {
            "policy": self.policy,
            "rules": [{"rule": rule, "classes": list(classes)} for rule, classes in self.rules],
            "encoded_classes": [{"link_class": c.link_class, "encoding": c.encoding, "links": c.links,
                                 "messages": c.messages, "exact_bytes": c.exact_bytes, "wire_bytes": c.wire_bytes,
                                 "saved": round(c.saved, 4)} for c in self.classes],
            "encoded_links": [{"link": f"{a} -> {b}", "encoding": e, "exact_bytes": x, "wire_bytes": w}
                              for a, b, e, x, w in self.links],
            "encoded_messages": self.encoded_messages,
            "rounding_copies": self.roundings,
            "kept_exact": self.kept_exact,
            "approximate_chunks": self.approximate_chunks,
            "size_bytes": self.size_bytes,
            "exact_time_s": self.exact_time_s,
            "predicted_time_s": self.predicted_time_s,
            "speedup": self.speedup,
        }


@dataclass(frozen=True, slots=True)
class Compressed:
    """A compressed plan (verified, timed) and its report."""

    compiled: Compiled
    report: CompressReport


def compress(where: Topology | Network, compiled: Compiled, policy: str | Policy) -> Compressed:
    """Encode the messages of ``compiled`` that ``policy`` selects, keep every rank's result identical, prove
    and time the result (see the module docstring).  Raises :class:`~topocc.planner.errors.NotApplicableError`
    where the policy selects no message."""
    net = network_of(where)
    policy = parse_policy(policy) if isinstance(policy, str) else policy
    schedule = compiled.schedule
    paths = _message_paths(net, schedule)
    routes = {send: frozenset(key for path in ways for key in path) for send, ways in paths.items()}
    classes = link_classes_of(net.topology)
    busiest = compiled.sim.bottlenecks(1)
    slow = classes[busiest[0][0]] if busiest else None
    selected = [(rule, _selected(net, rule, routes, classes, slow)) for rule in policy.rules]
    marks = _marks(net, routes, classes, selected)
    if not marks:
        raise NotApplicableError(f"compression policy {policy.text!r} selects no message of this plan "
                                 f"({_crossed_note(net, routes, classes)})",
                                 where=f"{schedule.collective} plan ({schedule.metadata.algorithm}) on "
                                       f"{net.topology.name}",
                                 fix="name a link class the plan crosses, or leave --compress out to run exact")
    consistent = make_consistent(schedule, marks)
    size = schedule.metadata.size_bytes or compiled.sim.size_bytes
    try:
        proof = verify(consistent.schedule)
    except VerificationError:  # a redirected read the schedule's order does not allow: round in place only
        consistent = make_consistent(schedule, marks, redirect=False)
        proof = verify(consistent.schedule)
    sim = simulate(net, consistent.schedule, size)
    options = {**schedule.metadata.options, "compress": policy.text}
    result = consistent.schedule.with_metadata(options=options, predicted_time_s=sim.time_s)
    # the result's own numbering: rounding copies moved its operations
    uses, per_link = _link_use(result, _message_paths(net, result), classes, chunk_bytes(result, size))
    report = CompressReport(
        policy.text, tuple((str(rule), tuple(sorted({classes[k] for k in chosen}))) for rule, chosen in selected),
        uses, per_link, sum(1 for p in result.programs for op in p if op.kind == "send" and op.encoding),
        consistent.roundings, consistent.kept_exact, proof.approximate_chunks, size, compiled.sim.time_s,
        sim.time_s)
    return Compressed(replace(compiled, schedule=result, proof=proof, sim=sim), report)


def _marks(net: Network, routes: Mapping[tuple[int, int], frozenset[LinkKey]], classes: Mapping[LinkKey, str],
           selected: Sequence[tuple[Rule, frozenset[LinkKey]]]) -> dict[tuple[int, int], str]:
    """Each send's encoding: the first rule that selects a link of its route; a ``topk:budget`` rule's sized
    by the slowest selected link on the route (see the module docstring)."""
    bandwidth = {(link.src, link.dst): link.bandwidth for link in net.topology.links}
    marks = {}
    for send, links in routes.items():
        found = next(((rule, chosen & links) for rule, chosen in selected if chosen & links), None)
        if found is None:
            continue
        rule, hit = found
        if rule.budget is None:
            marks[send] = rule.encoding
            continue
        chosen = next(c for r, c in selected if r is rule)
        narrowest: dict[str, float] = {}  # each selected class's bandwidth: its narrowest link the plan crosses
        for key in chosen:
            narrowest[classes[key]] = min(narrowest.get(classes[key], float("inf")), bandwidth[key])
        slowest = min(narrowest[classes[key]] for key in hit)
        marks[send] = parse_encoding(f"topk:{rule.budget * slowest / max(narrowest.values())!r}").spec
    return marks


def _message_paths(net: Network, schedule: Schedule) -> dict[tuple[int, int], Paths]:
    """Every send's paths (its bytes split evenly over them), by (rank, op index)."""
    recorded = recorded_paths(net, schedule)
    out = {}
    for key, stream in streams(schedule).items():
        ways = (recorded[key],) if key in recorded else net.connection_paths(*key)
        paths = tuple(tuple((link.src, link.dst) for link in path) for path in ways)
        for ks in stream.sends:
            out[(key[0], ks)] = paths
    return out


def _selected(net: Network, rule: Rule, routes: Mapping[tuple[int, int], frozenset[LinkKey]],
              classes: Mapping[LinkKey, str], slow: str | None) -> frozenset[LinkKey]:
    """The links the plan crosses that ``rule`` selects (``slow``: the class of the exact plan's busiest link)."""
    crossed = frozenset().union(*routes.values()) if routes else frozenset()
    bandwidth = {(link.src, link.dst): link.bandwidth for link in net.topology.links}
    scope = rule.scope
    if scope == "slow":
        narrowest: dict[str, float] = {}
        for key in crossed:
            narrowest[classes[key]] = min(narrowest.get(classes[key], float("inf")), bandwidth[key])
        if slow not in narrowest or narrowest[slow] >= max(narrowest.values()):  # no class is slower than another
            return frozenset()
        return frozenset(k for k in crossed if classes[k] == slow)
    if rule.max_bandwidth is not None:
        return frozenset(k for k in crossed if bandwidth[k] <= rule.max_bandwidth * (1 + 1e-9))
    if scope == "inter-rack":
        return frozenset(k for k in crossed if classes[k].startswith("switch-"))
    if scope == "inter-host":
        return frozenset(k for k in crossed if not classes[k].startswith("host:"))
    if scope not in set(classes.values()):
        raise UsageError(f"compression scope {scope!r} is neither slow, links<=BANDWIDTH, inter-rack, inter-host "
                         f"nor a link class of {net.topology.name}",
                         fix="its link classes: " + ", ".join(sorted(set(classes.values()))))
    return frozenset(k for k in crossed if classes[k] == scope)


def _crossed_note(net: Network, routes: Mapping[tuple[int, int], frozenset[LinkKey]],
                  classes: Mapping[LinkKey, str]) -> str:
    """The link classes the plan crosses and their narrowest bandwidths, for a refusal."""
    bandwidth = {(link.src, link.dst): link.bandwidth for link in net.topology.links}
    narrowest: dict[str, float] = {}
    for links in routes.values():
        for key in links:
            narrowest[classes[key]] = min(narrowest.get(classes[key], float("inf")), bandwidth[key])
    if not narrowest:
        return "it sends no message"
    return "it crosses " + ", ".join(f"{name} ({format_bandwidth(bw)})" for name, bw in sorted(narrowest.items()))


def _link_use(schedule: Schedule, paths: Mapping[tuple[int, int], Paths], classes: Mapping[LinkKey, str],
              chunk: float) -> tuple[tuple[ClassUse, ...], tuple[tuple[str, str, str, float, float], ...]]:
    """Per link class and encoding, and per link, the bytes encoded messages put there, exact and encoded
    (a message's bytes split evenly over its paths)."""
    per_link: dict[tuple[LinkKey, str], list[float]] = {}
    messages: dict[tuple[str, str], int] = {}
    for (rank, k), ways in paths.items():
        op = schedule.programs[rank][k]
        if op.encoding is None or not ways:
            continue
        exact = op.count * chunk
        wire = float(parse_encoding(op.encoding).wire_bytes(round(exact / FLOAT32_BYTES), FLOAT32_BYTES))
        for path in ways:
            for key in path:
                entry = per_link.setdefault((key, op.encoding), [0.0, 0.0])
                entry[0] += exact / len(ways)
                entry[1] += wire / len(ways)
        for name in {classes[key] for path in ways for key in path}:
            messages[(name, op.encoding)] = messages.get((name, op.encoding), 0) + 1
    grouped: dict[tuple[str, str], list[float]] = {}
    for (key, encoding), (exact, wire) in per_link.items():
        entry = grouped.setdefault((classes[key], encoding), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += exact
        entry[2] += wire
    uses = tuple(ClassUse(name, encoding, int(n), messages[(name, encoding)], exact, wire)
                 for (name, encoding), (n, exact, wire) in sorted(grouped.items()))
    links = tuple(sorted((a, b, encoding, exact, wire) for ((a, b), encoding), (exact, wire) in per_link.items()))
    return uses, links


def describe_encoded(where: Topology | Network, schedule: Schedule, size_bytes: int) -> CompressReport:
    """The report of an encoded schedule read back (the HTML report's): its encodings per link, and its time at
    ``size_bytes`` against the same schedule run exact.  The policy is the one its metadata records."""
    net = network_of(where)
    paths = _message_paths(net, schedule)
    classes = link_classes_of(net.topology)
    exact = replace(schedule.expanded(), programs=tuple(tuple(map(without_encoding, p)) for p in schedule.programs))
    uses, per_link = _link_use(schedule, paths, classes, chunk_bytes(schedule, size_bytes))
    text = str(schedule.metadata.options.get("compress", "as the schedule file says"))
    approximate = verify(schedule).approximate_chunks
    ops = [op for p in schedule.programs for op in p if op.encoding]
    return CompressReport(text, (), uses, per_link, sum(op.kind == "send" for op in ops),
                          sum(op.kind == "copy" for op in ops), 0, approximate, size_bytes,
                          simulate(net, exact, size_bytes).time_s, simulate(net, schedule, size_bytes).time_s)


def compress_all(where: Topology | Network, results: Sequence[Compiled], policy: str | Policy, *,
                 exact_if_none: bool = False) -> list[Compressed]:
    """:func:`compress` for each schedule of a plan (its size buckets), on one network.  A bucket the policy
    selects nothing of stays exact (a small size's plan may never leave the rack); a policy that selects
    nothing of any bucket is refused as :func:`compress` refuses it, or, with ``exact_if_none``, leaves the
    whole plan exact (a process group inside one host, which has no slow link)."""
    net = network_of(where)
    policy = parse_policy(policy) if isinstance(policy, str) else policy
    out: list[Compressed] = []
    refused: NotApplicableError | None = None
    for compiled in results:
        try:
            out.append(compress(net, compiled, policy))
        except NotApplicableError as exc:
            refused = refused or exc
            sim = compiled.sim
            out.append(Compressed(compiled, CompressReport(policy.text, (), (), (), 0, 0, 0, 0, sim.size_bytes,
                                                           sim.time_s, sim.time_s)))
    if refused is not None and not exact_if_none and all(c.report.encoded_messages == 0 for c in out):
        raise refused
    return out
