"""The probe under mpiexec on loopback: every test kind runs and reports what the planner's fit reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from topocc.runtime.harness.launch import RANK_WRAPPER, find_mpiexec

pytestmark = pytest.mark.mpi


def test_every_kind_of_test_reports_its_rows(tmp_path: Path) -> None:
    tests = [
        {"id": "ping 0-1", "kind": "pingpong", "pairs": [[0, 1]], "sizes": [1024, 65536], "reps": 3},
        {"id": "stream 0-2", "kind": "stream", "pairs": [[0, 2]], "bytes": 65536, "messages": [1, 4], "reps": 3},
        {"id": "spread x", "kind": "stream", "pairs": [[0, 1], [0, 2], [1, 2], [2, 0]], "bytes": 65536,
         "messages": [2], "reps": 2},
        {"id": "local", "kind": "local", "bytes": 1 << 16, "dtypes": ["float32", "int32", "no-such-dtype"], "reps": 2},
    ]
    spec = tmp_path / "tests.json"
    spec.write_text(json.dumps({"tests": tests, "timeout_s": 30}))
    cmd = [find_mpiexec(), "-n", "3", *RANK_WRAPPER, sys.executable, "-m", "topocc.runtime.harness.probe", str(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows[0]["id"] == "transport" and rows[0]["library"]
    by_id: dict[str, list[dict]] = {}
    for row in rows[1:]:
        by_id.setdefault(row["id"], []).append(row)
    assert [r["size"] for r in by_id["ping 0-1"]] == [1024, 65536]
    assert all(r["one_way_s"] > 0 for r in by_id["ping 0-1"])
    assert [(r["messages"], r["bytes"]) for r in by_id["stream 0-2"]] == [(1, 65536), (4, 65536)]
    (spread,) = by_id["spread x"]
    assert spread["pairs"] == 4 and spread["time_s"] > 0
    assert {(r["op"], r["dtype"]) for r in by_id["local"]} == {(op, d) for op in ("reduce", "copy")
                                                                for d in ("float32", "int32")}
    assert [line for line in proc.stderr.splitlines() if line.startswith("progress: ")][-1] == "progress: 4/4 local"


def _probe_with_hosts(tmp_path: Path, hosts: list[str], machine: str | None) -> subprocess.CompletedProcess[str]:
    """The probe on ``len(hosts)`` ranks told their hosts; with ``machine``, rank r runs under the machine name
    that shell arithmetic on ``machine`` gives (each rank in a UTS namespace of its own: root only)."""
    spec = tmp_path / "tests.json"
    spec.write_text(json.dumps({"tests": [{"id": "local", "kind": "local", "bytes": 4096, "dtypes": ["float32"],
                                           "reps": 1}], "timeout_s": 30, "hosts": hosts}))
    probe = [sys.executable, "-m", "topocc.runtime.harness.probe", str(spec)]
    ranks = [find_mpiexec(), "-n", str(len(hosts))]
    if machine is None:
        cmd = [*ranks, *RANK_WRAPPER, *probe]
    else:
        cmd = [*ranks, "unshare", "--uts", "sh", "-c", f'hostname "node-$(({machine}))"; exec "$@"', "sh", *probe]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_ranks_on_one_machine_pass_the_placement_check(tmp_path: Path) -> None:
    proc = _probe_with_hosts(tmp_path, ["h0", "h0", "h1", "h1"], None)
    assert proc.returncode == 0 and '"id": "local"' in proc.stdout, proc.stderr[-2000:]


@pytest.mark.root
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (a machine name per rank)")
def test_a_placement_other_than_the_topologys_is_refused_before_measuring(tmp_path: Path) -> None:
    proc = _probe_with_hosts(tmp_path, ["h0", "h0", "h1", "h1"], "PMI_RANK % 2")  # round robin: hosts split
    errors = [line for line in proc.stderr.splitlines() if line.startswith("topocc:")]
    assert proc.returncode != 0 and proc.stdout == "" and len(errors) == 1
    assert errors[0].startswith("topocc: rank placement: ranks 0-1 belong to host h0 but run on node-0 (rank 0) "
                                "and node-1 (rank 1) (fix: give mpiexec one machine per host")
    proc = _probe_with_hosts(tmp_path, ["h0", "h0", "h1", "h1"], "PMI_RANK / 2")  # filled machine by machine
    assert proc.returncode == 0 and '"id": "local"' in proc.stdout, proc.stderr[-2000:]


def test_the_tests_file_need_only_be_on_one_ranks_machine(tmp_path: Path) -> None:
    """Ranks whose machine lacks the file (here: given a path that does not exist) get it from one that has it;
    where none has it, rank 0 says so in one line."""
    spec = tmp_path / "tests.json"
    spec.write_text(json.dumps({"tests": [{"id": "local", "kind": "local", "bytes": 4096, "dtypes": ["float32"],
                                           "reps": 1}], "timeout_s": 30}))
    missing = tmp_path / "elsewhere" / "tests.json"
    for readable, code in (("2", 0), ("none", 5)):
        pick = f'if [ "$PMI_RANK" = "{readable}" ]; then f={spec}; else f={missing}; fi; exec "$@" "$f"'
        cmd = [find_mpiexec(), "-n", "3", "sh", "-c", pick, "sh", sys.executable, "-m", "topocc.runtime.harness.probe"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == code, proc.stderr[-2000:]
        if code == 0:
            assert '"id": "local"' in proc.stdout
        else:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("topocc:")]
            assert errors == [f"topocc: no rank can read {missing} (fix: run topocc calibrate on a machine of the "
                              "host file, or with TMPDIR on a folder every machine shares)"]
