"""Compressed vs exact planned all-reduce on an emulated cluster whose time is set by its slow rack uplinks.

Compiles the planned (``auto``) all-reduce for the topology (default: the shipped emu-racks, 12 ranks in
3 racks whose 50 Gbit/s uplinks set the time), then :func:`topocc.planner.compiler.compress.compress`
variants of it (default: bf16, int8 and top-k 1% on the inter-rack hops, and int8 and top-k 1% on every
inter-host hop), and runs them all, one after another, over MPI on the emulated cluster (each host a
network namespace, inter-host links shaped to bandwidth x ``--scale``).  Each row: the slowest rank's
mean time, its ratio to the exact plan's, the simulator's predicted ratio (on the scaled topology), the
relative L2 error of the result against the exact plan's result, and whether every rank ended with
bitwise the same result.  Targets (64 MiB float32): bf16 <= 0.6x, int8 <= 0.35x, top-k 1% <= 0.15x the
exact plan's time, on the inter-rack hops.

Needs root (network namespaces), MPICH and mpi4py.  A 64 MiB call at the default scale takes seconds: the
default iterations fit about 10 minutes.  ``--codecs`` only measures the encodings' throughput here
(numpy, one core; no root), the figures :mod:`topocc.runtime.encoding` takes as its defaults.

    sudo .venv/bin/python benchmarks/compression_bench.py [--size 67108864] [--iters 2]
    .venv/bin/python benchmarks/compression_bench.py --codecs
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

TARGETS = {"bf16@inter-rack": 0.6, "int8@inter-rack": 0.35, "topk:1%@inter-rack": 0.15}
POLICIES = ["bf16@inter-rack", "int8@inter-rack", "topk:1%@inter-rack", "int8@inter-host", "topk:1%@inter-host"]
ROW = "ROW "


def codec_table(elements: int = 1 << 20, repeats: int = 5) -> str:
    """Encode and decode throughput of every encoding on float32 messages, best of ``repeats``, beside a copy."""
    from topocc.planner.report.table import format_table
    from topocc.runtime.encoding import parse_encoding

    x = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    y = np.empty_like(x)
    copy = min(_timed(lambda: np.copyto(y, x)) for _ in range(repeats))
    rows = []
    for spec in ("bf16", "fp16", "int8", "topk:0.01"):
        codec = parse_encoding(spec)
        wire = np.empty(codec.wire_bytes(x.size, x.itemsize), np.uint8)
        enc = min(_timed(lambda c=codec, w=wire: c.encode(x, w)) for _ in range(repeats))
        dec = min(_timed(lambda c=codec, w=wire: c.decode(w, y)) for _ in range(repeats))
        rows.append((codec.spec, f"{wire.nbytes / x.nbytes:.3f}", f"{x.nbytes / enc / 1e9:.2f}",
                     f"{x.nbytes / dec / 1e9:.2f}", f"{x.nbytes / (enc + dec) / 1e9:.2f}",
                     f"{(enc + dec) / copy:.1f}", f"{codec.default_Bps / 1e9:.2f}", f"{codec.cost:g}"))
    head = f"# encodings on {x.nbytes >> 20} MiB of float32, numpy on one core; copy {x.nbytes / copy / 1e9:.1f} GB/s"
    return head + "\n" + format_table(rows, ("encoding", "wire/exact", "encode GB/s", "decode GB/s", "both GB/s",
                                             "copies", "default GB/s", "default cost"), "<>>>>>>>")


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rank_main(folder: Path, size: int, iters: int, warmup: int) -> int:
    """One rank (under mpiexec): every schedule of ``folder`` in name order, on the same input; rank 0 prints a
    row per schedule."""
    from mpi4py import MPI

    from topocc.runtime import Communicator

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    x = np.random.default_rng([7, rank]).standard_normal(size // 4).astype(np.float32)
    buf = np.empty_like(x)
    reference: np.ndarray | None = None
    for path in sorted(folder.glob("*.json")):
        comm = Communicator(path, timeout=600.0)
        times = []
        for i in range(warmup + iters):
            np.copyto(buf, x)
            world.Barrier()
            start = time.perf_counter()
            comm.allreduce(buf)
            elapsed = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if i >= warmup:
                times.append(elapsed)
        comm.close()
        if reference is None:
            reference = buf.astype(np.float64)
        error = float(np.linalg.norm(buf - reference) / np.linalg.norm(reference))
        digests = world.allgather(zlib.crc32(buf.tobytes()))
        if rank == 0:
            print(ROW + json.dumps({"name": path.stem, "time_s": float(np.mean(times)), "iters": iters,
                                    "error": error, "consistent": len(set(digests)) == 1}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="emu-racks")
    parser.add_argument("--size", type=int, default=64 << 20, help="bytes of float32 per rank")
    parser.add_argument("--policy", action="append", default=None, help="a compression policy (repeatable)")
    parser.add_argument("--scale", type=float, default=None)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--codecs", action="store_true", help="only measure the encodings' throughput here")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--rank", default=None, help=argparse.SUPPRESS)  # the per-rank entry, under mpiexec
    args = parser.parse_args(argv)
    if args.rank:
        return rank_main(Path(args.rank), args.size, args.iters, args.warmup)
    if args.codecs:
        print(codec_table())
        return 0
    return _drive(args)


def _drive(args: argparse.Namespace) -> int:
    from topocc.planner.analysis.simulate import simulate
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.compiler.compress import compress
    from topocc.planner.compiler.options import Options
    from topocc.planner.routing.network import network_of
    from topocc.planner.testbed.emulation import DEFAULT_SCALE, EmulatedCluster, emulation_available
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.runtime.harness.launch import find_mpiexec, worker_env
    from topocc.runtime.schedule import save_schedule

    why = emulation_available()
    if why is not None:
        print(f"compression_bench: cannot emulate here: {why} (--codecs runs without root)", file=sys.stderr)
        return 2
    scale = args.scale or DEFAULT_SCALE
    topology = resolve_topology(args.topology)
    net = network_of(topology)
    start = time.monotonic()
    exact = compile_schedule(net, "allreduce", "auto", Options(size_bytes=args.size))
    variants: list[tuple[str, Any, int]] = [("exact", exact.schedule, 0)]
    for policy in args.policy or POLICIES:
        done = compress(net, exact, policy)
        variants.append((policy, done.compiled.schedule, done.report.encoded_messages))
    print(f"{topology.name}: {exact.schedule.metadata.algorithm} plan, {len(variants) - 1} compressed variants "
          f"(compiled in {time.monotonic() - start:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp, EmulatedCluster(topology, scale=scale) as cluster:
        for j, (_, schedule, _) in enumerate(variants):
            save_schedule(schedule, Path(tmp) / f"{j}.json")
        scaled = cluster.scaled_topology()
        predicted = [simulate(scaled, schedule, args.size).time_s for _, schedule, _ in variants]
        budget = 300.0 + 4 * (args.iters + args.warmup) * sum(predicted)
        cmd = cluster.mpiexec_command([str(Path(__file__).resolve()), "--rank", tmp, "--size", str(args.size),
                                       "--iters", str(args.iters), "--warmup", str(args.warmup)],
                                      env={"OMP_NUM_THREADS": "1"}, mpiexec=find_mpiexec())
        proc = cluster.run(cmd, timeout_s=budget, env=worker_env())
    rows = {int(r["name"]): r for r in (json.loads(line.removeprefix(ROW)) for line in proc.stdout.splitlines()
                                        if line.startswith(ROW))}
    if proc.returncode or len(rows) != len(variants):
        print(f"compression_bench: the run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return 1
    print(_table(topology.name, scale, args.size, variants, predicted, rows))
    if args.json:
        Path(args.json).write_text(json.dumps([{"policy": name, "encoded_messages": n, "predicted_time_s": p,
                                                **rows[j]} for j, ((name, _, n), p)
                                               in enumerate(zip(variants, predicted))], indent=1))
    return 0


def _table(name: str, scale: float, size: int, variants: list[tuple[str, Any, int]], predicted: list[float],
           rows: dict[int, dict[str, Any]]) -> str:
    from topocc.planner.report.table import format_table
    from topocc.planner.units import format_size, format_time

    exact_s, exact_p = rows[0]["time_s"], predicted[0]
    cells, verdicts = [], []
    for j, (policy, _, messages) in enumerate(variants):
        r = rows[j]
        ratio = r["time_s"] / exact_s
        cells.append((policy, messages, format_time(r["time_s"]), f"{ratio:.3f}", f"{predicted[j] / exact_p:.3f}",
                      f"{r['error']:.3g}", "yes" if r["consistent"] else "NO", r["iters"]))
        if policy in TARGETS:
            met = ratio <= TARGETS[policy]
            verdicts.append(f"{'met ' if met else 'MISS'} {policy}: {ratio:.3f} of exact (target <= {TARGETS[policy]})")
    head = (f"# allreduce of {format_size(size)} float32 on emulated {name} (inter-host bandwidth x{scale:g}); "
            "time: slowest rank's mean; ratio: to the exact plan's time; predicted: the simulator's ratio on the "
            "scaled topology; error: relative L2 against the exact plan's result; consistent: every rank bitwise "
            "equal")
    table = format_table(cells, ("policy", "encoded msgs", "time", "ratio", "predicted", "rel L2 error",
                                 "consistent", "iters"), "<>>>>><>")
    return head + "\n" + table + "\ntargets:\n" + "\n".join("  " + v for v in verdicts)


if __name__ == "__main__":
    sys.exit(main())
