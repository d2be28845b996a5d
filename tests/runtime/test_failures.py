"""Failure behaviour: refusals before data moves, and dead or mismatched peers turning into timeouts.

MPICH's hydra mpiexec kills every rank as soon as one dies by a signal, and
after any non-zero exit unless ``-disable-auto-cleanup`` is given; these tests
use that flag (and ``topocc.runtime.harness.launch``'s shell wrapper for signal deaths) so the
surviving ranks can report, and check plain ``mpiexec`` still ends promptly.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from topocc.runtime.errors import UsageError
from topocc.runtime.harness.launch import find_mpiexec, launch_worker, run_schedule, summarize_failures
from topocc.runtime.schedule import save_schedule

pytestmark = pytest.mark.mpi

HERE = Path(__file__).parent
SCRIPTS = HERE / "mpi_scripts"
_spec = importlib.util.spec_from_file_location("runtime_test_schedules", SCRIPTS / "schedules.py")
assert _spec is not None and _spec.loader is not None
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)

TIMEOUT = 3.0
#: A healthy job: start, one allreduce, exit (argv: a 4-rank schedule and the timeout).
HEALTHY = ("import sys\nimport numpy as np\nfrom topocc.runtime import Communicator\n"
           "Communicator(sys.argv[1], timeout=float(sys.argv[2])).allreduce(np.ones(1001, np.float32))\n")


def mpiexec(n: int, *args: str, auto_cleanup: bool = False, limit: float = 120) -> tuple[subprocess.CompletedProcess,
                                                                                         float]:
    """Run ``n`` ranks; stdout and stderr come back rank by rank (each rank writes its own file, so lines
    of ranks failing at the same moment never interleave mid-line, as they do on a shared pipe). ``limit`` only
    ends a hang: how fast a failing job ends is what :func:`prompt` checks."""
    flags = [] if auto_cleanup else ["-disable-auto-cleanup"]
    with tempfile.TemporaryDirectory() as tmp:
        files = ["-outfile-pattern", f"{tmp}/out.%r", "-errfile-pattern", f"{tmp}/err.%r"]
        start = time.monotonic()
        proc = subprocess.run([find_mpiexec(), *flags, *files, "-n", str(n), sys.executable, *args],
                              capture_output=True, text=True, timeout=limit)
        elapsed = time.monotonic() - start

        def gather(kind: str) -> str:
            parts = [Path(tmp, f"{kind}.{r}") for r in range(n)]
            return "".join(part.read_text() for part in parts if part.exists())

        proc.stdout += gather("out")
        proc.stderr += gather("err")
    return proc, elapsed


@pytest.fixture
def ring4(tmp_path: Path) -> Path:
    path = tmp_path / "ring4.json"
    save_schedule(S.ring_allreduce(4, 2, channels=2), path)
    return path


@pytest.fixture(scope="module")
def healthy_s(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Seconds a healthy 4-rank job takes on this machine now (mpiexec, interpreters, one call, exit): what a
    loaded machine stretches, measured here so that the bounds below stretch with it."""
    path = tmp_path_factory.mktemp("healthy") / "ring4.json"
    save_schedule(S.ring_allreduce(4, 2, channels=2), path)
    proc, elapsed = mpiexec(4, "-c", HEALTHY, str(path), str(TIMEOUT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return elapsed


def prompt(elapsed: float, timeout: float, healthy_s: float) -> bool:
    """Whether a failing job ended promptly: within its timeout, plus twice a healthy job's time here (start-up
    and exit), plus 5 s; a survivor that waits for the dead peer beyond its timeout overshoots that."""
    return elapsed < timeout + 2 * healthy_s + 5


def waiting_for(lines: list[str]) -> dict[int, set[int]]:
    """rank -> the peers its error line says it was waiting for."""
    out = {}
    for line in lines:
        m = re.search(r"rank (\d+): .*timed out after [\d.]+ s waiting for rank\(s\) ([\d, ]+)", line)
        if m:
            out[int(m.group(1))] = {int(p) for p in m.group(2).split(",")}
    return out


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_killed_rank_fails_fast_on_every_survivor(ring4: Path, how: str, healthy_s: float) -> None:
    start = time.monotonic()
    result = run_schedule(ring4, 4, 4004, timeout=TIMEOUT, repeat=3,
                          worker_args=["--die-rank", "2", "--die-after", "1", "--die-how", how])
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert prompt(elapsed, TIMEOUT, healthy_s), (elapsed, healthy_s)
    waits = waiting_for(list(result.errors))
    assert set(waits) == {0, 1, 3}, result.stderr[-2000:]
    assert waits[3] == {2}  # rank 3 receives from rank 2 in the ring
    assert all(line.count("\n") == 0 for line in result.errors)
    # the launcher's one line: the silent rank first, then the survivors together with the peers they waited for
    line = result.failure()
    assert "\n" not in line and line.count("timed out") == 1, line
    assert re.search(r"rank 2: no error line .*; ranks 0, 1 and 3: allreduce .*timed out after 3 s waiting for "
                     r"ranks [\d, and]+ between them \(fix: a peer died", line), line


def test_plain_script_rank_exits_between_collectives(ring4: Path, healthy_s: float) -> None:
    proc, elapsed = mpiexec(4, str(SCRIPTS / "die_between.py"), str(ring4), "exit", str(TIMEOUT))
    assert proc.returncode != 0
    assert prompt(elapsed, TIMEOUT, healthy_s), (elapsed, healthy_s)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("topocc:")]
    waits = waiting_for(lines)
    assert set(waits) == {0, 1, 3}, proc.stderr[-2000:]
    assert waits[3] == {2}
    assert "exiting without MPI_Finalize" in lines[0]


def test_plain_mpiexec_with_auto_cleanup_does_not_hang(ring4: Path, healthy_s: float) -> None:
    """Default hydra: a SIGKILLed rank takes the whole job down at once (no survivor can report)."""
    proc, elapsed = mpiexec(4, str(SCRIPTS / "die_between.py"), str(ring4), "kill", str(TIMEOUT),
                            auto_cleanup=True)
    assert proc.returncode != 0
    assert prompt(elapsed, TIMEOUT, healthy_s), (elapsed, healthy_s)
    assert "second allreduce unexpectedly completed" not in proc.stdout


def test_rank_count_mismatch_refused(tmp_path: Path) -> None:
    """The launcher refuses before starting anything; ranks started anyway refuse too, in one collapsed line."""
    path = tmp_path / "ring3.json"
    save_schedule(S.ring_allreduce(3), path)
    with pytest.raises(UsageError, match=r"ring3.json: the schedule is for 3 ranks, not --np 2 \(fix: pass --np 3"):
        run_schedule(path, 2, 4000, timeout=TIMEOUT)
    proc = launch_worker(2, ["check", str(path), "--timeout", str(TIMEOUT)], limit_s=120)
    assert proc.returncode == 5
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("topocc:")]
    assert len(lines) == 2 and all("is for 3 ranks but the communicator has 2" in line for line in lines)
    assert summarize_failures(lines, 2, proc.returncode) == (
        "ranks 0 and 1: the schedule is for 3 ranks but the communicator has 2 "
        "(fix: launch with -n 3 or compile for 2 ranks)")


def test_under_torchrun_the_rank_count_fix_names_a_torch_transport(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun starts no MPI world: each process is an MPI world of one, and mpiexec is not the fix."""
    path = tmp_path / "ring2.json"
    save_schedule(S.ring_allreduce(2), path)
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets in every process it starts
    proc = launch_worker(1, ["check", str(path), "--timeout", str(TIMEOUT)], limit_s=120)
    assert proc.returncode == 5
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("topocc:")]
    assert line.endswith("the schedule is for 2 ranks but the communicator has 1 (fix: under torchrun MPI sees one "
                         "rank per process: use init_process_group(\"topocc\") (README, With torchrun), or pass "
                         "transport=GlooTransport() (topocc.runtime.transports.gloo, CPU "
                         "tensors) or NCCLTransport() (topocc.runtime.transports.nccl, CUDA tensors))"), line


def test_fingerprint_mismatch_refused(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    save_schedule(S.ring_allreduce(2).with_metadata(fingerprint="sha256:aaaa"), path)
    ok = run_schedule(path, 2, 4000, timeout=TIMEOUT, worker_args=["--fingerprint", "sha256:aaaa"])
    assert ok.ok
    bad = run_schedule(path, 2, 4000, timeout=TIMEOUT, worker_args=["--fingerprint", "sha256:bbbb"])
    assert bad.returncode == 5
    assert bad.errors and all("fingerprint mismatch" in line and "sha256:aaaa" in line for line in bad.errors)


@pytest.mark.parametrize(("mode", "message"), [
    ("schedule", "loaded a different schedule or plan"),
    ("dtype", "float64"),
    ("count", "1002"),
])
def test_disagreeing_ranks_refused_before_data_moves(tmp_path: Path, mode: str, message: str,
                                                    healthy_s: float) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_schedule(S.ring_allreduce(2), a)
    save_schedule(S.ring_allreduce(2, 2), b)
    proc, elapsed = mpiexec(2, str(SCRIPTS / "mismatch.py"), mode, str(a), str(b))
    assert proc.returncode != 0
    assert prompt(elapsed, 10, healthy_s), (elapsed, healthy_s)  # mismatch.py's timeout
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED")]
    assert len(refused) == 2, proc.stdout + proc.stderr[-2000:]
    assert all(message in ln for ln in refused)
    if mode != "schedule":
        assert proc.stdout.count("untouched") == 2


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (pip install torch)")
@pytest.mark.parametrize(("ending", "n"), [("exit", 8), ("destroy", 4)])
def test_communicators_beside_torch_distributed_exit_cleanly(tmp_path: Path, ending: str, n: int) -> None:
    """Over MPI, over gloo and torch's own all_reduce (on the world and on a group of its own, last) in one
    script: every rank reaches the exit guard's barriers in the same order (communicators are barriered in
    creation order), then the guard closes them and destroys torch's groups before the interpreter finalizes,
    so the job exits 0 with no ``terminate called`` (std::terminate) on stderr; the same where the script
    destroyed torch's groups itself (``destroy``: the guard finds its own gloo group gone). Rank 0 binds torch's
    rendezvous port itself. ``benchmarks/exit_stress.py`` runs this script many times on a loaded machine."""
    schedule = tmp_path / "ring.json"
    save_schedule(S.ring_allreduce(n), schedule)
    proc, _ = mpiexec(n, str(SCRIPTS / "beside_torch.py"), str(schedule), ending)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(" done") == n, proc.stdout + proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr and "topocc:" not in proc.stderr, proc.stderr[-3000:]
    # what the guard left, as each rank saw it afterwards: communicators closed, torch's groups destroyed
    torn_down = "at exit: torch.distributed initialized False, topocc's gloo group destroyed"
    assert proc.stdout.count(torn_down) == n, proc.stdout
