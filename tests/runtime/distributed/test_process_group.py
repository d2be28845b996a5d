"""``init_process_group("topocc")`` under torchrun: every planned collective equals gloo's, DDP and FSDP2
train as over gloo, subgroups, refusals at init, and failed peers.

Each test launches ``torchrun --standalone`` (a rendezvous on a free loopback port) with one of the
worker scripts beside this file, killed if it passes its time limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from tests.conftest import REPO, run_bounded  # noqa: E402
from tests.runtime.training.launch import TOPOLOGY  # noqa: E402
from topocc.planner.compiler.bundling import requests_from_calls  # noqa: E402
from topocc.planner.compiler.options import Options  # noqa: E402
from topocc.planner.compiler.size_buckets import compile_plan  # noqa: E402
from topocc.planner.compiler.symmetrize import grid_shapes, symmetrize  # noqa: E402
from topocc.planner.topology.parse import parse_topology_text  # noqa: E402
from topocc.runtime.bundle import Bundle, BundlePlan, save_bundle  # noqa: E402
from topocc.runtime.calls import read_calls  # noqa: E402
from topocc.runtime.errors import CommunicatorError  # noqa: E402
from topocc.runtime.plan import Plan  # noqa: E402

HERE = Path(__file__).parent
EVERY = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall")
SHAPES = {2: (2, 1), 3: (3, 1), 4: (2, 2)}


def bundle_for(tmp_path: Path, world: int, collectives: tuple[str, ...] = EVERY,
               groups: tuple[tuple[int, ...], ...] = (), symmetric: bool = False) -> Path:
    """A bundle folder for ``world`` ranks (small sizes): each collective on the world, all-reduce on ``groups``;
    ``symmetric``: the world's plans in the symmetric form wherever it stores fewer operations (at any size)."""
    hosts, gpus = SHAPES[world]
    topology = parse_topology_text(TOPOLOGY.format(hosts=hosts, gpus=gpus), "t")
    plans = [BundlePlan(compile_plan(topology, c, 1 << 6, 1 << 16, options=Options(root=0))[0],
                        tuple(range(world))) for c in collectives]
    if symmetric:
        shapes = grid_shapes(topology)
        plans = [BundlePlan(Plan(tuple(symmetrize(s, shapes) for s in p.plan.schedules)), p.group) for p in plans]
    for group in groups:
        plan, _ = compile_plan(topology.subset(group), "allreduce", 1 << 6, 1 << 16)
        plans.append(BundlePlan(plan, group))
    folder = tmp_path / f"bundle{world}"
    save_bundle(Bundle(world, tuple(plans), topology.name, topology.fingerprint), folder)
    return folder


def torchrun(world: int, script: str, *args: str, env: dict[str, str], limit: float = 240,
             ) -> subprocess.CompletedProcess[str]:
    # these jobs test what the plans do: no trials against gloo (TOPOCC_TUNE) unless a test asks for them
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "TOPOCC_TUNE": "off", **env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(HERE / script), *args]
    return run_bounded(cmd, limit, f"torchrun {script}", env=full)


def start_jobs(options: list[Any], wait_s: float = 60.0, late_s: float = 0.0) -> list[Any]:
    """``Job.start`` of one rank per entry of ``options`` (threads meeting on one store; rank r starts
    ``r * late_s`` seconds late): each rank's job, or its :class:`CommunicatorError`."""
    import threading
    import time

    from topocc.runtime.distributed.job import Job

    store = torch.distributed.HashStore()
    outcome: list[Any] = [None] * len(options)

    def start(rank: int) -> None:
        time.sleep(rank * late_s)
        try:
            outcome[rank] = Job.start(store, rank, len(options), options[rank], wait_s=wait_s)
        except CommunicatorError as exc:
            outcome[rank] = exc

    threads = [threading.Thread(target=start, args=(r,)) for r in range(len(options))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait_s + len(options) * late_s + 30)
    return outcome


def result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.parametrize(("world", "dtypes", "counts", "backend"), [
    (2, "float32,int32", "7,1001", "cpu:topocc,cuda:topocc"),
    (3, "bfloat16,float16,int32", "1,1001", "topocc"),
    (4, "float32,bfloat16,float16,int32", "1,7,1001", "topocc"),
])
def test_every_planned_collective_equals_gloo(tmp_path: Path, world: int, dtypes: str, counts: str,
                                              backend: str) -> None:
    res = result(torchrun(world, "collectives_job.py", dtypes, counts, backend,
                          env={"TOPOCC_PLAN": str(bundle_for(tmp_path, world, groups=((0, 1),) if world > 2 else ()))}))
    assert res["wrong"] == [] and res["cases"] >= 100
    counts_ = res["counters"]
    for collective in EVERY:
        assert counts_[collective]["planned"] > 0, counts_
    # broadcast from rank 1 has no plan (the bundle's is for root 0): gloo ran it, and says why
    assert counts_["broadcast"]["delegated"] > 0 and "root 1" in counts_["broadcast"]["why"]
    if world >= 3:
        assert res["subgroup"]["planned"] > 0 and res["subgroup_without_plan"]["delegated"] > 0


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_training_over_topocc_equals_gloo(tmp_path: Path, mode: str) -> None:
    """20 steps of DDP (no hook) or FSDP2: the same losses as over gloo, the gradients carried by plans."""
    record = tmp_path / "calls.jsonl"
    res = result(torchrun(4, "training_job.py", mode, "20", env={"TOPOCC_PLAN": str(bundle_for(tmp_path, 4)),
                                                                 "TOPOCC_RECORD": str(record)}))
    assert len(res["topocc"]) == 20
    assert res["topocc"] == pytest.approx(res["native"], rel=1e-5)
    assert res["param_diff"] < 1e-5
    gradients = ("allreduce",) if mode == "ddp" else ("reducescatter", "allgather")
    for collective in gradients:
        assert res["counters"][collective]["planned"] >= 20 and res["counters"][collective]["delegated"] == 0
    # the record lists what the job called on the topocc group, for `topocc bundle --calls`
    requests = requests_from_calls(read_calls(record), 4)
    assert {r.collective for r in requests} >= set(gradients)
    assert all(r.group == (0, 1, 2, 3) and r.low <= r.high for r in requests)


def test_plans_written_once_per_class_train_as_gloo(tmp_path: Path) -> None:
    """DDP over a bundle whose plans are in the symmetric form: each rank builds its own program from its
    class's, and the losses are gloo's."""
    folder = bundle_for(tmp_path, 4, ("allreduce", "broadcast"), symmetric=True)
    assert '"symmetry"' in next(folder.glob("allreduce*")).read_text()
    res = result(torchrun(4, "training_job.py", "ddp", "10", env={"TOPOCC_PLAN": str(folder)}))
    assert res["topocc"] == pytest.approx(res["native"], rel=1e-5) and len(res["topocc"]) == 10
    assert res["counters"]["allreduce"]["planned"] >= 10 and res["counters"]["allreduce"]["delegated"] == 0


@pytest.mark.parametrize("mode", ["die", "hang"])
def test_a_failed_peer_fails_the_call_within_the_timeout(tmp_path: Path, mode: str) -> None:
    done = torchrun(2, "failure_job.py", mode, env={"TOPOCC_PLAN": str(bundle_for(tmp_path, 2, ("allreduce",))),
                                                    "TOPOCC_TIMEOUT": "3"}, limit=90)
    assert done.returncode != 0
    elapsed = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("ELAPSED")]
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR")]
    assert elapsed and elapsed[0] < 10, done.stdout + done.stderr[-3000:]
    assert "rank(s) 1" in errors[0] and "\n" not in errors[0]


def test_init_refuses_a_bundle_for_another_world_or_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked before any group is built: one line naming the bundle and the fix."""
    from topocc.runtime.distributed.job import BackendOptions, Job

    folder = bundle_for(tmp_path, 2, ("allreduce",))
    store = torch.distributed.HashStore()
    with pytest.raises(CommunicatorError, match=r"bundle is for 2 ranks but this job has 1 .*fix: launch 2 ranks"):
        Job.start(store, 0, 1, BackendOptions(plan=folder))
    with pytest.raises(CommunicatorError, match=r"compiled for t2x1 but TOPOCC_TOPOLOGY names dgx1-v100"):
        Job.start(store, 0, 2, BackendOptions(plan=folder, topology="dgx1-v100"))
    monkeypatch.delenv("TOPOCC_TOPOLOGY", raising=False)
    monkeypatch.setenv("TOPOCC_TIMEOUT", "soon")
    with pytest.raises(CommunicatorError, match=r"TOPOCC_TIMEOUT='soon' is not a positive number of seconds"):
        Job.start(store, 0, 2, BackendOptions(plan=folder))
    monkeypatch.delenv("TOPOCC_TIMEOUT")
    monkeypatch.delenv("TOPOCC_PLAN", raising=False)
    with pytest.raises(CommunicatorError, match=r"no plan bundle .*fix: set TOPOCC_PLAN"):
        Job.start(store, 0, 2, BackendOptions())


def test_init_waits_for_a_late_rank_as_long_as_the_process_groups_timeout(tmp_path: Path) -> None:
    """``TOPOCC_TIMEOUT`` bounds planned calls, not the ranks' arrival at ``init_process_group``: a rank whose
    imports end 2 s after its peer's (a loaded machine) still meets it under a 1 s call timeout; a rank that
    never comes is reported after the process group's timeout."""
    from topocc.runtime.distributed.job import BackendOptions, Job

    folder = bundle_for(tmp_path, 2, ("allreduce",))
    outcome = start_jobs([BackendOptions(plan=folder, timeout=1)] * 2, wait_s=60, late_s=2.0)
    assert all(isinstance(o, Job) for o in outcome), outcome
    with pytest.raises(CommunicatorError, match=r"not every rank came to init_process_group within 1 s"):
        Job.start(torch.distributed.HashStore(), 0, 2, BackendOptions(plan=folder, timeout=60), wait_s=1)


def test_ranks_with_different_bundles_are_refused(tmp_path: Path) -> None:
    """Every rank states its bundle's digest through the store; a rank that loaded another is named."""
    from topocc.runtime.distributed.job import BackendOptions

    folders = [bundle_for(tmp_path, 2, ("allreduce",)), bundle_for(tmp_path / "other", 2, ("allgather",))]
    errors = [str(o) for o in start_jobs([BackendOptions(plan=f, timeout=20) for f in folders], wait_s=20)
              if isinstance(o, CommunicatorError)]
    assert len(errors) == 2 and all("loaded a different plan bundle" in e for e in errors), errors
