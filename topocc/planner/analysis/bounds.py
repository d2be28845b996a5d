"""Lower bounds on the time of a collective on a topology: cuts and latency.

No schedule can beat the returned bound under the simulator's model
(:mod:`topocc.planner.analysis.simulate`); the planner uses it to rank candidates and to say how
far a schedule is from optimal.

Bandwidth (cut) bounds.  For a set S of devices holding k of the p ranks
(0 < k < p), some bytes must cross into S and some out of it; the links entering
S carry at most their total bandwidth, so ``time >= bytes_in / cap_in(S)`` and
likewise out.  With N = ``size_bytes`` (nccl-tests' size, the larger buffer):

* allgather: in N (p-k)/p (the outside ranks' blocks, each needed once),
  out N k/p (S's blocks, wanted outside);
* reducescatter, the mirror: in N k/p (S's shards need the outside
  contributions, at best pre-reduced to one copy), out N (p-k)/p;
* allreduce: in N and out N (S's results depend on every outside input and
  vice versa; this is the reduce-scatter plus the all-gather bound);
* broadcast: in N into any S without the root, out N out of any S with it;
* reduce: out N out of any S without the root, in N into any S with it;
* alltoall: in and out N k (p-k)/p (each of the k ranks gets N/p from each of
  the p-k others, and sends as much).

Allreduce also gets a partition bound: split the ranks into m groups of
devices (each rank alone, each host, each rack); every element must make at
least 2(m-1) crossings between groups (one-way gossip among m parties needs
2m-2 calls, Harary & Schwenk, "The communication problem on graphs and
digraphs", 1974; reductions never mix elements, as the verifier enforces), so
``time >= 2(m-1) N / sum of the groups' in- (or out-) capacities``.  On up to
:data:`ROUTED_PARTITION_RANKS` ranks the crossings' capacity is also solved
exactly for the simulator's model, where a message between two ranks follows
the routes the topology's routing gives it: an LP finds the most bytes/s that
rank pairs in different groups can exchange at once over those routes (any
split over a pair's cheapest paths where channels or source routing let a
schedule choose among them).  It sees, say, that the PCIe
links into a DGX-1 GPU only carry messages that also cross the CPUs'
interconnect, which the sum of capacities cannot.  On p equal
ranks behind one switch this is the familiar 2(p-1)/p N/B (Patarasuk & Yuan,
"Bandwidth optimal all-reduce algorithms", JPDC 2009).  It equals "twice the
allgather cut" on groups of equal size and capacity, and unlike that per-cut
rule stays valid on uneven topologies (a fast rank can reduce for slow ones).

All-gather and reduce-scatter also get a routed per-rank bound (up to
:data:`ROUTED_PARTITION_RANKS` ranks): every rank must receive (all-gather) or
send (reduce-scatter) (p-1)N/p bytes, all at once, and an LP over the same
routed rates finds the most each rank can get while all do
(:func:`_routed_rank_rate`).  The cut through one rank's links counts capacity
that no route reaches: a DGX-1 GPU's PCIe link carries only messages that also
cross the CPUs' 6 GB/s interconnect, so 151.5 GB/s per GPU, not 166.

Relayed schedules are bound as well.  A transfer between ranks without a
GPU-free route is relayed (:mod:`topocc.planner.routing.relay`): one ordinary message per hop,
each between ranks that have a route, the relay receiving and then sending.
The cut bounds count link capacity, which a relayed byte uses on every hop like
any other (more of it, not less).  The gossip count holds for any sequence of
calls, a relay's receive and send being two of them: a relay in a third group
makes one crossing two, a relay in the sender's or receiver's group leaves it
one.  And the routed LP ranges over every pair with a route (the only pairs the
simulator lets a schedule send between) at their fixed route shares, so each
hop of a relayed message is one of its variables and the LP's maximum caps
what relayed crossings can carry too.

The maximum over any family of valid cuts is itself a valid lower bound, so the
candidate family only decides how tight the bound is: each rank alone, each
host, each rack, the first and second half of the hosts, a Kernighan-Lin
bisection of the undirected graph, and (on small topologies) for each host the
minimum cut separating its ranks from the others, by max-flow; each with its
complement.

Latency.  The last byte across a cut still has to arrive: under the
simulator's fluid model a message occupies every link of its path at once and
completes when its last byte is sent plus the latency of its (slowest) path.
Let ``t*`` be when the last byte crossing the cut (in, say) is sent; all the
``need`` bytes that must cross were sent through links of total capacity
``cap`` by then, so ``t* >= need / cap``, and the message carrying that byte
completes no earlier than ``t*`` plus its path's latency.  That path runs from
a rank to a rank through one of the cut's links ``(u, v)``, so its latency is
at least ``reach(u) + lat(u, v) + back(v)``, with ``reach(u)`` the least latency
from any rank to ``u`` and ``back(v)`` the least from ``v`` to any rank (both
by Dijkstra, relaying or not: a route is one path of the graph, and a relayed
transfer's hops are each such a message).  So a cut's bound adds the least of
that over its links, not just the least link latency: on a cluster, the whole
GPU-NIC-switch-NIC-GPU path rather than the one switch port.  The same holds for
the partition bounds below, whose crossings are messages too.  Separately, every
output depends on some input of every other rank (broadcast: the root's; reduce:
the root depends on all), so a chain of messages must cover the minimum-latency
path between them, relaying allowed: the latency diameter (exact all-pairs
Dijkstra on small topologies; on large ones, alternating forward and backward
sweeps from the farthest rank found, which can only under-estimate it).
``time_s = max(bandwidth_s + cut latency, latency diameter)``.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from topocc.planner.errors import InfeasibleError, NotApplicableError, UsageError
from topocc.planner.routing.network import PER_CONNECTION, Memo, Network, network_of
from topocc.planner.solvers import LinearProgram, SolverOptions, solve
from topocc.planner.topology.model import Topology
from topocc.planner.units import format_bandwidth, format_time
from topocc.runtime.collective import ALLREDUCE, Collective
from topocc.runtime.collective import collective as describe

__all__ = ["Bound", "lower_bound"]

#: Per-host max-flow cuts run only when hosts * links stays under this (each max-flow is O(links) Python).
MAXFLOW_BUDGET = 40_000
#: All-pairs latency diameter is exact when ranks * links stays under this; above, iterated sweeps.
EXACT_DIAMETER_BUDGET = 1_000_000
#: Dijkstra runs of the sweep heuristic on large topologies.
DIAMETER_SWEEPS = 8
#: Kernighan-Lin passes (networkx default 10): the first few find almost all of the gain.
KL_ITERATIONS = 4
#: Up to this many ranks the partition bounds also solve the routed LP (ranks^2 rate variables).
ROUTED_PARTITION_RANKS = 64
#: Time limit of that LP (it has a few thousand variables; a limit only drops the refinement).
ROUTED_PARTITION_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Bound:
    """A lower bound on a collective's time.

    ``bandwidth_s`` is the binding cut's bytes / capacity; ``latency_s`` the
    latency added to it (the cut's smallest crossing latency) or, when the
    latency diameter alone is larger, that diameter.  ``time_s`` is
    ``max(bandwidth_s + cut latency, diameter)``; ``cut`` says what binds,
    e.g. ``"host h0 (4 ranks): 25 GB/s in"``.
    """

    time_s: float
    bandwidth_s: float
    latency_s: float
    cut: str


@dataclass(frozen=True, slots=True)
class _Cut:
    """A candidate device set with its crossing capacities (bytes/s) and smallest crossing latencies.

    It holds the ranks in ``ranks``, or, when ``inverted``, every rank but those
    (complements are kept this way so that making them costs nothing).
    """

    label: str
    ranks: frozenset[int]
    inverted: bool
    cap_in: float
    cap_out: float
    lat_in: float
    lat_out: float

    def count(self, p: int) -> int:
        return p - len(self.ranks) if self.inverted else len(self.ranks)

    def holds(self, rank: int) -> bool:
        return (rank in self.ranks) != self.inverted


@dataclass(frozen=True, slots=True)
class _Partition:
    """Disjoint device groups covering all ranks, for the allreduce gossip bound."""

    label: str
    parts: int
    cap_in: float
    cap_out: float
    lat_in: float
    lat_out: float
    routed: float | None = None  # most crossing bytes/s the fixed routes carry (an LP), when computed


class _CutFamily:
    """The candidate cuts and partitions of a topology; independent of the collective, so kept per network."""

    def __init__(self, net: Network) -> None:
        topology = net.topology
        self.size = topology.size
        self.link_count = len(topology.links)
        names = [d.name for d in topology.devices]
        self.index = {name: i for i, name in enumerate(names)}
        n = len(names)
        self.in_adj: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
        self.out_adj: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
        for link in topology.links:
            a, b = self.index[link.src], self.index[link.dst]
            self.out_adj[a].append((b, link.bandwidth, link.latency))
            self.in_adj[b].append((a, link.bandwidth, link.latency))
        self.rank_dev = [self.index[name] for name in topology.ranks]
        self.rank_of = {dev: r for r, dev in enumerate(self.rank_dev)}
        # least latency from any rank to each device, and from each device to any rank (crossing latencies)
        self.reach = self._dijkstra(self.rank_dev, reverse=False)
        self.back = self._dijkstra(self.rank_dev, reverse=True)
        self.cuts: list[_Cut] = []
        self.partitions: list[_Partition] = []
        self._seen: set[frozenset[int]] = set()
        self._build(net)
        self._diameter: tuple[float, int, int] | None = None

    # ---- capacities

    def _boundary(self, members: set[int] | frozenset[int]) -> tuple[float, float, float, float]:
        """Capacity into and out of ``members``, and the least latency of a rank-to-rank path crossing in / out.

        A crossing path through link (u, v) takes at least ``reach[u] + lat + back[v]`` (module docstring).
        """
        reach, back = self.reach, self.back
        cap_in = cap_out = 0.0
        lat_in = lat_out = math.inf
        for d in members:
            for u, bw, lat in self.in_adj[d]:
                if u not in members:
                    cap_in += bw
                    lat_in = min(lat_in, reach[u] + lat + back[d])
            for v, bw, lat in self.out_adj[d]:
                if v not in members:
                    cap_out += bw
                    lat_out = min(lat_out, reach[d] + lat + back[v])
        return cap_in, cap_out, lat_in, lat_out

    def _add(self, label: str, members: Iterable[int], complement_label: str | None = None) -> None:
        members = frozenset(members)
        if members in self._seen:
            return
        self._seen.add(members)
        ranks = frozenset(self.rank_of[d] for d in members if d in self.rank_of)
        if not 0 < len(ranks) < self.size:
            return
        cap_in, cap_out, lat_in, lat_out = self._boundary(members)
        self.cuts.append(_Cut(label, ranks, False, cap_in, cap_out, lat_in, lat_out))
        # The complement comes for free: its in-links are S's out-links.
        self.cuts.append(_Cut(complement_label or f"all but {label}", ranks, True, cap_out, cap_in, lat_out, lat_in))

    def _add_partition(self, label: str, groups: list[set[int]], net: Network) -> None:
        if len(groups) < 2:
            return
        cap_in = cap_out = 0.0
        lat_in = lat_out = math.inf
        for members in groups:
            ci, co, li, lo = self._boundary(members)
            cap_in += ci
            cap_out += co
            lat_in, lat_out = min(lat_in, li), min(lat_out, lo)
        routed = None
        if self.size <= ROUTED_PARTITION_RANKS:
            group_of = {self.rank_of[d]: g for g, members in enumerate(groups) for d in members if d in self.rank_of}
            routed = _routed_crossings(net, group_of)
        self.partitions.append(_Partition(label, len(groups), cap_in, cap_out, lat_in, lat_out, routed))

    # ---- candidates

    def _build(self, net: Network) -> None:
        topo = net.topology
        devices = topo.devices
        p = topo.size
        for r, dev in enumerate(self.rank_dev):
            self._add(f"rank {r} ({devices[dev].name})", (dev,))
        self._add_partition(f"each of the {p} ranks alone", [{dev} for dev in self.rank_dev], net)
        groups: list[set[int]] = [{dev} for dev in self.rank_dev]
        for dev, r in self._nearest_rank().items():
            groups[r].add(dev)
        if any(len(g) > 1 for g in groups):
            self._add_partition(f"each of the {p} ranks with the devices nearest to it alone", groups, net)
            # one such group alone: a mesh corner's three router links, found without the per-host max-flow
            # cuts that large fabrics skip (a corner's routers can carry less than its GPU's own port)
            for r, g in enumerate(groups):
                if len(g) > 1:
                    self._add(f"rank {r} ({devices[self.rank_dev[r]].name}) with the devices nearest to it", g)

        # hosts: every device naming the host, plus ranks that have no host (their own host)
        host_members: dict[str, set[int]] = {h: set() for h in topo.hosts}
        for i, d in enumerate(devices):
            key = d.host if d.host is not None else (d.name if i in self.rank_of else None)
            if key is not None and key in host_members:
                host_members[key].add(i)
        host_names = list(topo.hosts)
        if len(host_names) > 1:
            for h in host_names:
                self._add(f"host {h} ({_plural(len(topo.hosts[h]), 'rank')})", host_members[h])
            if len(host_names) < p:
                self._add_partition(f"each of the {len(host_names)} hosts", list(host_members.values()), net)
            half = len(host_names) // 2
            first = set().union(*(host_members[h] for h in host_names[:half]))
            second = set().union(*(host_members[h] for h in host_names[half:]))
            self._add(f"first {half} hosts", first)
            self._add(f"last {len(host_names) - half} hosts", second)
        else:
            half = p // 2
            self._add(f"ranks 0..{half - 1}", self.rank_dev[:half])
            self._add(f"ranks {half}..{p - 1}", self.rank_dev[half:])

        # racks: devices naming the rack, and devices of the hosts whose ranks are in it
        if len(topo.racks) > 1:
            host_rack = {}
            for rack, ranks in topo.racks.items():
                for r in ranks:
                    d = devices[self.rank_dev[r]]
                    host_rack[d.host or d.name] = rack
            rack_members: dict[str, set[int]] = {rack: set() for rack in topo.racks}
            for i, d in enumerate(devices):
                in_rack = d.rack if d.rack in rack_members else host_rack.get(d.host or d.name)
                if in_rack is not None:
                    rack_members[in_rack].add(i)
            for rack, members in rack_members.items():
                self._add(f"rack {rack} ({_plural(len(topo.racks[rack]), 'rank')})", members)
            if len(topo.racks) < len(host_names):
                self._add_partition(f"each of the {len(topo.racks)} racks", list(rack_members.values()), net)

        self._kernighan_lin()
        if len(host_names) > 1 and len(host_names) * len(topo.links) <= MAXFLOW_BUDGET:
            self._min_cuts({h: topo.hosts[h] for h in host_names})

    def _nearest_rank(self) -> dict[int, int]:
        """Non-rank devices with one nearest rank (in hops, either direction): a router or NIC serving one GPU.

        Any assignment of such devices to groups gives a valid partition; this one
        moves a rank's private switch inside its group, so that its group's
        capacity is that of the switch's network links (a mesh router's two to
        four links rather than its 100 GB/s injection port).
        """
        owner: dict[int, int | None] = {dev: r for r, dev in enumerate(self.rank_dev)}
        frontier = list(self.rank_dev)
        while frontier:
            reached: dict[int, int | None] = {}
            for u in frontier:
                for v, _, _ in (*self.out_adj[u], *self.in_adj[u]):
                    if v in owner:
                        continue
                    if v in reached and reached[v] != owner[u]:
                        reached[v] = None  # two ranks equally near: the device is shared
                    else:
                        reached.setdefault(v, owner[u])
            owner.update(reached)
            frontier = [v for v, r in reached.items() if r is not None]
        return {dev: r for dev, r in owner.items() if r is not None and dev not in self.rank_of}

    def _kernighan_lin(self) -> None:
        graph: nx.Graph[int] = nx.Graph()
        graph.add_nodes_from(range(len(self.in_adj)))
        for a, edges in enumerate(self.out_adj):
            for b, bw, _ in edges:
                if graph.has_edge(a, b):
                    graph[a][b]["weight"] += bw
                else:
                    graph.add_edge(a, b, weight=bw)
        if graph.number_of_nodes() < 2:
            return
        # networkx's own random start (its seed 0 is random.Random(0) shuffling the nodes), given as sets: left
        # to it, the halves stay lists that it searches once per node, quadratic (81 s at 65,536 GPUs)
        nodes = list(graph)
        random.Random(0).shuffle(nodes)
        start = (set(nodes[:len(nodes) // 2]), set(nodes[len(nodes) // 2:]))
        side, _ = nx.algorithms.community.kernighan_lin_bisection(
            graph, partition=start, weight="weight", max_iter=KL_ITERATIONS)
        self._add("Kernighan-Lin bisection side A", side, "Kernighan-Lin bisection side B")

    def _min_cuts(self, hosts: dict[str, tuple[int, ...]]) -> None:
        """The cheapest device sets holding exactly each host's ranks, into and out of it (max-flow min-cut).

        Solved by OR-Tools' push-relabel (in C++: networkx's, in Python, was a third of a 64-rank compile) on
        capacities in whole bytes/s; the sink side is the least one, the devices that still reach the sink in
        the residual graph, which every maximum flow leaves alike.
        """
        from ortools.graph.python import max_flow  # here, not at import: the runtime's machines lack ortools

        n = len(self.out_adj)
        source, sink = n, n + 1
        arcs = [(a, b, round(bw)) for a, edges in enumerate(self.out_adj) for b, bw, _ in edges]
        endless = sum(c for _, _, c in arcs) + 1  # more than any cut: the terminals' arcs never are
        for host, ranks in hosts.items():
            inside = {self.rank_dev[r] for r in ranks}
            terminals = [(dev, sink) if dev in inside else (source, dev) for dev in self.rank_dev]
            label = f"host {host} ({_plural(len(ranks), 'rank')})"
            for reverse in (False, True):
                flow = max_flow.SimpleMaxFlow()
                for a, b, c in arcs:
                    flow.add_arc_with_capacity(*((b, a) if reverse else (a, b)), c)
                for a, b in terminals:
                    flow.add_arc_with_capacity(a, b, endless)
                if flow.solve(source, sink) == flow.OPTIMAL:
                    self._add(f"min cut {'out of' if reverse else 'into'} {label}",
                              set(flow.get_sink_side_min_cut()) - {sink})

    # ---- latency

    def _dijkstra(self, starts: Iterable[int], reverse: bool) -> list[float]:
        """Least latency from the nearest of ``starts`` to every device (to it, if ``reverse``)."""
        adj = self.in_adj if reverse else self.out_adj
        dist = [math.inf] * len(adj)
        heap = []
        for start in starts:
            dist[start] = 0.0
            heap.append((0.0, start))
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            for v, _, lat in adj[u]:
                nd = d + lat
                if nd < dist[v]:
                    dist[v] = nd
                    heapq.heappush(heap, (nd, v))
        return dist

    def from_rank(self, rank: int, reverse: bool = False) -> list[float]:
        """Minimum latency from rank ``rank`` to every rank (to it, if ``reverse``), relaying allowed."""
        dist = self._dijkstra((self.rank_dev[rank],), reverse)
        return [dist[d] for d in self.rank_dev]

    def diameter(self) -> tuple[float, int, int]:
        """(latency, src, dst) of the rank pair farthest apart; exact on small topologies, else a lower bound."""
        if self._diameter is not None:
            return self._diameter
        p = self.size
        best = (0.0, 0, 0)
        if all(lat == 0 for edges in self.out_adj for _, _, lat in edges):
            pass
        elif p * self.link_count <= EXACT_DIAMETER_BUDGET:
            for s in range(p):
                dist = self.from_rank(s)
                t = max(range(p), key=dist.__getitem__)
                best = max(best, (dist[t], s, t))
        else:
            # Double sweeps: the farthest target of a source, then the farthest source of that target, ...
            # Any pair's distance is a valid bound, so stopping early only loosens it.
            s, reverse = 0, False
            for _ in range(DIAMETER_SWEEPS):
                dist = self.from_rank(s, reverse)
                t = max(range(p), key=dist.__getitem__)
                best = max(best, (dist[t], t, s) if reverse else (dist[t], s, t))
                s, reverse = t, not reverse
        self._diameter = best
        return best


def _routed_crossings(net: Network, group_of: dict[int, int]) -> float | None:
    """The most bytes/s that messages between ranks of different groups can carry over their routes.

    An LP: a rate per ordered rank pair in different groups, every link's load
    within its bandwidth, maximising the total.  Only pairs with a route have a
    rate: no message travels between others (relays send hop by hop, each hop
    such a pair).  Where the routing fixes how a
    pair's messages use its paths (``spray``: evenly, ``dimension-order``: one
    path), each rate loads the links by its route shares.  Where a schedule can
    choose (``ecmp``: each channel hashes anew; ``source``: recorded paths),
    any split over the pair's cheapest paths is allowed: a flow from each source
    over the links of its cheapest paths, which a path decomposition turns into
    per-pair splits, so no choice of channels or paths escapes the bound.  None
    unless solved to optimality (a sub-optimal maximum would overstate the bound).
    """
    lp = LinearProgram()
    usage: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for a in group_of:
        targets = [b for b in group_of if group_of[b] != group_of[a] and net.has_route(a, b)]
        _pair_rates(lp, net, a, targets, usage, cost=-1.0)
    return _solve_routed(lp, net, usage) if usage else None


def _pair_rates(lp: LinearProgram, net: Network, a: int, targets: list[int],
                usage: dict[tuple[str, str], list[tuple[int, float]]], cost: float) -> list[int]:
    """A rate variable (of objective ``cost``) per rank pair ``a -> b`` for ``b`` in ``targets``, each loading
    the links in ``usage``: by its route shares where the routing fixes them; else as a flow from ``a`` over
    the links of the pairs' cheapest paths, so that any split over those paths is allowed."""
    topology = net.topology
    if topology.routing not in PER_CONNECTION:
        rates = []
        for b in targets:
            rate = lp.var(cost=cost)
            for key, share in net.route_shares(a, b).items():
                usage.setdefault(key, []).append((rate, share))
            rates.append(rate)
        return rates
    links = sorted({(ln.src, ln.dst) for b in targets for ln in net.equal_cost_links(a, b)})
    flow = {key: lp.var() for key in links}
    balance: dict[str, list[tuple[int, float]]] = {}  # inflow - outflow - delivered = 0 at every device
    for key, var in flow.items():
        usage.setdefault(key, []).append((var, 1.0))
        balance.setdefault(key[0], []).append((var, -1.0))
        balance.setdefault(key[1], []).append((var, 1.0))
    rates = []
    for b in targets:
        rates.append(lp.var(cost=cost))
        balance[topology.ranks[b]].append((rates[-1], -1.0))
    balance.pop(topology.ranks[a], None)  # the source emits freely
    for terms in balance.values():
        lp.add_eq(terms, 0.0)
    return rates


def _solve_routed(lp: LinearProgram, net: Network, usage: dict[tuple[str, str], list[tuple[int, float]]],
                  ) -> float | None:
    """Bound every link's load in ``usage`` by its bandwidth and solve: the optimum in bytes/s (rates are in
    units of the fastest link), None unless solved to optimality."""
    topology = net.topology
    scale = max(link.bandwidth for link in topology.links)
    for key in sorted(usage):
        lp.add_le(usage[key], topology.bandwidth(*key) / scale)
    try:
        solution = solve(lp, SolverOptions(backend="glop", time_limit_s=ROUTED_PARTITION_SECONDS))
    except (InfeasibleError, NotApplicableError):  # no time, or no solver installed: no refinement
        return None
    if not solution.optimal:
        return None
    return -solution.objective * scale * (1 + 1e-9)  # the margin keeps rounding on the safe side


def _routed_rank_rate(net: Network, inbound: bool) -> float | None:
    """The largest rate every rank can receive at at once (``inbound``; else send at), over the routes.

    An LP over the same rate variables as :func:`_routed_crossings` (every rank
    pair with a route; any split over a pair's cheapest paths where the
    schedule can choose), maximising ``t`` such that each rank's total inbound
    (outbound) rate is at least ``t`` while every link stays within its
    bandwidth.  A schedule in which every rank receives (sends) ``D`` bytes in
    time ``T`` averages such rates ``D / T``, so ``T >= D / t``.  Unlike the cut
    through each rank's links it sees capacity that no route reaches (a
    DGX-1's PCIe links into a GPU carry only messages that also cross the CPUs'
    interconnect).  None unless solved to optimality.
    """
    topology = net.topology
    p = topology.size
    lp = LinearProgram()
    t = lp.var(cost=-1.0)
    usage: dict[tuple[str, str], list[tuple[int, float]]] = {}
    per_rank: list[list[int]] = [[] for _ in range(p)]
    for a in range(p):
        targets = [b for b in range(p) if b != a and net.has_route(a, b)]
        for b, rate in zip(targets, _pair_rates(lp, net, a, targets, usage, cost=0.0)):
            per_rank[b if inbound else a].append(rate)
    if not usage or not all(per_rank):
        return None
    for rates in per_rank:
        lp.add_le([(t, 1.0), *((var, -1.0) for var in rates)], 0.0)
    return _solve_routed(lp, net, usage)


#: The cuts and partitions of a network, and the rate at which every rank can receive (all-gather) or send
#: (reduce-scatter) at once over the routes.
_CUTS = Memo("bounds: cut family", _CutFamily)
_RECEIVING = Memo("bounds: routed rate in", lambda net: _routed_rank_rate(net, True))
_SENDING = Memo("bounds: routed rate out", lambda net: _routed_rank_rate(net, False))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _demand(collective: Collective, n: float, p: int, k: int, has_root: bool) -> tuple[float, float]:
    """(bytes into, bytes out of) a cut holding ``k`` of ``p`` ranks (see the module docstring)."""
    if collective.gathers:
        return n * (p - k) / p, n * k / p
    if collective.scatters:
        return n * k / p, n * (p - k) / p
    if collective.from_root:
        return (0.0, n) if has_root else (n, 0.0)
    if collective.to_root:
        return (n, 0.0) if has_root else (0.0, n)
    if collective.exchanges:
        both = n * k * (p - k) / p
        return both, both
    assert collective is ALLREDUCE, collective  # the one left: every result depends on every input
    return n, n


def _term(need: float, cap: float, lat: float) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of moving ``need`` bytes over ``cap`` bytes/s."""
    if need <= 0:
        return 0.0, 0.0
    if cap <= 0:  # only in a topology built without build_topology's connectivity check
        return math.inf, 0.0
    return need / cap, (lat if math.isfinite(lat) else 0.0)


def lower_bound(where: Topology | Network, collective: str, size_bytes: int, root: int = 0) -> Bound:
    """A lower bound on the time of ``collective`` of ``size_bytes`` on a topology (or its network).

    See the module docstring for the cuts and the latency terms.  A network keeps its cut family, so calls
    after the first on one network are cheap.

    >>> b = lower_bound(topology, "allreduce", 1 << 30)  # doctest: +SKIP
    >>> (1 << 30) / b.time_s / 1e9, b.cut  # best possible algbw in GB/s, and why  # doctest: +SKIP
    """
    net = network_of(where)
    topology = net.topology
    c = describe(collective)
    p = topology.size
    if not 0 <= root < p:
        raise UsageError(f"root {root} is not a rank of {topology.name} (it has {p} ranks)",
                         fix=f"pass a root between 0 and {p - 1}")
    if size_bytes < 0:
        raise UsageError(f"negative size {size_bytes}")
    if p == 1 or size_bytes == 0:
        return Bound(0.0, 0.0, 0.0, "nothing has to move")
    family = net.memo(_CUTS)
    n = float(size_bytes)

    best = (0.0, 0.0, 0.0, "")  # (time, bandwidth, latency, description)
    for cut in family.cuts:
        need_in, need_out = _demand(c, n, p, cut.count(p), cut.holds(root))
        for need, cap, lat, way in ((need_in, cut.cap_in, cut.lat_in, "in"),
                                    (need_out, cut.cap_out, cut.lat_out, "out")):
            bw, lt = _term(need, cap, lat)
            if bw + lt > best[0]:
                best = (bw + lt, bw, lt, f"{cut.label}: {format_bandwidth(cap)} {way}")
    if c is ALLREDUCE:
        for part in family.partitions:
            need = 2.0 * (part.parts - 1) * n
            terms = [(part.cap_in, part.lat_in, "entering them"), (part.cap_out, part.lat_out, "leaving them")]
            if part.routed is not None:
                terms.append((part.routed, min(part.lat_in, part.lat_out), "between them over the routes"))
            for cap, lat, way in terms:
                bw, lt = _term(need, cap, lat)
                if bw + lt > best[0]:
                    best = (bw + lt, bw, lt, f"{part.label}: 2(m-1)N over {format_bandwidth(cap)} {way}")

    if (c.gathers or c.scatters) and p <= ROUTED_PARTITION_RANKS:
        # every rank receives the others' blocks (all-gather), or sends its contributions to them
        inbound = c.gathers
        rate = net.memo(_RECEIVING if inbound else _SENDING)
        if rate is not None:
            bw, _ = _term(n * (p - 1) / p, rate, 0.0)
            if bw > best[0]:
                best = (bw, bw, 0.0, f"every rank {'receiving' if inbound else 'sending'} (p-1)N/p at once: "
                                     f"{format_bandwidth(rate)} each over the routes")

    if c.from_root:
        dist = family.from_rank(root)
        far = max(range(p), key=dist.__getitem__)
        latency, pair = dist[far], (root, far)
    elif c.to_root:
        dist = family.from_rank(root, reverse=True)
        far = max(range(p), key=dist.__getitem__)
        latency, pair = dist[far], (far, root)
    else:
        latency, *rest = family.diameter()
        pair = (rest[0], rest[1])
    time_s, bandwidth_s, latency_s, description = best
    if latency > time_s:
        return Bound(latency, bandwidth_s, latency, f"latency from rank {pair[0]} to rank {pair[1]}: "
                     f"{format_time(latency)} (cut {description or 'none'})")
    return Bound(time_s, bandwidth_s, latency_s, description)
