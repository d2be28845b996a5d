"""A plan bundle: every plan a training job needs, one per collective and process group, in one folder.

A job issues several collectives (DDP's all-reduce, FSDP's reduce-scatter and
all-gather, a broadcast at start) on the world and on subgroups (a node's ranks
for hybrid sharding or DASO).  A bundle holds a plan (size buckets, ``plan.py``)
for each, keyed by the collective, the group's global ranks and, for broadcast
and reduce, the root.  On disk it is a folder: ``bundle.json`` lists the plans,
each a plan file beside it that ``topocc inspect`` and ``simulate`` read as any
other::

    {"format": "topocc-bundle", "version": 1, "world": 12, "topology": "emu-racks",
     "fingerprint": "...", "plans": [{"file": "allreduce.json", "group": [0, 1, ...],
                                      "collective": "allreduce", "native_below_bytes": 65536}, ...]}

A plan's ``native_below_bytes`` is where the compiler predicts it stops
beating the native backend: smaller calls go native (null: every call; absent:
none).  A row that names its ``collective`` (and ``root``) has its plan file
parsed on first use, so a job pays only for the plans it calls; a process reads
a bundle once (:func:`load_bundle` keeps it per path and modification time).
A single plan or schedule file is a bundle of one plan for the world.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from topocc.runtime.collective import ROOTED
from topocc.runtime.collective import collective as describe
from topocc.runtime.documents import read_json_document
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.plan import PLAN_FORMAT, AnyPlan, LazyPlan, as_plan, load_any, read_lazy_plan, save_plan

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "MANIFEST", "ROOTED", "Bundle", "BundlePlan", "PlanFile", "group_label",
           "load_bundle", "rank_ranges", "save_bundle"]

BUNDLE_FORMAT = "topocc-bundle"
BUNDLE_VERSION = 1
#: The manifest's name inside a bundle folder.
MANIFEST = "bundle.json"


#: Parsed plan files of this process, by (path, modification time, size): a file is parsed once.
_PARSED: dict[tuple[str, int, int], LazyPlan] = {}
_PARSED_LOCK = threading.Lock()


def _stamp(path: Path) -> tuple[str, int, int]:
    """What names one version of a file: its path, modification time and size."""
    st = os.stat(path)
    return (str(path), st.st_mtime_ns, st.st_size)


@dataclass(frozen=True, slots=True)
class PlanFile:
    """A bundle's plan file, parsed on first use: its manifest row names the collective and root, so the bundle
    is keyed without reading it.  ``ranks`` is the group's size, ``where`` the manifest row (for errors)."""

    path: Path
    collective: str
    root: int | None
    ranks: int
    where: str
    digest: int

    def load(self) -> LazyPlan:
        """The plan, read once per process and each bucket parsed at its first use (:class:`LazyPlan`); one
        that disagrees with its row is refused naming the row."""
        stamp = _stamp(self.path)
        with _PARSED_LOCK:  # progress threads of several groups may ask at once
            plan = _PARSED.get(stamp)
            if plan is None:
                plan = read_lazy_plan(self.path, self.digest)
                root = (plan.root if plan.root is not None else 0) if plan.collective in ROOTED else None
                if (plan.collective, root) != (self.collective, self.root):
                    raise ScheduleFormatError(f"the file holds a {plan.collective} plan (root {root}) but the row "
                                              f"names {self.collective} (root {self.root})", where=self.where,
                                              fix="recompile the bundle")
                if plan.ranks != self.ranks:
                    raise ScheduleFormatError(f"the group has {self.ranks} ranks but the plan is for {plan.ranks}",
                                              where=self.where, fix="recompile the bundle")
                _PARSED[stamp] = plan
        return plan


@dataclass(frozen=True, slots=True, eq=False)
class BundlePlan:
    """One plan of a bundle and the process group it is for (global ranks, in group-rank order).

    ``source`` is the plan, or its file (parsed on first use of :attr:`plan`).  Calls of fewer than
    ``native_below`` bytes go to the native backend (None: every call), where the compiler predicts no gain.
    """

    source: AnyPlan | PlanFile
    group: tuple[int, ...]
    native_below: int | None = 0

    @property
    def plan(self) -> AnyPlan:
        return self.source.load() if isinstance(self.source, PlanFile) else self.source

    @property
    def collective(self) -> str:
        return self.source.collective

    @property
    def root(self) -> int | None:
        """The root (a group rank) of a broadcast or reduce plan; None for the other collectives."""
        if isinstance(self.source, PlanFile):
            return self.source.root
        return self.source.schedule(0).root if self.collective in ROOTED else None

    def key(self) -> tuple[str, tuple[int, ...], int | None]:
        return (self.collective, self.group, self.root)

    def __eq__(self, other: object) -> bool:
        """The same plan for the same group and threshold, parsed or not."""
        if not isinstance(other, BundlePlan):
            return NotImplemented
        return (self.group, self.native_below, self.plan) == (other.group, other.native_below, other.plan)

    def __hash__(self) -> int:
        return hash((self.key(), self.native_below))


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
            if not isinstance(entry.source, PlanFile) and len(entry.group) != entry.source.ranks:
                raise ScheduleFormatError(f"the group has {len(entry.group)} ranks but the plan is for "
                                          f"{entry.plan.ranks}", where=where, fix="recompile the bundle")
            if len(set(entry.group)) != len(entry.group) or not all(0 <= r < self.world for r in entry.group):
                raise ScheduleFormatError(f"the group must name distinct ranks of 0..{self.world - 1}", where=where)
            if entry.native_below is not None and entry.native_below < 0:
                raise ScheduleFormatError("native_below must be a size in bytes, at least 0, or null", where=where)
            if entry.key() in seen:
                raise ScheduleFormatError(f"a second {entry.collective} plan for the same group", where=where,
                                          fix="keep one plan per collective, group and root")
            seen.add(entry.key())

    def find(self, collective: str, group: Sequence[int], root: int | None = None) -> AnyPlan | None:
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
        """One line per plan: collective, group, root, buckets (reading every plan), native threshold."""
        lines = []
        for e in self.plans:
            label = group_label(e.group, self.world)
            group = label if label == "world" else f"ranks {label}"
            root = f", root {e.root}" if e.root is not None else ""
            native = ("" if e.native_below == 0 else ", native at every size" if e.native_below is None
                      else f", native below {e.native_below} B")
            lines.append(f"{e.collective} on {group}{root}: {e.plan.bucket_count} size bucket(s){native}")
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
        row: dict[str, Any] = {"file": name, "group": list(entry.group), "collective": entry.collective}
        if entry.root is not None:
            row["root"] = entry.root
        row["native_below_bytes"] = entry.native_below
        rows.append(row)
    doc = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "world": bundle.world, "topology": bundle.topology,
           "fingerprint": bundle.fingerprint, "plans": rows}
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps(doc, indent=1) + "\n")
    return manifest


@dataclass(frozen=True, slots=True)
class _Row:
    """One manifest row: the plan file's name, the group (None: the world), and the optional keys."""

    file: str
    group: tuple[int, ...] | None
    collective: str | None
    root: int | None
    native_below: int | None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _row(row: Any, where: str) -> _Row:
    """A manifest row, checked field by field."""
    if not isinstance(row, dict) or not isinstance(row.get("file"), str) or set(row) - _ROW_KEYS:
        raise ScheduleFormatError('each plan must be {"file": NAME, "group": [RANK, ...]} (and optionally '
                                  '"collective", "root", "native_below_bytes")', where=where)
    name, group = row["file"], row.get("group")
    if "/" in name or "\\" in name or name.startswith("."):
        raise ScheduleFormatError(f"plan file {name!r} must be a plain name inside the bundle folder", where=where)
    if group is not None and (not isinstance(group, list) or not all(_is_int(r) for r in group)):
        raise ScheduleFormatError("group must be an array of global ranks", where=f"{where}: group")
    collective = row.get("collective")
    if collective is not None:
        if not isinstance(collective, str):
            raise ScheduleFormatError("collective must be a string", where=f"{where}: collective")
        try:
            collective = describe(collective).name
        except ScheduleFormatError as exc:
            raise ScheduleFormatError(exc.message, where=f"{where}: collective", fix=exc.fix) from None
    root = row.get("root")
    if root is not None and not (_is_int(root) and root >= 0 and collective in ROOTED):
        raise ScheduleFormatError("root must be a rank of the group, for a broadcast or reduce row only",
                                  where=f"{where}: root")
    if collective in ROOTED and root is None:
        raise ScheduleFormatError(f"a {collective} row must name its root", where=where, fix="recompile the bundle")
    below = row.get("native_below_bytes", 0)
    if below is not None and not (_is_int(below) and below >= 0):
        raise ScheduleFormatError("native_below_bytes must be a size in bytes, at least 0, or null",
                                  where=f"{where}: native_below_bytes")
    return _Row(name, tuple(group) if group is not None else None, collective, root, below)


#: The keys a manifest row may have.
_ROW_KEYS = frozenset({"file", "group", "collective", "root", "native_below_bytes"})


def _manifest(doc: Any, source: str) -> tuple[int, list[_Row], Any, Any]:
    """The world size, rows, topology and fingerprint of a manifest, checked field by field."""
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
    if not _is_int(world) or world < 1:
        raise ScheduleFormatError("world must be a positive integer", where=f"{source}: world")
    for key in ("topology", "fingerprint"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise ScheduleFormatError(f"{key} must be a string or null", where=f"{source}: {key}")
    plans = doc.get("plans")
    if not isinstance(plans, list) or not plans:
        raise ScheduleFormatError("plans must be a non-empty array", where=f"{source}: plans")
    rows = [_row(row, f"{source}: plans[{i}]") for i, row in enumerate(plans)]
    return world, rows, doc.get("topology"), doc.get("fingerprint")


#: Bundles this process has read, by the stamps (:func:`_stamp`) of the manifest and its plan files.
_LOADED: dict[tuple[tuple[str, int, int], ...], Bundle] = {}


def load_bundle(path: str | Path) -> Bundle:
    """The bundle at ``path``: a bundle folder, its manifest, or one plan or schedule file (a plan for the world).

    Read once per process while the files are unchanged; a row naming its collective has its plan file parsed
    on first use (:class:`PlanFile`), a row without one (older bundles) now.
    """
    path = Path(path)
    manifest = path / MANIFEST if path.is_dir() else path
    if path.is_dir() and not manifest.exists():
        raise ScheduleFormatError(f"no {MANIFEST} in this folder", where=str(path),
                                  fix="compile one with: topocc bundle TOPOLOGY -o FOLDER")
    raw = read_json_document(manifest, "bundle")
    rows = raw.get("plans") if isinstance(raw, dict) else None
    names = [r["file"] for r in rows if isinstance(r, dict) and isinstance(r.get("file"), str)] \
        if isinstance(rows, list) else []
    try:
        key = tuple(_stamp(p) for p in (manifest, *(manifest.parent / n for n in names)))
    except OSError:
        key = ()  # a missing plan file: reading it below says which
    if key and key in _LOADED:
        return _LOADED[key]
    bundle = _read_bundle(manifest, raw)
    if key:
        _LOADED[key] = bundle
    return bundle


def _read_bundle(manifest: Path, raw: Any) -> Bundle:
    """The bundle of the manifest (or single plan file) ``manifest``, whose JSON is ``raw``."""
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
    for i, row in enumerate(rows):
        where = f"{manifest}: plans[{i}]"
        file = manifest.parent / row.file
        try:
            data = file.read_bytes()
        except OSError:
            raise ScheduleFormatError(f"plan file {row.file!r} is missing from the bundle folder", where=where,
                                      fix="copy the whole folder, or recompile it") from None
        digest = zlib.crc32(data, digest)
        group = row.group if row.group is not None else tuple(range(world))
        source: AnyPlan | PlanFile = (PlanFile(file, row.collective, row.root, len(group), where, zlib.crc32(data))
                                      if row.collective is not None else as_plan(file))
        entries.append(BundlePlan(source, group, row.native_below))
    return Bundle(world, tuple(entries), topology, fingerprint, str(manifest), digest)
