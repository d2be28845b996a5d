"""The result each rank of ``topocc torchbench`` checks against: what the collective computes from every
rank's whole input, sliced afterwards (here), equals what the worker derives from the collective's
description (there), for every collective, reduction and datatype; and the patterns stay exact."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

import torch

from topocc.runtime.harness.torchbench.sweep import make_sweep
from topocc.runtime.harness.torchbench.timer import cuda_device, expected, pattern

COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}


def reference(collective: str, ranks: int, rank: int, count: int, root: int, op: str, dtype: torch.dtype
              ) -> torch.Tensor | None:
    """The collective's result on ``rank``, from each rank's whole input (float64, then ``dtype``)."""
    split_input = collective in ("reducescatter", "alltoall")
    inputs = [pattern(r, count * ranks if split_input else count, torch.float64, op) for r in range(ranks)]
    total = inputs[0]
    for x in inputs[1:]:
        total = COMBINE[op](total, x)
    block = slice(rank * count, (rank + 1) * count)
    result = {"allreduce": total, "reduce": total if rank == root else None, "broadcast": inputs[root],
              "allgather": torch.cat(inputs), "reducescatter": total[block],
              "alltoall": torch.cat([x[block] for x in inputs])}[collective]
    return None if result is None else result.to(dtype)


@pytest.mark.parametrize("collective", ["allreduce", "reduce", "broadcast", "allgather", "reducescatter",
                                        "alltoall"])
@pytest.mark.parametrize(("op", "datatype"), [("sum", "bfloat16"), ("prod", "half"), ("max", "int8"),
                                               ("min", "float")])
def test_the_expected_result_is_the_collectives(collective: str, op: str, datatype: str) -> None:
    sweep = make_sweep(collective, 1024, 1024, 2, ranks=3, datatype=datatype, op=op, root=2)
    dtype = getattr(torch, sweep.dtype)
    for rank in range(3):
        want = reference(collective, 3, rank, 5, 2, op, dtype)
        got = expected(sweep, 5, rank)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.dtype == dtype and torch.equal(got, want), (rank, got, want)


def test_the_patterns_are_exact_and_differ_by_rank() -> None:
    """Sums over 64 ranks fit bfloat16's 8 bits exactly; every rank's input differs from the others' (a call
    that returned the wrong rank's data would be counted wrong)."""
    sweep = make_sweep("allreduce", 64, 64, 2, ranks=64, datatype="bfloat16")
    exact = expected(sweep, 16, 0)
    assert exact is not None
    wide = torch.stack([pattern(r, 16, torch.float64, "sum") for r in range(64)]).sum(dim=0)  # integers: exact
    assert torch.equal(exact.to(torch.float64), wide)
    assert len({tuple(pattern(r, 5, torch.int64, "sum").tolist()) for r in range(5)}) == 5
    prod = dataclasses.replace(sweep, op="prod", ranks=2)
    assert set(pattern(1, 8, torch.int64, "prod").tolist()) == {1, 2} and expected(prod, 4, 0) is not None


def test_ranks_beyond_the_gpus_share_them_each_as_a_host_of_its_own() -> None:
    one_each = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "RANK": "11"}
    assert cuda_device(one_each, 8) == 3 and "NCCL_HOSTID" not in one_each
    shared = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "RANK": "3"}
    assert cuda_device(shared, 1) == 0 and shared["NCCL_HOSTID"] == "torchbench-host3"
    other = {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "RANK": "2"}
    assert cuda_device(other, 1) == 0 and other["NCCL_HOSTID"] != shared["NCCL_HOSTID"]
