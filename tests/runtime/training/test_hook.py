"""The DDP communication hook gives DDP's gradients, whichever transport carries the buckets (under mpiexec)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.training.launch import PREAMBLE, launch, plan_for

torch = pytest.importorskip("torch")

# plain DDP vs DDP + hook, with the hook's communicator on MPI (numpy views), gloo (tensors) and the lowered
# replay (MPIGroupTransport: NCCL's group semantics on CPU)
WORKER = PREAMBLE + r'''
from topocc.runtime.training import TopoccHookState, topocc_allreduce_hook
from topocc.runtime.transports.gloo import GlooTransport
from topocc.runtime.transports.mpi import MPIGroupTransport

def grads(state):
    m = model()
    ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.1)   # several buckets of several sizes
    if state is not None:
        ddp.register_comm_hook(state, topocc_allreduce_hook)
    nn.functional.mse_loss(ddp(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]

plain = grads(None)
out = {"rank": rank, "param_bytes": sum(p.numel() * 4 for p in model().parameters()),
       "grad_scale": max(float(a.abs().max()) for a in plain)}
for name, transport in (("mpi", None), ("gloo", GlooTransport(timeout=20.0)), ("lowered", MPIGroupTransport())):
    state = TopoccHookState(sys.argv[1], transport=transport, timeout=20.0)
    hooked = grads(state)
    out[name] = {"calls": state.calls, "bytes": state.bytes,
                 "max_diff": max(float((a - b).abs().max()) for a, b in zip(plain, hooked))}
    state.close()
rows = world.gather(out)
if rank == 0:
    print(json.dumps(rows), flush=True)       # one line: ranks' prints would interleave
dist.destroy_process_group()
'''


@pytest.mark.mpi
@pytest.mark.parametrize(("hosts", "gpus"), [(1, 2), (2, 2)])
def test_hook_matches_ddp_over_every_transport(tmp_path: Path, hosts: int, gpus: int) -> None:
    rows = launch(hosts * gpus, WORKER, [str(plan_for(tmp_path, hosts, gpus))], tmp_path, limit=240)
    for r in rows:
        for name in ("mpi", "gloo", "lowered"):
            got = r[name]
            assert got["calls"] >= 1 and got["bytes"] == r["param_bytes"], (name, r)  # every gradient went through
            assert got["max_diff"] <= 1e-6 * max(1.0, r["grad_scale"]), (name, r)


def test_hook_refuses_a_non_allreduce_plan() -> None:
    import importlib.util

    from topocc.runtime.errors import CommunicatorError
    from topocc.runtime.training import TopoccHookState

    here = Path(__file__).parent.parent / "mpi_scripts" / "schedules.py"
    spec = importlib.util.spec_from_file_location("runtime_test_schedules", here)
    schedules = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(schedules)  # type: ignore[union-attr]
    with pytest.raises(CommunicatorError, match="the DDP hook needs an allreduce plan, got allgather"):
        TopoccHookState(schedules.ring_allgather(2))
