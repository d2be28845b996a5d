"""DASO converges, averages globally every B steps after warm-up, and leaves every rank equal (under mpiexec)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.runtime.training.launch import launch, plan_for

torch = pytest.importorskip("torch")

DASO_WORKER = r'''
import json, sys
import torch
from torch import nn
from mpi4py import MPI
from topocc.runtime.training import DASO

plan4, plan2, steps, skip, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
world = MPI.COMM_WORLD
rank = world.Get_rank()
torch.set_num_threads(1)
torch.manual_seed(0)
teacher = torch.randn(8, 1)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
daso = DASO(model, opt, plan4, group_size=2, local_plan=plan2, warmup_steps=warm, max_skip=skip, adapt=False)
g = torch.Generator().manual_seed(rank)
losses = []
for k in range(steps):
    x = torch.randn(32, 8, generator=g)
    y = x @ teacher
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    daso.step(loss.item())
    losses.append(loss.item())
daso.finish()
flat = torch.cat([p.detach().view(-1) for p in model.parameters()]).numpy()
import numpy as np
hi, lo = np.empty_like(flat), np.empty_like(flat)
world.Allreduce(flat, hi, op=MPI.MAX)
world.Allreduce(flat, lo, op=MPI.MIN)
spread = float((hi - lo).max())
rows = world.gather({"rank": rank, "first": losses[0], "last": sum(losses[-5:]) / 5, "syncs": daso.sync_steps,
                     "applied": daso.applied, "spread": spread,
                     "err": float((model.weight.detach().view(-1, 1) - teacher).abs().max())})
if rank == 0:
    print(json.dumps(rows), flush=True)
daso.close()
'''


@pytest.mark.mpi
def test_daso_converges_and_syncs_every_b_steps(tmp_path: Path) -> None:
    steps, skip, warm = 42, 4, 3
    rows = launch(4, DASO_WORKER, [str(plan_for(tmp_path, 2, 2)), str(plan_for(tmp_path, 1, 2)), str(steps),
                                   str(skip), str(warm)], tmp_path)
    syncs = rows[0]["syncs"]
    assert all(r["syncs"] == syncs for r in rows)
    assert syncs[:warm] == list(range(1, warm + 1))            # warm-up: every step
    after = syncs[warm - 1:]
    assert all(b - a == skip for a, b in itertools.pairwise(after))  # then every B steps
    assert len(syncs) == warm + (steps - warm) // skip
    stale = max(1, skip // 4)
    assert [tuple(a) for a in rows[0]["applied"]][warm:] == [(s, s + stale) for s in syncs[warm:] if s + stale <= steps]
    for r in rows:
        assert r["last"] < 0.02 * r["first"], r                  # converged on the toy regression
        assert r["err"] < 0.05
        assert r["spread"] < 1e-6                                  # finish() leaves every rank equal
