"""The ``topocc`` backend costs no time: its progress thread, the compiler's native thresholds, the backend's
autoloading, ``TOPOCC_DEBUG`` and the last line of a failed rank.

The torchrun tests launch ``async_job.py`` or ``uncaught_job.py``, neither of which imports topocc: the
backend is registered by torch's autoloading of the installed entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from tests.conftest import REPO  # noqa: E402
from tests.runtime.distributed.test_process_group import bundle_for, result, torchrun  # noqa: E402
from topocc.runtime.bundle import MANIFEST  # noqa: E402
from topocc.runtime.distributed.progress import PlannedWork, Progress  # noqa: E402
from topocc.runtime.errors import CommunicatorError  # noqa: E402


def with_threshold(folder: Path, native_below: int | None) -> Path:
    """The bundle folder with its all-reduce plan's ``native_below_bytes`` set (as ``topocc bundle`` writes it)."""
    doc = json.loads((folder / MANIFEST).read_text())
    for row in doc["plans"]:
        if row["collective"] == "allreduce":
            row["native_below_bytes"] = native_below
    (folder / MANIFEST).write_text(json.dumps(doc))
    return folder


# ---------------------------------------------------------------------------------------------- progress thread


def test_the_progress_thread_runs_calls_in_order_and_hands_on_their_errors() -> None:
    progress = Progress("test-progress")
    order: list[int] = []
    gate = threading.Event()

    def held() -> None:
        gate.wait(10)
        order.append(1)

    first = progress.submit(held, ["first"])
    second = progress.submit(lambda: order.append(2), ["second"])

    def fail() -> None:
        raise CommunicatorError("timed out waiting for rank(s) 1", where="rank 0")

    third = progress.submit(fail, ["third"])
    fourth = progress.submit(lambda: order.append(4), ["fourth"])
    assert isinstance(first, PlannedWork) and not first.is_completed() and not second.is_completed()
    gate.set()
    assert fourth.wait() and order == [1, 2, 4]  # FIFO, and a failed call does not stop the ones after it
    assert first.get_future().wait() == ["first"] and second.result() == ["second"]
    assert third.is_completed() and not third.is_success()
    with pytest.raises(CommunicatorError, match=r"^rank 0: timed out waiting for rank\(s\) 1$"):
        third.wait()
    assert isinstance(third.exception(), CommunicatorError) and first.exception() is None
    progress.close()


def test_an_async_call_returns_before_a_late_peer_arrives(tmp_path: Path) -> None:
    """Rank 1 is a second late: rank 0's planned all_reduce returns at once and completes when rank 1 comes,
    and rank 0's Python code runs meanwhile (the replay waits for messages without holding the GIL)."""
    res = result(torchrun(2, "async_job.py", "late", env={"TOPOCC_PLAN": str(bundle_for(tmp_path, 2, ("allreduce",)))}))
    assert res["returned_s"] < 0.3 and not res["completed_at_once"], res
    assert res["completed_after"] and res["waited_s"] > 0.5, res
    assert res["result"] == res["expected"] == res["future"]
    # a thread that held the GIL would leave the caller a small fraction of its loop; sharing it, about half
    assert res["during"] > 0.25 * res["baseline"], res
    assert res["counters"]["allreduce"]["planned"] == 2 and not res["loaded_before_init"]


# ---------------------------------------------------------------------------------------------- thresholds


def test_calls_below_the_bundles_threshold_go_native_and_are_counted(tmp_path: Path) -> None:
    """The bundle says the all-reduce plan gains from 16 KiB: a 4 KiB call goes to gloo, a 64 KiB one runs it."""
    folder = with_threshold(bundle_for(tmp_path, 2, ("allreduce",)), 16 << 10)
    res = result(torchrun(2, "async_job.py", "sizes", "1024", "16384", env={"TOPOCC_PLAN": str(folder)}))
    allreduce = res["counters"]["allreduce"]
    assert (allreduce["planned"], allreduce["planned_bytes"]) == (2, 2 * 65536), allreduce
    assert (allreduce["delegated"], allreduce["delegated_bytes"]) == (2, 2 * 4096), allreduce
    assert allreduce["why"] == "model predicts no gain at 4096 bytes (the plan runs from 16384)"


def test_a_plan_predicted_faster_nowhere_never_runs(tmp_path: Path) -> None:
    folder = with_threshold(bundle_for(tmp_path, 2, ("allreduce",)), None)
    res = result(torchrun(2, "async_job.py", "sizes", "1024", "16384", env={"TOPOCC_PLAN": str(folder)}))
    allreduce = res["counters"]["allreduce"]
    assert allreduce["planned"] == 0 and allreduce["delegated"] == 4
    assert allreduce["why"] == "model predicts no gain at any size"


def test_the_first_calls_of_a_size_are_trials_and_the_ranks_agree_on_which_runs_the_rest(tmp_path: Path) -> None:
    """Six 1 KiB all-reduces, the bundle running the plan at every size: two timed calls each way, then every
    rank takes the same side for the rest, says which with both times, and counts the reason."""
    folder = bundle_for(tmp_path, 2, ("allreduce",))
    done = torchrun(2, "async_job.py", "sizes", "256", "256", "256",
                    env={"TOPOCC_PLAN": str(folder), "TOPOCC_TUNE": "on", "TOPOCC_DEBUG": "INFO"})
    allreduce = result(done)["counters"]["allreduce"]
    verdicts = set()
    for rank in (0, 1):
        head = f"topocc INFO rank {rank} world: allreduce of 1 KiB to 2 KiB on cpu: measured plan "
        (line,) = [line for line in done.stderr.splitlines() if line.startswith(head)]
        verdicts.add(line.rpartition(": ")[2])
    assert len(verdicts) == 1, verdicts  # both ranks decided alike, from the same agreed figures
    if verdicts == {"gloo runs it"}:  # on loopback the host-driven replay is usually the slower
        assert (allreduce["planned"], allreduce["delegated"]) == (2, 4), allreduce
        assert allreduce["why"].startswith("measured no faster than gloo"), allreduce
    else:
        assert verdicts == {"the plan runs it"}
        assert (allreduce["planned"], allreduce["delegated"]) == (4, 2), allreduce
        assert allreduce["why"] == "", allreduce  # the trials' reason is not kept


# ---------------------------------------------------------------------------------------------- debug lines


def test_topocc_debug_info_prints_each_distinct_call_once(tmp_path: Path) -> None:
    folder = with_threshold(bundle_for(tmp_path, 2, ("allreduce",)), 16 << 10)
    done = torchrun(2, "async_job.py", "sizes", "1024", "16384", "16384",
                    env={"TOPOCC_PLAN": str(folder), "TOPOCC_DEBUG": "INFO"})
    result(done)
    lines = [line for line in done.stderr.splitlines() if line.startswith("topocc INFO")]
    for rank in (0, 1):
        mine = sorted(line for line in lines if line.startswith(f"topocc INFO rank {rank} world: "))
        assert len(mine) == 2, lines  # 4 KiB and 64 KiB, each called several times, each said once
        native, planned = sorted(mine, key=lambda line: "native" not in line)
        assert native.endswith("allreduce 4 KiB float32 on cpu: native gloo: model predicts no gain at 4096 bytes "
                               "(the plan runs from 16384)"), native
        assert "allreduce 64 KiB float32 on cpu: plan bucket " in planned and ", predicted " in planned, planned


def test_a_bad_topocc_debug_level_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = bundle_for(tmp_path, 2, ("allreduce",))
    done = torchrun(2, "async_job.py", "sizes", "1024", env={"TOPOCC_PLAN": str(folder), "TOPOCC_DEBUG": "LOUD"},
                    limit=120)
    assert done.returncode != 0
    assert "TOPOCC_DEBUG='LOUD' is not a level (fix: set TOPOCC_DEBUG=INFO" in done.stderr


# ---------------------------------------------------------------------------------------------- last line


def rank_logs(log_dir: Path, rank: int) -> list[str]:
    """The lines rank ``rank`` wrote to stderr (torchrun ``--redirects 3 --log-dir``)."""
    found = sorted(log_dir.glob(f"**/attempt_*/{rank}/stderr.log"))
    assert found, list(log_dir.rglob("*"))
    return found[-1].read_text().splitlines()


@pytest.mark.parametrize("mode", ["dead_peer", "bad_bundle"])
def test_a_failed_rank_ends_its_output_with_topoccs_line(tmp_path: Path, mode: str) -> None:
    log_dir = tmp_path / "logs"
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "TOPOCC_PLAN": str(bundle_for(tmp_path, 2, ("allreduce",))), "TOPOCC_TIMEOUT": "3", "TOPOCC_TUNE": "off"}
    full.pop("TOPOCC_TOPOLOGY", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--redirects", "3",
           "--log-dir", str(log_dir),
           # the agent stops the other rank once one has failed, before it prints, unless it looks seldom
           "--monitor-interval=5", str(Path(__file__).parent / "uncaught_job.py"), mode]
    done = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=180)
    assert done.returncode != 0
    survivors = (0,) if mode == "dead_peer" else (0, 1)
    for rank in survivors:
        lines = [line for line in rank_logs(log_dir, rank) if line.strip()]
        assert lines[-1].startswith("topocc: "), lines[-12:]
        assert not any(line.startswith("Traceback") for line in lines), lines
        expected = "waiting for rank(s) 1" if mode == "dead_peer" else "TOPOCC_TOPOLOGY names some-other-cluster"
        assert any(expected in line for line in lines if line.startswith("topocc: ")), lines[-5:]


# ---------------------------------------------------------------------------------------------- autoloading


def test_torch_registers_the_backend_without_importing_topocc() -> None:
    """The installed entry point registers the name at ``import torch`` and loads nothing else of topocc."""
    code = ("import sys, torch.distributed as d; "
            "print('TOPOCC' in d.Backend._plugins, sorted(m for m in sys.modules if m.startswith('topocc')))")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd="/").stdout.strip()
    assert out == "True ['topocc', 'topocc._autoload']", out
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd="/").stdout.strip()
    assert out == "False []", out


def test_the_schedule_format_loads_with_the_first_planned_call(tmp_path: Path) -> None:
    """``init_process_group`` and a class's first call (gloo's, a trial) read the bundle without the schedule
    format; the class's second call, the plan's trial, loads it."""
    res = result(torchrun(2, "async_job.py", "first", "1001",
                          env={"TOPOCC_PLAN": str(bundle_for(tmp_path, 2, ("allreduce",))), "TOPOCC_TUNE": "on"}))
    assert res["format_loaded"] == [False, True], res
    assert not res["loaded_before_init"], res


def test_calls_in_flight_together_run_in_call_order(tmp_path: Path) -> None:
    """Eight all_reduces issued before any is waited on (as DDP's backward issues its buckets): each rank's
    progress thread takes them in call order, so every result is exact and every call ran the plan."""
    res = result(torchrun(2, "async_job.py", "burst", "7", "1001", "70000", "1001",
                          env={"TOPOCC_PLAN": str(bundle_for(tmp_path, 2, ("allreduce",)))}))
    assert res["wrong"] == [] and res["counters"]["allreduce"]["planned"] == 8, res
