"""A torchrun worker: every planned collective through ``init_process_group("topocc")`` against gloo's own.

Run as ``torchrun --standalone --nproc_per_node N collectives_job.py DTYPES COUNTS [BACKEND]`` with
``TOPOCC_PLAN`` naming a bundle for N ranks (BACKEND: ``topocc``, or ``cpu:topocc,cuda:topocc``).
Inputs are small integers (exact in every dtype), so sums, products, minima and maxima must equal
gloo's bit for bit; averages are compared with gloo's sum divided by N.  Rank 0 prints one
``RESULT {json}`` line: cases run, the ones that differ, and the process group's counters.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

import topocc.runtime.distributed as td

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int32": torch.int32}
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
       "avg": dist.ReduceOp.AVG}


def data(n: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + dist.get_rank())
    return torch.randint(-3, 4, (n,), generator=g).to(dtype)


def reduce_cases(w: int, gloo: Any) -> dict[str, Callable[[Any, torch.dtype, Any, int], list[torch.Tensor]]]:
    """Collectives with an op: (group, dtype, op, elements) -> outputs."""
    r = dist.get_rank()

    def all_reduce(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        x = data(n, dt, 1)
        dist.all_reduce(x, op=op, group=pg)
        return [x]

    def all_reduce_async(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        x = data(n, dt, 2)
        return [dist.all_reduce(x, op=op, group=pg, async_op=True).get_future().wait()[0]]

    def reduce_scatter_tensor(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        out = torch.empty(n, dtype=dt)
        dist.reduce_scatter_tensor(out, data(n * w, dt, 3), op=op, group=pg)
        return [out]

    def reduce_scatter_in_place(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        x = data(n * w, dt, 4)
        mine = x[r * n:(r + 1) * n]
        dist.reduce_scatter_tensor(mine, x, op=op, group=pg)
        return [mine.clone()]

    def reduce_scatter_list(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        out = torch.empty(n, dtype=dt)
        dist.reduce_scatter(out, list(data(n * w, dt, 5).chunk(w)), op=op, group=pg)
        return [out]

    def reduce(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        x = data(n, dt, 6)
        dist.reduce(x, dst=0, op=op, group=pg)
        return [x] if r == 0 else []

    def all_reduce_coalesced(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        xs = [data(n, dt, 7), data(n + 3, dt, 8)]
        with _coalescing_manager(group=pg, async_ops=True) as cm:
            for x in xs:
                dist.all_reduce(x, op=op, group=pg)
        cm.wait()
        return xs

    def reduce_scatter_coalesced(pg: Any, dt: torch.dtype, op: Any, n: int) -> list[torch.Tensor]:
        outs = [torch.empty(n, dtype=dt), torch.empty(n + 1, dtype=dt)]
        ins = [data(n * w, dt, 9), data((n + 1) * w, dt, 10)]
        with _coalescing_manager(group=pg, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, op=op, group=pg)
        cm.wait()
        return outs

    return {f.__name__: f for f in (all_reduce, all_reduce_async, reduce_scatter_tensor, reduce_scatter_in_place,
                                     reduce_scatter_list, reduce, all_reduce_coalesced, reduce_scatter_coalesced)}


def move_cases(w: int) -> dict[str, Callable[[Any, torch.dtype, int], list[torch.Tensor]]]:
    """Collectives without an op: (group, dtype, elements) -> outputs."""
    r = dist.get_rank()

    def all_gather_into_tensor(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:
        out = torch.empty(n * w, dtype=dt)
        dist.all_gather_into_tensor(out, data(n, dt, 11), group=pg)
        return [out]

    def all_gather_in_place(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:
        out = torch.zeros(n * w, dtype=dt)
        out[r * n:(r + 1) * n] = data(n, dt, 12)
        dist.all_gather_into_tensor(out, out[r * n:(r + 1) * n], group=pg)
        return [out]

    def all_gather_list(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:
        outs = [torch.empty(n, dtype=dt) for _ in range(w)]
        dist.all_gather(outs, data(n, dt, 13), group=pg)
        return outs

    def all_gather_async(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:
        out = torch.empty(n * w, dtype=dt)
        dist.all_gather_into_tensor(out, data(n, dt, 14), group=pg, async_op=True).wait()
        return [out]

    def all_gather_coalesced(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:
        outs = [torch.empty(n * w, dtype=dt), torch.empty((n + 2) * w, dtype=dt)]
        with _coalescing_manager(group=pg, async_ops=True) as cm:
            dist.all_gather_into_tensor(outs[0], data(n, dt, 15), group=pg)
            dist.all_gather_into_tensor(outs[1], data(n + 2, dt, 16), group=pg)
        cm.wait()
        return outs

    def broadcast_root0(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:
        x = data(n, dt, 17)
        dist.broadcast(x, src=0, group=pg)
        return [x]

    def broadcast_root1(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:  # no plan: goes to gloo
        x = data(n, dt, 18)
        dist.broadcast(x, src=1, group=pg)
        return [x]

    def all_to_all_single(pg: Any, dt: torch.dtype, n: int) -> list[torch.Tensor]:
        out = torch.empty(n * w, dtype=dt)
        dist.all_to_all_single(out, data(n * w, dt, 19), group=pg)
        return [out]

    return {f.__name__: f for f in (all_gather_into_tensor, all_gather_in_place, all_gather_list, all_gather_async,
                                     all_gather_coalesced, broadcast_root0, broadcast_root1, all_to_all_single)}


def main() -> None:
    dtypes, counts = sys.argv[1].split(","), [int(c) for c in sys.argv[2].split(",")]
    dist.init_process_group(sys.argv[3] if len(sys.argv) > 3 else "topocc")  # or the device-mapped form
    torch.set_num_threads(1)
    w = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    topocc = dist.group.WORLD
    cases, wrong = 0, []
    for dname in dtypes:
        dt = DTYPES[dname]
        for n in counts:
            for name, f in reduce_cases(w, gloo).items():
                for oname, op in OPS.items():
                    if oname == "avg" and not dt.is_floating_point:
                        continue
                    mine = f(topocc, dt, op, n)
                    ref = f(gloo, dt, dist.ReduceOp.SUM if oname == "avg" else op, n)
                    if oname == "avg":
                        ref = [(x.double() / w).to(dt) for x in ref]
                    cases += 1
                    if len(mine) != len(ref) or not all(torch.equal(a, b) for a, b in zip(mine, ref)):
                        wrong.append(f"{name} {oname} {dname} n={n}")
            for name, g in move_cases(w).items():
                cases += 1
                if not all(torch.equal(a, b) for a, b in zip(g(topocc, dt, n), g(gloo, dt, n))):
                    wrong.append(f"{name} {dname} n={n}")
    found = {"cases": cases, "wrong": wrong, "counters": td.counters().as_dict()}
    if w >= 3:  # a subgroup with a plan in the bundle, and one without (its calls go to gloo)
        for key, ranks in (("subgroup", [0, 1]), ("subgroup_without_plan", [0, 2])):
            mine, ref = dist.new_group(ranks), dist.new_group(ranks, backend="gloo")
            if dist.get_rank() in ranks:
                x, y = data(1001, torch.float32, 20), data(1001, torch.float32, 20)
                dist.all_reduce(x, group=mine)
                dist.all_reduce(y, group=ref)
                if not torch.equal(x, y):
                    wrong.append(f"all_reduce on {key}")
                found[key] = td.counters(mine).as_dict()["allreduce"]
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(found), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
