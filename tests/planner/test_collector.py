"""The collector's tuning: raised while schedules are built, restored after, even on an error."""

from __future__ import annotations

import gc

import pytest

from topocc.planner.collector import YOUNG_THRESHOLD, rare_collections


def test_rare_collections_raises_the_young_threshold_and_restores_it() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])
        with rare_collections():
            assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        assert gc.get_threshold() == (700, *before[1:])
        with pytest.raises(RuntimeError), rare_collections():
            raise RuntimeError("a failed compile")
        assert gc.get_threshold() == (700, *before[1:])
        gc.set_threshold(50_000, *before[1:])  # a caller's higher threshold is kept
        with rare_collections():
            assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)
