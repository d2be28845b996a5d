"""Start ``torchrun --standalone`` over :mod:`~.timer` and read its rows back: the library half of
``topocc torchbench``.

The launching process never imports torch unless a GPU is asked for (to ask torch whether it sees one):
it finds the ``torchrun`` beside this interpreter (else on ``PATH``), points ``TOPOCC_PLAN`` at the
bundle, runs the job under a hard wall-clock limit, and turns rank 0's lines into :class:`Row` objects.
When the job fails, the first ``topocc: error:`` line a rank printed is the error's one line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topocc.runtime.bandwidth import bus_factor
from topocc.runtime.bundle import Bundle, load_bundle, save_bundle
from topocc.runtime.errors import CommunicatorError, TopoccError, UsageError
from topocc.runtime.harness.launch import beside_or_on_path, run_job, worker_env
from topocc.runtime.harness.torchbench.sweep import Sweep

__all__ = ["STARTUP_S", "Row", "TorchbenchResult", "find_torchrun", "planned_at_every_size", "preflight",
           "require_torch", "run_torchbench"]

#: Seconds allowed for torchrun and the ranks' interpreters to start and meet, on top of the sweep's own limit.
STARTUP_S = 120.0
#: The worker's module, as ``torchrun -m`` takes it.
WORKER = "topocc.runtime.harness.torchbench.timer"
#: Its line prefixes, the variable naming the bundle (``topocc.runtime.distributed.job.PLAN_ENV``) and the one
#: that turns the backend's measured trials off (``...distributed.tuning.TUNE_ENV``): kept here too, since
#: importing those modules would import torch.
ROW, COUNTERS, PLAN_ENV, TUNE_ENV = "torchbench-row ", "torchbench-counters ", "TOPOCC_PLAN", "TOPOCC_TUNE"


@dataclass(frozen=True, slots=True)
class Row:
    """One size on one backend: the slowest rank's mean time per call, the wrong elements over all ranks and,
    for topocc, how many of this size's calls (warm-up, timed and checked) a plan ran and the native backend."""

    backend: str
    size: int
    count: int
    time_s: float
    wrong: int
    planned: int | None = None
    native: int | None = None

    @property
    def algbw(self) -> float:
        """nccl-tests' algbw, GB/s: ``size`` over the time."""
        return self.size / self.time_s / 1e9 if self.time_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class TorchbenchResult:
    """What a sweep measured: its rows (each size, each backend in turn), topocc's counters for the collective
    (None without topocc), the plans it ran (``bundle``: a description for the reader; ``forced``: at every
    size), and how it ran."""

    sweep: Sweep
    rows: tuple[Row, ...]
    counters: dict[str, Any] | None
    bundle: str | None
    forced: bool
    command: tuple[str, ...]
    elapsed_s: float

    @property
    def factor(self) -> float:
        """busbw / algbw: nccl-tests' factor for the collective on these ranks."""
        return bus_factor(self.sweep.collective, self.sweep.ranks)


def require_torch() -> None:
    """Refuse in one line where this interpreter has no torch (the ranks would fail one by one)."""
    if importlib.util.find_spec("torch") is None:
        raise TopoccError(f"torch is not installed for {sys.executable}",
                          fix="pip install torch (it brings torchrun and torch.distributed)")


def find_torchrun(explicit: str | None = None, *, python: str = sys.executable) -> str:
    """``explicit``, else the ``torchrun`` beside ``python`` (the venv's), else the one on ``PATH``."""
    if explicit is not None:
        found = shutil.which(explicit)
        if found is None:
            raise TopoccError(f"--torchrun {explicit}: no such program", fix="pass the path of torchrun, or leave "
                              "--torchrun out to use the one beside this Python")
        return found
    found = beside_or_on_path("torchrun", python)
    if found is None:
        raise TopoccError(f"torchrun is neither beside {python} nor on PATH",
                          fix="pip install torch in this environment, or pass --torchrun PATH")
    return found


def _check_cuda(sweep: Sweep) -> None:
    """NCCL, or tensors on the GPU, only where torch sees a GPU: else one line naming what to leave out."""
    if "nccl" not in sweep.backends and sweep.device != "cuda":
        return
    import torch  # optional dependency: only a GPU sweep asks torch about CUDA here

    if not torch.cuda.is_available():
        what = "--backend nccl" if "nccl" in sweep.backends else "--device cuda"
        raise UsageError(f"{what} needs CUDA, and torch sees no GPU here",
                         fix="leave nccl out of --backend (e.g. --backend topocc,gloo) and use --device cpu, "
                             "or run where torch.cuda.is_available()")


def preflight(sweep: Sweep, torchrun: str | None = None) -> str:
    """The torchrun to launch, once torch is installed and a GPU is there if the sweep asks for one: each
    refusal one line, before anything is compiled or started."""
    require_torch()
    program = find_torchrun(torchrun)
    _check_cuda(sweep)
    return program


def _check_bundle(sweep: Sweep, bundle: str | Path | None) -> Bundle | None:
    """The bundle topocc's group will load, refused here (not in every rank) when it is for another world."""
    if "topocc" not in sweep.backends:
        return None
    if bundle is None:
        raise UsageError("the topocc backend needs a plan bundle", fix="pass --bundle FOLDER or --topology FILE")
    loaded = load_bundle(bundle)
    if loaded.world != sweep.ranks:
        raise UsageError(f"the bundle is for {loaded.world} ranks but --ranks is {sweep.ranks}", where=str(bundle),
                         fix=f"pass --ranks {loaded.world}, or a bundle compiled for {sweep.ranks} ranks")
    return loaded


def planned_at_every_size(bundle: str | Path, folder: str | Path) -> Path:
    """A copy of ``bundle`` in ``folder`` whose plans run at every size (``native_below`` 0): what the plans
    themselves cost, below the size from which the compiler predicts them faster than the native backend."""
    loaded = load_bundle(bundle)
    plans = tuple(dataclasses.replace(e, source=e.plan, native_below=0) for e in loaded.plans)
    save_bundle(dataclasses.replace(loaded, plans=plans), folder)
    return Path(folder)


def _environment(bundle: str | Path | None) -> dict[str, str]:
    """The ranks' environment: this one, the package importable, ``TOPOCC_PLAN`` the bundle; torchrun's own
    default of one OpenMP thread per rank, and gloo on loopback (every rank is on this machine), unless set."""
    env = worker_env()
    if bundle is not None:
        env[PLAN_ENV] = str(Path(bundle).resolve())
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _passed_on(line: str) -> None:
    """A rank's ``TOPOCC_DEBUG=INFO`` line (which plan ran a call, or why gloo did), on this stderr as it comes."""
    if line.startswith("topocc INFO "):
        sys.stderr.write(line)
        sys.stderr.flush()


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    """The job's failure in one line: the first ``topocc: error:`` line of a rank, else torchrun's last line."""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    ours = next((line for line in lines if line.startswith("topocc: error: ")), None)
    if ours is not None:
        return ours.removeprefix("topocc: error: ")
    last = lines[-1] if lines else "no output"
    return f"the torchrun job failed (exit {done.returncode}): {last}"


def _rows(stdout: str) -> tuple[list[Row], dict[str, Any] | None]:
    rows = []
    counters = None
    for line in stdout.splitlines():
        if line.startswith(ROW):
            raw = json.loads(line[len(ROW):])
            rows.append(Row(raw["backend"], raw["size_bytes"], raw["count"], raw["time_s"], raw["wrong"],
                            raw.get("planned"), raw.get("native")))
        elif line.startswith(COUNTERS):
            counters = json.loads(line[len(COUNTERS):])
    return rows, counters


def run_torchbench(sweep: Sweep, *, bundle: str | Path | None = None, bundle_note: str | None = None,
                   force_plans: bool = False, torchrun: str | None = None,
                   progress: Callable[[Row], None] | None = None) -> TorchbenchResult:
    """Run ``sweep`` on ``sweep.ranks`` ranks under ``torchrun --standalone``; topocc's group loads ``bundle``
    (``bundle_note`` describes it for the reader; default: its path).

    ``force_plans`` runs the plans at every size: below their native thresholds (a copy of the bundle), and
    without the measured trials against gloo (``TOPOCC_TUNE=off``).  Each size of each backend may take
    ``sweep.timeout_s`` (and the job :data:`STARTUP_S` to start) before the whole job is killed; ``progress``
    gets each row as it is measured.  Refusals (no torch, no torchrun, no GPU for NCCL, a bundle for another
    world) come before anything starts.
    """
    program = preflight(sweep, torchrun)
    _check_bundle(sweep, bundle)
    cmd = [program, "--standalone", f"--nproc-per-node={sweep.ranks}", "-m", WORKER, json.dumps(sweep.to_json())]
    limit = STARTUP_S + sweep.timeout_s * len(sweep.sizes) * len(sweep.backends)

    def on_line(line: str) -> None:
        if progress is not None and line.startswith(ROW):
            progress(_rows(line)[0][0])

    with tempfile.TemporaryDirectory(prefix="topocc-torchbench-") as tmp:
        env = _environment(bundle)
        if force_plans and bundle is not None:
            env[PLAN_ENV] = str(planned_at_every_size(bundle, Path(tmp) / "every-size").resolve())
            env[TUNE_ENV] = "off"
        start = time.monotonic()
        done = run_job(cmd, env, limit, on_line=on_line, on_error_line=_passed_on,
                       killed=f"topocc: error: the job ran past its limit of {limit:g} s and was killed\n")
        elapsed = time.monotonic() - start
    rows, counters = _rows(done.stdout)
    if done.returncode != 0:
        raise CommunicatorError(_failure(done))
    if len(rows) != len(sweep.sizes) * len(sweep.backends):
        raise CommunicatorError(f"the torchrun job ended with {len(rows)} of "
                                f"{len(sweep.sizes) * len(sweep.backends)} rows", fix="rerun it; if it recurs, "
                                "it is a bug of topocc torchbench")
    note = bundle_note if bundle_note is not None else (str(bundle) if bundle is not None else None)
    return TorchbenchResult(sweep, tuple(rows), counters, note, force_plans and bundle is not None, tuple(cmd),
                            elapsed)
