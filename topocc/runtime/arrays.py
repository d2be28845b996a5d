"""The array operations of the replay, and the element types and reductions it knows.

The executor and the communicator move and reduce chunks only through an :class:`ArrayOps`: numpy here
(:data:`NUMPY_OPS`); a transport whose buffers are torch tensors brings its own subclass.  Apart from the
executor so that what sets a transport up loads no replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from topocc.runtime.errors import CommunicatorError

__all__ = ["DTYPES", "DTYPE_NAMES", "ITEMSIZES", "NUMPY_OPS", "REDUCTIONS", "ArrayOps", "resolve_dtype", "same_memory"]


def _dtypes() -> dict[str, np.dtype]:
    names = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"]
    table = {name: np.dtype(name) for name in names}
    try:  # numpy has no bfloat16; ml_dtypes (shipped with jax/tensorflow) provides one
        import ml_dtypes

        table["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        pass
    return table


#: Element types the runtime replays, by name.  ``bfloat16`` is present only when ml_dtypes is installed.
DTYPES: dict[str, np.dtype] = _dtypes()

#: Reduction operators as in-place numpy ufuncs.  ``avg`` sums, then the caller divides once at the end.
REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
}

#: Every element type name any backend may replay, in a fixed order (the set-up handshake sends the index).
DTYPE_NAMES: tuple[str, ...] = ("float32", "float64", "float16", "int32", "int64", "int8", "uint8", "bfloat16")

#: Bytes per element of each of :data:`DTYPE_NAMES` (bfloat16 too, which numpy alone does not know).
ITEMSIZES: Mapping[str, int] = {name: 2 if name == "bfloat16" else np.dtype(name).itemsize for name in DTYPE_NAMES}

def resolve_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype for a name or dtype, refusing the ones the runtime does not replay."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    name = str(dt) if dt is not None else str(dtype)
    if name not in DTYPES:
        if name == "bfloat16" or str(dtype) == "bfloat16":
            raise CommunicatorError(
                "bfloat16 needs the ml_dtypes package (numpy has no bfloat16)", fix="pip install ml_dtypes"
            )
        raise CommunicatorError(f"unsupported dtype {name}", fix=f"use one of {', '.join(DTYPES)}")
    return DTYPES[name]


class ArrayOps:
    """The array operations the executor and communicator use: allocate, copy, reduce, divide (numpy here).

    A transport whose buffers are not numpy arrays (torch tensors) exposes a
    subclass as its ``array_ops`` attribute; everything else in the replay is
    shared.  ``reductions[op](a, b, out=d)`` must compute ``d = a (op) b`` in place.
    """

    name = "numpy"
    reductions: Mapping[str, Callable[..., Any]] = REDUCTIONS

    def dtype_of(self, array: Any) -> Any:
        """The backend dtype of ``array``, refusing the ones the runtime does not replay."""
        return resolve_dtype(array.dtype)

    def dtype_name(self, dtype: Any) -> str:
        """The dtype's name in :data:`DTYPE_NAMES`."""
        return str(dtype)

    def is_integer(self, dtype: Any) -> bool:
        return bool(dtype.kind in "iu")

    def empty(self, count: int, dtype: Any) -> Any:
        return np.empty(count, dtype=dtype)

    def empty_bytes(self, count: int) -> Any:
        """A new buffer of ``count`` bytes (an encoded message's, on the wire)."""
        return np.empty(count, dtype=np.uint8)

    def host(self, array: Any) -> np.ndarray | None:
        """A numpy view of ``array``'s memory (the encodings work on these), or None where there is none."""
        return array if isinstance(array, np.ndarray) else None

    def empty_like(self, array: Any, count: int | None = None) -> Any:
        """A new 1-D buffer of ``array``'s type (and device), ``count`` elements (default: as many)."""
        return np.empty(array.size if count is None else count, dtype=array.dtype)

    def copyto(self, dst: Any, src: Any) -> None:
        np.copyto(dst, src)

    def copy_many(self, dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        """``copyto`` pairwise; the destinations do not overlap each other or any source (callers check)."""
        for d, s in zip(dsts, srcs):
            self.copyto(d, s)

    def reduce_many(self, reduce: Callable[..., Any], dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        """``d = d (op) s`` pairwise, in place; the destinations do not overlap each other or any source."""
        for d, s in zip(dsts, srcs):
            reduce(d, s, out=d)

    def divide(self, array: Any, n: int) -> None:
        np.divide(array, n, out=array)

    def count(self, array: Any) -> int:
        """Number of elements."""
        return int(array.size)

    def itemsize(self, array: Any) -> int:
        """Bytes per element."""
        return int(array.itemsize)

    def address(self, array: Any) -> int:
        return _address(array)

    def check(self, array: Any, what: str) -> Any:
        """A flat 1-D view of a contiguous, writable array (no copy), or a CommunicatorError."""
        if not hasattr(array, "dtype") or not hasattr(array, "reshape"):
            raise CommunicatorError(f"{what} must be an array, got {type(array).__name__}")
        flags = getattr(array, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            raise CommunicatorError(f"{what} is not contiguous", fix="pass np.ascontiguousarray(...) ")
        if flags is not None and not flags["WRITEABLE"]:
            raise CommunicatorError(f"{what} is read-only")
        return array.reshape(-1)


#: The numpy backend (MPI on host memory, and CUDA-aware MPI on arrays with ``__cuda_array_interface__``).
NUMPY_OPS = ArrayOps()


def same_memory(ops: ArrayOps, a: Any, b: Any) -> bool:
    """Whether two arrays are the same bytes (the same start and length)."""
    return bool(ops.address(a) == ops.address(b) and a.nbytes == b.nbytes)


def _address(array: Any) -> int:
    """The data address of a numpy or CUDA array (the key under which its binding is cached)."""
    iface = getattr(array, "__array_interface__", None) or getattr(array, "__cuda_array_interface__", None)
    return int(iface["data"][0]) if iface else id(array)
