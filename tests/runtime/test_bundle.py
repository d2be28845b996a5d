"""Plan bundles (a folder of plans and its manifest) and the call record a job writes for ``topocc bundle``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from topocc.runtime.bundle import MANIFEST, Bundle, BundlePlan, PlanFile, load_bundle, save_bundle
from topocc.runtime.calls import Call, CallLog, read_calls
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.plan import Plan, save_plan
from topocc.runtime.schedule import Chunk, Copy, Metadata, Schedule, build_schedule, save_schedule


def copies(collective: str, ranks: int, root: int | None = None, buckets: int = 1) -> Plan:
    """A plan of ``buckets`` schedules whose every rank copies its input out: well-formed, enough for a bundle."""
    lows = [0, *(1 << (10 + 2 * i) for i in range(buckets - 1))]
    return Plan(tuple(
        build_schedule(collective, ranks, 1, 1, [[Copy(Chunk("i", 0), Chunk("o", 0))]] * ranks, root=root,
                       metadata=Metadata(algorithm=f"copy{i}", topology="t", fingerprint="f", min_bytes=lo,
                                         max_bytes=hi))
        for i, (lo, hi) in enumerate(zip(lows, [*lows[1:], None]))))


WORLD = 4
BUNDLE = Bundle(WORLD, (BundlePlan(copies("allreduce", 4, buckets=3), (0, 1, 2, 3)),
                        BundlePlan(copies("allreduce", 2), (2, 3)),
                        BundlePlan(copies("allreduce", 2), (3, 2)),
                        BundlePlan(copies("broadcast", 3, root=1), (0, 2, 3)),
                        BundlePlan(copies("broadcast", 3, root=2), (0, 2, 3))), "t", "f")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_bundle(BUNDLE, tmp_path / "b")
    return tmp_path / "b"


def test_a_bundle_loads_from_its_folder_or_its_manifest(folder: Path) -> None:
    for path in (folder, folder / MANIFEST, str(folder)):
        loaded = load_bundle(path)
        assert loaded.plans == BUNDLE.plans
        assert (loaded.world, loaded.topology, loaded.fingerprint) == (WORLD, "t", "f")
        assert loaded.source == str(folder / MANIFEST) and loaded.digest
    doc = json.loads((folder / MANIFEST).read_text())
    assert doc["format"] == "topocc-bundle" and doc["version"] == 1 and doc["world"] == WORLD
    assert [row["group"] for row in doc["plans"]] == [list(e.group) for e in BUNDLE.plans]
    assert sorted(p.name for p in folder.iterdir()) == sorted([MANIFEST, *(row["file"] for row in doc["plans"])])


def test_find_by_collective_group_and_root(folder: Path) -> None:
    bundle = load_bundle(folder)
    assert bundle.find("allreduce", [0, 1, 2, 3]) == BUNDLE.plans[0].plan
    assert bundle.find("allreduce", (3, 2), root=7) == BUNDLE.plans[2].plan  # a root means nothing to allreduce
    assert bundle.find("broadcast", (0, 2, 3), 2) == BUNDLE.plans[4].plan
    assert bundle.find("broadcast", (0, 2, 3)) is None and bundle.find("allreduce", (1, 2)) is None
    assert bundle.describe().splitlines() == [
        "allreduce on world: 3 size bucket(s)", "allreduce on ranks 2-3: 1 size bucket(s)",
        "allreduce on ranks 3,2: 1 size bucket(s)", "broadcast on ranks 0,2-3, root 1: 1 size bucket(s)",
        "broadcast on ranks 0,2-3, root 2: 1 size bucket(s)"]


def test_the_digest_changes_with_a_plan(folder: Path) -> None:
    before = load_bundle(folder).digest
    assert load_bundle(folder).digest == before
    name = json.loads((folder / MANIFEST).read_text())["plans"][1]["file"]
    save_plan(copies("allreduce", 2, buckets=2), folder / name)
    assert load_bundle(folder).digest != before


def test_thresholds_round_trip_and_an_older_manifest_has_none(folder: Path) -> None:
    thresholded = Bundle(WORLD, (BundlePlan(copies("allreduce", 4, buckets=3), (0, 1, 2, 3), 65536),
                                 BundlePlan(copies("broadcast", 3, root=1), (0, 2, 3), None)), "t", "f")
    save_bundle(thresholded, folder)
    loaded = load_bundle(folder)
    assert [e.native_below for e in loaded.plans] == [65536, None] and loaded.plans == thresholded.plans
    assert loaded.describe().splitlines() == [
        "allreduce on world: 3 size bucket(s), native below 65536 B",
        "broadcast on ranks 0,2-3, root 1: 1 size bucket(s), native at every size"]
    doc = manifest(folder)  # as topocc wrote it before rows named their collective and threshold
    doc["plans"] = [{"file": r["file"], "group": r["group"]} for r in doc["plans"]]
    (folder / MANIFEST).write_text(json.dumps(doc))
    older = load_bundle(folder)
    assert [e.native_below for e in older.plans] == [0, 0] and older.plans[1].root == 1
    assert all(isinstance(e.source, Plan) for e in older.plans)  # no collective in the row: read at once


def test_a_bundle_is_read_once_and_its_plans_on_first_use(folder: Path) -> None:
    first = load_bundle(folder)
    assert load_bundle(folder / MANIFEST) is first  # the same files: the same bundle, not read again
    assert all(isinstance(e.source, PlanFile) for e in first.plans)
    plan = first.plans[0].plan
    assert first.plans[0].plan is plan and load_bundle(folder).plans[0].plan is plan  # parsed once
    name = manifest(folder)["plans"][1]["file"]
    save_plan(copies("allreduce", 2, buckets=2), folder / name)  # a changed file: read again
    again = load_bundle(folder)
    assert again is not first and len(again.plans[1].plan.schedules) == 2


@pytest.mark.parametrize("kind", ["plan", "schedule"])
def test_one_plan_or_schedule_file_is_a_bundle_for_the_world(kind: str, tmp_path: Path) -> None:
    plan = copies("allreduce", 3, buckets=2 if kind == "plan" else 1)
    path = tmp_path / f"{kind}.json"
    if kind == "plan":
        save_plan(plan, path)
    else:
        save_schedule(plan.schedules[0], path)
    bundle = load_bundle(path)
    assert bundle.world == 3 and [e.group for e in bundle.plans] == [(0, 1, 2)]
    assert bundle.plans[0].plan == plan and bundle.source == f"{path} (one {kind})"
    assert (bundle.topology, bundle.fingerprint) == ("t", "f")
    assert bundle.find("allreduce", range(3)) == plan


def manifest(folder: Path, **changes: Any) -> dict[str, Any]:
    """The folder's manifest with ``changes`` (a value of None deletes the field)."""
    doc = json.loads((folder / MANIFEST).read_text())
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def row(folder: Path, i: int, **changes: Any) -> list[dict[str, Any]]:
    """The manifest's plans with row ``i`` changed."""
    rows = manifest(folder)["plans"]
    rows[i] = rows[i] | changes
    return rows


BAD = {
    "wrong format": (lambda f: manifest(f, format="topocc-bundel"), ": not a topocc bundle manifest"),
    "version": (lambda f: manifest(f, version=2), ": unsupported bundle format version 2"),
    "unknown field": (lambda f: manifest(f, owner="me"), ": unknown field 'owner'"),
    "world missing": (lambda f: manifest(f, world=None), ": world: world must be a positive integer"),
    "world zero": (lambda f: manifest(f, world=0), ": world: world must be a positive integer"),
    "world text": (lambda f: manifest(f, world="4"), ": world: world must be a positive integer"),
    "world bool": (lambda f: manifest(f, world=True), ": world: world must be a positive integer"),
    "topology": (lambda f: manifest(f, topology=3), ": topology: topology must be a string or null"),
    "group text": (lambda f: manifest(f, plans=row(f, 1, group="2-3")), ": plans[1]: group: group must be an array"),
    "group bool": (lambda f: manifest(f, plans=row(f, 1, group=[2, True])), ": plans[1]: group: group must be"),
    "group outside": (lambda f: manifest(f, plans=row(f, 1, group=[3, 4])),
                      ": plans[1]: the group must name distinct ranks of 0..3"),
    "group twice": (lambda f: manifest(f, plans=row(f, 1, group=[3, 3])), ": plans[1]: the group must name distinct"),
    "group size": (lambda f: manifest(f, plans=row(f, 1, group=[0, 1, 2])),
                   ": plans[1]: the group has 3 ranks but the plan is for 2"),
    "no group, not the world": (lambda f: manifest(f, plans=row(f, 3, group=None)),
                                ": plans[3]: the group has 4 ranks but the plan is for 3"),
    "duplicate key": (lambda f: manifest(f, plans=row(f, 2, group=[2, 3])),
                      ": plans[2]: a second allreduce plan for the same group"),
    "row not an object": (lambda f: manifest(f, plans=["a.json"]), ": plans[0]: each plan must be"),
    "row field": (lambda f: manifest(f, plans=row(f, 0, owner="me")), ": plans[0]: each plan must be"),
    "root of an allreduce": (lambda f: manifest(f, plans=row(f, 0, root=0)), ": plans[0]: root: root must be a rank"),
    "broadcast without root": (lambda f: manifest(f, plans=[{k: v for k, v in r.items() if k != "root"}
                                                            for r in manifest(f)["plans"]]),
                               ": plans[3]: a broadcast row must name its root"),
    "unknown collective": (lambda f: manifest(f, plans=row(f, 0, collective="allsum")),
                           ": plans[0]: collective: unknown collective 'allsum'"),
    "another collective": (lambda f: manifest(f, plans=row(f, 1, collective="allgather")),
                           ": plans[1]: the file holds a allreduce plan (root None) but the row names allgather"),
    "negative threshold": (lambda f: manifest(f, plans=row(f, 0, native_below_bytes=-1)),
                           ": plans[0]: native_below_bytes: native_below_bytes must be a size in bytes"),
    "threshold text": (lambda f: manifest(f, plans=row(f, 0, native_below_bytes="64KiB")),
                       ": plans[0]: native_below_bytes: native_below_bytes must be a size in bytes"),
    "file with /": (lambda f: manifest(f, plans=row(f, 0, file="../b/x.json")),
                    ": plans[0]: plan file '../b/x.json' must be a plain name inside the bundle folder"),
    "file hidden": (lambda f: manifest(f, plans=row(f, 0, file=".x.json")), ": plans[0]: plan file '.x.json' must"),
    "missing file": (lambda f: manifest(f, plans=row(f, 3, file="gone.json")),
                     ": plans[3]: plan file 'gone.json' is missing from the bundle folder"),
    "empty plans": (lambda f: manifest(f, plans=[]), ": plans: plans must be a non-empty array"),
    "plans not a list": (lambda f: manifest(f, plans={"file": "a.json"}), ": plans: plans must be a non-empty"),
    "invalid JSON": (lambda f: '{"format": "topocc-bundle",', ": invalid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_manifest_is_one_line_naming_the_place(case: str, folder: Path) -> None:
    make, says = BAD[case]
    doc = make(folder)
    path = folder / MANIFEST
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ScheduleFormatError) as info:
        _ = [entry.plan for entry in load_bundle(folder).plans]  # a row's plan file is read on first use
    line = info.value.one_line()
    assert line.startswith(f"{path}{says}"), line
    assert "\n" not in line


def test_a_folder_without_a_manifest_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ScheduleFormatError, match=r"no bundle\.json in this folder.*topocc bundle TOPOLOGY -o FOLDER"):
        load_bundle(tmp_path)


def test_a_bad_plan_file_is_named_by_its_path(folder: Path) -> None:
    name = manifest(folder)["plans"][0]["file"]
    (folder / name).write_text('{"format": "topocc-plan", "version": 1}')
    bundle = load_bundle(folder)  # the manifest names the collective: the file is read when the plan is first used
    with pytest.raises(ScheduleFormatError, match=f"^{re.escape(str(folder / name))}: buckets: buckets must be"):
        _ = bundle.plans[0].plan


def test_the_call_log_writes_each_call_once_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    calls = [Call("allreduce", (0, 1, 2, 3), 4096, "float32", "sum"),
             Call("broadcast", (2, 0), 64, "int64", root=1, device="cuda"),
             Call("allgather", (0, 1), 0, "bfloat16")]
    log, other = CallLog(path), CallLog(path)  # two processes' logs append to one file
    for call in [*calls, calls[0], calls[1]]:
        log.add(call)
    other.add(calls[2])
    assert read_calls(path) == [*calls, calls[2]]
    with path.open("a") as f:
        f.write("\n   \n")
    assert len(read_calls(path)) == 4


LINE = {"collective": "allreduce", "group": [0, 1], "size_bytes": 8, "dtype": "float32", "op": "sum", "root": None}


@pytest.mark.parametrize("line, says", [
    ("{nope", r"invalid JSON \(.*\) \(fix: record again with TOPOCC_RECORD, or delete the line\)"),
    (json.dumps([LINE]), "collective must be one of"),
    (json.dumps(LINE | {"collective": "all-reduce"}), "collective must be one of allreduce, reducescatter"),
    (json.dumps(LINE | {"group": []}), "group must be a non-empty array of global ranks"),
    (json.dumps(LINE | {"group": [0, -1]}), "group must be a non-empty array"),
    (json.dumps(LINE | {"group": [0, True]}), "group must be a non-empty array"),
    (json.dumps(LINE | {"size_bytes": -1}), "size_bytes must be a non-negative integer"),
    (json.dumps(LINE | {"size_bytes": 8.0}), "size_bytes must be a non-negative integer"),
    (json.dumps(LINE | {"collective": "broadcast", "root": 2}), "root must be null or a rank of the group"),
])
def test_a_bad_call_line_is_named_by_file_and_line(line: str, says: str, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(json.dumps(LINE) + "\n\n" + line + "\n")
    with pytest.raises(ScheduleFormatError, match=f"^{re.escape(str(path))}:3: {says}") as info:
        read_calls(path)
    assert "\n" not in info.value.one_line()


def test_a_missing_call_record(tmp_path: Path) -> None:
    with pytest.raises(ScheduleFormatError, match=r"gone\.jsonl: cannot read the call record: No such file"):
        read_calls(tmp_path / "gone.jsonl")


def test_a_schedule_in_a_bundle_keeps_its_root() -> None:
    entry: BundlePlan = BUNDLE.plans[3]
    first: Schedule = entry.plan.schedules[0]
    assert entry.root == first.root == 1 and entry.key() == ("broadcast", (0, 2, 3), 1)
    assert BUNDLE.plans[0].root is None
