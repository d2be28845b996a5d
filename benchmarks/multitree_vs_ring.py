"""MultiTree against a single ring and the lower bound, simulated on the shipped topologies.

Run from the repository root::

    python benchmarks/multitree_vs_ring.py [--collective allreduce] [--sizes 64MiB,1GiB] [topology ...]

Prints one row per topology and size: simulated MultiTree time, single-ring
time (``ring`` with one channel), the lower bound, MultiTree's share of the
bound and its speed-up over the ring.
"""

from __future__ import annotations

import argparse
import time

from topocc.planner.analysis.bounds import lower_bound
from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.algorithms.multitree import multitree
from topocc.planner.compiler.algorithms.ring import ring
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology, shipped_topologies
from topocc.planner.units import format_time, parse_size

DEFAULT = ("torus-4x4", "mesh-4x4", "dgx1-v100", "ndv2-2chassis", "dgx2", "dgx-a100-4node", "pcie-4x4-10gbe")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topologies", nargs="*", default=list(DEFAULT))
    parser.add_argument("--collective", default="allreduce")
    parser.add_argument("--sizes", default="64MiB,1GiB")
    parser.add_argument("--pipeline", type=int, default=None)
    args = parser.parse_args()
    names = args.topologies or sorted(shipped_topologies())
    print(f"{'topology':16} {'size':>6} {'multitree':>10} {'ring':>10} {'bound':>10} {'%bound':>7} "
          f"{'vs ring':>7} {'build':>6}")
    for name in names:
        topology = resolve_topology(name)
        net = Network(topology)
        for text in args.sizes.split(","):
            size = parse_size(text)
            options = Options(size_bytes=size, pipeline=args.pipeline)
            started = time.perf_counter()
            schedule = multitree(net, args.collective, options)
            built = time.perf_counter() - started
            mt = simulate(topology, schedule, size).time_s
            try:
                rg = simulate(topology, ring(net, args.collective, Options(size_bytes=size, channels=1)),
                              size).time_s
            except NotApplicableError:
                rg = float("nan")
            bound = lower_bound(topology, args.collective, size).time_s
            print(f"{name:16} {text:>6} {format_time(mt):>10} {format_time(rg):>10} {format_time(bound):>10} "
                  f"{100 * bound / mt:6.1f}% {rg / mt:6.2f}x {built:5.1f}s")


if __name__ == "__main__":
    main()
