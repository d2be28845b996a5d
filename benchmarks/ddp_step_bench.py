"""A DDP step over ``init_process_group("topocc")`` against gloo's, and each backend's set-up time, emulated.

On an emulated cluster (``topocc emulate``'s network namespaces and shaped links; needs root), every rank
times, under ``mpiexec``:

* **a DDP training step** (forward, backward with DDP's bucketed all-reduces overlapping it, SGD) of a model
  with many small gradient buckets (``--small-layers`` linear layers in buckets of ``--bucket-mib``) and,
  for the ``+ large`` row, a few large ones (``--large-layers`` layers of about ``--large-mib`` MiB of
  gradients each, a bucket each), once over the world's topocc group and once over a gloo group of the
  same ranks, steps alternating between the two (the slowest rank's time, median of ``--steps``);
* **the set-up**: ``init_process_group`` and the first call of all_reduce, reduce_scatter_tensor,
  all_gather_into_tensor and broadcast (``--setup-kib`` each), in a fresh process per try, timed from a
  barrier after ``import torch`` to the last rank's return (median of ``--setup-tries`` per backend,
  alternating).  The topocc processes import nothing of topocc: torch's backend autoloading registers
  the backend, and the runtime is loaded inside ``init_process_group``, so its import is counted.
  Processes import from a warm bytecode cache, as an installed package does.  The ranks meet on a store
  made before the clock starts, as torchrun's agent makes one before it starts its workers: a store made
  by ``init_process_group`` itself has its clients race its server, and one that comes first retries after
  a back-off of 0.3-0.7 s (measured for gloo as for topocc, in about half the tries on two ranks).

The bundle is compiled for the cluster as emulated (its inter-host links at ``--scale`` of their bandwidth)
by ``topocc bundle``'s compiler, with each plan's native threshold, or for ``--topology-file`` (a
calibrated topology, ``topocc calibrate --emulate``).  Prints one table per cluster and the targets: the
DDP step at most 1.02x gloo's where no gradient ran a plan, at least 1.25x faster than gloo's with the
large buckets on emu-racks; set-up within 1.2x of gloo's.

    sudo .venv/bin/python benchmarks/ddp_step_bench.py [--topologies emu-racks emu-uniform] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
#: The collectives whose first call the set-up includes, and the bundle compiles.
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast")
#: Port of the rendezvous of the ranks' process groups; the set-up's pre-start barrier uses the next one.
PORT = 29531


# ---------------------------------------------------------------------------------------------- every rank


def _interface_address(ifname: str) -> str:
    """The IPv4 address of ``ifname`` (this rank's emulated host interface)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


def _model(args: argparse.Namespace, large: bool) -> Any:
    """Small layers (many buckets), then, with ``large``, a few layers of about ``--large-mib`` MiB each."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[Any] = [nn.Linear(args.small_width, args.small_width) for _ in range(args.small_layers)]
    if large:
        width = int((args.large_mib * MIB / 4) ** 0.5)
        layers = [nn.Linear(args.small_width, width), *(nn.Linear(width, width) for _ in range(args.large_layers)),
                  nn.Linear(width, args.small_width), *layers]
    return nn.Sequential(*layers)


def _allreduces(counters: Any) -> tuple[int, int, int]:
    """The topocc group's all-reduces so far: planned, their bytes, and native."""
    tally = counters.by_collective.get("allreduce")
    return (tally.planned, tally.planned_bytes, tally.delegated) if tally else (0, 0, 0)


def _ddp_rows(world: Any, args: argparse.Namespace, gloo: Any) -> list[dict[str, Any]]:
    """Per model: the median step of DDP over topocc's world group and over ``gloo``, alternating."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.nn.parallel import DistributedDataParallel as DDP

    import topocc.runtime.distributed as td

    rows = []
    for large in (False, True):
        steps = {}
        for name, group in (("topocc", dist.group.WORLD), ("gloo", gloo)):
            model = DDP(_model(args, large), process_group=group, bucket_cap_mb=args.bucket_mib)
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)
            x = torch.randn(8, args.small_width)

            def step(model: Any = model, opt: Any = opt, x: Any = x) -> None:
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

            steps[name] = step
        before = _allreduces(td.counters())
        for fn in steps.values():  # warm-up: DDP rebuilds its buckets after the first step
            for _ in range(2):
                fn()
        times: dict[str, list[float]] = {"topocc": [], "gloo": []}
        for _ in range(args.steps):
            for name, fn in steps.items():
                world.Barrier()
                start = time.perf_counter()
                fn()
                times[name].append(world.allreduce(time.perf_counter() - start, op=MPI.MAX))
        after = _allreduces(td.counters())
        grads = sum(p.numel() * 4 for p in _model(args, large).parameters())
        rows.append({"what": "DDP step" + (" + large" if large else ""), "grad_bytes": grads,
                     "topocc": statistics.median(times["topocc"]), "gloo": statistics.median(times["gloo"]),
                     "planned": after[0] - before[0], "planned_bytes": after[1] - before[1],
                     "native": after[2] - before[2]})
        if world.Get_rank() == 0:
            print(f"  {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return rows


def _setup_rows(world: Any, args: argparse.Namespace, address: str) -> list[dict[str, Any]]:
    """Per try and backend, a fresh process per rank times its set-up; the slowest rank's time, per backend."""
    from mpi4py import MPI

    rank, size = world.Get_rank(), world.Get_size()
    times: dict[str, list[float]] = {"gloo": [], "topocc": []}
    for attempt in range(args.setup_tries + 1):  # the first try of each warms the file caches: not counted
        for backend in ("gloo", "topocc"):
            cmd = [sys.executable, __file__, "--child", backend, address, str(rank), str(size),
                   str(args.setup_kib), str(PORT + 2 + 4 * attempt + (backend == "topocc") * 2)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, timeout=600)
            lines = [line for line in done.stdout.splitlines() if line.startswith("SETUP ")]
            mine = float(lines[-1].split()[1]) if done.returncode == 0 and lines else float("nan")
            if done.returncode != 0:
                last = done.stderr.strip().splitlines()[-1:] or ["no output"]
                print(f"rank {rank}: {backend} set-up failed: {last[0]}", file=sys.stderr, flush=True)
            slowest = world.allreduce(mine, op=MPI.MAX)
            if attempt:
                times[backend].append(slowest)
    return [{"what": f"set-up ({size} ranks)", "topocc": statistics.median(times["topocc"]),
             "gloo": statistics.median(times["gloo"]), "tries": args.setup_tries}]


def child_main(backend: str, address: str, rank: int, size: int, kib: int, port: int) -> None:
    """One fresh process: from a barrier after ``import torch``, init_process_group and each collective's first
    call; prints ``SETUP seconds``.  Imports nothing of topocc (the backend comes from torch's autoloading)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    pre = dist.TCPStore(address, port + 1, size, rank == 0, timedelta(seconds=300))
    pre.add("arrived", 1)
    while int(pre.add("arrived", 0)) < size:
        time.sleep(0.0005)
    start = time.perf_counter()
    dist.init_process_group(backend, store=dist.PrefixStore("init/", pre), rank=rank, world_size=size,
                            timeout=timedelta(seconds=300))
    n = kib * 1024 // 4 // size * size
    dist.all_reduce(torch.ones(n))
    dist.reduce_scatter_tensor(torch.empty(n // size), torch.ones(n))
    dist.all_gather_into_tensor(torch.empty(n), torch.ones(n // size))
    dist.broadcast(torch.ones(n), 0)
    print(f"SETUP {time.perf_counter() - start:.6f}", flush=True)
    dist.destroy_process_group()
    # rank 0 serves the store: it leaves last, once every other rank has left
    pre.add("left", 1)
    while rank == 0 and int(pre.add("left", 0)) < size:
        time.sleep(0.001)


def rank_main(args: argparse.Namespace) -> None:
    """One rank: the DDP rows over one topocc world group, then the set-up rows; rank 0 prints ``RESULT``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    address = world.bcast(_interface_address(os.environ["GLOO_SOCKET_IFNAME"]) if rank == 0 else None)
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    if not args.setup_only:
        dist.init_process_group("topocc", init_method=f"tcp://{address}:{PORT}", rank=rank, world_size=size,
                                timeout=timedelta(seconds=900))
        gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=900))
        rows += _ddp_rows(world, args, gloo)
        dist.destroy_process_group()
    if args.setup_tries:
        rows += _setup_rows(world, args, address)
    if rank == 0:
        print("RESULT " + json.dumps({"rows": rows}), flush=True)


# ---------------------------------------------------------------------------------------------- the driver


def format_rows(name: str, rows: list[dict[str, Any]]) -> str:
    """The table: times in ms, gloo over topocc, and what the topocc group ran."""
    from topocc.planner.report.table import format_table

    out = []
    for r in rows:
        grads = f"{r['grad_bytes'] / MIB:.1f} MiB" if "grad_bytes" in r else "-"
        calls = (f"{r['planned']} planned ({r['planned_bytes'] / MIB:.1f} MiB), {r['native']} native"
                 if "planned" in r else f"{r['tries']} tries each")
        out.append((name, r["what"], grads, f"{1e3 * r['topocc']:,.0f}", f"{1e3 * r['gloo']:,.0f}",
                    f"{r['gloo'] / r['topocc']:.2f}", calls))
    return format_table(out, ("cluster", "what", "gradients", "topocc ms", "gloo ms", "gloo / topocc",
                              "topocc's all-reduces (warm-up and timed steps)"))


def targets(name: str, rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        ratio = r["topocc"] / r["gloo"]
        if r["what"].startswith("set-up"):
            out.append(f"{'met ' if ratio <= 1.2 else 'MISS'} {name} {r['what']}: topocc / gloo {ratio:.2f} "
                       "(target <= 1.20)")
        elif r["planned"] == 0:
            out.append(f"{'met ' if ratio <= 1.02 else 'MISS'} {name} {r['what']} (nothing planned): topocc / gloo "
                       f"{ratio:.2f} (target <= 1.02)")
        elif name.startswith("emu-racks") and "large" in r["what"]:
            speed = r["gloo"] / r["topocc"]
            out.append(f"{'met ' if speed >= 1.25 else 'MISS'} {name} {r['what']}: gloo / topocc {speed:.2f} "
                       "(target >= 1.25)")
    return out


def _warm_bytecode(env: dict[str, str]) -> None:
    """Compile what a rank imports into the bytecode cache the ranks use (an installed package ships it)."""
    code = ("import torch, torch.distributed, mpi4py.MPI, topocc.runtime.distributed, "
            "topocc.runtime.transports.gloo, topocc.runtime.communicator")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)


def run_cluster(name: str, args: argparse.Namespace, cache: str) -> list[dict[str, Any]] | None:
    """Compile the bundle for ``name`` as emulated, run the ranks (reading bytecode from ``cache``); the rows, or
    None when they failed."""
    from topocc.planner.compiler.bundling import compile_bundle, requests_for
    from topocc.planner.testbed.bench import run_emulated
    from topocc.planner.testbed.emulation import scaled_topology
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.runtime.bundle import save_bundle

    topology = resolve_topology(name)
    planned_for = resolve_topology(args.topology_file) if args.topology_file else scaled_topology(topology,
                                                                                                   args.scale)
    start = time.perf_counter()
    bundle, compiled = compile_bundle(planned_for, requests_for(topology.size, COLLECTIVES, 4 << 10, 64 * MIB))
    thresholds = ", ".join(f"{c.request.collective} from {c.native.native_below}" if c.native else "-"
                           for c in compiled)
    print(f"{name}: compiled the bundle in {time.perf_counter() - start:.0f} s; native below (bytes): "
          f"{thresholds}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_bundle(bundle, Path(tmp) / "bundle")
        cmd = [sys.executable, __file__, "--rank", str(Path(tmp) / "bundle"), *args.rank_args]
        env = {"PYTHONPYCACHEPREFIX": cache, "TOPOCC_PLAN": str(Path(tmp) / "bundle")}
        done = run_emulated(topology, cmd, scale=args.scale, timeout_s=7200, env=env,
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    for line in done.stderr.splitlines():  # a try that failed: its rank's one line (the rows show nan)
        if line.startswith("rank ") and " set-up failed: " in line:
            print(f"{name}: {line}", file=sys.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        print(f"{name}: the ranks failed (exit {done.returncode})\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    rows: list[dict[str, Any]] = json.loads(lines[-1].removeprefix("RESULT "))["rows"]
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=["emu-racks", "emu-uniform"])
    parser.add_argument("--topology-file", default=None, help="plan for this (calibrated) topology instead")
    parser.add_argument("--scale", type=float, default=None, help="emulated link rate = bandwidth x scale")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--small-layers", type=int, default=48)
    parser.add_argument("--small-width", type=int, default=128)
    parser.add_argument("--large-layers", type=int, default=4)
    parser.add_argument("--large-mib", type=float, default=16)
    parser.add_argument("--bucket-mib", type=float, default=0.25)
    parser.add_argument("--setup-kib", type=int, default=1024)
    parser.add_argument("--setup-tries", type=int, default=3, help="0: no set-up rows")
    parser.add_argument("--setup-only", action="store_true", help="time the set-up only")
    parser.add_argument("--rank", dest="bundle", default=None, help=argparse.SUPPRESS)  # set for the ranks
    parser.add_argument("--child", nargs=6, default=None, help=argparse.SUPPRESS)  # a set-up try's process
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        backend, address, rank, size, kib, port = args.child
        child_main(backend, address, int(rank), int(size), int(kib), int(port))
        return 0
    if args.bundle:
        rank_main(args)
        return 0
    from topocc.planner.testbed.emulation import DEFAULT_SCALE, emulation_available
    from topocc.runtime.errors import TopoccError

    if (why := emulation_available()) is not None:
        print(f"cannot emulate a cluster here: {why}", file=sys.stderr)
        return 1
    args.scale = args.scale or DEFAULT_SCALE
    args.rank_args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                      if k in ("steps", "small_layers", "small_width", "large_layers", "large_mib", "bucket_mib",
                               "setup_kib", "setup_tries")] + (["--setup-only"] if args.setup_only else [])
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        _warm_bytecode({**env, "PYTHONPYCACHEPREFIX": cache})
        try:
            results = {name: run_cluster(name, args, cache) for name in args.topologies}
        except TopoccError as exc:  # an unknown topology, a bundle that does not compile: one line, no traceback
            print(f"ddp_step_bench: {exc}", file=sys.stderr)
            return 2
    print(f"times: the slowest rank's, median; inter-host links at x{args.scale:g} of their bandwidth; "
          f"{os.cpu_count()} cores shared by every rank (and whatever else runs on the machine)")
    for name, rows in results.items():
        if rows is not None:
            print(format_rows(name, rows))
    lines = [line for name, rows in results.items() if rows is not None for line in targets(name, rows)]
    print("\n".join(lines))
    return 0 if all(rows is not None for rows in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
