"""Encoded schedules replayed over the real transports, MPI (mpiexec) and gloo (torch.distributed): every rank
ends bitwise equal, close to the exact sum, and integer data stays exact."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_bounded
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.compress import compress
from topocc.planner.compiler.options import Options
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.harness.launch import RANK_WRAPPER, find_mpiexec, spawn_ranks
from topocc.runtime.schedule import save_schedule

SCRIPT = Path(__file__).parent / "mpi_scripts" / "encoded_check.py"

#: 2 hosts of 2 GPUs, joined by one 25 Gbit/s switch: the host links are the slow ones.
SLOW_NIC = """\
name: slow-nic
cluster:
  hosts: 2
  host:
    gpus: 2
    fabric: fully-connected
    gpu_link: {bandwidth: 50 GB/s, latency: 1 us, kind: nvlink}
    nics: 1
    nic: {bandwidth: 25 Gbit/s, latency: 5 us}
  network: {type: single-switch}
"""


@pytest.fixture(scope="module")
def schedule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    topology = parse_topology_text(SLOW_NIC)
    exact = compile_schedule(topology, "allreduce", "ring", Options(size_bytes=1 << 20))
    done = compress(topology, exact, "int8@slow")
    assert done.report.encoded_messages > 0
    path = tmp_path_factory.mktemp("encoded") / "ring-int8.json"
    save_schedule(done.compiled.schedule, path)
    return path


def _result(stdout: str, stderr: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def _check(result: dict) -> None:
    assert result["consistent"] and result["ints_exact"]
    assert 0 < result["error"] < 0.05


def test_mpi_replays_encodings(schedule_file: Path) -> None:
    cmd = [find_mpiexec(), "-n", "4", *RANK_WRAPPER, sys.executable, str(SCRIPT), str(schedule_file), "mpi"]
    proc = run_bounded(cmd, 180, "the encoded MPI replay", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(_result(proc.stdout, proc.stderr))


def test_gloo_replays_encodings(schedule_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    init = f"file://{tmp_path / 'rendezvous'}"
    done = spawn_ranks([([sys.executable, str(SCRIPT), str(schedule_file), "gloo", str(r), "4", init], env)
                        for r in range(4)], limit_s=240)
    for proc in done:
        assert proc.returncode == 0, proc.stderr[-3000:]
    _check(_result(done[0].stdout, done[0].stderr))
