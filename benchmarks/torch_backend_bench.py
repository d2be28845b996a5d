"""The ``topocc`` process group against gloo's own collectives, and against the same plan run by Communicator.

On an emulated cluster (``topocc emulate``'s network namespaces and shaped links; needs root), every rank
joins ``init_process_group("topocc")`` under ``mpiexec`` (a ``tcp://`` rendezvous at rank 0) and times:

* all_reduce, reduce_scatter_tensor and all_gather_into_tensor at each size: through the process group
  (the plan), through a gloo group of the same ranks (gloo's own algorithm), and through a
  :class:`~topocc.runtime.communicator.Communicator` on the same plan over a gloo transport (what the
  process group adds over the runtime);
* a DDP step and an FSDP2 step (gradients of about ``--model-mib`` MiB) over each group.

Prints one table (times in ms, the slowest rank's, median over ``--iters``) and the targets: the plan's
all_reduce at least 1.3x faster than gloo's at 64 MiB, the process group at most 5% over Communicator.

    sudo .venv/bin/python benchmarks/torch_backend_bench.py [--topology emu-racks] [--sizes-mib 16 64]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from topocc.runtime.bundle import Bundle
    from topocc.runtime.plan import AnyPlan

MIB = 1 << 20
COLLECTIVES = ("allreduce", "reducescatter", "allgather")


# ---------------------------------------------------------------------------------------------- every rank


def _interface_address(ifname: str) -> str:
    """The IPv4 address of ``ifname`` (this rank's emulated host interface)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


def _timed(world: Any, call: Callable[[], Any], warmup: int, iters: int) -> float:
    """Median seconds of ``call`` over ``iters`` (after ``warmup``), each the slowest rank's, ranks aligned."""
    from topocc.runtime.harness.probe import slowest_median

    for _ in range(warmup):
        call()
    return slowest_median(world, call, iters)


def _model(mib: float) -> Any:
    """A small MLP whose parameters (and so gradients) take about ``mib`` MiB in float32."""
    import torch
    from torch import nn

    width = max(64, int((mib * MIB / 4 / 4) ** 0.5))
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))


def _steps(world: Any, group: Any, kind: str, mib: float, steps: int) -> float:
    """Median seconds per training step of DDP or FSDP2 over ``group`` (after one warm-up step)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(mib)
    if kind == "ddp":
        model = DDP(model, process_group=group)
    else:
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    width = next(model.parameters()).shape[-1] if kind == "ddp" else _model(mib)[0].in_features
    x = torch.randn(16, width)

    def step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return _timed(world, step, 1, steps)


def _breakdown(world: Any, comm: Any, tensor: Any) -> dict[str, float]:
    """One all-reduce by ``comm`` with its reductions and copies timed: the slowest rank's wall time, and the
    largest per-rank time in reductions and in copies (the rest is the transport and waiting for peers)."""
    from mpi4py import MPI

    spent = {"reduce": 0.0, "copy": 0.0}

    def timed(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - start
        return run

    ops = comm.ops
    ops.reductions = {name: timed(fn, "reduce") for name, fn in type(ops).reductions.items()}
    ops.copyto = timed(type(ops).copyto.__get__(ops), "copy")
    world.Barrier()
    start = time.perf_counter()
    comm.allreduce(tensor)
    wall = time.perf_counter() - start
    return {"wall": world.allreduce(wall, op=MPI.MAX), "reduce": world.allreduce(spent["reduce"], op=MPI.MAX),
            "copy": world.allreduce(spent["copy"], op=MPI.MAX)}


def _planned(bundle: Bundle, collective: str, ranks: int) -> AnyPlan:
    """The bundle's plan for ``collective`` over all ``ranks`` (the bundle this script compiles has each)."""
    plan = bundle.find(collective, range(ranks))
    if plan is None:
        raise SystemExit(f"torch_backend_bench: the bundle has no {collective} plan over {ranks} ranks")
    return plan


def _calls(big: Any, small: Any, direct: dict[str, Any]) -> dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]]:
    """Per collective: the call through a process group (topocc's for None, else the given one), and the same
    plan's call by its Communicator."""
    import torch.distributed as dist

    return {
        "allreduce": (lambda g: dist.all_reduce(big, group=g), lambda: direct["allreduce"].allreduce(big)),
        "reducescatter": (lambda g: dist.reduce_scatter_tensor(small, big, group=g),
                          lambda: direct["reducescatter"].reduce_scatter(big, small)),
        "allgather": (lambda g: dist.all_gather_into_tensor(big, small, group=g),
                      lambda: direct["allgather"].allgather(small, big)),
    }


def rank_main(args: argparse.Namespace) -> None:
    """One rank: join the process groups, time every variant, rank 0 prints ``RESULT {json}``."""
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import topocc.runtime.distributed as td
    from topocc.runtime.bundle import load_bundle
    from topocc.runtime.communicator import Communicator
    from topocc.runtime.transports.gloo import GlooTransport

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    address = world.bcast(f"{_interface_address(os.environ['GLOO_SOCKET_IFNAME'])}:29517" if rank == 0 else None)
    torch.set_num_threads(1)
    os.environ["TOPOCC_TUNE"] = "off"  # this bench times the plans themselves: no measured choice against gloo
    dist.init_process_group("topocc", init_method=f"tcp://{address}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=600), pg_options=td.BackendOptions(plan=args.bundle))
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=600))
    bundle = load_bundle(args.bundle)
    transport = GlooTransport(timeout=600)
    direct = {c: Communicator(_planned(bundle, c, size), transport=transport, timeout=600) for c in COLLECTIVES}
    rows: list[dict[str, Any]] = []
    for mib in args.sizes_mib:
        n = int(mib * MIB) // 4 // size * size
        big, small = torch.ones(n), torch.ones(n // size)
        calls = _calls(big, small, direct)
        warm, iters = (1, args.iters) if mib < 64 else (0, max(1, args.iters - 1))
        for name, (through, by_comm) in calls.items():
            row = {"what": name, "mib": mib,
                   "topocc": _timed(world, functools.partial(through, None), warm, iters),
                   "gloo": _timed(world, functools.partial(through, gloo), warm, iters),
                   "communicator": _timed(world, by_comm, warm, iters)}
            rows.append(row)
            if rank == 0:
                print(f"  {name} {mib} MiB: {json.dumps(row)}", file=sys.stderr, flush=True)
    breakdown = _breakdown(world, direct["allreduce"], torch.ones(int(max(args.sizes_mib) * MIB) // 4))
    for kind in ("ddp", "fsdp"):
        row = {"what": f"{kind} step", "mib": args.model_mib,
               "topocc": _steps(world, dist.group.WORLD, kind, args.model_mib, args.steps),
               "gloo": _steps(world, gloo, kind, args.model_mib, args.steps), "communicator": None}
        rows.append(row)
        if rank == 0:
            print(f"  {kind}: {json.dumps(row)}", file=sys.stderr, flush=True)
    if rank == 0:
        print("RESULT " + json.dumps({"rows": rows, "counters": td.counters().as_dict(), "breakdown": breakdown}),
              flush=True)
    for comm in direct.values():
        comm.close()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- the driver


def _ms(v: float | None) -> str:
    return f"{1e3 * v:,.0f}" if v is not None else "-"


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table: time per variant in ms, the simulator's prediction, gloo over topocc, the process group over
    Communicator."""
    from topocc.planner.report.table import format_table

    out = []
    for r in rows:
        over = f"{r['topocc'] / r['communicator'] - 1:+.1%}" if r["communicator"] else "-"
        out.append((r["what"], f"{r['mib']:g} MiB", _ms(r["topocc"]), _ms(r["gloo"]), _ms(r["communicator"]),
                    _ms(r.get("predicted")), f"{r['gloo'] / r['topocc']:.2f}", over))
    return format_table(out, ("what", "size", "topocc pg", "gloo", "Communicator", "predicted", "gloo / topocc",
                              "pg over Communicator"))


def predict(bundle: Any, topology: Any, scale: float, rows: list[dict[str, Any]]) -> None:
    """Add the simulator's time on the emulated (scaled) topology to each collective's row."""
    from topocc.planner.analysis.simulate import simulate
    from topocc.planner.testbed.emulation import scaled_topology

    scaled = scaled_topology(topology, scale)
    if scaled.ranks != topology.ranks:  # a subset's ranks (scaling rebuilds the topology with every GPU a rank)
        scaled = scaled.subset([scaled.ranks.index(name) for name in topology.ranks])
    for r in rows:
        if r["what"] in COLLECTIVES:
            size = int(r["mib"] * MIB) // 4 // topology.size * topology.size * 4
            r["predicted"] = simulate(scaled, bundle.find(r["what"], range(topology.size)).select(size), size).time_s


def targets(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r["what"] == "allreduce" and r["mib"] >= 64:
            speed = r["gloo"] / r["topocc"]
            out.append(f"{'met ' if speed >= 1.3 else 'MISS'} all_reduce {r['mib']:g} MiB: gloo / topocc "
                       f"{speed:.2f} (target >= 1.30)")
        if r["communicator"]:
            over = r["topocc"] / r["communicator"] - 1
            out.append(f"{'met ' if over <= 0.05 else 'MISS'} {r['what']} {r['mib']:g} MiB: process group over "
                       f"Communicator {over:+.1%} (target <= +5%)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="emu-racks")
    parser.add_argument("--sizes-mib", nargs="+", type=float, default=[16, 64])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--model-mib", type=float, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--scale", type=float, default=None, help="emulated link rate = bandwidth x scale")
    parser.add_argument("--rank", dest="bundle", default=None, help=argparse.SUPPRESS)  # set for the ranks
    args = parser.parse_args(argv)
    if args.bundle:
        rank_main(args)
        return 0
    from topocc.planner.compiler.bundling import compile_bundle, requests_for
    from topocc.planner.testbed.bench import run_emulated
    from topocc.planner.testbed.emulation import DEFAULT_SCALE, emulation_available
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.runtime.bundle import save_bundle

    if (why := emulation_available()) is not None:
        print(f"cannot emulate a cluster here: {why}", file=sys.stderr)
        return 1
    topology = resolve_topology(args.topology)
    low, high = int(min(args.sizes_mib) * MIB) // 8, int(max(args.sizes_mib) * MIB)
    start = time.perf_counter()
    bundle, _ = compile_bundle(topology, requests_for(topology.size, ("allreduce", "reducescatter", "allgather",
                                                                      "broadcast"), low, high))
    print(f"compiled the bundle for {topology.name} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        save_bundle(bundle, Path(tmp) / "bundle")
        cmd = [sys.executable, __file__, "--rank", str(Path(tmp) / "bundle"), "--sizes-mib",
               *map(str, args.sizes_mib), "--iters", str(args.iters), "--model-mib", str(args.model_mib),
               "--steps", str(args.steps)]
        done = run_emulated(topology, cmd, scale=args.scale or DEFAULT_SCALE, timeout_s=3600,
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    sys.stderr.write(done.stderr[-3000:] if done.returncode else "")
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        print(f"the ranks failed (exit {done.returncode})", file=sys.stderr)
        return 1
    result = json.loads(lines[-1].removeprefix("RESULT "))
    scale = args.scale or DEFAULT_SCALE
    predict(bundle, topology, scale, result["rows"])
    print(f"{topology.name} ({topology.size} ranks), scale {scale:g}; times in ms, the slowest rank's, median of "
          f"{args.iters}; predicted: the simulator on the emulated links")
    print(format_rows(result["rows"]))
    b = result["breakdown"]
    print(f"one all_reduce of {max(args.sizes_mib):g} MiB by Communicator over gloo: {_ms(b['wall'])} ms on the "
          f"slowest rank; at most {_ms(b['reduce'])} ms of a rank's in reductions, {_ms(b['copy'])} ms in copies; "
          "the rest is the transport and waiting for peers")
    print("\n".join(targets(result["rows"])))
    print("process group counters:", json.dumps(result["counters"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
