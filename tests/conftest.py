"""Shared fixtures: where the repository, its shipped topologies and ../shared live."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from topocc.planner.topology.model import Link, Topology
    from topocc.runtime.schedule import Op

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = REPO / "topologies"
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the repository; tests that need it skip where it is absent (a user's clone)."""
    if not SHARED.is_dir():
        pytest.skip("../shared (reference inputs beside the repository) is absent in this checkout")
    return SHARED


def run_bounded(cmd: Sequence[str], limit_s: float, what: str, **popen: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in a session of its own, capturing text output; past ``limit_s`` seconds kill its whole
    process group (mpiexec's ranks, a shell's children) and fail the test naming ``what``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **popen)  # type: ignore[call-overload]
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{what} ran past {limit_s:g} s and was killed\n{err[-3000:]}")
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def existing_link(topology: Topology, src: str, dst: str) -> Link:
    """The directed link ``src -> dst``, which the test expects: a missing one fails the test naming it."""
    link = topology.link(src, dst)
    assert link is not None, f"{topology.name} has no link {src} -> {dst}"
    return link


def peer_of(op: Op) -> int:
    """The rank a send or receive exchanges with, which the schedule format requires it to name."""
    assert op.peer is not None, f"a {op.kind} without a peer"
    return op.peer


def must_search(pattern: str, text: str, flags: int = 0) -> re.Match[str]:
    """``re.search`` where the test expects a match: none fails the test naming the pattern."""
    found = re.search(pattern, text, flags)
    assert found is not None, f"nothing matches {pattern!r}"
    return found


TWO_GPUS = """\
name: two-gpus
devices:
  - {name: g, type: gpu, count: 2}
links:
  - {ends: [g0, g1], bandwidth: 10 GB/s, latency: 1 us}
"""


@pytest.fixture(scope="session")
def two_rank_schedule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ring allreduce compiled for a 2-GPU topology, the topology file beside it (so it can be simulated)."""
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.compiler.options import Options
    from topocc.planner.topology.parse import load_topology
    from topocc.runtime.schedule import save_schedule

    folder = tmp_path_factory.mktemp("two-gpus")
    (folder / "two-gpus.yaml").write_text(TWO_GPUS)
    compiled = compile_schedule(load_topology(folder / "two-gpus.yaml"), "allreduce", "ring",
                                Options(size_bytes=64 << 10))
    save_schedule(compiled.schedule, folder / "ring.json")
    return folder / "ring.json"
