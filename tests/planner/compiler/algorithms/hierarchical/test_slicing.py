"""Slice counts and shapes within the chunk and message budgets."""

from __future__ import annotations

from topocc.planner.compiler.algorithms.hierarchical.estimates import DIRECT_MAX_MEMBERS
from topocc.planner.compiler.algorithms.hierarchical.slicing import (
    CLASS_SLICE_BYTES,
    CLASS_TRANSFERS_PER_RANK,
    DOUBLING,
    EQUAL_SLICES,
    MIN_CHUNK_BYTES,
    MIN_SLICE_BYTES,
    chunk_budget,
    class_direct_members,
    slice_shape,
    stage_slices,
    wanted_slices,
)


def test_slice_shape_is_small_at_both_ends() -> None:
    assert slice_shape(1) == (1,)
    assert slice_shape(4) == (1, 2, 2, 1)
    assert slice_shape(9) == (1, 2, 3, 4, 6, 8, 4, 2, 1)  # grows by about 1.5, halves at the end
    assert slice_shape(11) == (1, 2, 3, 4, 6, 8, 8, 8, 4, 2, 1)


def test_few_slices_double_from_both_ends() -> None:
    assert slice_shape(4, DOUBLING) == (1, 2, 2, 1)
    assert slice_shape(8, DOUBLING) == (1, 2, 4, 8, 8, 4, 2, 1)
    assert slice_shape(11, DOUBLING) == (1, 2, 4, 8, 8, 8, 8, 8, 4, 2, 1)


def test_stage_slices_keep_within_the_chunk_budget_and_the_least_slice_size() -> None:
    for p, size in ((16, 1 << 20), (16, 256 << 20), (1024, 256 << 20), (64, 64 << 20)):
        slices = stage_slices(p, size)
        assert sum(slice_shape(slices)) <= max(chunk_budget(p, size), 1)
        assert slices == 1 or sum(slice_shape(slices)) <= size / p / MIN_SLICE_BYTES
        # and no more would fit
        assert sum(slice_shape(slices + 1)) > min(chunk_budget(p, size), size / p / MIN_SLICE_BYTES)


def test_wanted_slices_are_raised_to_a_few_where_levels_overlap() -> None:
    """A small collective gets a few equal slices where there are levels to overlap, one where there are
    not; a pinned pipeline wins."""
    raised = wanted_slices("allgather", 16, 1 << 20, 2, None, False)
    assert raised.raised and raised.slices > 1
    assert wanted_slices("allgather", 16, 1 << 20, 1, None, False) == (1, False)
    assert wanted_slices("allreduce", 16, 1 << 20, 2, 3, True) == (3, False)
    # an all-reduce in virtual order: about a MiB a slice, within the chunk budget
    assert wanted_slices("allreduce", 16, 64 << 20, 2, None, True) == (64, False)


def test_a_small_all_reduce_built_as_one_class_wants_many_slices() -> None:
    """Built one rank per class, a small all-reduce in virtual order wants slices of CLASS_SLICE_BYTES, up to
    EQUAL_SLICES and no chunk under MIN_CHUNK_BYTES (not raised past that); a large one, or one in whole blocks,
    wants what it would rank by rank."""
    for p, size in ((16384, 16 << 20), (16384, 1 << 20), (65536, 16 << 20), (65536, 1 << 20), (1024, 4 << 20)):
        wanted = wanted_slices("allreduce", p, size, 3, None, True, per_class=True)
        assert not wanted.raised
        assert wanted.slices == min(size // CLASS_SLICE_BYTES, EQUAL_SLICES, size // (p * MIN_CHUNK_BYTES))
        assert wanted.slices > 1
    # 16 bytes a rank: four chunks of a float32, where rank by rank it would be raised to 8 (of 2 bytes)
    assert wanted_slices("allreduce", 65536, 1 << 20, 3, None, True, per_class=True) == (4, False)
    assert wanted_slices("allreduce", 65536, 1 << 20, 3, None, True) == (8, True)
    for p, size, virtual in ((1024, 64 << 20, True), (16384, 16 << 20, False)):
        assert (wanted_slices("allreduce", p, size, 3, None, virtual, per_class=True)
                == wanted_slices("allreduce", p, size, 3, None, virtual))
    assert wanted_slices("allreduce", 16384, 1 << 20, 3, 2, True, per_class=True) == (2, False)


def test_a_direct_level_built_as_one_class_has_as_many_members_as_the_per_rank_budget_allows() -> None:
    """A small all-reduce built one rank per class runs a direct level of as many members as keep its messages
    at the slices wanted, 2 (n - 1) a rank and slice, within CLASS_TRANSFERS_PER_RANK, never fewer than
    DIRECT_MAX_MEMBERS; a reduce-scatter, whose slices every rank's budget sizes, DIRECT_MAX_MEMBERS."""
    for p, size, members in ((16384, 1 << 20, 257), (16384, 16 << 20, 65), (65536, 1 << 20, 1025),
                             (1024, 1 << 20, 257)):
        slices = wanted_slices("allreduce", p, size, 3, None, True, per_class=True).slices
        assert class_direct_members("allreduce", p, size) == members
        assert 2 * (members - 1) * slices <= CLASS_TRANSFERS_PER_RANK < 2 * members * slices
    assert class_direct_members("reducescatter", 16384, 1 << 20) == DIRECT_MAX_MEMBERS
    # not small: 128 KiB a rank
    assert class_direct_members("allreduce", 1024, 128 << 20) == DIRECT_MAX_MEMBERS
