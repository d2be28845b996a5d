"""Train a small MLP on 4 CPU processes with topocc's runtime inside PyTorch (DDP hook, Prophet blocks, DASO).

Run (one command, from the repository root)::

    mpiexec -n 4 python examples/train_mlp.py [--plan PLAN] [--steps 60]

Without ``--plan`` the example compiles an allreduce plan for
``examples/two_hosts_2x2.yaml`` (2 hosts x 2 ranks) on its first run and caches
it.  It then trains the same seeded model on the same synthetic data five ways:

1. plain DDP (gloo allreduce);
2. DDP with :func:`topocc.runtime.training.topocc_allreduce_hook` (the compiled plan
   over MPI): the loss curves of 1 and 2 must match to float tolerance;
3. topocc blocks laid out like DDP's default buckets, update after all arrive;
4. topocc blocks planned by ``topocc.planner.gradblocks.block_plan`` (Prophet) from a profile of
   this model, updates gated per layer in the next forward pass; 3 and 4 print
   the planner's predicted iteration time next to the measured one;
5. DASO: gradients averaged inside each "host" (2 ranks) every step, parameters
   averaged across hosts every B steps, stale by S steps.

It prints the loss curves side by side, the iteration times, and wall time and
final evaluation loss of DASO against synchronous DDP.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from topocc.runtime.communicator import Communicator  # noqa: E402
from topocc.runtime.plan import load_plan, save_plan  # noqa: E402
from topocc.runtime.training import (  # noqa: E402
    DASO,
    BlockScheduler,
    TopoccHookState,
    profile_model,
    topocc_allreduce_hook,
)

TOPOLOGY = Path(__file__).resolve().parent / "two_hosts_2x2.yaml"
HOST_TOPOLOGY = """
name: one-host-2
cluster:
  hosts: 1
  host:
    gpus: 2
    fabric: fully-connected
    gpu_link: {bandwidth: 10 GB/s, latency: 1 us, kind: shm}
"""


def compiled_plan(path: Path | None, cache: Path, ranks: int) -> tuple[Path, Path]:
    """The 4-rank plan (given or compiled once) and a 2-rank single-host plan for DASO's node-local step."""
    global_path = path if path is not None else cache / "two_hosts_2x2-allreduce.plan.json"
    local_path = cache / "one_host_2-allreduce.plan.json"
    if MPI.COMM_WORLD.Get_rank() == 0 and not (global_path.exists() and local_path.exists()):
        from topocc.planner.compiler.size_buckets import compile_plan
        from topocc.planner.topology.parse import load_topology, parse_topology_text

        cache.mkdir(parents=True, exist_ok=True)
        if not global_path.exists():
            plan, _ = compile_plan(load_topology(TOPOLOGY), "allreduce", 1 << 10, 16 << 20)
            save_plan(plan, global_path)
            print(f"compiled {global_path} ({len(plan.schedules)} size buckets)", flush=True)
        if not local_path.exists():
            plan, _ = compile_plan(parse_topology_text(HOST_TOPOLOGY, "one-host-2"), "allreduce", 1 << 10, 16 << 20)
            save_plan(plan, local_path)
    MPI.COMM_WORLD.Barrier()
    if load_plan(global_path).ranks != ranks:
        raise SystemExit(f"the plan is for {load_plan(global_path).ranks} ranks, launched {ranks}")
    return global_path, local_path


def init_gloo(comm: Any) -> None:
    """DDP's process group over 127.0.0.1, on a free port chosen by rank 0 and shared through MPI."""
    port = 0
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size())


def make_model(width: int, depth: int, d_in: int, d_out: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(d_in, width), nn.Tanh()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Tanh()]
    layers.append(nn.Linear(width, d_out))
    return nn.Sequential(*layers)


def make_data(steps: int, batch: int, ranks: int, d_in: int, d_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression task: a random teacher network plus noise (the same on every rank)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(steps * batch * ranks + 512, d_in, generator=g)
    teacher = torch.randn(d_in, d_out, generator=g) / d_in ** 0.5
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(x.shape[0], d_out, generator=g)
    return x, y


class Run:
    """One training run's record: per-step global mean loss, timed iterations, final evaluation loss."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.losses: list[float] = []
        self.iter_s = 0.0
        self.wall_s = 0.0
        self.eval_loss = float("nan")


def train(name: str, comm: Any, args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor],
          setup: Callable[[nn.Module], tuple[Callable[[torch.Tensor, torch.Tensor], float], Callable[[], nn.Module]]]
          ) -> Run:
    """Train a fresh copy of the model; ``setup`` returns (one step(x, y) -> loss, finish() -> model)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    model = make_model(args.width, args.depth, args.d_in, args.d_out)
    step, finish = setup(model)
    x, y = data
    run = Run(name)
    local: list[float] = []
    comm.Barrier()
    started = timed_from = time.perf_counter()
    for k in range(args.steps):
        if k == args.warmup:
            timed_from = time.perf_counter()
        lo = (k * size + rank) * args.batch
        local.append(step(x[lo:lo + args.batch], y[lo:lo + args.batch]))
    model = finish()
    end = time.perf_counter()
    run.iter_s = comm.allreduce((end - timed_from) / (args.steps - args.warmup), op=MPI.MAX)
    run.wall_s = comm.allreduce(end - started, op=MPI.MAX)
    run.losses = list(np.asarray(comm.allreduce(np.asarray(local), op=MPI.SUM)) / size)
    with torch.no_grad():
        ex, ey = x[-512:], y[-512:]
        run.eval_loss = float(nn.functional.mse_loss(model(ex), ey))
    return run


def optimizer(params: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def ddp_setup(args: argparse.Namespace, state: TopoccHookState | None) -> Callable[..., Any]:
    def setup(model: nn.Module) -> tuple[Callable[..., float], Callable[[], nn.Module]]:
        ddp = nn.parallel.DistributedDataParallel(model)
        if state is not None:
            ddp.register_comm_hook(state, topocc_allreduce_hook)
        opt = optimizer(ddp.parameters(), args.lr)

        def step(xb: torch.Tensor, yb: torch.Tensor) -> float:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(ddp(xb), yb)
            loss.backward()
            opt.step()
            return loss.item()
        return step, lambda: model
    return setup


def block_setup(args: argparse.Namespace, comm: Communicator, blocks: list[list[tuple[int, int, int]]],
                overlap: bool) -> Callable[..., Any]:
    def setup(model: nn.Module) -> tuple[Callable[..., float], Callable[[], nn.Module]]:
        sched = BlockScheduler(model, blocks, comm, lambda ps: optimizer(ps, args.lr), overlap_forward=overlap)

        def step(xb: torch.Tensor, yb: torch.Tensor) -> float:
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            sched.step()
            return loss.item()

        def finish() -> nn.Module:
            sched.synchronize()
            sched.close()
            return model
        return step, finish
    return setup


def daso_setup(args: argparse.Namespace, plan: Path, local_plan: Path, record: list[DASO]) -> Callable[..., Any]:
    def setup(model: nn.Module) -> tuple[Callable[..., float], Callable[[], nn.Module]]:
        opt = optimizer(model.parameters(), args.lr)
        daso = DASO(model, opt, plan, group_size=2, local_plan=local_plan, warmup_steps=args.daso_warmup,
                    max_skip=args.daso_max_skip, window=8)
        record.append(daso)

        def step(xb: torch.Tensor, yb: torch.Tensor) -> float:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            daso.step(loss.item())
            return loss.item()

        def finish() -> nn.Module:
            daso.finish()
            return model
        return step, finish
    return setup


def measured_cost(comm: Communicator, mpi: Any) -> list[tuple[int, float]]:
    """Median allreduce time of the compiled plan on this machine at a few sizes (max over ranks)."""
    points = []
    for nbytes in (4 << 10, 64 << 10, 512 << 10, 2 << 20):
        buf = np.zeros(nbytes // 4, np.float32)
        times = []
        for _ in range(7):
            mpi.Barrier()
            t = time.perf_counter()
            comm.allreduce(buf, op="avg")
            times.append(time.perf_counter() - t)
        points.append((nbytes, mpi.allreduce(float(np.median(times)), op=MPI.MAX)))
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", type=Path, help="compiled allreduce plan for the 4 ranks (default: compile one)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "topocc-example",
                    help="where a compiled plan is kept between runs")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of each run")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--d-in", type=int, default=256)
    ap.add_argument("--d-out", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--daso-warmup", type=int, default=4)
    ap.add_argument("--daso-max-skip", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    out = print if rank == 0 else (lambda *a, **k: None)
    plan_path, local_plan_path = compiled_plan(args.plan, args.cache, size)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    init_gloo(world)
    data = make_data(args.steps, args.batch, size, args.d_in, args.d_out)
    nparams = sum(p.numel() for p in make_model(args.width, args.depth, args.d_in, args.d_out).parameters())
    out(f"{size} ranks, MLP {args.d_in}-{'x'.join([str(args.width)] * args.depth)}-{args.d_out} "
        f"({nparams * 4 / 2**20:.2f} MiB of gradients), {args.steps} steps, plan {plan_path}", flush=True)

    state = TopoccHookState(plan_path)
    runs = [train("ddp", world, args, data, ddp_setup(args, None)),
            train("ddp+topocc", world, args, data, ddp_setup(args, state))]
    a, b = runs
    out("\nloss curves (mean over ranks): plain DDP vs DDP + topocc hook")
    out(f"{'step':>5} {'DDP (gloo)':>14} {'topocc hook':>14} {'|diff|':>10}")
    for k in [*range(0, args.steps, max(1, args.steps // 10)), args.steps - 1]:
        out(f"{k:>5} {a.losses[k]:>14.8f} {b.losses[k]:>14.8f} {abs(a.losses[k] - b.losses[k]):>10.2e}")
    diff = max(abs(u - v) for u, v in zip(a.losses, b.losses))
    match = np.allclose(a.losses, b.losses, rtol=1e-5, atol=1e-6)
    out(f"max |diff| over {args.steps} steps: {diff:.2e} -> curves {'MATCH' if match else 'DIFFER'} "
        f"(rtol 1e-5, atol 1e-6); hook calls per rank: {state.calls}")

    # ---------------------------------------------------------------- Prophet blocks
    comm = state.comm
    assert comm is not None
    profile_net = make_model(args.width, args.depth, args.d_in, args.d_out)
    world.Barrier()  # every rank profiles at once, so the profile sees the same CPU contention as training
    profile = profile_model(profile_net, nn.functional.mse_loss, (data[0][:args.batch], data[1][:args.batch]))
    points = measured_cost(comm, world)
    blocks_ddp = blocks_prophet = None
    report: dict[str, Any] = {}
    if rank == 0:
        from topocc.planner.gradblocks.block_plan import ddp_blocks, format_block_plan, plan_blocks, simulate_blocks
        from topocc.planner.gradblocks.cost import fit_cost, plan_cost

        cost = fit_cost(points)
        bucket_plan = plan_blocks(profile, cost)
        out("\n" + format_block_plan(bucket_plan, profile))
        model_cost = plan_cost(load_plan(plan_path))
        on_topology = plan_blocks(profile, model_cost)
        report = {"prophet": bucket_plan.predicted_time_s, "ddp-blocks": bucket_plan.ddp_time_s,
                  "topo_prophet": on_topology.predicted_time_s, "topo_ddp": on_topology.ddp_time_s}
        blocks_ddp = ddp_blocks(profile)
        ddp_sim = simulate_blocks(profile, cost, blocks_ddp, policy="fifo", gating="global")
        assert abs(ddp_sim.iteration_s - bucket_plan.ddp_time_s) < 1e-12
        blocks_prophet = [list(blk.pieces) for blk in bucket_plan.blocks]
        out(f"(on the plan's modelled topology, {model_cost.alpha_s * 1e6:.1f} us + B / "
            f"{model_cost.bytes_per_s / 1e9:.2f} GB/s: Prophet {on_topology.predicted_time_s * 1e3:.3f} ms vs "
            f"DDP default {on_topology.ddp_time_s * 1e3:.3f} ms)")
    blocks_ddp, blocks_prophet, report = world.bcast((blocks_ddp, blocks_prophet, report), root=0)
    runs.append(train("blocks (DDP layout, FIFO, step after all)", world, args, data,
                      block_setup(args, comm, blocks_ddp, overlap=False)))
    runs.append(train("blocks (Prophet plan, layer-gated)", world, args, data,
                      block_setup(args, comm, blocks_prophet, overlap=True)))
    c, d = runs[2], runs[3]
    out("\niteration time (after warm-up, max over ranks): predicted (profile + measured cost) vs measured")
    out(f"{'run':<44} {'predicted ms':>13} {'measured ms':>12}")
    out(f"{'DDP (gloo), plain':<44} {'-':>13} {a.iter_s * 1e3:>12.3f}")
    out(f"{'DDP + topocc hook':<44} {'-':>13} {b.iter_s * 1e3:>12.3f}")
    out(f"{c.name:<44} {report['ddp-blocks'] * 1e3:>13.3f} {c.iter_s * 1e3:>12.3f}")
    out(f"{d.name:<44} {report['prophet'] * 1e3:>13.3f} {d.iter_s * 1e3:>12.3f}")
    dd = max(abs(u - v) for u, v in zip(a.losses, d.losses))
    out(f"Prophet-run loss curve vs plain DDP: max |diff| {dd:.2e}")

    # ---------------------------------------------------------------- DASO
    record: list[DASO] = []
    e = train("daso", world, args, data, daso_setup(args, plan_path, local_plan_path, record))
    daso = record[0]
    out("\nDASO (2 nodes x 2 ranks) vs synchronous DDP, same data and steps")
    out(f"{'run':<26} {'wall s':>8} {'ms/iter':>8} {'final train loss':>17} {'eval loss':>10}")
    for r in (a, e):
        out(f"{r.name:<26} {r.wall_s:>8.3f} {r.iter_s * 1e3:>8.3f} {r.losses[-1]:>17.6f} {r.eval_loss:>10.6f}")
    out(f"DASO global syncs: {len(daso.sync_steps)} in {args.steps} steps at {daso.sync_steps}")
    out(f"DASO applied (sent step -> applied step): {daso.applied}")
    out(f"DASO B over time (step, B): {daso.skip_history}")
    daso.close()
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
