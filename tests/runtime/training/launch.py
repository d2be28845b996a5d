"""What the training integration's tests share: compiled plans for small clusters, and a launcher for worker scripts.

Each test writes a worker script that every rank runs under ``mpiexec``; rank 0 prints one JSON line with
every rank's row (``world.gather``), which :func:`launch` returns sorted by rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.conftest import REPO, run_bounded
from topocc.planner.compiler.size_buckets import compile_plan
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.harness.launch import RANK_WRAPPER, find_mpiexec
from topocc.runtime.plan import save_plan

#: Every rank's preamble: MPI for the rows, torch.distributed over gloo (rank 0's store binds a free port itself
#: and the others learn it over MPI: no port picked, released and raced for), and the model whose DDP buckets
#: (``bucket_cap_mb=0.1``) come in several sizes, with different data per rank.
PREAMBLE = r'''
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
from torch import nn
from mpi4py import MPI

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
torch.set_num_threads(1)
store = dist.TCPStore("127.0.0.1", 0, size, True, timedelta(seconds=60), wait_for_workers=False) if rank == 0 else None
port = world.bcast(store.port if store is not None else None)
if store is None:
    store = dist.TCPStore("127.0.0.1", port, size, False, timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=size)

def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(37, 300), nn.Tanh(), nn.Linear(300, 900), nn.Tanh(), nn.Linear(900, 5))

g = torch.Generator().manual_seed(100 + rank)
x, y = torch.randn(16, 37, generator=g), torch.randn(16, 5, generator=g)
'''

TOPOLOGY = """
name: t{hosts}x{gpus}
cluster:
  hosts: {hosts}
  host:
    gpus: {gpus}
    fabric: fully-connected
    gpu_link: {{bandwidth: 10 GB/s, latency: 1 us, kind: shm}}
    nics: 1
    nic: {{bandwidth: 10 Gbit/s, latency: 20 us, kind: ethernet}}
  network: {{type: single-switch}}
"""



def plan_for(tmp_path: Path, hosts: int, gpus: int) -> Path:
    plan, _ = compile_plan(parse_topology_text(TOPOLOGY.format(hosts=hosts, gpus=gpus), "t"), "allreduce",
                           1 << 8, 1 << 20)
    path = tmp_path / f"plan{hosts}x{gpus}.json"
    save_plan(plan, path)
    return path


def launch(np_: int, script: str, args: list[str], tmp_path: Path, limit: float = 180) -> list[dict]:
    """Run ``script`` on ``np_`` ranks; kill the whole job past ``limit`` seconds (a hang's ceiling, far above
    what a loaded machine needs); rank rows sorted by rank."""
    file = tmp_path / "worker.py"
    file.write_text(script)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [find_mpiexec(), "-disable-auto-cleanup", "-n", str(np_), *RANK_WRAPPER, sys.executable, str(file), *args]
    done = run_bounded(cmd, limit, "the job", env=env)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err[-3000:]
    rows = [row for line in out.splitlines() if line.startswith("[") for row in json.loads(line)]
    assert len(rows) == np_, out + err[-2000:]
    return sorted(rows, key=lambda r: r["rank"])
