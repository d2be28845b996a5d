"""The lowered replay over NCCL against NCCL's own all-reduce, on one GPU: plain and on emulated clusters.

For each configuration and size (float32 all-reduce, 1, 16, 64 and 256 MiB by default) it prints a table:
the topocc replay's time per call, NCCL's ``ncclAllReduce`` on the same communicator and data, their
ratio, the simulator's prediction, and the largest difference between the two results.

Configurations:

* ``plain``: ``--ranks`` processes (4) on the one GPU, each with its own ``NCCL_HOSTID``, so NCCL joins them
  through loopback sockets; the schedule is the planner's ring on a switch of as many single-GPU hosts (the
  algorithm NCCL itself runs).  No prediction: the planner has no model of loopback sockets.
* ``emu-uniform``, ``emu-racks``: the shipped topology emulated as ``topocc emulate`` does for MPI
  (``topocc.planner.testbed.emulation``: a network namespace per host, veth pairs and bridges, a token bucket on every
  inter-host link at ``--scale`` of its bandwidth); each rank runs in its host's namespace with
  ``NCCL_SOCKET_IFNAME`` on the host's interface, so traffic between hosts crosses the shaped links and
  traffic inside a host takes its loopback.  The schedule is the shipped one (``schedules/``); the
  prediction is ``topocc.planner.analysis.simulate`` on the scaled topology.  Needs root and iproute2 (``ip``, ``tc``).

Before launching, the schedule and its lowering at every size are proved (``topocc.planner.analysis.verify``,
``topocc.planner.analysis.verify_lowered``).  Ranks meet through a ``FileStore`` (no ``mpiexec``); rank 0 reports.
``--backend gloo`` runs the same on CPU tensors (the dataflow replay over gloo against gloo's all-reduce):
that is how the tests exercise this script without a GPU.  ``--probe`` first times one group of sends and
receives through CuPy's NCCL bindings and through ``torch.distributed.batch_isend_irecv``, the measurement
behind the transport's choice of library.  ``--profile`` times one more call per size with an event
around every NCCL group and prints where it went: the host's enqueueing, the time inside groups (waiting
for peers and moving data) and between them (the reductions and copies), and the slowest groups.

    python benchmarks/gpu_bench.py [--configs plain emu-uniform emu-racks] [--sizes 1 16 64 256] [--probe]
                                   [--profile]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MIB = 1 << 20
CONFIGS = ("plain", "emu-uniform", "emu-racks")
#: Inter-host links at 1% of their bandwidth: emu-racks' 100 Gbit/s NICs run at 1 Gbit/s, slow enough that
#: NCCL's sockets fill the shaped links (the network, not the host, limits the run), fast enough that the
#: largest size takes seconds.
DEFAULT_SCALE = 1e-2
#: Seconds a rank may wait for a peer: well above the slowest call (the largest size on emu-racks at the
#: default scale), so that only a dead or hung peer reaches it.
TIMEOUT_S = 180.0

PLAIN_TOPOLOGY = """
name: plain-{ranks}
description: {ranks} single-GPU hosts on one switch (ranks on one GPU over loopback sockets)
cluster:
  hosts: {ranks}
  host:
    gpus: 1
    nics: 1
    nic: {{bandwidth: 10 Gbit/s, latency: 10 us, kind: ethernet}}
  network: {{type: single-switch}}
"""


@dataclass(frozen=True, slots=True)
class Row:
    """One size of one configuration: what the ranks measured and what the planner predicted."""

    config: str
    size: int
    algorithm: str
    groups: int
    time_s: float
    native_s: float
    predicted_s: float | None
    max_error: float
    iters: int
    profile: dict[str, Any] | None = None

    @property
    def ratio(self) -> float:
        return self.time_s / self.native_s if self.native_s else float("nan")


# --------------------------------------------------------------------------- driver


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--sizes", nargs="+", type=int, default=[1, 16, 64, 256], help="MiB")
    p.add_argument("--ranks", type=int, default=4, help="ranks of the plain configuration")
    p.add_argument("--scale", type=float, default=DEFAULT_SCALE, help="emulated link rates x this")
    p.add_argument("--budget", type=float, default=3.0, help="seconds of timed calls per size and side, at most")
    p.add_argument("--max-iters", type=int, default=20)
    p.add_argument("--group-bytes", type=int, default=None, help="bytes per stream and group (the lowering's)")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--probe", action="store_true", help="first time one NCCL group via CuPy and via torch")
    p.add_argument("--wait", choices=("poll", "cuda"), default="poll",
                   help="how ranks wait for the GPU: poll an event with short sleeps (default), or "
                        "torch.cuda.synchronize (spins a core per rank)")
    p.add_argument("--profile", action="store_true",
                   help="time one more call group by group on the GPU (NCCL): where the time goes")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    if args.ranks < 2 or any(s < 1 for s in args.sizes) or not args.scale > 0 or args.max_iters < 1:
        p.error("--ranks needs at least 2, --sizes positive MiB, --scale above 0, --max-iters at least 1")
    return args


def schedule_for(config: str, ranks: int) -> tuple[Any, Any]:
    """(topology, schedule) of a configuration: the planner's ring for plain, the shipped schedule otherwise."""
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.options import Options
    from topocc.planner.routing.network import Network
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.planner.topology.parse import parse_topology_text
    from topocc.runtime.schedule import load_schedule

    if config == "plain":
        topology = parse_topology_text(PLAIN_TOPOLOGY.format(ranks=ranks), f"plain-{ranks}")
        net = Network(topology)
        return topology, ALGORITHMS["ring"].load()(net, "allreduce", Options(size_bytes=64 * MIB))
    return resolve_topology(config), load_schedule(REPO / "schedules" / f"{config}-allreduce.json")


def prove(schedule: Any, sizes_bytes: Sequence[int], group_bytes: int) -> dict[int, int]:
    """Prove the schedule and its lowering at each size; the NCCL groups of the busiest rank, by size."""
    from topocc.planner.analysis.verify import verify
    from topocc.planner.analysis.verify_lowered import verify_lowering

    verify(schedule)
    return {size: verify_lowering(schedule, lowering_at(schedule, size, group_bytes)).max_groups
            for size in sizes_bytes}


def lowering_at(schedule: Any, size: int, group_bytes: int) -> Any:
    """The lowering the runtime replays ``schedule`` with at ``size`` bytes of float32."""
    from topocc.runtime.lowering import chunks_per_round_for, lower

    chunk = -(-size // 4 // schedule.input_chunks) * 4  # float32: the largest chunk, as the runtime cuts it
    return lower(schedule, chunks_per_round_for(chunk, group_bytes))


def predicted(topology: Any, schedule: Any, size: int, scale: float, group_bytes: int) -> float:
    """The simulator's time for the program NCCL runs: the schedule lowered into groups as the runtime lowers
    it at this size, on the emulated (scaled) topology, by its calibrated model where it has one."""
    from topocc.planner.analysis.lowered import as_lowered
    from topocc.planner.analysis.simulate import simulate
    from topocc.planner.testbed.emulation import scaled_topology

    lowered = as_lowered(schedule, lowering_at(schedule, size, group_bytes))
    return simulate(scaled_topology(topology, scale), lowered, size).time_s


def rank_command(rank: int, world: int, store: str, backend: str, schedule: str, sizes: Sequence[int],
                 budget: float, max_iters: int, group_bytes: int, probe: bool, profile: bool = False,
                 wait: str = "poll") -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "rank", str(rank), str(world), store, backend, schedule,
            ",".join(map(str, sizes)), str(budget), str(max_iters), str(group_bytes), "probe" if probe else "-",
            "profile" if profile else "-", wait]


def rank_env(rank: int, interface: str | None) -> dict[str, str]:
    """Each rank its own NCCL host (so ranks may share a GPU); on an emulated host, its interface."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "NCCL_HOSTID": f"topocc-host{rank}", "OMP_NUM_THREADS": "1"}
    if interface is not None:
        env.update(NCCL_SOCKET_IFNAME=interface, GLOO_SOCKET_IFNAME=interface, NCCL_IB_DISABLE="1")
    else:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def run_ranks(commands: Sequence[tuple[list[str], dict[str, str]]], limit: float) -> dict[str, Any]:
    """Start every rank, wait at most ``limit`` seconds, return rank 0's RESULT (or raise with the errors)."""
    from topocc.runtime.harness.launch import spawn_ranks

    done = spawn_ranks(commands, limit_s=limit)
    lines = [line for line in done[0].stdout.splitlines() if line.startswith("RESULT ")]
    failed = [(r, p.returncode, p.stderr) for r, p in enumerate(done) if p.returncode != 0]
    if failed or not lines:
        detail = "; ".join(f"rank {r} exit {code}: {' | '.join(err.strip().splitlines()[-2:])}"
                           for r, code, err in failed[:4])
        raise RuntimeError(detail or "rank 0 reported nothing")
    return json.loads(lines[-1].removeprefix("RESULT "))


def run_config(config: str, args: argparse.Namespace) -> list[Row]:
    """Prove, launch (in an emulated cluster where asked), and collect one configuration's rows."""
    from topocc.planner.testbed.emulation import EmulatedCluster, emulation_available
    from topocc.runtime.lowering import DEFAULT_GROUP_BYTES
    from topocc.runtime.schedule import save_schedule

    topology, schedule = schedule_for(config, args.ranks)
    sizes = [s * MIB for s in args.sizes]
    group_bytes = args.group_bytes or DEFAULT_GROUP_BYTES
    groups = prove(schedule, sizes, group_bytes)
    emulated = config != "plain"
    if emulated and (why := emulation_available()) is not None:
        raise RuntimeError(f"cannot emulate {config} here: {why}")
    with tempfile.TemporaryDirectory(prefix="topocc-gpu-bench-") as tmp:
        path = str(Path(tmp) / "schedule.json")
        save_schedule(schedule, path)
        store = str(Path(tmp) / "store")
        world = schedule.ranks

        def command(rank: int) -> list[str]:
            return rank_command(rank, world, store, args.backend, path, sizes, args.budget, args.max_iters,
                                group_bytes, args.probe and config == "plain", args.profile, args.wait)

        limit = 120.0 + len(sizes) * (4 * args.budget + 6 * TIMEOUT_S / 4)
        if emulated:
            with EmulatedCluster(topology, scale=args.scale) as cluster:
                commands = [(cluster.host_command(cluster.host_of(r), command(r)),
                             rank_env(r, cluster.host_of(r).interface)) for r in range(world)]
                report = run_ranks(commands, limit)
                try:  # a diagnostic: never lose the configuration's rows to it
                    print(format_link_stats(config, cluster.link_stats()), flush=True)
                except Exception as exc:
                    print(f"# {config} network: no statistics ({exc})", flush=True)
        else:
            report = run_ranks([(command(r), rank_env(r, None)) for r in range(world)], limit)
    if report.get("probe"):
        print(format_probe(report["probe"]), flush=True)
    return [Row(config, m["size"], schedule.metadata.algorithm, groups[m["size"]], m["time_s"], m["native_s"],
                predicted(topology, schedule, m["size"], args.scale, group_bytes) if emulated else None,
                m["max_error"],
                m["iters"], m.get("profile")) for m in report["rows"]]


def format_table(rows: Sequence[Row], title: str) -> str:
    """One configuration's rows: times in ms, the ratio, the prediction and the largest difference."""
    lines = [f"# {title}",
             f"#{'size':>9} {'algorithm':>13} {'groups':>6} | {'topocc(ms)':>11} {'native(ms)':>10} {'ratio':>6} | "
             f"{'predicted(ms)':>13} {'vs pred':>7} | {'max error':>9} {'iters':>5}"]
    for r in rows:
        if r.predicted_s:
            pred = f"{r.predicted_s * 1e3:13.1f} {r.time_s / r.predicted_s:6.2f}x"
        else:
            pred = f"{'n/a':>13} {'':>7}"
        lines.append(f" {r.size // MIB:>5} MiB {r.algorithm:>13} {r.groups:>6} | {r.time_s * 1e3:11.1f} "
                     f"{r.native_s * 1e3:10.1f} {r.ratio:6.2f} | {pred} | {r.max_error:9.2g} {r.iters:>5}")
    lines += [format_profile(r) for r in rows if r.profile]
    return "\n".join(lines)


def format_profile(row: Row) -> str:
    """Where one call's time went (rank 0's stream; host figures are the slowest rank's)."""
    p = row.profile or {}
    if "error" in p:
        return f"#   profile {row.size // MIB} MiB: {p['error']}"
    slowest = ", ".join(f"#{i} {ms:.1f} ms (peers {peers}, {size >> 10} KiB)" for i, ms, peers, size in p["slowest"])
    return (f"#   profile {row.size // MIB} MiB: host enqueue {p['enqueue_ms']:.1f} ms, call {p['wall_ms']:.1f} ms; "
            f"GPU {p['gpu_ms']:.1f} ms = {p['groups']} groups {p['in_groups_ms']:.1f} ms + between them "
            f"{p['between_ms']:.1f} ms; slowest groups: {slowest}")


def format_link_stats(config: str, stats: dict[str, dict[str, int]]) -> str:
    """One line on what the shaped links did during the configuration's calls: bytes, drops, TCP retransmits."""
    ends = {k: v for k, v in stats.items() if "sent_bytes" in v}
    drops = sorted(((v["dropped"], k) for k, v in ends.items() if v["dropped"]), reverse=True)
    retrans = {k: v["tcp_retransmitted"] for k, v in stats.items() if "tcp_retransmitted" in v}
    worst = ", ".join(f"{k} {n}" for n, k in drops[:4])
    return (f"# {config} network: {sum(v['sent_bytes'] for v in ends.values()) / MIB:.0f} MiB through "
            f"{len(ends)} shaped wire ends, {sum(n for n, _ in drops)} packets dropped by their token buckets"
            f"{' (' + worst + ')' if worst else ''}, {sum(retrans.values())} TCP segments retransmitted "
            f"(per host: {', '.join(str(n) for n in retrans.values())})")


def format_probe(probe: Sequence[dict[str, Any]]) -> str:
    lines = ["# one NCCL group (send to the next rank, receive from the previous), microseconds per group",
             f"#{'bytes':>10} {'cupy.cuda.nccl':>15} {'torch batch_isend_irecv':>24}"]
    for p in probe:
        torch_us = f"{p['torch_us']:24.1f}" if p["torch_us"] is not None else f"{'n/a':>24}"
        lines.append(f" {p['bytes']:>10} {p['cupy_us']:15.1f} {torch_us}")
    return "\n".join(lines)


def title(config: str, args: argparse.Namespace, ranks: int) -> str:
    where = {"plain": f"{ranks} ranks on one GPU over loopback sockets"}.get(
        config, f"{config}: {ranks} ranks in emulated hosts, inter-host links at {args.scale:g} x bandwidth")
    return f"{where}; float32 allreduce; backend {args.backend}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    all_rows: list[Row] = []
    status = 0
    for config in args.configs:
        start = time.monotonic()
        try:
            rows = run_config(config, args)
        except RuntimeError as exc:
            print(f"# {config}: FAILED: {exc}", flush=True)
            status = 1
            continue
        all_rows += rows
        ranks = args.ranks if config == "plain" else schedule_for(config, args.ranks)[1].ranks
        print(format_table(rows, title(config, args, ranks)) + f"\n# ({time.monotonic() - start:.0f} s)\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "ratio": r.ratio} for r in all_rows], indent=1))
    return status


# --------------------------------------------------------------------------- one rank


def rank_main(argv: Sequence[str]) -> int:
    """Time the replay and the native all-reduce at each size; rank 0 prints ``RESULT {json}``."""
    import torch
    import torch.distributed as dist

    from topocc.runtime.communicator import Communicator
    from topocc.runtime.errors import TopoccError

    rank, world, store_path, backend, schedule = int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4]
    sizes = [int(s) for s in argv[5].split(",")]
    budget, max_iters, group_bytes, probe = float(argv[6]), int(argv[7]), int(argv[8]), argv[9] == "probe"
    profile, wait = argv[10] == "profile" and backend == "nccl", argv[11]
    store = dist.FileStore(store_path, world)
    try:
        if backend == "nccl":
            from topocc.runtime.transports.nccl import NCCLTransport
            from topocc.runtime.transports.store import StoreControl

            transport: Any = NCCLTransport(StoreControl(store, rank, world), timeout=TIMEOUT_S)
            device = transport.device
        else:
            from datetime import timedelta

            from topocc.runtime.transports.gloo import GlooTransport

            dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world,
                                    timeout=timedelta(seconds=4 * TIMEOUT_S))
            transport, device = GlooTransport(timeout=TIMEOUT_S), torch.device("cpu")
        comm = Communicator(schedule, transport=transport, timeout=TIMEOUT_S, group_bytes=group_bytes)
        report: dict[str, Any] = {"rows": [_measure(comm, transport, device, size, budget, max_iters, profile,
                                                    wait) for size in sizes]}
        if probe and backend == "nccl":
            report["probe"] = _probe(transport, store, rank, world, device)
        comm.close()
    except TopoccError as err:
        os.write(2, f"topocc: {err.one_line()}\n".encode())
        return err.exit_code
    if rank == 0:
        print("RESULT " + json.dumps(report), flush=True)
    return 0


def gpu_waiter(how: str) -> Any:
    """How a rank waits for its GPU work: ``cuda`` (``torch.cuda.synchronize``, which spins a core) or
    ``poll`` (an event queried with short sleeps: ranks spinning beside NCCL's busy proxy threads can take
    more cores than the machine has, and descheduled proxies stall every handshake)."""
    import torch

    from topocc.runtime.transports.torch_ops import wait_for_gpu

    return torch.cuda.synchronize if how == "cuda" else wait_for_gpu


def _measure(comm: Any, transport: Any, device: Any, size: int, budget: float, max_iters: int,
             profile: bool = False, wait: str = "poll") -> dict[str, Any]:
    import torch

    from topocc.runtime.harness.baselines import native

    sync = gpu_waiter(wait) if device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(1000 * comm.rank + size % 997)
    x = torch.randn(size // 4, generator=g).to(device)
    ref = x.clone()
    native(transport, "allreduce", ref, ref, "sum", 0)
    buf = x.clone()

    def ours() -> None:
        buf.copy_(x)
        comm.allreduce(buf)
        sync()

    def library() -> None:
        buf.copy_(x)
        native(transport, "allreduce", buf, buf, "sum", 0)
        sync()

    ours()  # set-up, handshake and warm-up
    error = transport.max_float(float((buf - ref).abs().max()))

    def timed(fn: Any, iters: int) -> float:
        transport.barrier(TIMEOUT_S)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return transport.max_float((time.perf_counter() - start) / iters)

    first = (timed(ours, 1), timed(library, 1))
    iters = max(1, min(max_iters, int(budget / max(first))))  # every rank computes it from the same maxima
    mine, theirs = first if iters == 1 else (timed(ours, iters), timed(library, iters))
    row = {"size": size, "time_s": mine, "native_s": theirs, "max_error": error, "iters": iters}
    if profile:
        buf.copy_(x)
        row["profile"] = _profile(comm, transport, buf)
    return row


def _profile(comm: Any, transport: Any, buf: Any) -> dict[str, Any]:
    """One more call with an event around every NCCL group: host enqueue time, time in and between groups."""
    import torch

    torch.cuda.synchronize()
    transport.barrier(TIMEOUT_S)
    transport.group_events = []
    start = time.perf_counter()
    comm.allreduce(buf)
    enqueue = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events, transport.group_events = transport.group_events, None
    enqueue_ms, wall_ms = transport.max_float(enqueue * 1e3), transport.max_float(wall * 1e3)
    if not events:
        return {"error": "no NCCL groups were posted"}
    inside = [before.elapsed_time(after) for before, after, _ in events]
    between = [a[1].elapsed_time(b[0]) for a, b in itertools.pairwise(events)]
    slowest = sorted(range(len(inside)), key=lambda i: -inside[i])[:5]
    return {"enqueue_ms": enqueue_ms, "wall_ms": wall_ms, "gpu_ms": events[0][0].elapsed_time(events[-1][1]),
            "groups": len(events), "in_groups_ms": sum(inside), "between_ms": sum(between),
            "slowest": [(i, inside[i], sorted({m.peer for m in events[i][2]}),
                         sum(m.nbytes for m in events[i][2])) for i in slowest]}


#: groups per probe measurement
_PROBE_GROUPS = 200


def _groups(how: str, transport: Any, send: Any, recv: Any, nxt: int, prv: int) -> None:
    """``_PROBE_GROUPS`` ring steps, through our transport (CuPy) or torch's ``batch_isend_irecv``; then sync."""
    import torch
    import torch.distributed as dist

    if how == "cupy_us":
        messages = [transport.send_init(send, nxt, 0), transport.recv_init(recv, prv, 1)]
        with transport.ordered():
            for _ in range(_PROBE_GROUPS):
                transport.group(messages, time.monotonic() + TIMEOUT_S)
    else:
        for _ in range(_PROBE_GROUPS):
            ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
    torch.cuda.synchronize()


def _probe(transport: Any, store: Any, rank: int, world: int, device: Any) -> list[dict[str, Any]]:
    """Microseconds per group of one send and one receive (a ring step): CuPy's NCCL vs torch's batch_isend_irecv."""
    import torch
    import torch.distributed as dist

    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = []
    try:
        dist.init_process_group("nccl", store=dist.PrefixStore("probe", store), rank=rank, world_size=world,
                                device_id=device)
    except Exception:  # a torch without NCCL: measure CuPy alone
        initialized = False
    else:
        initialized = True
    for nbytes in (64 << 10, 4 << 20):
        send = torch.ones(nbytes, dtype=torch.uint8, device=device)
        recv = torch.empty(nbytes, dtype=torch.uint8, device=device)
        row: dict[str, Any] = {"bytes": nbytes, "torch_us": None}
        for name in ("cupy_us", "torch_us") if initialized else ("cupy_us",):
            _groups(name, transport, send, recv, nxt, prv)  # warm-up: connects the pairs
            transport.barrier(TIMEOUT_S)
            start = time.perf_counter()
            _groups(name, transport, send, recv, nxt, prv)
            row[name] = transport.max_float((time.perf_counter() - start) / _PROBE_GROUPS * 1e6)
        out.append(row)
    if initialized:
        dist.destroy_process_group()
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        sys.exit(rank_main(sys.argv[2:]))
    from topocc.runtime.harness.launch import exit_on_sigterm

    exit_on_sigterm()  # a `timeout` on this launcher takes its ranks along
    sys.exit(main())
