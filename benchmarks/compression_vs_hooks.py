"""Compressed topocc plans against PyTorch's DDP compression hooks, on an emulated cluster with slow rack uplinks.

On the emulated emu-racks (12 ranks in 3 racks whose 50 Gbit/s uplinks set the time; ``topocc emulate``'s
network namespaces and shaped links at ``--scale``; needs root), every rank holds the same gradients at every
step (default: an MLP's, 4 layers of 2048 x 2048, 64 MiB of float32, each rank on its own batch; ``--gradients
random``: a fixed normal vector per rank) in a DDP model whose backward yields exactly them, and DDP all-reduces
them (in one bucket):

* over ``init_process_group("topocc")`` with a bundle of the planned all-reduce (``auto``, compiled for the
  cluster as emulated), and of it compressed bf16, int8 and top-k 1% on the inter-rack hops
  (:mod:`topocc.planner.compiler.compress`).  ``TOPOCC_TUNE=off`` and no native threshold: the plan itself
  is timed, never gloo's all-reduce in its place; no error feedback;
* over a gloo group of the same ranks: DDP's own all-reduce, ``bf16_compress_hook`` (PyTorch's, called from a
  function of another name: DDP refuses that name without CUDA), and ``powerSGD_hook``
  (``matrix_approximation_rank=4``, warm start on, error feedback off; its first ``start_powerSGD_iter``
  steps are plain all-reduces, PowerSGD's own warm-up, and are the gloo row's steps).

Each row: the backward's time (the slowest rank's, median of ``--iters`` after ``--warmup``; the backward only
copies the gradients, so the all-reduces are the time), its ratio to the exact plan's, the relative L2 error
of rank 0's averaged gradient against the exact average (float64, of every rank's gradient; error feedback
off everywhere, so each row's error is one call's), and whether every rank ended bitwise equal.  On 2 cores
the default run takes about 9 minutes.

    sudo .venv/bin/python benchmarks/compression_vs_hooks.py [--iters 3] [--warmup 1] [--gradients mlp|random]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

MIB = 1 << 20
POLICIES = ("bf16@inter-rack", "int8@inter-rack", "topk:1%@inter-rack")
#: Port of the first process group's rendezvous; each later group (one per bundle, then gloo's) takes the next.
PORT = 29571
ROW = "ROW "


# ---------------------------------------------------------------------------------------------- every rank


def _interface_address(ifname: str) -> str:
    """The IPv4 address of ``ifname`` (this rank's emulated host interface)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


def gradients(kind: str, rank: int, width: int, layers: int = 4, batch: int = 64) -> list[Any]:
    """Rank ``rank``'s gradients, one ``width`` x ``width`` float32 matrix per layer: an MLP's (tanh, no bias) on
    its own batch, regressing a fixed random teacher, or (``random``) standard normal values."""
    import torch
    from torch import nn

    if kind == "random":
        rng = np.random.default_rng([7, rank])
        return [torch.from_numpy(rng.standard_normal((width, width), dtype=np.float32)) for _ in range(layers)]
    torch.manual_seed(0)
    model = nn.Sequential(*(m for _ in range(layers) for m in (nn.Linear(width, width, bias=False), nn.Tanh())))
    teacher = torch.randn(width, width, generator=torch.Generator().manual_seed(1)) / width ** 0.5
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(100 + rank))
    nn.functional.mse_loss(model(x), torch.tanh(x @ teacher)).backward()
    grads = []
    for m in model:
        if isinstance(m, nn.Linear):
            assert m.weight.grad is not None  # backward() above filled it
            grads.append(m.weight.grad.detach().clone())
    return grads


def _fixed_model(grads: list[Any]) -> Any:
    """A model whose backward yields ``grads`` exactly: its loss is ``sum_j <W_j, G_j>``, so ``dL/dW_j = G_j``."""
    import torch
    from torch import nn

    class Fixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = nn.ParameterList([nn.Parameter(torch.zeros_like(g)) for g in grads])

        def forward(self) -> Any:
            return sum((w * g).sum() for w, g in zip(self.weights, grads))

    return Fixed()


def _ddp(group: Any, grads: list[Any], hook: Any = None, state: Any = None) -> Any:
    """DDP over ``group`` of the fixed model (every rank starts from zeros: no initial broadcast), with ``hook``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    size_mb = sum(g.numel() * g.element_size() for g in grads) / MIB
    ddp = DDP(_fixed_model(grads), process_group=group, bucket_cap_mb=size_mb, init_sync=False)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return ddp


def _steps(world: Any, model: Any, steps: int) -> list[float]:
    """Time ``steps`` backwards of ``model`` (a DDP model or not): the slowest rank's seconds, per step."""
    from mpi4py import MPI

    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss = model()
        world.Barrier()
        start = time.perf_counter()
        loss.backward()
        times.append(world.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return times


def _row(world: Any, what: str, over: str, times: list[float], ddp: Any, reference: np.ndarray | None,
         **extra: Any) -> None:
    """Rank 0 prints the row: the median time, the error of its result, whether every rank's result is equal."""
    result = np.concatenate([p.grad.detach().numpy().ravel() for p in ddp.module.weights])
    digests = world.allgather(zlib.crc32(result.tobytes()))
    if reference is not None:
        error = float(np.linalg.norm(result - reference) / np.linalg.norm(reference))
        print(ROW + json.dumps({"what": what, "over": over, "time_s": statistics.median(times), "iters": len(times),
                                "error": error, "consistent": len(set(digests)) == 1, **extra}), flush=True)


def _reference(world: Any, grads: list[Any], folder: Path) -> np.ndarray | None:
    """The exact average of every rank's gradients, in float64, on rank 0 (through files, not the network)."""
    rank, size = world.Get_rank(), world.Get_size()
    np.save(folder / f"grad{rank}.npy", np.concatenate([g.numpy().ravel() for g in grads]))
    world.Barrier()
    total = None
    if rank == 0:
        total = np.zeros(sum(g.numel() for g in grads), np.float64)
        for r in range(size):
            total += np.load(folder / f"grad{r}.npy")
        total /= size
    world.Barrier()
    (folder / f"grad{rank}.npy").unlink()
    return total


def _topocc_rows(world: Any, args: argparse.Namespace, address: str, grads: list[Any],
                 reference: np.ndarray | None) -> None:
    """One topocc world group per bundle (exact, then each policy), DDP over it."""
    import torch.distributed as dist

    import topocc.runtime.distributed as td
    from topocc.runtime.distributed.job import BackendOptions

    rank, size = world.Get_rank(), world.Get_size()
    for i, name in enumerate(("exact", *args.policies)):
        dist.init_process_group("topocc", init_method=f"tcp://{address}:{PORT + i}", rank=rank, world_size=size,
                                pg_options=BackendOptions(plan=str(Path(args.bundles) / str(i))))
        group = dist.group.WORLD
        assert isinstance(group, td.TopoccProcessGroup)  # the world group init_process_group("topocc") made
        ddp = _ddp(group, grads)
        times = _steps(world, ddp, args.warmup + args.iters)[args.warmup:]
        tally = td.counters().by_collective["allreduce"]
        _row(world, "plan" if name == "exact" else name, "topocc", times, ddp, reference,
             planned=tally.planned, encoded=tally.encoded, native=tally.delegated)
        del ddp
        group.close()  # its communicators' buffers now, not at exit: twelve ranks share the machine's memory
        dist.destroy_process_group()
        gc.collect()


def _bf16_hook() -> Any:
    """PyTorch's ``bf16_compress_hook`` itself under another name: DDP refuses that name without CUDA and NCCL 2.10
    (NCCL's bfloat16 support), which gloo on CPU does not need.  A partial keeps the hook's own signature, which
    DDP checks."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = functools.partial(default_hooks.bf16_compress_hook)
    for name in ("__name__", "__qualname__"):
        setattr(hook, name, "bf16_compress_hook_on_gloo")
    return hook


def _gloo_rows(world: Any, args: argparse.Namespace, address: str, grads: list[Any],
               reference: np.ndarray | None) -> None:
    """A gloo world group: DDP's own all-reduce (PowerSGD's plain warm-up steps), bf16_compress_hook, PowerSGD."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as power

    rank, size = world.Get_rank(), world.Get_size()
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{PORT + 1 + len(args.policies)}", rank=rank,
                            world_size=size)
    group = dist.group.WORLD
    steps = args.warmup + args.iters
    ddp = _ddp(group, grads, _bf16_hook(), group)
    _row(world, "bf16_compress_hook", "gloo", _steps(world, ddp, steps)[args.warmup:], ddp, reference)
    del ddp
    state = power.PowerSGDState(process_group=group, matrix_approximation_rank=4, start_powerSGD_iter=max(2, steps),
                                use_error_feedback=False, warm_start=True)
    ddp = _ddp(group, grads, power.powerSGD_hook, state)
    _row(world, "all-reduce (DDP's own)", "gloo", _steps(world, ddp, max(2, steps))[args.warmup:], ddp, reference)
    _row(world, "powerSGD_hook rank 4", "gloo", _steps(world, ddp, steps)[args.warmup:], ddp, reference)
    del ddp
    dist.destroy_process_group()


def rank_main(args: argparse.Namespace) -> int:
    """One rank (under mpiexec): the gradients, the exact average, then every row; rank 0 prints them."""
    import torch
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    torch.set_num_threads(1)
    address = world.bcast(_interface_address(os.environ["GLOO_SOCKET_IFNAME"]) if world.Get_rank() == 0 else None)
    grads = gradients(args.gradients, world.Get_rank(), args.width)
    reference = _reference(world, grads, Path(args.bundles))
    backward = statistics.median(_steps(world, _fixed_model(grads), 3))
    if world.Get_rank() == 0:
        print(ROW + json.dumps({"backward_s": backward}), flush=True)
    _topocc_rows(world, args, address, grads, reference)
    _gloo_rows(world, args, address, grads, reference)
    return 0


# ---------------------------------------------------------------------------------------------- the driver


def _bundles(args: argparse.Namespace, folder: Path) -> str:
    """The exact plan's bundle (``folder/0``) and each policy's (``folder/1``, ...), for the cluster as emulated;
    a line saying what was compiled."""
    from topocc.planner.compiler.compress import compress_all
    from topocc.planner.compiler.size_buckets import compile_plan
    from topocc.planner.routing.network import network_of
    from topocc.planner.testbed.emulation import scaled_topology
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.runtime.bundle import Bundle, BundlePlan, save_bundle
    from topocc.runtime.plan import Plan

    start = time.perf_counter()
    topology = scaled_topology(resolve_topology(args.topology), args.scale)
    net = network_of(topology)
    nbytes = 4 * args.width ** 2 * 4
    plan, buckets = compile_plan(net, "allreduce", nbytes // 8, nbytes)
    world = tuple(range(topology.size))
    plans = [plan] + [Plan(tuple(d.compiled.schedule for d in compress_all(net, buckets, policy)))
                      for policy in args.policies]
    for i, p in enumerate(plans):
        save_bundle(Bundle(topology.size, (BundlePlan(p, world),), topology.name, topology.fingerprint),
                    folder / str(i))
    algorithms = ", ".join(dict.fromkeys(s.metadata.algorithm for s in plan.schedules))
    return (f"{topology.name}: planned all-reduce ({algorithms}) and {len(args.policies)} compressed variants, "
            f"compiled in {time.perf_counter() - start:.0f} s")


def rank_floor(kind: str, width: int, ranks: int, rank: int = 4) -> float:
    """The relative L2 error of the best rank-``rank`` approximation of each layer of the exact average (SVD): the
    least any low-rank compressor of that rank (PowerSGD's) can err by on these gradients."""
    import torch

    total = [torch.zeros(width, width, dtype=torch.float64) for _ in range(4)]
    for r in range(ranks):
        for t, g in zip(total, gradients(kind, r, width)):
            t += g.double()
    values = [torch.linalg.svdvals(t) for t in total]
    dropped = sum(float((v[rank:] ** 2).sum()) for v in values)
    return (dropped / sum(float((v ** 2).sum()) for v in values)) ** 0.5


def _table(args: argparse.Namespace, ranks: int, rows: list[dict[str, Any]], backward: float, floor: float) -> str:
    from topocc.planner.report.table import format_table
    from topocc.planner.units import format_time

    exact = next(r["time_s"] for r in rows if r["over"] == "topocc" and r["what"] == "plan")
    cells = []
    for r in rows:
        calls = (f"{r['encoded']} of {r['planned']}" + (f", {r['native']} native" if r["native"] else "")
                 if "planned" in r else "-")
        cells.append((r["over"], r["what"], format_time(r["time_s"]), f"{r['time_s'] / exact:.2f}",
                      f"{r['error']:.2g}", "yes" if r["consistent"] else "NO", calls, r["iters"]))
    buckets = next(r["planned"] for r in rows if "planned" in r) / (args.warmup + args.iters)
    head = (f"# DDP all-reduce of {4 * args.width ** 2 * 4 / MIB:g} MiB of float32 {args.gradients} gradients "
            f"(4 x {args.width}^2, {buckets:g} bucket(s)) on emulated {args.topology}, {ranks} ranks, inter-host "
            f"bandwidth x{args.scale:g}; time: the backward, slowest rank, median of {args.iters} after {args.warmup} "
            f"warm-up (without DDP it takes {format_time(backward)}); x plan: over the exact plan's time; error: "
            "relative L2 against the exact average, one call, no error feedback; encoded: topocc's all-reduces "
            "that ran encoded, of those planned (warm-up and timed); TOPOCC_TUNE=off")
    table = format_table(cells, ("over", "what", "time", "x plan", "rel L2 error", "consistent", "encoded", "iters"),
                         "<<>>><>>")
    return (f"{head}\n{table}\nthe best rank-4 approximation of each layer of the exact average (SVD) errs by "
            f"{floor:.3g}: no rank-4 compressor does better on these gradients")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--topology", default="emu-racks")
    parser.add_argument("--width", type=int, default=2048, help="each of the 4 gradient matrices is WIDTH^2")
    parser.add_argument("--gradients", choices=("mlp", "random"), default="mlp")
    parser.add_argument("--policy", dest="policies", action="append", default=None,
                        help="a compression policy (repeatable; default: bf16, int8, top-k 1%% on inter-rack hops)")
    parser.add_argument("--scale", type=float, default=None)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--rank", dest="bundles", default=None, help=argparse.SUPPRESS)  # set for the ranks
    args = parser.parse_args(argv)
    args.policies = args.policies or list(POLICIES)
    if args.bundles:
        return rank_main(args)
    return _drive(args)


def _drive(args: argparse.Namespace) -> int:
    from topocc.planner.testbed.bench import run_emulated
    from topocc.planner.testbed.emulation import DEFAULT_SCALE, emulation_available
    from topocc.planner.topology.catalogue import resolve_topology

    if (why := emulation_available()) is not None:
        print(f"compression_vs_hooks: cannot emulate here: {why}", file=sys.stderr)
        return 2
    args.scale = args.scale or DEFAULT_SCALE
    topology = resolve_topology(args.topology)
    with tempfile.TemporaryDirectory() as tmp:
        print(_bundles(args, Path(tmp)), flush=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--rank", tmp, "--width", str(args.width),
               "--gradients", args.gradients, "--iters", str(args.iters), "--warmup", str(args.warmup),
               *(f"--policy={p}" for p in args.policies)]
        done = run_emulated(topology, cmd, scale=args.scale, timeout_s=3600,
                            env={"OMP_NUM_THREADS": "1", "TOPOCC_TUNE": "off"},
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    found = [json.loads(line.removeprefix(ROW)) for line in done.stdout.splitlines() if line.startswith(ROW)]
    rows = [r for r in found if "what" in r]
    if done.returncode or len(rows) != 1 + len(args.policies) + 3:
        print(f"compression_vs_hooks: the run failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
              file=sys.stderr)
        return 1
    floor = rank_floor(args.gradients, args.width, topology.size)  # after the run: the ranks' cores are free
    print(_table(args, topology.size, rows, next(r["backward_s"] for r in found if "backward_s" in r), floor))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
