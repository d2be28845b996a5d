"""A torchrun worker: every call form torch 2.13 dispatches to a process group, over topocc against gloo.

PyTorch's ``distributed_test`` (``test_conformance.py``) has no CPU case for some forms: the list and
uneven all-to-all, reduce-scatter in any form, the coalescing manager's tensor forms, the deprecated
``all_reduce_coalesced``, and the functional collectives (which reach the group through torch's C++
dispatcher, not its Python methods).  Each form runs on the world's topocc group and on a gloo group of
the same ranks with the same inputs; rank 0 prints ``RESULT {json}``: the forms run, those whose outputs
differ or that raised (with the error's first line), and the topocc group's counters.

``torchrun --standalone --nproc_per_node N forms_job.py`` with ``TOPOCC_PLAN`` naming a bundle for N ranks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.distributed_c10d import _coalescing_manager

import topocc.runtime.distributed as td

Form = Callable[[Any], list[torch.Tensor]]


def waited(t: Any) -> torch.Tensor:
    """A functional collective's result, waited for (an ``AsyncCollectiveTensor``, typed as a tensor)."""
    return t.wait()


def data(n: int, salt: int, rank: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + (dist.get_rank() if rank is None else rank))
    return torch.randint(-3, 4, (n,), generator=g).float()


def collective_forms(w: int) -> dict[str, Form]:
    """``dist.*`` calls, one per process-group method torch dispatches to from Python."""
    r = dist.get_rank()

    def all_to_all_list(pg: Any) -> list[torch.Tensor]:
        outs = [torch.empty(5) for _ in range(w)]
        dist.all_to_all(outs, list(data(5 * w, 1).chunk(w)), group=pg)
        return outs

    def all_to_all_single_uneven(pg: Any) -> list[torch.Tensor]:
        send = [i + 1 for i in range(w)]  # rank r sends i + 1 elements to rank i
        recv = [r + 1] * w
        out = torch.empty(sum(recv))
        dist.all_to_all_single(out, data(sum(send), 2), output_split_sizes=recv, input_split_sizes=send, group=pg)
        return [out]

    def reduce_scatter_list(pg: Any) -> list[torch.Tensor]:
        out = torch.empty(6)
        dist.reduce_scatter(out, list(data(6 * w, 3).chunk(w)), group=pg)
        return [out]

    def reduce_scatter_tensor(pg: Any) -> list[torch.Tensor]:
        out = torch.empty(7)
        dist.reduce_scatter_tensor(out, data(7 * w, 4), group=pg)
        return [out]

    def all_reduce_coalesced(pg: Any) -> list[torch.Tensor]:
        xs = [data(3, 5), data(9, 6)]
        dist.all_reduce_coalesced(xs, group=pg)
        return xs

    def all_gather_coalesced(pg: Any) -> list[torch.Tensor]:
        ins = [data(3, 7), data(5, 8)]
        outs = [[torch.empty_like(t) for t in ins] for _ in range(w)]
        dist.all_gather_coalesced(outs, ins, group=pg)
        return [t for row in outs for t in row]

    def all_gather_into_tensor_coalesced(pg: Any) -> list[torch.Tensor]:
        outs = [torch.empty(4 * w), torch.empty(6 * w)]
        with _coalescing_manager(group=pg, async_ops=True) as cm:
            dist.all_gather_into_tensor(outs[0], data(4, 9), group=pg)
            dist.all_gather_into_tensor(outs[1], data(6, 10), group=pg)
        cm.wait()
        return outs

    def reduce_scatter_tensor_coalesced(pg: Any) -> list[torch.Tensor]:
        outs = [torch.empty(4), torch.empty(6)]
        with _coalescing_manager(group=pg, async_ops=True) as cm:
            dist.reduce_scatter_tensor(outs[0], data(4 * w, 11), group=pg)
            dist.reduce_scatter_tensor(outs[1], data(6 * w, 12), group=pg)
        cm.wait()
        return outs

    def gather_scatter(pg: Any) -> list[torch.Tensor]:
        got = [torch.empty(3) for _ in range(w)] if r == 0 else None
        dist.gather(data(3, 13), got, dst=0, group=pg)
        out = torch.empty(3)
        dist.scatter(out, got if r == 0 else None, src=0, group=pg)
        return [out]

    def send_recv_any_source(pg: Any) -> list[torch.Tensor]:
        x = data(4, 14)
        if r == 0:
            got = []
            for _ in range(w - 1):
                y = torch.empty(4)
                src = dist.recv(y, group=pg)
                got.append((src, y))
            return [y for _, y in sorted(got, key=lambda p: p[0])]
        dist.send(x, dst=0, group=pg)
        return []

    def monitored_barrier(pg: Any) -> list[torch.Tensor]:
        pg.monitored_barrier()  # the group's method: dist.monitored_barrier refuses every backend but gloo by name
        return []

    return {f.__name__: f for f in (all_to_all_list, all_to_all_single_uneven, reduce_scatter_list,
                                     reduce_scatter_tensor, all_reduce_coalesced, all_gather_coalesced,
                                     all_gather_into_tensor_coalesced, reduce_scatter_tensor_coalesced,
                                     gather_scatter, send_recv_any_source, monitored_barrier)}


def functional_forms(w: int) -> dict[str, Form]:
    """The functional collectives (DTensor's, torch.compile's): they reach the group through C++."""

    def funcol_all_reduce(pg: Any) -> list[torch.Tensor]:
        return [waited(funcol.all_reduce(data(5, 20), "sum", pg))]

    def funcol_all_gather(pg: Any) -> list[torch.Tensor]:
        return [waited(funcol.all_gather_tensor(data(5, 21), 0, pg))]

    def funcol_reduce_scatter(pg: Any) -> list[torch.Tensor]:
        return [waited(funcol.reduce_scatter_tensor(data(5 * w, 22), "sum", 0, pg))]

    def funcol_all_to_all(pg: Any) -> list[torch.Tensor]:
        return [waited(funcol.all_to_all_single(data(3 * w, 23), None, None, pg))]

    def funcol_broadcast(pg: Any) -> list[torch.Tensor]:
        return [waited(funcol.broadcast(data(5, 24), 0, pg))]

    def funcol_all_reduce_coalesced(pg: Any) -> list[torch.Tensor]:
        return [waited(t) for t in funcol.all_reduce_coalesced([data(3, 25), data(4, 26)], "sum", pg)]

    return {f.__name__: f for f in (funcol_all_reduce, funcol_all_gather, funcol_reduce_scatter, funcol_all_to_all,
                                     funcol_broadcast, funcol_all_reduce_coalesced)}


def main() -> None:
    dist.init_process_group("topocc")
    torch.set_num_threads(1)
    w = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    topocc = dist.group.WORLD
    forms = {**collective_forms(w), **functional_forms(w)}
    wrong: list[str] = []
    for name, form in forms.items():
        ref = form(gloo)
        try:
            mine = form(topocc)
        except Exception as exc:  # a form the group cannot serve: named, with why
            wrong.append(f"{name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}")
            dist.barrier(group=gloo)  # realign the ranks before the next form
            continue
        if len(mine) != len(ref) or not all(torch.equal(a, b) for a, b in zip(mine, ref)):
            wrong.append(f"{name}: outputs differ from gloo's")
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"forms": sorted(forms), "wrong": wrong,
                                      "counters": td.counters().as_dict()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
