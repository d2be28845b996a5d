"""The store control plane: three processes agree over a FileStore, and a missing rank is a timeout, not a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

REPO = Path(__file__).resolve().parents[2]

RANK = r'''
import json, sys, time
import torch.distributed as dist
from topocc.runtime.transports.store import StoreControl

rank, world, path, present = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
control = StoreControl(dist.FileStore(path, world), rank, world)
out = {"rank": rank}
out["rows"] = control.allgather_ints([rank, 10 * rank, -rank], 20.0)
out["barrier"] = control.barrier(20.0)
out["max"] = control.max_float(0.5 * rank)
if rank < present:  # the last rank skips this call: the others must give up after 1 s
    start = time.monotonic()
    out["missing"] = control.allgather_ints([1], 1.0)
    out["waited"] = time.monotonic() - start
print(json.dumps(out), flush=True)
'''


def test_three_ranks_agree_and_a_missing_rank_times_out(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    world = 3
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), str(tmp_path / "store"),
                               str(world - 1)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    rows = []
    start = time.monotonic()
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err[-2000:]
        rows.append(json.loads(out.strip().splitlines()[-1]))
    assert time.monotonic() - start < 60
    for row in rows:
        assert row["rows"] == [[r, 10 * r, -r] for r in range(world)]
        assert row["barrier"] is True and row["max"] == 1.0
    for row in rows[:world - 1]:
        assert row["missing"] is None and 0.9 < row["waited"] < 10


def test_a_rank_outside_the_world_is_refused() -> None:
    import torch.distributed as dist

    from topocc.runtime.errors import CommunicatorError
    from topocc.runtime.transports.store import StoreControl

    with pytest.raises(CommunicatorError, match=r"rank 3 is not in 0\.\.2"):
        StoreControl(dist.HashStore(), 3, 3)
