"""``topocc torchbench``'s plans: the bundle the ``topocc`` backend runs, given or compiled as ``topocc bundle`` would.

With ``--bundle`` the folder is used as it is; with ``--topology`` (or, by default, the first ranks of the
shipped :data:`DEFAULT_TOPOLOGY`, as the README's torchrun section compiles) a bundle of the sweep's
collective over its sizes is compiled into a temporary folder, with each plan's native threshold as
``topocc bundle`` writes it.  The sweep itself is the runtime's
(:func:`topocc.runtime.harness.torchbench.torchrun.run_torchbench`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from topocc.planner.compiler.bundling import compile_bundle, requests_for
from topocc.planner.errors import UsageError
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.bundle import save_bundle
from topocc.runtime.harness.torchbench.sweep import Sweep
from topocc.runtime.harness.torchbench.torchrun import Row, TorchbenchResult, preflight, run_torchbench

__all__ = ["DEFAULT_TOPOLOGY", "compile_for_sweep", "default_topology", "torchbench"]

#: The shipped topology whose first ranks the plans are compiled for when neither a bundle nor a topology is
#: given: hosts of 2 ranks behind one switch, 8 ranks in all.
DEFAULT_TOPOLOGY = "emu-uniform"
_DEFAULT_RANKS = 8


def default_topology(ranks: int) -> str:
    """``emu-uniform[0-(ranks-1)]``; more ranks than it has are refused, naming the options that fix it."""
    if ranks > _DEFAULT_RANKS:
        raise UsageError(f"the default topology ({DEFAULT_TOPOLOGY}) has {_DEFAULT_RANKS} ranks, not {ranks}",
                         fix="pass --topology FILE (your cluster) or --bundle FOLDER (topocc bundle's)")
    return f"{DEFAULT_TOPOLOGY}[0-{ranks - 1}]"


def compile_for_sweep(topology: str, sweep: Sweep, folder: Path) -> str:
    """Compile the sweep's collective (its root, over its sizes) for ``topology`` into ``folder``, as
    ``topocc bundle TOPOLOGY -c COLLECTIVE -s MIN:MAX --root ROOT`` does; returns the topology's name."""
    topo = resolve_topology(topology)
    if topo.size != sweep.ranks:
        raise UsageError(f"--topology {topology} has {topo.size} ranks but --ranks is {sweep.ranks}",
                         fix=f"pass --ranks {topo.size}, or a process group of it: --topology "
                             f"'{topology}[0-{sweep.ranks - 1}]'")
    requests = requests_for(topo.size, (sweep.collective,), sweep.sizes[0], sweep.sizes[-1], (), sweep.root)
    bundle, _ = compile_bundle(topo, requests)
    save_bundle(bundle, folder)
    return topo.name


def torchbench(sweep: Sweep, *, bundle: str | None = None, topology: str | None = None, force_plans: bool = False,
               torchrun: str | None = None, progress: Callable[[str], None] | None = None,
               on_row: Callable[[Row], None] | None = None) -> TorchbenchResult:
    """Run ``sweep`` under torchrun with the plans of ``bundle``, or of a bundle compiled for ``topology``
    (default: :func:`default_topology`), at every size with ``force_plans``; ``progress`` gets a line as the
    bundle is compiled, ``on_row`` each measured row."""
    if "topocc" not in sweep.backends:
        if bundle is not None or topology is not None or force_plans:
            raise UsageError("--bundle, --topology and --force-plans are the topocc backend's, and --backend leaves "
                             "it out", fix="add topocc to --backend, or leave those options out")
        return run_torchbench(sweep, torchrun=torchrun, progress=on_row)
    if bundle is not None and topology is not None:
        raise UsageError("--bundle and --topology both name the plans", fix="pass one of them")
    torchrun = preflight(sweep, torchrun)  # no torch, torchrun or GPU: refused before the plans are compiled
    with tempfile.TemporaryDirectory(prefix="topocc-torchbench-") as tmp:
        if bundle is not None:
            folder, note = Path(bundle), f"the bundle {bundle}"
        else:
            name = topology if topology is not None else default_topology(sweep.ranks)
            if progress is not None:
                progress(f"torchbench: compiling {sweep.collective} for {name} over {sweep.sizes[0]} to "
                         f"{sweep.sizes[-1]} bytes")
            folder = Path(tmp) / "bundle"
            compiled = compile_for_sweep(name, sweep, folder)
            default = " (the default: pass --topology or --bundle for your cluster)" if topology is None else ""
            note = f"compiled for {compiled}{default}"
        return run_torchbench(sweep, bundle=folder, bundle_note=note, force_plans=force_plans, torchrun=torchrun,
                              progress=on_row)
