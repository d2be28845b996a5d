"""Array operations on torch tensors: what the executors need to allocate, copy and reduce them.

Shared by the backends whose buffers are torch tensors (``gloo.py`` on CPU, ``nccl.py`` on CUDA): a
transport exposes a :class:`TorchOps` as its ``array_ops`` and the executors use it in place of numpy.
bfloat16 works here as any other dtype.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from topocc.runtime.arrays import ArrayOps
from topocc.runtime.errors import CommunicatorError

__all__ = ["TORCH_DTYPES", "TorchOps"]

#: Element types replayed on torch, by the names of :data:`topocc.runtime.arrays.DTYPE_NAMES`.
TORCH_DTYPES: Mapping[torch.dtype, str] = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int32: "int32", torch.int64: "int64", torch.int8: "int8", torch.uint8: "uint8",
}

#: The in-place multi-tensor form of each reduction in :attr:`TorchOps.reductions`.
_FOREACH: Mapping[Callable[..., Any], Callable[..., Any]] = {
    torch.add: torch._foreach_add_, torch.mul: torch._foreach_mul_, torch.maximum: torch._foreach_maximum_,
    torch.minimum: torch._foreach_minimum_,
}


class TorchOps(ArrayOps):
    """Array operations on torch tensors of one device (CPU for gloo, a CUDA device for NCCL).

    ``check`` refuses a tensor on another device, so a call never moves data it cannot reach.
    """

    name = "torch"
    reductions: Mapping[str, Callable[..., Any]] = {
        "sum": torch.add, "avg": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum,
    }

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def dtype_of(self, array: Any) -> Any:
        if not isinstance(array, torch.Tensor):
            raise CommunicatorError(f"the torch transport replays torch tensors, got {type(array).__name__}")
        if array.dtype not in TORCH_DTYPES:
            raise CommunicatorError(f"unsupported dtype {array.dtype}",
                                    fix=f"use one of {', '.join(TORCH_DTYPES.values())}")
        return array.dtype

    def dtype_name(self, dtype: Any) -> str:
        return TORCH_DTYPES[dtype]

    def is_integer(self, dtype: Any) -> bool:
        return not (dtype.is_floating_point or dtype.is_complex)

    def empty(self, count: int, dtype: Any) -> Any:
        return torch.empty(count, dtype=dtype, device=self.device)

    def empty_like(self, array: Any, count: int | None = None) -> Any:
        return torch.empty(array.numel() if count is None else count, dtype=array.dtype, device=array.device)

    def empty_bytes(self, count: int) -> Any:
        return torch.empty(count, dtype=torch.uint8, device=self.device)

    def host(self, array: Any) -> np.ndarray | None:
        """The CPU tensor's memory as numpy (bfloat16, which numpy lacks, and CUDA memory have none)."""
        if array.device.type != "cpu" or array.dtype == torch.bfloat16:
            return None
        return array.numpy()

    def copyto(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    # one multi-tensor kernel for many pieces instead of a launch each (hundreds per call on CUDA)
    def copy_many(self, dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        torch._foreach_copy_(list(dsts), list(srcs))

    def reduce_many(self, reduce: Callable[..., Any], dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        _FOREACH[reduce](list(dsts), list(srcs))

    def divide(self, array: Any, n: int) -> None:
        array.div_(n)

    def count(self, array: Any) -> int:
        return int(array.numel())

    def itemsize(self, array: Any) -> int:
        return int(array.element_size())

    def address(self, array: Any) -> int:
        return int(array.data_ptr())

    def check(self, array: Any, what: str) -> Any:
        if not isinstance(array, torch.Tensor):
            raise CommunicatorError(f"{what} must be a torch tensor, got {type(array).__name__}")
        if array.device != self.device:
            raise CommunicatorError(f"{what} is on {array.device} but the communicator runs on {self.device}",
                                    fix="move the tensor, or make the transport on that device")
        if not array.is_contiguous():
            raise CommunicatorError(f"{what} is not contiguous", fix="pass tensor.contiguous()")
        if array.requires_grad and array.is_leaf:
            raise CommunicatorError(f"{what} requires grad; the runtime writes it in place",
                                    fix="pass tensor.detach() (or call under torch.no_grad())")
        return array.view(-1)


def wait_for_gpu(max_pause_s: float = 2e-4) -> None:
    """Block until the current stream's work so far is done, polling an event with short sleeps (from 10 us,
    doubling up to ``max_pause_s``) rather than spinning a core in ``cudaDeviceSynchronize``: where ranks and
    NCCL's proxy threads outnumber the machine's cores, spinning ranks deschedule the proxies, and every
    handshake between ranks then waits for a proxy to run again, which costs far more than the sleeps."""
    done = torch.cuda.Event()
    done.record()
    pause = 1e-5
    while not done.query():
        time.sleep(pause)
        pause = min(2 * pause, max_pause_s)
