"""A torchrun worker for ``benchmarks/fault_trials.py``: one rank SIGKILLs itself inside a planned collective.

``fault_job.py kill OUT VICTIM DELAY_S``: every rank loops planned ``all_reduce`` calls over
``init_process_group("topocc")``; rank VICTIM, DELAY_S seconds in, waits until its main thread is inside
a call and SIGKILLs itself (writing ``OUT/killed`` first: the wall-clock time).  Each survivor writes
``OUT/rank<R>.json`` when its call fails: when, and the error's text; then exits with status 5.

``fault_job.py train OUT VICTIM STEP STEPS``: DDP training that checkpoints every 4 steps (rank 0, an
atomic rename) and resumes from the checkpoint when torchrun restarts it; on torchrun's first attempt rank
VICTIM SIGKILLs itself during step STEP's backward pass (VICTIM -1: never).  Rank 0 appends
``step loss`` lines to ``OUT/losses.<attempt>`` and, at the end, the counters to ``OUT/counters.<attempt>``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import topocc.runtime.distributed as td

#: Steps between checkpoints of the training job (a restart recomputes up to this many steps).
CHECKPOINT_EVERY = 4
#: Elements per all_reduce of the kill loop (1 MiB of float32: most of a rank's time is inside the call).
KILL_ELEMENTS = 1 << 18


def _suicide_when(inside: threading.Event, out: Path) -> None:
    """Wait until the main thread is inside a collective, note the time, and SIGKILL this process."""
    inside.wait()
    (out / "killed").write_text(f"{time.time():.6f}")
    os.kill(os.getpid(), signal.SIGKILL)


def kill_loop(out: Path, victim: int, delay_s: float) -> None:
    rank = dist.get_rank()
    inside = threading.Event()
    if rank == victim:
        timer = threading.Timer(delay_s, _suicide_when, args=(inside, out))
        timer.daemon = True
        timer.start()
    x = torch.ones(KILL_ELEMENTS)
    calls = 0
    try:
        while True:
            inside.set()
            dist.all_reduce(x)
            inside.clear()
            x.fill_(1.0)
            calls += 1
    except Exception as exc:
        text = str(exc)
        (out / f"rank{rank}.json").write_text(json.dumps({"time": time.time(), "error": text, "calls": calls}))
        print(f"rank {rank}: {text}", file=sys.stderr, flush=True)
        raise SystemExit(5) from None


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s data on ``rank``: the same on every attempt, so a resumed run sees what it would have."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def train(out: Path, victim: int, kill_step: int, steps: int) -> None:
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = out / "checkpoint.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    ddp = DDP(model, bucket_cap_mb=0.25)
    for step in range(start, steps):
        x, y = _batch(step, rank)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        if attempt == 0 and rank == victim and step == kill_step:
            # SIGKILL a few milliseconds into the backward pass, while DDP's bucket all_reduces run
            threading.Timer(0.002, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        loss.backward()
        opt.step()
        if rank == 0:
            with open(out / f"losses.{attempt}", "a") as f:
                f.write(f"{step} {loss.item():.9e}\n")
        if (step + 1) % CHECKPOINT_EVERY == 0:
            if rank == 0:
                tmp = out / "checkpoint.tmp"
                torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
                os.replace(tmp, ckpt)
            dist.barrier()  # no rank runs past a checkpoint before it is written
    if rank == 0:
        (out / f"counters.{attempt}").write_text(json.dumps(td.counters().as_dict()))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("topocc")
    torch.set_num_threads(1)
    if mode == "kill":
        kill_loop(out, int(sys.argv[3]), float(sys.argv[4]))
    else:
        train(out, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
