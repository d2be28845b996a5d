"""Launch schedule replays under ``mpiexec``: the library half of ``topocc run`` and ``topocc bench``.

The CLI only parses arguments and calls :func:`run_schedule` or
:func:`bench_schedule`.  Both start ``mpiexec -disable-auto-cleanup -n NP
python -m runtime.worker ...`` (``-disable-auto-cleanup`` so that when a rank
dies, hydra lets the others report which peer they were waiting for instead of
killing them at once) under a hard wall-clock limit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import CommunicatorError
from runtime.executor import resolve_dtype
from runtime.plan import Plan, load_any, save_plan
from runtime.schedule import Schedule, save_schedule
from runtime.worker import case_count

__all__ = [
    "BenchRow",
    "RunResult",
    "bench_schedule",
    "bus_factor",
    "find_mpiexec",
    "format_bench_table",
    "launch_worker",
    "run_schedule",
    "trace_records",
    "write_trace",
]

#: Builds the full command line from the worker's arguments after the interpreter (``-m runtime.worker ...``),
#: e.g. an emulated cluster's ``mpiexec`` placing each rank in its host's network namespace.
Launcher = Callable[[Sequence[str]], list[str]]

#: Each rank runs under a shell, so a rank killed by a signal reaches hydra as an exit code (137): hydra
#: kills every rank of a job when one dies *by a signal*, even with -disable-auto-cleanup, but leaves
#: the others running after a plain non-zero exit.  ``trap : USR1`` keeps the shell alive when hydra
#: then sends SIGUSR1 (its process-failure notice) to the surviving ranks.
RANK_WRAPPER = ("sh", "-c", 'trap : USR1; "$0" "$@"')

#: Seconds allowed for mpiexec and the interpreters to start, on top of the work itself.
STARTUP_S = 30.0


def find_mpiexec(explicit: str | None = None) -> str:
    """``explicit``, else the mpiexec next to this Python (a venv with the mpich wheel), else the one on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise CommunicatorError("mpiexec not found", fix="pip install mpich mpi4py, or pass mpiexec=PATH")
    return found


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw * factor."""
    if collective == "allreduce":
        return 2 * (ranks - 1) / ranks
    if collective in ("allgather", "reducescatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


def worker_env() -> dict[str, str]:
    """The environment for the ranks: this checkout importable, nothing else changed."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch_worker(np: int, args: Sequence[str], *, limit_s: float, mpiexec: str | None = None,
                  extra_mpiexec_args: Sequence[str] = (), launcher: Launcher | None = None
                  ) -> subprocess.CompletedProcess[str]:
    """Run ``runtime.worker`` on ``np`` ranks; kill the whole job if it outlives ``limit_s`` seconds.

    ``launcher`` replaces the default ``mpiexec -n NP python`` prefix (it must start ``np`` ranks).
    """
    if launcher is not None:
        cmd = launcher(["-m", "runtime.worker", *args])
    else:
        cmd = [find_mpiexec(mpiexec), "-disable-auto-cleanup", *extra_mpiexec_args, "-n", str(np),
               *RANK_WRAPPER, sys.executable, "-m", "runtime.worker", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=worker_env(),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\ntopocc: the job ran past its hard limit of {limit_s:g} s and was killed\n"
        return subprocess.CompletedProcess(cmd, -signal.SIGKILL, out, err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one replay produced: per-case rows from rank 0, the error lines of every rank, the exit code."""

    returncode: int
    rows: tuple[dict[str, Any], ...]
    errors: tuple[str, ...]
    elapsed_s: float
    stderr: str = field(repr=False, default="")

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.errors

    @property
    def max_error(self) -> float:
        return max((r["max_error"] for r in self.rows), default=float("nan"))


def _parse(proc: subprocess.CompletedProcess[str], elapsed: float) -> RunResult:
    rows = tuple(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))
    # a rank's one-line error is one write, but another rank's unfinished line may precede it on the pipe
    errors = tuple(line[line.index("topocc:"):] for line in proc.stderr.splitlines() if "topocc:" in line)
    return RunResult(proc.returncode, rows, errors, elapsed, proc.stderr)


def _as_files(source: str | Path | Schedule | Plan | Sequence[Any], tmp: Path) -> list[str]:
    """File paths for the worker: paths as given, in-memory schedules and plans written to ``tmp``."""
    if isinstance(source, (str, Path)):
        return [str(source)]
    if isinstance(source, Schedule):
        save_schedule(source, tmp / "schedule.json")
        return [str(tmp / "schedule.json")]
    if isinstance(source, Plan):
        save_plan(source, tmp / "plan.json")
        return [str(tmp / "plan.json")]
    files = []
    for j, item in enumerate(source):
        sub = tmp / str(j)
        sub.mkdir(exist_ok=True)
        files.extend(_as_files(item, sub))
    return files


def _collective(files: Sequence[str]) -> tuple[str, int]:
    loaded = load_any(files[0])
    return loaded.collective, loaded.ranks


def run_schedule(path: str | Path | Schedule, np: int, size_bytes: int, *, dtype: str = "float32",
                 op: str = "sum", timeout: float = 30.0, mpiexec: str | None = None, seed: int = 0,
                 repeat: int = 1, echo: bool = True, worker_args: Sequence[str] = ()) -> RunResult:
    """Replay a schedule once on ``np`` ranks with deterministic random data and check it against numpy.

    ``size_bytes`` is nccl-tests' size (bytes of the larger buffer).  Returns the
    rank-0 result row (``max_error`` over all ranks) and every rank's error line.

    >>> run_schedule("ring.json", 4, 1 << 20).max_error   # doctest: +SKIP
    0.0
    """
    with tempfile.TemporaryDirectory(prefix="topocc-run-") as tmp:
        files = _as_files(path, Path(tmp))
        collective, ranks = _collective(files)
        count = case_count(collective, ranks, size_bytes, resolve_dtype(dtype).itemsize)
        args = ["check", *files, "--dtypes", dtype, "--ops", op, "--counts", str(count),
                "--seed", str(seed), "--timeout", str(timeout), "--repeat", str(repeat), *worker_args]
        start = time.monotonic()
        proc = launch_worker(np, args, limit_s=timeout * (repeat + 2) + STARTUP_S, mpiexec=mpiexec)
        result = _parse(proc, time.monotonic() - start)
    if echo:
        for row in result.rows:
            print(f"{collective} {row['count']} x {row['dtype']} op={row['op']} on {np} ranks: "
                  f"max error {row['max_error']:.3g}")
        for line in result.errors:
            print(line, file=sys.stderr)
    return result


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One size of a benchmark: the replayed schedule and MPI's native collective side by side."""

    size: int
    count: int
    dtype: str
    op: str
    time_s: float
    native_time_s: float | None
    max_error: float
    algbw: float
    busbw: float
    native_busbw: float | None
    algorithm: str = ""
    gloo_time_s: float | None = None
    iters: int = 0

    @property
    def ratio(self) -> float | None:
        """Replay time over native time (below 1: the schedule is faster)."""
        return self.time_s / self.native_time_s if self.native_time_s else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def bench_schedule(source: str | Path | Schedule | Plan | Sequence[Any], np: int, sizes: Sequence[int], *,
                   iters: int | Sequence[int] = 20, warmup: int = 5, dtype: str = "float32", op: str = "sum",
                   timeout: float = 30.0, mpiexec: str | None = None, echo: bool = True,
                   launcher: Launcher | None = None, gloo: str | None = None, trace: str | Path | None = None,
                   limit_s: float | None = None) -> list[BenchRow]:
    """Time a schedule (or plan) against MPI's native collective at each size; print an nccl-tests table.

    Time is the maximum over ranks of the mean per-iteration time after
    ``warmup`` calls, between barriers.  ``iters`` is one count or one per size.
    ``launcher`` builds the command (see :data:`Launcher`; default: local
    ``mpiexec``); ``gloo`` (rank 0's ``HOST:PORT``) also times torch's gloo
    allreduce; ``trace`` (a ``.json`` path) records one call per size on every
    rank and writes them as a Chrome trace (see :func:`write_trace`).  The job is
    killed after ``limit_s`` (default: ``timeout`` per call).  Raises
    CommunicatorError if the job fails.
    """
    counts = [iters] * len(sizes) if isinstance(iters, int) else list(iters)
    if len(counts) != len(sizes):
        raise CommunicatorError(f"{len(counts)} iteration counts for {len(sizes)} sizes")
    with tempfile.TemporaryDirectory(prefix="topocc-bench-") as tmp:
        files = _as_files(source, Path(tmp))
        collective, ranks = _collective(files)
        args = ["bench", *files, "--dtypes", dtype, "--ops", op, "--sizes", *map(str, sizes),
                "--iters", *map(str, counts), "--warmup", str(warmup), "--timeout", str(timeout)]
        if gloo:
            args += ["--gloo", gloo]
        if trace is not None:
            args += ["--trace", str(Path(tmp) / "trace")]
        calls = sum(c + warmup + 1 for c in counts) * (3 if gloo else 2)
        limit = limit_s if limit_s is not None else timeout * calls + STARTUP_S
        proc = launch_worker(np, args, limit_s=limit, mpiexec=mpiexec, launcher=launcher)
        result = _parse(proc, 0.0)
        if trace is not None and result.ok:
            write_trace(trace_records(Path(tmp) / "trace"), trace)
    if not result.ok:
        detail = "; ".join(result.errors) or proc.stderr.strip().splitlines()[-1:] or "no output"
        raise CommunicatorError(f"benchmark failed (exit {result.returncode}): {detail}")
    factor = bus_factor(collective, ranks)
    rows = []
    for r in result.rows:
        algbw = r["size"] / r["time_s"] / 1e9 if r["time_s"] else 0.0
        native = r["native_time_s"]
        rows.append(BenchRow(
            size=r["size"], count=r["count"], dtype=r["dtype"], op=r["op"], time_s=r["time_s"],
            native_time_s=native, max_error=r["max_error"], algbw=algbw, busbw=algbw * factor,
            native_busbw=(r["size"] / native / 1e9 * factor) if native else None, algorithm=r["algorithm"],
            gloo_time_s=r.get("gloo_time_s"), iters=r.get("iters", 0),
        ))
    if echo:
        print(format_bench_table(rows, collective, ranks))
    return rows


def format_bench_table(rows: Sequence[BenchRow], collective: str, ranks: int) -> str:
    """An nccl-tests style table: replay and native MPI side by side, with their ratio."""
    head = (f"# {collective} on {ranks} ranks (busbw factor {bus_factor(collective, ranks):.3f})\n"
            f"#{'size':>12} {'count':>11} {'type':>8} | {'time(us)':>10} {'algbw':>7} {'busbw':>7} "
            f"{'#wrong':>9} | {'mpi(us)':>10} {'busbw':>7} | {'ratio':>6}")
    lines = [head]
    for r in rows:
        native = f"{r.native_time_s * 1e6:10.1f} {r.native_busbw:7.2f}" if r.native_time_s else f"{'n/a':>10} {'':>7}"
        ratio = f"{r.ratio:6.2f}" if r.ratio else f"{'n/a':>6}"
        lines.append(f" {r.size:12d} {r.count:11d} {r.dtype:>8} | {r.time_s * 1e6:10.1f} {r.algbw:7.2f} "
                     f"{r.busbw:7.2f} {r.max_error:9.2g} | {native} | {ratio}")
    return "\n".join(lines)


def trace_records(folder: str | Path) -> list[tuple[Any, ...]]:
    """Every rank's traced operations from a bench ``--trace`` folder (``rank<R>.json`` files), in rank order.

    Each record is a :data:`runtime.communicator.TraceRecord`: (rank, call, collective, algorithm, op index,
    kind, peer, channel, elements, start_s, end_s).
    """
    files = sorted(Path(folder).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    return [tuple(r) for f in files for r in json.loads(f.read_text())]


def write_trace(records: Sequence[tuple[Any, ...]], path: str | Path) -> Path:
    """Write measured per-op records (see :func:`trace_records`) as a Chrome trace, one track per rank.

    Converted by :func:`runtime.trace.chrome_trace` (the project's one writer) from ``OpEvent``-like
    mappings; ``step`` is the traced call's number and ``chunk`` the elements moved.
    """
    from runtime.trace import write_trace as write_chrome_trace

    events = [{"rank": rank, "index": k, "kind": kind, "peer": peer, "step": call, "channel": channel,
               "chunk": f"{elements} el", "start_s": start, "end_s": end}
              for rank, call, _c, _a, k, kind, peer, channel, elements, start, end in records]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_chrome_trace(path, events)
    return path
