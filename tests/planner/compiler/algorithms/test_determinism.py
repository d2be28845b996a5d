"""Compiling is deterministic: the same topology gives byte-identical schedules in fresh processes.

Python randomises string hashes per process, so any set or dict of device names that
feeds an ordering (LP rows, edge choice, tie-breaks) would show up here.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = """
import hashlib
from topocc.planner.compiler.algorithms import get_algorithm
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.schedule import dump_schedule
topology = resolve_topology("emu-racks")
for name in ("ring", "tree", "hierarchical", "multitree", "treepack"):
    schedule = get_algorithm(name).load()(Network(topology), "allreduce", Options(size_bytes=64 << 20))
    print(name, hashlib.sha256(dump_schedule(schedule).encode()).hexdigest())
"""


def _digests(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_schedules_do_not_depend_on_string_hashing() -> None:
    first = _digests("1")
    assert len(first.splitlines()) == 5
    assert first == _digests("2")
