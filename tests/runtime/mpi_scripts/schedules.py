"""Small hand-written schedules of every collective, for the runtime's tests and benchmarks.

Built with :class:`topocc.planner.compiler.builder.ScheduleBuilder` (which adds the data
dependencies), so each is checked by ``topocc.planner.analysis.verify`` before the runtime sees it;
:func:`planner_schedules` adds the planner's own algorithms on a 4-rank topology, and
:func:`grid_schedules` the bucket all-reduce, reduce-scatter and all-gather on 4-rank grids.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence

from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.routing.network import Network
from topocc.runtime.schedule import Chunk, Metadata, Schedule, build_schedule, operation


def ring_allreduce(n: int, pipeline: int = 1, *, inplace: bool = False, channels: int = 1) -> Schedule:
    """Reduce-scatter then allgather around a ring; each block split into ``pipeline`` messages."""
    p = pipeline
    b = ScheduleBuilder("allreduce", n, n * p, n * p, inplace=inplace)
    if not inplace:
        for r in range(n):
            b.copy(r, Chunk("i", 0, n * p), Chunk("o", 0, n * p))
    for phase, reduce in (("rs", True), ("ag", False)):
        for s in range(n - 1):
            for r in range(n):
                blk = (r - s) % n if reduce else (r + 1 - s) % n
                for j in range(p):
                    c = Chunk("o", blk * p + j)
                    b.transfer(r, (r + 1) % n, c, c, reduce=reduce, step=s if phase == "rs" else n - 1 + s,
                               channel=j % channels)
    return b.build("ring", {"pipeline": p})


def direct_allreduce_scratch(n: int, chunks: int = 3) -> Schedule:
    """Every rank sends its whole input into a scratch slot of every other rank, then reduces locally."""
    b = ScheduleBuilder("allreduce", n, chunks, chunks, scratch_chunks=(n - 1) * chunks)
    for r in range(n):
        b.copy(r, Chunk("i", 0, chunks), Chunk("o", 0, chunks))
    for r in range(n):
        for q in range(n):
            if q != r:
                slot = ((r - q) % n - 1) * chunks
                b.transfer(q, r, Chunk("i", 0, chunks), Chunk("s", slot, chunks))
    for r in range(n):
        for t in range(n - 1):
            b.reduce(r, Chunk("s", t * chunks, chunks), Chunk("o", 0, chunks))
    return b.build("direct-scratch")


def pairwise_allreduce_src(chunks: int = 2) -> Schedule:
    """Two ranks exchange inputs; ``recv_reduce`` with a ``src`` operand writes ``o := i + received``."""
    programs = [
        [operation("send", 1 - r, Chunk("i", 0, chunks)), operation("recv_reduce", 1 - r, Chunk("i", 0, chunks),
                                                      Chunk("o", 0, chunks))]
        for r in range(2)
    ]
    return build_schedule("allreduce", 2, chunks, chunks, programs, metadata=Metadata(algorithm="pairwise-src"))


def ring_allgather(n: int, k: int = 1, *, inplace: bool = False) -> Schedule:
    b = ScheduleBuilder("allgather", n, k, n * k, inplace=inplace)
    if not inplace:
        for r in range(n):
            b.copy(r, Chunk("i", 0, k), Chunk("o", r * k, k))
    for s in range(n - 1):
        for r in range(n):
            blk = (r - s) % n
            c = Chunk("o", blk * k, k)
            b.transfer(r, (r + 1) % n, c, c, step=s)
    return b.build("ring")


def ring_reducescatter(n: int, k: int = 1) -> Schedule:
    """Partial sums travel in scratch (multi-chunk scratch references)."""
    b = ScheduleBuilder("reducescatter", n, n * k, k, scratch_chunks=n * k)
    for r in range(n):
        b.copy(r, Chunk("i", 0, n * k), Chunk("s", 0, n * k))
    for s in range(n - 1):
        for r in range(n):
            blk = (r - s - 1) % n
            c = Chunk("s", blk * k, k)
            b.transfer(r, (r + 1) % n, c, c, reduce=True, step=s)
    for r in range(n):
        b.copy(r, Chunk("s", r * k, k), Chunk("o", 0, k))
    return b.build("ring")


def direct_reducescatter_inplace(n: int, k: int = 1) -> Schedule:
    """In place: output block r is input block r of rank r."""
    b = ScheduleBuilder("reducescatter", n, n * k, k, inplace=True)
    for r in range(n):
        for q in range(n):
            if q != r:
                b.transfer(q, r, Chunk("i", r * k, k), Chunk("o", 0, k), reduce=True)
    return b.build("direct")


def chain_broadcast(n: int, chunks: int = 2, root: int = 0, *, inplace: bool = False) -> Schedule:
    b = ScheduleBuilder("broadcast", n, chunks, chunks, root=root, inplace=inplace)
    order = [(root + j) % n for j in range(n)]
    if not inplace:
        b.copy(root, Chunk("i", 0, chunks), Chunk("o", 0, chunks))
    for c in range(chunks):
        for a, z in itertools.pairwise(order):
            b.transfer(a, z, Chunk("o", c), Chunk("o", c), step=c)
    return b.build("chain")


def chain_reduce(n: int, chunks: int = 2, root: int = 0) -> Schedule:
    b = ScheduleBuilder("reduce", n, chunks, chunks, root=root)
    order = [(root + 1 + j) % n for j in range(n)]  # root+1, ..., root
    for r in range(n):
        b.copy(r, Chunk("i", 0, chunks), Chunk("o", 0, chunks))
    for c in range(chunks):
        for a, z in itertools.pairwise(order):
            b.transfer(a, z, Chunk("o", c), Chunk("o", c), reduce=True, step=c)
    return b.build("chain")


def direct_alltoall(n: int, k: int = 1, *, inplace: bool = False) -> Schedule:
    if inplace:
        # in place, block q is sent before the received block overwrites it: receive into scratch, copy after
        b = ScheduleBuilder("alltoall", n, n * k, n * k, scratch_chunks=n * k, inplace=True)
        for r in range(n):
            for q in range(n):
                if q != r:
                    b.transfer(r, q, Chunk("i", q * k, k), Chunk("s", r * k, k))
        for r in range(n):
            for q in range(n):
                if q != r:
                    b.copy(r, Chunk("s", q * k, k), Chunk("o", q * k, k))
        return b.build("direct")
    b = ScheduleBuilder("alltoall", n, n * k, n * k)
    for r in range(n):
        b.copy(r, Chunk("i", r * k, k), Chunk("o", r * k, k))
        for q in range(n):
            if q != r:
                b.transfer(r, q, Chunk("i", q * k, k), Chunk("o", r * k, k))
    return b.build("direct")


def every_collective(n: int) -> dict[str, Schedule]:
    """One or more schedules of every collective for ``n`` ranks, by a descriptive name."""
    out = {
        "allreduce-ring": ring_allreduce(n, 2, channels=2),
        "allreduce-ring-inplace": ring_allreduce(n, 1, inplace=True),
        "allreduce-direct-scratch": direct_allreduce_scratch(n),
        "allgather-ring": ring_allgather(n, 2),
        "allgather-ring-inplace": ring_allgather(n, 1, inplace=True),
        "reducescatter-ring-scratch": ring_reducescatter(n, 2),
        "reducescatter-direct-inplace": direct_reducescatter_inplace(n),
        "broadcast-chain": chain_broadcast(n, 3, root=n - 1),
        "broadcast-chain-inplace": chain_broadcast(n, 2, inplace=True),
        "reduce-chain": chain_reduce(n, 2, root=1 % n),
        "alltoall-direct": direct_alltoall(n, 2),
        "alltoall-direct-inplace": direct_alltoall(n, 1, inplace=True),
    }
    if n == 2:
        out["allreduce-pairwise-src"] = pairwise_allreduce_src()
    return out


#: Two hosts of two ranks on a switch: every algorithm applies.
TINY_2X2 = """
name: tiny-2x2
cluster:
  hosts: 2
  host:
    gpus: 2
    fabric: fully-connected
    gpu_link: {bandwidth: 10 GB/s, latency: 1 us, kind: shm}
    nics: 1
    nic: {bandwidth: 100 Gbit/s, latency: 5 us, kind: ethernet}
  network: {type: fat-tree, hosts_per_leaf: 2, spines: 1, latency: 5 us}
"""


def planner_schedules(algorithms: Sequence[str] = ("ring", "tree", "halving-doubling", "direct", "hierarchical"),
                      size_bytes: int = 1 << 16) -> dict[str, Schedule]:
    """Every collective each algorithm builds on :data:`TINY_2X2`, by ``algorithm-collective``."""
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.options import Options
    from topocc.planner.errors import NotApplicableError
    from topocc.planner.topology.parse import parse_topology_text

    topology = parse_topology_text(TINY_2X2, "tiny-2x2")
    net = Network(topology)
    schedules = {}
    for name in algorithms:
        for collective in ALGORITHMS[name].collectives:
            with contextlib.suppress(NotApplicableError):
                schedules[f"{name}-{collective}"] = ALGORITHMS[name].load()(
                    net, collective, Options(size_bytes=size_bytes, pipeline=2))
    return schedules


def grid_schedules(size_bytes: int = 1 << 16) -> dict[str, Schedule]:
    """The bucket all-reduce, reduce-scatter and all-gather (in scratch, copied to and from the buffers) on a ring
    of 4 (both ways round) and a 2x2 mesh (lines of two), by name."""
    from benchmarks.fabrics import grid
    from topocc.planner.compiler.algorithms.bucket import bucket
    from topocc.planner.compiler.options import Options

    return {f"bucket-{collective}-{kind}-{'x'.join(map(str, dims))}": bucket(
        Network(grid(kind, dims).topology()), collective, Options(size_bytes=size_bytes))
        for kind, dims in (("torus", (4,)), ("mesh", (2, 2))) for collective in ("allreduce", "reducescatter",
                                                                                   "allgather")}
