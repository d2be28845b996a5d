"""Chunk formulas of the symmetric form that set each digit of a block's rank from one digit of the rank.

A buffer laid out as ``unit`` chunks per rank of the grid (an all-gather's output, a reduce-scatter's input)
is named by formulas ``(offset + sum(coefs[e] * x[e])) mod m`` of a rank's coordinates ``x``.  Such a formula is
*digit-wise* where each term moves one digit of the block's rank and nothing else (no carries): then the chunk
is ``unit * sum(strides[f] * tables[f][x[sources[f]]]) + within`` at every point of the grid (after the
copies of the layout before it, where a buffer holds several: an all-reduce's slices), and what holds at
every point (the chunks stay in range; a translation of one digit moves them as it moves the blocks) is decided
digit by digit, in time linear in the digits' sizes rather than in the grid's.  Halving-doubling levels write
their blocks' owners this way on a grid of binary digits (a digit kept, flipped or fixed), each block digit set
by the same digit of the rank; an all-reduce whose levels order its blocks otherwise than its ranks (virtual
order: the last level's digits highest) sets them from other digits, which :func:`decode` reads where asked
(``across``).  A formula that is not digit-wise (a ring's or a direct level's walk, ``(i + t) mod n``,
carries) is decoded as None and left to the caller's point-by-point checks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from topocc.runtime.symmetric import Field, grid_strides

__all__ = ["Digitwise", "decode"]


@dataclass(frozen=True, slots=True)
class Digitwise:
    """Chunk ``first + unit * sum(strides[f] * tables[f][x[sources[f]]]) + within`` at coordinates ``x`` of
    ``shape``: block digit ``f`` is set by coordinate ``sources[f]`` (each coordinate sets at most one block
    digit; a block digit that no coordinate sets has a constant table and is its own source)."""

    shape: tuple[int, ...]
    tables: tuple[tuple[int, ...], ...]
    within: int
    unit: int
    sources: tuple[int, ...]
    #: the first chunk of the copy of the block layout the formula stays in, and the copies in the buffer (see
    #: :func:`decode`'s ``repeats``)
    first: int = 0
    repeats: int = 1

    def largest(self) -> int:
        """The largest chunk over the grid."""
        return (self.first + self.unit * sum(s * max(t) for s, t in zip(grid_strides(self.shape), self.tables))
                + self.within)

    def sets(self, digit: int) -> int | None:
        """The block digit that coordinate ``digit`` sets, or None where the formula does not read it."""
        for f, (source, table) in enumerate(zip(self.sources, self.tables)):
            if source == digit and len(set(table)) > 1:
                return f
        return None

    def follows(self, digit: int, block: int) -> bool:
        """Whether adding 1 to coordinate ``digit`` (modulo its size) adds 1 to block digit ``block`` and
        changes no other: the formula then commutes with that translation of the grid and that of the
        blocks."""
        n, table = self.shape[block], self.tables[block]
        return (self.sources[block] == digit and self.shape[digit] == n
                and all(table[(v + 1) % n] == (table[v] + 1) % n for v in range(n)))

    def run_start(self, count: int) -> int | None:
        """The first of the lowest digits that ``count`` chunks from the formula span whole (the grid's rank
        of digits where they stay within one block), or None where they do not make such a box: chunks
        within a block, every block whose higher digits are the formula's and lower ones any value, or whole
        copies of the layout (0)."""
        if self.within + count <= self.unit:
            return len(self.shape)
        if self.within:
            return None
        span, k = self.unit, len(self.shape)
        while span < count and k > 0:
            k -= 1
            if any(self.tables[k]):
                return None
            span *= self.shape[k]
        if k == 0 and not count % span and self.first + count <= self.repeats * span:
            return 0
        return k if span == count else None

    def fixed_ranks(self) -> list[tuple[int, ...]]:
        """Per digit, the coordinates where a peer formula (``unit`` 1, ``within`` 0) names the rank itself:
        the formula gives a rank its own number exactly at the points whose every digit is one of these (each
        block digit set by its own digit: :func:`decode` without ``across``)."""
        assert self.sources == tuple(range(len(self.shape)))
        return [tuple(v for v, t in enumerate(table) if t == v) for table in self.tables]


def decode(index: Field, modulus: int, shape: Sequence[int], unit: int, *, across: bool = False,
           repeats: int = 1) -> Digitwise | None:
    """``index`` (modulo ``modulus``) as a digit-wise formula over blocks of ``unit`` chunks per rank of
    ``shape``, or None where it is not one: each block digit set by the same digit of the rank, or where
    ``across``, by any one digit (no two setting the same block digit).  The buffer may hold ``repeats``
    copies of that layout one after the other (an all-reduce's slices in virtual order, each a block of one
    chunk per rank); the formula must stay within one.

    Exact: with ``y_e(v) = (offset + coefs[e] * v) mod m`` and ``base = y_e(0)``, every term is
    ``y_e(x[e]) - base`` modulo ``m``; where each of those moves one digit of the block alone, staying in its
    range, and no two move the same one, their sum with ``base`` is the digit-wise chunk, below ``unit`` times
    the ranks, so no reduction modulo ``m`` changes it.  A term that moves one digit by at most its size less
    one is a multiple of that digit's stride below the next stride up, so the digit it moves is unique.
    """
    period = unit * math.prod(shape)
    if unit < 1 or repeats < 1 or period * repeats > modulus:
        return None
    offset, coefs = (index, (0,) * len(shape)) if isinstance(index, int) else (index.offset, index.coefs)
    base = offset % modulus
    if base >= period * repeats:
        return None
    copy, rest = divmod(base, period)
    block, within = divmod(rest, unit)
    strides = grid_strides(shape)
    own = [block // s % n for n, s in zip(shape, strides)]
    tables = [(v,) * n for n, v in zip(shape, own)]
    sources = list(range(len(shape)))
    taken = [False] * len(shape)
    for e, (n, c) in enumerate(zip(shape, coefs)):
        terms = [(offset + c * v) % modulus - base for v in range(n)]
        moved = next((t for t in terms if t), 0)
        if not moved:
            continue
        f = e if not across else next((f for f, s in enumerate(strides) if s * unit <= abs(moved)), None)
        if f is None or taken[f]:
            return None
        table = []
        for t in terms:
            step, rest = divmod(t, unit * strides[f])
            if rest or not 0 <= own[f] + step < shape[f]:
                return None
            table.append(own[f] + step)
        taken[f], tables[f], sources[f] = True, tuple(table), e
    return Digitwise(tuple(shape), tuple(tables), within, unit, tuple(sources), copy * period, repeats)
