"""Per-rank entry point that ``topocc.runtime.harness.launch`` starts under ``mpiexec``.

``python -m topocc.runtime.harness.worker check SCHEDULE ...`` replays a schedule on
deterministic data, compares with numpy and times the calls; ``... bench SCHEDULE ...`` times it
against MPI's native collective (and, with ``--gloo HOST:PORT``, torch's gloo
allreduce; with ``--trace DIR``, one extra traced call per size is written to
``DIR/rank<R>.json``).  Rank 0 prints one JSON object per case on
stdout; a failure prints one ``topocc: ...`` line on stderr and exits non-zero.

Every rank regenerates every rank's input from a seed, so references need no
communication: the result is checked on every rank.  An element is wrong when
it differs from numpy's by more than :func:`tolerance` allows; rows report the
count of wrong elements over all ranks (nccl-tests' ``#wrong``) and the largest
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from topocc.runtime.arrays import REDUCTIONS, resolve_dtype
from topocc.runtime.collective import ALLGATHER, ALLREDUCE, BROADCAST, REDUCE, REDUCESCATTER
from topocc.runtime.collective import collective as describe
from topocc.runtime.communicator import Communicator
from topocc.runtime.errors import CommunicatorError, TopoccError
from topocc.runtime.harness.baselines import gloo_allreduce, has_native, native
from topocc.runtime.lowering import DEFAULT_GROUP_BYTES

__all__ = ["PROGRESS", "case_count", "count_wrong", "main", "make_input", "reference", "tolerance"]

#: Rank 0's progress lines on stdout start with this (rows are JSON objects, so they never do).
PROGRESS = "progress: "


def case_count(collective: str, ranks: int, size_bytes: int, itemsize: int) -> int:
    """Elements per call for nccl-tests' ``size`` (bytes of the larger buffer): see :func:`call_buffers`."""
    elements = size_bytes // itemsize
    return elements // max(describe(collective).sizes(ranks, 1))  # the larger buffer's rank blocks


def make_input(collective: str, ranks: int, rank: int, count: int, dtype: np.dtype, seed: int, data: str,
               op: str) -> np.ndarray:
    """Rank ``rank``'s input: ``count`` elements, or ``ranks * count`` for reducescatter and alltoall.

    ``data="exact"`` draws small integers (products of them stay exact), so any
    reduction order gives bit-identical results; ``"random"`` draws normal floats.
    """
    n = describe(collective).sizes(ranks, count)[0]
    rng = np.random.default_rng([seed, rank, n])
    if data == "exact" or dtype.kind in "iu":
        if op == "prod":
            values = rng.choice(np.array([1, 2] if dtype.kind == "u" else [-1, 1, 2]), size=n)
        else:
            low = 0 if dtype.kind == "u" else -3
            values = rng.integers(low, 4, size=n)
        return values.astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def reference(collective: str, inputs: Sequence[np.ndarray], rank: int, root: int, op: str) -> np.ndarray | None:
    """What ``rank`` must hold afterwards (None where the collective leaves it unspecified)."""
    n, c = len(inputs), describe(collective)
    if c.from_root:
        return inputs[root]
    if c.gathers:
        return np.concatenate(inputs)
    if c.exchanges:
        block = len(inputs[0]) // n
        return np.concatenate([x[rank * block:(rank + 1) * block] for x in inputs])
    ufunc = REDUCTIONS[op]
    total = inputs[0].copy()
    for x in inputs[1:]:
        ufunc(total, x, out=total)
    if op == "avg":
        np.divide(total, n, out=total)
    if c.to_root:
        return total if rank == root else None
    if c.scatters:
        block = len(total) // n
        return total[rank * block:(rank + 1) * block]
    return total


def _eps(dtype: np.dtype) -> float:
    """Machine epsilon of a floating dtype (ml_dtypes' bfloat16 included)."""
    try:
        return float(np.finfo(dtype).eps)
    except ValueError:
        import ml_dtypes  # optional dependency: numpy's own dtypes have no bfloat16

        return float(ml_dtypes.finfo(dtype).eps)


def tolerance(collective: str, inputs: Sequence[np.ndarray], rank: int, root: int, op: str,
              want: np.ndarray | None) -> np.ndarray | float:
    """How far each element of ``rank``'s result may be from numpy's ``want`` and still be right.

    Copies (broadcast, all-gather, all-to-all), ``max``, ``min`` and integer types
    are exact: 0.  Summing n floats in any order is off by at most
    (n-1)·(eps/2)·Σ|x| (Higham, *Accuracy and Stability of Numerical Algorithms*,
    §4.2), and so is the numpy reference, so a sum may differ from it by
    n·eps·Σ|x| at most; ``avg`` adds the division's rounding, ``prod`` is off by
    n·eps·|product|.  The bound is per element, so neither cancellation nor large
    values hide a wrong one.
    """
    dtype, c = inputs[0].dtype, describe(collective)
    if want is None or not c.reduces or op in ("max", "min") or dtype.kind in "iub":
        return 0.0
    n, eps = len(inputs), _eps(dtype)
    magnitude = np.abs(want.astype(np.float64))
    if op != "prod":
        total = np.zeros(len(inputs[0]), np.float64)
        for x in inputs:
            total += np.abs(x.astype(np.float64))
        if c.scatters:
            block = len(total) // n
            total = total[rank * block:(rank + 1) * block]
        magnitude += total / n if op == "avg" else total
    return n * eps * magnitude


def count_wrong(got: np.ndarray, want: np.ndarray | None, tol: np.ndarray | float) -> int:
    """Elements of ``got`` farther from ``want`` than ``tol`` (equal values, infinities and NaNs, are right)."""
    if want is None or want.size == 0:
        return 0
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN: such elements are right only when equal
        right = (np.abs(g - w) <= tol) | (g == w) | (np.isnan(g) & np.isnan(w))
    return int(right.size - np.count_nonzero(right))


def _sum_over_ranks(comm: Any, value: int) -> int:
    """``value`` summed over every rank (within the communicator's timeout)."""
    rows = comm.transport.allgather_ints([value], comm.timeout)
    if rows is None:
        raise CommunicatorError(f"not every rank came to compare results within {comm.timeout:g} s",
                                where=f"rank {comm.rank}", fix="a peer died or hangs; check its output")
    return sum(row[0] for row in rows)


def call(comm: Any, collective: str, data: Any, op: str, recv: Any = None) -> Any:
    """Run the communicator's collective on ``data`` and return where the result is."""
    c = describe(collective)
    if c is ALLREDUCE:
        return comm.allreduce(data, op=op)
    if c is REDUCE:
        return comm.reduce(data, op=op)
    if c is BROADCAST:
        return comm.broadcast(data)
    if c is ALLGATHER:
        return comm.allgather(data, recv)
    if c is REDUCESCATTER:
        return comm.reduce_scatter(data, recv, op=op)
    return comm.alltoall(data, recv)


def max_error(got: np.ndarray, want: np.ndarray | None) -> float:
    """Largest absolute difference, computed in float64 (0 where nothing is specified)."""
    if want is None or want.size == 0:
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))


def _die(how: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(9)


def _progress(rank: int, text: str) -> None:
    """A progress line from rank 0 (the launcher passes it on; the others stay quiet)."""
    if rank == 0:
        print(PROGRESS + text, flush=True)


def _check(comm: Any, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Per case: ``--warmup`` and then ``--repeat`` calls, every result checked, the ``--repeat`` calls timed."""
    collective, ranks, rank = comm.collective, comm.size, comm.rank
    root = comm.plan.schedules[0].root or 0
    calls = 0
    total = args.warmup + args.repeat
    for dtype_name in args.dtypes:
        dtype = resolve_dtype(dtype_name)
        ops = args.ops if describe(collective).reduces else args.ops[:1]
        for op in ops:
            if op == "avg" and dtype.kind in "iu":
                continue
            for count in args.counts:
                started = time.perf_counter()
                # every rank builds all ranks' inputs to compute its expected result: O(ranks x count) work
                inputs = [make_input(collective, ranks, r, count, dtype, args.seed, args.data, op)
                          for r in range(ranks)]
                want = reference(collective, inputs, rank, root, op)
                tol = tolerance(collective, inputs, rank, root, op, want)
                mine = inputs[rank]
                del inputs
                _progress(rank, f"{count} x {dtype} {op}: inputs and expected result ready in "
                                f"{time.perf_counter() - started:.1f} s")
                err, wrong, timed = 0.0, 0, 0.0
                for j in range(total):
                    data = mine.copy()
                    start = time.perf_counter()
                    got = call(comm, collective, data, op)
                    took = time.perf_counter() - start
                    if j >= args.warmup:
                        timed += took
                    _progress(rank, f"call {j + 1}/{total} ({'timed' if j >= args.warmup else 'warm-up'}) "
                                    f"took {took:.3f} s on rank 0")
                    err = max(err, max_error(got, want))
                    wrong = max(wrong, count_wrong(got, want, tol))
                    calls += 1
                    if args.die_rank == rank and calls == args.die_after:
                        _die(args.die_how)
                yield {"collective": collective, "algorithm": comm.plan.schedules[0].metadata.algorithm,
                       "dtype": str(dtype), "op": op, "count": count,
                       "size": count_bytes(collective, ranks, count, dtype),
                       "time_s": comm.transport.max_float(timed / max(args.repeat, 1)), "iters": args.repeat,
                       "wrong": _sum_over_ranks(comm, wrong), "max_error": comm.transport.max_float(err)}


def _bench(comm: Any, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Per size: one checked call, then the replay and the native collective timed (rows as each size ends)."""
    collective, ranks, rank = comm.collective, comm.size, comm.rank
    dtype = resolve_dtype(args.dtypes[0])
    op = args.ops[0]
    iters = args.iters if len(args.iters) == len(args.sizes) else [args.iters[0]] * len(args.sizes)
    root = comm.plan.schedules[0].root or 0
    described = describe(collective)
    in_place = described.replicates and described.symmetric_sizes  # the native call's output is its input
    traces: list[Any] = []
    for size, n_iter in zip(args.sizes, iters):
        count = case_count(collective, ranks, size, dtype.itemsize)
        data = make_input(collective, ranks, rank, count, dtype, args.seed, "random", op)
        inputs = [make_input(collective, ranks, r, count, dtype, args.seed, "random", op) for r in range(ranks)]
        want = reference(collective, inputs, rank, root, op)
        tol = tolerance(collective, inputs, rank, root, op, want)
        del inputs
        work = data.copy()
        recv = _recv_buffer(collective, ranks, count, dtype)
        got = call(comm, collective, work, op, recv)
        err = comm.transport.max_float(max_error(got, want))
        wrong = _sum_over_ranks(comm, count_wrong(got, want, tol))
        del want, tol
        topocc_s = _time(comm, lambda w=work, r=recv: call(comm, collective, w, op, r), args.warmup, n_iter)
        if args.trace:
            comm.start_trace()
            call(comm, collective, work, op, recv)
            traces.extend(comm.stop_trace())
        native_s = None
        if args.native and has_native(comm.transport):
            nrecv = work if in_place else _recv_buffer(collective, ranks, count, dtype, native=True)
            try:
                native_s = _time(comm, lambda w=work, r=nrecv: native(comm.transport, collective, w, r, op, root),
                                 args.warmup, n_iter)
            except Exception as exc:  # e.g. a dtype this MPI cannot reduce: report, do not fail the run
                print(f"note: native {collective} unavailable for {dtype}: {exc}", file=sys.stderr)
        gloo_s = _time_gloo(comm, collective, work, op, args.warmup, n_iter) if args.gloo else None
        yield {"size": count_bytes(collective, ranks, count, dtype), "count": count, "dtype": str(dtype),
               "op": op, "time_s": topocc_s, "native_time_s": native_s, "gloo_time_s": gloo_s, "wrong": wrong,
               "max_error": err, "algorithm": comm.plan.select(size).metadata.algorithm, "iters": n_iter}
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
        with open(os.path.join(args.trace, f"rank{rank}.json"), "w") as f:
            json.dump([list(r) for r in traces], f)


def _init_gloo(comm: Any, address: str, timeout: float) -> None:
    """Join torch.distributed (gloo) with the MPI ranks and size, rendezvous at ``address`` (rank 0's HOST:PORT)."""
    import torch.distributed as dist  # optional dependency

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://{address}", rank=comm.rank, world_size=comm.size,
                                timeout=timedelta(seconds=max(60.0, 4 * timeout)))


def _time_gloo(comm: Any, collective: str, work: np.ndarray, op: str, warmup: int, iters: int) -> float | None:
    """torch.distributed's gloo allreduce on the same data (a baseline); None for other collectives."""
    if describe(collective) is not ALLREDUCE or op not in ("sum", "max", "min", "prod"):
        return None
    import torch  # optional dependency

    try:
        tensor = torch.from_numpy(work)
    except TypeError:  # a dtype torch cannot wrap (ml_dtypes' bfloat16)
        return None
    return _time(comm, lambda: gloo_allreduce(tensor, op), warmup, iters)


def count_bytes(collective: str, ranks: int, count: int, dtype: np.dtype) -> int:
    """nccl-tests' size: bytes of the larger buffer for a call of ``count`` elements."""
    return max(describe(collective).sizes(ranks, count)) * dtype.itemsize


def _recv_buffer(collective: str, ranks: int, count: int, dtype: np.dtype, native: bool = False) -> Any:
    c = describe(collective)
    if c.split:
        return np.empty(c.sizes(ranks, count)[1], dtype)
    return np.empty(count, dtype) if native else None


def _time(comm: Any, fn: Any, warmup: int, iters: int) -> float:
    """Max over ranks of the mean per-iteration time after warm-up, between barriers."""
    for _ in range(warmup):
        fn()
    comm.transport.barrier(comm.timeout)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    mean = (time.perf_counter() - start) / max(iters, 1)
    return comm.transport.max_float(mean)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m topocc.runtime.harness.worker", description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("check", "bench"))
    p.add_argument("schedule", nargs="+", help="schedule or plan file(s); several files form a plan")
    p.add_argument("--each", action="store_true", help="check each file on its own communicator (check)")
    p.add_argument("--dtypes", nargs="+", default=["float32"])
    p.add_argument("--ops", nargs="+", default=["sum"])
    p.add_argument("--counts", nargs="+", type=int, default=[1001], help="elements per rank block (check)")
    p.add_argument("--sizes", nargs="+", type=int, default=[1 << 20], help="bytes, nccl-tests' size (bench)")
    p.add_argument("--data", choices=("exact", "random"), default="random")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="timed calls per case (check)")
    p.add_argument("--iters", nargs="+", type=int, default=[20], help="one count, or one per size (bench)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default: 0 in check, 5 in bench)")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--fingerprint", default=None)
    p.add_argument("--gloo", default=None, metavar="HOST:PORT", help="also time torch gloo allreduce (bench)")
    p.add_argument("--no-native", dest="native", action="store_false", help="do not time MPI's own collective (bench)")
    p.add_argument("--trace", default=None, metavar="DIR", help="write one traced call per size (bench)")
    p.add_argument("--lowered", action="store_true",
                   help="replay the lowering group by group with NCCL's semantics (MPIGroupTransport)")
    p.add_argument("--group-bytes", type=int, default=None, help="with --lowered: bytes per stream and group")
    p.add_argument("--die-rank", type=int, default=-1, help="testing: this rank dies ...")
    p.add_argument("--die-after", type=int, default=1, help="... after this many calls ...")
    p.add_argument("--die-how", choices=("exit", "kill"), default="exit", help="... by os._exit(9) or SIGKILL")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one worker; returns the exit code."""
    args = parser().parse_args(argv)
    rank = -1
    try:
        sources = args.schedule if args.each else [args.schedule[0] if len(args.schedule) == 1 else args.schedule]
        if args.warmup is None:
            args.warmup = 0 if args.mode == "check" else 5
        for source in sources:
            transport = None
            if args.lowered:
                # mpi4py, loaded where it is used (the communicator loads it for its default transport too)
                from topocc.runtime.transports.mpi import MPIGroupTransport

                transport = MPIGroupTransport()
            comm = Communicator(source, fingerprint=args.fingerprint, timeout=args.timeout, transport=transport,
                                group_bytes=args.group_bytes or DEFAULT_GROUP_BYTES)
            rank = comm.rank
            _progress(rank, f"{comm.size} ranks up, schedule loaded and agreed")
            if args.gloo and args.mode == "bench":
                _init_gloo(comm, args.gloo, args.timeout)
            for row in _check(comm, args) if args.mode == "check" else _bench(comm, args):
                if rank == 0:
                    print(json.dumps(row), flush=True)  # as each case ends: the launcher shows progress
            comm.close()
    except TopoccError as err:
        text = err.one_line()
        if rank >= 0 and not text.startswith("rank"):
            text = f"rank {rank}: {text}"
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, f"topocc: {text}\n".encode())  # one write: lines of different ranks must not interleave
        os._exit(err.exit_code)  # MPI_Finalize would wait for the failed peer
    return 0


if __name__ == "__main__":
    sys.exit(main())
