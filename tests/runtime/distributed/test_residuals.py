"""Error feedback in the ``topocc`` backend (under torchrun): DDP on a compressed bundle with
``TOPOCC_ERROR_FEEDBACK`` trains to gloo's loss, step ahead goes through DDP's bucket views, and calls the
encodings cannot carry run exact and are counted so; which all-reduces carry a residual; bad options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from tests.runtime.distributed.test_process_group import result, start_jobs, torchrun  # noqa: E402
from tests.runtime.training.launch import TOPOLOGY  # noqa: E402
from topocc.planner.compiler.compress import compress_all  # noqa: E402
from topocc.planner.compiler.size_buckets import compile_plan  # noqa: E402
from topocc.planner.topology.parse import parse_topology_text  # noqa: E402
from topocc.runtime.bundle import Bundle, BundlePlan, save_bundle  # noqa: E402
from topocc.runtime.distributed.residuals import bucket_key, carries_residual  # noqa: E402
from topocc.runtime.errors import CommunicatorError  # noqa: E402
from topocc.runtime.plan import Plan  # noqa: E402

#: The final loss error feedback (step ahead, residuals averaged every step) reaches, over gloo's exact one.
WITHIN = 1.35


def compressed_bundle(tmp_path: Path, policy: str) -> Path:
    """A 2-rank bundle (2 hosts of 1 GPU) whose all-reduce plan is compressed with ``policy``; every call runs it."""
    topology = parse_topology_text(TOPOLOGY.format(hosts=2, gpus=1), "t")
    _, buckets = compile_plan(topology, "allreduce", 1 << 8, 1 << 20)
    plan = Plan(tuple(d.compiled.schedule for d in compress_all(topology, buckets, policy)))
    folder = tmp_path / "bundle"
    save_bundle(Bundle(2, (BundlePlan(plan, (0, 1)),), topology.name, topology.fingerprint), folder)
    return folder


def test_ddp_with_error_feedback_and_step_ahead_trains_as_gloo(tmp_path: Path) -> None:
    env = {"TOPOCC_PLAN": str(compressed_bundle(tmp_path, "topk:10%@inter-host")),
           "TOPOCC_ERROR_FEEDBACK": "step-ahead,error-avg:1", "TOPOCC_TUNE": "off"}
    res = result(torchrun(2, "feedback_job.py", "120", "step-ahead", env=env))
    assert res["same_params"] and res["exact_results"]
    assert res["topocc"] <= WITHIN * res["native"], res
    assert res["residuals"] >= 1 and res["residuals_after"] == res["residuals"]  # none for the metric
    allreduce = res["counters"]["allreduce"]
    assert allreduce["encoded"] >= 120 and allreduce["delegated"] == 0
    # int32 data, then op max, then a metric outside backward: exact, the first reason kept
    assert allreduce["exact"] == 3 and allreduce["why_exact"].startswith("int32 data")
    assert "encoded" in res["table"] and "int32 data" in res["table"]


def test_init_refuses_bad_or_differing_options_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from topocc.runtime.distributed.job import BackendOptions, Job

    folder = compressed_bundle(tmp_path, "bf16@inter-host")
    store = torch.distributed.HashStore()
    monkeypatch.setenv("TOPOCC_ERROR_FEEDBACK", "efx")
    with pytest.raises(CommunicatorError, match=r"TOPOCC_ERROR_FEEDBACK='efx': 'efx' is not an error-feedback option"):
        Job.start(store, 0, 2, BackendOptions(plan=folder))
    with pytest.raises(CommunicatorError, match=r"error_feedback='ef,error-avg:-1'"):
        Job.start(store, 0, 2, BackendOptions(plan=folder, error_feedback="ef,error-avg:-1"))
    monkeypatch.delenv("TOPOCC_ERROR_FEEDBACK")
    # rank 0 with error feedback, rank 1 without: error averaging would hang
    outcome = start_jobs([BackendOptions(plan=folder, error_feedback=spec) for spec in ("ef", "off")])
    assert all(isinstance(o, CommunicatorError) for o in outcome)
    assert "rank 1 runs other error-feedback options than rank 0 (ef)" in outcome[0].one_line()
    assert "fix: give every rank the same TOPOCC_ERROR_FEEDBACK" in outcome[0].one_line()


def test_only_float_cpu_all_reduces_during_backward_carry_a_residual() -> None:
    x = torch.ones(4, requires_grad=True)
    outside = carries_residual(torch.ones(4))
    seen: list[bool] = []

    def during(grad: Any) -> Any:
        seen.extend([carries_residual(grad), carries_residual(grad.to(torch.int32))])
        return grad

    x.register_hook(during)
    (x * 2).sum().backward()
    assert (outside, seen) == (False, [True, False])
    t = torch.zeros(8)
    assert bucket_key(t) == bucket_key(t) != bucket_key(t[:4]) != bucket_key(torch.zeros(8))


def test_step_ahead_finds_parameters_through_their_bucket_views() -> None:
    """A parameter whose gradient is a view of an all-reduced bucket moves by its piece of the residual; where
    no gradient is such a view, step ahead says in one line what to set."""
    from topocc.runtime.distributed.residuals import step_ahead_over
    from topocc.runtime.feedback import ErrorFeedback, FeedbackOptions, Residual

    bucket = torch.zeros(10)
    feedback = ErrorFeedback(FeedbackOptions(step_ahead=True))
    residual = Residual(feedback.options, bucket, bucket.numpy(), "sum", 2)
    residual.values[:] = np.arange(10)
    residual.calls = 1
    feedback.residuals[bucket_key(bucket)] = residual
    shard = torch.zeros(6)  # a reduce-scatter's residual, keyed by its place in backward: no parameter's view
    feedback.residuals[("backward", 0, 6, torch.float32)] = Residual(feedback.options, shard, shard.numpy(), "sum", 2)
    feedback.residuals[("backward", 0, 6, torch.float32)].calls = 1
    p, q = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(3))
    p.grad, q.grad = bucket[4:8].view(2, 2), torch.zeros(3)  # p's gradient lies in the bucket, q's does not
    optimizer = torch.optim.SGD([p, q], lr=0.5)
    ahead = step_ahead_over(feedback, optimizer)
    assert ahead.shift() == 1
    assert p.detach().flatten().tolist() == [-0.5 * 2 * v for v in (4, 5, 6, 7)]  # sum: lr * ranks * residual
    ahead.settle()
    p.grad = torch.zeros(2, 2)  # not a view: nothing to find
    with pytest.raises(CommunicatorError, match=r"gradient_as_bucket_view=True"):
        ahead.shift()
    with pytest.raises(CommunicatorError, match=r"error feedback is off"):
        step_ahead_over(None, optimizer)


def test_backward_order_names_a_call_by_its_place_in_each_backward_pass() -> None:
    """FSDP2's reduce-scatter inputs are new buffers each step: the n-th keyed call of every backward pass gets
    the same key, and the calls of one pass get different ones."""
    from topocc.runtime.distributed.residuals import BackwardOrder

    order, keys = BackwardOrder(), list[Any]()
    x = torch.ones(3, requires_grad=True)

    def hook(grad: Any) -> Any:
        keys.extend(order.key(torch.zeros(4)) for _ in range(2))  # two buffers, new each pass
        return grad

    x.register_hook(hook)
    for _ in range(2):
        (x * 2).sum().backward()
    assert keys[0] != keys[1] and keys[:2] == keys[2:]
