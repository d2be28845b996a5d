"""Faults under torchrun: a rank SIGKILLed inside a planned collective, and a job restarted from its checkpoint.

**Kill trials** (``--trials``, default 20, on ``--ranks`` 4): ``fault_job.py kill`` loops planned
all_reduces over ``init_process_group("topocc")`` and one rank, chosen at random, SIGKILLs itself at a
random moment while inside a call.  Each trial passes when every other rank ends within
``TOPOCC_TIMEOUT`` + 10 s of the kill with a one-line error that names the lost rank, and no process of
the trial is left once torchrun has exited (a scan of ``/proc``).  torchrun runs with a monitor interval
longer than that bound: its agent stops the survivors (SIGTERM) as soon as it sees a failed worker, which
would hide how the backend itself ends them, the one thing measured here; once every survivor has ended
on its own, the harness stops the agent instead of waiting for its next look.

**Restart trial**: ``fault_job.py train`` under ``torchrun --max-restarts 1`` (torchrun's defaults
otherwise) trains with DDP over topocc, checkpointing every few steps; a rank SIGKILLs itself during
one step's backward pass, torchrun restarts the job, which reloads the bundle and the checkpoint and
finishes.  It passes when the losses from the checkpoint on equal those of an uninterrupted run, the
restarted attempt's gradients went through the plans, and no process is left.

Prints one row per trial and a summary; exits 1 if any trial failed.

    python benchmarks/fault_trials.py [--trials 20] [--ranks 4] [--timeout-s 5] [--seed 0] [--no-restart]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as a script: the repository's modules
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bundles import REPO, compile_bundle

JOB = REPO / "benchmarks" / "fault_job.py"
#: Seconds past TOPOCC_TIMEOUT within which every survivor must have ended.
GRACE_S = 10.0
#: The restart trial: its steps, and the step whose backward pass is cut (fault_job.py checkpoints every 4).
TRAIN_STEPS, KILL_STEP = 12, 7


@dataclass(frozen=True)
class Survivor:
    """How one rank that was not killed ended: seconds after the kill (None: it wrote nothing), its error."""

    rank: int
    after_s: float | None
    error: str


@dataclass(frozen=True)
class KillTrial:
    """One kill trial's victim and delay, how the others ended, torchrun's status and the processes left."""

    victim: int
    delay_s: float
    killed: bool
    survivors: tuple[Survivor, ...]
    returncode: int
    orphans: tuple[int, ...]
    bound_s: float

    def problems(self) -> list[str]:
        """Why this trial failed (empty: it passed)."""
        found = [] if self.killed else [f"rank {self.victim} never killed itself"]
        for s in self.survivors:
            if s.after_s is None:
                found.append(f"rank {s.rank} wrote no error")
            elif s.after_s > self.bound_s:
                found.append(f"rank {s.rank} ended {s.after_s:.1f} s after the kill (bound {self.bound_s:g} s)")
            if "\n" in s.error:
                found.append(f"rank {s.rank}'s error spans {s.error.count(chr(10)) + 1} lines")
            if s.after_s is not None and not names_rank(s.error, self.victim):
                found.append(f"rank {s.rank}'s error does not name rank {self.victim}: {s.error[:200]}")
        if self.orphans:
            found.append(f"processes left: {', '.join(map(str, self.orphans))}")
        return found


@dataclass(frozen=True)
class RestartTrial:
    """The restart trial: the losses of both attempts and of the uninterrupted run, and what was left."""

    reference: dict[int, float]
    first: dict[int, float]
    resumed: dict[int, float]
    planned_after_restart: int
    returncode: int
    orphans: tuple[int, ...]
    notes: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        found = list(self.notes)
        if self.returncode != 0:
            found.append(f"torchrun exited with {self.returncode}")
        if not self.resumed:
            found.append("the job was not restarted (no losses from attempt 1)")
        if set(self.first) | set(self.resumed) != set(self.reference) or not self.reference:
            found.append(f"steps run {sorted(set(self.first) | set(self.resumed))} are not the uninterrupted run's")
        for attempt, losses in (("first attempt", self.first), ("after the restart", self.resumed)):
            for step, loss in sorted(losses.items()):
                ref = self.reference.get(step)
                if ref is None or abs(loss - ref) > 1e-6 * max(1.0, abs(ref)):
                    found.append(f"step {step} {attempt}: loss {loss!r}, uninterrupted {ref!r}")
        if self.planned_after_restart == 0:
            found.append("no planned all_reduce after the restart")
        if self.orphans:
            found.append(f"processes left: {', '.join(map(str, self.orphans))}")
        return found


def names_rank(error: str, rank: int) -> bool:
    """Whether ``error`` names ``rank`` as the one lost ("lost rank(s) 3", "lost rank(s) 1, 3")."""
    return re.search(rf"\blost rank\(s\) ([0-9]+, )*{rank}\b", error) is not None


def torchrun(ranks: int, args: Sequence[str], *, max_restarts: int = 0,
             monitor_interval_s: float | None = None) -> list[str]:
    """The command line: the venv's torchrun, ``--standalone`` (its rendezvous on a free loopback port)."""
    exe = Path(sys.executable).parent / "torchrun"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd += ["--standalone", f"--nproc-per-node={ranks}", f"--max-restarts={max_restarts}"]
    if monitor_interval_s is not None:
        cmd.append(f"--monitor-interval={monitor_interval_s:g}")
    return [*cmd, str(JOB), *args]


def run(cmd: list[str], env: dict[str, str], limit_s: float) -> int:
    """Run ``cmd`` in its own session, output discarded; past ``limit_s`` kill the session (then 124)."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        return proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124


def _run_kill_job(cmd: list[str], env: dict[str, str], folder: Path, survivors: int, limit_s: float) -> int:
    """Run a kill trial's torchrun; once the victim has killed itself and every survivor has written its error
    and exited on its own, stop torchrun's agent (SIGTERM), which would otherwise sit out its long monitor
    interval.  Returns torchrun's status (124: killed at ``limit_s``)."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline, stopped = time.monotonic() + limit_s, False
    while proc.poll() is None and time.monotonic() < deadline:
        written = (folder / "killed").exists() and len(list(folder.glob("rank*.json"))) >= survivors
        if not stopped and written and not leftovers(str(folder), settle_s=0, besides=(proc.pid,)):
            proc.send_signal(signal.SIGTERM)
            deadline, stopped = min(deadline, time.monotonic() + 60), True
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124
    return proc.returncode


def _ancestors() -> set[int]:
    """This process and those above it (their command lines may hold a trial's folder too)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def leftovers(token: str, settle_s: float = 2.0, besides: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Processes whose command line holds ``token`` (a trial's own folder), after ``settle_s`` for exits;
    ``besides`` (torchrun's agent, while it runs) are left out."""
    deadline = time.monotonic() + settle_s
    mine = _ancestors() | set(besides)
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in mine:
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if token in cmdline:
                found.append(int(entry.name))
        if not found or time.monotonic() > deadline:
            return tuple(sorted(found))
        time.sleep(0.2)


def job_env(plan: Path, timeout_s: float) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "TOPOCC_PLAN": str(plan), "TOPOCC_TIMEOUT": f"{timeout_s:g}", "TOPOCC_TUNE": "off"}
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    return env


def kill_trial(ranks: int, victim: int, delay_s: float, plan: Path, timeout_s: float, folder: Path) -> KillTrial:
    """One kill trial in ``folder`` (empty, unique: it also tells the trial's processes apart)."""
    bound = timeout_s + GRACE_S
    cmd = torchrun(ranks, ["kill", str(folder), str(victim), f"{delay_s:.3f}"], monitor_interval_s=bound + 5)
    code = _run_kill_job(cmd, job_env(plan, timeout_s), folder, ranks - 1, limit_s=delay_s + 3 * bound + 120)
    killed_file = folder / "killed"
    killed_at = float(killed_file.read_text()) if killed_file.exists() else None
    survivors = []
    for r in range(ranks):
        if r == victim:
            continue
        out = folder / f"rank{r}.json"
        if out.exists() and killed_at is not None:
            row = json.loads(out.read_text())
            survivors.append(Survivor(r, row["time"] - killed_at, row["error"]))
        else:
            survivors.append(Survivor(r, None, ""))
    return KillTrial(victim, delay_s, killed_at is not None, tuple(survivors), code, leftovers(str(folder)), bound)


def _losses(path: Path) -> dict[int, float]:
    if not path.exists():
        return {}
    return {int(s): float(v) for s, v in (line.split() for line in path.read_text().splitlines() if line.strip())}


def restart_trial(ranks: int, plan: Path, timeout_s: float, folder: Path) -> RestartTrial:
    """The uninterrupted run, then the run whose rank ``ranks - 1`` is killed at step :data:`KILL_STEP`."""
    env = job_env(plan, timeout_s)
    ref_dir, cut_dir = folder / "uninterrupted", folder / "restarted"
    ref_dir.mkdir()
    cut_dir.mkdir()
    notes = []
    code = run(torchrun(ranks, ["train", str(ref_dir), "-1", "0", str(TRAIN_STEPS)]), env, limit_s=600)
    if code != 0:
        notes.append(f"the uninterrupted run exited with {code}")
    code = run(torchrun(ranks, ["train", str(cut_dir), str(ranks - 1), str(KILL_STEP), str(TRAIN_STEPS)],
                        max_restarts=1), env, limit_s=900)
    counters = cut_dir / "counters.1"
    planned = json.loads(counters.read_text()).get("allreduce", {}).get("planned", 0) if counters.exists() else 0
    return RestartTrial(_losses(ref_dir / "losses.0"), _losses(cut_dir / "losses.0"), _losses(cut_dir / "losses.1"),
                        planned, code, leftovers(str(folder)), tuple(notes))


def fault_bundle(ranks: int, folder: Path) -> Path:
    """An all-reduce bundle for ``ranks`` ranks (what both jobs call; the rest goes to gloo)."""
    return compile_bundle(ranks, folder, ("allreduce",), size="1KiB:4MiB")


def kill_trials(trials: int, ranks: int, plan: Path, timeout_s: float, seed: int, folder: Path) -> list[KillTrial]:
    """``trials`` kill trials, victims and delays drawn from ``seed``, each printed as it ends."""
    rng = random.Random(seed)
    done = []
    for i in range(trials):
        victim, delay = rng.randrange(ranks), rng.uniform(0.2, 2.0)
        trial_dir = folder / f"kill{i}"
        trial_dir.mkdir()
        t = kill_trial(ranks, victim, delay, plan, timeout_s, trial_dir)
        ends = [s.after_s for s in t.survivors if s.after_s is not None]
        print(f"{i:>5} {t.victim:>6} {t.delay_s:>7.2f} {max(ends) if ends else float('nan'):>10.2f} "
              f"{t.returncode:>5} {len(t.orphans):>5}  {'; '.join(t.problems()) or 'ok'}", flush=True)
        done.append(t)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=5.0, help="TOPOCC_TIMEOUT for the jobs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-restart", action="store_true", help="skip the restart trial")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="topocc-faults-") as tmp:
        folder = Path(tmp)
        plan = fault_bundle(args.ranks, folder / "bundle")
        print(f"# {args.trials} kill trials on {args.ranks} ranks, TOPOCC_TIMEOUT={args.timeout_s:g} s, "
              f"bound {args.timeout_s + GRACE_S:g} s after the kill")
        print(f"{'trial':>5} {'victim':>6} {'delay':>7} {'last end':>10} {'exit':>5} {'left':>5}  problems")
        trials = kill_trials(args.trials, args.ranks, plan, args.timeout_s, args.seed, folder)
        ends = sorted(s.after_s for t in trials for s in t.survivors if s.after_s is not None)
        failed = sum(1 for t in trials if t.problems())
        if ends:
            print(f"survivors' end after the kill: median {ends[len(ends) // 2]:.2f} s, max {ends[-1]:.2f} s; "
                  f"{args.trials - failed}/{args.trials} trials passed")
        if not args.no_restart:
            restart_dir = folder / "restart"
            restart_dir.mkdir()
            r = restart_trial(args.ranks, plan, args.timeout_s, restart_dir)
            resumed_from = min(r.resumed) if r.resumed else None
            print(f"restart trial: first attempt steps {sorted(r.first)}, resumed at step {resumed_from}, "
                  f"{len(r.resumed)} steps after the restart, planned all_reduces after it {r.planned_after_restart}: "
                  f"{'; '.join(r.problems()) or 'ok (losses equal the uninterrupted run)'}")
            failed += bool(r.problems())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
