"""The DDP hook, the Prophet block runtime, the torch.distributed replay and DASO, under mpiexec."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import itertools  # noqa: E402

from planner.buckets import BucketPlan, LinearCost, bucket_plan_to_dict, prophet_blocks  # noqa: E402
from planner.compile import compile_plan  # noqa: E402
from planner.topology import parse_topology_text  # noqa: E402
from runtime.launch import RANK_WRAPPER, find_mpiexec  # noqa: E402
from runtime.plan import save_plan  # noqa: E402
from runtime.torch_hook import profile_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

TOPOLOGY = """
name: t{hosts}x{gpus}
cluster:
  hosts: {hosts}
  host:
    gpus: {gpus}
    fabric: fully-connected
    gpu_link: {{bandwidth: 10 GB/s, latency: 1 us, kind: shm}}
    nics: 1
    nic: {{bandwidth: 10 Gbit/s, latency: 20 us, kind: ethernet}}
  network: {{type: single-switch}}
"""

# Run on every rank: plain DDP vs DDP + hook gradients, the torch p2p replay, and the block scheduler.
WORKER = r'''
import json, os, socket, sys
import numpy as np, torch, torch.distributed as dist
from torch import nn
from mpi4py import MPI
from runtime.torch_hook import TopoccHookState, TorchReplay, BlockScheduler, load_block_plan, topocc_allreduce_hook

plan_path, blocks_path = sys.argv[1], sys.argv[2]
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
torch.set_num_threads(1)
port = 0
if rank == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
port = world.bcast(port)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)

def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(37, 300), nn.Tanh(), nn.Linear(300, 900), nn.Tanh(), nn.Linear(900, 5))

g = torch.Generator().manual_seed(100 + rank)          # different data on every rank
x, y = torch.randn(16, 37, generator=g), torch.randn(16, 5, generator=g)

def grads(hook):
    m = model()
    ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.1)   # several buckets of several sizes
    if hook is not None:
        ddp.register_comm_hook(hook, topocc_allreduce_hook)
    nn.functional.mse_loss(ddp(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]

state = TopoccHookState(plan_path)
plain, hooked = grads(None), grads(state)
out = {"rank": rank, "hook_calls": state.calls, "hook_bytes": state.bytes,
       "param_bytes": sum(p.numel() * 4 for p in model().parameters()),
       "hook_max_diff": max(float((a - b).abs().max()) for a, b in zip(plain, hooked)),
       "grad_scale": max(float(a.abs().max()) for a in plain)}

# torch.distributed replay (the code path CUDA buckets take), here over gloo on CPU
replay = TorchReplay(state.plan, rank)
errs = []
for n in (1, 7, 1000, 70001):
    t = torch.arange(n, dtype=torch.float32) * (rank + 1)
    replay.allreduce_(t)
    errs.append(float((t - torch.arange(n, dtype=torch.float32) * (size * (size + 1) / 2)).abs().max()))
out["replay_max_err"] = max(errs)

# block scheduler with the planner's blocks: same update as DDP + SGD
blocks = load_block_plan(blocks_path)
ref = model(); opt = torch.optim.SGD(ref.parameters(), lr=0.1)
ddp = nn.parallel.DistributedDataParallel(ref)
m = model()
sched = BlockScheduler(m, blocks, state.comm, lambda ps: torch.optim.SGD(ps, lr=0.1), overlap_forward=True)
for step in range(3):
    opt.zero_grad(); nn.functional.mse_loss(ddp(x), y).backward(); opt.step()
    nn.functional.mse_loss(m(x), y).backward(); sched.step()
sched.synchronize()
out["blocks_max_diff"] = max(float((a - b).abs().max()) for a, b in zip(ref.parameters(), m.parameters()))
out["blocks_sent"] = [[it, j] for it, j in sched.sent]
out["nblocks"] = len(blocks)
sched.close()
rows = world.gather(out)
if rank == 0:
    print(json.dumps(rows), flush=True)       # one line: ranks' prints would interleave
state.close()
dist.destroy_process_group()
'''

DASO_WORKER = r'''
import json, sys
import torch
from torch import nn
from mpi4py import MPI
from runtime.torch_hook import DASO

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


def plan_for(tmp_path: Path, hosts: int, gpus: int) -> Path:
    plan, _ = compile_plan(parse_topology_text(TOPOLOGY.format(hosts=hosts, gpus=gpus), "t"), "allreduce",
                           1 << 8, 1 << 20)
    path = tmp_path / f"plan{hosts}x{gpus}.json"
    save_plan(plan, path)
    return path


def launch(np_: int, script: str, args: list[str], tmp_path: Path, limit: float = 50) -> list[dict]:
    """Run ``script`` on ``np_`` ranks; kill the whole job past ``limit`` seconds; rank rows sorted by rank."""
    file = tmp_path / "worker.py"
    file.write_text(script)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [find_mpiexec(), "-disable-auto-cleanup", "-n", str(np_), *RANK_WRAPPER, sys.executable, str(file), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job ran past {limit} s:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    rows = [row for line in out.splitlines() if line.startswith("[") for row in json.loads(line)]
    assert len(rows) == np_, out + err[-2000:]
    return rows


def blocks_file(tmp_path: Path) -> Path:
    """A Prophet plan for the worker's model, small chunks so blocks split parameters."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(37, 300), torch.nn.Tanh(), torch.nn.Linear(300, 900),
                              torch.nn.Tanh(), torch.nn.Linear(900, 5))
    prof = profile_model(net, torch.nn.functional.mse_loss, (torch.randn(16, 37), torch.randn(16, 5)), repeats=2)
    timeline = prophet_blocks(prof, LinearCost(1e-6, 1e9), 64 << 10)
    plan = BucketPlan(timeline.blocks, timeline.iteration_s, 0.0, 0.0, "prophet", 64 << 10)
    assert any(lo > 0 for b in plan.blocks for _, lo, _ in b.pieces), "the test needs split parameters"
    path = tmp_path / "blocks.json"
    path.write_text(json.dumps(bucket_plan_to_dict(plan, prof)))
    return path


@pytest.mark.mpi
@pytest.mark.parametrize(("hosts", "gpus"), [(1, 2), (2, 2)])
def test_hook_replay_and_blocks_match_ddp(tmp_path: Path, hosts: int, gpus: int) -> None:
    rows = launch(hosts * gpus, WORKER, [str(plan_for(tmp_path, hosts, gpus)), str(blocks_file(tmp_path))],
                  tmp_path)
    for r in rows:
        assert r["hook_calls"] >= 1 and r["hook_bytes"] == r["param_bytes"]  # every gradient went through the hook
        assert r["hook_max_diff"] <= 1e-6 * max(1.0, r["grad_scale"]), r
        assert r["replay_max_err"] == 0.0
        assert r["blocks_max_diff"] <= 1e-5, r
        sent = [j for _, j in r["blocks_sent"]]
        for it in range(3):  # each block reduced exactly once per iteration
            assert sorted(j for i, j in r["blocks_sent"] if i == it) == list(range(r["nblocks"]))
        assert len(sent) == 3 * r["nblocks"]


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


def test_profile_sees_backward_in_reverse_layer_order() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 4))
    prof = profile_model(net, torch.nn.functional.mse_loss, (torch.randn(32, 64), torch.randn(32, 4)), repeats=3)
    assert prof.layers == ("0", "2", "4")
    assert [p.layer for p in prof.params] == [0, 0, 1, 1, 2, 2]
    assert [p.nbytes for p in prof.params] == [64 * 256 * 4, 256 * 4, 256 * 256 * 4, 256 * 4, 256 * 4 * 4, 16]
    weights = [prof.params[i].ready_time_s for i in (0, 2, 4)]
    assert weights[0] > weights[1] > weights[2] > 0                # the last layer's gradient comes first
    assert prof.backward_time_s >= max(p.ready_time_s for p in prof.params)
    assert len(prof.forward_time_s) == 3 and all(t > 0 for t in prof.forward_time_s)
    assert all(p.grad is None for p in net.parameters())


def test_block_plan_errors_are_one_line(tmp_path: Path) -> None:
    from runtime.errors import CommunicatorError
    from runtime.torch_hook import load_block_plan

    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"format": "topocc-bucket-plan", "blocks": [{"pieces": [[0, 1]]}]}))
    with pytest.raises(CommunicatorError, match="malformed bucket plan"):
        load_block_plan(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CommunicatorError, match="not a topocc bucket plan"):
        load_block_plan(bad)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="the NCCL path needs at least 2 CUDA GPUs (one rank per GPU); none or one here")
def test_hook_on_cuda_through_nccl(tmp_path: Path) -> None:  # pragma: no cover - needs GPUs
    script = WORKER.replace('dist.init_process_group("gloo"', 'torch.cuda.set_device(rank); '
                            'dist.init_process_group("nccl"')
    script = script.replace("x, y = torch.randn(16, 37, generator=g), torch.randn(16, 5, generator=g)",
                            "x, y = torch.randn(16, 37, generator=g).cuda(), torch.randn(16, 5, generator=g).cuda()")
    script = script.replace("    m = model()\n    ddp", "    m = model().cuda()\n    ddp")
    script = script.replace("t = torch.arange(n, dtype=torch.float32) * (rank + 1)",
                            "t = torch.arange(n, dtype=torch.float32, device='cuda') * (rank + 1)")
    script = script.replace("(t - torch.arange(n, dtype=torch.float32)",
                            "(t.cpu() - torch.arange(n, dtype=torch.float32)")
    script = script.split("# block scheduler")[0] + 'print(json.dumps(world.gather(out)) if rank == 0 else "")\n'
    script = script.replace("state = TopoccHookState(plan_path)", "state = TopoccHookState(plan_path, cpu=False)")
    rows = launch(2, script, [str(plan_for(tmp_path, 1, 2)), "-"], tmp_path)
    for r in rows:
        assert r["hook_max_diff"] <= 1e-5 * max(1.0, r["grad_scale"])
        assert r["replay_max_err"] == 0.0
