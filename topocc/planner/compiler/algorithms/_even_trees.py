"""One spanning tree of a torus or mesh whose images under the grid's symmetries pack undirected trees evenly.

An all-reduce over undirected trees (:func:`topocc.planner.compiler.algorithms.treepack.pack_undirected`)
meets its load only as a fractional packing: dozens of trees of unequal weights.  Links are shared fairly
per connection, not per tree weight, so such a packing runs well below its load.  On a torus or mesh the
fabric's symmetries give equal weights instead: the images of one tree under a group ``G`` of automorphisms,
each of weight ``1/|G|``, load every link with the mean of what the one tree puts on the links of its orbit.
So a search over single trees finds an even packing: edge swaps (add a grid edge, drop one of the cycle it
closes), annealed on the symmetrised busiest link, then on the tree's height from the grid's centre (every
hop of height is pipeline fill and drain).  The group is the grid's reflections and the permutations of
its equal dimensions (a torus's translations too would make a tree per rank); a permutation that does not
keep every neighbour pair's route (its links' loads and latency) is left out.  One that is not the fabric's
own only makes the packing worse, never the schedule wrong: the schedule is simulated and verified as any
other.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

from topocc.planner.compiler.algorithms._arborescence import RankGraph, rank_graph
from topocc.planner.compiler.algorithms.bucket import Grid, grid_of
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Memo, Network

__all__ = ["EvenTrees", "even_trees"]

#: Restarts of the search and swaps tried in each: on the 4x4x4 mesh every restart reached the same load,
#: most of them at the least height (the grid's radius); the whole search takes about a second on 2 cores.
RESTARTS = 4
SWAPS = 2500
#: Annealing: the starting temperature in units of the busiest link's load, its decay per swap, and what a
#: hop of height costs against load when a worse swap is weighed.
TEMPERATURE = 0.05
COOLING = 0.999
HOP_PRICE = 0.02
#: The search is seeded, so a topology always gets the same trees (plans keep their hashes).
SEED = 1
#: Ranks above which the search is not tried: its swaps are Python work per rank of a path, and tree packing
#: declines all-reduce beyond about 360 ranks anyway.
MAX_RANKS = 360


@dataclass(frozen=True, slots=True)
class EvenTrees:
    """Distinct spanning trees (their edges, each ``(u, v)`` with ``u < v``) of equal weight, and the busiest
    link's load per unit of data, each tree edge carrying the data both ways, in units of the fastest link."""

    trees: tuple[tuple[tuple[int, int], ...], ...]
    load: float


def even_trees(net: Network) -> EvenTrees | None:
    """The even packing of the network's grid (see the module docstring), kept with the network; None where
    the fabric is no torus or mesh, has no symmetry, or has more than :data:`MAX_RANKS` ranks."""
    return net.memo(_EVEN)


def _search(net: Network) -> EvenTrees | None:
    p = net.topology.size
    if p > MAX_RANKS:
        return None
    try:
        grid = grid_of(net)
    except NotApplicableError:
        return None
    pairs = _neighbours(grid)
    graph = rank_graph(net, both_ways=True)
    arc_of = {(int(u), int(v)): k for k, (u, v) in enumerate(zip(graph.tail, graph.head))}
    if any((u, v) not in arc_of or (v, u) not in arc_of for u, v in pairs):
        return None
    index = {pair: e for e, pair in enumerate(pairs)}
    # each grid edge's load (both ways), and the symmetrised one: the mean over the group of its images'
    loads = np.array([graph.arc_loads([arc_of[u, v], arc_of[v, u]]) for u, v in pairs])
    route = _routes(graph, arc_of, pairs)
    images = [g for g in _symmetries(grid)
              if all(route[u, v] == route[int(g[u]), int(g[v])] and route[v, u] == route[int(g[v]), int(g[u])]
                     for u, v in pairs)]
    if len(images) < 2:
        return None
    moved = np.array([[index[_edge(g[u], g[v])] for u, v in pairs] for g in images])
    even = loads[moved].mean(axis=0)
    adjacency = _adjacent(p, pairs)
    centre = min(range(p), key=lambda r: (max(_depths(adjacency, r)), r))
    rng = np.random.default_rng(SEED)
    best: tuple[tuple[float, int], list[tuple[int, int]]] | None = None
    for _ in range(RESTARTS):
        chosen = _anneal(pairs, index, adjacency, even, centre, rng)
        tree = [pairs[e] for e in np.flatnonzero(chosen)]
        key = (round(float(even[chosen].sum(axis=0).max()), 9), max(_depths(_adjacent(p, tree), centre)))
        if best is None or key < best[0]:
            best = (key, tree)
    assert best is not None  # RESTARTS > 0
    (load, _), tree = best
    copies: dict[tuple[tuple[int, int], ...], int] = {}
    for g in images:
        edges = tuple(sorted(_edge(g[u], g[v]) for u, v in tree))
        copies[edges] = copies.get(edges, 0) + 1
    # a tree that some symmetries keep is the image of as many: equal weights need as many copies of each
    if len(set(copies.values())) > 1:
        return None
    return EvenTrees(tuple(copies), load)


_EVEN: Memo[EvenTrees | None] = Memo("treepack: even trees", _search)


def _anneal(pairs: list[tuple[int, int]], index: dict[tuple[int, int], int], adjacency: list[list[int]],
            even: np.ndarray, centre: int, rng: np.random.Generator) -> np.ndarray:
    """One run of the search from a breadth-first tree of the centre (random among equals): which grid edges
    the tree keeps."""
    chosen = np.zeros(len(pairs), dtype=bool)
    for child, par in enumerate(_up(adjacency, centre, rng)):
        if child != centre:
            chosen[index[_edge(child, par)]] = True
    load = even[chosen].sum(axis=0)
    tree = _adjacent(len(adjacency), [pairs[e] for e in np.flatnonzero(chosen)])
    depth = _depths(tree, centre)
    up = _up(tree, centre)
    current = _key(load, max(depth))
    temperature = TEMPERATURE * current[0]
    for _ in range(SWAPS):
        temperature *= COOLING
        add = int(rng.choice(np.flatnonzero(~chosen)))
        u, v = pairs[add]
        path = _path(up, depth, u, v)
        x, y = path[int(rng.integers(len(path)))]
        drop = index[_edge(x, y)]
        trial = load + even[add] - even[drop]
        _swap(tree, (x, y), (u, v))
        trial_depth = _depths(tree, centre)
        candidate = _key(trial, max(trial_depth))
        # a worse tree is taken with the annealing's odds: its extra load, and its extra hops at HOP_PRICE each
        worse = candidate[0] - current[0] + HOP_PRICE * current[0] * (candidate[1] - current[1])
        if candidate <= current or worse <= 0 or rng.random() < np.exp(-worse / temperature):
            chosen[add], chosen[drop] = True, False
            load, depth, current, up = trial, trial_depth, candidate, _up(tree, centre)
        else:
            _swap(tree, (u, v), (x, y))
    return chosen


def _edge(u: int | np.integer, v: int | np.integer) -> tuple[int, int]:
    """The undirected edge of ``u`` and ``v``, smaller rank first."""
    return (int(u), int(v)) if u < v else (int(v), int(u))


def _key(load: np.ndarray, height: int) -> tuple[float, int, tuple[float, ...]]:
    """What the search minimises: the busiest link, the height, then every other link, busiest first."""
    ranked = np.round(np.sort(load)[::-1], 9)
    return float(ranked[0]), height, tuple(ranked.tolist())


def _swap(tree: list[list[int]], drop: tuple[int, int], add: tuple[int, int]) -> None:
    """Replace the edge ``drop`` of ``tree`` by ``add``."""
    tree[drop[0]].remove(drop[1])
    tree[drop[1]].remove(drop[0])
    tree[add[0]].append(add[1])
    tree[add[1]].append(add[0])


def _neighbours(grid: Grid) -> list[tuple[int, int]]:
    """The grid's edges (u < v): ranks one step apart along a line of a dimension, round the rings."""
    found: set[tuple[int, int]] = set()
    for d, (n, ring) in enumerate(zip(grid.sizes, grid.rings)):
        for line in grid.lines(d):
            found.update(_edge(a, b) for a, b in zip(line, line[1:] + (line[:1] if ring and n > 2 else [])))
    return sorted(found)


def _symmetries(grid: Grid) -> list[np.ndarray]:
    """Rank permutations of the grid's coordinates: equal dimensions permuted, each reflected or not.  A
    torus's translations are left out: they would multiply the trees by the ranks, each needing pieces."""
    at = {c: r for r, c in enumerate(grid.coords)}
    sizes, ndim = grid.sizes, len(grid.sizes)
    coords = np.array(grid.coords)
    found: list[np.ndarray] = []
    for order in itertools.permutations(range(ndim)):
        if any(sizes[order[d]] != sizes[d] for d in range(ndim)):
            continue
        for flips in itertools.product((False, True), repeat=ndim):
            image = coords[:, list(order)]
            for d in range(ndim):
                if flips[d]:
                    image[:, d] = sizes[d] - 1 - image[:, d]
            found.append(np.array([at[tuple(c)] for c in image.tolist()]))
    return found


def _routes(graph: RankGraph, arc_of: dict[tuple[int, int], int],
            pairs: list[tuple[int, int]]) -> dict[tuple[int, int], tuple[tuple[float, ...], float]]:
    """Each grid pair's route, both ways, as what a symmetry must keep: the loads it puts on links (sorted)
    and its latency, rounded so that equal routes compare equal."""
    found: dict[tuple[int, int], tuple[tuple[float, ...], float]] = {}
    for u, v in pairs:
        for arc in ((u, v), (v, u)):
            loads = graph.arc_loads([arc_of[arc]])
            found[arc] = (tuple(np.round(np.sort(loads[loads > 0]), 9).tolist()),
                          round(float(graph.latency[arc_of[arc]]), 15))
    return found


def _adjacent(p: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    """Each rank's neighbours over ``edges``."""
    adjacency: list[list[int]] = [[] for _ in range(p)]
    for u, v in edges:
        adjacency[u].append(v)
        adjacency[v].append(u)
    return adjacency


def _depths(adjacency: list[list[int]], root: int) -> list[int]:
    """Hops from ``root`` to every rank (breadth first)."""
    depth = [-1] * len(adjacency)
    depth[root] = 0
    queue = deque([root])
    while queue:
        u = queue.popleft()
        for v in adjacency[u]:
            if depth[v] < 0:
                depth[v] = depth[u] + 1
                queue.append(v)
    return depth


def _up(graph: list[list[int]], root: int, rng: np.random.Generator | None = None) -> list[int]:
    """Each rank's parent in a breadth-first tree of ``graph`` from ``root`` (the root its own): in a tree, its
    parent; with ``rng``, each rank's neighbours are taken in random order."""
    up = list(range(len(graph)))
    seen = {root}
    queue = deque([root])
    while queue:
        u = queue.popleft()
        for v in graph[u] if rng is None else rng.permutation(graph[u]).tolist():
            if v not in seen:
                seen.add(v)
                up[v] = u
                queue.append(v)
    return up


def _path(up: list[int], depth: list[int], u: int, v: int) -> list[tuple[int, int]]:
    """The tree edges between ``u`` and ``v`` (through their lowest common ancestor)."""
    edges: list[tuple[int, int]] = []
    while u != v:
        if depth[u] >= depth[v]:
            edges.append((u, up[u]))
            u = up[u]
        else:
            edges.append((v, up[v]))
            v = up[v]
    return edges
