"""The shipped topologies by name, and the topology a compiled schedule was compiled for.

Shipped files live in the repository's ``topologies/`` (a source checkout) or, installed, in
``<prefix>/share/topocc/topologies``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

from topocc.planner.errors import SimulationError, TopoccError, UsageError
from topocc.planner.topology.model import Topology, parse_rank_ranges
from topocc.planner.topology.parse import load_topology
from topocc.runtime.schedule import Schedule

__all__ = ["SCHEDULED_MAX_RANKS", "compiled_for", "resolve_topology", "schedule_topology", "scheduled_topologies",
           "shipped_topologies", "split_ranks"]


def _shipped_dirs() -> list[Path]:
    """Where shipped topologies live: the source tree (editable install) or the installed share folder."""
    return [Path(__file__).resolve().parents[3] / "topologies", Path(sys.prefix) / "share" / "topocc" / "topologies"]


def shipped_topologies() -> dict[str, Path]:
    """Shipped topology files by name (file stem)."""
    found: dict[str, Path] = {}
    for folder in _shipped_dirs():
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return found


def resolve_topology(arg: str) -> Topology:
    """Load a topology from a path, or by the name of a shipped one (``dgx1-v100``).

    Either may end in ranks, ``emu-racks[0-3]``: the topology of that process group
    (:meth:`Topology.subset`), as a bundle's plans for a group record it.
    """
    path = Path(arg)
    whole, ranks = split_ranks(arg)
    if ranks is not None:
        return resolve_topology(whole).subset(ranks)
    if path.exists() or path.suffix in (".yaml", ".yml"):
        return load_topology(path)
    shipped = shipped_topologies()
    if arg in shipped:
        return load_topology(shipped[arg])
    raise UsageError(f"no topology file or shipped topology named {arg!r}",
                     fix=f"pass a YAML path or one of: {', '.join(shipped) or '(none shipped)'}")


def split_ranks(arg: str) -> tuple[str, tuple[int, ...] | None]:
    """``cluster.yaml[0-1,4-5]`` -> (``cluster.yaml``, (0, 1, 4, 5)): a topology argument and the ranks of the
    process group it ends in (None where it names none, or is a file whose name only looks so)."""
    group = re.fullmatch(r"(.+)\[([0-9,\- ]+)\]", arg)
    if group is None or Path(arg).exists():
        return arg, None
    return group[1], parse_rank_ranges(group[2])


def compiled_for(schedule: Schedule, topology: Topology) -> bool:
    """Whether ``schedule`` was compiled for ``topology`` (same fingerprint, or the schedule records none)."""
    return not schedule.metadata.fingerprint or schedule.metadata.fingerprint == topology.fingerprint


def schedule_topology(schedule: Schedule, schedule_path: str | Path | None = None,
                      override: str | None = None, *, what_if: bool = False) -> Topology:
    """The topology a schedule was compiled for: ``override``, else the file or shipped name it records.

    An explicit ``override`` is loaded as given, so its errors name it.  The
    topology's fingerprint must match the schedule's, so a schedule is never
    timed on a cluster it was not compiled for unless the caller asks for a
    what-if (``what_if=True``; then :func:`compiled_for` tells the two apart).
    """
    meta = schedule.metadata
    where = str(schedule_path) if schedule_path is not None else None
    topology = resolve_topology(override) if override else _recorded_topology(schedule, schedule_path)
    if topology.size != schedule.ranks:
        raise SimulationError(
            f"the schedule has {schedule.ranks} ranks but topology {topology.name} has {topology.size}",
            where=where, fix="pass the topology the schedule was compiled for",
        )
    if not what_if and not compiled_for(schedule, topology):
        if override:
            raise SimulationError(
                f"the schedule was compiled for {meta.topology or 'another topology'}, not {topology.name} "
                "(their fingerprints differ)", where=where,
                fix=f"pass --what-if to time it on {override} anyway, or compile one for it: topocc compile {override}",
            )
        raise SimulationError(
            f"topology {topology.name} has changed since the schedule was compiled (fingerprint mismatch)",
            where=where, fix="recompile the schedule, or pass --what-if to time it on the changed topology anyway",
        )
    return topology


def _recorded_topology(schedule: Schedule, schedule_path: str | Path | None) -> Topology:
    """The topology file or shipped name the schedule's metadata records, tried in turn."""
    meta = schedule.metadata
    candidates: list[Path | str] = []
    if meta.topology_file:
        candidates.append(Path(meta.topology_file))
        if schedule_path is not None:
            candidates.append(Path(schedule_path).parent / meta.topology_file)
    if meta.topology:
        candidates.append(meta.topology)
    tried = []
    for candidate in candidates:
        try:
            return resolve_topology(str(candidate))
        except TopoccError as exc:
            tried.append(f"{candidate} ({exc.message})")
    raise UsageError(
        "cannot find the topology this schedule was compiled for"
        + (f": tried {', '.join(tried)}" if tried else " (the schedule names none)"),
        where=str(schedule_path) if schedule_path is not None else None,
        fix="pass --topology TOPO (a YAML file or a shipped name)",
    )


#: ``schedules/`` holds the compiled schedule of every shipped topology up to this many ranks, what
#: ``compile-shipped`` compiles unless told which: a larger one takes minutes and tens of megabytes, so it
#: is compiled when named.
SCHEDULED_MAX_RANKS = 4096


def scheduled_topologies() -> Iterator[Topology]:
    """The shipped topologies whose schedules ``schedules/`` holds (at most :data:`SCHEDULED_MAX_RANKS` ranks),
    each loaded as it is reached: a caller that compiles them keeps one at a time."""
    for path in shipped_topologies().values():
        topology = load_topology(path)
        if topology.size <= SCHEDULED_MAX_RANKS:
            yield topology
