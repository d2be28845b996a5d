"""Digit-wise chunk formulas: decoded exactly where they are digit-wise, and their questions answered as every
point of the grid answers them."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from topocc.planner.analysis.digitwise import Digitwise, decode
from topocc.runtime.symmetric import Formula, grid_strides

SHAPES = [(2, 2, 2), (3, 2, 4), (4, 4), (2, 3, 2, 2), (5,)]


def _points(shape: tuple[int, ...]) -> np.ndarray:
    return np.indices(shape).reshape(len(shape), -1).T


def _at(f: Formula, points: np.ndarray, modulus: int) -> np.ndarray:
    return (f.offset + points @ np.array(f.coefs, dtype=np.int64)) % modulus


def _digitwise_formula(rng: random.Random, shape: tuple[int, ...], unit: int, modulus: int,
                       across: bool = False) -> Formula:
    """A formula whose every digit keeps, flips or fixes a block digit (the top one may also be shifted,
    wrapping modulo the buffer), written as the symmetrizer writes it: modulo the buffer.  Each digit sets the
    block's same digit, or where ``across``, a digit of the same size shuffled among them."""
    strides = grid_strides(shape)
    blocks = list(range(len(shape)))
    if across:
        for n in set(shape):
            same = [e for e in blocks if shape[e] == n]
            for e, f in zip(same, rng.sample(same, len(same))):
                blocks[e] = f
    offset, coefs = rng.randrange(unit), []
    for e, n in enumerate(shape):
        s = strides[blocks[e]]
        kind = rng.choice(["keep", "flip", "fix"] + (["shift"] if blocks[e] == 0 else []))
        start = {"keep": 0, "flip": n - 1}.get(kind, rng.randrange(n))
        coefs.append({"flip": -unit * s, "fix": 0}.get(kind, unit * s))
        offset += unit * s * start
    return Formula(offset % modulus, tuple(c % modulus for c in coefs))


@pytest.mark.parametrize("shape", SHAPES)
def test_decoding_is_exact_at_every_point(shape: tuple[int, ...]) -> None:
    rng = random.Random(hash(shape) & 0xFFFF)
    points = _points(shape)
    strides = np.array(grid_strides(shape))
    ranks = math.prod(shape)
    decoded = 0
    for _ in range(300):
        unit = rng.choice([1, 2, 3])
        modulus = unit * ranks + rng.choice([0, 0, 5])
        built, across = rng.random() < 0.5, rng.random() < 0.5
        if built:  # where the buffer is longer, a shifted top digit is not digit-wise
            f = _digitwise_formula(rng, shape, unit, modulus, across)
        else:  # any formula: decoded only where it is digit-wise
            f = Formula(rng.randrange(modulus), tuple(rng.randrange(modulus) for _ in shape))
        d = decode(f, modulus, shape, unit, across=across)
        values = _at(f, points, modulus)
        if d is None:
            assert not (built and modulus == unit * ranks)
            continue
        decoded += 1
        assert across or d.sources == tuple(range(len(shape)))
        tables = np.array([[d.tables[e][p[d.sources[e]]] for e in range(len(shape))] for p in points])
        assert np.array_equal(values, unit * (tables @ strides) + d.within)
        assert d.largest() == values.max()
    assert decoded >= 100


@pytest.mark.parametrize("shape", [(3, 2, 4), (4, 4), (2, 3, 2, 2)])
def test_carries_are_not_digitwise(shape: tuple[int, ...]) -> None:
    """A digit below the top shifted by a constant carries into the next one: never decoded."""
    ranks = math.prod(shape)
    for e, n in enumerate(shape):
        if n < 3 or e == 0:
            continue  # the top digit wraps modulo the buffer; a digit of 2 shifted by 1 is a flip
        s = grid_strides(shape)[e]
        coefs = tuple(s if k == e else 0 for k in range(len(shape)))
        f = Formula(s, coefs)
        assert decode(f, ranks, shape, 1) is None


@pytest.mark.parametrize("shape", SHAPES)
def test_questions_are_answered_as_every_point_answers_them(shape: tuple[int, ...]) -> None:
    rng = random.Random(7 + len(shape))
    points = _points(shape)
    strides = np.array(grid_strides(shape))
    ranks = math.prod(shape)
    for _ in range(200):
        unit, across = rng.choice([1, 2]), rng.random() < 0.5
        f = _digitwise_formula(rng, shape, unit, unit * ranks, across)
        d = decode(f, unit * ranks, shape, unit, across=across)
        assert d is not None
        values = _at(f, points, unit * ranks)
        by_rank = dict(zip((points @ strides).tolist(), values.tolist()))
        blocks = values // unit
        for digit, n in enumerate(shape):
            moved = points.copy()
            moved[:, digit] = (moved[:, digit] + 1) % n
            at_moved = np.array([by_rank[r] for r in (moved @ strides).tolist()])
            assert (d.sets(digit) is None) == np.array_equal(at_moved, values)  # sets: whether the digit is read
            for block, m in enumerate(shape):  # follows: f(x + e_digit) is f(x)'s block moved in block digit
                block_coords = (blocks[:, None] // strides) % np.array(shape)
                block_coords[:, block] = (block_coords[:, block] + 1) % m
                translated = unit * (block_coords @ strides) + values % unit
                assert d.follows(digit, block) == np.array_equal(translated, at_moved), (f, digit, block)
        for count in range(1, unit * ranks + 1):  # run_start: the chunks are a box of whole low digits
            start = d.run_start(count)
            if start is None:
                continue
            inner = unit * math.prod(shape[start:])
            assert count == inner or (start == len(shape) and d.within + count <= unit)
            for v in values.tolist():
                assert (v % inner == 0 and count == inner) or v // unit == (v + count - 1) // unit
        if unit == 1 and d.within == 0 and not across:  # fixed_ranks: where the peer is the rank itself
            own = [tuple(p) for p, v, r in zip(points.tolist(), values.tolist(), (points @ strides).tolist()) if v == r]
            fixed = d.fixed_ranks()
            assert sorted(own) == sorted(itertools.product(*fixed))


def test_a_block_of_chunks_is_decoded_with_its_place_in_the_block() -> None:
    d = decode(Formula(7, (0, 18)), 24, (2, 2), 6)  # rank (0, 1)'s block, its second chunk, the last digit flipped
    assert d == Digitwise((2, 2), ((0, 0), (1, 0)), 1, 6, (0, 1))
    assert d is not None and d.run_start(4) == 2 and d.run_start(6) is None
    assert decode(Formula(0, (12, 6)), 24, (2, 2), 6) is not None
    assert decode(Formula(0, (6, 12)), 24, (2, 2), 6) is None  # the digits' strides swapped
    swapped = decode(Formula(0, (6, 12)), 24, (2, 2), 6, across=True)  # read as such
    assert swapped == Digitwise((2, 2), ((0, 1), (0, 1)), 0, 6, (1, 0))
    assert swapped.follows(0, 1) and swapped.follows(1, 0) and not swapped.follows(0, 0)
    assert decode(Formula(0, (6, 6)), 24, (2, 2), 6, across=True) is None  # two digits setting one
    assert decode(Formula(0, (12, 6)), 24, (2, 2), 12) is None  # twice as many chunks as the buffer holds


@pytest.mark.parametrize("shape", SHAPES)
def test_copies_of_the_layout_are_decoded_within_one(shape: tuple[int, ...]) -> None:
    """A buffer of several copies of the block layout (an all-reduce's slices in virtual order): a formula in
    any copy decodes exactly, with that copy's first chunk, where it stays in the copy at every point, and not
    where it crosses into another; whole copies from a copy's start are a run of every digit, within the
    buffer only."""
    rng = random.Random(11 + len(shape))
    points = _points(shape)
    strides = np.array(grid_strides(shape))
    ranks = math.prod(shape)
    decoded = 0
    for _ in range(200):
        unit, copies, across = rng.choice([1, 2]), rng.choice([2, 3]), rng.random() < 0.5
        period = unit * ranks
        modulus = period * copies
        copy = rng.randrange(copies)
        built = _digitwise_formula(rng, shape, unit, modulus, across)
        f = Formula((built.offset + copy * period) % modulus, built.coefs)
        d = decode(f, modulus, shape, unit, across=across, repeats=copies)
        values = _at(f, points, modulus)
        if d is None:
            assert len(set((values // period).tolist())) > 1  # a shifted top digit wraps into another copy
            continue
        decoded += 1
        tables = np.array([[d.tables[e][p[d.sources[e]]] for e in range(len(shape))] for p in points])
        assert np.array_equal(values, d.first + unit * (tables @ strides) + d.within)
        assert d.first == copy * period and d.largest() == values.max()
        assert decode(f, modulus, shape, unit, across=across) is None or copy == 0  # one copy: only the first
    assert decoded >= 100
    for copy in range(3):
        d = decode(copy * ranks, 3 * ranks, shape, 1, repeats=3)
        assert d is not None
        assert [d.run_start(k * ranks) for k in range(1, 4)] == [0] * (3 - copy) + [None] * copy
