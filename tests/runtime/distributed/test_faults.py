"""Faults under torchrun (``benchmarks/fault_trials.py``): a rank SIGKILLed inside a planned collective is
named by every survivor within the timeout, and a job torchrun restarts resumes with the same losses.

Two of the benchmark's kill trials on 4 ranks (victims and moments drawn from a fixed seed), one at the
victim's first call, and its restart trial; the benchmark runs twenty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from benchmarks.fault_trials import (  # noqa: E402
    KillTrial,
    Survivor,
    fault_bundle,
    kill_trial,
    kill_trials,
    names_rank,
    restart_trial,
)

RANKS = 4
TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fault_bundle(RANKS, tmp_path_factory.mktemp("fault-bundle"))


def test_every_survivor_names_the_killed_rank_within_the_timeout(plan: Path, tmp_path: Path) -> None:
    trials = kill_trials(2, RANKS, plan, TIMEOUT_S, seed=1, folder=tmp_path)
    for t in trials:
        assert t.killed and len(t.survivors) == RANKS - 1
        assert t.problems() == [], t.problems()
        assert t.returncode != 0  # torchrun reports the failed job


def test_a_rank_lost_at_its_first_call_is_named_by_every_survivor(plan: Path, tmp_path: Path) -> None:
    """The victim dies as it enters its first call, before the plan's communicator has met its peers (no
    connection of the private gloo group made yet): the survivors still end in time, naming it alone."""
    t = kill_trial(RANKS, 2, 0.0, plan, TIMEOUT_S, tmp_path)
    assert t.killed and len(t.survivors) == RANKS - 1
    assert t.problems() == [], t.problems()


def test_a_restarted_job_resumes_from_its_checkpoint_with_the_uninterrupted_losses(plan: Path,
                                                                                   tmp_path: Path) -> None:
    r = restart_trial(RANKS, plan, TIMEOUT_S, tmp_path)
    assert r.problems() == [], r.problems()
    assert r.resumed and min(r.resumed) < max(r.first) + 1  # steps after the checkpoint were run again


def test_the_trial_verdicts_catch_what_they_claim() -> None:
    """The checks themselves: a survivor that named another rank, ended late, wrote nothing or spanned lines."""
    line = "rank 0: allreduce (ring, 8 x float32): lost rank(s) 3: gloo: Connection reset (fix: ...)"
    assert names_rank(line, 3) and not names_rank(line, 2)
    assert names_rank("lost rank(s) 1, 3: timed out", 3) and not names_rank("waiting for rank(s) 3", 3)
    good = Survivor(0, 0.2, line)
    assert KillTrial(3, 0.5, True, (good,), 1, (), 14.0).problems() == []
    bad = KillTrial(2, 0.5, True, (good, Survivor(1, 20.0, line), Survivor(2, None, "")), 1, (4242,), 14.0)
    found = " | ".join(bad.problems())
    for what in ("does not name rank 2", "ended 20.0 s after", "wrote no error", "processes left: 4242"):
        assert what in found, found
    assert "spans 2 lines" in " ".join(KillTrial(3, 0.5, True, (Survivor(0, 0.1, line + "\nmore"),), 1, (),
                                                  14.0).problems())
