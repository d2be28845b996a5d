"""Prophet blocks: the scheduler's updates equal DDP's, each block reduced once per iteration; plan errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runtime.training.launch import PREAMBLE, launch, plan_for
from topocc.planner.gradblocks.block_plan import BlockPlan, block_plan_to_dict, prophet_blocks
from topocc.planner.gradblocks.cost import LinearCost
from topocc.runtime.training import profile_model

torch = pytest.importorskip("torch")

# the block scheduler with the planner's blocks gives the same update as DDP + SGD
WORKER = PREAMBLE + r'''
from topocc.runtime.training import BlockScheduler, TopoccHookState, load_block_plan

comm = TopoccHookState(sys.argv[1], timeout=20.0).comm
blocks = load_block_plan(sys.argv[2])
ref = model(); opt = torch.optim.SGD(ref.parameters(), lr=0.1)
ddp = nn.parallel.DistributedDataParallel(ref)
m = model()
sched = BlockScheduler(m, blocks, comm, lambda ps: torch.optim.SGD(ps, lr=0.1), overlap_forward=True)
for step in range(3):
    opt.zero_grad(); nn.functional.mse_loss(ddp(x), y).backward(); opt.step()
    nn.functional.mse_loss(m(x), y).backward(); sched.step()
sched.synchronize()
out = {"rank": rank, "max_diff": max(float((a - b).abs().max()) for a, b in zip(ref.parameters(), m.parameters())),
       "sent": [[it, j] for it, j in sched.sent], "nblocks": len(blocks)}
sched.close()
rows = world.gather(out)
if rank == 0:
    print(json.dumps(rows), flush=True)
comm.close()
dist.destroy_process_group()
'''


def blocks_file(tmp_path: Path) -> Path:
    """A Prophet plan for the worker's model, small chunks so blocks split parameters."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(37, 300), torch.nn.Tanh(), torch.nn.Linear(300, 900),
                              torch.nn.Tanh(), torch.nn.Linear(900, 5))
    prof = profile_model(net, torch.nn.functional.mse_loss, (torch.randn(16, 37), torch.randn(16, 5)), repeats=2)
    timeline = prophet_blocks(prof, LinearCost(1e-6, 1e9), 64 << 10)
    plan = BlockPlan(timeline.blocks, timeline.iteration_s, 0.0, 0.0, "prophet", 64 << 10)
    assert any(lo > 0 for b in plan.blocks for _, lo, _ in b.pieces), "the test needs split parameters"
    path = tmp_path / "blocks.json"
    path.write_text(json.dumps(block_plan_to_dict(plan, prof)))
    return path


@pytest.mark.mpi
@pytest.mark.parametrize(("hosts", "gpus"), [(1, 2), (2, 2)])
def test_blocks_match_ddp(tmp_path: Path, hosts: int, gpus: int) -> None:
    rows = launch(hosts * gpus, WORKER, [str(plan_for(tmp_path, hosts, gpus)), str(blocks_file(tmp_path))], tmp_path)
    for r in rows:
        assert r["max_diff"] <= 1e-5, r
        for it in range(3):  # each block reduced exactly once per iteration, in the plan's order on every rank
            assert [j for i, j in r["sent"] if i == it] == list(range(r["nblocks"]))
        assert len(r["sent"]) == 3 * r["nblocks"]


def test_block_plan_errors_are_one_line(tmp_path: Path) -> None:
    from topocc.runtime.errors import CommunicatorError
    from topocc.runtime.training import load_block_plan

    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"format": "topocc-bucket-plan", "blocks": [{"pieces": [[0, 1]]}]}))
    with pytest.raises(CommunicatorError, match="malformed bucket plan"):
        load_block_plan(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CommunicatorError, match="not a topocc bucket plan"):
        load_block_plan(bad)
