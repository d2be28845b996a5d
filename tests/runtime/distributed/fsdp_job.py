"""A torchrun worker: FSDP2 (``fully_shard``) over ``init_process_group("topocc")`` with a compressed bundle.

``fsdp_job.py STEPS``: each rank fits its own data with a small MLP, every layer sharded (SGD), once over the
world's topocc group (the bundle's compressed reduce-scatter for the gradients, its all-gather for the
parameters) and once over a native gloo group (exact).  Then a float reduce-scatter outside backward (not a
gradient: exact).  Rank 0 prints ``RESULT {json}``: both runs' losses (the mean over ranks) at the first and
the last step, whether the reduce-scatter outside backward was exact, and the counters.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import topocc.runtime.distributed as td
from tests.runtime.distributed.feedback_job import data  # the same regression data per rank


def train(group: dist.ProcessGroup, native: dist.ProcessGroup, steps: int) -> list[float]:
    """The loss, averaged over the ranks (exactly, over ``native``), before each of ``steps`` SGD steps and after
    the last."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5))
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = data()
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        losses.append(loss.detach().clone())
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        losses.append(nn.functional.mse_loss(model(x), y))
    mean = torch.stack(losses)
    dist.all_reduce(mean, group=native)
    return (mean / dist.get_world_size()).tolist()


def main() -> None:
    steps = int(sys.argv[1])
    dist.init_process_group("topocc")
    torch.set_num_threads(1)
    native = dist.new_group(backend="gloo")
    world = dist.group.WORLD
    assert world is not None
    mine = train(world, native, steps)
    theirs = train(native, native, steps)
    values = torch.arange(1000 * dist.get_world_size(), dtype=torch.float32) / 7 + dist.get_rank()
    shard, expected = torch.empty(1000), torch.empty(1000)
    dist.reduce_scatter_tensor(shard, values)  # outside backward: not a gradient, so exact
    dist.reduce_scatter_tensor(expected, values, group=native)  # two ranks: one sum, bit for bit
    stats = td.counters()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"topocc": mine, "native": theirs, "exact_outside": torch.equal(shard, expected),
                                      "counters": stats.as_dict(), "table": str(stats)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
