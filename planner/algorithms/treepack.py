"""Throughput-optimal spanning-tree packing (as in ForestColl), for large messages.

For every root, a fractional packing of spanning out-trees is found with a
linear program: per root ``r`` a capacity ``x_r(e)`` on each rank-to-rank edge,
and for every destination ``d`` a unit flow from ``r`` to ``d`` inside it; by
Edmonds' branching theorem such an ``x_r`` holds a packing of arborescences of
total weight 1.  The physical links the edges' routes cross bound the load;
the LP minimises the time of the most loaded link.  The packing is then split
into trees greedily (widest tree first), each tree carrying a share of the
root's pieces proportional to its weight.

All-gather runs the out-trees root to leaf; reduce-scatter runs the trees of
the reversed topology leaf to root; broadcast and reduce use one root.

All-reduce on a full-duplex fabric packs *undirected* spanning trees instead:
each piece of data is reduced up a tree to the tree's centre and broadcast
back down the same tree, so every tree edge carries the piece once each way
(2(p-1) crossings per element, which is what :mod:`planner.bounds` charges;
by Nash-Williams and Tutte the best packing meets the partition bound when
the candidate edges allow it).  Unlike reduce-scatter followed by all-gather
no rank has to receive ``2 (p-1)/p N``: a leaf sends N and receives N.  The
packing comes from minimum spanning trees under multiplicative link prices
and one small LP that weighs them (:func:`pack_undirected`).  Reductions and
broadcasts use separate channels so neither queues behind the other, and a
window of credits keeps reductions from racing ahead of broadcasts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from planner.algorithms import Options
from planner.builder import ScheduleBuilder
from planner.collectives import chunk_counts
from planner.errors import NotApplicableError
from planner.solvers import LinearProgram, SolverOptions, solve
from planner.topology import Topology
from runtime.schedule import Chunk, Schedule

__all__ = ["Packing", "pack_trees", "pack_undirected", "treepack"]

#: The LP has roots x destinations x edges flow variables; beyond this many ranks use a hierarchical plan.
MAX_RANKS = 32
#: Largest arborescence LP built (roots x destinations x candidate edges flow variables): CLP solves
#: ndv2-2chassis' 16k in 2.4 s and pcie-4x4-10gbe's 35k in 3 s, but neither dgx-a100-4node's 286k nor a
#: 4 x 8 GPU multi-chassis box's 131k within its time limit (and a solution cut short is not a packing).
MAX_FLOW_VARIABLES = 100_000
#: Candidate edges per rank (cheapest routes first); enough to reach the cut bound on the fabrics we model.
EDGES_PER_RANK = 6
#: Extra edges per rank to other hosts, so hierarchical clusters stay connected in the LP.
CROSS_HOST_EDGES = 3
#: CLP solves this degenerate LP several times faster than GLOP and HiGHS (measured on dgx2, torus-4x4,
#: mesh-4x4 and pcie-4x4-10gbe: 0.6-6 s against 2.6-21 s).
DEFAULT_SOLVER = SolverOptions(backend="clp", time_limit_s=15.0)
#: A tiny cost per unit of edge capacity, weighted by latency, so that among equally fast packings the
#: LP picks shallow trees over long chains.
LATENCY_WEIGHT = 1e-3
#: All-reduce piece size and count cap (the op count is 4 (p-1) per piece).  What matters is the count:
#: every tree fills and drains its pipeline once, so each needs many pieces (mesh-4x4: 85.7% of the bound
#: with 512 pieces, 90.4% with 1024, 93.8% with 2048, 96.5% with 4096, whatever the size).
ALLREDUCE_PIECE_BYTES = 64 << 10
MAX_ALLREDUCE_PIECES = 4096
#: A rank sends a piece up only once it has the result of the piece ``window`` before it (credits, as
#: NCCL's bounded slots): otherwise reductions race ahead of broadcasts on shared links and starve them.
#: WINDOW at 1024 pieces, growing as pieces^0.7: measured best on mesh-4x4 and torus-4x4 among 4 to 384 at
#: 1024 pieces (64: 2-4 points less, 384: 10-15 less) and among 96 to 256 at 4096.
WINDOW = 96
#: Multiplicative-weights rounds that generate candidate trees, and the price step per round (relative to
#: the round's busiest link); the final LP picks among the trees found, so more rounds only add choice.
MWU_ROUNDS = 120
MWU_STEP = 0.1
#: Trees lighter than this (after the LP) are dropped and the rest rescaled: too few pieces to use them.
MIN_TREE_WEIGHT = 1e-3
#: Fewest trees whose best weighting is within this fraction of the optimum over all trees found (fewer
#: trees pipeline better only with few pieces; at 4096 pieces 2% slack costs 1-2 points).
TREE_SLACK = 0.002


@dataclass(frozen=True, slots=True)
class Packing:
    """Trees per root: ``trees[r]`` is a list of (weight, parent map child -> parent)."""

    roots: tuple[int, ...]
    trees: dict[int, list[tuple[float, dict[int, int]]]]
    load: float  # LP optimum: time units per unit of data per root on the busiest link


def _candidate_edges(topology: Topology, reverse: bool) -> list[tuple[int, int]]:
    """The cheapest routable edges of each rank, plus its cheapest edges to other hosts.

    The cross-host edges keep the rank graph connected where a host's own fabric
    is far cheaper than its NICs (every intra-host edge would win otherwise).
    """
    p = topology.size
    host_of = {r: h for h, ranks in topology.hosts.items() for r in ranks}
    edges: list[tuple[int, int]] = []
    for u in range(p):
        reachable = []
        for v in range(p):
            if u == v:
                continue
            a, b = (v, u) if reverse else (u, v)
            if topology.has_route(a, b):
                cost = topology.route_latency(a, b) * 1e6 + 1e9 / topology.route_bandwidth(a, b)
                # ties go round the ranks (u+1, u+2, ...) so that on a switch every rank keeps in-edges
                reachable.append((round(cost, 9), (v - u) % p, v))
        reachable.sort()
        chosen = [v for _, _, v in reachable[:EDGES_PER_RANK]]
        remote = [v for _, _, v in reachable if host_of[v] != host_of[u] and v not in chosen]
        edges.extend((u, v) for v in chosen + remote[:CROSS_HOST_EDGES])
    return edges


def pack_trees(topology: Topology, roots: Sequence[int], *, reverse: bool = False,
               solver: SolverOptions | None = None) -> Packing:
    """Solve the packing LP for ``roots`` and decompose it into weighted spanning trees.

    With ``reverse`` the trees are for data flowing toward the root (each edge
    ``u -> v`` of a tree then means ``v`` sends to ``u``).
    """
    edges = _candidate_edges(topology, reverse)
    if reverse:
        loads = [topology.route_shares(v, u) for u, v in edges]
        latency = [topology.route_latency(v, u) for u, v in edges]
    else:
        loads = [topology.route_shares(u, v) for u, v in edges]
        latency = [topology.route_latency(u, v) for u, v in edges]
    return _solve(topology, roots, edges, loads, latency, solver)


def pack_undirected(topology: Topology, solver: SolverOptions | None = None) -> Packing:
    """Undirected spanning trees for all-reduce, every tree edge carrying data both ways.

    The fractional packing is found by column generation without duals: a
    multiplicative-weights pass (Garg and Koenemann, "Faster and simpler
    algorithms for multicommodity flow", FOCS 1998) repeatedly takes the minimum
    spanning tree under link prices that grow with each link's load, and a small
    LP then weighs the trees found to minimise the busiest link's load.  Unlike
    an arborescence LP this needs no decomposition step, which a greedy pass
    cannot do exactly.
    """
    p = topology.size
    forward = _candidate_edges(topology, reverse=False)
    pairs = sorted({(min(u, v), max(u, v)) for u, v in forward if topology.has_route(v, u)})
    loads: list[dict[tuple[str, str], float]] = []
    latency: list[float] = []
    for u, v in pairs:
        # the edge carries a piece up on channel 0 and back down on channel 1, which way round depends on
        # where the tree is centred: each orientation counts half (they differ only where ECMP hashes)
        both: dict[tuple[str, str], float] = {}
        for a, b, channel in ((u, v, 0), (v, u, 1), (u, v, 1), (v, u, 0)):
            for key, share in topology.route_shares(a, b, channel).items():
                both[key] = both.get(key, 0.0) + share / 2
        loads.append(both)
        latency.append(topology.route_latency(u, v) + topology.route_latency(v, u))
    links = sorted({key for shares in loads for key in shares})
    top_bw = max(topology.link(*key).bandwidth for key in links)  # type: ignore[union-attr]
    capacity = {key: topology.link(*key).bandwidth / top_bw for key in links}  # type: ignore[union-attr]
    price = {key: 1.0 / capacity[key] for key in links}
    # latency breaks ties between equally loaded trees, in favour of short hops
    tie = [LATENCY_WEIGHT * lat / (max(latency) or 1.0) for lat in latency]
    found: dict[tuple[int, ...], dict[tuple[str, str], float]] = {}
    for _ in range(MWU_ROUNDS):
        cost = [sum(price[key] * s for key, s in shares.items()) * (1.0 + t) for shares, t in zip(loads, tie)]
        chosen = _spanning_tree(p, pairs, cost)
        if chosen is None:
            raise NotApplicableError("tree packing: the ranks are not connected by routes both ways",
                                     fix="all-reduce tree packing needs full-duplex routes; try ring or mcf")
        tree_load: dict[tuple[str, str], float] = {}
        for e in chosen:
            for key, share in loads[e].items():
                tree_load[key] = tree_load.get(key, 0.0) + share
        peak = max(tree_load[key] / capacity[key] for key in tree_load)
        for key, amount in tree_load.items():
            price[key] *= math.exp(MWU_STEP * amount / capacity[key] / peak)
        found.setdefault(tuple(chosen), tree_load)
    columns = list(found.values())
    weights, load = _weigh(columns, capacity, solver)
    # fewer trees pipeline better (each keeps more pieces in flight): keep the heaviest few that stay
    # within TREE_SLACK of the optimum
    ranked = sorted(range(len(columns)), key=lambda j: -weights[j])
    lo, hi = 1, len(ranked)
    best = (weights, load, list(range(len(columns))))
    while lo < hi:
        mid = (lo + hi) // 2
        kept = ranked[:mid]
        w, value = _weigh([columns[j] for j in kept], capacity, solver)
        if value <= load * (1 + TREE_SLACK):
            best, hi = (w, value, kept), mid
        else:
            lo = mid + 1
    w, value, kept = best
    keys = list(found)
    trees = [(w[n], _parent_map(p, [pairs[e] for e in keys[j]])) for n, j in enumerate(kept) if w[n] > MIN_TREE_WEIGHT]
    total = sum(x for x, _ in trees)
    return Packing((0,), {0: [(x / total, parent) for x, parent in trees]}, value * total)


def _weigh(columns: list[dict[tuple[str, str], float]], capacity: dict[tuple[str, str], float],
           solver: SolverOptions | None) -> tuple[list[float], float]:
    """Tree weights summing to 1 that minimise the busiest link's load, and that load."""
    lp = LinearProgram()
    t = lp.var(cost=1.0)
    weight = [lp.var() for _ in columns]
    lp.add_eq([(w, 1.0) for w in weight], 1.0)
    for key, cap in capacity.items():
        terms = [(w, tree_load[key]) for w, tree_load in zip(weight, columns) if key in tree_load]
        if terms:
            lp.add_le([*terms, (t, -cap)], 0.0)
    values = solve(lp, solver or DEFAULT_SOLVER).values
    return [float(values[w]) for w in weight], float(values[t])


def _spanning_tree(p: int, pairs: list[tuple[int, int]], cost: list[float]) -> list[int] | None:
    """Kruskal: indices into ``pairs`` of a minimum spanning tree under ``cost``, None if disconnected."""
    leader = list(range(p))

    def find(a: int) -> int:
        while leader[a] != a:
            leader[a] = leader[leader[a]]
            a = leader[a]
        return a

    chosen: list[int] = []
    for e in sorted(range(len(pairs)), key=lambda e: (cost[e], e)):
        a, b = find(pairs[e][0]), find(pairs[e][1])
        if a != b:
            leader[a] = b
            chosen.append(e)
    return chosen if len(chosen) == p - 1 else None


def _parent_map(p: int, edges: list[tuple[int, int]]) -> dict[int, int]:
    """The undirected tree ``edges`` as child -> parent from rank 0."""
    tree = _bfs_tree(p, 0, [*edges, *((v, u) for u, v in edges)])
    assert tree is not None  # a spanning tree spans
    return tree


def _solve(topology: Topology, roots: Sequence[int], edges: list[tuple[int, int]],
           loads: list[dict[tuple[str, str], float]], latency: list[float],
           solver: SolverOptions | None) -> Packing:
    """The packing LP over candidate ``edges``, each loading links by ``loads[k]`` per unit of tree weight."""
    p = topology.size
    flows = len(roots) * (p - 1) * len(edges)
    if flows > MAX_FLOW_VARIABLES:
        raise NotApplicableError(
            f"tree packing: its LP would have {flows:,} flow variables ({len(roots)} roots x {p - 1} destinations"
            f" x {len(edges)} edges), above {MAX_FLOW_VARIABLES:,}", fix="use multitree or hierarchical here")
    out_edges: dict[int, list[int]] = {u: [] for u in range(p)}
    in_edges: dict[int, list[int]] = {u: [] for u in range(p)}
    for k, (u, v) in enumerate(edges):
        out_edges[u].append(k)
        in_edges[v].append(k)
    links = sorted({key for shares in loads for key in shares})  # sorted: the row order must not follow str hashes
    top_bw = max(topology.link(*key).bandwidth for key in links)  # type: ignore[union-attr]
    scale = max(latency) or 1.0

    lp = LinearProgram()
    t = lp.var(cost=1.0)
    x = {(r, k): lp.var(cost=LATENCY_WEIGHT * latency[k] / scale) for r in roots for k in range(len(edges))}
    for r in roots:
        for d in range(p):
            if d == r:
                continue
            flow = [lp.var() for _ in edges]
            for k in range(len(edges)):
                lp.add_le([(flow[k], 1.0), (x[r, k], -1.0)], 0.0)
            for node in range(p):
                if node == r:
                    continue
                # inflow - outflow = 1 at d, 0 elsewhere (the source balances itself)
                terms = [(flow[k], 1.0) for k in in_edges[node]] + [(flow[k], -1.0) for k in out_edges[node]]
                lp.add_eq(terms, 1.0 if node == d else 0.0)
    usage: dict[tuple[str, str], list[tuple[int, float]]] = {key: [] for key in links}
    for k, shares in enumerate(loads):
        for key, share in shares.items():
            usage[key].extend((x[r, k], share) for r in roots)
    for key, terms in usage.items():
        capacity = topology.link(*key).bandwidth / top_bw  # type: ignore[union-attr]
        lp.add_le([*terms, (t, -capacity)], 0.0)
    solver = solver or DEFAULT_SOLVER
    solution = solve(lp, solver)
    if not solution.optimal:  # stopped at its limit: the point need not hold a unit flow to every rank
        raise NotApplicableError(f"tree packing: {solver.backend} did not solve its LP ({flows:,} flow variables)"
                                 f" within {solver.time_limit_s:g} s", fix="use multitree or hierarchical here")
    values = solution.values
    trees: dict[int, list[tuple[float, dict[int, int]]]] = {}
    for r in roots:
        capacity = {edges[k]: values[x[r, k]] for k in range(len(edges)) if values[x[r, k]] > 1e-9}
        trees[r] = _decompose(p, r, capacity)
    return Packing(tuple(roots), trees, float(values[t]))


def _decompose(p: int, root: int, capacity: dict[tuple[int, int], float]) -> list[tuple[float, dict[int, int]]]:
    """Greedy arborescence decomposition: repeatedly take the widest shallow spanning tree in what is left."""
    trees: list[tuple[float, dict[int, int]]] = []
    remaining = dict(capacity)
    total = 0.0
    while total < 1.0 - 1e-6:
        levels = sorted({w for w in remaining.values() if w > 1e-9}, reverse=True)
        found = None
        # widest threshold at which the edges still span every rank from the root
        lo, hi = 0, len(levels) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            parent = _bfs_tree(p, root, [e for e, w in remaining.items() if w >= levels[mid] - 1e-12])
            if parent is not None:
                found = (levels[mid], parent)
                hi = mid - 1
            else:
                lo = mid + 1
        if found is None:
            break
        width, parent = found
        weight = min(width, 1.0 - total)
        for child, par in parent.items():
            remaining[(par, child)] -= weight
        trees.append((weight, parent))
        total += weight
        if len(trees) > 4 * p:
            break
    if not trees:
        raise NotApplicableError("tree packing found no spanning tree (the LP solution is degenerate)")
    return [(w / total, parent) for w, parent in trees]


def _bfs_tree(p: int, root: int, edges: list[tuple[int, int]]) -> dict[int, int] | None:
    adjacency: dict[int, list[int]] = {}
    for u, v in edges:
        adjacency.setdefault(u, []).append(v)
    parent: dict[int, int] = {}
    seen = {root}
    queue = deque([root])
    while queue:
        u = queue.popleft()
        for v in adjacency.get(u, ()):
            if v not in seen:
                seen.add(v)
                parent[v] = u
                queue.append(v)
    return parent if len(seen) == p else None


def _assign_pieces(trees: list[tuple[float, dict[int, int]]], pieces: int) -> list[tuple[dict[int, int], int]]:
    """Largest-remainder split of ``pieces`` among trees by weight: (tree, how many pieces)."""
    quotas = [w * pieces for w, _ in trees]
    counts = [int(q) for q in quotas]
    for i in sorted(range(len(trees)), key=lambda i: counts[i] - quotas[i])[: pieces - sum(counts)]:
        counts[i] += 1
    return [(parent, n) for (_, parent), n in zip(trees, counts) if n]


def _tree_pieces(packing: Packing, pieces: int) -> Iterator[tuple[int, list[tuple[int, int]], int]]:
    """(root, the tree's edges from the root outward, piece index) for every piece of every root."""
    for r in packing.roots:
        j = 0
        for parent, n in _assign_pieces(packing.trees[r], pieces):
            order = _bfs_order(parent, r)
            for piece in range(j, j + n):
                yield r, order, piece
            j += n


def _bfs_order(parent: dict[int, int], root: int) -> list[tuple[int, int]]:
    """Tree edges (parent, child) from the root outward."""
    children: dict[int, list[int]] = {}
    for child, par in parent.items():
        children.setdefault(par, []).append(child)
    order, queue = [], deque([root])
    while queue:
        u = queue.popleft()
        for v in sorted(children.get(u, ())):
            order.append((u, v))
            queue.append(v)
    return order


def _pieces(options: Options, p: int) -> int:
    if options.pipeline:
        return options.pipeline
    per_root = options.size_bytes / p
    # enough pieces to follow the tree weights and pipeline down the trees, but not tiny messages
    return max(1, min(32, int(per_root // (256 << 10)) or 1))


def _allreduce_pieces(options: Options) -> int:
    if options.pipeline:
        return options.pipeline
    # pieces of ALLREDUCE_PIECE_BYTES: enough to follow the tree weights and to keep a tree's pipeline
    # (reduce up, broadcast down: twice its depth) short against its share of the pieces
    return max(1, min(MAX_ALLREDUCE_PIECES, options.size_bytes // ALLREDUCE_PIECE_BYTES))


def _centred(topology: Topology, parent: dict[int, int]) -> list[tuple[int, int]]:
    """The tree's edges (parent, child) outward from its latency centre, the root that makes pipelines shortest.

    A piece's reduce and broadcast both take the tree's height from the root, so
    the root is the rank of smallest eccentricity (route latencies, then hops).
    """
    adjacency: dict[int, list[int]] = {}
    for child, par in parent.items():
        adjacency.setdefault(child, []).append(par)
        adjacency.setdefault(par, []).append(child)

    def eccentricity(start: int) -> tuple[float, int]:
        far, hops = 0.0, 0
        stack = [(start, -1, 0.0, 0)]
        while stack:
            u, came, dist, depth = stack.pop()
            far, hops = max(far, dist), max(hops, depth)
            stack.extend((v, u, dist + topology.route_latency(u, v), depth + 1) for v in adjacency[u] if v != came)
        return round(far, 12), hops

    root = min(sorted(adjacency), key=eccentricity)
    rerooted = _bfs_tree(len(adjacency), root, [(u, v) for u in adjacency for v in adjacency[u]])
    assert rerooted is not None  # a spanning tree spans
    return _bfs_order(rerooted, root)


def _interleave(counts: list[int]) -> list[int]:
    """Tree index of every piece, the trees' pieces spread evenly over the sequence (each tree keeps busy)."""
    slots = sorted(((j + 0.5) / n, i) for i, n in enumerate(counts) for j in range(n))
    return [i for _, i in slots]


def _allreduce(topology: Topology, options: Options) -> Schedule:
    """All-reduce over undirected packed trees: each piece reduced up its tree, then broadcast down it."""
    p = topology.size
    packing = pack_undirected(topology)
    trees = packing.trees[packing.roots[0]]
    k = _allreduce_pieces(options)
    assigned = _assign_pieces(trees, k)
    orders = [_centred(topology, parent) for parent, _ in assigned]
    b = ScheduleBuilder("allreduce", p, k, k)
    for rank in range(p):
        b.copy(rank, Chunk("i", 0, k), Chunk("o", 0, k))
    window = max(WINDOW, round(WINDOW * (k / 1024) ** 0.7))
    done: list[list[int]] = [[] for _ in range(p)]  # per rank, its last op on each piece, in piece order
    for c, i in enumerate(_interleave([n for _, n in assigned])):
        piece = Chunk("o", c)
        for par, child in reversed(orders[i]):  # deepest edges first: a node has all its children's sums
            gate = done[child][-window:-window + 1] if len(done[child]) >= window else []
            b.send(child, par, piece, step=0, channel=0, after=gate)
            b.recv(par, child, piece, reduce=True, step=0, channel=0)
        root = orders[i][0][0]
        for par, child in orders[i]:
            b.send(par, child, piece, step=1, channel=1)
            done[child].append(b.recv(child, par, piece, step=1, channel=1))
        done[root].append(len(b.programs[root]) - 1)
    return b.build("treepack", {**options.as_dict(), "pieces": k, "trees": len(assigned),
                                "lp_load": round(packing.load, 6)})


def treepack(topology: Topology, collective: str, options: Options) -> Schedule:
    """Tree-packing schedule for ``collective`` (see the module docstring)."""
    p = topology.size
    if p > MAX_RANKS:
        raise NotApplicableError(f"tree packing solves an LP per rank pair; {p} ranks exceed {MAX_RANKS}",
                                 fix="use hierarchical or multitree at this scale")
    if p == 1:
        raise NotApplicableError("tree packing needs at least two ranks")
    if collective == "allreduce" and topology.symmetric:
        return _allreduce(topology, options)
    k = _pieces(options, p)
    rooted = collective in ("broadcast", "reduce")
    roots = [options.root] if rooted else list(range(p))
    if rooted and k < 4:
        k = 4
    in_chunks, out_chunks = chunk_counts(collective, p, p * k if collective == "allreduce" else k)
    b = ScheduleBuilder(collective, p, in_chunks, out_chunks, scratch_chunks=in_chunks if collective ==
                        "reducescatter" else 0, root=options.root if rooted else None)
    down = pack_trees(topology, roots) if collective in ("allgather", "allreduce", "broadcast") else None
    up = None
    if collective in ("reducescatter", "allreduce", "reduce"):
        # on a full-duplex fabric the reversed LP is the same LP: reduce along the broadcast trees
        up = down if down is not None and topology.symmetric else pack_trees(topology, roots, reverse=True)

    def piece_chunk(r: int, j: int) -> int:
        return j if rooted else r * k + j

    # every rank starts with its own data in the buffer the trees reduce into / forward from
    acc = "s" if collective == "reducescatter" else "o"
    if collective != "allgather":
        for rank in range(p):
            b.copy(rank, Chunk("i", 0, in_chunks), Chunk(acc, 0, in_chunks))
    if up is not None:
        for r, order, piece in _tree_pieces(up, k):
            c = piece_chunk(r, piece)
            for par, child in reversed(order):  # deepest edges first: a node has all its children's sums
                b.transfer(child, par, Chunk(acc, c), Chunk(acc, c), reduce=True, step=0)
            if collective == "reducescatter":
                b.copy(r, Chunk("s", c), Chunk("o", piece), step=0)
    if down is not None:
        for r, order, piece in _tree_pieces(down, k):
            c = piece_chunk(r, piece)
            if collective == "allgather":
                b.copy(r, Chunk("i", piece), Chunk("o", c))
            for par, child in order:
                b.transfer(par, child, Chunk("o", c), Chunk("o", c), step=1)
    load = max(x.load for x in (down, up) if x is not None)
    return b.build("treepack", {**options.as_dict(), "pieces": k, "lp_load": round(load, 6)})
