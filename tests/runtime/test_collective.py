"""The collectives' descriptions: names and spellings, buffer shapes, aliasing, pre/postconditions, bus factors."""

from __future__ import annotations

import pytest

from topocc.runtime.collective import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    DESCRIPTIONS,
    NAMES,
    REDUCE,
    REDUCESCATTER,
    ROOTED,
    Collective,
    closest_collective,
    collective,
)
from topocc.runtime.errors import ScheduleFormatError


@pytest.mark.parametrize(("spelling", "want"), [
    ("allreduce", ALLREDUCE), ("all_reduce", ALLREDUCE), ("All-Reduce", ALLREDUCE), ("reduce_scatter", REDUCESCATTER),
    ("all_gather", ALLGATHER), ("all_to_all", ALLTOALL), ("all to all", ALLTOALL), ("Broadcast", BROADCAST),
    ("reduce", REDUCE),
])
def test_every_spelling_finds_its_description(spelling: str, want: Collective) -> None:
    assert collective(spelling) is want
    assert collective(want) is want


def test_the_names_are_the_formats_in_its_order() -> None:
    assert NAMES == ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall")
    assert ROOTED == ("broadcast", "reduce")
    assert all(collective(alias) is c for c in DESCRIPTIONS for alias in c.aliases)


def test_an_unknown_name_is_one_line_naming_the_known_ones_and_the_closest() -> None:
    with pytest.raises(ScheduleFormatError) as caught:
        collective("all_reduse")
    assert str(caught.value) == ("unknown collective 'all_reduse' (did you mean allreduce?) (fix: use one of "
                                 "allreduce, reducescatter, allgather, broadcast, reduce, alltoall)")
    with pytest.raises(ScheduleFormatError, match=r"^unknown collective 'gossip' \(fix: use one of allreduce"):
        collective("gossip")
    assert closest_collective("brodcast") == "broadcast"
    assert closest_collective("gossip") is None


def test_descriptions_are_frozen_data() -> None:
    with pytest.raises(AttributeError):
        ALLREDUCE.reduces = False  # type: ignore[misc]


@pytest.mark.parametrize(("c", "facts"), [
    # rooted, reduces, gathers, scatters, exchanges, symmetric_sizes, replicates, passes
    (ALLREDUCE, (False, True, False, False, False, True, True, 2)),
    (REDUCESCATTER, (False, True, False, True, False, False, False, 1)),
    (ALLGATHER, (False, False, True, False, False, False, True, 1)),
    (BROADCAST, (True, False, False, False, False, True, True, 1)),
    (REDUCE, (True, True, False, False, False, True, False, 1)),
    (ALLTOALL, (False, False, False, False, True, True, False, 1)),
])
def test_what_each_collective_does(c: Collective, facts: tuple[object, ...]) -> None:
    assert (c.rooted, c.reduces, c.gathers, c.scatters, c.exchanges, c.symmetric_sizes, c.replicates,
            c.passes) == facts
    assert c.from_root == (c is BROADCAST) and c.to_root == (c is REDUCE)
    assert c.split == (c not in (ALLREDUCE, BROADCAST, REDUCE))


def test_bus_factors_follow_nccl_tests() -> None:
    assert ALLREDUCE.bus_factor(8) == 1.75
    assert ALLGATHER.bus_factor(4) == REDUCESCATTER.bus_factor(4) == ALLTOALL.bus_factor(4) == 0.75
    assert BROADCAST.bus_factor(8) == REDUCE.bus_factor(8) == 1.0


@pytest.mark.parametrize("c", DESCRIPTIONS, ids=NAMES)
@pytest.mark.parametrize("ranks", [1, 3, 4])
def test_block_and_sizes_are_one_rule_both_ways(c: Collective, ranks: int) -> None:
    for block in (1, 5):
        inputs, outputs = c.sizes(ranks, block)
        assert c.block(ranks, inputs, outputs) == block
        assert c.chunking_problem(ranks, inputs, outputs) is None
        assert max(inputs, outputs) == block * (ranks if c.split else 1)


@pytest.mark.parametrize(("c", "ranks", "inputs", "outputs", "says"), [
    (BROADCAST, 2, 2, 3, "broadcast needs as many output chunks as input chunks (3 != 2)"),
    (ALLGATHER, 3, 2, 5, "allgather needs output chunks = ranks x input chunks (5 != 3 x 2)"),
    (REDUCESCATTER, 3, 5, 2, "reducescatter needs input chunks = ranks x output chunks (5 != 3 x 2)"),
    (ALLTOALL, 3, 4, 4, "alltoall needs equal input and output chunks, a multiple of 3 (4, 4)"),
])
def test_a_chunking_that_does_not_fit_says_why(c: Collective, ranks: int, inputs: int, outputs: int,
                                               says: str) -> None:
    assert c.chunking_problem(ranks, inputs, outputs) == says


def test_in_place_the_smaller_buffer_is_the_ranks_block_of_the_larger() -> None:
    assert [ALLGATHER.alias(3, "i", j, 2) for j in range(2)] == [("o", 6), ("o", 7)]
    assert ALLGATHER.alias(3, "o", 5, 2) == ("o", 5)
    assert [REDUCESCATTER.alias(2, "o", j, 2) for j in range(2)] == [("i", 4), ("i", 5)]
    assert REDUCESCATTER.alias(2, "i", 7, 2) == ("i", 7)
    for c in (ALLREDUCE, BROADCAST, REDUCE, ALLTOALL):
        assert c.alias(1, "i", 2, 3) == c.alias(1, "o", 2, 3) == ("o", 2)
    assert ALLTOALL.alias(0, "s", 4, 1) == ("s", 4)


def test_postconditions_name_where_each_output_chunk_comes_from() -> None:
    full = 0b111
    assert ALLREDUCE.expected(1, 3, 2, 2, None) == [(0, full), (1, full)]
    assert REDUCE.expected(2, 3, 1, 1, 2) == [(0, full)] and REDUCE.expected(0, 3, 1, 1, 2) == [None]
    assert BROADCAST.expected(0, 3, 2, 2, 1) == [(0, 0b010), (1, 0b010)]
    assert ALLGATHER.initial(1, 2) == [(2, 0b010), (3, 0b010)]
    assert ALLGATHER.expected(0, 3, 2, 6, None) == [(0, 1), (1, 1), (2, 2), (3, 2), (4, 4), (5, 4)]
    assert REDUCESCATTER.expected(1, 3, 6, 2, None) == [(2, full), (3, full)]
    # all-to-all: output block s of rank r is input block r of rank s
    p, k = 3, 2
    for r in range(p):
        got = ALLTOALL.expected(r, p, p * k, p * k, None)
        assert got == [ALLTOALL.initial(s, p * k)[r * k + j] for s in range(p) for j in range(k)]
