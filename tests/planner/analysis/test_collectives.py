"""Collective specifications: chunk layouts, pre/postconditions and NCCL in-place aliasing, as data."""

from __future__ import annotations

import pytest

from topocc.planner.analysis.collectives import COLLECTIVES, CollectiveSpec, canonical_collective, chunk_counts, spec
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.schedule import chunking_problem


@pytest.mark.parametrize(("name", "want"), [
    ("all-reduce", "allreduce"), ("reduce_scatter", "reducescatter"), ("AllGather", "allgather"),
    ("Broadcast", "broadcast"), ("all to all", "alltoall"), ("reduce", "reduce"),
])
def test_canonical_names(name: str, want: str) -> None:
    assert canonical_collective(name) == want


def test_unknown_collective_lists_the_known_ones() -> None:
    with pytest.raises(ScheduleFormatError, match=r"unknown collective 'allsum'.*fix: use one of allreduce"):
        canonical_collective("allsum")


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("ranks", [1, 2, 5])
def test_chunk_counts_fit_the_collective_shape(collective: str, ranks: int) -> None:
    n_in, n_out = chunk_counts(collective, ranks, 3)
    assert chunking_problem(collective, ranks, n_in, n_out) is None
    sp = spec(collective, ranks, n_in, n_out)
    assert len(sp.initial(0)) == n_in
    assert len(sp.expected(ranks - 1)) == n_out


def test_rooted_collectives_default_to_root_zero() -> None:
    assert spec("broadcast", 3, 1, 1).root == 0
    assert spec("reduce", 3, 1, 1, root=2).root == 2
    assert spec("allreduce", 3, 1, 1).root is None


def test_allreduce_needs_every_contribution_everywhere() -> None:
    sp = spec("allreduce", 3, 2, 2)
    assert sp.full == 0b111
    assert sp.initial(1) == [(0, 0b010), (1, 0b010)]
    assert sp.expected(2) == [(0, 0b111), (1, 0b111)]


def test_reduce_specifies_only_the_root() -> None:
    sp = spec("reduce", 3, 1, 1, root=1)
    assert sp.expected(1) == [(0, 0b111)]
    assert sp.expected(0) == [None]


def test_broadcast_delivers_the_root_value() -> None:
    sp = spec("broadcast", 4, 2, 2, root=2)
    assert sp.expected(0) == [(0, 0b100), (1, 0b100)]


def test_allgather_output_block_q_is_rank_q_input() -> None:
    sp = spec("allgather", 3, 2, 6)
    assert sp.initial(1) == [(2, 0b010), (3, 0b010)]
    assert sp.expected(0) == [(0, 1), (1, 1), (2, 2), (3, 2), (4, 4), (5, 4)]


def test_reducescatter_rank_r_gets_block_r_fully_reduced() -> None:
    sp = spec("reducescatter", 3, 6, 2)
    assert sp.initial(2) == [(i, 0b100) for i in range(6)]
    assert sp.expected(1) == [(2, 0b111), (3, 0b111)]


def test_alltoall_output_block_s_is_input_block_r_of_rank_s() -> None:
    p, k = 3, 2
    sp = spec("alltoall", p, p * k, p * k)
    n = p * k
    for r in range(p):
        for s in range(p):
            for j in range(k):
                value = sp.expected(r)[s * k + j]
                assert value is not None
                key, mask = value
                assert (key, mask) == sp.initial(s)[r * k + j]
                assert divmod(key, n) == (s, r * k + j)


def test_inplace_aliasing_follows_nccl() -> None:
    ag = spec("allgather", 4, 2, 8)
    assert [ag.alias(3, "i", j) for j in range(2)] == [("o", 6), ("o", 7)]
    assert ag.alias(3, "o", 1) == ("o", 1)
    rs = spec("reducescatter", 4, 8, 2)
    assert [rs.alias(2, "o", j) for j in range(2)] == [("i", 4), ("i", 5)]
    assert rs.alias(2, "i", 7) == ("i", 7)
    for name in ("allreduce", "broadcast", "reduce"):
        sp = spec(name, 2, 3, 3)
        assert sp.alias(1, "i", 2) == ("o", 2)
        assert sp.alias(1, "o", 2) == ("o", 2)
    assert spec("allreduce", 2, 1, 1).alias(0, "s", 4) == ("s", 4)


@pytest.mark.parametrize(("collective", "ranks", "n_in", "n_out", "fragment"), [
    ("allreduce", 2, 2, 3, "as many output chunks as input chunks (3 != 2)"),
    ("allgather", 3, 2, 5, "output chunks = ranks x input chunks (5 != 3 x 2)"),
    ("reducescatter", 3, 5, 2, "input chunks = ranks x output chunks (5 != 3 x 2)"),
    ("alltoall", 3, 4, 4, "a multiple of 3"),
    ("alltoall", 2, 4, 2, "equal input and output chunks"),
])
def test_chunking_problems(collective: str, ranks: int, n_in: int, n_out: int, fragment: str) -> None:
    problem = chunking_problem(collective, ranks, n_in, n_out)
    assert problem is not None and fragment in problem


def test_spec_is_plain_frozen_data() -> None:
    sp = spec("all-reduce", 2, 1, 1)
    assert sp == CollectiveSpec("allreduce", 2, 1, 1, None)
    with pytest.raises(AttributeError):
        sp.ranks = 3  # type: ignore[misc]
