"""Which rank a failed planned call lost (``topocc.runtime.distributed.lost``), agreed through a store.

The ranks' failures are played in one process over a ``HashStore``, in the orders a kill produces them:
the killed rank's direct peers first (their links to it broke), then the ranks that waited on those.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from topocc.runtime.distributed.lost import LostRanks  # noqa: E402
from topocc.runtime.errors import CommunicatorError, PeerError  # noqa: E402

GROUP = (10, 11, 12, 13)  # global ranks of a 4-rank subgroup: the messages name these


def failure(rank: int, failed: tuple[int, ...], waiting: tuple[int, ...]) -> PeerError:
    return PeerError(f"gloo: Connection reset waiting for rank(s) {', '.join(map(str, waiting))}",
                     where=f"rank {rank}: allreduce (ring, 8 x float32)", fix="check its output",
                     failed=failed, waiting=waiting)


def test_the_rank_whose_link_broke_without_a_post_is_lost_and_everyone_names_it() -> None:
    store = torch.distributed.HashStore()
    ranks = {r: LostRanks(store, r, GROUP, window_s=5.0) for r in (0, 1, 2)}
    # rank 3 is killed: rank 2's link to it breaks; rank 0 waited on 2 and 3; rank 1 only on rank 0
    first = ranks[2].restate(failure(2, (3,), (3,)))
    second = ranks[0].restate(failure(0, (2,), (2, 3)))  # rank 2 left after posting: not the lost one
    third = ranks[1].restate(failure(1, (0,), (0,)))
    for err in (first, second, third):
        assert isinstance(err, PeerError) and "lost rank(s) 13:" in err.one_line() and "\n" not in err.one_line()
    assert "rank(s) 13 died or hang" in third.one_line()
    # a later failure of the same group answers at once, with the same rank
    start = time.monotonic()
    assert "lost rank(s) 13" in ranks[1].restate(CommunicatorError("the communicator failed earlier")).one_line()
    assert time.monotonic() - start < 0.5


def test_a_rank_that_hangs_is_named_after_the_others_post() -> None:
    store = torch.distributed.HashStore()
    two = (0, 1)
    start = time.monotonic()
    err = LostRanks(store, 0, two, window_s=3.0).restate(failure(0, (), (1,)))  # a timeout: no link broke
    elapsed = time.monotonic() - start
    assert "lost rank(s) 1:" in err.one_line()
    assert 0.9 < elapsed < 2.5  # every rank it could hear from had posted: only the settle time, not the window


def test_with_nobody_to_ask_the_window_bounds_the_wait() -> None:
    store = torch.distributed.HashStore()
    start = time.monotonic()
    err = LostRanks(store, 0, GROUP, window_s=1.5).restate(failure(0, (), (1,)))
    assert "lost rank(s) 11:" in err.one_line()  # the silent rank it waited for, of the three silent ones
    assert time.monotonic() - start < 3


class _DeadStore:
    """A store whose server went with the job."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> Any:
            raise RuntimeError("Connection refused")
        return fail


def test_without_a_store_the_call_keeps_its_own_error() -> None:
    err = failure(0, (3,), (2, 3))
    assert LostRanks(_DeadStore(), 0, GROUP, window_s=1.0).restate(err) is err
