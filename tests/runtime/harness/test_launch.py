"""The launcher's pure parts: rank lists, one line from many ranks' errors, rank-count refusal, sizes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import topocc
import topocc.runtime.harness.launch as launch
from topocc.runtime.errors import UsageError
from topocc.runtime.harness.launch import (
    bench_sizes,
    check_ranks,
    find_mpiexec,
    rank_list,
    spawn_ranks,
    summarize_failures,
)

REPO = Path(__file__).resolve().parents[3]
FIX = " (fix: a peer died, hangs, or runs a different schedule; check its output)"


def timeout_line(rank: int, peers: str) -> str:
    return (f"topocc: rank {rank}: allreduce (ring, 1001 x float32): timed out after 30 s waiting for rank(s) "
            f"{peers} (op 7: receive from rank {peers.split(',')[0]} ch 1; op 8: send to rank 4, +2 more){FIX}")


@pytest.mark.parametrize(("ranks", "text"), [
    ([4], "rank 4"), ([1, 0], "ranks 0 and 1"), ([0, 1, 2, 3, 5], "ranks 0-3 and 5"), ([0, 2, 3], "ranks 0, 2 and 3"),
    ([5, 6, 7, 0], "ranks 0 and 5-7"), ([3, 3], "rank 3"),
])
def test_rank_list(ranks: list[int], text: str) -> None:
    assert rank_list(ranks) == text


def test_ranks_waiting_for_one_dead_rank_are_one_message() -> None:
    lines = [timeout_line(r, "4") for r in (0, 1, 2, 3, 5)]
    assert summarize_failures(lines, 6, 5) == (
        "rank 4: no error line (died, was killed or exited early); ranks 0-3 and 5: allreduce (ring, 1001 x "
        f"float32): timed out after 30 s waiting for rank 4{FIX}")


def test_ranks_waiting_for_different_peers_merge_the_peers() -> None:
    lines = [timeout_line(0, "3"), timeout_line(1, "0"), timeout_line(3, "2, 3")]
    assert summarize_failures(lines, 4, 5).endswith(
        "ranks 0, 1 and 3: allreduce (ring, 1001 x float32): timed out after 30 s waiting for ranks 0, 2 and 3 "
        f"between them{FIX}")


def test_many_different_messages_are_counted_not_listed() -> None:
    lines = [f"topocc: rank {r}: failure number {r} (fix: fix {r})" for r in range(6)]
    line = summarize_failures(lines, 6, 5)
    assert line == ("rank 0: failure number 0; rank 1: failure number 1; rank 2: failure number 2; "
                    "and 3 more messages (fix: fix 0)")


def test_lines_without_a_rank_and_a_killed_job() -> None:
    lines = ["garbage before topocc: is not a line", "topocc: the job ran past its hard limit of 60 s and was killed"]
    assert summarize_failures(lines, 2, -9) == "the job ran past its hard limit of 60 s and was killed"
    assert summarize_failures([], 2, 1) == "no error line from the ranks"


def test_a_wrong_rank_count_names_the_flag() -> None:
    assert check_ranks(8, None, "s.json") == 8 and check_ranks(8, 8, "s.json") == 8
    with pytest.raises(UsageError) as info:
        check_ranks(8, 16, "s.json")
    assert info.value.one_line() == ("s.json: the schedule is for 8 ranks, not --np 16 "
                                     "(fix: pass --np 8, or leave --np out to use the schedule's)")
    assert info.value.exit_code == 2


def test_bench_sizes_are_whole_elements_per_rank() -> None:
    assert bench_sizes("allreduce", 8, [1024, 1001], "float32") == [1024, 1000]
    assert bench_sizes("allgather", 8, [1024, 1000], "float32") == [1024, 992]  # 31 elements per rank


def test_a_size_without_a_whole_element_is_refused() -> None:
    with pytest.raises(UsageError, match=r"a size of 2 bytes holds no float32 element \(fix: .* at least 4 bytes"):
        bench_sizes("allreduce", 8, [1024, 2], "float32")
    with pytest.raises(UsageError, match=r"holds no float64 element for each of 8 ranks \(fix: .* at least 64 bytes"):
        bench_sizes("reducescatter", 8, [63], "float64")


def test_spawned_ranks_report_and_a_straggler_is_killed() -> None:
    """Each rank's output and exit code come back; one that outlives the limit is killed, and says so.

    The limit leaves a loaded machine time to start the two quick interpreters; the straggler sleeps far past it.
    """
    env = dict(os.environ)
    code = "import sys, time; print('rank', sys.argv[1]); sys.stdout.flush(); time.sleep(float(sys.argv[2]))"
    start = time.monotonic()
    done = spawn_ranks([([sys.executable, "-c", code, str(r), "120" if r == 1 else "0"], env) for r in range(3)],
                       limit_s=10.0)
    assert time.monotonic() - start < 60
    assert [p.stdout for p in done] == ["rank 0\n", "rank 1\n", "rank 2\n"]
    assert [p.returncode for p in done] == [0, -9, 0]
    assert done[1].stderr.endswith("topocc: killed after 10 s\n") and not done[0].stderr


def test_a_launcher_stopped_by_sigterm_takes_its_ranks_along(tmp_path: Path) -> None:
    """`timeout` signals only the launcher's group; the ranks lead their own sessions, yet must not outlive it."""
    launcher = (
        "import sys, threading\n"
        "from topocc.runtime.harness.launch import exit_on_sigterm, spawn_ranks\n"
        "exit_on_sigterm()\n"
        "rank = ['-c', 'import os, sys, time; open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(120)']\n"
        "def job(r):  # one launch from a thread, as nccl_check's --jobs does\n"
        "    spawn_ranks([([sys.executable, *rank, f'{sys.argv[1]}/{r}.pid'], {})], limit_s=120)\n"
        "threading.Thread(target=job, args=(1,), daemon=True).start()\n"
        "try:\n"
        "    job(0)\n"
        "finally:\n"
        "    open(f'{sys.argv[1]}/cleaned', 'w').close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher, str(tmp_path)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    pids = [tmp_path / f"{r}.pid" for r in (0, 1)]
    deadline = time.monotonic() + 30
    while not all(p.exists() and p.read_text() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = [int(p.read_text()) for p in pids]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert (tmp_path / "cleaned").exists()  # finally blocks ran (an emulated cluster's namespaces go)
    for pid in ranks:  # gone, or a zombie that nobody has reaped yet (a container's init may not)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", pid


def test_mpiexec_is_the_one_given_else_the_one_beside_the_interpreter(tmp_path: Path) -> None:
    (tmp_path / "mpiexec").write_text("")
    python = str(tmp_path / "python")
    assert find_mpiexec(python=python) == str(tmp_path / "mpiexec")
    assert find_mpiexec("/opt/mpi/bin/mpiexec", python=python) == "/opt/mpi/bin/mpiexec"
    beside = Path(sys.executable).parent / "mpiexec"
    assert find_mpiexec() == (str(beside) if beside.exists() else shutil.which("mpiexec"))


def _ranks_pythonpath(folder: Path, env_path: str | None, cwd: Path) -> tuple[str, str]:
    """(package_home(), the ranks' PYTHONPATH) in a process that imports topocc from ``folder``."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import topocc.runtime.harness.launch as launch; "
            "print(launch.__file__); print(launch.package_home()); print(launch.worker_env().get('PYTHONPATH'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if env_path is not None:
        env["PYTHONPATH"] = env_path
    out = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert Path(out[0]).is_relative_to(folder)  # the topocc under test, not the one installed here
    return out[1], out[2]


def test_a_topocc_outside_the_site_folders_puts_its_folder_on_the_ranks_path(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    (copy / "topocc").parent.mkdir()
    (copy / "topocc").symlink_to(REPO / "topocc", target_is_directory=True)
    # symlinked: the package resolves to this checkout's folder, which is what the ranks then import
    assert _ranks_pythonpath(copy, None, tmp_path) == (str(REPO), str(REPO))
    assert _ranks_pythonpath(copy, "/elsewhere", tmp_path) == (str(REPO), f"{REPO}{os.pathsep}/elsewhere")
    assert _ranks_pythonpath(copy, str(REPO), tmp_path) == (str(REPO), str(REPO))  # once


def test_a_topocc_in_a_site_folder_puts_nothing_on_the_ranks_path(monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(topocc.__file__).resolve().parent.parent
    monkeypatch.setattr(launch.site, "getsitepackages", lambda: [str(home)])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert launch.package_home() is None
    assert "PYTHONPATH" not in launch.worker_env()
