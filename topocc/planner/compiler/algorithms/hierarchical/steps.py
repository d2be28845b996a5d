"""The steps of one level's reduce-scatter or all-gather, per method: ring, halving-doubling, direct.

A step is a list of :data:`~topocc.planner.compiler.algorithms._order.Send`:
(sending member, receiving member, first part, end part), members and parts
as positions in the group; every group of a level runs the same steps.
"""

from __future__ import annotations

from collections.abc import Callable

from topocc.planner.compiler.algorithms._order import Send, ring_steps

__all__ = ["METHODS", "direct_steps", "halving_doubling_steps", "level_steps", "power_of_two"]


def halving_doubling_steps(n: int, gather: bool) -> list[list[Send]]:
    """Recursive halving (reduce-scatter) or doubling (all-gather) among ``n`` (a power of two) members.

    Thakur, Rabenseifner & Gropp 2005, section 4.4.  Halving at distance ``d``:
    member ``i`` holds the aligned run of ``2d`` parts around its own, sends the
    half its partner ``i ^ d`` keeps and keeps the other; doubling sends the
    aligned run of ``d`` parts it holds and receives the partner's.
    """
    distances = []
    d = 1
    while d < n:
        distances.append(d)
        d *= 2
    if not gather:
        distances.reverse()
    return [[(i, i ^ d, (i ^ d) & ~(d - 1) if not gather else i & ~(d - 1),
              ((i ^ d) & ~(d - 1) if not gather else i & ~(d - 1)) + d) for i in range(n)]
            for d in distances]


def direct_steps(n: int, gather: bool) -> list[list[Send]]:
    """Direct reduce-scatter or all-gather among ``n`` members: one step, every member to every other.

    Reduce-scatter: member ``i`` sends part ``k`` to member ``k``; all-gather:
    member ``i`` sends its part ``i`` to everyone.  One path latency instead of
    ``n - 1`` (ring) or ``log2 n`` (halving-doubling): the latency-optimal
    stage where the members meet through a switch, whose every port then runs
    at once.  Member ``i`` walks its peers from ``i + 1`` on, so that no member
    is everyone's first destination.
    """
    return [[(i, (i + off) % n, i if gather else (i + off) % n, (i if gather else (i + off) % n) + 1)
             for i in range(n) for off in range(1, n)]]


#: Each method's steps, ``(members, gather) -> steps``, by the name ``options.hierarchical.stage_method`` uses.
METHODS: dict[str, Callable[[int, bool], list[list[Send]]]] = {
    "ring": ring_steps,
    "halving-doubling": halving_doubling_steps,
    "direct": direct_steps,
}


def level_steps(method: str, n: int, gather: bool, by_class: bool) -> list[list[Send]]:
    """The steps of ``method`` among ``n`` members; ``by_class`` (a schedule built as one class): a direct
    level of a power-of-two size in the order ``k = 1 .. n - 1``, member ``i`` to member ``i ^ k``.

    That is the same one step, but each peer and part is then an affine
    formula of the member's binary digits (a digit kept or flipped), as one
    class over the ranks' digits needs (:func:`~topocc.planner.compiler.symmetrize.one_class`);
    ``(i + k) mod n`` is not, and neither are the receives' order by sender.
    """
    if not (by_class and method == "direct" and power_of_two(n)):
        return METHODS[method](n, gather)
    return [[(i, i ^ k, i if gather else i ^ k, (i if gather else i ^ k) + 1) for k in range(1, n) for i in range(n)]]


def power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
