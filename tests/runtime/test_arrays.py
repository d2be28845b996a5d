"""The replay's array operations: the element types it knows, and the numpy backend's checks."""

from __future__ import annotations

import numpy as np
import pytest

from topocc.runtime.arrays import NUMPY_OPS, resolve_dtype, same_memory
from topocc.runtime.errors import CommunicatorError


def test_dtypes() -> None:
    assert resolve_dtype("float16") == np.float16
    with pytest.raises(CommunicatorError, match="unsupported dtype complex64"):
        resolve_dtype(np.complex64)
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(CommunicatorError, match="ml_dtypes"):
            resolve_dtype("bfloat16")


def test_same_memory_is_the_same_start_and_length() -> None:
    a = np.zeros(8, dtype=np.float32)
    assert same_memory(NUMPY_OPS, a, a[:])
    assert not same_memory(NUMPY_OPS, a, a[:4])  # same start, shorter
    assert not same_memory(NUMPY_OPS, a, a.copy())


def test_check_refuses_what_the_replay_cannot_write_in_place() -> None:
    a = np.zeros((2, 3), dtype=np.float32)
    assert NUMPY_OPS.check(a, "buffer").shape == (6,)
    with pytest.raises(CommunicatorError, match="not contiguous"):
        NUMPY_OPS.check(a[:, ::2], "buffer")
    a.flags.writeable = False
    with pytest.raises(CommunicatorError, match="read-only"):
        NUMPY_OPS.check(a, "buffer")
    with pytest.raises(CommunicatorError, match="must be an array"):
        NUMPY_OPS.check([1.0], "buffer")
