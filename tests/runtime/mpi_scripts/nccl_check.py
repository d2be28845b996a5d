"""The NCCL checks on one GPU: a launcher, one rank's work, and the verdict on what the ranks reported.

``python nccl_check.py run MODE WORLD [ARGS]`` starts WORLD copies of this script (``... rank R WORLD STORE
MODE [ARGS]``), all on the current GPU, each with its own ``NCCL_HOSTID`` (NCCL then treats them as hosts
and connects them through sockets), their control plane a ``torch.distributed.FileStore`` (no ``mpiexec``);
it prints the verdict and exits non-zero on any problem.  ``python nccl_check.py suite [--jobs N]`` runs every
case of :data:`SUITE` (N at a time; ``TOPOCC_CHECK_LIMIT_S`` bounds each, 300 s by default):
tests/runtime/test_nccl.py runs the same cases under pytest, benchmarks/gpu_check.sh without.

Modes:

* ``check DTYPES COUNTS GROUP_BYTES``: every collective of ``schedules.py`` (their lowerings are proved on
  CPU by tests/planner/analysis/test_verify_lowered.py), every op, twice per case (the second reuses the binding),
  plus ``async_op=True`` and NCCL's own allreduce on the same communicator, against torch references;
* ``planner``: the planner's algorithms on a 4-rank topology (bucket on a ring and a 2x2 mesh), float32 and bfloat16;
* ``ddp`` (4 ranks): training with DDP and the hook over our NCCL transport (the planner's hierarchical
  all-reduce on a 2 x 2 topology, built identically by every rank) against plain DDP over torch's NCCL: the
  same loss at each of a few SGD steps, and the same weights after them;
* ``hang`` / ``die`` (2 ranks): rank 1 stops answering (sleeps, or exits) before the second allreduce;
  rank 0 must fail within the timeout with ``topocc:`` lines naming it.

Rank 0 prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
#: the failure modes' communicator timeout
FAIL_TIMEOUT_S = 3.0
#: training steps of the DDP case (each compares the loss with plain DDP's)
_DDP_STEPS = 12
_DTYPES = "float32,bfloat16,float16,int32"
_COUNTS = "1,7,65537"  # one element, a tail shorter than the chunks, a size that does not divide

#: The GPU suite, (mode, ranks, arguments): every collective on 2-4 ranks with the smallest groups (one chunk
#: per stream and group) and the default ones, the planner's algorithms, DDP, a hung and a dead peer.
SUITE: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("check", 2, (_DTYPES, _COUNTS, "1")),
    ("check", 3, (_DTYPES, _COUNTS, str(512 << 10))),
    ("check", 4, (_DTYPES, _COUNTS, "1")),
    ("planner", 4, ()),
    ("ddp", 4, ()),
    ("hang", 2, ()),
    ("die", 2, ()),
)

Outputs = list[tuple[int, str, str]]  # (exit code, stdout, stderr) per rank


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"runtime_test_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


# --------------------------------------------------------------------------- the launcher and the verdict


def launch(mode: str, world: int, *args: str, limit: float = 300.0) -> Outputs:
    """Run ``world`` ranks of ``mode`` on this machine's GPU; every rank is killed if ``limit`` seconds pass."""
    from topocc.runtime.harness.launch import spawn_ranks

    with tempfile.TemporaryDirectory(prefix="topocc-nccl-") as tmp:
        store = str(Path(tmp) / "store")
        pythonpath = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
        done = spawn_ranks([([sys.executable, str(Path(__file__)), "rank", str(r), str(world), store, mode, *args],
                             {**os.environ, "PYTHONPATH": pythonpath, "NCCL_HOSTID": f"topocc-host{r}",
                              "OMP_NUM_THREADS": "1"}) for r in range(world)], limit_s=limit)
    return [(p.returncode, p.stdout, p.stderr) for p in done]


def result(outputs: Outputs) -> dict[str, Any] | None:
    lines = [line for line in outputs[0][1].splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1].removeprefix("RESULT ")) if lines else None


def verdict(mode: str, outputs: Outputs) -> list[str]:
    """What is wrong with a run of ``mode`` (empty: it passed)."""
    if mode in ("hang", "die"):
        return _failure_verdict(mode, outputs)
    problems = [f"rank {r} exited with {code}: {err.strip()[-1500:]}" for r, (code, _, err) in enumerate(outputs)
                if code != 0]
    res = result(outputs)
    if res is None:
        return [*problems, "rank 0 printed no RESULT line"]
    if mode == "ddp":
        close = res["max_diff"] <= 1e-4 * max(1.0, res["scale"]) and res["loss_diff"] <= 1e-4
        if not close or res["calls"] < res["steps"]:  # a bucket or more per step through the hook
            problems.append(f"DDP + hook over NCCL differs from DDP: {res}")
    else:
        if res["wrong_total"]:
            problems.append(f"{res['wrong_total']} wrong results, for example {res['wrong']}")
        if res["cases"] < 50 or res["native_checked"] < 1:
            problems.append(f"too few cases ran: {res}")
    return problems


def _failure_verdict(mode: str, outputs: Outputs) -> list[str]:
    """Two ranks: rank 0 must leave with code 5 and ``topocc:`` lines naming rank 1, within the timeout."""
    code, _, err = outputs[0]
    lines = [line for line in err.splitlines() if line.startswith("topocc:")]
    problems = []
    if code != 5 or not lines:
        problems.append(f"{mode}: rank 0 exited with {code} and {len(lines)} topocc lines: {err[-1500:]}")
    elif not all("waiting for rank(s) 1 " in line for line in lines):
        problems.append(f"{mode}: rank 0 did not name rank 1: {lines}")
    res = result(outputs)
    if res is None or not res["elapsed"] < FAIL_TIMEOUT_S + 5.0:
        problems.append(f"{mode}: rank 0 did not fail within {FAIL_TIMEOUT_S + 5.0:g} s: {res}")
    return problems


# --------------------------------------------------------------------------- one rank


def _rank_main(rank: int, world: int, path: str, mode: str, args: list[str]) -> int:
    import torch
    import torch.distributed as dist

    from topocc.runtime.communicator import Communicator
    from topocc.runtime.errors import CommunicatorError
    from topocc.runtime.transports.nccl import NCCLTransport
    from topocc.runtime.transports.store import StoreControl

    # without CUDA the transport refuses (one line); the tensors are never made
    device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    store = dist.FileStore(path, world)
    control = StoreControl(store, rank, world)
    S = _load("schedules")

    def transport(timeout: float = 30.0) -> NCCLTransport:
        return NCCLTransport(control, device=device, timeout=timeout)

    if mode in ("hang", "die"):  # a ring allreduce; rank 1 stops answering before the second call
        comm = Communicator(S.ring_allreduce(world, 2), transport=transport(FAIL_TIMEOUT_S), timeout=FAIL_TIMEOUT_S)
        x = torch.ones(1 << 16, device=device)
        comm.allreduce(x)
        torch.cuda.synchronize()
        if rank == 1:
            if mode == "die":
                os._exit(9)
            time.sleep(3 * FAIL_TIMEOUT_S + 10)
            os._exit(0)
        start = time.monotonic()
        with contextlib.suppress(CommunicatorError):  # the exit guard repeats the line and leaves with code 5
            comm.allreduce(x, async_op=True).synchronize()
        print(f"RESULT {json.dumps({'elapsed': time.monotonic() - start})}", flush=True)
        return 0
    if mode == "ddp":
        schedule = S.planner_schedules(("hierarchical",), 1 << 20)["hierarchical-allreduce"]
        res = _check_ddp(rank, world, store, device, schedule, transport())
    else:
        if mode == "check":
            schedules, dtypes = S.every_collective(world), args[0].split(",")
            counts, group_bytes = [int(c) for c in args[1].split(",")], int(args[2])
        else:
            schedules = {**S.planner_schedules(("ring", "tree", "halving-doubling", "direct", "hierarchical",
                                                "multitree", "treepack"), 1 << 20), **S.grid_schedules(1 << 20)}
            dtypes, counts, group_bytes = ["float32", "bfloat16"], [7, 65537], 512 << 10
        res = _check_schedules(rank, world, device, schedules, dtypes, counts, group_bytes, transport)
        totals = control.allgather_ints([res["wrong_count"]], 120.0) or []
        res["wrong_total"] = sum(row[0] for row in totals)
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    return 0


def _check_schedules(rank: int, world: int, device: Any, schedules: dict[str, Any], dtypes: list[str],
                     counts: list[int], group_bytes: int, transport: Any) -> dict[str, Any]:
    import torch

    from topocc.runtime.communicator import Communicator
    from topocc.runtime.harness.baselines import native
    from topocc.runtime.harness.worker import call

    T = _load("torch_check")  # inputs_for, reference, DTYPES, OPS: the same references as the gloo checks
    cases, wrong, natives = 0, [], 0
    for name, schedule in schedules.items():
        comm = Communicator(schedule, transport=transport(), timeout=30.0, group_bytes=group_bytes)
        c, root = schedule.collective, schedule.root or 0
        reducing = c in ("allreduce", "reduce", "reducescatter")
        for dtype in dtypes:
            for op in (T.OPS if reducing else ["sum"]):
                if op == "avg" and not T.DTYPES[dtype].is_floating_point:
                    continue
                for count in counts:
                    xs = T.inputs_for(c, world, count, dtype, op, device)
                    want = T.reference(c, xs, rank, root, op)
                    for _ in range(2):  # the second call reuses the binding
                        got = call(comm, c, xs[rank].clone(), op)
                        torch.cuda.current_stream().synchronize()
                        cases += 1
                        if want is not None and not (got.dtype == want.dtype and torch.equal(got, want)):
                            wrong.append(f"{name} {dtype} {op} {count}")
                    if c != "allreduce":
                        continue
                    mine = xs[rank].clone()
                    comm.allreduce(mine, op=op, async_op=True).wait()  # orders the current stream after it
                    torch.cuda.current_stream().synchronize()
                    cases += 1
                    if not torch.equal(mine, want):
                        wrong.append(f"{name} {dtype} {op} {count}: async_op")
                    if op in ("sum", "max"):
                        mine = xs[rank].clone()
                        native(comm.transport, c, mine, mine, op)  # NCCL's own allreduce, on the same communicator
                        natives += 1
                        if not torch.equal(mine, want):
                            wrong.append(f"{name} {dtype} {op} {count}: NCCL's own allreduce differs")
        comm.close()
    return {"cases": cases, "wrong": wrong[:10], "wrong_count": len(wrong), "native_checked": natives}


def _check_ddp(rank: int, world: int, store: Any, device: Any, plan: Any, transport: Any) -> dict[str, Any]:
    """Training with DDP + hook over our NCCL transport follows plain DDP over torch's NCCL: losses and weights."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from topocc.runtime.training import TopoccHookState, topocc_allreduce_hook

    dist.init_process_group("nccl", store=dist.PrefixStore("torch", store), rank=rank, world_size=world,
                            device_id=device)
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(16, 37, generator=g).to(device), torch.randn(16, 5, generator=g).to(device))
               for _ in range(_DDP_STEPS)]

    def train(state: Any) -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(37, 300), nn.Tanh(), nn.Linear(300, 900), nn.Tanh(), nn.Linear(900, 5)).to(device)
        ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.1)  # several buckets, reduced while backward runs
        if state is not None:
            ddp.register_comm_hook(state, topocc_allreduce_hook)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        losses = []
        for x, y in batches:  # from the second step on, DDP's rebuilt buckets (several sizes)
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return [float(v) for v in losses], [p.detach().clone() for p in m.parameters()]

    plain_losses, plain = train(None)
    state = TopoccHookState(plan, transport=transport, timeout=30.0)
    hooked_losses, hooked = train(state)
    torch.cuda.synchronize()
    res = {"calls": state.calls, "bytes": state.bytes, "steps": _DDP_STEPS,
           "max_diff": max(float((a - b).abs().max()) for a, b in zip(plain, hooked)),
           "scale": max(float(a.abs().max()) for a in plain),
           "loss_diff": max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(plain_losses, hooked_losses)),
           "losses": [plain_losses[0], plain_losses[-1], hooked_losses[-1]]}
    state.close()
    dist.destroy_process_group()
    return res


def main(argv: list[str]) -> int:
    if argv[0] == "rank":
        from topocc.runtime.errors import TopoccError

        try:
            return _rank_main(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5:])
        except TopoccError as err:  # a refusal (no GPU, no CuPy) is one line, as the runtime promises
            os.write(2, f"topocc: {err.one_line()}\n".encode())
            return err.exit_code
    if argv[0] in ("run", "suite"):
        from topocc.runtime.harness.launch import exit_on_sigterm

        exit_on_sigterm()  # a `timeout` on this launcher takes its ranks along
        jobs = 1
        if argv[0] == "suite" and len(argv) == 3 and argv[1] == "--jobs":
            jobs = max(1, int(argv[2]))
        cases = [(argv[1], int(argv[2]), tuple(argv[3:]))] if argv[0] == "run" else list(SUITE)
        limit = float(os.environ.get("TOPOCC_CHECK_LIMIT_S", 300))

        def one(case: tuple[str, int, tuple[str, ...]]) -> bool:
            mode, world, args = case
            start = time.monotonic()
            problems = verdict(mode, launch(mode, world, *args, limit=limit))
            lines = [f"nccl {mode} on {world} ranks {' '.join(args)}: {'FAILED' if problems else 'ok'} "
                     f"({time.monotonic() - start:.0f} s)", *(f"  {p}" for p in problems)]
            print("\n".join(lines), flush=True)
            return bool(problems)

        # cases may run at once (each rank has its own NCCL host id and ports), except those that kill a
        # rank: under MPS a fault of one process reaches every process on the GPU, so they run last, alone
        killing = [c for c in cases if c[0] in ("hang", "die")]
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            failed = sum(pool.map(one, [c for c in cases if c not in killing]))
        failed += sum(map(one, killing))
        return 1 if failed else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
