"""``topocc torchbench``'s launcher: torch and torchrun found or refused in one line, a bundle for another world
refused before anything starts, a copy of a bundle that plans every size, and a failed job's one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from topocc.runtime.bundle import load_bundle
from topocc.runtime.errors import TopoccError, UsageError
from topocc.runtime.harness.torchbench import torchrun as launcher
from topocc.runtime.harness.torchbench.sweep import make_sweep
from topocc.runtime.harness.torchbench.torchrun import (
    find_torchrun,
    planned_at_every_size,
    require_torch,
    run_torchbench,
)


def test_torch_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what find_spec reports for a module that is not there
    with pytest.raises(TopoccError, match=r"^torch is not installed for .* \(fix: pip install torch"):
        require_torch()


def test_torchrun_is_the_one_beside_python_else_on_path_else_refused(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "venv").mkdir()
    beside = tmp_path / "venv" / "torchrun"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert find_torchrun(python=str(tmp_path / "venv" / "python")) == str(beside)
    elsewhere = tmp_path / "bin"
    elsewhere.mkdir()
    monkeypatch.setenv("PATH", str(elsewhere))
    with pytest.raises(TopoccError, match=r"^torchrun is neither beside .*/python nor on PATH \(fix: pip install "
                                          r"torch in this environment, or pass --torchrun PATH\)$"):
        find_torchrun(python=str(tmp_path / "python"))
    (elsewhere / "torchrun").write_text("#!/bin/sh\n")
    (elsewhere / "torchrun").chmod(0o755)
    assert find_torchrun(python=str(tmp_path / "python")) == str(elsewhere / "torchrun")
    with pytest.raises(TopoccError, match=r"^--torchrun /no/such/torchrun: no such program"):
        find_torchrun("/no/such/torchrun")


def test_a_bundle_for_another_world_or_none_is_refused_before_the_job(tmp_path: Path, two_rank_schedule: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "preflight", lambda sweep, torchrun=None: "torchrun")
    four = make_sweep("allreduce", 1024, 1024, 2, ranks=4)
    with pytest.raises(UsageError, match=r": the bundle is for 2 ranks but --ranks is 4 \(fix: pass --ranks 2"):
        run_torchbench(four, bundle=two_rank_schedule)
    with pytest.raises(UsageError, match=r"^the topocc backend needs a plan bundle"):
        run_torchbench(four)


def test_every_size_planned_is_a_copy_without_native_thresholds(tmp_path: Path, two_rank_schedule: Path) -> None:
    folder = planned_at_every_size(two_rank_schedule, tmp_path / "forced")
    forced = load_bundle(folder)
    assert [e.native_below for e in forced.plans] == [0]
    assert forced.plans[0].plan == load_bundle(two_rank_schedule).plans[0].plan


def test_a_failed_job_is_the_first_line_a_rank_wrote() -> None:
    noise = ("W0101 torch/distributed/run.py: Setting OMP_NUM_THREADS\n"
             "topocc: error: rank 1: CommunicatorError: lost rank(s) 0 (fix: restart the job)\n"
             "topocc: error: rank 0: RuntimeError: connection closed\n"
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    done = subprocess.CompletedProcess(["torchrun"], 1, "", noise)
    assert launcher._failure(done) == "rank 1: CommunicatorError: lost rank(s) 0 (fix: restart the job)"
    bare = subprocess.CompletedProcess(["torchrun"], 1, "", "Traceback ...\nModuleNotFoundError: No module named x\n")
    assert launcher._failure(bare) == ("the torchrun job failed (exit 1): ModuleNotFoundError: No module named x")
