"""Launch schedule replays under ``mpiexec``: the library half of ``topocc run`` and ``topocc bench``.

The CLI only parses arguments and calls :func:`run_schedule` or
:func:`bench_schedule`.  Both refuse a rank count other than the schedule's
before anything starts, then run ``mpiexec -disable-auto-cleanup -n NP python
-m topocc.runtime.harness.worker ...`` (``-disable-auto-cleanup`` so that when a rank dies,
hydra lets the others report which peer they were waiting for instead of
killing them at once) under a hard wall-clock limit, and return rank 0's rows
(:class:`BenchRow`).  When ranks fail, :func:`summarize_failures` collapses
their error lines into one: which ranks, what, the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import topocc
from topocc.runtime.arrays import resolve_dtype
from topocc.runtime.bandwidth import bus_factor
from topocc.runtime.chrome_trace import write_trace as write_chrome_trace
from topocc.runtime.errors import CommunicatorError, UsageError
from topocc.runtime.harness.worker import PROGRESS, case_count, count_bytes
from topocc.runtime.plan import Plan, load_any, save_plan
from topocc.runtime.schedule import Schedule, save_schedule

__all__ = [
    "BenchRequest",
    "BenchRow",
    "RunResult",
    "bench_schedule",
    "bench_sizes",
    "beside_or_on_path",
    "check_ranks",
    "exit_on_sigterm",
    "find_mpiexec",
    "launch_worker",
    "package_home",
    "rank_list",
    "run_job",
    "run_schedule",
    "spawn_ranks",
    "summarize_failures",
    "trace_records",
    "write_trace",
]

#: Builds the full command line from the worker's arguments after the interpreter
#: (``-m topocc.runtime.harness.worker ...``),
#: e.g. an emulated cluster's ``mpiexec`` placing each rank in its host's network namespace.
Launcher = Callable[[Sequence[str]], list[str]]

#: Each rank runs under a shell, so a rank killed by a signal reaches hydra as an exit code (137): hydra
#: kills every rank of a job when one dies *by a signal*, even with -disable-auto-cleanup, but leaves
#: the others running after a plain non-zero exit.  ``trap : USR1`` keeps the shell alive when hydra
#: then sends SIGUSR1 (its process-failure notice) to the surviving ranks.
RANK_WRAPPER = ("sh", "-c", 'trap : USR1; "$0" "$@"')

#: Seconds allowed for mpiexec and the interpreters to start, on top of the work itself.
STARTUP_S = 30.0


def beside_or_on_path(program: str, python: str = sys.executable) -> str | None:
    """``program`` beside ``python`` (the venv's, as pip installed it there), else on ``PATH``; None if neither."""
    beside = Path(python).parent / program
    return str(beside) if beside.exists() else shutil.which(program)


def find_mpiexec(explicit: str | None = None, *, python: str = sys.executable) -> str:
    """``explicit``, else the ``mpiexec`` beside ``python`` (a venv with MPICH from PyPI), else the one on PATH."""
    if explicit:
        return explicit
    found = beside_or_on_path("mpiexec", python)
    if found is None:
        raise CommunicatorError("mpiexec not found", fix="pip install mpich mpi4py, or pass mpiexec=PATH")
    return found


def package_home() -> Path | None:
    """The folder a rank needs on its path to import this same topocc: the one holding the package, or None
    where every interpreter of this Python searches it anyway (an installed topocc in site-packages)."""
    home = Path(topocc.__file__).resolve().parent.parent
    searched = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    return None if home in searched else home


def worker_env() -> dict[str, str]:
    """The environment for the ranks: this process's, with :func:`package_home` first on PYTHONPATH where it
    must be, so that the ranks import the same topocc (a checkout run as it is, or another than the one
    installed)."""
    env = dict(os.environ)
    home = package_home()
    paths = env["PYTHONPATH"].split(os.pathsep) if env.get("PYTHONPATH") else []
    if home is not None and str(home) not in paths:
        env["PYTHONPATH"] = os.pathsep.join([str(home), *paths])
    return env


#: Process groups of the ranks that :func:`spawn_ranks` started and has not yet reaped (from any thread).
_LIVE_RANKS: set[int] = set()


def exit_on_sigterm() -> None:
    """On SIGTERM (``timeout``'s), kill every rank :func:`spawn_ranks` started, then exit with 143.

    The ranks lead their own sessions, so a signal to the launcher's process group never reaches them:
    without this, a launcher killed by ``timeout`` leaves its ranks running on the GPU (and CUDA MPS's
    ``quit`` waiting for them).  Raising ``SystemExit`` lets ``finally`` blocks run (an emulated cluster's
    namespaces are removed); the ranks are killed here first since launcher threads never see it.
    """

    def handler(signum: int, _frame: object) -> None:
        for group in list(_LIVE_RANKS):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def spawn_ranks(commands: Sequence[tuple[Sequence[str], Mapping[str, str]]], *, limit_s: float
                ) -> list[subprocess.CompletedProcess[str]]:
    """Start one process per rank (its command and environment) without ``mpiexec``; kill them all past ``limit_s``.

    For ranks that meet through a store (NCCL, gloo).  Output goes to files, not pipes, so a rank
    that writes much never blocks the others; each process leads its own session, so killing it
    takes its children (``ip netns exec``'s included).  A killed rank's stderr ends with a line saying so.
    """
    with tempfile.TemporaryDirectory(prefix="topocc-ranks-") as tmp, contextlib.ExitStack() as files:
        procs = []
        outputs = []
        try:
            for r, (cmd, env) in enumerate(commands):
                out, err = (files.enter_context(open(Path(tmp) / f"{r}.{kind}", "w+")) for kind in ("out", "err"))
                outputs.append((out, err))
                procs.append(subprocess.Popen(list(cmd), env=dict(env), stdout=out, stderr=err, text=True,
                                              start_new_session=True))
                _LIVE_RANKS.add(procs[-1].pid)
            deadline = time.monotonic() + limit_s
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            killed = [p for p in procs if p.poll() is None]
            for p in killed:
                os.killpg(p.pid, signal.SIGKILL)
            for p in killed:
                p.wait()
            _LIVE_RANKS.difference_update(p.pid for p in procs)
        done = []
        for p, (out, err) in zip(procs, outputs):
            out.seek(0)
            err.seek(0)
            text = err.read()
            if p in killed:
                text += ("" if text.endswith("\n") or not text else "\n") + f"topocc: killed after {limit_s:g} s\n"
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out.read(), text))
        return done


def launch_worker(np: int, args: Sequence[str], *, limit_s: float, mpiexec: str | None = None,
                  extra_mpiexec_args: Sequence[str] = (), launcher: Launcher | None = None,
                  on_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``topocc.runtime.harness.worker`` on ``np`` ranks; kill the whole job if it outlives ``limit_s`` seconds.

    ``launcher`` replaces the default ``mpiexec -n NP python`` prefix (it must start ``np`` ranks);
    ``on_line`` is called with each line of the job's stdout as it arrives (rank 0's rows, for progress).
    """
    if launcher is not None:
        cmd = launcher(["-m", "topocc.runtime.harness.worker", *args])
    else:
        cmd = [find_mpiexec(mpiexec), "-disable-auto-cleanup", *extra_mpiexec_args, "-n", str(np),
               *RANK_WRAPPER, sys.executable, "-m", "topocc.runtime.harness.worker", *args]
    return run_job(cmd, worker_env(), limit_s, on_line=on_line,
                   killed=f"\ntopocc: the job ran past its hard limit of {limit_s:g} s and was killed\n")


def run_job(cmd: list[str], env: dict[str, str], limit_s: float, *, on_line: Callable[[str], None] | None = None,
            on_error_line: Callable[[str], None] | None = None, killed: str = "") -> subprocess.CompletedProcess[str]:
    """Run a job (mpiexec's, torchrun's) in a session of its own, reading both streams as they come (``on_line``
    gets stdout's lines, ``on_error_line`` stderr's); past ``limit_s``, or when interrupted, kill it all (the
    ranks lead no session of their own: the job's group holds them), ``killed`` then ending its stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=_drain, args=(proc.stdout, out, on_line), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err, on_error_line), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        returncode = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        err.append(killed)
        returncode = -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:
        reader.join()
    return subprocess.CompletedProcess(cmd, returncode, "".join(out), "".join(err))


def _drain(stream: IO[str] | None, into: list[str], on_line: Callable[[str], None] | None) -> None:
    """Read ``stream`` to its end into ``into``, passing each line to ``on_line`` as it comes."""
    if stream is None:
        return
    for line in stream:
        into.append(line)
        if on_line is not None:
            on_line(line)
    stream.close()


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One case of a run or benchmark (a row of nccl-tests' table), beside MPI's native collective when timed.

    ``size`` is nccl-tests' size (bytes of the larger buffer); ``time_s`` the
    slowest rank's mean per call; ``algbw``/``busbw`` in GB/s; ``wrong`` the
    elements, over all ranks, farther from numpy's result than the dtype's
    tolerance (:func:`topocc.runtime.harness.worker.tolerance`); ``max_error`` the largest
    difference.
    """

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
    wrong: int = 0

    @property
    def ratio(self) -> float | None:
        """Replay time over native time (below 1: the schedule is faster)."""
        return self.time_s / self.native_time_s if self.native_time_s else None

    @property
    def passed(self) -> bool:
        """No element is wrong."""
        return self.wrong == 0

    def to_json(self) -> dict[str, Any]:
        """The row under the names ``docs/json.md`` lists, in the order of nccl-tests' columns."""
        return {"size_bytes": self.size, "count": self.count, "type": self.dtype, "redop": self.op,
                "time_s": self.time_s, "algbw_GBps": self.algbw, "busbw_GBps": self.busbw, "wrong": self.wrong,
                "max_error": self.max_error, "native_time_s": self.native_time_s,
                "native_busbw_GBps": self.native_busbw, "ratio": self.ratio, "gloo_time_s": self.gloo_time_s,
                "algorithm": self.algorithm, "iters": self.iters}


def _row(raw: dict[str, Any], factor: float) -> BenchRow:
    """A worker's JSON row as a :class:`BenchRow`, with bandwidths (``factor``: see :func:`bus_factor`)."""
    size, time_s, native = raw["size"], raw["time_s"], raw.get("native_time_s")
    algbw = size / time_s / 1e9 if time_s else 0.0
    return BenchRow(size=size, count=raw["count"], dtype=raw["dtype"], op=raw["op"], time_s=time_s,
                    native_time_s=native, max_error=raw["max_error"], algbw=algbw, busbw=algbw * factor,
                    native_busbw=size / native / 1e9 * factor if native else None, algorithm=raw["algorithm"],
                    gloo_time_s=raw.get("gloo_time_s"), iters=raw.get("iters", 0), wrong=raw["wrong"])


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one replay produced: per-case rows from rank 0, the error lines of every rank, the exit code."""

    returncode: int
    rows: tuple[BenchRow, ...]
    errors: tuple[str, ...]
    elapsed_s: float
    collective: str
    ranks: int
    stderr: str = field(repr=False, default="")
    #: The size asked for, where the one run was rounded to whole elements (per rank where the collective
    #: splits the buffer); None where it ran as asked.
    requested_size: int | None = None

    @property
    def ok(self) -> bool:
        """The job ran to the end on every rank (whether the results are right is :attr:`passed`)."""
        return self.returncode == 0 and not self.errors

    @property
    def passed(self) -> bool:
        """The job ran and no element of any case is wrong."""
        return self.ok and bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def max_error(self) -> float:
        return max((r.max_error for r in self.rows), default=float("nan"))

    def failure(self) -> str:
        """Why the job failed, in one line (see :func:`summarize_failures`)."""
        detail = summarize_failures(self.errors, self.ranks, self.returncode)
        return f"{self.ranks} ranks, exit {self.returncode}: {detail}"


def _parse(proc: subprocess.CompletedProcess[str], elapsed: float, collective: str, ranks: int) -> RunResult:
    factor = bus_factor(collective, ranks)
    rows = tuple(_row(json.loads(line), factor) for line in proc.stdout.splitlines() if line.startswith("{"))
    # a rank's one-line error is one write, but another rank's unfinished line may precede it on the pipe
    errors = tuple(line[line.index("topocc:"):] for line in proc.stderr.splitlines() if "topocc:" in line)
    return RunResult(proc.returncode, rows, errors, elapsed, collective, ranks, proc.stderr)


_ERROR_LINE = re.compile(r"topocc: (?:rank (\d+): )?(.*?)(?: \[exiting without MPI_Finalize\])?$")
_FIX = re.compile(r" \(fix: (.*)\)$")
#: The executor's per-operation detail of a timeout, "(op 5: receive from rank 2 ch 1; ...)": it differs by rank.
_OP_DETAIL = re.compile(r" \(op \d+: [^()]*\)")
#: The peers a timed-out rank waited for, "waiting for rank(s) 2, 3": merged over the ranks of one message.
_WAITING = re.compile(r"waiting for rank\(s\) ([\d, ]+)")
#: At most this many distinct messages in the line; the rest are counted.
MAX_MESSAGES = 3


def rank_list(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"ranks 0-3 and 5"``, ``[0, 1]`` -> ``"ranks 0 and 1"``, ``[4]`` -> ``"rank 4"``."""
    ordered = sorted(set(ranks))
    items: list[str] = []
    start = 0
    for end in range(len(ordered)):
        if end + 1 == len(ordered) or ordered[end + 1] != ordered[end] + 1:  # a run of consecutive ranks ends
            run = ordered[start:end + 1]
            items += [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(r) for r in run]
            start = end + 1
    if len(items) == 1:
        return ("rank " if len(ordered) == 1 else "ranks ") + items[0]
    return "ranks " + ", ".join(items[:-1]) + " and " + items[-1]


def summarize_failures(lines: Sequence[str], ranks: int, returncode: int) -> str:
    """Every rank's ``topocc: rank R: ...`` error line, collapsed into one line: which ranks, what, the fix.

    Ranks that wrote no line come first when the job failed (they likely died);
    then ranks with the same message are listed together, the peers they waited
    for merged ("ranks 0-3 and 5: allreduce ...: timed out after 30 s waiting
    for rank 4"); one fix, the first given, ends the line.
    """
    groups: dict[str, tuple[list[int], set[int], set[tuple[int, ...]]]] = {}  # message -> ranks, waited, lists
    unranked: dict[str, None] = {}
    fixes: list[str] = []
    for line in lines:
        match = _ERROR_LINE.match(line.strip())
        if match is None:
            continue
        rank, text = match.groups()
        fix = _FIX.search(text)
        if fix:
            text = text[:fix.start()]
            if fix.group(1) not in fixes:
                fixes.append(fix.group(1))
        text = _OP_DETAIL.sub("", text)
        if rank is None:
            unranked[text] = None
            continue
        waiting = _WAITING.search(text)
        peers = tuple(int(p) for p in waiting.group(1).split(",")) if waiting else ()
        key = _WAITING.sub("waiting for {}", text) if waiting else text
        members, waited, lists = groups.setdefault(key, ([], set(), set()))
        members.append(int(rank))
        waited.update(peers)
        lists.add(peers)
    parts = []
    silent = set(range(ranks)) - {r for members, _, _ in groups.values() for r in members}
    if returncode != 0 and silent and groups:
        parts.append(f"{rank_list(silent)}: no error line (died, was killed or exited early)")
    for key, (members, waited, lists) in sorted(groups.items(), key=lambda g: min(g[1][0])):
        named = (rank_list(waited) + (" between them" if len(lists) > 1 else "")) if waited else ""
        parts.append(f"{rank_list(members)}: {key.replace('waiting for {}', f'waiting for {named}')}")
    parts += list(unranked)
    if len(parts) > MAX_MESSAGES:
        more = len(parts) - MAX_MESSAGES
        parts = [*parts[:MAX_MESSAGES], f"and {more} more message{'s' if more > 1 else ''}"]
    text = "; ".join(parts) or "no error line from the ranks"
    return text + (f" (fix: {fixes[0]})" if fixes else "")


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


def _elements(collective: str, ranks: int, size: int, dtype: str) -> int:
    """Elements per call for nccl-tests' ``size``; a size too small for one element (per rank) is refused."""
    dt = resolve_dtype(dtype)
    count = case_count(collective, ranks, size, dt.itemsize)
    if count < 1:
        least = count_bytes(collective, ranks, 1, dt)
        raise UsageError(f"a size of {size} bytes holds no {dtype} element"
                         + (f" for each of {ranks} ranks" if least > dt.itemsize else ""),
                         fix=f"pass a size of at least {least} bytes")
    return count


def check_ranks(ranks: int, np: int | None, source: str) -> int:
    """``np``, or the schedule's ``ranks`` when None; a different count is refused before anything starts."""
    if np is not None and np != ranks:
        raise UsageError(f"the schedule is for {ranks} ranks, not --np {np}", where=source,
                         fix=f"pass --np {ranks}, or leave --np out to use the schedule's")
    return ranks


def _name(source: str | Path | Schedule | Plan | Sequence[Any]) -> str:
    return str(source) if isinstance(source, (str, Path)) else "the schedule"


def run_schedule(path: str | Path | Schedule, np: int | None, size_bytes: int, *, dtype: str = "float32",
                 op: str = "sum", timeout: float = 30.0, mpiexec: str | None = None, seed: int = 0,
                 repeat: int = 1, warmup: int = 0, worker_args: Sequence[str] = (),
                 progress: Callable[[str], None] | None = None) -> RunResult:
    """Replay a schedule on ``np`` ranks (None: the schedule's) with deterministic random data, check and time it.

    ``size_bytes`` is nccl-tests' size (bytes of the larger buffer), rounded down to whole elements (per rank
    where the collective splits the buffer: the result's ``requested_size`` says so); ``warmup``
    untimed calls come first, then ``repeat`` timed ones, every result checked
    against numpy.  Returns the rank-0 row (time, wrong elements and
    ``max_error`` over all ranks) and every rank's error line.  A rank count
    other than the schedule's is refused (:class:`~topocc.runtime.errors.UsageError`)
    before anything starts.  ``progress`` gets a line at each step: the launch, the ranks up, the data
    ready, each call.

    >>> run_schedule("ring.json", 4, 1 << 20).passed   # doctest: +SKIP
    True
    """
    with tempfile.TemporaryDirectory(prefix="topocc-run-") as tmp:
        files = _as_files(path, Path(tmp))
        collective, ranks = _collective(files)
        np = check_ranks(ranks, np, _name(path))
        count = _elements(collective, ranks, size_bytes, dtype)
        actual = count_bytes(collective, ranks, count, resolve_dtype(dtype))
        args = ["check", *files, "--dtypes", dtype, "--ops", op, "--counts", str(count), "--seed", str(seed),
                "--timeout", str(timeout), "--repeat", str(repeat), "--warmup", str(warmup), *worker_args]
        if progress is not None:
            progress(f"launching {np} ranks for {warmup} warm-up and {repeat} timed calls of {actual} bytes"
                     + (f" (asked {size_bytes}: rounded down to whole elements)" if actual != size_bytes else ""))
        start = time.monotonic()
        proc = launch_worker(np, args, limit_s=timeout * (warmup + repeat + 2) + STARTUP_S, mpiexec=mpiexec,
                             on_line=_progress_lines(progress, start))
        result = _parse(proc, time.monotonic() - start, collective, ranks)
        return replace(result, requested_size=size_bytes) if actual != size_bytes else result


def _progress_lines(progress: Callable[[str], None] | None, start: float) -> Callable[[str], None] | None:
    """Passes the worker's progress lines on to ``progress``, each with the seconds since ``start``."""
    if progress is None:
        return None

    def on_line(line: str) -> None:
        if line.startswith(PROGRESS):
            progress(f"[{time.monotonic() - start:6.1f} s] {line[len(PROGRESS):].rstrip()}")

    return on_line


def bench_sizes(collective: str, ranks: int, sizes: Sequence[int], dtype: str = "float32") -> list[int]:
    """The sizes a benchmark of ``sizes`` measures: whole elements, divisible among the ranks where it must be.

    A size too small for one element (per rank, where the collective splits the
    buffer) is refused with :class:`~topocc.runtime.errors.UsageError`.
    """
    return [count_bytes(collective, ranks, _elements(collective, ranks, s, dtype), resolve_dtype(dtype))
            for s in sizes]


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """What a bench times: each size (bytes), ``iters`` timed calls per size (one count, or one per size) after
    ``warmup`` calls, the dtype and op, each call's ``timeout`` (seconds); ``gloo`` (rank 0's ``HOST:PORT``) also
    times torch's gloo allreduce, ``native=False`` leaves MPI's own collective out; ``trace`` (a ``.json`` path)
    records one call per size on every rank as a Chrome trace; the job is killed after ``limit_s`` (default:
    ``timeout`` per call)."""

    sizes: tuple[int, ...]
    iters: int | tuple[int, ...] = 20
    warmup: int = 5
    dtype: str = "float32"
    op: str = "sum"
    timeout: float = 30.0
    gloo: str | None = None
    trace: str | Path | None = None
    limit_s: float | None = None
    native: bool = True


def bench_schedule(source: str | Path | Schedule | Plan | Sequence[Any], np: int | None, request: BenchRequest, *,
                   mpiexec: str | None = None, launcher: Launcher | None = None,
                   progress: Callable[[BenchRow], None] | None = None) -> list[BenchRow]:
    """Time a schedule (or plan) against MPI's native collective as ``request`` asks, on ``np`` ranks (None: its
    own).

    Time is the maximum over ranks of the mean per-iteration time after the warm-up calls, between barriers.
    ``launcher`` builds the command (see :data:`Launcher`; default: local ``mpiexec``); ``progress`` gets each
    row as its size ends.  Raises UsageError for a rank count other than the schedule's (before anything
    starts), CommunicatorError if the job fails.
    """
    sizes, iters, warmup, dtype, timeout = request.sizes, request.iters, request.warmup, request.dtype, request.timeout
    gloo, trace, native = request.gloo, request.trace, request.native
    counts = [iters] * len(sizes) if isinstance(iters, int) else list(iters)
    if len(counts) != len(sizes):
        raise CommunicatorError(f"{len(counts)} iteration counts for {len(sizes)} sizes")
    with tempfile.TemporaryDirectory(prefix="topocc-bench-") as tmp:
        files = _as_files(source, Path(tmp))
        collective, ranks = _collective(files)
        np = check_ranks(ranks, np, _name(source))
        bench_sizes(collective, ranks, sizes, dtype)  # refuses a size too small for one element
        args = ["bench", *files, "--dtypes", dtype, "--ops", request.op, "--sizes", *map(str, sizes),
                "--iters", *map(str, counts), "--warmup", str(warmup), "--timeout", str(timeout)]
        if gloo:
            args += ["--gloo", gloo]
        if not native:
            args.append("--no-native")
        if trace is not None:
            args += ["--trace", str(Path(tmp) / "trace")]
        calls = sum(c + warmup + 1 for c in counts) * (1 + bool(gloo) + native)
        limit = request.limit_s if request.limit_s is not None else timeout * calls + STARTUP_S

        def on_line(line: str) -> None:
            if progress is not None and line.startswith("{"):
                progress(_row(json.loads(line), bus_factor(collective, ranks)))

        proc = launch_worker(np, args, limit_s=limit, mpiexec=mpiexec, launcher=launcher, on_line=on_line)
        result = _parse(proc, 0.0, collective, ranks)
        if trace is not None and result.ok:
            write_trace(trace_records(Path(tmp) / "trace"), trace)
    if not result.ok:
        raise CommunicatorError(f"benchmark failed: {result.failure()}")
    return list(result.rows)


def trace_records(folder: str | Path) -> list[tuple[Any, ...]]:
    """Every rank's traced operations from a bench ``--trace`` folder (``rank<R>.json`` files), in rank order.

    Each record is a :data:`topocc.runtime.communicator.TraceRecord`: (rank, call, collective, algorithm, op index,
    kind, peer, channel, elements, start_s, end_s).
    """
    files = sorted(Path(folder).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    return [tuple(r) for f in files for r in json.loads(f.read_text())]


def write_trace(records: Sequence[tuple[Any, ...]], path: str | Path) -> Path:
    """Write measured per-op records (see :func:`trace_records`) as a Chrome trace, one track per rank.

    Converted by :func:`topocc.runtime.chrome_trace.chrome_trace` (the project's one writer) from ``OpEvent``-like
    mappings; ``step`` is the traced call's number and ``chunk`` the elements moved.
    """
    events = [{"rank": rank, "index": k, "kind": kind, "peer": peer, "step": call, "channel": channel,
               "chunk": f"{elements} el", "start_s": start, "end_s": end}
              for rank, call, _c, _a, k, kind, peer, channel, elements, start, end in records]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_chrome_trace(path, events)
    return path
