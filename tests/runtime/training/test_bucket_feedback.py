"""Error feedback through the DDP hook: residuals carried across DDP's bucket rebuild, step ahead moving and
restoring the parameters bit for bit, and a real 2-rank gloo training run where a top-k plan with error
feedback ends near the exact plan's loss while the same plan without it ends far worse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.training.launch import PREAMBLE, TOPOLOGY, launch
from topocc.planner.compiler.compress import compress_all
from topocc.planner.compiler.size_buckets import compile_plan
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.arrays import NUMPY_OPS
from topocc.runtime.feedback import FeedbackOptions, Residual
from topocc.runtime.plan import Plan, save_plan
from topocc.runtime.training.bucket_feedback import BucketFeedback, StepAhead

torch = pytest.importorskip("torch")


class _Bucket:
    """What BucketFeedback reads of a ``GradBucket``: its index and parameters."""

    def __init__(self, index: int, params: list[Any]) -> None:
        self._index, self._params = index, params

    def index(self) -> int:
        return self._index

    def parameters(self) -> list[Any]:
        return self._params


class _Comm:
    """A one-rank stand-in for a communicator whose every call drops 1.0 per element into the residual."""

    ops, grouped, size = NUMPY_OPS, False, 2

    def allreduce(self, array: np.ndarray, op: str = "sum", *, exact: bool = False,
                  feedback: Residual | None = None) -> np.ndarray:
        if feedback is not None:
            feedback.inject(array)
            feedback.values += 1.0
        return array


def test_residuals_follow_their_parameters_when_ddp_rebuilds_its_buckets() -> None:
    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (3, 4, 5))
    feedback, comm = BucketFeedback(FeedbackOptions()), _Comm()
    feedback.allreduce(comm, _Bucket(0, [a, b, c]), np.zeros(12, np.float32), "avg")  # first step: one bucket
    feedback.feedback.residuals[0].values[:] = np.arange(12)
    rebuilt = [_Bucket(0, [c]), _Bucket(1, [b, a])]  # DDP's rebuild: other buckets, other orders
    first = np.zeros(5, np.float32)
    feedback.allreduce(comm, rebuilt[0], first, "avg")
    second = np.zeros(7, np.float32)
    feedback.allreduce(comm, rebuilt[1], second, "avg")
    assert first.tolist() == list(range(7, 12))  # c's residual went with c
    assert second.tolist() == [3, 4, 5, 6, 0, 1, 2]  # then b's, then a's
    located = {id(p): (piece.copy(), scale) for p, piece, scale in feedback.located()}
    assert located[id(a)][0].tolist() == [1.0] * 3 and located[id(c)][1] == 1.0  # avg: the residual as it is


def test_step_ahead_moves_by_lr_times_the_residual_and_restores_bitwise() -> None:
    torch.manual_seed(0)
    p, q = torch.nn.Parameter(torch.randn(2, 3)), torch.nn.Parameter(torch.randn(4))
    optimizer = torch.optim.SGD([{"params": [p], "lr": 0.5}, {"params": [q], "lr": 0.1}])
    residual = np.linspace(-1, 1, 6).astype(np.float32)
    shift = 0.5 * 2.0 * torch.from_numpy(residual).view(2, 3)  # lr * scale * residual
    ahead = StepAhead(optimizer, lambda: [(p, residual, 2.0)])  # q has no residual: it stays where it steps
    p.grad, q.grad = torch.ones(2, 3), torch.ones(4)
    first, q_first = p.detach() - 0.5, q.detach() - 0.1
    optimizer.step()  # the post-hook moves what the step made
    assert torch.allclose(p.detach(), first - shift) and ahead.shifted == 1
    assert torch.equal(q.detach(), q_first)
    optimizer.step()  # the pre-hook restores bit for bit, then the optimizer steps from there, then moves again
    second = first - 0.5
    assert torch.allclose(p.detach(), second - shift)
    ahead.settle()
    assert torch.equal(p.detach(), second)
    ahead.remove()
    optimizer.step()
    assert torch.equal(p.detach(), second - 0.5)  # unhooked: no move any more


# Each rank fits its own data with a small MLP, DDP-averaging through the hook over gloo: the exact plan, the
# top-k plan without and with error feedback, and with step ahead and error averaging every step.
WORKER = PREAMBLE + r'''
import hashlib
from topocc.runtime.training import TopoccHookState, topocc_allreduce_hook
from topocc.runtime.transports.gloo import GlooTransport

exact_plan, topk_plan, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
g = torch.Generator().manual_seed(7)
W = torch.randn(40, 5, generator=g)
g = torch.Generator().manual_seed(100 + rank)
x = torch.randn(64, 40, generator=g)
y = x @ W + 0.01 * torch.randn(64, 5, generator=g)

def train(plan, feedback):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(40, 64), nn.Tanh(), nn.Linear(64, 5))
    ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.01)
    state = TopoccHookState(plan, transport=GlooTransport(timeout=30.0), timeout=30.0, error_feedback=feedback)
    ddp.register_comm_hook(state, topocc_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    if feedback is not None and "step-ahead" in feedback:
        state.step_ahead(opt)
    for _ in range(steps):
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    state.close()   # settles a step ahead's parameters
    with torch.no_grad():
        final = nn.functional.mse_loss(m(x), y).item()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()
    kept = len(state.feedback.feedback.residuals) if state.feedback else 0
    return {"loss": final, "params": digest, "residuals": kept}

out = {"rank": rank}
for name, plan, feedback in (("exact", exact_plan, None), ("topk", topk_plan, None), ("ef", topk_plan, "ef"),
                             ("ahead", topk_plan, "step-ahead,error-avg:1")):
    out[name] = train(plan, feedback)
rows = world.gather(out)
if rank == 0:
    print(json.dumps(rows), flush=True)
dist.destroy_process_group()
'''

#: How close error feedback's final loss comes to the exact plan's (a ratio), and how far the same plan without
#: it stays (topk:10% drops 90% of each message on the slow hop).  Measured: 1.15x with EF, 1.06x with step
#: ahead and error averaging, 3.9x without (120 steps).
EF_WITHIN, WITHOUT_AT_LEAST = 1.35, 2.0


@pytest.mark.mpi
def test_error_feedback_recovers_the_exact_loss_over_gloo(tmp_path: Path) -> None:
    topology = parse_topology_text(TOPOLOGY.format(hosts=2, gpus=1), "t")
    exact, buckets = compile_plan(topology, "allreduce", 1 << 8, 1 << 20)
    topk = Plan(tuple(d.compiled.schedule for d in compress_all(topology, buckets, "topk:10%@inter-host")))
    assert all(op.encoding == "topk:0.1" for s in topk.schedules for p in s.programs for op in p if op.encoding)
    save_plan(exact, tmp_path / "exact.json")
    save_plan(topk, tmp_path / "topk.json")
    rows = launch(2, WORKER, [str(tmp_path / "exact.json"), str(tmp_path / "topk.json"), "120"], tmp_path,
                  limit=240)
    loss = {name: sum(r[name]["loss"] for r in rows) / len(rows) for name in ("exact", "topk", "ef", "ahead")}
    for name in loss:
        assert rows[0][name]["params"] == rows[1][name]["params"], name  # the replicas stayed equal
    assert rows[0]["ef"]["residuals"] >= 1 and rows[0]["topk"]["residuals"] == 0  # on where asked for only
    assert loss["topk"] >= WITHOUT_AT_LEAST * loss["exact"], loss
    assert loss["ef"] <= EF_WITHIN * loss["exact"], loss
    assert loss["ahead"] <= EF_WITHIN * loss["exact"], loss
