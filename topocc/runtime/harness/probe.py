"""Measure the transport between ranks: the runtime's half of ``topocc calibrate``.

Every rank runs ``python -m topocc.runtime.harness.probe TESTS.json`` under ``mpiexec`` (inside an emulated
cluster, or on the real one).  The planner chose the tests (which pairs cross which links, which pairs
load one link together); this module only runs them, over mpi4py with the runtime's own way of waiting
(nonblocking requests polled, the core yielded between polls), and prints rank 0's results as JSON
lines on stdout.  It imports nothing of the planner.

Test kinds (every figure is the median of ``reps`` repetitions, each between barriers):

* ``pingpong``: for one pair, a message of each size goes there and back; half the round trip is the
  one-way time of a message alone (the latency and bandwidth of that pair's path).
* ``stream``: every pair of ``pairs`` at once, the first rank sending ``bytes`` to the second as
  ``messages`` equal messages posted back to back; the time is from the barrier until the last byte
  arrived anywhere.  One pair and several message counts give the cost of each message on a
  connection; several pairs through one link give that link's bandwidth under contention.
* ``local``: every rank at once reduces (``numpy`` in place, as the runtime does) and copies
  ``bytes`` of each dtype; the figure is the median rank's throughput.

The file need only be readable on one rank's machine (the one ``topocc calibrate`` ran on, where its
temporary folder is): the ranks that read it send it to the others.  With ``hosts`` in it (per rank, the
topology's host for it: a real cluster), the ranks first check that they run where the topology puts them
(:mod:`topocc.runtime.harness.placement`); rank 0 says in one line where they do not, and every rank exits 5
before measuring anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from topocc.runtime.arrays import DTYPES
from topocc.runtime.harness.placement import placement_error

__all__ = ["main", "run_tests", "slowest_median"]

#: The probe's messages use this tag on a private duplicate of the world communicator.
_TAG = 7


def _wait(requests: Sequence[Any], deadline: float) -> None:
    """Poll ``requests`` until all complete, yielding the core between polls as the executor does."""
    from mpi4py import MPI  # optional dependency: the probe runs over MPI, the rest of the runtime need not

    pending = list(requests)
    while pending:
        done = MPI.Request.Testsome(pending)
        if done:
            pending = [r for j, r in enumerate(pending) if j not in set(done)]
        elif time.monotonic() > deadline:
            raise TimeoutError("a probe message did not complete in time")
        else:
            os.sched_yield()


def slowest_median(comm: Any, fn: Callable[[], Any], reps: int) -> float:
    """The median over ``reps`` of the slowest rank's time for ``fn`` (started together after a barrier)."""
    from mpi4py import MPI  # optional dependency: the probe runs over MPI, the rest of the runtime need not

    times = []
    for _ in range(reps):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(times)


def _pingpong(comm: Any, test: dict[str, Any], deadline: float) -> Iterator[dict[str, Any]]:
    (a, b), = test["pairs"]
    rank = comm.Get_rank()
    for size in test["sizes"]:
        buf = np.zeros(max(size, 1), np.uint8)[:size]

        def trip(buf: np.ndarray = buf) -> None:
            if rank == a:
                _wait([comm.Isend(buf, b, _TAG)], deadline)
                _wait([comm.Irecv(buf, b, _TAG)], deadline)
            elif rank == b:
                _wait([comm.Irecv(buf, a, _TAG)], deadline)
                _wait([comm.Isend(buf, a, _TAG)], deadline)

        yield {"id": test["id"], "size": size, "one_way_s": slowest_median(comm, trip, test["reps"]) / 2}


def _stream(comm: Any, test: dict[str, Any], deadline: float) -> Iterator[dict[str, Any]]:
    rank = comm.Get_rank()
    total = int(test["bytes"])
    mine = [(src, dst) for src, dst in test["pairs"] if rank in (src, dst)]
    buffers = [np.zeros(total, np.uint8) for _ in mine]  # one per pair: receives never share memory
    for count in test["messages"]:
        step = total // count

        def flow(count: int = count, step: int = step) -> None:
            requests = []
            for (src, dst), buf in zip(mine, buffers):
                pieces = [buf[j * step:(j + 1) * step] for j in range(count)]
                if rank == src:
                    requests += [comm.Isend(p, dst, _TAG) for p in pieces]
                else:
                    requests += [comm.Irecv(p, src, _TAG) for p in pieces]
            _wait(requests, deadline)

        yield {"id": test["id"], "messages": count, "bytes": step * count, "pairs": len(test["pairs"]),
               "time_s": slowest_median(comm, flow, test["reps"])}


def _local(comm: Any, test: dict[str, Any], deadline: float) -> Iterator[dict[str, Any]]:
    nbytes = int(test["bytes"])
    for name in test["dtypes"]:
        if name not in DTYPES:  # bfloat16 without ml_dtypes
            continue
        dtype = DTYPES[name]
        n = max(1, nbytes // dtype.itemsize)
        a, b = np.ones(n, dtype), np.ones(n, dtype)
        ops: tuple[tuple[str, Callable[[np.ndarray, np.ndarray], object]], ...] = (
            ("reduce", lambda x, y: np.add(x, y, out=x)), ("copy", np.copyto))
        for what, fn in ops:
            fn(a, b)  # first touch
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(test["reps"]):
                fn(a, b)
            mine = (time.perf_counter() - start) / test["reps"]
            times = comm.gather(mine, root=0)
            if comm.Get_rank() == 0:
                yield {"id": test["id"], "op": what, "dtype": name, "bytes": n * dtype.itemsize,
                       "time_s": statistics.median(times)}
            else:
                yield {}


_KINDS: dict[str, Callable[[Any, dict[str, Any], float], Iterator[dict[str, Any]]]] = {
    "pingpong": _pingpong, "stream": _stream, "local": _local,
}


def run_tests(comm: Any, tests: Sequence[dict[str, Any]], timeout_s: float) -> Iterator[dict[str, Any]]:
    """Run ``tests`` in order on every rank of ``comm``; yields the results (complete on rank 0 only)."""
    for test in tests:
        deadline = time.monotonic() + timeout_s
        for row in _KINDS[test["kind"]](comm, test, deadline):
            if row:
                yield row


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tests a file lists; rank 0 prints one JSON line per result, and ``progress`` lines to stderr."""
    p = argparse.ArgumentParser(prog="python -m topocc.runtime.harness.probe", description=__doc__.splitlines()[0])
    p.add_argument("tests", help="the tests, as JSON: {\"tests\": [...], \"timeout_s\": N, \"hosts\": [...]}")
    args = p.parse_args(argv)
    try:
        with open(args.tests) as f:
            mine = json.load(f)
    except FileNotFoundError:  # a machine without the launching one's temporary folder
        mine = None
    from mpi4py import MPI  # optional dependency, loaded once the arguments are read (so --help needs no MPI)

    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    readers = [r for r, ok in enumerate(comm.allgather(mine is not None)) if ok]
    wrong = None if readers else (
        f"no rank can read {args.tests} (fix: run topocc calibrate on a machine of the host file, or with TMPDIR "
        "on a folder every machine shares)")
    spec = comm.bcast(mine, root=readers[0]) if readers else {}
    if wrong is None and spec.get("hosts") is not None:  # a real cluster: each rank on its host's machine
        wrong = placement_error(spec["hosts"], comm.allgather(MPI.Get_processor_name()))
    if wrong is not None:
        if rank == 0:
            print(f"topocc: {wrong}", file=sys.stderr, flush=True)
        comm.Free()
        return 5
    tests = spec["tests"]
    if rank == 0:
        print(json.dumps({"id": "transport", "library": MPI.Get_library_version().strip().splitlines()[0]}),
              flush=True)
    try:
        for j, test in enumerate(tests):
            for row in run_tests(comm, [test], float(spec.get("timeout_s", 60.0))):
                if rank == 0:
                    print(json.dumps(row), flush=True)
            if rank == 0:
                print(f"progress: {j + 1}/{len(tests)} {test['id']}", file=sys.stderr, flush=True)
    except TimeoutError as exc:
        os.write(2, f"topocc: rank {rank}: {exc}\n".encode())
        os._exit(5)
    comm.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
