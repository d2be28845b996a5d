"""A torchrun worker: the same training job over ``init_process_group("topocc")`` and over gloo, step by step.

``training_job.py ddp|fsdp STEPS [cpu|cuda]``: DDP without a hook (several gradient buckets), or FSDP2's
``fully_shard`` on a small transformer; each trains twice from the same weights on the same
per-rank data, once on the world's topocc group and once on a native group of the same ranks (gloo on
CPU; on CUDA, NCCL with every rank on the one GPU, each its own ``NCCL_HOSTID``).
Rank 0 prints ``RESULT {json}``: both loss curves, the largest parameter difference at the end, and
the topocc group's counters (which show the plans carried the gradient collectives).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

import topocc.runtime.distributed as td

DEVICE = torch.device(sys.argv[3] if len(sys.argv) > 3 else "cpu")


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    return [(torch.randn(8, 12, 16, generator=g).to(DEVICE), torch.randn(8, 12, 16, generator=g).to(DEVICE))
            for _ in range(steps)]


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 200), nn.Tanh(), nn.Linear(200, 300), nn.Tanh(), nn.Linear(300, 16))


def transformer() -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True) for _ in range(3)]
    return nn.Sequential(*layers, nn.Linear(16, 16))


def train(model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in data:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def ddp(group: Any, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    model = DDP(mlp().to(DEVICE), process_group=group, bucket_cap_mb=0.1)
    losses = train(model, batches(steps))
    return losses, [p.detach().clone() for p in model.parameters()]


def fsdp(group: Any, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    mesh = DeviceMesh.from_group(group, DEVICE.type)
    model = transformer().to(DEVICE)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = train(model, batches(steps))
    return losses, [gathered(p) for p in model.parameters()]


def gathered(param: torch.Tensor) -> torch.Tensor:
    """A parameter ``fully_shard`` sharded (a DTensor), whole and on the CPU."""
    assert isinstance(param, DTensor)
    return param.full_tensor().detach().cpu()


def main() -> None:
    mode, steps = sys.argv[1], int(sys.argv[2])
    if DEVICE.type == "cuda":  # every rank on the one GPU: NCCL must see each as a host of its own
        os.environ["NCCL_HOSTID"] = f"host{os.environ['RANK']}"
        torch.cuda.set_device(0)
    dist.init_process_group("topocc")
    torch.set_num_threads(1)
    native = dist.new_group(backend="gloo" if DEVICE.type == "cpu" else "nccl")
    job = ddp if mode == "ddp" else fsdp
    mine, mine_params = job(dist.group.WORLD, steps)
    theirs, their_params = job(native, steps)
    diff = max(float((a.cpu() - b.cpu()).abs().max()) for a, b in zip(mine_params, their_params))
    stats = td.counters()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"topocc": mine, "native": theirs, "param_diff": diff,
                                      "counters": stats.as_dict(), "table": str(stats)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
