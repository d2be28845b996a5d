"""Time MPICH's MPI_Allreduce on an emulated cluster at several scales, and say which regime each ran in.

On one small machine the emulated network is only meaningful while it, not the CPUs, limits the run.
For each scale this builds the cluster (:class:`topocc.planner.testbed.emulation.EmulatedCluster`), runs a 16 MiB
float32 allreduce over all ranks a few times, and reports the measured time beside the simulator's
prediction for a ring on the scaled topology and the planner's lower bound, and how busy the busiest
shaped port was (bytes through its token bucket / (its rate x the time): how well MPICH's algorithm
uses the bottleneck).  The regime comes from fitting ``time = a / scale + c`` over the scales: the
share ``(a / scale) / time`` is the part of the run the emulated network accounts for, ``c`` what
the CPUs and start-up add whatever the rates.  Needs root.

    sudo /work/venv/bin/python benchmarks/emulate_probe.py [--topology T.yaml] [--scales 4e-3 1e-3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.testbed.emulation import EmulatedCluster, emulation_available, scaled_topology
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import load_topology
from topocc.runtime.errors import TopoccError

REPO = Path(__file__).resolve().parent.parent
#: A run is network-bound when at least this share of its time shrinks in proportion to the link rates.
NETWORK_BOUND_SHARE = 0.75

JOB = textwrap.dedent("""\
    import json, sys, time
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    count, iters = int(sys.argv[1]), int(sys.argv[2])
    send = np.full(count, comm.rank + 1, dtype=np.float32)
    recv = np.empty_like(send)
    comm.Allreduce(send[:1], recv[:1])  # connect before timing
    times = []
    for _ in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(send, recv)
        times.append(time.perf_counter() - start)
    slowest = np.empty(iters)
    comm.Allreduce(np.array(times), slowest, op=MPI.MAX)  # the slowest rank's time for each run
    expected = comm.size * (comm.size + 1) / 2
    if comm.rank == 0:
        print("RESULT " + json.dumps({"times": slowest.tolist(), "ok": bool(np.all(recv == expected))}), flush=True)
    """)


@dataclass(frozen=True)
class Row:
    """One scale's figures."""

    scale: float
    host_mbit: float
    uplink_mbit: float
    times: list[float]
    ring_s: float
    bound_s: float
    busiest: str
    utilisation: float


def port_bytes(cluster: EmulatedCluster) -> dict[tuple[str, str], int]:
    """Bytes sent so far through every shaped port, by (namespace, device)."""
    out: dict[tuple[str, str], int] = {}
    for ns in cluster.plan.namespaces:
        text = subprocess.run(["tc", "-s", "-n", ns, "qdisc", "show"], capture_output=True, text=True, timeout=10,
                              check=True).stdout
        for dev, sent in re.findall(r"qdisc tbf \S+ dev (\S+) .*\n\s*Sent (\d+) bytes", text):
            out[(ns, dev)] = int(sent)
    return out


def port_rates(cluster: EmulatedCluster) -> dict[tuple[str, str], tuple[float, str]]:
    """Shaped rate (bytes/s) and direction (``leaf0->spine0``) of every port, by (namespace, device)."""
    rates = {}
    for w in cluster.plan.wires:
        a, b = (end.removeprefix("host ") for end in w.what.split(" <-> "))
        rates[(w.a_ns, w.a_dev)] = (w.a_rate, f"{a}->{b}")
        rates[(w.b_ns, w.b_dev)] = (w.b_rate, f"{b}->{a}")
    return rates


def measure(topology: Topology, scale: float, size: int, iters: int, workdir: Path) -> Row:
    """Build the cluster at ``scale``, run the allreduce job, and gather the figures."""
    scaled = scaled_topology(topology, scale)
    options = Options(size_bytes=size)
    ring_s = compile_schedule(scaled, "allreduce", "ring", options).sim.time_s
    bound_s = lower_bound(scaled, "allreduce", size, 0).time_s
    job = workdir / "allreduce_job.py"
    job.write_text(JOB)
    with EmulatedCluster(topology, scale=scale) as cluster:
        rates = port_rates(cluster)
        host_rate = max(w.b_rate for w in cluster.plan.wires if w.b_dev == cluster.hosts[0].interface)
        uplinks = [w.a_rate for w in cluster.plan.wires if w.a_dev.startswith("s")]
        before = port_bytes(cluster)
        cmd = cluster.mpiexec_command([str(job), str(size // 4), str(iters)])
        done = cluster.run(cmd, timeout_s=min(600.0, 60 + 4 * iters * ring_s))
        after = port_bytes(cluster)
    found = re.search(r"RESULT (\{.*\})", done.stdout)
    if done.returncode != 0 or found is None:
        raise TopoccError(f"the allreduce job failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    result = json.loads(found.group(1))
    if not result["ok"]:
        raise TopoccError("the allreduce job computed a wrong sum")
    busy_s = sum(result["times"])
    util = {port: (after[port] - before.get(port, 0)) / (rates[port][0] * busy_s) for port in after}
    busiest = max(util, key=util.__getitem__)
    return Row(scale, host_rate * 8e-6, (min(uplinks) if uplinks else float("nan")) * 8e-6, result["times"], ring_s,
               bound_s, rates[busiest][1], util[busiest])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default=str(REPO / "topologies" / "emu-racks.yaml"))
    parser.add_argument("--scales", type=float, nargs="+", default=[4e-3, 1e-3])
    parser.add_argument("--size", type=int, default=16 << 20, help="bytes per rank (float32)")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args(argv)
    reason = emulation_available()
    if reason is not None:
        print(f"emulate_probe: cannot run here: {reason}", file=sys.stderr)
        return 2
    topology = load_topology(args.topology)
    print(f"{topology.name}: {topology.size} ranks on {len(topology.hosts)} hosts, "
          f"MPI_Allreduce of {args.size / 2**20:g} MiB float32, {args.iters} runs per scale")
    rows = []
    with tempfile.TemporaryDirectory(prefix="emulate_probe") as tmp:
        for scale in args.scales:
            rows.append(measure(topology, scale, args.size, args.iters, Path(tmp)))
    fit = network_fit(rows)
    header = (f"{'scale':>7} | {'host/uplink Mbit/s':>18} | {'MPICH s (median, min-max)':>25} | {'sim ring s':>10} | "
              f"{'bound s':>7} | {'busiest shaped port':>20} | regime")
    print(header)
    print("-" * len(header))
    for r in rows:
        med = statistics.median(r.times)
        if fit is None:
            regime = "? (needs two scales)"
        else:
            share = min(1.0, fit[0] / r.scale / med)
            regime = f"{'network' if share >= NETWORK_BOUND_SHARE else 'CPU'}-bound ({share:.0%} scales with the rates)"
        print(f"{r.scale:>7g} | {r.host_mbit:>8.0f} / {r.uplink_mbit:<7.0f} | "
              f"{f'{med:.2f} ({min(r.times):.2f}-{max(r.times):.2f})':>25} | {r.ring_s:>10.2f} | {r.bound_s:>7.2f} | "
              f"{r.busiest:>14} {r.utilisation:>5.0%} | {regime}")
    if fit is not None:
        print(f"fit: time = {fit[0]:.4g} s / scale + {fit[1]:.3g} s (the first term is the network's, the second "
              f"what does not shrink with the rates: CPU, start-up)")
    return 0


def network_fit(rows: list[Row]) -> tuple[float, float] | None:
    """Least-squares ``time = a / scale + c`` over the scales measured (``None`` with fewer than two)."""
    if len({r.scale for r in rows}) < 2:
        return None
    xs = [1 / r.scale for r in rows]
    ys = [statistics.median(r.times) for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return a, my - a * mx


    return 0


if __name__ == "__main__":
    sys.exit(main())
