"""The worker's check: what counts as a wrong element (nccl-tests' #wrong) for each dtype, op and collective."""

from __future__ import annotations

import numpy as np
import pytest

from topocc.runtime.harness.worker import count_wrong, make_input, reference, tolerance


def inputs(collective: str, ranks: int, count: int, dtype: str, op: str, seed: int = 0) -> list[np.ndarray]:
    return [make_input(collective, ranks, r, count, np.dtype(dtype), seed, "random", op) for r in range(ranks)]


def reversed_sum(xs: list[np.ndarray]) -> np.ndarray:
    """The sum in the opposite order from numpy's reference: another order a schedule may reduce in."""
    total = xs[-1].copy()
    for x in xs[-2::-1]:
        total += x
    return total


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_another_summation_order_is_right(dtype: str, seed: int) -> None:
    xs = inputs("allreduce", 8, 4096, dtype, "sum", seed)
    want = reference("allreduce", xs, 0, 0, "sum")
    got = reversed_sum(xs)
    assert np.any(got != want)  # the orders do round differently ...
    assert count_wrong(got, want, tolerance("allreduce", xs, 0, 0, "sum", want)) == 0  # ... within tolerance


@pytest.mark.parametrize(("dtype", "error"), [("float16", 0.1), ("float32", 1e-4), ("float64", 1e-12)])
def test_one_element_off_by_a_small_error_is_wrong(dtype: str, error: float) -> None:
    """Errors far below 1, but above what rounding 4 terms can do, are caught; so is a flipped sign."""
    xs = inputs("allreduce", 4, 1000, dtype, "sum")
    want = reference("allreduce", xs, 0, 0, "sum")
    tol = tolerance("allreduce", xs, 0, 0, "sum", want)
    assert want is not None
    got = want.copy()
    k = int(np.argmin(np.abs(want.astype(np.float64))))  # an element near 0: cancellation must not hide it
    got[k] += np.asarray(error, dtype=got.dtype)
    got[500] = -got[500] if got[500] != 0 else 1
    assert count_wrong(got, want, tol) == 2


def test_exact_cases_have_no_tolerance() -> None:
    for collective, op, dtype in [("allgather", "sum", "float32"), ("allreduce", "max", "float32"),
                                  ("allreduce", "sum", "int32"), ("broadcast", "sum", "float64")]:
        xs = inputs(collective, 3, 10, dtype, op)
        want = reference(collective, xs, 1, 0, op)
        assert np.all(tolerance(collective, xs, 1, 0, op, want) == 0)
    want = np.array([1, 2, 3], np.int32)
    assert count_wrong(np.array([1, 2, 4], np.int32), want, 0.0) == 1


def test_reduce_scatter_takes_the_ranks_own_block() -> None:
    xs = inputs("reducescatter", 4, 8, "float32", "sum")
    want = reference("reducescatter", xs, 2, 0, "sum")
    tol = tolerance("reducescatter", xs, 2, 0, "sum", want)
    assert want is not None and isinstance(tol, np.ndarray)
    magnitude = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)[16:24]
    assert tol.shape == (8,) and np.allclose(tol, 4 * np.finfo(np.float32).eps * (magnitude + np.abs(want)))


def test_equal_infinities_and_nans_are_right_a_nan_for_a_number_is_not() -> None:
    want = np.array([np.inf, np.nan, 1.0], np.float32)
    assert count_wrong(want.copy(), want, 1e-6) == 0
    assert count_wrong(np.array([np.inf, np.nan, np.nan], np.float32), want, 1e-6) == 1
    assert count_wrong(want, None, 0.0) == 0  # nothing specified (reduce off the root)
