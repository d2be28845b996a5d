"""A torchrun worker: DDP over ``init_process_group("topocc")`` with a compressed bundle and error feedback.

``feedback_job.py STEPS [step-ahead]``: each rank fits its own data with a small MLP (SGD), once over the world's
topocc group (the bundle's top-k all-reduce, with ``TOPOCC_ERROR_FEEDBACK`` as the test sets it; with
``step-ahead`` the optimizer is hooked through ``topocc.runtime.distributed.step_ahead``) and once over a
native gloo group (exact).  Then an int32 and a MAX all-reduce (which go exact) and a float sum outside
backward (not a gradient: exact, with no residual).  Rank 0 prints ``RESULT {json}``: both final losses, whether the
ranks' parameters are equal, the residuals kept and the counters.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import topocc.runtime.distributed as td


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    w = torch.randn(40, 5, generator=g)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    x = torch.randn(64, 40, generator=g)
    return x, x @ w + 0.01 * torch.randn(64, 5, generator=g)


def train(group: dist.ProcessGroup, steps: int, ahead: bool) -> tuple[float, str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 64), nn.Tanh(), nn.Linear(64, 5))
    ddp = DDP(model, process_group=group, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    hooked = td.step_ahead(opt, group) if ahead else None
    x, y = data()
    for _ in range(steps):
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if hooked is not None:
        assert hooked.shifted > 0  # the parameters did sit ahead between steps
        hooked.remove()
    with torch.no_grad():
        final = nn.functional.mse_loss(model(x), y).item()
    return final, hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()


def main() -> None:
    steps, ahead = int(sys.argv[1]), "step-ahead" in sys.argv[2:]
    dist.init_process_group("topocc")
    torch.set_num_threads(1)
    native = dist.new_group(backend="gloo")
    assert dist.group.WORLD is not None
    mine, mine_digest = train(dist.group.WORLD, steps, ahead)
    theirs, _ = train(native, steps, False)
    world = dist.group.WORLD
    assert isinstance(world, td.TopoccProcessGroup)
    kept = len(world.feedback.residuals) if world.feedback is not None else 0
    ints = torch.arange(2949, dtype=torch.int32)
    dist.all_reduce(ints)
    biggest = torch.full((2949,), float(dist.get_rank()))
    dist.all_reduce(biggest, op=dist.ReduceOp.MAX)
    metric = torch.ones(2949)
    dist.all_reduce(metric)  # outside backward: not a gradient, so exact, and with no residual
    after = len(world.feedback.residuals) if world.feedback is not None else 0
    digests: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, mine_digest, group=native)
    stats = td.counters()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({
            "topocc": mine, "native": theirs, "same_params": len(set(digests)) == 1, "residuals": kept,
            "residuals_after": after,
            "exact_results": bool(torch.equal(ints, torch.arange(2949, dtype=torch.int32) * 2)
                                  and float(biggest.min()) == 1.0
                                  and torch.equal(metric, torch.full((2949,), float(dist.get_world_size())))),
            "counters": stats.as_dict(), "table": str(stats)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
