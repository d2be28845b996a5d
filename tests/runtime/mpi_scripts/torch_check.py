"""One rank of a gloo replay check: every collective, dtype and op against a torch reference.

Started by tests/runtime/test_gloo.py as ``python torch_check.py RANK WORLD INIT_METHOD MODE``
(one process per rank).  Modes: ``check`` (every collective), ``hang`` (rank 1 never calls: rank 0
must time out naming it), ``die`` (rank 1 exits mid-run).
Rank 0 prints one ``RESULT {json}`` line; failures print ``topocc: ...`` lines (the communicator's).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from topocc.planner.analysis.verify import verify
from topocc.runtime.communicator import Communicator
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.harness.baselines import native
from topocc.runtime.harness.worker import call, make_input
from topocc.runtime.transports.gloo import GlooTransport

_spec = importlib.util.spec_from_file_location("runtime_test_schedules", Path(__file__).with_name("schedules.py"))
S = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(S)  # type: ignore[union-attr]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8}
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add, "avg": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}


def inputs_for(collective: str, n: int, count: int, dtype: str, op: str, device: torch.device) -> list[torch.Tensor]:
    """Every rank's input (small integers: exact in every dtype and any reduction order)."""
    base = np.dtype("float32") if dtype == "bfloat16" else np.dtype(dtype)
    return [torch.from_numpy(make_input(collective, n, r, count, base, 7, "exact", op)).to(device, DTYPES[dtype])
            for r in range(n)]


def reference(collective: str, xs: list[torch.Tensor], rank: int, root: int, op: str) -> torch.Tensor | None:
    """What ``rank`` must hold, computed with torch ops."""
    n = len(xs)
    if collective == "broadcast":
        return xs[root]
    if collective == "allgather":
        return torch.cat(xs)
    if collective == "alltoall":
        return torch.cat([x.chunk(n)[rank] for x in xs])
    total = functools.reduce(OPS[op], xs)
    if op == "avg":
        total = total / n
    if collective == "reduce":
        return total if rank == root else None
    if collective == "reducescatter":
        return total.chunk(n)[rank]
    return total


def check(rank: int, n: int, dtypes: list[str], counts: list[int]) -> dict[str, Any]:
    device = torch.device("cpu")
    cases, wrong, native_checked = 0, [], 0
    for name, schedule in S.every_collective(n).items():
        verify(schedule)
        comm = Communicator(schedule, transport=GlooTransport(timeout=20.0), timeout=20.0)
        c, root = schedule.collective, schedule.root or 0
        reducing = c in ("allreduce", "reduce", "reducescatter")
        for dtype in dtypes:
            for op in (OPS if reducing else ["sum"]):
                if op == "avg" and not DTYPES[dtype].is_floating_point:
                    continue
                for count in counts:
                    xs = inputs_for(c, n, count, dtype, op, device)
                    want = reference(c, xs, rank, root, op)
                    for _ in range(2):  # a second call reuses the binding and persistent requests
                        got = call(comm, c, xs[rank].clone(), op)
                        ok = want is None or (got.dtype == want.dtype and torch.equal(got, want))
                        cases += 1
                        if not ok:
                            wrong.append(f"{name} {dtype} {op} {count}")
                    if c in ("allreduce", "broadcast") and op in ("sum", "max"):
                        mine = xs[rank].clone()  # torch's own collective agrees with ours
                        native(comm.transport, c, mine, mine, op, root)
                        native_checked += 1
                        assert want is not None  # an all-reduce's and a broadcast's result is specified
                        if not torch.equal(mine, want):
                            wrong.append(f"{name} {dtype} {op} {count}: gloo's own result differs")
        comm.close()
    return {"cases": cases, "wrong": wrong[:10], "native_checked": native_checked}


def main() -> int:
    rank, world, init, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    if mode == "check":
        dtypes = sys.argv[5].split(",")
        counts = [int(x) for x in sys.argv[6].split(",")]
        result = check(rank, world, dtypes, counts)
        t = torch.tensor([len(result["wrong"])], dtype=torch.int64)
        dist.all_reduce(t)
        result["wrong_total"] = int(t.item())
        if rank == 0:
            print("RESULT " + json.dumps(result), flush=True)
        dist.destroy_process_group()
        return 0
    # failure modes: a 2-rank ring allreduce where rank 1 hangs or dies before its second call
    comm = Communicator(S.ring_allreduce(world), transport=GlooTransport(timeout=2.0), timeout=2.0)
    x = torch.ones(1 << 16)
    comm.allreduce(x)
    if rank == 1:
        if mode == "die":
            os._exit(9)
        time.sleep(8)
        os._exit(0)
    start = time.monotonic()
    with contextlib.suppress(CommunicatorError):  # the exit guard prints its one line, leaves with code 5
        comm.allreduce(x)
    print(f"RESULT {json.dumps({'elapsed': time.monotonic() - start})}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
