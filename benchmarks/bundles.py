"""Plan bundles for the torchrun benchmarks (``conformance.py``, ``fault_trials.py``), compiled by ``topocc bundle``.

A bundle for ``world`` ranks is compiled for the first ``world`` ranks of the shipped ``emu-uniform``
(hosts of 2 ranks behind one switch), as the README's torchrun section does, and kept in a folder: a
folder that already holds a bundle is reused.  Its plans then run at every size: ``topocc bundle`` hands
the sizes where it predicts gloo as fast to gloo (each plan's ``native_below``), which for these small
tensors is nearly every call, and these benchmarks are about the plans' replay.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from topocc.runtime.bundle import load_bundle, save_bundle

REPO = Path(__file__).resolve().parent.parent
#: The shipped topology whose first ranks the bundles are for.
TOPOLOGY = "emu-uniform"


def compile_bundle(world: int, folder: Path, collectives: Sequence[str], *, size: str = "1KiB:16MiB",
                   groups: Sequence[str] = (), limit_s: float = 900) -> Path:
    """``topocc bundle emu-uniform[0-(world-1)] -o folder -c ... --size size --group ...``; returns ``folder``."""
    if (folder / "bundle.json").is_file():
        return folder
    cmd = [sys.executable, "-m", "topocc.planner.cli", "bundle", f"{TOPOLOGY}[0-{world - 1}]", "-o", str(folder),
           "--size", size, "--no-progress", *(a for c in collectives for a in ("-c", c)),
           *(a for g in groups for a in ("--group", g))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        raise RuntimeError(f"topocc bundle failed for {world} ranks: {done.stderr.strip()[-2000:]}")
    plans_at_every_size(folder)
    return folder


def plans_at_every_size(folder: Path) -> None:
    """Rewrite the bundle in ``folder`` with every plan running at every size (``native_below`` 0)."""
    bundle = load_bundle(folder)
    plans = tuple(dataclasses.replace(e, source=e.plan, native_below=0) for e in bundle.plans)
    save_bundle(dataclasses.replace(bundle, plans=plans), folder)
