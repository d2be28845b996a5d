"""The probe under mpiexec on loopback: every test kind runs and reports what the planner's fit reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topocc.runtime.launch import RANK_WRAPPER, find_mpiexec

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
    cmd = [find_mpiexec(), "-n", "3", *RANK_WRAPPER, sys.executable, "-m", "topocc.runtime.probe", str(spec)]
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
