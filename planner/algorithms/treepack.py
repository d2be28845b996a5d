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
the reversed topology leaf to root; all-reduce is the two in sequence;
broadcast and reduce use one root.
"""

from __future__ import annotations

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

__all__ = ["Packing", "pack_trees", "treepack"]

#: The LP has roots x destinations x edges flow variables; beyond this many ranks use a hierarchical plan.
MAX_RANKS = 32
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
    p = topology.size
    edges = _candidate_edges(topology, reverse)
    out_edges: dict[int, list[int]] = {u: [] for u in range(p)}
    in_edges: dict[int, list[int]] = {u: [] for u in range(p)}
    for k, (u, v) in enumerate(edges):
        out_edges[u].append(k)
        in_edges[v].append(k)
    loads = [topology.route_shares(v, u) if reverse else topology.route_shares(u, v) for u, v in edges]
    links = sorted({key for shares in loads for key in shares})  # sorted: the row order must not follow str hashes
    top_bw = max(topology.link(*key).bandwidth for key in links)  # type: ignore[union-attr]
    latency = [(topology.route_latency(v, u) if reverse else topology.route_latency(u, v)) for u, v in edges]
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
    solution = solve(lp, solver or DEFAULT_SOLVER)
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


def treepack(topology: Topology, collective: str, options: Options) -> Schedule:
    """Tree-packing schedule for ``collective`` (see the module docstring)."""
    p = topology.size
    if p > MAX_RANKS:
        raise NotApplicableError(f"tree packing solves an LP per rank pair; {p} ranks exceed {MAX_RANKS}",
                                 fix="use hierarchical or multitree at this scale")
    if p == 1:
        raise NotApplicableError("tree packing needs at least two ranks")
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
