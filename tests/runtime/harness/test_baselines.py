"""The libraries' own collectives: which transports have one, and what NCCL's enqueues (checked without a GPU).

MPI's runs in the worker's bench mode (tests/runtime/test_mpi.py), gloo's in tests/runtime/test_gloo.py's
checks, NCCL's on a GPU in tests/runtime/test_nccl.py; here a stand-in transport records NCCL's calls.
"""

from __future__ import annotations

from typing import Any

import pytest

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.harness.baselines import has_native, native


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_every_transport_of_the_runtime_has_a_baseline() -> None:
    assert all(has_native(_Named(name)) for name in ("mpi", "mpi-groups", "gloo", "nccl"))
    assert not has_native(_Named("shm"))
    with pytest.raises(CommunicatorError, match="the shm transport has no native collectives"):
        native(_Named("shm"), "allreduce", None, None)


class _Comm:
    """NCCL's communicator as CuPy binds it, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *args))


class _NCCL:
    """An NCCL transport that runs what is enqueued on a recording communicator and stream 7."""

    name = "nccl"

    def __init__(self) -> None:
        self.comm = _Comm()

    def enqueue(self, launch: Any) -> None:
        launch(self.comm, 7)


def test_nccl_baselines_call_the_collective_on_the_transports_stream() -> None:
    torch = pytest.importorskip("torch")
    send, recv = torch.ones(8), torch.zeros(4)
    transport = _NCCL()
    native(transport, "allreduce", recv, recv, "max")
    native(transport, "reduce", send, recv, "prod", 1)
    native(transport, "broadcast", recv, recv, root=1)
    native(transport, "allgather", recv, send)
    native(transport, "reducescatter", send, recv, "avg")
    s, r, fp32 = send.data_ptr(), recv.data_ptr(), 7  # ncclFloat32
    assert transport.comm.calls == [
        ("allReduce", r, r, 4, fp32, 2, 7), ("reduce", s, r, 8, fp32, 1, 1, 7), ("broadcast", r, r, 4, fp32, 1, 7),
        ("allGather", r, s, 4, fp32, 7), ("reduceScatter", s, r, 4, fp32, 4, 7)]
    ints = torch.zeros(4, dtype=torch.int32)
    native(transport, "allreduce", ints, ints, "avg")  # NCCL averages floats only: integers are summed
    assert transport.comm.calls[-1] == ("allReduce", ints.data_ptr(), ints.data_ptr(), 4, 2, 0, 7)
    with pytest.raises(CommunicatorError, match="NCCL has no native alltoall"):
        native(transport, "alltoall", send, send)
    assert len(transport.comm.calls) == 6  # nothing enqueued
