"""Discrete-event simulation of a schedule on a topology, with max-min fair link sharing.

The model (the execution model of :mod:`topocc.runtime.schedule`, timed):

* every rank runs its program; an operation starts once all of its ``deps``
  have completed;
* the k-th send from rank a to rank b on channel c matches the k-th receive
  posted by b from a on channel c (FIFO, as the verifier matches them);
* a transfer starts when both the send and its receive have started
  (rendezvous); both complete when the data has arrived;
* a message of ``count`` chunks carries ``count * chunk_bytes`` bytes over the
  paths of its connection (sender, receiver, channel) under the topology's
  routing (:meth:`~topocc.planner.topology.model.Topology.connection_paths`: all equal-cost
  paths, split evenly, under ``spray``; one path otherwise), or over the path
  the schedule records for the connection on a source-routed topology
  (:func:`topocc.planner.routing.paths.recorded_paths`); each path's share is one *flow* over
  every link of the path, switches included.  A pair sprayed over more than
  :data:`~topocc.planner.routing.network.MAX_PATHS` paths sends each message as one flow over
  all their links, putting on each link the share of the paths through it
  (:meth:`~topocc.planner.routing.network.Network.sprayed`);
* messages on one connection (sender, receiver, channel) are transmitted one
  after another, in the order they became ready, as on a TCP stream, an MPI
  pair or an NCCL channel; the next may start as soon as the previous one's
  last byte is sent (its latency overlaps).  Independent connections run
  concurrently, so a schedule that wants parallel streams between two ranks
  says so with channels;
* all concurrently active flows share link capacities max-min fairly
  (progressive filling), recomputed whenever a flow starts or ends;
* a flow occupies all links of its path at its rate until its bytes are sent
  (a fluid model, as in SimGrid's and htsim's flow-level modes); the message
  completes when its last flow has sent its last byte plus the latency of its
  slowest path (sum of the path's link latencies, max over its paths);
* on a datasheet topology, local operations (``copy``, ``reduce``) take zero
  time: memory bandwidth is one to two orders of magnitude above link
  bandwidth, so the network dominates.  A calibrated topology
  (:mod:`topocc.planner.topology.calibration`) charges what the runtime
  spends besides the links: each message holds its connection for the
  measured fixed cost before its bytes go (so a connection's messages pay it
  one after another), and copies, reductions and the reduction of a received
  message take their bytes over the measured throughput (float32's) on their
  rank, one at a time per rank, as a host-driven replay runs them.  A link
  of a calibrated class that ``k`` of the schedule's connections cross
  carries ``bandwidth * (shared + (1 - shared) / k)`` in all: many TCP flows
  through one shaped or congested link lose part of it to losses and
  recovery, as measured (the class's ``shared``);
* an encoded message (the schedule's ``enc``) carries its encoding's bytes
  instead of the exact ones, after the sender's host has encoded it, and
  completes once the receiver's host has decoded it; a rounding copy takes
  both times (:mod:`topocc.planner.analysis.codec_costs`).

Complexity: every operation is visited a constant number of times; events at
the same instant (within a relative 1e-12) are handled as one group, so fair
shares are recomputed once per group, and only over the connected components
(flows linked by shared links) that the group touched, as SimGrid's lmm solver
does.  The flows live in numpy arrays with their finish times
(:class:`topocc.planner.analysis.fairshare.Fabric`), so a rate change costs no event; small
components get the scalar progressive filling, large ones (a fat-tree under
ECMP joins most inter-leaf flows into one) a vectorised filling whose rounds
are the distinct bottleneck levels, not the flows.  Routes are computed
once per rank pair (per connection where the routing tells channels apart)
and kept by the network (:class:`~topocc.planner.routing.network.Network`), so
a caller that simulates many schedules on one topology passes its network.

A schedule in the symmetric form (:mod:`topocc.runtime.symmetric`) whose classes the network's symmetries
carry onto each other (:mod:`~topocc.planner.analysis.automorphisms`) is replayed one rank per orbit of
those symmetries, on one link per orbit of links (:class:`_Setup`): its state is the same on every rank of
an orbit at every instant, so the representatives' events are all the events there are (fattree-1024's
all-reduce replays one rank for its 1,024).  The result is the full run's but for rounding, and but for
one choice the model leaves open: messages of one connection that become ready at one instant go in the
order the event loop reaches them, which the full run takes from rank numbers (so two ranks of an orbit
may take them in different orders) and this replay from the orbit's representative, for all its ranks.

The code follows the model's steps: :class:`_Setup` flattens the programs
(one numbering of all operations, their dependents, each message's two ends
by :mod:`topocc.runtime.matching`'s rule) and routes every connection; a
:class:`_Run` holds the run's state and its event loop; :class:`_ContentionFree`
is the same run without contention, for a lower bound (:func:`simulate_within`).
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from topocc.planner.analysis.automorphisms import Orbits, schedule_orbits
from topocc.planner.analysis.codec_costs import CodecCost, codec_costs
from topocc.planner.analysis.fairshare import SAME_INSTANT, Fabric, Route, Unshared, make_route
from topocc.planner.collector import collector_paused
from topocc.planner.errors import SimulationError
from topocc.planner.routing.load import LinkLoad
from topocc.planner.routing.network import Memo, Network, network_of
from topocc.planner.routing.paths import connection_chunks, recorded_paths
from topocc.planner.topology.calibration import link_classes_of
from topocc.planner.topology.model import Link, Topology
from topocc.runtime import matching
from topocc.runtime.bandwidth import bus_factor
from topocc.runtime.matching import Connection
from topocc.runtime.schedule import Op, Schedule

__all__ = [
    "LinkEvent", "MessageHook", "OpEvent", "SimResult", "chunk_bytes", "simulate", "simulate_within",
]

#: Connections whose routes are kept per topology (up to 16 paths each).
_ROUTE_CACHE_PAIRS = 1 << 18

_LOCAL, _SEND, _RECV = 0, 1, 2
_KIND_CODES = {"copy": _LOCAL, "reduce": _LOCAL, "send": _SEND, "recv": _RECV, "recv_reduce": _RECV}


#: Called once per message as it arrives: ``(src rank, send index, dst rank, receive index, start_s, sent_s,
#: end_s)``.  ``start_s`` is when the message went on the wire (both ends posted, its connection free),
#: ``sent_s`` when its last byte left (``end_s`` less the path latency), ``end_s`` its arrival.
MessageHook = Callable[[int, int, int, int, float, float, float], None]


@dataclass(frozen=True, slots=True)
class OpEvent:
    """When one operation ran: from the moment its dependencies were met until it completed.

    For a send or receive, ``start_s`` is when it was posted; the gap until the
    transfer began is time spent waiting for the peer.
    """

    rank: int
    index: int
    kind: str
    peer: int | None
    step: int
    channel: int
    chunk: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """A flow (one path's share of a message) occupying a link while it transmits."""

    src: str
    dst: str
    start_s: float
    end_s: float
    bytes: float
    rank_src: int
    rank_dst: int
    step: int


@dataclass(frozen=True)
class SimResult:
    """Predicted time and bandwidths of a schedule, with per-link loads.

    ``algbw_GBps`` and ``busbw_GBps`` follow nccl-tests (doc/PERFORMANCE.md):
    algbw = size / time, busbw = algbw * :func:`~topocc.runtime.bandwidth.bus_factor`, in 1e9 bytes/s.
    """

    time_s: float
    size_bytes: int
    algbw_GBps: float
    busbw_GBps: float
    link_bytes: Mapping[tuple[str, str], float]
    link_utilisation: Mapping[tuple[str, str], float]
    rank_finish_s: tuple[float, ...]
    op_events: tuple[OpEvent, ...] = field(default=(), repr=False)
    link_events: tuple[LinkEvent, ...] = field(default=(), repr=False)

    def bottlenecks(self, n: int = 5) -> list[tuple[tuple[str, str], float]]:
        """The ``n`` most utilised links (bytes / (bandwidth * time)), busiest first."""
        used = [(key, u) for key, u in self.link_utilisation.items() if u > 0]
        used.sort(key=lambda item: (-item[1], item[0]))
        return used[:n]


def chunk_bytes(schedule: Schedule, size_bytes: int) -> float:
    """Bytes per chunk: ``size_bytes`` is the larger of the input and output buffers (nccl-tests' size)."""
    return size_bytes / max(schedule.input_chunks, schedule.output_chunks)


# --------------------------------------------------------------------------- the network's links as integers


class _LinkIndex:
    """Links as integers, and routes as tuples of link indices, computed once per connection that differs."""

    def __init__(self, net: Network) -> None:
        self.net = net
        links = net.topology.links
        self.names = [(link.src, link.dst) for link in links]
        self.index = {key: i for i, key in enumerate(self.names)}
        self.bandwidth = [link.bandwidth for link in links]
        self.routes: dict[tuple[int, int, int], Route] = {}

    def route(self, src: int, dst: int, channel: int) -> Route:
        """The route of connection ``(src, dst, channel)`` under the topology's routing."""
        key = self.net.route_key(src, dst, channel)
        found = self.routes.get(key)
        if found is None:
            if len(self.routes) >= _ROUTE_CACHE_PAIRS:
                self.routes.clear()  # bounded memory: an alltoall on 1024 ranks touches a million pairs
            sprayed = self.net.sprayed(src, dst)
            found = self.routes[key] = self.indexed(self.net.connection_paths(src, dst, channel)) \
                if sprayed is None else make_route((sprayed.links,), sprayed.latency, (sprayed.shares,))
        return found

    def indexed(self, paths: tuple[tuple[Link, ...], ...]) -> Route:
        """``paths`` as a :class:`~topocc.planner.analysis.fairshare.Route` of link indices."""
        index = self.index
        return make_route(
            tuple(tuple(index[(link.src, link.dst)] for link in path) for path in paths),
            max((sum(link.latency for link in path) for path in paths), default=0.0),
        )


#: The simulator's view of a network's links (built once per network).
_LINKS = Memo("simulator: link index", _LinkIndex)


# --------------------------------------------------------------------------- the contention-free bound

#: The contention-free run records at most this many (start, link, bytes) entries for :func:`_suffix_bound`
#: (48 MiB, and three times that to sort them), and does without it beyond: a large fat-tree's all-reduce,
#: its messages sprayed over the spines, makes millions of them, and the bound is not worth that memory.
_LOADS_MAX = 1 << 21


def _suffix_bound(start: np.ndarray, link: np.ndarray, nbytes: np.ndarray, bandwidth: list[float]) -> float:
    """The latest, over links and over flows' starts t, of t plus the bytes that flows starting at t or later
    put on the link over its bandwidth, for flows given by their ``start``, ``link`` and ``nbytes``.  Where no
    flow starts earlier than given, this bounds the end: those bytes cross the link after t, at its bandwidth
    at most.  With the starts of a contention-free run it joins dependency chains and link loads, so it can
    exceed both the contention-free run's end and the busiest link's time (as for tree packing, whose chains
    load the same links one after another)."""
    order = np.lexsort((-start, link))  # by link, latest start first
    start, link, nbytes = start[order], link[order], nbytes[order]
    total = np.cumsum(nbytes)
    first = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])  # each link's first row
    before = np.repeat(total[first] - nbytes[first], np.diff(np.r_[first, link.size]))
    return float((start + (total - before) / np.asarray(bandwidth)[link]).max())


def _heavy_links(chunks: Mapping[tuple[int, int, int], int], conn_route: Mapping[tuple[int, int, int], Route],
                 bandwidth: list[float]) -> dict[tuple[int, int, int], tuple[tuple[int, float], ...]]:
    """Per connection, its paths' links (each once a path, with its flow's fraction on it) whose bytes take at
    least half the busiest link's time, from the ``chunks`` each connection sends.  :func:`_suffix_bound` over
    any links bounds the end, and a lightly loaded link seldom sets it, where keeping every link would multiply
    the entries (and the memory) by the length of the paths, for messages sprayed over many paths by their
    number too."""
    load: LinkLoad[int] = LinkLoad()
    for key, sent in chunks.items():
        route = conn_route[key]
        share = sent / len(route.paths)  # chunks a path: only the ratios matter
        for path, coefs in _fractions(route):
            load.add_fractions(path, coefs, share)
    busiest = load.busiest(bandwidth.__getitem__)
    return {key: tuple((link, c) for path, coefs in _fractions(route) for link, c in zip(path, coefs)
                       if 2 * load.get(link) >= busiest * bandwidth[link])
            for key, route in conn_route.items()}


def _fractions(route: Route) -> Iterable[tuple[tuple[int, ...], Sequence[float]]]:
    """Each path of ``route`` with the fraction of its flow on each of its links (all of it where none given)."""
    if route.coefs is not None:
        return zip(route.paths, route.coefs)
    return ((path, [1.0] * len(path)) for path in route.paths)


def _chunks(setup: _Setup) -> dict[Connection, int]:
    """Chunks sent on each connection the run replays."""
    out: dict[Connection, int] = {}
    programs, base, op_rank = setup.run_programs, setup.programs.base, setup.programs.op_rank
    for send, key in setup.programs.conn_of.items():
        i = op_rank[send]
        out[key] = out.get(key, 0) + programs[i][send - base[i]].count
    return out


def _op_chunk(op: Op) -> str:
    if op.kind == "send":
        return str(op.src)
    if op.kind in ("recv", "recv_reduce"):
        return str(op.dst)
    return f"{op.src}->{op.dst}"


def _describe(setup: _Setup, gid: int) -> str:
    base = setup.programs.base
    i = bisect.bisect_right(base, gid) - 1
    k = gid - base[i]
    op = setup.run_programs[i][k]
    peer = f" {'to' if op.kind == 'send' else 'from'} rank {op.peer}" if op.peer is not None else ""
    rank = i if setup.orbits is None else setup.orbits.reps[i]
    return f"rank {rank} op {k} ({op.kind}{peer})"


def simulate(where: Topology | Network, schedule: Schedule, size_bytes: int, *, record: bool = False,
             on_message: MessageHook | None = None, by_class: bool = True) -> SimResult:
    """Predict how long ``schedule`` takes on a topology (or its network) for a buffer of ``size_bytes``.

    See the module docstring for the model.  ``record=True`` also returns every
    operation's and every link occupation's interval (for traces): millions of
    objects on a 1024-rank schedule.  ``on_message`` is the lean alternative:
    it is called once per message as it arrives (see :data:`MessageHook`), so a
    caller keeps only what it aggregates (the HTML report keeps a few numbers
    per message).  A schedule in the symmetric form is replayed one rank per
    orbit of its symmetries (:mod:`~topocc.planner.analysis.automorphisms`)
    where it has some, unless ``by_class=False`` or events are asked for: the
    same result but for rounding and the order of a connection's messages ready
    at one instant (see the module docstring), at the cost of the orbits'
    representatives.
    Raises :class:`SimulationError` when the schedule does not fit the topology
    or cannot run (unmatched messages, deadlock).

    >>> result = simulate(topology, schedule, 1 << 26)  # doctest: +SKIP
    >>> result.busbw_GBps, result.bottlenecks(3)  # doctest: +SKIP
    """
    with collector_paused():
        setup = _Setup.of(network_of(where), schedule, size_bytes,
                          by_class=by_class and not record and on_message is None)
        result = _Run(setup, record, on_message).result_within(math.inf)
    assert result is not None  # no deadline
    return result


def simulate_within(where: Topology | Network, schedule: Schedule, size_bytes: int,
                    deadline_s: float) -> SimResult | None:
    """:func:`simulate`, given up once the simulated clock passes ``deadline_s`` with work left: None then, as
    the schedule takes longer.  ``auto`` times a candidate so against the best so far: a candidate several
    times slower than the leader is given up after a fraction of its own simulation.

    Against a deadline a lower bound comes first, from a run without contention (:class:`_ContentionFree`)
    at a fraction of the cost, and the schedule is given up if that passes the deadline already: a schedule
    of long chains of dependent messages (tree packing's on a large fat-tree) is then rejected in a small part
    of the time its full simulation would take to pass the deadline.  Both runs start from one set-up.
    """
    with collector_paused():
        setup = _Setup.of(network_of(where), schedule, size_bytes)
        if math.isfinite(deadline_s):
            bound = _ContentionFree(setup).result_within(deadline_s)
            if bound is None or bound.time_s > deadline_s:
                return None
        return _Run(setup).result_within(deadline_s)


def _bound(where: Topology | Network, schedule: Schedule, size_bytes: int, by_class: bool = True) -> SimResult:
    """The result of the run without contention (:class:`_ContentionFree`): its time bounds :func:`simulate`'s
    from below."""
    with collector_paused():
        setup = _Setup.of(network_of(where), schedule, size_bytes, by_class=by_class)
        result = _ContentionFree(setup).result_within(math.inf)
    assert result is not None  # no deadline
    return result


# --------------------------------------------------------------------------- the set-up: programs and routes


@dataclass(frozen=True, slots=True)
class _Programs:
    """Every rank's operations under one numbering (rank r's k-th is ``base[r] + k``), as flat lists."""

    base: list[int]  # each rank's first operation, then the number of operations
    kinds: list[int]  # _LOCAL, _SEND or _RECV
    deps: list[int]  # how many operations each one depends on
    op_rank: list[int]
    dependents: list[list[int] | None]  # the operations that depend on each (None: none do)
    partner: list[int]  # the other end of each message; -1 for a local operation
    conn_of: dict[int, Connection]  # each send's connection
    connections: list[Connection]  # every connection, in order of first use


def _numbered(programs: Sequence[Sequence[Op]], ranks: Sequence[int], where: str
              ) -> tuple[list[int], list[int], list[int], list[int]]:
    """``programs`` (of ``ranks``) under one numbering: each one's first operation (then the total), and every
    operation's kind code, number of dependencies and program (its position in ``programs``)."""
    base: list[int] = []
    kinds: list[int] = []
    deps: list[int] = []
    op_rank: list[int] = []
    for i, (rank, program) in enumerate(zip(ranks, programs)):
        base.append(len(kinds))
        try:
            kinds += [_KIND_CODES[op.kind] for op in program]
        except KeyError as exc:
            raise SimulationError(f"rank {rank}: unknown operation {exc.args[0]!r}", where=where) from None
        deps += [len(op.deps) for op in program]
        op_rank += [i] * len(program)
    base.append(len(kinds))
    return base, kinds, deps, op_rank


def _flatten(schedule: Schedule, where: str) -> _Programs:
    """The programs under one numbering, each message's ends paired (see :func:`_match`)."""
    base, kinds, deps, op_rank = _numbered(schedule.programs, range(schedule.ranks), where)
    streams = _streams(schedule, where)
    partner, conn_of = _match(streams, base)
    return _Programs(base, kinds, deps, op_rank, _dependents(schedule.programs, base), partner, conn_of,
                     list(streams))


def _flatten_orbits(schedule: Schedule, orbits: Orbits, where: str) -> _Programs | None:
    """The programs of the orbits' representatives under one numbering, each message's ends paired: the other
    end of a representative's message is an operation of some rank of another orbit, which stands for the
    operation at the same place in its representative's program (the symmetries carry one program onto the
    other).  None where the pairing is not one to one (a schedule the full simulation rejects)."""
    reps = orbits.reps
    programs = [schedule.programs[r] for r in reps]
    base, kinds, deps, op_rank = _numbered(programs, reps, where)
    slot = {r: i for i, r in enumerate(reps)}
    rep_of = orbits.rep_of
    read: dict[int, dict[tuple[bool, int, int, int], int]] = {}  # per peer read: its messages' places

    sym = schedule.symmetry
    among = np.array(reps, dtype=np.int64)

    def places(rank: int) -> dict[tuple[bool, int, int, int], int]:
        """Where each of ``rank``'s messages with a representative sits in its program, by (sends, peer,
        channel, sequence number): from its class's template where the schedule has one, without building
        the program."""
        found = read.get(rank)
        if found is None:
            messages = (sym.stream_keys(rank, among) if sym is not None
                        else [(k, key) for k, op in enumerate(schedule.programs[rank])
                              if (key := matching.stream_key(op)) is not None])
            keys = [key for _, key in messages]
            found = read[rank] = {(*key, seq): k for (k, key), seq in zip(messages, matching.numbered(keys))}
        return found

    partner = [-1] * base[-1]
    conn_of: dict[int, Connection] = {}
    connections: dict[Connection, None] = {}
    for i, rank in enumerate(reps):
        program = programs[i]
        for k, seq in enumerate(matching.sequence_numbers(program)):
            if seq < 0:
                continue
            op = program[k]
            peer = op.peer
            assert peer is not None  # a message has a peer
            sending = op.kind == "send"
            there = places(peer).get((not sending, rank, op.channel, seq))
            if there is None:
                return None
            gid = base[i] + k
            partner[gid] = base[slot[int(rep_of[peer])]] + there
            if sending:
                key = conn_of[gid] = (rank, peer, op.channel)
                connections[key] = None
    if any(partner[other] != gid for gid, other in enumerate(partner) if other >= 0):
        return None
    return _Programs(base, kinds, deps, op_rank, _dependents(programs, base), partner, conn_of, list(connections))


def _dependents(programs: Sequence[Sequence[Op]], base: list[int]) -> list[list[int] | None]:
    """For every operation, the operations that depend on it, in program order (None where none does)."""
    dependents: list[list[int] | None] = [None] * base[-1]
    for first, program in zip(base, programs):
        for g, op in enumerate(program, first):
            for d in op.deps:
                found = dependents[first + d]
                if found is None:
                    dependents[first + d] = [g]
                else:
                    found.append(g)
    return dependents


def _streams(schedule: Schedule, where: str) -> dict[Connection, matching.Stream]:
    """Every connection's stream (:mod:`topocc.runtime.matching`), once each is matched and joins two distinct
    ranks."""
    streams = matching.streams(schedule)
    for (src, dst, ch), stream in streams.items():
        if not stream.matched:
            raise SimulationError(
                f"rank {src} sends {len(stream.sends)} message(s) to rank {dst}{f' on channel {ch}' if ch else ''} "
                f"but rank {dst} receives {len(stream.recvs)}", where=where,
                fix="verify the schedule first (topocc.planner.analysis.verify)",
            )
    for src, dst, _ in streams:
        if src == dst or not all(isinstance(r, int) and 0 <= r < schedule.ranks for r in (src, dst)):
            raise SimulationError(f"a message from rank {src!r} to rank {dst!r}: not a pair of distinct ranks",
                                  where=where, fix="verify the schedule first (topocc.planner.analysis.verify)")
    return streams


def _match(streams: Mapping[Connection, matching.Stream], base: list[int]) -> tuple[list[int], dict[int, Connection]]:
    """Each operation's partner (-1 for a local one), and each send's connection."""
    partner = [-1] * base[-1]
    conn_of: dict[int, Connection] = {}
    for key, stream in streams.items():
        first_send, first_recv = base[key[0]], base[key[1]]
        for s, r in stream.messages():
            send, recv = first_send + s, first_recv + r
            partner[send] = recv
            partner[recv] = send
            conn_of[send] = key
    return partner, conn_of


def _routes(net: Network, schedule: Schedule, connections: list[Connection], where: str) -> dict[Connection, Route]:
    """Every connection's route: the path the schedule records for it where the topology allows that (source
    routing), else the topology's routing."""
    for src, dst in sorted({key[:2] for key in connections}):
        if not net.has_route(src, dst):
            raise SimulationError(
                f"rank {src} sends to rank {dst}, but no route joins them without passing through another GPU",
                where=where, fix=f"relay the data through a rank that has a route to rank {dst}",
            )
    index = net.memo(_LINKS)
    recorded = recorded_paths(net, schedule)
    return {key: index.indexed((recorded[key],)) if key in recorded else index.route(*key) for key in connections}


@dataclass(frozen=True, slots=True)
class _Setup:
    """What a run starts from: the schedule checked against the topology, its programs flattened, its routes.
    Runs only read it, so several may start from one.

    A run by class (``orbits`` given) replays one rank per orbit of the schedule's symmetries
    (:mod:`~topocc.planner.analysis.automorphisms`) on one link per link orbit.  Every rank of an orbit sends
    a copy of each message of its representative, so the ``N`` copies of a flow put ``N m / |O|`` flows on each
    link of an orbit ``O`` that its path crosses ``m`` times: the orbit stands for its links with capacity
    ``c |O| / N``, a path crossing it ``m`` times counts ``m`` times, and the fair shares are the full run's
    (its state is the same on every member of an orbit, so every link of ``O`` saturates at the same level).
    """

    schedule: Schedule
    size_bytes: int
    where: str  # the schedule and topology, for errors
    links: _LinkIndex
    programs: _Programs
    routes: dict[Connection, Route]
    route_links: dict[Connection, tuple[int, ...]]  # every path's links one after the other, per connection
    bandwidth: list[float]  # each link's capacity for this schedule (below its figure where flows contend)
    codecs: Mapping[int, CodecCost]  # each encoded send's and rounding copy's costs, by operation number
    run_programs: Sequence[tuple[Op, ...]]  # the programs replayed: every rank's, or each orbit's representative's
    alone: list[float]  # each link's bandwidth as one flow alone on it sees it
    orbits: Orbits | None = None  # the orbits replayed by class

    @staticmethod
    def of(net: Network, schedule: Schedule, size_bytes: int, *, by_class: bool = True) -> _Setup:
        """The set-up of a run by class where ``by_class`` and the schedule's symmetries allow it (see the
        class docstring), else of a run of every rank."""
        topology = net.topology
        where = f"{schedule.collective} schedule ({schedule.metadata.algorithm}) on {topology.name}"
        if schedule.ranks != topology.size:
            raise SimulationError(
                f"the schedule has {schedule.ranks} ranks but the topology has {topology.size}", where=where,
                fix=f"compile the schedule for this topology, or simulate it on a topology with {schedule.ranks} "
                    "ranks",
            )
        if size_bytes < 0:
            raise SimulationError(f"negative size {size_bytes}", where=where)
        if by_class and schedule.symmetry is not None and net.memo(_SHARED) is None:
            found = _Setup.by_class(net, schedule, size_bytes, where)
            if found is not None:
                return found
        links = net.memo(_LINKS)
        flat = _flatten(schedule, where)
        routes = _routes(net, schedule, flat.connections, where)
        route_links = _route_links(routes)
        bandwidth = _shared_bandwidth(net, links, route_links)
        codecs = codec_costs(schedule.programs, flat.base, chunk_bytes(schedule, size_bytes), topology.calibration)
        return _Setup(schedule, size_bytes, where, links, flat, routes, route_links, bandwidth, codecs,
                      schedule.programs, bandwidth)


    @staticmethod
    def by_class(net: Network, schedule: Schedule, size_bytes: int, where: str) -> _Setup | None:
        """The set-up of a run by class (see the class docstring), or None where the schedule has no
        symmetries on this network."""
        orbits = schedule_orbits(net, schedule)
        flat = None if orbits is None else _flatten_orbits(schedule, orbits, where)
        if orbits is None or flat is None:
            return None
        links = net.memo(_LINKS)
        programs = [schedule.programs[r] for r in orbits.reps]
        orbit_of = orbits.link_orbit.tolist()
        routes = {key: _on_orbits(route, orbit_of) for key, route in _routes(net, schedule, flat.connections,
                                                                             where).items()}
        alone = [0.0] * len(orbits.link_count)
        for k, o in enumerate(orbit_of):
            alone[o] = links.bandwidth[k]  # the same on every link of an orbit
        bandwidth = [c * n / orbits.copies for c, n in zip(alone, orbits.link_count.tolist())]
        codecs = codec_costs(programs, flat.base, chunk_bytes(schedule, size_bytes), net.topology.calibration)
        return _Setup(schedule, size_bytes, where, links, flat, routes, _route_links(routes), bandwidth, codecs,
                      programs, alone, orbits)


def _on_orbits(route: Route, orbit_of: list[int]) -> Route:
    """``route`` on the link orbits: each link replaced by its orbit, a path crossing an orbit twice counting
    it twice; a path with fractions puts their sum on each orbit it crosses (one entry each: a sprayed message
    crosses thousands of links of a few orbits)."""
    if route.coefs is None:
        return make_route(tuple(tuple(orbit_of[k] for k in path) for path in route.paths), route.latency)
    paths, coefs = [], []
    for path, fractions in zip(route.paths, route.coefs):
        summed: dict[int, float] = {}
        for k, c in zip(path, fractions):
            o = orbit_of[k]
            summed[o] = summed.get(o, 0.0) + c
        paths.append(tuple(summed))
        coefs.append(tuple(summed.values()))
    return make_route(tuple(paths), route.latency, tuple(coefs))


def _route_links(routes: Mapping[Connection, Route]) -> dict[Connection, tuple[int, ...]]:
    """Every route's paths' links one after the other."""
    return {key: tuple(link for path in route.paths for link in path) for key, route in routes.items()}


def _shared_bandwidth(net: Network, links: _LinkIndex, route_links: Mapping[Connection, tuple[int, ...]]
                      ) -> list[float]:
    """The links' capacities for a schedule whose connections take ``route_links``: a calibrated class's link
    crossed by ``k`` connections carries ``bandwidth * (shared + (1 - shared) / k)``; every other link its
    bandwidth."""
    shared = net.memo(_SHARED)
    if shared is None:
        return links.bandwidth
    crossing = [0] * len(links.bandwidth)
    for route in route_links.values():
        for link in set(route):
            crossing[link] += 1
    out = links.bandwidth.copy()
    for i, (s, k) in enumerate(zip(shared, crossing)):
        if k > 1 and s < 1.0:
            out[i] *= s + (1.0 - s) / k
    return out


def _link_shares(net: Network) -> list[float] | None:
    """Each link's ``shared`` (by the simulator's link index) from its class's calibration, 1.0 where none; None
    where no calibrated class shares less than all (every link keeps its bandwidth)."""
    cal = net.topology.calibration
    if cal is None or all(f.shared >= 1.0 for f in cal.links.values()):
        return None
    classes = link_classes_of(net.topology)
    return [f.shared if (f := cal.links.get(classes[name])) is not None else 1.0 for name in net.memo(_LINKS).names]


#: The calibrated ``shared`` of every link, found once per network (``auto`` simulates many schedules on one).
_SHARED = Memo("simulator: calibrated link shares", _link_shares)


# --------------------------------------------------------------------------- the run


class _Run:
    """One simulation's state, with the steps of its event loop as methods (see the module docstring).

    Operations start as their dependencies complete (:meth:`start_op`); a message whose two ends are posted
    waits for its connection (:meth:`message_ready`), goes on the wire as flows (:meth:`start_message`),
    frees its connection when its last byte is out (:meth:`release`) and completes both ends when it has
    arrived (:meth:`message_done`).  :meth:`run` moves the clock from instant to instant.
    """

    __slots__ = ("arrivals", "base", "chunk_bytes", "codecs", "conn_links", "conn_of", "conn_queue", "copy_Bps",
                 "cpu_free",
                 "dependents", "fabric", "finished", "kinds", "launches", "link_bytes", "link_events", "local_done",
                 "message_s", "msg_start", "on_message", "op_events", "op_rank", "partner", "posted", "programs",
                 "rank_finish", "ready", "reduce_Bps", "routes", "setup", "start_time", "waiting")

    def __init__(self, setup: _Setup, record: bool = False, on_message: MessageHook | None = None) -> None:
        flat = setup.programs
        total = flat.base[-1]
        self.setup = setup
        self.programs = setup.run_programs
        self.base, self.kinds, self.op_rank = flat.base, flat.kinds, flat.op_rank
        self.dependents, self.partner, self.conn_of = flat.dependents, flat.partner, flat.conn_of
        self.waiting = waiting = flat.deps.copy()  # dependencies not yet completed, counted down
        self.routes = setup.routes
        self.conn_links = setup.route_links  # a message adds its share to each link, in this order
        self.chunk_bytes = chunk_bytes(setup.schedule, setup.size_bytes)
        self.on_message = on_message
        self.fabric: Fabric | Unshared = self.make_fabric(setup.bandwidth, total, record)
        self.conn_queue: dict[Connection, deque[int]] = {}  # busy connections and their waiting messages
        self.posted = [False] * total
        self.finished = bytearray(total)
        self.start_time = [0.0] * total if record else None
        self.rank_finish = [0.0] * len(self.programs)
        self.link_bytes = [0.0] * len(setup.bandwidth)
        self.msg_start: dict[int, float] = {}  # when each message in flight went on the wire (only for on_message)
        self.arrivals: list[tuple[float, int]] = []  # (time, send): a message's last byte arrives after its latency
        self.op_events: list[OpEvent] = []
        self.link_events: list[LinkEvent] = []
        self.ready = [i for i in range(total) if not waiting[i]]
        cal = setup.links.net.topology.calibration
        inf = math.inf
        self.message_s = cal.host.message_s if cal is not None else 0.0
        self.copy_Bps = cal.host.copy_Bps if cal is not None else inf
        self.reduce_Bps = cal.host.reduce_rate() if cal is not None else inf
        self.cpu_free = [0.0] * len(self.programs)  # when each rank's host is done with its local work
        self.launches: list[tuple[float, int]] = []  # (time, send): a message's bytes go once its fixed cost is paid
        self.codecs = setup.codecs
        self.local_done: list[tuple[float, int]] = []  # (time, op): local work that ends later than it starts

    def make_fabric(self, bandwidth: list[float], messages: int, record: bool) -> Fabric | Unshared:
        """The links' model: max-min fair sharing."""
        return Fabric(bandwidth, messages, record)

    # ---- operations

    def drain(self, now: float) -> None:
        """Start every ready operation at ``now``, in the order they became ready; local ones complete at once."""
        ready, start_op = self.ready, self.start_op
        while ready:
            batch = ready.copy()
            ready.clear()
            for op in batch:
                start_op(op, now)

    def start_op(self, op: int, now: float) -> None:
        """Start an operation whose dependencies have completed: post a send or receive, run a local one."""
        if self.start_time is not None:
            self.start_time[op] = now
        kind = self.kinds[op]
        if kind == _LOCAL:
            codec = self.codecs.get(op)
            if codec is not None:  # a rounding copy: encode and decode on the host
                self.busy(op, now, codec.encode_s + codec.decode_s)
            elif self.copy_Bps == self.reduce_Bps == math.inf:
                self.complete(op, now)
            else:
                self.local_work(op, now, self.reduce_Bps if self.op_kind(op) == "reduce" else self.copy_Bps)
            return
        posted = self.posted
        posted[op] = True
        other = self.partner[op]
        if posted[other]:
            self.message_ready(op if kind == _SEND else other, now)

    def op_kind(self, op: int) -> str:
        """The kind of operation ``op`` (``copy``, ``reduce``, ``send``, ...)."""
        r = self.op_rank[op]
        return self.programs[r][op - self.base[r]].kind

    def local_work(self, op: int, now: float, rate: float) -> None:
        """Operation ``op`` works on its bytes at ``rate`` on its rank's host, after the work queued there; it
        completes at once where that takes no time (a datasheet topology)."""
        if rate == math.inf:
            self.complete(op, now)
            return
        r = self.op_rank[op]
        self.busy(op, now, self.programs[r][op - self.base[r]].count * self.chunk_bytes / rate)

    def busy(self, op: int, now: float, seconds: float) -> None:
        """Operation ``op`` keeps its rank's host busy ``seconds``, after the work queued there, then completes."""
        r = self.op_rank[op]
        start = max(now, self.cpu_free[r])
        end = self.cpu_free[r] = start + seconds
        if end <= now:
            self.complete(op, now)
        else:
            heapq.heappush(self.local_done, (end, op))

    def complete(self, op: int, now: float) -> None:
        """Operation ``op`` completes at ``now``: the operations waiting for it may become ready."""
        self.finished[op] = 1
        r = self.op_rank[op]
        rank_finish = self.rank_finish
        if now > rank_finish[r]:
            rank_finish[r] = now
        if self.start_time is not None:
            self.op_events.append(self.op_event(op, now))
        deps_of = self.dependents[op]
        if deps_of is not None:
            waiting, ready = self.waiting, self.ready
            for j in deps_of:
                waiting[j] -= 1
                if not waiting[j]:
                    ready.append(j)

    def op_event(self, op: int, now: float) -> OpEvent:
        """The recorded interval of operation ``op``, which completes at ``now``."""
        r = self.op_rank[op]
        k = op - self.base[r]
        o = self.programs[r][k]
        assert self.start_time is not None
        return OpEvent(r, k, o.kind, o.peer, o.step, o.channel, _op_chunk(o), self.start_time[op], now)

    # ---- messages

    def message_ready(self, send: int, now: float) -> None:
        """Both ends of a message are posted: it goes on the wire once its connection's earlier messages are."""
        key = self.conn_of[send]
        queue = self.conn_queue.get(key)
        if queue is not None:  # the connection is busy: wait for its current message's last byte
            queue.append(send)
            return
        self.conn_queue[key] = deque()
        self.start_message(send, now)

    def start_message(self, send: int, now: float) -> None:
        """The message holds its connection from ``now``: its bytes go once its fixed cost is paid (and its
        sender's host has encoded it)."""
        codec = self.codecs.get(send)
        if codec is not None:
            r = self.op_rank[send]
            done = self.cpu_free[r] = max(now, self.cpu_free[r]) + codec.encode_s
            if self.on_message is not None:
                self.msg_start[send] = now
            heapq.heappush(self.launches, (done + self.message_s, send))
        elif self.message_s > 0.0:
            if self.on_message is not None:
                self.msg_start[send] = now
            heapq.heappush(self.launches, (now + self.message_s, send))
        else:
            self.launch(send, now)

    def launch(self, send: int, now: float) -> None:
        """Put a message on the wire: one flow per path of its connection."""
        src = self.op_rank[send]
        key = self.conn_of[send]
        route = self.routes[key]
        codec = self.codecs.get(send)
        nbytes = codec.wire_bytes if codec is not None else self.programs[src][send - self.base[src]].count * \
            self.chunk_bytes
        if self.on_message is not None:
            self.msg_start.setdefault(send, now)
        if nbytes <= 0.0:
            self.release(send, now)
            heapq.heappush(self.arrivals, (now + route.latency, send))
            return
        share = nbytes / len(route.paths)
        link_bytes = self.link_bytes
        if route.coefs is None:
            for link in self.conn_links[key]:
                link_bytes[link] += share
        else:
            for path, coefs in zip(route.paths, route.coefs):
                for link, c in zip(path, coefs):
                    link_bytes[link] += share * c
        self.on_wire(key, share, now)
        self.fabric.add(send, route, share)

    def on_wire(self, key: Connection, share: float, now: float) -> None:
        """A message of connection ``key`` went on the wire at ``now``, ``share`` bytes on each of its paths."""

    def release(self, send: int, now: float) -> None:
        """The message's last byte is out: start the next message queued on its connection."""
        key = self.conn_of[send]
        queue = self.conn_queue[key]
        if queue:
            self.start_message(queue.popleft(), now)
        else:
            del self.conn_queue[key]

    def message_done(self, send: int, now: float) -> None:
        """The message has arrived: both of its ends complete."""
        recv = self.partner[send]
        self.complete(send, now)
        codec = self.codecs.get(send)
        reduces = self.reduce_Bps != math.inf and self.op_kind(recv) == "recv_reduce"
        if codec is not None:  # decoded on receipt, then reduced
            r = self.op_rank[recv]
            reduce_s = self.programs[r][recv - self.base[r]].count * self.chunk_bytes / self.reduce_Bps if reduces \
                else 0.0
            self.busy(recv, now, codec.decode_s + reduce_s)
        elif reduces:
            self.local_work(recv, now, self.reduce_Bps)
        else:
            self.complete(recv, now)
        if self.on_message is not None:
            op_rank, base = self.op_rank, self.base
            src, dst = op_rank[send], op_rank[recv]
            latency = self.routes[self.conn_of[send]].latency
            self.on_message(src, send - base[src], dst, recv - base[dst], self.msg_start.pop(send), now - latency, now)

    # ---- the clock

    def result_within(self, deadline_s: float) -> SimResult | None:
        """The result, or None once the clock passes ``deadline_s`` with work left."""
        return self.result() if self.run(deadline_s) else None

    def run(self, deadline_s: float) -> bool:
        """Handle instants until no event is left (True) or the clock passes ``deadline_s`` with work left."""
        fabric, arrivals, launches, local_done = self.fabric, self.arrivals, self.launches, self.local_done
        heappop = heapq.heappop
        self.drain(0.0)
        fabric.reallocate(0.0)
        inf = math.inf
        while True:
            flows_end = fabric.next_end()
            now = min(flows_end, arrivals[0][0]) if arrivals else flows_end
            if launches and launches[0][0] < now:
                now = launches[0][0]
            if local_done and local_done[0][0] < now:
                now = local_done[0][0]
            if now == inf:
                return True
            if now > deadline_s:  # work is left, and it ends at ``now`` or later
                return False
            limit = now + SAME_INSTANT * now  # events this close are one instant
            self.messages_end(self.flows_end(now, limit) if flows_end <= limit else [], now, limit)
            while local_done and local_done[0][0] <= limit:
                self.complete(heappop(local_done)[1], now)
            while launches and launches[0][0] <= limit:
                self.launch(heappop(launches)[1], now)
            self.drain(now)
            if fabric.touched or fabric.pending:
                fabric.reallocate(now)

    def flows_end(self, now: float, limit: float) -> list[tuple[float, int]]:
        """Retire the flows that end by ``limit``; returns the messages whose last flow ended, as (time, send)."""
        fabric = self.fabric
        done = fabric.finish(limit)
        if isinstance(fabric, Fabric) and fabric.ended:  # recorded flows
            names, op_rank, partner, programs, base = self.setup.links.names, self.op_rank, self.partner, \
                self.programs, self.base
            for send, pid, start, nbytes in fabric.ended:
                src, dst = op_rank[send], op_rank[partner[send]]
                step = programs[src][send - base[src]].step
                coefs = fabric.fractions.get(pid)
                self.link_events.extend(
                    LinkEvent(*names[link], start, now, nbytes if coefs is None else nbytes * coefs[i], src, dst, step)
                    for i, link in enumerate(fabric.paths[pid]))
            fabric.ended.clear()
        return done

    def messages_end(self, done: list[tuple[float, int]], now: float, limit: float) -> None:
        """Messages whose last flow ended (``done``) and messages whose last byte arrives by ``limit``, in the
        order of their times (a flow's end before an arrival at the same time), then of their sends."""
        arrivals, fabric = self.arrivals, self.fabric
        heappop, heappush = heapq.heappop, heapq.heappush
        inf = math.inf
        i = 0
        while True:
            arrival = arrivals[0][0] if arrivals and arrivals[0][0] <= limit else inf
            if i < len(done) and done[i][0] <= arrival:
                msg = done[i][1]
                i += 1
                latency = fabric.close(msg)
                self.release(msg, now)
                if latency > 0.0:
                    heappush(arrivals, (now + latency, msg))
                else:
                    self.message_done(msg, now)
            elif arrival != inf:
                self.message_done(heappop(arrivals)[1], now)
            else:
                break

    # ---- the result

    def time_s(self) -> float:
        """When the last rank finished."""
        return max(self.rank_finish, default=0.0)

    def result(self) -> SimResult:
        """The result of a run that handled every event; a :class:`SimulationError` if some operation never ran."""
        finished = self.finished
        if finished.count(1) != len(finished):
            raise self.deadlock()
        time_s = self.time_s()
        setup = self.setup
        size_bytes = setup.size_bytes
        names, bandwidth, link_bytes = setup.links.names, setup.links.bandwidth, self.link_bytes
        rank_finish: Sequence[float] = self.rank_finish
        if setup.orbits is not None:  # each rank finishes with its representative, each link carries its orbit's
            orbits = setup.orbits
            slot = {r: i for i, r in enumerate(orbits.reps)}
            rank_finish = [rank_finish[slot[r]] for r in orbits.rep_of.tolist()]
            per_link = [b * orbits.copies / n for b, n in zip(link_bytes, orbits.link_count.tolist())]
            link_bytes = [per_link[o] for o in orbits.link_orbit.tolist()]
        algbw = size_bytes / time_s / 1e9 if time_s > 0 else 0.0
        util = {
            names[i]: (link_bytes[i] / (bandwidth[i] * time_s) if time_s > 0 else 0.0) for i in range(len(names))
        }
        self.op_events.sort(key=lambda e: (e.start_s, e.rank, e.index))
        self.link_events.sort(key=lambda e: (e.start_s, e.src, e.dst))
        schedule = setup.schedule
        return SimResult(
            time_s=time_s,
            size_bytes=size_bytes,
            algbw_GBps=algbw,
            busbw_GBps=algbw * bus_factor(schedule.collective, schedule.ranks),
            link_bytes=MappingProxyType({names[i]: link_bytes[i] for i in range(len(names))}),
            link_utilisation=MappingProxyType(util),
            rank_finish_s=tuple(rank_finish),
            op_events=tuple(self.op_events),
            link_events=tuple(self.link_events),
        )

    def deadlock(self) -> SimulationError:
        """Which operation never completed: one that was posted if any, else the first."""
        finished, total = self.finished, len(self.finished)
        stuck = next((i for i in range(total) if self.posted[i] and not finished[i]), None)
        if stuck is None:
            stuck = next(i for i in range(total) if not finished[i])
        copies = 1 if self.setup.orbits is None else self.setup.orbits.copies  # each replayed rank's
        return SimulationError(
            f"deadlock: {copies * finished.count(1)} of {copies * total} operations completed; "
            f"{_describe(self.setup, stuck)} never did",
            where=self.setup.where, fix="verify the schedule first (topocc.planner.analysis.verify)",
        )


class _ContentionFree(_Run):
    """A run that bounds the simulation's time from below.

    Every message goes on the wire as soon as both its operations are posted (its connection's earlier
    messages need not be out) and each of its flows runs at its path's narrowest bandwidth
    (:class:`~topocc.planner.analysis.fairshare.Unshared`).  Each event is then the latest of the events it
    waits for plus a duration no longer than the simulation's (a fair share never exceeds a path's narrowest
    link, and a connection's order only adds waits), so by induction over the operations no event comes later
    than in the simulation.  So no flow starts earlier there either, and the time is also at least
    :func:`_suffix_bound` of the flows' starts here.
    """

    __slots__ = ("heavy", "loads")

    def __init__(self, setup: _Setup) -> None:
        super().__init__(setup)
        chunks = connection_chunks(setup.schedule) if setup.orbits is None else _chunks(setup)
        self.heavy = _heavy_links(chunks, setup.routes, setup.bandwidth)
        # each flow's start, link and bytes, per link it crosses of those it keeps (see _heavy_links)
        self.loads = (array("d"), array("q"), array("d"))

    def make_fabric(self, bandwidth: list[float], messages: int, record: bool) -> Fabric | Unshared:
        """The links' model: every flow alone on its path."""
        return Unshared(self.setup.alone)

    def on_wire(self, key: Connection, share: float, now: float) -> None:
        """Keep the message's flows' bytes on the heavily loaded links, for the bound."""
        loads = self.loads
        if len(loads[0]) < _LOADS_MAX:
            links = self.heavy[key]
            loads[0].extend([now] * len(links))
            loads[1].extend(link for link, _ in links)
            loads[2].extend(share * c for _, c in links)

    #: A message goes on the wire as soon as both its ends are posted (and its fixed cost is paid): no
    #: connection is waited for.
    message_ready = _Run.start_message

    def release(self, send: int, now: float) -> None:
        """Nothing waits for a connection here."""

    def time_s(self) -> float:
        """When the last rank finished, or later where the links' loads say so (unless some were not kept)."""
        time_s = super().time_s()
        loads = self.loads
        if 0 < len(loads[0]) < _LOADS_MAX:
            start, link, nbytes = (np.frombuffer(column, dtype=column.typecode) for column in loads)
            time_s = max(time_s, _suffix_bound(start, link, nbytes, self.setup.bandwidth))
        return time_s
