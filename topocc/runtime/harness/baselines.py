"""The libraries' own collectives, to measure a plan against: MPI's, gloo's and NCCL's.

The transports replay schedules and nothing else; a benchmark times the same call through the library a
transport wraps, on the transport's own communicator and the same data (:func:`native`).  The worker's
bench mode (``python -m topocc.runtime.harness.worker bench``) and ``benchmarks/gpu_bench.py`` do.  Each library is
loaded when its baseline first runs, as the transports load theirs: importing mpi4py starts MPI, which a
gloo or NCCL rank started without ``mpiexec`` must not do, and torch and CuPy are optional.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from topocc.runtime.errors import CommunicatorError

__all__ = ["gloo_allreduce", "has_native", "native"]

#: ``ncclRedOp_t`` values (NCCL's stable ABI) by the runtime's op names.
_NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


def native(transport: Any, collective: str, send: Any, recv: Any, op: str = "sum", root: int = 0) -> None:
    """Run the library's own ``collective`` on ``transport``'s communicator (``root``: a rank of it).

    MPI's and gloo's block until done; NCCL's is enqueued on the transport's stream as a replay is (the
    caller's current stream waits for it, and the transport's watchdog bounds it), so that one wait of the
    caller times either.  ``avg`` reduces as ``sum`` where the library has no average.
    """
    run = _BASELINES.get(transport.name)
    if run is None:
        raise CommunicatorError(f"the {transport.name} transport has no native collectives")
    run(transport, collective, send, recv, op, root)


def has_native(transport: Any) -> bool:
    """Whether :func:`native` knows the library under ``transport``."""
    return transport.name in _BASELINES


def _mpi(transport: Any, collective: str, send: Any, recv: Any, op: str, root: int) -> None:
    """MPI's collective on the transport's duplicated communicator: blocking, no timeout."""
    from mpi4py import MPI  # loaded here: see the module's notes

    mop = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    c = transport.comm
    calls: dict[str, Callable[[], None]] = {
        "allreduce": lambda: c.Allreduce(MPI.IN_PLACE, recv, op=mop),
        "reduce": lambda: c.Reduce(send, recv if transport.rank == root else None, op=mop, root=root),
        "broadcast": lambda: c.Bcast(recv, root=root),
        "allgather": lambda: c.Allgather(send, recv),
        "reducescatter": lambda: c.Reduce_scatter_block(send, recv, op=mop),
        "alltoall": lambda: c.Alltoall(send, recv),
    }
    _run(calls, collective)


def _torch_op(op: str) -> Any:
    """torch.distributed's reduction for ``op``."""
    import torch.distributed as dist  # optional dependency

    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
            "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]


def gloo_allreduce(tensor: Any, op: str, group: Any = None) -> None:
    """torch.distributed's all-reduce of ``tensor`` in place over ``group`` (default: the world): blocking."""
    import torch.distributed as dist  # optional dependency

    dist.all_reduce(tensor, op=_torch_op(op), group=group)


def _gloo(transport: Any, collective: str, send: Any, recv: Any, op: str, root: int) -> None:
    """gloo's collective on the transport's private process group (``root`` is a rank of that group): blocking."""
    import torch.distributed as dist  # optional dependency

    rop = _torch_op(op)
    g, r = transport.group, transport.ranks[root]
    calls: dict[str, Callable[[], None]] = {
        "allreduce": lambda: dist.all_reduce(recv, op=rop, group=g),
        "reduce": lambda: dist.reduce(send, r, op=rop, group=g),
        "broadcast": lambda: dist.broadcast(recv, r, group=g),
        "allgather": lambda: dist.all_gather(list(recv.chunk(transport.size)), send, group=g),
        "reducescatter": lambda: dist.reduce_scatter_tensor(recv, send, op=rop, group=g),
        "alltoall": lambda: dist.all_to_all_single(recv, send, group=g),
    }
    _run(calls, collective)


def _run(calls: dict[str, Callable[[], None]], collective: str) -> None:
    """Call the library's own ``collective`` from a table of them by stored name."""
    run = calls.get(collective)
    if run is None:
        raise ValueError(collective)
    run()


def _nccl(transport: Any, collective: str, send: Any, recv: Any, op: str, root: int) -> None:
    """NCCL's collective on the transport's communicator, enqueued on its stream (see :func:`native`)."""
    # optional dependency: both modules load torch
    from topocc.runtime.transports.nccl import NCCL_TYPES
    from topocc.runtime.transports.torch_ops import TORCH_DTYPES

    code = NCCL_TYPES[TORCH_DTYPES[recv.dtype]]
    red = _NCCL_OPS["sum" if op == "avg" and not recv.dtype.is_floating_point else op]
    calls: dict[str, Callable[[Any, int], None]] = {
        "allreduce": lambda comm, s: comm.allReduce(recv.data_ptr(), recv.data_ptr(), recv.numel(), code, red, s),
        "reduce": lambda comm, s: comm.reduce(send.data_ptr(), recv.data_ptr(), send.numel(), code, red, root, s),
        "broadcast": lambda comm, s: comm.broadcast(recv.data_ptr(), recv.data_ptr(), recv.numel(), code, root, s),
        "allgather": lambda comm, s: comm.allGather(send.data_ptr(), recv.data_ptr(), send.numel(), code, s),
        "reducescatter": lambda comm, s: comm.reduceScatter(send.data_ptr(), recv.data_ptr(), recv.numel(), code,
                                                            red, s),
    }
    launch = calls.get(collective)
    if launch is None:
        raise CommunicatorError(f"NCCL has no native {collective}")
    transport.enqueue(launch)


#: The baseline of each transport, by its name (the MPI group transport runs on the same communicator).
_BASELINES: dict[str, Callable[[Any, str, Any, Any, str, int], None]] = {
    "mpi": _mpi, "mpi-groups": _mpi, "gloo": _gloo, "nccl": _nccl,
}
