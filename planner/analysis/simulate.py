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
  every link of the path, switches included;
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
* local operations (``copy``, ``reduce``) take zero time: memory bandwidth is
  one to two orders of magnitude above link bandwidth, so the network
  dominates; a model that charges them would go here.

Complexity: every operation is visited a constant number of times; events at
the same instant (within a relative 1e-12) are handled as one group, so fair
shares are recomputed once per group, and only over the connected components
(flows linked by shared links) that the group touched, as SimGrid's lmm solver
does.  The flows live in numpy arrays with their finish times
(:class:`topocc.planner.analysis.fairshare.Fabric`), so a rate change costs no event; small
components get the scalar progressive filling, large ones (a fat-tree under
ECMP joins most inter-leaf flows into one) a vectorised filling whose rounds
are the distinct bottleneck levels, not the flows.  Halving-doubling on
fattree-1024 at 256 MiB (21k messages, ~1000 flows contending on spines)
takes about 17 s of CPU.  Routes are computed once per rank pair (per
connection where the routing tells channels apart) and kept by the network
(:class:`~topocc.planner.routing.network.Network`), so a caller that simulates
many schedules on one topology passes its network.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from topocc.planner.errors import SimulationError
from topocc.planner.analysis.fairshare import SAME_INSTANT, Fabric, Route, Unshared, make_route
from topocc.planner.routing.paths import connection_chunks, recorded_paths
from topocc.planner.routing.network import Memo, Network, network_of
from topocc.planner.topology.model import Link, Topology
from topocc.runtime.schedule import Op, Schedule

__all__ = [
    "LinkEvent", "MessageHook", "OpEvent", "SimResult", "bus_factor", "chunk_bytes", "simulate", "simulate_within",
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
    algbw = size / time, busbw = algbw * :func:`bus_factor`, in 1e9 bytes/s.
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


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for a collective on ``ranks`` ranks (nccl-tests doc/PERFORMANCE.md).

    >>> bus_factor("allreduce", 8)
    1.75
    """
    n = ranks
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise SimulationError(f"unknown collective {collective!r}")


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
            found = self.routes[key] = self.indexed(self.net.connection_paths(src, dst, channel))
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


# --------------------------------------------------------------------------- the simulation

#: The contention-free run records at most this many (start, link, bytes) entries for :func:`_suffix_bound`
#: (48 MiB, and three times that to sort them), and does without it beyond: fattree-1024's all-reduce at
#: 256 MiB, sprayed over its spines, made 5.5M of them (550 MiB at the peak).
_LOADS_MAX = 1 << 21


def _suffix_bound(start: np.ndarray, link: np.ndarray, nbytes: np.ndarray, bandwidth: list[float]) -> float:
    """The latest, over links and over flows' starts t, of t plus the bytes that flows starting at t or later
    put on the link over its bandwidth, for flows given by their ``start``, ``link`` and ``nbytes``.  Where no
    flow starts earlier than given, this bounds the end: those bytes cross the link after t, at its bandwidth
    at most.  With the starts of a contention-free run it joins dependency chains and link loads (tree
    packing's all-reduce on ibm-s822lc-48x4 at 1 MiB: 254.9 us, where the run ends at 206.5 us and the
    busiest link needs 209.2 us)."""
    order = np.lexsort((-start, link))  # by link, latest start first
    start, link, nbytes = start[order], link[order], nbytes[order]
    total = np.cumsum(nbytes)
    first = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])  # each link's first row
    before = np.repeat(total[first] - nbytes[first], np.diff(np.r_[first, link.size]))
    return float((start + (total - before) / np.asarray(bandwidth)[link]).max())


def _heavy_links(chunks: Mapping[tuple[int, int, int], int], conn_route: Mapping[tuple[int, int, int], Route],
                 bandwidth: list[float]) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """Per connection, its paths' links (each once a path) whose bytes take at least half the busiest link's
    time, from the ``chunks`` each connection sends.  :func:`_suffix_bound` over any links bounds the end,
    and a lightly loaded link seldom sets it; all of them held fattree-1024's all-reduce at 256 MiB, its
    messages sprayed over the spines, to 800 MiB more memory."""
    load = [0.0] * len(bandwidth)
    for key, sent in chunks.items():
        paths = conn_route[key].paths
        share = sent / len(paths)  # chunks a path: only the ratios matter
        for path in paths:
            for link in path:
                load[link] += share
    busiest = max((v / b for v, b in zip(load, bandwidth)), default=0.0)
    return {key: tuple(link for path in route.paths for link in path if 2 * load[link] >= busiest * bandwidth[link])
            for key, route in conn_route.items()}


def _op_chunk(op: Op) -> str:
    if op.kind == "send":
        return str(op.src)
    if op.kind in ("recv", "recv_reduce"):
        return str(op.dst)
    return f"{op.src}->{op.dst}"


def _describe(schedule: Schedule, gid: int, base: list[int]) -> str:
    rank = bisect.bisect_right(base, gid) - 1
    k = gid - base[rank]
    op = schedule.programs[rank][k]
    peer = f" {'to' if op.kind == 'send' else 'from'} rank {op.peer}" if op.peer is not None else ""
    return f"rank {rank} op {k} ({op.kind}{peer})"


def simulate(where: Topology | Network, schedule: Schedule, size_bytes: int, *, record: bool = False,
             on_message: MessageHook | None = None) -> SimResult:
    """Predict how long ``schedule`` takes on a topology (or its network) for a buffer of ``size_bytes``.

    See the module docstring for the model.  ``record=True`` also returns every
    operation's and every link occupation's interval (for traces): millions of
    objects on a 1024-rank schedule.  ``on_message`` is the lean alternative:
    it is called once per message as it arrives (see :data:`MessageHook`), so a
    caller keeps only what it aggregates (the HTML report keeps a few numbers
    per message).
    Raises :class:`SimulationError` when the schedule does not fit the topology
    or cannot run (unmatched messages, deadlock).

    >>> result = simulate(topology, schedule, 1 << 26)  # doctest: +SKIP
    >>> result.busbw_GBps, result.bottlenecks(3)  # doctest: +SKIP
    """
    net = network_of(where)
    if record or on_message is not None:
        result = _paused_collector(net, schedule, size_bytes, record, on_message, math.inf)
    else:
        result = simulate_within(net, schedule, size_bytes, math.inf)
    assert result is not None  # no deadline
    return result


def simulate_within(where: Topology | Network, schedule: Schedule, size_bytes: int,
                    deadline_s: float) -> SimResult | None:
    """:func:`simulate`, given up once the simulated clock passes ``deadline_s`` with work left: None then, as
    the schedule takes longer.  ``auto`` times a candidate so against the best so far (torus-4x4x4: direct's
    all-reduce takes 125 ms where halving-doubling, timed before it, took 24 ms).

    Against a deadline a lower bound comes first, from a run without contention (:func:`_simulate`'s
    ``alone``) at a fraction of the cost, and the schedule is given up if that passes the deadline already:
    tree packing's chains of dependent messages on fattree-256-2to1 at 4 MiB take 63.0 us so (1.9 s), where
    hierarchical's all-reduce took 53.7 us and tree packing's simulation ran 38 s to see it pass.
    """
    net = network_of(where)
    if math.isfinite(deadline_s):
        bound = _paused_collector(net, schedule, size_bytes, False, None, deadline_s, alone=True)
        if bound is None or bound.time_s > deadline_s:
            return None
    return _paused_collector(net, schedule, size_bytes, False, None, deadline_s)


def _paused_collector(net: Network, schedule: Schedule, size_bytes: int, record: bool,
                      on_message: MessageHook | None, deadline_s: float, alone: bool = False) -> SimResult | None:
    # The simulation allocates millions of small, acyclic objects; the cyclic
    # collector would rescan them over and over (a 3x slowdown), so pause it.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(net, schedule, size_bytes, record, on_message, deadline_s, alone)
    finally:
        if enabled:
            gc.enable()


def _simulate(net: Network, schedule: Schedule, size_bytes: int, record: bool,
              on_message: MessageHook | None, deadline_s: float, alone: bool = False) -> SimResult | None:
    """The simulation (see the module docstring); None once the clock passes ``deadline_s`` with work left.

    ``alone``: a lower bound of its time instead.  Every message goes on the wire as soon as both its
    operations are posted (its connection's earlier messages need not be out) and each of its flows runs at
    its path's narrowest bandwidth (:class:`~topocc.planner.analysis.fairshare.Unshared`).  Each event is then
    the latest of the events it waits for plus a duration no longer than the simulation's (a fair share
    never exceeds a path's narrowest link, and a connection's order only adds waits), so by induction over
    the operations no event comes later than in the simulation.  So no flow starts earlier there either, and
    the time is also at least :func:`_suffix_bound` of the flows' starts here.
    """
    topology = net.topology
    where = f"{schedule.collective} schedule ({schedule.metadata.algorithm}) on {topology.name}"
    if schedule.ranks != topology.size:
        raise SimulationError(
            f"the schedule has {schedule.ranks} ranks but the topology has {topology.size}", where=where,
            fix=f"compile the schedule for this topology, or simulate it on a topology with {schedule.ranks} ranks",
        )
    if size_bytes < 0:
        raise SimulationError(f"negative size {size_bytes}", where=where)
    index = net.memo(_LINKS)
    cb = chunk_bytes(schedule, size_bytes)
    programs = schedule.programs

    # ---- flatten the programs: global op ids, dependency counters, dependents, message partners
    base: list[int] = []
    kinds: list[int] = []
    waiting: list[int] = []
    op_rank: list[int] = []
    for rank, program in enumerate(programs):
        base.append(len(kinds))
        try:
            kinds += [_KIND_CODES[op.kind] for op in program]
        except KeyError as exc:
            raise SimulationError(f"rank {rank}: unknown operation {exc.args[0]!r}", where=where) from None
        waiting += [len(op.deps) for op in program]
        op_rank += [rank] * len(program)
    total = len(kinds)
    base.append(total)
    dependents: list[list[int] | None] = [None] * total
    partner = [-1] * total
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for rank, program in enumerate(programs):
        g = base[rank]
        for op in program:
            for d in op.deps:
                deps_of = dependents[base[rank] + d]
                if deps_of is None:
                    dependents[base[rank] + d] = [g]
                else:
                    deps_of.append(g)
            code = kinds[g]
            if code == _SEND:
                key = (rank, op.peer, op.channel)
                found = sends.get(key)
                if found is None:
                    sends[key] = [g]
                else:
                    found.append(g)
            elif code == _RECV:
                key = (op.peer, rank, op.channel)
                found = recvs.get(key)
                if found is None:
                    recvs[key] = [g]
                else:
                    found.append(g)
            g += 1
    pairs: set[tuple[int, int]] = set()
    for key in sends.keys() | recvs.keys():
        s, r = sends.get(key, ()), recvs.get(key, ())
        if len(s) != len(r):
            src, dst, ch = key
            raise SimulationError(
                f"rank {src} sends {len(s)} message(s) to rank {dst}{f' on channel {ch}' if ch else ''} "
                f"but rank {dst} receives {len(r)}", where=where, fix="verify the schedule first (topocc.planner.analysis.verify)",
            )
        for a, b in zip(s, r):
            partner[a] = b
            partner[b] = a
        pairs.add(key[:2])
    for src, dst in pairs:
        if src == dst or not all(isinstance(r, int) and 0 <= r < schedule.ranks for r in (src, dst)):
            raise SimulationError(f"a message from rank {src!r} to rank {dst!r}: not a pair of distinct ranks",
                                  where=where, fix="verify the schedule first (topocc.planner.analysis.verify)")
    for src, dst in sorted(pairs):
        if not net.has_route(src, dst):
            raise SimulationError(
                f"rank {src} sends to rank {dst}, but no route joins them without passing through another GPU",
                where=where, fix=f"relay the data through a rank that has a route to rank {dst}",
            )

    # ---- routes, per connection (a schedule's recorded paths replace the topology's routing where it allows)
    recorded = recorded_paths(net, schedule)
    conn_route: dict[tuple[int, int, int], Route] = {
        key: index.indexed((recorded[key],)) if key in recorded else index.route(*key) for key in sends}

    # every path's links one after the other: a message adds its share to each, in this order
    conn_links = {key: tuple(link for path in route.paths for link in path) for key, route in conn_route.items()}

    # ---- state
    conn_of: dict[int, tuple[int, int, int]] = {g: key for key, ids in sends.items() for g in ids}
    conn_queue: dict[tuple[int, int, int], deque[int]] = {}  # busy connections and their waiting messages
    posted = [False] * total
    finished = bytearray(total)
    start_time = [0.0] * total if record else None
    rank_finish = [0.0] * len(programs)
    done_count = 0
    fabric = Unshared(index.bandwidth) if alone else Fabric(index.bandwidth, total, record)
    # with ``alone``: each flow's start, link and bytes, per link it crosses of those it keeps (see _heavy_links)
    loads = (array("d"), array("q"), array("d")) if alone else None
    heavy = _heavy_links(connection_chunks(schedule), conn_route, index.bandwidth) if alone else {}
    names = index.names
    link_bytes = [0.0] * len(names)
    msg_start: dict[int, float] = {}  # when each message in flight went on the wire (only for on_message)
    arrivals: list[tuple[float, int]] = []  # (time, send): a message's last byte arrives after its latency
    op_events: list[OpEvent] = []
    link_events: list[LinkEvent] = []
    ready = [i for i in range(total) if not waiting[i]]

    def complete(op: int, now: float) -> None:
        nonlocal done_count
        done_count += 1
        finished[op] = 1
        r = op_rank[op]
        if now > rank_finish[r]:
            rank_finish[r] = now
        if start_time is not None:
            k = op - base[r]
            o = programs[r][k]
            op_events.append(OpEvent(r, k, o.kind, o.peer, o.step, o.channel, _op_chunk(o), start_time[op], now))
        deps_of = dependents[op]
        if deps_of is not None:
            for j in deps_of:
                waiting[j] -= 1
                if not waiting[j]:
                    ready.append(j)

    def message_done(send: int, now: float) -> None:
        recv = partner[send]
        complete(send, now)
        complete(recv, now)
        if on_message is not None:
            src, dst = op_rank[send], op_rank[recv]
            latency = conn_route[conn_of[send]].latency
            on_message(src, send - base[src], dst, recv - base[dst], msg_start.pop(send), now - latency, now)

    def drain(now: float) -> None:
        """Start every ready operation at ``now``, in the order they became ready; local ones complete at once."""
        while ready:
            batch = ready.copy()
            ready.clear()
            for op in batch:
                start_op(op, now)

    def start_op(op: int, now: float) -> None:
        if start_time is not None:
            start_time[op] = now
        kind = kinds[op]
        if kind == _LOCAL:
            complete(op, now)
            return
        posted[op] = True
        other = partner[op]
        if not posted[other]:
            return
        send = op if kind == _SEND else other
        key = conn_of[send]
        if alone:
            start_message(send, now)
            return
        queue = conn_queue.get(key)
        if queue is not None:  # the connection is busy: wait for its current message's last byte
            queue.append(send)
            return
        conn_queue[key] = deque()
        start_message(send, now)

    def start_message(send: int, now: float) -> None:
        """Put a matched message on the wire: one flow per path of its connection."""
        src = op_rank[send]
        key = conn_of[send]
        route = conn_route[key]
        nbytes = programs[src][send - base[src]].count * cb
        if on_message is not None:
            msg_start[send] = now
        if nbytes <= 0.0:
            release(send, now)
            heapq.heappush(arrivals, (now + route.latency, send))
            return
        share = nbytes / len(route.paths)
        for link in conn_links[key]:
            link_bytes[link] += share
        if loads is not None and len(loads[0]) < _LOADS_MAX:
            links = heavy[key]
            loads[0].extend([now] * len(links))
            loads[1].extend(links)
            loads[2].extend([share] * len(links))
        fabric.add(send, route, share)

    def release(send: int, now: float) -> None:
        """The message's last byte is out: start the next message queued on its connection."""
        if alone:
            return  # nothing queued
        key = conn_of[send]
        queue = conn_queue[key]
        if queue:
            start_message(queue.popleft(), now)
        else:
            del conn_queue[key]

    drain(0.0)
    fabric.reallocate(0.0)
    now = 0.0
    heappop, heappush = heapq.heappop, heapq.heappush
    inf = float("inf")
    while True:
        flows_end = fabric.next_end()
        now = min(flows_end, arrivals[0][0]) if arrivals else flows_end
        if now == inf:
            break
        if now > deadline_s:  # work is left, and it ends at ``now`` or later
            return None
        limit = now + SAME_INSTANT * now  # events this close are one instant
        done: list[tuple[float, int]] = []
        if flows_end <= limit:
            done = fabric.finish(limit)
            for send, path, start, nbytes in fabric.ended:
                src, dst = op_rank[send], op_rank[partner[send]]
                step = programs[src][send - base[src]].step
                link_events.extend(LinkEvent(*names[link], start, now, nbytes, src, dst, step) for link in path)
            fabric.ended.clear()
        # messages whose last flow ended and messages whose last byte arrived, in the order of their
        # times (a flow's end before an arrival at the same time), then of their sends
        i = 0
        while True:
            arrival = arrivals[0][0] if arrivals and arrivals[0][0] <= limit else inf
            if i < len(done) and done[i][0] <= arrival:
                msg = done[i][1]
                i += 1
                latency = fabric.close(msg)
                release(msg, now)
                if latency > 0.0:
                    heappush(arrivals, (now + latency, msg))
                else:
                    message_done(msg, now)
            elif arrival != inf:
                message_done(heappop(arrivals)[1], now)
            else:
                break
        drain(now)
        if fabric.touched or fabric.pending:
            fabric.reallocate(now)

    if done_count != total:
        stuck = next((i for i in range(total) if posted[i] and not finished[i]), None)
        if stuck is None:
            stuck = next(i for i in range(total) if not finished[i])
        raise SimulationError(
            f"deadlock: {done_count} of {total} operations completed; {_describe(schedule, stuck, base)} never did",
            where=where, fix="verify the schedule first (topocc.planner.analysis.verify)",
        )
    time_s = max(rank_finish, default=0.0)
    if loads is not None and 0 < len(loads[0]) < _LOADS_MAX:  # else some are missing
        time_s = max(time_s, _suffix_bound(*(np.frombuffer(column, dtype=column.typecode) for column in loads),
                                           index.bandwidth))
    algbw = size_bytes / time_s / 1e9 if time_s > 0 else 0.0
    bandwidth = index.bandwidth
    link_map = {names[i]: link_bytes[i] for i in range(len(names))}
    util = {
        names[i]: (link_bytes[i] / (bandwidth[i] * time_s) if time_s > 0 else 0.0) for i in range(len(names))
    }
    op_events.sort(key=lambda e: (e.start_s, e.rank, e.index))
    link_events.sort(key=lambda e: (e.start_s, e.src, e.dst))
    return SimResult(
        time_s=time_s,
        size_bytes=size_bytes,
        algbw_GBps=algbw,
        busbw_GBps=algbw * bus_factor(schedule.collective, schedule.ranks),
        link_bytes=MappingProxyType(link_map),
        link_utilisation=MappingProxyType(util),
        rank_finish_s=tuple(rank_finish),
        op_events=tuple(op_events),
        link_events=tuple(link_events),
    )

