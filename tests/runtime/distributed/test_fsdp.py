"""FSDP2 over the ``topocc`` backend with a compressed bundle (under torchrun): the gradients' reduce-scatter
during backward runs encoded, the parameters' all-gather and a reduce-scatter outside backward run exact, and
training ends within a stated tolerance of the exact run's loss."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from tests.runtime.distributed.test_process_group import result, torchrun  # noqa: E402
from tests.runtime.training.launch import TOPOLOGY  # noqa: E402
from topocc.planner.compiler.compress import compress_all  # noqa: E402
from topocc.planner.compiler.size_buckets import compile_plan  # noqa: E402
from topocc.planner.topology.parse import parse_topology_text  # noqa: E402
from topocc.runtime.bundle import Bundle, BundlePlan, save_bundle  # noqa: E402
from topocc.runtime.plan import Plan  # noqa: E402

STEPS = 40
#: How far the compressed run's final loss may lie from the exact run's, relative (int8 blocks on the one
#: inter-host hop; measured well inside it: 1e-4).
WITHIN = 0.01


def fsdp_bundle(tmp_path: Path, policy: str) -> Path:
    """A 2-rank bundle (2 hosts of 1 GPU) of what FSDP2 issues, reduce-scatter and all-gather, both compressed
    with ``policy``; every call runs its plan."""
    topology = parse_topology_text(TOPOLOGY.format(hosts=2, gpus=1), "t")
    plans = []
    for collective in ("reducescatter", "allgather"):
        _, buckets = compile_plan(topology, collective, 1 << 8, 1 << 20)
        plan = Plan(tuple(d.compiled.schedule for d in compress_all(topology, buckets, policy)))
        assert any(o.encoding for s in plan.schedules for p in s.programs for o in p)  # the plan does encode
        plans.append(BundlePlan(plan, (0, 1)))
    folder = tmp_path / "bundle"
    save_bundle(Bundle(2, tuple(plans), topology.name, topology.fingerprint), folder)
    return folder


def test_fsdp2_reduce_scatters_gradients_encoded_and_trains_to_the_exact_loss(tmp_path: Path) -> None:
    env = {"TOPOCC_PLAN": str(fsdp_bundle(tmp_path, "int8@inter-host")), "TOPOCC_TUNE": "off"}
    res = result(torchrun(2, "fsdp_job.py", str(STEPS), env=env, limit=400))
    mine, exact = res["topocc"], res["native"]
    # the parameters' all-gather is exact: the first forward sees gloo's parameters, so the same loss to the bit
    assert mine[0] == exact[0], res
    assert mine[-1] != exact[-1], res  # the gradients went encoded: training moved differently
    assert mine[-1] < 0.5 * mine[0], res  # it trains
    assert abs(mine[-1] / exact[-1] - 1) <= WITHIN, res
    rs, ag = res["counters"]["reducescatter"], res["counters"]["allgather"]
    # one gradient reduce-scatter per sharded layer (three) and step, all encoded; one outside backward, exact
    assert rs["delegated"] == 0 and rs["encoded"] == 3 * STEPS and rs["exact"] == 1, res["table"]
    assert rs["why_exact"] == "not a gradient (outside backward)" and res["exact_outside"], res["table"]
    assert ag["planned"] >= 3 * STEPS and ag["encoded"] == 0 and ag["exact"] == ag["planned"], res["table"]
    assert ag["why_exact"] == "not a gradient (allgather runs exact)", res["table"]


def test_fsdp2_error_feedback_keeps_what_top_k_drops_from_the_gradient_shards(tmp_path: Path) -> None:
    """Top-k on the inter-host hop drops most of each gradient shard; with error feedback
    (``TOPOCC_ERROR_FEEDBACK=ef``) each rank's shard residual, keyed by its reduce-scatter's place in the
    backward pass (FSDP2's input buffers are new each step), goes out with the next step's, and the run ends
    nearer the exact run's loss than the same run without it."""
    folder = fsdp_bundle(tmp_path, "topk:10%@inter-host")
    finals = {}
    for feedback in ("off", "ef"):
        env = {"TOPOCC_PLAN": str(folder), "TOPOCC_TUNE": "off", "TOPOCC_ERROR_FEEDBACK": feedback}
        res = result(torchrun(2, "fsdp_job.py", str(STEPS), env=env, limit=400))
        assert res["counters"]["reducescatter"]["encoded"] == 3 * STEPS, res["table"]
        finals[feedback] = abs(res["topocc"][-1] / res["native"][-1] - 1)
    assert finals["ef"] < 0.5 * finals["off"], finals
