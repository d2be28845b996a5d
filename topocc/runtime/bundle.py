"""A plan bundle: every plan a training job needs, one per collective and process group, in one folder.

A job issues several collectives (DDP's all-reduce, FSDP's reduce-scatter and
all-gather, a broadcast at start) on the world and on subgroups (a node's ranks
for hybrid sharding or DASO).  A bundle holds a plan (size buckets, ``plan.py``)
for each, keyed by the collective, the group's global ranks and, for broadcast
and reduce, the root.  On disk it is a folder: ``bundle.json`` lists the plans,
each a plan file beside it that ``topocc inspect`` and ``simulate`` read as any
other::

    {"format": "topocc-bundle", "version": 1, "world": 12, "topology": "emu-racks",
     "fingerprint": "...", "plans": [{"file": "allreduce.json", "group": [0, 1, ...]}, ...]}

A single plan or schedule file is a bundle of one plan for the world.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.plan import PLAN_FORMAT, Plan, as_plan, load_any, save_plan
from topocc.runtime.schedule import read_json_document

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "MANIFEST", "ROOTED", "Bundle", "BundlePlan", "group_label",
           "load_bundle", "rank_ranges", "save_bundle"]

BUNDLE_FORMAT = "topocc-bundle"
BUNDLE_VERSION = 1
#: The manifest's name inside a bundle folder.
MANIFEST = "bundle.json"
#: Collectives whose plans hold for one root only.
ROOTED = ("broadcast", "reduce")


@dataclass(frozen=True, slots=True)
class BundlePlan:
    """One plan of a bundle and the process group it is for (global ranks, in group-rank order)."""

    plan: Plan
    group: tuple[int, ...]

    @property
    def collective(self) -> str:
        return self.plan.collective

    @property
    def root(self) -> int | None:
        """The root (a group rank) of a broadcast or reduce plan; None for the other collectives."""
        return self.plan.schedules[0].root if self.collective in ROOTED else None

    def key(self) -> tuple[str, tuple[int, ...], int | None]:
        return (self.collective, self.group, self.root)


@dataclass(frozen=True, slots=True)
class Bundle:
    """The plans of one job: for a world of ``world`` ranks, compiled on ``topology`` (name and fingerprint)."""

    world: int
    plans: tuple[BundlePlan, ...]
    topology: str | None = None
    fingerprint: str | None = None
    source: str = "<bundle>"
    digest: int = 0

    def __post_init__(self) -> None:
        seen: set[tuple[str, tuple[int, ...], int | None]] = set()
        for i, entry in enumerate(self.plans):
            where = f"{self.source}: plans[{i}]"
            if len(entry.group) != entry.plan.ranks:
                raise ScheduleFormatError(f"the group has {len(entry.group)} ranks but the plan is for "
                                          f"{entry.plan.ranks}", where=where, fix="recompile the bundle")
            if len(set(entry.group)) != len(entry.group) or not all(0 <= r < self.world for r in entry.group):
                raise ScheduleFormatError(f"the group must name distinct ranks of 0..{self.world - 1}", where=where)
            if entry.key() in seen:
                raise ScheduleFormatError(f"a second {entry.collective} plan for the same group", where=where,
                                          fix="keep one plan per collective, group and root")
            seen.add(entry.key())

    def find(self, collective: str, group: Sequence[int], root: int | None = None) -> Plan | None:
        """The plan for ``collective`` on the process group of global ranks ``group`` (and ``root``), if any."""
        key = (collective, tuple(group), root if collective in ROOTED else None)
        for entry in self.plans:
            if entry.key() == key:
                return entry.plan
        return None

    def plans_for(self, group: Sequence[int]) -> list[BundlePlan]:
        """The plans for the process group of global ranks ``group``."""
        return [e for e in self.plans if e.group == tuple(group)]

    def describe(self) -> str:
        """One line per plan: collective, group, root, buckets."""
        lines = []
        for e in self.plans:
            label = group_label(e.group, self.world)
            group = label if label == "world" else f"ranks {label}"
            root = f", root {e.root}" if e.root is not None else ""
            lines.append(f"{e.collective} on {group}{root}: {len(e.plan.schedules)} size bucket(s)")
        return "\n".join(lines)


def group_label(group: Sequence[int], world: int) -> str:
    """``world`` for all ranks in order, else the ranks compacted (``0-3,8``)."""
    return "world" if tuple(group) == tuple(range(world)) else rank_ranges(group)


def rank_ranges(ranks: Sequence[int]) -> str:
    """``0-3,8`` for [0, 1, 2, 3, 8]: ranks in their order, runs of consecutive ones as ranges."""
    parts: list[str] = []
    start = prev = None
    for r in [*ranks, None]:
        if r is not None and prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    return ",".join(parts)


def _plan_file(entry: BundlePlan, world: int) -> str:
    label = group_label(entry.group, world)
    group = label if label == "world" else "ranks" + label.replace(",", "_")
    root = f"-root{entry.root}" if entry.root is not None else ""
    return f"{entry.collective}-{group}{root}.json"


def save_bundle(bundle: Bundle, folder: str | Path) -> Path:
    """Write ``bundle`` into ``folder`` (created): one plan file per plan and the manifest; returns the manifest."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for entry in bundle.plans:
        name = _plan_file(entry, bundle.world)
        save_plan(entry.plan, folder / name)
        rows.append({"file": name, "group": list(entry.group)})
    doc = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "world": bundle.world, "topology": bundle.topology,
           "fingerprint": bundle.fingerprint, "plans": rows}
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps(doc, indent=1) + "\n")
    return manifest


def _manifest(doc: Any, source: str) -> tuple[int, list[tuple[str, tuple[int, ...] | None]], Any, Any]:
    """The world size, (file, group) rows, topology and fingerprint of a manifest, checked field by field."""
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT:
        raise ScheduleFormatError("not a topocc bundle manifest", where=source,
                                  fix=f"pass a folder written by topocc bundle, or its {MANIFEST}")
    if doc.get("version") != BUNDLE_VERSION:
        raise ScheduleFormatError(f"unsupported bundle format version {doc.get('version')!r}", where=source,
                                  fix="recompile the bundle with this version of topocc")
    unknown = set(doc) - {"format", "version", "world", "topology", "fingerprint", "plans"}
    if unknown:
        raise ScheduleFormatError(f"unknown field {sorted(unknown)[0]!r}", where=source)
    world = doc.get("world")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ScheduleFormatError("world must be a positive integer", where=f"{source}: world")
    for key in ("topology", "fingerprint"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise ScheduleFormatError(f"{key} must be a string or null", where=f"{source}: {key}")
    plans = doc.get("plans")
    if not isinstance(plans, list) or not plans:
        raise ScheduleFormatError("plans must be a non-empty array", where=f"{source}: plans")
    rows: list[tuple[str, tuple[int, ...] | None]] = []
    for i, row in enumerate(plans):
        where = f"{source}: plans[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("file"), str) or set(row) - {"file", "group"}:
            raise ScheduleFormatError('each plan must be {"file": NAME, "group": [RANK, ...]}', where=where)
        name, group = row["file"], row.get("group")
        if "/" in name or "\\" in name or name.startswith("."):
            raise ScheduleFormatError(f"plan file {name!r} must be a plain name inside the bundle folder",
                                      where=where)
        if group is not None and (not isinstance(group, list) or not all(
                isinstance(r, int) and not isinstance(r, bool) for r in group)):
            raise ScheduleFormatError("group must be an array of global ranks", where=f"{where}: group")
        rows.append((name, tuple(group) if group is not None else None))
    return world, rows, doc.get("topology"), doc.get("fingerprint")


def load_bundle(path: str | Path) -> Bundle:
    """The bundle at ``path``: a bundle folder, its manifest, or one plan or schedule file (a plan for the world)."""
    path = Path(path)
    manifest = path / MANIFEST if path.is_dir() else path
    if path.is_dir() and not manifest.exists():
        raise ScheduleFormatError(f"no {MANIFEST} in this folder", where=str(path),
                                  fix="compile one with: topocc bundle TOPOLOGY -o FOLDER")
    raw = read_json_document(manifest, "bundle")
    digest = zlib.crc32(json.dumps(raw, sort_keys=True).encode())
    # a document with plans is a manifest, even one whose format is wrong: _manifest says so
    if not (isinstance(raw, dict) and (raw.get("format") == BUNDLE_FORMAT or "plans" in raw)):
        plan = as_plan(load_any(manifest))
        meta = plan.schedules[0].metadata
        kind = "plan" if isinstance(raw, dict) and raw.get("format") == PLAN_FORMAT else "schedule"
        return Bundle(plan.ranks, (BundlePlan(plan, tuple(range(plan.ranks))),), meta.topology, meta.fingerprint,
                      f"{manifest} (one {kind})", digest)
    world, rows, topology, fingerprint = _manifest(raw, str(manifest))
    entries = []
    for i, (name, group) in enumerate(rows):
        if not (manifest.parent / name).is_file():
            raise ScheduleFormatError(f"plan file {name!r} is missing from the bundle folder",
                                      where=f"{manifest}: plans[{i}]", fix="copy the whole folder, or recompile it")
        plan = as_plan(manifest.parent / name)
        digest = zlib.crc32((manifest.parent / name).read_bytes(), digest)  # readable: as_plan just read it
        entries.append(BundlePlan(plan, group if group is not None else tuple(range(world))))
    return Bundle(world, tuple(entries), topology, fingerprint, str(manifest), digest)
