"""``TOPOCC_TOPOLOGY``: the cluster a job says it runs on, checked against the one its bundle was compiled for.

A bundle records the topology's name and fingerprint (its manifest) and, in the world plan's schedules, the
file it was compiled from, with the ranks where it was a process group of a larger file (``cluster.yaml[0-3]``,
as ``topocc bundle 'cluster.yaml[0-3]'`` loads it).  The job may name the cluster by any of these: the name,
the fingerprint, or that file's path, alone or with those ranks.  The runtime never parses a topology (it
imports nothing of the planner), so a path is matched as the same file on disk, and trusted only where the
world plan's recorded fingerprint is the bundle's: the file the bundle was compiled from, not another.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from topocc.runtime.bundle import Bundle
from topocc.runtime.errors import CommunicatorError

__all__ = ["check_topology", "compiled_from"]

_GROUP = re.compile(r"(.+)\[([0-9,\- ]+)\]")


def _split(text: str) -> tuple[str, tuple[int, ...] | None]:
    """``cluster.yaml[0-1,4-5]`` -> (``cluster.yaml``, (0, 1, 4, 5)); without ranks, (text, None)."""
    match = _GROUP.fullmatch(text.strip())
    if match is None:
        return text.strip(), None
    ranks: list[int] = []
    for part in match[2].replace(" ", "").split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return text.strip(), None
        ranks.extend(range(int(first), int(last or first) + 1))
    return match[1], tuple(ranks)


def compiled_from(bundle: Bundle) -> str | None:
    """The topology file (with ranks, for a process group's) the bundle's world plan was compiled from, if it
    records one whose fingerprint is the bundle's."""
    world = tuple(range(bundle.world))
    entry = next((e for e in bundle.plans if e.group == world), None)
    if entry is None:
        return None
    meta = entry.plan.schedule(0).metadata
    if bundle.fingerprint and meta.fingerprint and meta.fingerprint != bundle.fingerprint:
        return None  # a plan of another topology: its file says nothing about this bundle's
    return meta.topology_file


def _located(recorded: str, bundle: Bundle) -> Path | None:
    """The ``recorded`` file (ranks left off), recorded relative to where ``topocc bundle`` ran: found from here,
    or from the folder holding the bundle; None where it is not a file (a topology given as text)."""
    file = _split(recorded)[0]
    holder = Path(bundle.source.split(" (")[0]).resolve().parent
    for base in (Path.cwd(), holder.parent, holder):
        if (base / file).is_file():
            return base / file
    return None


def _accepted(bundle: Bundle, expected: str) -> bool:
    """Whether ``expected`` names the bundle's topology (see :func:`check_topology`)."""
    if expected in (bundle.topology, bundle.fingerprint):
        return True
    name, ranks = _split(expected)
    if bundle.topology is not None and ranks is None and _split(bundle.topology)[0] == name:
        return True  # the cluster's name, for a bundle compiled for a process group of it
    recorded = compiled_from(bundle)
    if recorded is None:
        return False
    found = _located(recorded, bundle)
    if found is None or not Path(name).is_file():
        return False
    every = _split(recorded)[1] or tuple(range(bundle.world))  # a file compiled whole: all its ranks, in order
    return (ranks is None or ranks == every) and os.path.samefile(name, found)


def check_topology(bundle: Bundle, expected: str, env: str = "TOPOCC_TOPOLOGY", plan_env: str = "TOPOCC_PLAN"
                   ) -> None:
    """Refuse ``bundle`` unless ``expected`` (``env``'s value) names the topology it was compiled for: its name,
    its fingerprint, or the file it was compiled from (alone, or with the ranks it was compiled for).  The
    message's fix works as written: either value to set ``env`` to, or the command that compiles a bundle
    for ``expected``."""
    if _accepted(bundle, expected):
        return
    recorded = compiled_from(bundle)
    if recorded is not None and _located(recorded, bundle) is None:
        recorded = None  # text, or a file not here: no help to name
    names = [shlex.quote(v) for v in dict.fromkeys(x for x in (bundle.topology, recorded) if x)]
    source = f" (from {recorded})" if recorded and recorded != bundle.topology else ""
    same = f"if it is the cluster the bundle was compiled for, set {env}={' or '.join(names)}; " if names else ""
    raise CommunicatorError(
        f"the plan bundle was compiled for {bundle.topology or 'an unnamed topology'}{source} but {env} names "
        f"{expected}", where=bundle.source,
        fix=f"{same}else compile one for it: topocc bundle {shlex.quote(expected)} -o FOLDER and set {plan_env}=FOLDER")
