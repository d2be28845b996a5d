"""NCCL's double binary tree: two complementary binary trees, each carrying half the data.

Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth broadcast,
reduction and scan", Parallel Computing 2009 (section 3), as adopted by NCCL
2.4: in the second tree the ranks are shifted by one, so most ranks that are
leaves in one tree are interior in the other and every rank's links carry
about one tree's worth of traffic.  All-reduce reduces up both trees and
broadcasts back down, each half pipelined in pieces.  Ranks are laid out in
ring order (hosts contiguous), so the subtrees are mostly host-local.
"""

from __future__ import annotations

from collections.abc import Sequence

from topocc.planner.compiler.algorithms._order import depth_order, pieces, ring_order, root_rank, single_rank, split
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.routing.relay import hops, relays
from topocc.runtime.collective import Collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Schedule

__all__ = ["binary_tree", "double_binary_tree", "tree_link_floor"]

_MAX_PIECES = 64


def binary_tree(nodes: Sequence[int]) -> tuple[int, dict[int, int]]:
    """A balanced in-order binary tree over ``nodes``: (root, parent of every other node).

    In-order layout keeps each subtree a contiguous stretch of ``nodes``, so a
    topology-aware order makes most tree edges local.
    """
    parent: dict[int, int] = {}

    def build(lo: int, hi: int) -> int | None:
        if lo > hi:
            return None
        mid = (lo + hi) // 2
        for child in (build(lo, mid - 1), build(mid + 1, hi)):
            if child is not None:
                parent[child] = nodes[mid]
        return nodes[mid]

    root = build(0, len(nodes) - 1)
    if root is None:
        raise ValueError("a tree needs at least one node")
    return root, parent


def _check(net: Network, collective: str, options: Options) -> Collective:
    """The collective's description, or :class:`NotApplicableError` for one the tree cannot build (a tree moves
    one whole buffer: no collective with a buffer of rank blocks)."""
    topology = net.topology
    kind = describe(collective)
    if kind.split:
        raise NotApplicableError(f"tree does not implement {kind.name} (it builds allreduce, broadcast, reduce)")
    if kind.rooted:
        root_rank(options, topology.size)
    return kind


def _trees(net: Network, root: int | None) -> list[tuple[int, dict[int, int]]]:
    """The two trees (root, parent of every other rank) over the ring order; rooted at ``root`` when given."""
    order = ring_order(net)
    if root is None:
        return [binary_tree(shifted) for shifted in (order, order[1:] + order[:1])]
    at = order.index(root)
    rest = order[at + 1:] + order[:at]
    trees = []
    for shifted in (rest, rest[1:] + rest[:1]):
        sub_root, parent = binary_tree(shifted)
        trees.append((root, {**parent, sub_root: root}))
    return trees


def tree_link_floor(net: Network, collective: str, options: Options) -> float:
    """A lower bound of :func:`topocc.planner.compiler.evaluate.link_time` of the tree's schedule, without building it.

    Each tree carries half the buffer over each of its edges, up to reduce and
    down to broadcast, however many pieces pipeline it; a relayed edge crosses
    every hop of :func:`topocc.planner.routing.relay.hops`.  Only the links every cheapest path
    of a hop crosses (:meth:`Topology.common_links`) are counted, so the bound
    holds under any routing and channel assignment.  At 1024 ranks this costs
    a fraction of a second where the build costs about ten.
    """
    topology = net.topology
    kind = _check(net, collective, options)
    if topology.size == 1:
        return 0.0
    up, down = kind.reduces, kind.replicates
    edges = [edge for _, parent in _trees(net, options.root if kind.rooted else None)
             for child, par in parent.items() for edge in [(child, par)] * up + [(par, child)] * down]
    return net.common_link_time((a, b, options.size_bytes / 2)
                                     for src, dst in edges for a, b in hops(net, src, dst))


def double_binary_tree(net: Network, collective: str, options: Options) -> Schedule:
    """Double-binary-tree schedule for allreduce, broadcast or reduce (root: ``options.root``)."""
    topology = net.topology
    kind = _check(net, collective, options)
    p = topology.size
    meta = options.as_dict()
    rooted = kind.rooted
    root = options.root if rooted else None
    if p == 1:
        return single_rank(kind.name, 1, 1, "tree", meta, root)
    trees = _trees(net, options.root if rooted else None)
    q = pieces(options.pipeline, options.size_bytes / 2, _MAX_PIECES)
    meta.update(pipeline=q, channels=2, trees=[sorted(parent.items()) for _, parent in trees] if p <= 64 else None)
    n = 2 * q
    # a tree edge between ranks without a GPU-free route is relayed through other GPUs
    b = ScheduleBuilder(kind.name, p, n, n, root=root, relay=relays(net))
    for r in range(p):
        if not kind.from_root or r == root:
            b.copy(r, Chunk("i", 0, n), Chunk("o", 0, n))
    for t, (tree_root, parent) in enumerate(trees):
        down = depth_order(tree_root, parent)
        depth = {tree_root: 0}
        for v in down:
            depth[v] = depth[parent[v]] + 1
        height = max(depth.values())
        interior = set(parent.values())
        for piece in split(t * q, q, q):
            whole_input = Chunk("i", piece.index, piece.count)
            if kind.reduces:
                for v in reversed(down):
                    # a leaf sends straight from its input: no wait for its local copy
                    src = piece if v in interior else whole_input
                    b.transfer(v, parent[v], src, piece, reduce=True, step=height - depth[v], channel=t)
            if kind.replicates:
                for v in down:
                    src = whole_input if parent[v] == root else piece
                    b.transfer(parent[v], v, src, piece, step=height + depth[v], channel=t)
    return b.build("tree", meta)
