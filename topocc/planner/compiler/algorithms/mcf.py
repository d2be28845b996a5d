"""Min-cost multi-commodity flow over time (IBM DDL's MCF planner, TE-CCL's time-expanded formulation).

Commodities are *pieces*: each source rank's data is split into ``k`` pieces,
and every piece must reach every other rank.  Time is cut into epochs of length
``tau``, chosen so that a piece crosses the fastest edge in about one epoch
(TE-CCL §4.1); an edge's latency counts in whole epochs.  Edges are rank pairs
with a GPU-free route, pruned to the cheapest few per rank; their capacity per
epoch comes from the physical links their routes cross, shared by every edge
routed over a link and split evenly over ECMP paths.  Ranks store and forward.

Variables (TE-CCL §4.1-4.2, the multicast "buffer" form):

* ``send[c, e, t]``: how much of piece ``c`` starts over edge ``e`` in epoch ``t``;
* ``have[c, r, t]``: how much of piece ``c`` rank ``r`` holds at the start of epoch ``t``;

subject to ``send[c, (u, v), t] <= have[c, u, t]`` (a rank forwards copies of
what it holds, to any number of neighbours), ``have`` non-decreasing and growing
only by arrivals, physical link capacity per epoch, and every rank holding every
piece by the horizon ``T``.  The objective rewards early arrival (TE-CCL §4.3:
minimise the sum over epochs of what is still missing), plus a tiny cost per
send so that no copy travels for nothing.

Small instances are solved exactly as a MILP (whole pieces; a piece occupies a
slow edge for several epochs).  Larger ones solve the LP relaxation, in which a
piece is a fluid; each piece is then cut into ``q`` sub-pieces and the
fractional sends are rounded cumulatively per (piece, edge) to whole
sub-pieces, sending only what the sender holds and the receiver still lacks;
whatever rounding leaves undelivered is repaired by a greedy flood along the
same edges.  Every rank receives each sub-piece exactly once, so each
sub-piece's transfers form a spanning tree.

Reduce-scatter is the all-gather of the reversed topology run backwards in time
with ``recv_reduce`` (each rank sends its partial sum of a sub-piece once, to
the rank it would have received it from, after all the ranks it would have
forwarded to have sent theirs); all-reduce is reduce-scatter then all-gather;
broadcast and reduce have one source.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
import numpy as np

from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import InfeasibleError, NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.solvers import LinearProgram, Solution, SolverOptions, solve
from topocc.runtime.collective import ALLGATHER, ALLREDUCE, REDUCESCATTER
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["FlowPlan", "FlowSettings", "flow_plan", "mcf"]

#: Beyond this many ranks the model has too many commodities, and mcf declines (hierarchical and treepack scale).
MAX_RANKS = 32
#: Candidate edges per rank (cheapest routes first), as in treepack.
EDGES_PER_RANK = 10
#: Largest model (send variables, before pruning) built by default: larger ones take the LP solver longer
#: than a compile should.
MAX_VARIABLES = 200_000
#: Models up to this many send variables are solved exactly (MILP) unless told otherwise.
EXACT_VARIABLES = 300
#: Horizon cap; beyond it epochs are lengthened.
MAX_EPOCHS = 96
#: Epochs a fluid (LP) model gives the lower bound: fine enough to plan pipelining, coarse enough to solve fast.
TARGET_EPOCHS = 24
#: Sub-pieces are at least this large (smaller messages gain nothing from more pipelining).
MIN_SUBPIECE_BYTES = 1 << 20
#: At most this many sub-pieces per piece.
MAX_SUBPIECES = 8
#: Cost of sending one piece over one edge, relative to one piece missing for one epoch.
SEND_COST = 1e-3
#: Values below this are solver noise.
EPS = 1e-6


@dataclass(frozen=True, slots=True)
class FlowSettings:
    """How to build and solve the model: exactness, solvers and sizes (None: decided from the instance)."""

    exact: bool | None = None
    # CLP (benchmarks/mcf_bench.py compares the backends): this model is degenerate, and GLOP, fastest on
    # treepack's LPs, takes several times longer on it and can miss the time limit
    lp: SolverOptions = field(default_factory=lambda: SolverOptions(backend="clp", time_limit_s=60.0))
    mip: SolverOptions = field(default_factory=lambda: SolverOptions(backend="scip", time_limit_s=20.0))
    max_variables: int = MAX_VARIABLES


@dataclass(frozen=True, slots=True)
class _Edge:
    """A rank-level edge in the direction data flows in the solved problem."""

    src: int
    dst: int
    shares: tuple[tuple[tuple[str, str], float], ...]  # physical link -> share of this edge's traffic
    bandwidth: float
    latency: float


@dataclass(frozen=True, slots=True)
class FlowPlan:
    """Whole-sub-piece transfers ``(epoch, sub-piece, src, dst)``, sorted by epoch, and how they were found.

    Sub-piece ``c * subpieces + i`` is part ``i`` of commodity ``c``; ``info``
    holds the solver's report (for the schedule's metadata).
    """

    transfers: tuple[tuple[int, int, int, int], ...]
    subpieces: int
    epochs: int
    tau: float
    info: dict[str, Any]


# --------------------------------------------------------------------------- the network


def _edges(net: Network, piece_bytes: float, reverse: bool, channel: int) -> list[_Edge]:
    """Candidate edges: per rank the cheapest routable peers, all of them if that leaves a rank unreachable;
    each routed as a message on ``channel``."""
    topology = net.topology
    p = topology.size

    def phys(u: int, v: int) -> tuple[int, int]:
        return (v, u) if reverse else (u, v)

    routable: dict[int, list[tuple[float, int]]] = {u: [] for u in range(p)}
    for u in range(p):
        for v in range(p):
            if u != v and net.has_route(*phys(u, v)):
                a, b = phys(u, v)
                routable[u].append((net.route_latency(a, b, channel)
                                    + piece_bytes / net.route_bandwidth(a, b, channel), v))
        routable[u].sort()
    chosen = [(u, v) for u in range(p) for _, v in routable[u][:EDGES_PER_RANK]]
    graph = nx.DiGraph(chosen)
    graph.add_nodes_from(range(p))
    if not nx.is_strongly_connected(graph):
        chosen = [(u, v) for u in range(p) for _, v in routable[u]]
    edges = []
    for u, v in chosen:
        a, b = phys(u, v)
        shares = net.route_shares(a, b, channel)
        edges.append(_Edge(u, v, tuple(sorted(shares.items())), net.route_bandwidth(a, b, channel),
                           net.route_latency(a, b, channel)))
    return edges


def _earliest(p: int, edges: Sequence[_Edge], delay: Sequence[int], source: int) -> list[float]:
    """Earliest epoch each rank can hold data of ``source`` (shortest path in epochs)."""
    dist = [math.inf] * p
    dist[source] = 0
    changed = True
    while changed:  # Bellman-Ford: a few dozen edges, at most p rounds
        changed = False
        for k, e in enumerate(edges):
            if dist[e.src] + delay[k] < dist[e.dst]:
                dist[e.dst] = dist[e.src] + delay[k]
                changed = True
    return dist


# --------------------------------------------------------------------------- the model


_Sends = tuple[list[int], list[int], list[int], list[int]]  # var, commodity, edge, epoch of every send


@dataclass
class _Model:
    """The flow-over-time linear program and where its variables are."""

    lp: LinearProgram
    send: _Sends
    have_vars: int
    occupancy: list[int]  # epochs a send holds its edge (whole pieces) or 1 (fluid)
    delay: list[int]  # epochs from the start of a send to its arrival
    miss: list[int]  # per (piece, rank): how much is missing at the horizon
    have: dict[tuple[int, int, int], int]  # (piece, rank, epoch) -> variable


def _build(net: Network, sources: Sequence[int], edges: Sequence[_Edge], piece_bytes: float, tau: float,
           horizon: int, exact: bool) -> _Model:
    """The time-expanded model (see the module docstring); all amounts in pieces."""
    p = net.topology.size
    lp = LinearProgram()
    occupancy, delay = _timing(edges, piece_bytes, tau, exact)
    earliest = {s: _earliest(p, edges, delay, s) for s in set(sources)}
    send, by_key, have = _variables(lp, p, sources, edges, delay, earliest, horizon, exact)
    misses = _arrivals(lp, p, sources, edges, delay, earliest, horizon, by_key, have)
    _capacities(lp, net, edges, occupancy, send, piece_bytes, tau)
    return _Model(lp, send, len(have), occupancy, delay, misses, have)


def _timing(edges: Sequence[_Edge], piece_bytes: float, tau: float, exact: bool) -> tuple[list[int], list[int]]:
    """Per edge: the epochs a send holds it, and the epochs from the start of a send to its arrival."""
    occupancy, delay = [], []
    for e in edges:
        per_epoch = e.bandwidth * tau / piece_bytes
        # a whole piece holds a slow edge for several epochs; a fluid piece streams at the edge's rate
        w = max(1, math.ceil(1.0 / per_epoch - 1e-9)) if exact else 1
        occupancy.append(w)
        delay.append(w + round(e.latency / tau))
    return occupancy, delay


def _variables(lp: LinearProgram, p: int, sources: Sequence[int], edges: Sequence[_Edge], delay: Sequence[int],
               earliest: dict[int, list[float]], horizon: int, exact: bool,
               ) -> tuple[_Sends, dict[tuple[int, int, int], int], dict[tuple[int, int, int], int]]:
    """The ``have`` and ``send`` variables from the earliest epoch each can be non-zero, and the rows that
    let a rank send only what it holds: (the sends, send variable by (piece, edge, epoch), have variable by
    (piece, rank, epoch))."""
    send: _Sends = ([], [], [], [])
    send_var, send_c, send_e, send_t = send
    by_key: dict[tuple[int, int, int], int] = {}
    have: dict[tuple[int, int, int], int] = {}
    for c, s in enumerate(sources):
        first = earliest[s]
        for v in range(p):
            if v == s or math.isinf(first[v]):
                continue
            for t in range(int(first[v]), horizon + 1):
                have[c, v, t] = lp.var(upper=1.0, cost=-1.0, integer=exact)
        for k, e in enumerate(edges):
            if e.dst == s or math.isinf(first[e.src]):
                continue
            for t in range(int(first[e.src]), horizon - delay[k] + 1):
                x = lp.var(upper=1.0, cost=SEND_COST, integer=exact)
                by_key[c, k, t] = x
                send_var.append(x)
                send_c.append(c)
                send_e.append(k)
                send_t.append(t)
                if e.src != s:
                    lp.add([x, have[c, e.src, t]], [1.0, -1.0], upper=0.0)
    return send, by_key, have


def _arrivals(lp: LinearProgram, p: int, sources: Sequence[int], edges: Sequence[_Edge], delay: Sequence[int],
              earliest: dict[int, list[float]], horizon: int, by_key: dict[tuple[int, int, int], int],
              have: dict[tuple[int, int, int], int]) -> list[int]:
    """Rows: ``have`` grows only by arrivals, never shrinks, and is complete at the horizon or pays for what
    is missing; returns the variables of what is missing, per (piece, rank)."""
    into: dict[int, list[int]] = {v: [] for v in range(p)}
    for k, e in enumerate(edges):
        into[e.dst].append(k)
    penalty = 10.0 * horizon
    misses: list[int] = []
    for c, s in enumerate(sources):
        for v in range(p):
            if v == s or (c, v, horizon) not in have:
                continue
            for t in range(int(earliest[s][v]), horizon + 1):
                h = have[c, v, t]
                index, coef = [h], [1.0]
                before = have.get((c, v, t - 1))
                if before is not None:
                    index.append(before)
                    coef.append(-1.0)
                    lp.add([before, h], [1.0, -1.0], upper=0.0)
                for k in into[v]:
                    x = by_key.get((c, k, t - delay[k]))
                    if x is not None:
                        index.append(x)
                        coef.append(-1.0)
                lp.add(index, coef, upper=0.0)
            miss = lp.var(cost=penalty)
            misses.append(miss)
            lp.add([have[c, v, horizon], miss], [1.0, 1.0], lower=1.0)
    return misses


def _capacities(lp: LinearProgram, net: Network, edges: Sequence[_Edge], occupancy: Sequence[int], send: _Sends,
                piece_bytes: float, tau: float) -> None:
    """Rows: physical link capacity per epoch; a whole piece on an edge of occupancy w uses 1/w of it per epoch."""
    capacity_of = {key: net.topology.bandwidth(*key) * tau / piece_bytes
                   for e in edges for key, _ in e.shares}
    load: dict[tuple[tuple[str, str], int], tuple[list[int], list[float]]] = {}
    send_var, _, send_e, send_t = send
    for x, k, t in zip(send_var, send_e, send_t):
        w = occupancy[k]
        for key, share in edges[k].shares:
            for u in range(t, t + w):
                index, coef = load.setdefault((key, u), ([], []))
                index.append(x)
                coef.append(share / w)
    for (key, _), (index, coef) in load.items():
        lp.add(index, coef, upper=capacity_of[key])


def _solve(model: _Model, exact: bool, settings: FlowSettings) -> tuple[Solution, float | None]:
    """Solve; for a MILP stopped at its limit, also the gap to the LP relaxation (an upper bound on the true gap)."""
    lp = model.lp
    solution = solve(lp, settings.mip if exact else settings.lp)
    gap: float | None = 0.0 if solution.optimal else None
    if exact and not solution.optimal:
        relaxed = replace(lp, integer=[False] * len(lp.integer))
        try:
            bound = solve(relaxed, settings.lp).objective
        except InfeasibleError:
            bound = None
        if bound is not None:
            shift = model.have_vars  # objective + shift = sum of what is missing over epochs (+ send costs) >= 0
            gap = max(0.0, (solution.objective - bound) / max(solution.objective + shift, 1e-9))
    return solution, gap


# --------------------------------------------------------------------------- rounding and repair


def _round(p: int, sources: Sequence[int], edges: Sequence[_Edge], model: _Model, values: np.ndarray, q: int,
           link_capacity: dict[tuple[str, str], float], horizon: int,
           exact: bool) -> tuple[list[tuple[int, int, int, int]], int, int]:
    """Whole sub-pieces from the (possibly fractional) solution, epoch by epoch.

    In each epoch, first the solution's sends: per (piece, edge) the cumulative
    amount is rounded to whole sub-pieces, taking the lowest-numbered ones the
    sender holds and the receiver neither holds nor is receiving.  Then the
    repair: a sub-piece the solution says a rank should hold by now (reading
    ``have`` as a prefix of the piece) but that rounding has not delivered goes
    over the in-edge that brings it soonest.  Physical links are token buckets
    filled at their capacity per epoch, so rounding up many small fractions
    never overloads a slow link (a MILP's whole pieces are feasible as they are).

    Returns the transfers ``(epoch, sub-piece, src, dst)``, how many the repair
    added, and the epoch the last one arrives.
    """
    rounding = _Rounding(p, sources, edges, model, values, q, link_capacity, exact)
    t = 0
    limit = horizon + 4 * p * max(rounding.sub_delay) * rounding.n_sub
    while rounding.missing:
        if t > limit:
            raise NotApplicableError("mcf could not deliver every piece along its edges (no route)")
        rounding.refill()
        rounding.send_rounded(t)
        rounding.repair(t, horizon)
        t += 1
    rounding.transfers.sort()
    return rounding.transfers, rounding.repaired, max(max(h.values()) for h in rounding.held)


class _Rounding:
    """The state of :func:`_round`: who holds which sub-piece since when, the links' token buckets, and what
    rounding owes each (piece, edge)."""

    def __init__(self, p: int, sources: Sequence[int], edges: Sequence[_Edge], model: _Model, values: np.ndarray,
                 q: int, link_capacity: dict[tuple[str, str], float], exact: bool) -> None:
        self.p, self.q, self.edges, self.values, self.exact = p, q, edges, values, exact
        self.link_capacity = link_capacity
        self.n_sub = n_sub = len(sources) * q
        self.held: list[dict[int, int]] = [{sources[sp // q]: 0} for sp in range(n_sub)]  # rank -> epoch it holds sp
        # epochs a sub-piece takes over each edge, latency included
        rate = [min(link_capacity[key] / share for key, share in e.shares) for e in edges]  # pieces per epoch
        self.sub_delay = [model.delay[k] if exact
                          else max(1, math.ceil(1.0 / (q * rate[k]) - 1e-9)) + model.delay[k] - 1
                          for k in range(len(edges))]
        self.due = [[math.inf] * p for _ in range(n_sub)]  # the epoch the solution has each rank hold each sub-piece
        for (c, v, t), x in model.have.items():
            level = values[x]
            for i in range(q):
                if level >= (i + 1) / q - EPS and t < self.due[c * q + i][v]:
                    self.due[c * q + i][v] = t
        send_var, send_c, send_e, send_t = model.send
        self.by_epoch: dict[int, list[tuple[int, int, int]]] = {}
        for x, c, k, t in zip(send_var, send_c, send_e, send_t):
            if values[x] > EPS:
                self.by_epoch.setdefault(t, []).append((k, c, x))
        self.into: dict[int, list[int]] = {v: [] for v in range(p)}
        for k, e in enumerate(edges):
            self.into[e.dst].append(k)
        self.tokens = dict.fromkeys(link_capacity, 0.0)
        self.wanted: dict[tuple[int, int], float] = {}
        self.sent: dict[tuple[int, int], int] = {}
        self.transfers: list[tuple[int, int, int, int]] = []
        self.repaired = 0
        self.missing = sum(p - len(h) for h in self.held)

    def fits(self, k: int) -> bool:
        """Whether every link of edge ``k`` has the tokens for one sub-piece."""
        return self.exact or all(self.tokens[key] >= share / self.q - EPS for key, share in self.edges[k].shares)

    def move(self, t: int, sp: int, k: int) -> None:
        """Send sub-piece ``sp`` over edge ``k`` in epoch ``t``."""
        e = self.edges[k]
        self.held[sp][e.dst] = t + self.sub_delay[k]
        self.transfers.append((t, sp, e.src, e.dst))
        for key, share in e.shares:
            self.tokens[key] -= share / self.q
        self.missing -= 1

    def refill(self) -> None:
        """A bucket holds at most one epoch's capacity plus one sub-piece."""
        for key in self.tokens:
            self.tokens[key] = min(self.tokens[key] + self.link_capacity[key], self.link_capacity[key] + 1.0 / self.q)

    def send_rounded(self, t: int) -> None:
        """What rounding still owes: this epoch's sends and earlier ones the sender could not make yet."""
        wanted, sent, q = self.wanted, self.sent, self.q
        for k, c, x in self.by_epoch.get(t, ()):
            wanted[c, k] = wanted.get((c, k), 0.0) + self.values[x] * q
        for c, k in sorted(ck for ck, w in wanted.items() if math.floor(w + 0.5) > sent.get(ck, 0)):
            e = self.edges[k]
            for sp in range(c * q, c * q + q):
                if math.floor(wanted[c, k] + 0.5) <= sent.get((c, k), 0) or not self.fits(k):
                    break
                if e.dst not in self.held[sp] and self.held[sp].get(e.src, math.inf) <= t:
                    self.move(t, sp, k)
                    sent[c, k] = sent.get((c, k), 0) + 1

    def repair(self, t: int, horizon: int) -> None:
        """Every sub-piece a rank should hold by now (or at all, past the horizon) that it does not, over the
        in-edge that brings it soonest."""
        edges, held = self.edges, self.held
        for sp in range(self.n_sub):
            for v in range(self.p):
                if v in held[sp] or (self.due[sp][v] > t and t < horizon):
                    continue
                best = min(((self.sub_delay[k], k) for k in self.into[v]
                            if held[sp].get(edges[k].src, math.inf) <= t and self.fits(k)), default=None)
                if best is not None:
                    self.move(t, sp, best[1])
                    self.repaired += 1


# --------------------------------------------------------------------------- the plan


def _horizon(p: int, sources: Sequence[int], edges: Sequence[_Edge], bound_s: float,
             tau: float) -> tuple[float, int]:
    """(epoch length, horizon): the bound plus the deepest source-to-rank path, with slack; epochs lengthened
    when that would exceed :data:`MAX_EPOCHS`."""
    for _ in range(2):
        delay = [1 + round(e.latency / tau) for e in edges]
        depth = max(max(_earliest(p, edges, delay, s)) for s in set(sources))
        base = math.ceil(bound_s / tau - 1e-9)
        horizon = math.ceil(1.2 * (base + depth)) + 2
        if horizon <= MAX_EPOCHS:
            break
        tau *= horizon / MAX_EPOCHS
    return tau, min(horizon, MAX_EPOCHS)


def flow_plan(net: Network, sources: Sequence[int], piece_bytes: float, *, subpieces: int,
              bound_s: float, reverse: bool = False, settings: FlowSettings | None = None,
              channel: int = 0) -> FlowPlan:
    """Solve the flow-over-time model for one commodity per entry of ``sources`` and round it.

    ``bound_s`` (a lower bound on the collective's time) sizes the horizon;
    with ``reverse`` the model is for the reversed topology (logical edge
    ``u -> v`` uses the routes of ``v -> u``), as reduce-scatter needs.
    """
    topology = net.topology
    settings = settings or FlowSettings()
    p = topology.size
    edges = _edges(net, piece_bytes, reverse, channel)
    fastest = max(e.bandwidth for e in edges)
    # MILP: a whole piece crosses the fastest edge in one epoch (TE-CCL §4.1).  LP: pieces are fluid, so an
    # epoch is one sub-piece on the fastest edge, or a share of the bound fine enough to plan pipelining in.
    tau, horizon = _horizon(p, sources, edges, bound_s, max(piece_bytes / fastest, min(e.latency for e in edges)))
    estimate = len(sources) * len(edges) * horizon
    exact = settings.exact if settings.exact is not None else estimate <= EXACT_VARIABLES
    if not exact:
        fluid = max(piece_bytes / subpieces / fastest, bound_s / TARGET_EPOCHS, min(e.latency for e in edges))
        tau, horizon = _horizon(p, sources, edges, bound_s, fluid)
        estimate = len(sources) * len(edges) * horizon
    if estimate > settings.max_variables:
        raise NotApplicableError(
            f"mcf's model would have about {estimate} send variables ({len(sources)} pieces x {len(edges)} edges x "
            f"{horizon} epochs), above its limit of {settings.max_variables}",
            fix="use hierarchical or treepack here, or pass fewer pieces",
        )
    q = 1 if exact else subpieces
    link_capacity = {key: topology.bandwidth(*key) * tau / piece_bytes
                     for e in edges for key, _ in e.shares}
    started = time.perf_counter()
    for _ in range(3):
        model = _build(net, sources, edges, piece_bytes, tau, horizon, exact)
        solution, gap = _solve(model, exact, settings)
        if float(solution.values[model.miss].sum()) <= EPS or not solution.optimal:
            break  # done, or out of time: the rounding's repair delivers what the best solution misses
        horizon = math.ceil(1.5 * horizon)  # the horizon was too short for every piece
    transfers, repaired, epochs = _round(p, sources, edges, model, solution.values, q, link_capacity, horizon, exact)
    variables, rows = model.lp.size
    info = {
        "mode": "milp" if exact else "lp",
        "solver": solution.backend,
        "optimal": bool(solution.optimal),
        "gap": None if gap is None else round(gap, 6),
        "solve_s": round(time.perf_counter() - started, 3),
        "variables": variables,
        "rows": rows,
        "epochs": epochs,
        "horizon": horizon,
        "epoch_s": tau,
        "edges": len(edges),
        "repaired_transfers": repaired,
    }
    return FlowPlan(tuple(transfers), q, epochs, tau, info)


# --------------------------------------------------------------------------- schedules


#: Backends that solve only LPs: with one of them the model is always the relaxation.
_LP_ONLY = ("glop", "pdlp", "clp", "highs")


def _settings(options: Options) -> FlowSettings:
    """Solver choices from ``options.mcf`` (``solver``, ``time_limit_s``, ``exact``, ``max_variables``)."""
    pinned = options.mcf
    default = FlowSettings()
    limit = pinned.time_limit_s
    solver = pinned.solver
    exact = pinned.exact
    if solver in _LP_ONLY and exact is None:
        exact = False
    lp = replace(default.lp, backend=solver or default.lp.backend)
    mip = replace(default.mip, backend=solver or default.mip.backend)
    if limit is not None:
        lp, mip = replace(lp, time_limit_s=float(limit)), replace(mip, time_limit_s=float(limit))
    return FlowSettings(None if exact is None else bool(exact), lp, mip,
                        default.max_variables if pinned.max_variables is None else pinned.max_variables)


def _symmetric(net: Network) -> bool:
    """Whether every link has a reverse twin: then the reversed model is the same model."""
    topology = net.topology
    links = {(ln.src, ln.dst, ln.bandwidth, ln.latency) for ln in topology.links}
    return all((b, a, bw, lat) in links for a, b, bw, lat in links)


def _emit_gather(b: ScheduleBuilder, plan: FlowPlan, channel: int, step0: int) -> None:
    """Sub-pieces forwarded down their trees, epoch by epoch; one message at a time per rank pair."""
    last: dict[tuple[int, int], int] = {}
    for t, sp, u, v in plan.transfers:
        ref = Chunk("o", sp)  # sub-piece c * q + i is chunk c * q + i of the (whole) output
        prev = last.get((u, v))
        last[u, v] = b.send(u, v, ref, step=step0 + t, channel=channel, after=() if prev is None else (prev,))
        b.recv(v, u, ref, step=step0 + t, channel=channel)


def _emit_reduce(b: ScheduleBuilder, plan: FlowPlan, acc: str, channel: int) -> None:
    """The gather plan of the reversed topology backwards in time: partial sums flow up the trees.

    A rank receives a sub-piece in the gather plan strictly before it forwards
    it, so ordering by send epoch, latest first, emits every child's partial sum
    before its parent's.
    """
    last: dict[tuple[int, int], int] = {}
    for t, sp, u, v in sorted(plan.transfers, key=lambda x: -x[0]):
        ref = Chunk(acc, sp)
        step = plan.epochs - t
        prev = last.get((v, u))
        last[v, u] = b.send(v, u, ref, step=step, channel=channel, after=() if prev is None else (prev,))
        b.recv(u, v, ref, reduce=True, step=step, channel=channel)


def _merge(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report for one or two solves (all-reduce solves reduce-scatter and all-gather models)."""
    if len(infos) == 1:
        return dict(infos[0])
    first, second = infos
    gaps = [i["gap"] for i in infos]
    return {
        **first,
        "optimal": first["optimal"] and second["optimal"],
        "gap": None if None in gaps else max(gaps),
        "solve_s": round(first["solve_s"] + second["solve_s"], 3),
        "variables": first["variables"] + second["variables"],
        "rows": first["rows"] + second["rows"],
        "epochs": first["epochs"] + second["epochs"],
        "repaired_transfers": first["repaired_transfers"] + second["repaired_transfers"],
    }


def mcf(net: Network, collective: str, options: Options) -> Schedule:
    """Multi-commodity-flow-over-time schedule for ``collective`` (see the module docstring).

    ``options.mcf`` may set ``solver`` (a :data:`topocc.planner.solvers.BACKENDS`
    name), ``time_limit_s``, ``exact`` (True: MILP, False: LP and rounding,
    absent: MILP only for tiny models), ``pieces`` (per source) and
    ``max_variables``; ``options.pipeline`` sets the sub-pieces per piece.
    The metadata records the solver, whether it proved optimality (``optimal``,
    ``gap``) and the model's size.

    >>> schedule = mcf(Network(load_topology("topologies/dgx1-v100.yaml")), "allgather", Options())  # doctest: +SKIP
    """
    topology = net.topology
    p = topology.size
    if p > MAX_RANKS:
        raise NotApplicableError(f"mcf's time-expanded model grows with ranks x pieces x epochs; {p} ranks exceed "
                                 f"{MAX_RANKS}", fix="use hierarchical (or treepack) at this scale")
    if p == 1:
        raise NotApplicableError("mcf needs at least two ranks")
    kind = describe(collective)
    rooted = kind.rooted
    k = options.mcf.pieces or (4 if rooted else 1 if p >= 8 else 2)
    sources = [options.root] * k if rooted else [s for s in range(p) for _ in range(k)]
    piece_bytes = options.size_bytes / len(sources)
    settings = _settings(options)
    q = options.pipeline or max(1, min(MAX_SUBPIECES, int(piece_bytes // MIN_SUBPIECE_BYTES)))
    size = options.size_bytes
    gather, scatter = kind.replicates, kind.reduces  # a phase spreading data, one reducing it

    def plan(reverse: bool) -> FlowPlan:
        phase = (REDUCESCATTER if reverse else ALLGATHER) if kind is ALLREDUCE else kind
        bound = lower_bound(net, phase.name, size, options.root).time_s
        # all-reduce's gather phase runs on channel 1 (below)
        channel = 1 if kind is ALLREDUCE and not reverse else 0
        return flow_plan(net, sources, piece_bytes, subpieces=q, bound_s=bound, reverse=reverse,
                         settings=settings, channel=channel)

    down = plan(False) if gather else None
    up = (down if down is not None and _symmetric(net) else plan(True)) if scatter else None
    q = (down or up).subpieces  # type: ignore[union-attr]  # a MILP keeps pieces whole
    per_source = k * q

    n_in, n_out = kind.sizes(p, p * per_source if kind is ALLREDUCE else per_source)
    b = ScheduleBuilder(kind.name, p, n_in, n_out, scratch_chunks=n_in if kind.scatters else 0,
                        root=options.root if rooted else None)

    if kind.gathers:
        for r in range(p):
            b.copy(r, Chunk("i", 0, n_in), Chunk("o", r * per_source, n_in))
    elif kind.from_root:
        b.copy(options.root, Chunk("i", 0, n_in), Chunk("o", 0, n_in))
    else:
        acc = "s" if kind.scatters else "o"
        for r in range(p):
            b.copy(r, Chunk("i", 0, n_in), Chunk(acc, 0, n_in))
        _emit_reduce(b, up, acc, 0)  # type: ignore[arg-type]  # every reducing collective has an up plan
        if kind.scatters:
            for r in range(p):
                b.copy(r, Chunk("s", r * per_source, per_source), Chunk("o", 0, per_source))
    if down is not None:
        # all-reduce's second phase gets its own channel, so its messages never queue behind the first's
        _emit_gather(b, down, 1 if kind is ALLREDUCE else 0, up.epochs if up is not None else 0)
    infos = [x.info for x in (up, down) if x is not None]
    if up is down:
        infos = infos[:1]
    return b.build("mcf", {**options.as_dict(), "pieces": k, "subpieces": q, **_merge(infos)})
