"""The program every rank of ``topocc torchbench`` runs under ``torchrun``: times one collective through
``torch.distributed`` on each backend asked, and checks its result.

``torchrun ... -m topocc.runtime.harness.torchbench.timer SWEEP_JSON`` (a :class:`~.sweep.Sweep`).  The world's
process group is ``topocc`` when it is asked (its subgroups need it to be), else gloo; every other backend
gets a group of all ranks, and a private gloo group carries the barriers, the slowest rank's time and the
wrong elements' count, so that no call but the measured ones reaches a measured group (nor topocc's
counters).  Per size, the backends take turns: ``warmup`` calls, ``iters`` timed ones between a barrier and
the end of the last, then one call on data whose exact result every rank computes (small integers, so any
order of reduction gives it bit for bit).  Rank 0 prints a :data:`ROW` line per size and backend as it is
measured, and :data:`COUNTERS` at the end; a failure prints one ``topocc: error: ...`` line on stderr and
exits non-zero (torchrun then stops the other ranks).  Imports torch and the runtime, never the planner.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, MutableMapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import topocc.runtime.distributed as topocc_dist
from topocc.runtime.collective import collective
from topocc.runtime.errors import TopoccError
from topocc.runtime.harness.torchbench.sweep import Sweep

__all__ = ["COUNTERS", "ROW", "expected", "main", "pattern"]

#: Rank 0's line per measured row: this, then a JSON object.
ROW = "torchbench-row "
#: Rank 0's last line: this, then topocc's counters for the collective (JSON; null without topocc).
COUNTERS = "torchbench-counters "

_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def pattern(rank: int, n: int, dtype: torch.dtype, op: str, start: int = 0) -> torch.Tensor:
    """Elements ``start`` to ``start + n`` of rank ``rank``'s check input: small integers (0..4; 1 or 2 for a
    product), so that a sum over up to 64 ranks and any product of them stay exact in every datatype,
    bfloat16's 8 bits included."""
    i = torch.arange(start, start + n, dtype=torch.int64)
    values = 1 + (i + rank) % 2 if op == "prod" else (i + 3 * rank) % 5
    return values.to(dtype)


_COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}


def _reduced(n: int, ranks: int, dtype: torch.dtype, op: str, start: int = 0) -> torch.Tensor:
    """Elements ``start`` to ``start + n`` of the reduction of every rank's :func:`pattern`, computed wide
    (exactly: float32 holds every sum and product of the patterns that bfloat16 and float16 do), in ``dtype``."""
    wide = torch.int64 if not dtype.is_floating_point else torch.float64 if dtype == torch.float64 else torch.float32
    acc = pattern(0, n, wide, op, start)
    for r in range(1, ranks):
        acc = _COMBINE[op](acc, pattern(r, n, wide, op, start))
    return acc.to(dtype)


def expected(sweep: Sweep, count: int, rank: int) -> torch.Tensor | None:
    """What rank ``rank`` holds after the checked call with rank blocks of ``count`` elements (None: nothing
    is defined, a reduce's off the root), read off the collective's description: its input block for
    ``rank`` (the whole input where the input is not split), reduced over every rank where it reduces, else
    from the root, else from each rank in turn."""
    desc = collective(sweep.collective)
    n, root, dtype, op = sweep.ranks, sweep.root, getattr(torch, sweep.dtype), sweep.op
    start = rank * count if desc.input_split else 0
    if desc.to_root and rank != root:
        return None
    if desc.reduces:
        return _reduced(count, n, dtype, op, start)
    if desc.from_root:
        return pattern(root, count, dtype, op, start)
    return torch.cat([pattern(source, count, dtype, op, start) for source in range(n)])


def _torch_call(name: str, inp: torch.Tensor, out: torch.Tensor, op: Any, root: int, group: Any
                ) -> Callable[[], Any]:
    """The torch call that runs collective ``name`` from ``inp`` into ``out`` (one tensor for those torch runs
    in place).  Every group spans all ranks in order, so the root is a global rank as torch wants it."""
    calls: dict[str, Callable[[], Any]] = {
        "allreduce": lambda: dist.all_reduce(out, op=op, group=group),
        "broadcast": lambda: dist.broadcast(out, src=root, group=group),
        "reduce": lambda: dist.reduce(out, dst=root, op=op, group=group),
        "allgather": lambda: dist.all_gather_into_tensor(out, inp, group=group),
        "reducescatter": lambda: dist.reduce_scatter_tensor(out, inp, op=op, group=group),
        "alltoall": lambda: dist.all_to_all_single(out, inp, group=group),
    }
    return calls[name]


def _call(sweep: Sweep, group: Any, count: int, fill: Callable[[int], torch.Tensor], device: torch.device
          ) -> tuple[Callable[[], Any], torch.Tensor]:
    """The collective as a call on rank blocks of ``count`` elements (the input from ``fill(elements)``), and
    the tensor that holds its result: in place where no buffer is split (all_reduce, broadcast, reduce)."""
    desc = collective(sweep.collective)
    inputs, outputs = desc.sizes(sweep.ranks, count)
    inp = fill(inputs).to(device)
    out = torch.empty(outputs, dtype=inp.dtype, device=device) if desc.split else inp
    return _torch_call(desc.name, inp, out, _OPS[sweep.op], sweep.root, group), out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(control: Any, seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control)
    return float(t.item())


def _total(control: Any, value: int) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=control)
    return int(t.item())


def _measure(sweep: Sweep, group: Any, control: Any, count: int, device: torch.device) -> tuple[float, int]:
    """The slowest rank's mean time per call, and the wrong elements over all ranks, at ``count`` elements."""
    rank = dist.get_rank()
    dtype = getattr(torch, sweep.dtype)
    run, _ = _call(sweep, group, count, lambda k: torch.zeros(k, dtype=dtype), device)  # zeros stay zeros: no overflow
    for _ in range(sweep.warmup):
        run()
    _sync(device)
    dist.barrier(group=control)
    start = time.perf_counter()
    for _ in range(sweep.iters):
        run()
    _sync(device)
    seconds = _slowest(control, (time.perf_counter() - start) / sweep.iters)
    check, result = _call(sweep, group, count, lambda k: pattern(rank, k, dtype, sweep.op), device)
    check()
    _sync(device)
    want = expected(sweep, count, rank)
    wrong = 0 if want is None else int((result.cpu() != want).sum().item())
    return seconds, _total(control, wrong)


def cuda_device(env: MutableMapping[str, str], gpus: int) -> int:
    """This rank's GPU: its local rank's, or, where a host runs more ranks than it has GPUs (a test of the NCCL
    path on one GPU), the local rank's modulo the GPUs, each rank then named a host of its own in
    ``NCCL_HOSTID`` (NCCL refuses two ranks of one communicator on one GPU of one host)."""
    local = int(env.get("LOCAL_RANK", "0"))
    if int(env.get("LOCAL_WORLD_SIZE", "1")) > gpus:
        env["NCCL_HOSTID"] = f"torchbench-host{env.get('RANK', local)}"
    return local % gpus


def _groups(sweep: Sweep) -> tuple[Any, dict[str, Any]]:
    """The control group (gloo) and a group of all ranks per backend; the world is topocc's when it is asked."""
    timeout = timedelta(seconds=sweep.timeout_s)
    if "nccl" in sweep.backends or sweep.device == "cuda":
        torch.cuda.set_device(cuda_device(os.environ, torch.cuda.device_count()))
    world = "topocc" if "topocc" in sweep.backends else "gloo"
    dist.init_process_group(world, timeout=timeout)
    control = dist.group.WORLD if world == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    groups = {}
    for backend in sweep.backends:
        groups[backend] = (dist.group.WORLD if backend == world else control if backend == "gloo"
                           else dist.new_group(backend=backend, timeout=timeout))
    return control, groups


def _tally(group: Any, collective: str) -> tuple[int, int]:
    stats = topocc_dist.counters(group)
    return stats.planned(collective), stats.delegated(collective)


def _emit(prefix: str, doc: Any) -> None:
    if dist.get_rank() == 0:
        print(prefix + json.dumps(doc), flush=True)


def run(sweep: Sweep) -> None:
    """Measure every size on every backend (rank 0 prints the rows), then topocc's counters."""
    control, groups = _groups(sweep)
    for size, count in zip(sweep.sizes, sweep.counts):
        for backend, group in groups.items():
            device = torch.device("cuda" if backend == "nccl" else sweep.device)
            before = _tally(group, sweep.collective) if backend == "topocc" else None
            seconds, wrong = _measure(sweep, group, control, count, device)
            after = _tally(group, sweep.collective) if backend == "topocc" else None
            row: dict[str, Any] = {"backend": backend, "size_bytes": size, "count": count, "time_s": seconds,
                                   "wrong": wrong}
            if before is not None and after is not None:
                row |= {"planned": after[0] - before[0], "native": after[1] - before[1]}
            _emit(ROW, row)
    counters = topocc_dist.counters(groups["topocc"]).as_dict() if "topocc" in groups else None
    _emit(COUNTERS, counters)
    dist.barrier(group=control)
    dist.destroy_process_group()


def _one_line(exc: BaseException) -> str:
    """``exc`` as one line: a topocc error's own, else its type and the first line of its message."""
    if isinstance(exc, TopoccError):
        return exc.one_line()
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep given as one JSON argument; a failure is one ``topocc: error: rank R: ...`` line."""
    args = list(sys.argv[1:] if argv is None else argv)
    rank = os.environ.get("RANK", "?")
    try:
        run(Sweep.from_json(json.loads(args[0])))
    except Exception as exc:  # every failure of a rank: one line, then torchrun stops the others
        sys.stderr.write(f"topocc: error: rank {rank}: {_one_line(exc)}\n")
        sys.stderr.flush()
        return exc.exit_code if isinstance(exc, TopoccError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
