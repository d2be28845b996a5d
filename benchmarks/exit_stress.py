"""Exit beside torch.distributed under load: how often a job using topocc ends with exit 0 and no abort.

Runs ``tests/runtime/mpi_scripts/beside_torch.py`` (topocc communicators over MPI and over gloo beside
torch's own gloo groups, torch's call last, then a plain exit; the script ``tests/runtime/test_failures.py``
runs) ``--runs`` times under the venv's ``mpiexec``, while one busy-loop process per core keeps the machine
loaded (each bounded in time, all killed at the end). ``--control N`` also runs N jobs of a script with no
topocc in it (torch's all_reduce on four gloo groups, then exit): how often gloo's own teardown aborts on this
machine now, what the exit guard prevents (``docs/exit.md``). Prints one table, a row per script: runs,
clean exits, aborts (``std::terminate``, SIGABRT), other failures, median and maximum seconds per run; exits 1
if a topocc run was not clean.

    .venv/bin/python benchmarks/exit_stress.py [--runs 50] [--control 0] [--ranks 8] [--hogs N] [--no-load]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from topocc.runtime.harness.launch import find_mpiexec, worker_env
from topocc.runtime.schedule import save_schedule

SCRIPTS = Path(__file__).resolve().parent.parent / "tests" / "runtime" / "mpi_scripts"
#: What std::terminate, abort() and a SIGABRT death leave on stderr (hydra reports the signal by name or number).
ABORT_MARKS = ("terminate called", "Aborted", "signal 6", "SIGABRT", "core dumped")
#: Exit codes of a rank killed by SIGABRT, as a shell or hydra reports them.
ABORT_CODES = (134, -signal.SIGABRT)
#: The control: torch alone, the rendezvous as beside_torch.py's, the last call a collective on each of four gloo
#: groups (gloo's worker threads may still hold their tensors when the interpreter finalizes).
TORCH_ONLY = """\
from datetime import timedelta
import torch, torch.distributed as dist
from mpi4py import MPI
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
server = dist.TCPStore("127.0.0.1", 0, size, True, timedelta(seconds=60), wait_for_workers=False) if rank == 0 else None
port = world.bcast(server.port if server is not None else None)
store = server if server is not None else dist.TCPStore("127.0.0.1", port, size, False, timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
groups = [None, *(dist.new_group(backend="gloo") for _ in range(3))]
for group in groups:
    dist.all_reduce(torch.ones(1000), group=group)
print(f"rank {rank} done", flush=True)
"""


@dataclass(frozen=True)
class Run:
    """One job: its exit code, seconds, how it ended and the first line of stderr that says why."""

    returncode: int
    seconds: float
    outcome: str  # "clean", "abort" or "other"
    why: str


def classify(returncode: int, stdout: str, stderr: str, ranks: int) -> tuple[str, str]:
    """("clean" | "abort" | "other", the stderr line that decided it): clean is exit 0, every rank done,
    nothing on stderr from topocc and no abort."""
    for line in stderr.splitlines():
        if any(mark in line for mark in ABORT_MARKS):
            return "abort", line.strip()
    if returncode in ABORT_CODES:
        return "abort", f"exit code {returncode}"
    done = stdout.count(" done")
    if returncode == 0 and done == ranks and "topocc:" not in stderr:
        return "clean", ""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return "other", f"exit {returncode}, {done}/{ranks} done" + (f": {lines[-1][:160]}" if lines else "")


def start_hogs(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    """``count`` processes spinning for at most ``seconds`` each (their own bound, should this one be killed)."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]


def gather(folder: Path, kind: str, ranks: int) -> str:
    """What the ranks wrote to their ``kind`` ("out" or "err") files in ``folder``, rank by rank."""
    parts = [folder / f"{kind}.{r}" for r in range(ranks)]
    return "".join(part.read_text() for part in parts if part.exists())


def run_once(mpiexec: str, argv: Sequence[str], ranks: int, limit: float) -> Run:
    """One job of ``ranks`` ranks running ``python argv``, each rank's output in its own file (lines never
    interleave mid-line); past ``limit`` seconds the whole job is killed and counts as a failure."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [mpiexec, "-disable-auto-cleanup", "-outfile-pattern", f"{tmp}/out.%r",
               "-errfile-pattern", f"{tmp}/err.%r", "-n", str(ranks), sys.executable, *argv]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # mpiexec leads a session of its own: its ranks go with it
            proc.communicate()
            return Run(-signal.SIGKILL, time.monotonic() - start, "other", f"no exit within {limit:g} s")
        seconds = time.monotonic() - start
        out += gather(Path(tmp), "out", ranks)
        err += gather(Path(tmp), "err", ranks)
    outcome, why = classify(proc.returncode, out, err, ranks)
    return Run(proc.returncode, seconds, outcome, why)


def repeat(name: str, mpiexec: str, argv: Sequence[str], runs: int, ranks: int, limit: float) -> list[Run]:
    """``runs`` jobs, a progress line each."""
    done = []
    for i in range(runs):
        done.append(run_once(mpiexec, argv, ranks, limit))
        last = done[-1]
        print(f"{name} {i + 1:>3}: {last.outcome:<5} {last.seconds:6.2f} s  {last.why}", flush=True)
    return done


def report(rows: dict[str, list[Run]], ranks: int, hogs: int) -> None:
    """The table, a row per script, then the distinct reasons of the runs that were not clean."""
    print(f"\n# {ranks} ranks per job, {hogs} busy-loop processes on {os.cpu_count()} cores")
    print(f"{'script':<22} {'runs':>5} {'clean exits':>12} {'aborts':>7} {'other failures':>15} "
          f"{'median s':>9} {'max s':>7}")
    for name, runs in rows.items():
        seconds = [r.seconds for r in runs]
        counts = {k: sum(r.outcome == k for r in runs) for k in ("clean", "abort", "other")}
        print(f"{name:<22} {len(runs):>5} {counts['clean']:>12} {counts['abort']:>7} {counts['other']:>15} "
              f"{statistics.median(seconds):9.2f} {max(seconds):7.2f}")
    for name, runs in rows.items():
        for outcome, why in sorted({(r.outcome, r.why) for r in runs if r.outcome != "clean"}):
            print(f"  {name}: {outcome}: {why}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50, help="jobs of beside_torch.py")
    p.add_argument("--control", type=int, default=0, help="jobs of the torch-only control (default none)")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: one a core)")
    p.add_argument("--no-load", action="store_true", help="start no busy-loop processes")
    p.add_argument("--limit", type=float, default=120.0, help="seconds one job may take before it counts as hung")
    args = p.parse_args()
    if args.runs < 1 or args.control < 0 or args.ranks < 2:
        p.error("--runs must be at least 1, --control at least 0 and --ranks at least 2")
    sys.path.insert(0, str(SCRIPTS.parents[2]))  # the repository
    from tests.runtime.mpi_scripts import schedules  # the tests' hand-built schedules

    # SIGTERM (timeout's) becomes SystemExit, so the finally below still kills the busy loops
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    hogs = [] if args.no_load else start_hogs(args.hogs, (args.runs + args.control) * args.limit)
    rows: dict[str, list[Run]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            schedule = Path(tmp, "ring.json")
            save_schedule(schedules.ring_allreduce(args.ranks), schedule)
            mpiexec = find_mpiexec()
            rows["beside_torch.py"] = repeat("beside_torch.py", mpiexec, [str(SCRIPTS / "beside_torch.py"),
                                                                          str(schedule)], args.runs, args.ranks,
                                             args.limit)
            if args.control:
                rows["torch only (control)"] = repeat("control", mpiexec, ["-c", TORCH_ONLY], args.control,
                                                      args.ranks, args.limit)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    report(rows, args.ranks, len(hogs))
    return 0 if all(r.outcome == "clean" for r in rows["beside_torch.py"]) else 1


if __name__ == "__main__":
    sys.exit(main())
