"""The serialized schedule format: round trips, determinism, and every structural check of the loader."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.planner.compiler.test_builder import CONSTRUCTIONS, direct_allreduce_schedule
from topocc.planner.analysis.verify import verify
from topocc.runtime.errors import ScheduleFormatError, TopoccError
from topocc.runtime.schedule import (
    FORMAT,
    OP_RULES,
    VERSION,
    Chunk,
    Copy,
    Metadata,
    Op,
    PathChoice,
    Recv,
    RecvReduce,
    Send,
    build_schedule,
    dump_schedule,
    load_schedule,
    operation,
    parse_schedule,
    save_schedule,
    schedule_to_dict,
)

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "data" / "bad_schedules"
DOC = REPO / "docs" / "schedule-format.md"


def base_doc() -> dict[str, Any]:
    """A valid document: a 2-rank direct allreduce with 2 chunks and some metadata."""
    s = direct_allreduce_schedule(2).with_metadata(topology="two.yaml", size_bytes=1024, predicted_time_s=1e-5)
    return json.loads(dump_schedule(s))


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", sorted(CONSTRUCTIONS))
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_round_trip_every_collective(tmp_path: Path, name: str, suffix: str) -> None:
    s = CONSTRUCTIONS[name](4, 2).with_metadata(
        topology="t.yaml", fingerprint="abc", min_bytes=1, max_bytes=1 << 20, size_bytes=4096,
        predicted_time_s=2.5e-4,
    )
    path = tmp_path / f"s{suffix}"
    save_schedule(s, path)
    if suffix.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
    loaded = load_schedule(path)
    assert loaded == s
    assert dump_schedule(loaded) == dump_schedule(s)
    verify(loaded)


def test_round_trip_keeps_every_op_field(tmp_path: Path) -> None:
    ops: list[list[Op]] = [
        [operation("copy", None, Chunk("i", 0, 2), Chunk("s", 1, 2), (), 3),
         operation("send", 1, Chunk("s", 1, 2), None, (0,), 4, 7),
         operation("recv_reduce", 1, Chunk("i", 0, 2), Chunk("o", 0, 2), (), 5, 2),
         operation("reduce", None, Chunk("s", 1, 2), Chunk("o", 0, 2), (0, 2), 6)],
        [Recv(0, Chunk("o", 0, 2), channel=7), Send(0, Chunk("i", 0, 2), step=1, channel=2)],
    ]
    s = build_schedule("allreduce", 2, 2, 2, ops, scratch_chunks=3,
                       metadata=Metadata("custom", {"pipeline": 2, "tree": [1, 2]}))
    path = tmp_path / "ops.json"
    save_schedule(s, path)
    assert load_schedule(path) == s


def test_programs_are_written_as_json_dumps_writes_their_dicts() -> None:
    """The programs are written directly, not through ``json.dumps``: the text must be exactly what dumping
    :func:`schedule_to_dict`'s programs gives, for every field and a buffer name that needs escaping."""
    ops: list[list[Op]] = [
        [operation("copy", None, Chunk("i", 0, 2), Chunk("s", 1, 2), (), 3),
         operation("send", 1, Chunk("s", 1, 2), None, (0,), 4, 7),
         RecvReduce(1, Chunk("o", 0, 2), Chunk('b"\\\u00e9', 0, 1), deps=(0, 1), step=5, channel=2)],
        [Recv(0, Chunk("o", 10**12, 2), channel=7), Send(0, Chunk("i", 0, 1), step=1)],
    ]
    built = [CONSTRUCTIONS[name](4, 2) for name in sorted(CONSTRUCTIONS)]
    for s in [build_schedule("allreduce", 2, 2, 2, ops, scratch_chunks=3), *built]:
        programs = schedule_to_dict(s)["programs"]
        expected = [json.dumps(p, separators=(",", ":")) for p in programs]
        assert dump_schedule(s).split('"programs": [\n')[1].split("\n ]")[0] == ",\n".join(
            "  " + e for e in expected)


def test_round_trip_keeps_recorded_paths(tmp_path: Path) -> None:
    """Path choices survive a save and a load, sorted by connection, in format version 2."""
    s = direct_allreduce_schedule(3).with_paths([PathChoice(2, 0, 0, ("nic2", "spine1", "nic0")),
                                                 PathChoice(0, 1, 0, ())])
    assert [(c.src, c.dst) for c in s.paths] == [(0, 1), (2, 0)]
    path = tmp_path / "routed.json"
    save_schedule(s, path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 < VERSION
    assert doc["paths"] == [{"src": 0, "dst": 1, "via": []}, {"src": 2, "dst": 0, "via": ["nic2", "spine1", "nic0"]}]
    loaded = load_schedule(path)
    assert loaded == s and loaded.paths == s.paths
    assert dump_schedule(loaded) == path.read_text()
    assert loaded.with_metadata(algorithm="x").paths == s.paths  # metadata edits keep the paths


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    s = direct_allreduce_schedule(3)
    path = tmp_path / "plain-name.json"
    path.write_bytes(gzip.compress(dump_schedule(s).encode()))
    assert load_schedule(path) == s


def test_save_creates_parent_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "s.json"
    save_schedule(direct_allreduce_schedule(2), path)
    assert load_schedule(path).ranks == 2


def test_dump_is_deterministic_and_one_line_per_program(tmp_path: Path) -> None:
    s = CONSTRUCTIONS["allreduce-ring-2ch"](5, 1)
    text = dump_schedule(s)
    assert text == dump_schedule(CONSTRUCTIONS["allreduce-ring-2ch"](5, 1))
    assert text.endswith("}\n")
    lines = text.splitlines()
    start = lines.index(' "programs": [')
    assert len(lines) - start - 3 == s.ranks
    assert json.loads(text) == schedule_to_dict(s)
    for name in ("a.json.gz", "b.json.gz"):
        save_schedule(s, tmp_path / name)
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    save_schedule(s, tmp_path / "c.json")
    assert (tmp_path / "c.json").read_text() == text


def test_dump_omits_defaults_of_ops() -> None:
    doc = schedule_to_dict(build_schedule("allreduce", 1, 1, 1, [[Copy(Chunk("i", 0), Chunk("o", 0))]]))
    assert doc["format"] == FORMAT and doc["version"] == 1  # the oldest version that holds it: no paths
    assert doc["programs"] == [[{"op": "copy", "src": ["i", 0], "dst": ["o", 0], "step": 0}]]


def test_dump_rejects_metadata_that_is_not_json() -> None:
    s = direct_allreduce_schedule(2).with_metadata(predicted_time_s=float("nan"))
    with pytest.raises(ScheduleFormatError, match="cannot store the schedule's metadata as JSON"):
        dump_schedule(s)
    s = direct_allreduce_schedule(2).with_metadata(options={"f": object()})
    with pytest.raises(ScheduleFormatError, match="metadata options must be JSON values"):
        dump_schedule(s)


def test_with_metadata_replaces_only_named_fields() -> None:
    s = direct_allreduce_schedule(2)
    t = s.with_metadata(size_bytes=8)
    assert t.metadata.size_bytes == 8 and t.metadata.algorithm == s.metadata.algorithm
    assert t.programs is s.programs


def test_parse_defaults() -> None:
    doc = base_doc()
    for key in ("root", "inplace", "metadata"):
        del doc[key]
    del doc["chunks"]["scratch"]
    for op in doc["programs"][0]:
        op.pop("step")
    s = parse_schedule(doc)
    assert (s.root, s.inplace, s.scratch_chunks, s.metadata) == (None, False, 0, Metadata())
    assert s.programs[0][0].step == 0


def test_collective_names_are_normalised_and_rooted_default_root_zero() -> None:
    doc = base_doc()
    doc["collective"] = "All-Reduce"
    assert parse_schedule(doc).collective == "allreduce"
    doc = schedule_to_dict(CONSTRUCTIONS["broadcast-chain-root2"](3, 1))
    assert parse_schedule(doc).root == 2
    doc["root"] = None
    assert parse_schedule(doc).root == 0


# --------------------------------------------------------------------------- files that cannot be read


def load_error(path: Path) -> str:
    with pytest.raises(ScheduleFormatError) as info:
        load_schedule(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text
    return text


@pytest.mark.parametrize(("content", "fragment"), [
    (b"", "empty file"),
    (b"  \n\t", "empty file"),
    (b"\xff\xfe{}", "not UTF-8 text at byte 0"),
    (b'{"format": "topocc-schedule",', "invalid JSON: Expecting property name enclosed in double quotes at line 1"),
    (b"[" * 100_000, "JSON nested too deeply"),
    (b'{"a": NaN}', "NaN is not a number in a schedule"),
    (b'{"a": -Infinity}', "-Infinity is not a number in a schedule"),
    (b'{"a": ' + b"1" * 5000 + b"}", "Exceeds the limit"),
    (gzip.compress(b"{}" * 100, mtime=0)[:-12], "corrupt gzip data"),
    (b"\x1f\x8b" + b"\x00" * 30, "corrupt gzip data"),
    (gzip.compress(b"{}", mtime=0)[:10] + b"\xff" * 20, "corrupt gzip data"),
])
def test_unreadable_files(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert fragment in load_error(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert "cannot read schedule: No such file or directory" in load_error(tmp_path / "nope.json")
    assert "cannot read schedule" in load_error(tmp_path)


# --------------------------------------------------------------------------- every structural check


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting ``doc[a][b]...`` (dotted path, integers index arrays)."""

    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.lstrip("-").isdigit() else p for p in path.split(".")]
        node: Any = doc
        for p in parents:
            node = node[p]
        node[last] = value

    return mutate


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = doc
        for p in parents:
            node = node[p]
        del node[last]

    return mutate


def _paths(*entries: dict[str, Any], version: int = 2) -> Callable[[dict[str, Any]], None]:
    """A mutation recording ``entries`` as the document's paths."""

    def mutate(doc: dict[str, Any]) -> None:
        doc["version"] = version
        doc["paths"] = list(entries)

    return mutate


# rank 0's program of base_doc(): 0 copy i0->o0, 1 recv_reduce from 1 o0 deps [0], 2 send to 1 i1,
# 3 send to 1 o0 deps [1], 4 recv from 1 o1
P, W = "programs.0", "programs[0]"
STRUCTURAL: list[tuple[str, Callable[[Any], Any], str, str]] = [
    # (id, mutation, where, message)
    ("top-not-object", lambda d: [d], "", "expected an object, got an array"),
    ("top-unknown-field", _set("colective", "allreduce"), "", "unknown field 'colective' (fix: allowed fields"),
    ("top-missing-field", _del("ranks"), "", "missing field 'ranks'"),
    ("format", _set("format", "msccl"), "format", "not a topocc schedule (format 'msccl') (fix: expected"),
    ("format-long", _set("format", "x" * 500), "format", "format 'xxxxxxxx"),
    ("version-type", _set("version", "1"), "version", "expected an integer, got a string"),
    ("version-newer", _set("version", VERSION + 1), "version",
     "unsupported schedule format version 5 (this topocc reads versions 1, 2, 3, 4) (fix: upgrade topocc"),
    ("version-older", _set("version", 0), "version",
     "version 0 (this topocc reads versions 1, 2, 3, 4) (fix: recompile"),
    ("collective-type", _set("collective", 3), "collective", "expected a string, got int"),
    ("collective-unknown", _set("collective", "allsum"), "collective", "unknown collective 'allsum'"),
    ("ranks-string", _set("ranks", "2"), "ranks", "expected an integer, got a string"),
    ("ranks-bool", _set("ranks", True), "ranks", "expected an integer, got a boolean"),
    ("ranks-float", _set("ranks", 2.0), "ranks", "expected an integer, got float"),
    ("ranks-zero", _set("ranks", 0), "ranks", "0 is below the minimum 1"),
    ("ranks-huge", _set("ranks", 1 << 21), "ranks", "is above the maximum 1048576"),
    ("root-on-allreduce", _set("root", 0), "root", "allreduce has no root (fix: set root to null)"),
    ("inplace-type", _set("inplace", "yes"), "inplace", "expected a boolean, got a string"),
    ("chunks-type", _set("chunks", 2), "chunks", "expected an object, got int"),
    ("chunks-unknown", _set("chunks.inputs", 2), "chunks", "unknown field 'inputs'"),
    ("chunks-missing", _del("chunks.output"), "chunks", "missing field 'output'"),
    ("chunks-input-zero", _set("chunks.input", 0), "chunks.input", "0 is below the minimum 1"),
    ("chunks-scratch-negative", _set("chunks.scratch", -1), "chunks.scratch", "-1 is below the minimum 0"),
    ("chunking", _set("chunks.output", 3), "chunks", "allreduce needs as many output chunks as input chunks"),
    ("metadata-type", _set("metadata", []), "metadata", "expected an object, got an array"),
    ("metadata-null", _set("metadata", None), "metadata", "expected an object, got null"),
    ("metadata-unknown", _set("metadata.algo", "x"), "metadata", "unknown field 'algo'"),
    ("metadata-options", _set("metadata.options", [1]), "metadata.options", "expected an object, got an array"),
    ("metadata-algorithm", _set("metadata.algorithm", None), "metadata.algorithm", "expected a string, got null"),
    ("metadata-topology", _set("metadata.topology", 1), "metadata.topology", "expected a string, got int"),
    ("metadata-fingerprint", _set("metadata.fingerprint", []), "metadata.fingerprint", "expected a string"),
    ("metadata-min-bytes", _set("metadata.min_bytes", -1), "metadata.min_bytes", "-1 is below the minimum 0"),
    ("metadata-max-bytes", _set("metadata.max_bytes", 1.5), "metadata.max_bytes", "expected an integer"),
    ("metadata-size-bytes", _set("metadata.size_bytes", "1k"), "metadata.size_bytes", "expected an integer"),
    ("metadata-time-negative", _set("metadata.predicted_time_s", -1.0), "metadata.predicted_time_s",
     "-1.0 is negative"),
    ("metadata-time-nan", _set("metadata.predicted_time_s", float("nan")), "metadata.predicted_time_s",
     "expected a finite number, got nan"),
    ("metadata-time-string", _set("metadata.predicted_time_s", "1"), "metadata.predicted_time_s",
     "expected a finite number, got a string"),
    ("programs-type", _set("programs", {}), "programs", "expected an array, got an object"),
    ("programs-count", lambda d: d["programs"].pop() and None, "programs", "1 rank programs for 2 ranks"),
    ("program-type", _set(P, "ops"), W, "expected an array, got a string"),
    ("op-type", _set(f"{P}.0", ["copy"]), f"{W}[0]", "expected an object, got an array"),
    ("op-unknown-field", _set(f"{P}.0.channel", 1), f"{W}[0]", "unknown field 'channel'"),
    ("op-missing-kind", _del(f"{P}.0.op"), f"{W}[0]", "missing field 'op'"),
    ("op-unknown-kind", _set(f"{P}.0.op", "cpy"), f"{W}[0].op", "unknown operation 'cpy' (fix: use one of send"),
    ("op-kind-type", _set(f"{P}.0.op", ["copy"]), f"{W}[0].op", "unknown operation ['copy']"),
    ("peer-missing", _del(f"{P}.2.peer"), f"{W}[2]", "send needs a peer"),
    ("peer-type", _set(f"{P}.2.peer", "1"), f"{W}[2].peer", "expected an integer, got a string"),
    ("peer-range", _set(f"{P}.2.peer", 2), f"{W}[2].peer", "2 is above the maximum 1"),
    ("peer-negative", _set(f"{P}.2.peer", -1), f"{W}[2].peer", "-1 is below the minimum 0"),
    ("peer-self", _set(f"{P}.2.peer", 0), f"{W}[2].peer", "rank 0 sends to itself (fix: use copy or reduce"),
    ("peer-on-copy", _set(f"{P}.0.peer", 1), f"{W}[0]", "copy takes no peer"),
    ("src-missing", _del(f"{P}.2.src"), f"{W}[2]", "send needs a src chunk"),
    ("dst-missing", _del(f"{P}.4.dst"), f"{W}[4]", "recv needs a dst chunk"),
    ("src-on-recv", _set(f"{P}.4.src", ["i", 0]), f"{W}[4]", "recv takes no src"),
    ("dst-on-send", _set(f"{P}.2.dst", ["o", 0]), f"{W}[2]", "send takes no dst"),
    ("chunk-type", _set(f"{P}.0.src", "i0"), f"{W}[0].src", "expected an array, got a string"),
    ("chunk-length", _set(f"{P}.0.src", ["i"]), f"{W}[0].src", "[buffer, index] or [buffer, index, count], got 1"),
    ("chunk-buffer", _set(f"{P}.0.src", ["x", 0]), f"{W}[0].src[0]", "unknown buffer 'x' (fix: use 'i' (input)"),
    ("chunk-buffer-type", _set(f"{P}.0.src", [["i"], 0]), f"{W}[0].src[0]", "unknown buffer ['i']"),
    ("chunk-index-type", _set(f"{P}.0.src", ["i", "0"]), f"{W}[0].src[1]", "expected an integer, got a string"),
    ("chunk-index-negative", _set(f"{P}.0.src", ["i", -1]), f"{W}[0].src[1]", "-1 is below the minimum 0"),
    ("chunk-count-zero", _set(f"{P}.0.src", ["i", 0, 0]), f"{W}[0].src[2]", "0 is below the minimum 1"),
    ("chunk-range", _set(f"{P}.0.src", ["i", 1, 2]), f"{W}[0].src",
     "chunks 1..2 of buffer 'i' are out of range (it has 2 chunks)"),
    ("chunk-scratch-range", _set(f"{P}.0.dst", ["s", 0]), f"{W}[0].dst", "buffer 's' are out of range (it has 0"),
    ("src-dst-lengths", _set(f"{P}.0.src", ["i", 0, 2]), f"{W}[0]", "src has 2 chunks but dst has 1"),
    ("deps-type", _set(f"{P}.1.deps", 0), f"{W}[1].deps", "expected an array, got int"),
    ("dep-type", _set(f"{P}.1.deps", ["0"]), f"{W}[1].deps[0]", "expected an integer, got a string"),
    ("dep-negative", _set(f"{P}.1.deps", [-1]), f"{W}[1].deps[0]", "-1 is below the minimum 0"),
    ("dep-self", _set(f"{P}.1.deps", [1]), f"{W}[1].deps", "depends on operation 1, which is not earlier"),
    ("dep-forward", _set(f"{P}.1.deps", [0, 3]), f"{W}[1].deps", "depends on operation 3, which is not earlier"),
    ("step-negative", _set(f"{P}.0.step", -2), f"{W}[0].step", "-2 is below the minimum 0"),
    ("channel-type", _set(f"{P}.2.ch", 1.0), f"{W}[2].ch", "expected an integer, got float"),
    ("channel-range", _set(f"{P}.2.ch", 1 << 17), f"{W}[2].ch", "is above the maximum 65536"),
    ("paths-version", _paths({"src": 0, "dst": 1, "via": []}, version=1), "paths",
     "paths need format version 2 (fix: set version to 2)"),
    ("paths-type", lambda d: d.update(version=2, paths={}), "paths", "expected an array, got an object"),
    ("path-unknown-field", _paths({"src": 0, "dst": 1, "via": [], "lane": 1}), "paths[0]", "unknown field 'lane'"),
    ("path-missing-via", _paths({"src": 0, "dst": 1}), "paths[0]", "missing field 'via'"),
    ("path-src-range", _paths({"src": 2, "dst": 1, "via": []}), "paths[0].src", "2 is above the maximum 1"),
    ("path-channel-type", _paths({"src": 0, "dst": 1, "ch": "0", "via": []}), "paths[0].ch", "expected an integer"),
    ("path-no-connection", _paths({"src": 0, "dst": 1, "ch": 5, "via": []}), "paths[0]",
     "no message goes from rank 0 to rank 1 on channel 5 (fix: record paths only for connections"),
    ("path-twice", _paths({"src": 0, "dst": 1, "via": []}, {"src": 0, "dst": 1, "via": ["sw"]}), "paths[1]",
     "a second path for rank 0 -> rank 1 on channel 0 (fix: record one path per connection)"),
    ("path-via-type", _paths({"src": 0, "dst": 1, "via": "sw"}), "paths[0].via", "expected an array, got a string"),
    ("path-via-name", _paths({"src": 0, "dst": 1, "via": [3]}), "paths[0].via[0]", "expected a string, got int"),
]


@pytest.mark.parametrize(("mutate", "where", "message"), [case[1:] for case in STRUCTURAL],
                         ids=[case[0] for case in STRUCTURAL])
def test_structural_check(mutate: Callable[[Any], Any], where: str, message: str) -> None:
    doc = base_doc()
    parse_schedule(doc, source="s.json")  # the unmutated document is valid
    result = mutate(doc)
    if isinstance(result, list):  # the mutation replaced the whole document
        doc = result  # type: ignore[assignment]
    with pytest.raises(ScheduleFormatError) as info:
        parse_schedule(doc, source="s.json")
    err = info.value
    assert err.where == ("s.json" if not where else f"s.json: {where}")
    text = str(err)
    assert message in text, f"{message!r} not in {text!r}"
    assert "\n" not in text and text.startswith(err.where)
    assert err.exit_code == 3


def test_rooted_collective_root_range() -> None:
    doc = schedule_to_dict(CONSTRUCTIONS["reduce-chain-root1"](3, 1))
    doc["root"] = 3
    with pytest.raises(ScheduleFormatError, match=r"root: 3 is above the maximum 2"):
        parse_schedule(doc, source="s.json")
    doc["root"] = "1"
    with pytest.raises(ScheduleFormatError, match=r"root: expected an integer, got a string"):
        parse_schedule(doc, source="s.json")


def test_recv_reduce_may_name_a_src_of_the_same_length() -> None:
    doc = base_doc()
    doc["programs"][0][1]["src"] = ["i", 0]
    assert parse_schedule(doc).programs[0][1].src == Chunk("i", 0)
    doc["programs"][0][1]["src"] = ["i", 0, 2]
    with pytest.raises(ScheduleFormatError, match="src has 2 chunks but dst has 1"):
        parse_schedule(doc)


def test_load_error_names_the_file(tmp_path: Path) -> None:
    doc = base_doc()
    doc["version"] = VERSION + 1
    path = tmp_path / "future.json"
    path.write_text(json.dumps(doc))
    text = load_error(path)
    assert text.startswith(f"{path}: version: unsupported schedule format version {VERSION + 1}")
    assert "fix: upgrade topocc to read it, or recompile the schedule" in text


# --------------------------------------------------------------------------- the malformed-schedule corpus


def _corpus() -> dict[str, dict[str, str]]:
    return yaml.safe_load((BAD / "expected.yaml").read_text())


def test_corpus_is_complete() -> None:
    expected = _corpus()
    files = {p.name for p in BAD.iterdir() if p.name != "expected.yaml"}
    assert files == set(expected), files ^ set(expected)
    assert len(files) >= 16
    for name, entry in expected.items():
        assert set(entry) == {"stage", "contains"}, name
        assert entry["stage"] in ("load", "expand", "verify"), name
        assert isinstance(entry["contains"], str) and entry["contains"], name
    stages = [e["stage"] for e in expected.values()]
    assert stages.count("verify") >= 4


@pytest.mark.parametrize("name", sorted(_corpus()))
def test_bad_schedule(name: str) -> None:
    entry = _corpus()[name]
    path = BAD / name
    with pytest.raises(TopoccError) as info:
        schedule = load_schedule(path)
        assert entry["stage"] != "load", f"{name} loaded but should fail to load"
        if entry["stage"] == "expand":  # a symmetric schedule whose classes give some rank a bad program
            list(schedule.programs)
            pytest.fail(f"{name}: every rank's program was built")
        verify(schedule)
    text = str(info.value)
    assert "\n" not in text
    assert entry["contains"] in text, f"{entry['contains']!r} not in {text!r}"
    if entry["stage"] in ("load", "expand"):
        assert isinstance(info.value, ScheduleFormatError)
        assert name in text
    else:
        assert not isinstance(info.value, ScheduleFormatError)


# --------------------------------------------------------------------------- the format documentation


def _doc_examples() -> list[str]:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 2, "docs/schedule-format.md must hold two ```json examples (per rank, symmetric)"
    return blocks


def test_documented_examples_show_both_forms() -> None:
    assert sorted("symmetry" in json.loads(text) for text in _doc_examples()) == [False, True]


@pytest.mark.parametrize("index", [0, 1])
def test_documented_examples_load_and_verify(tmp_path: Path, index: int) -> None:
    text = _doc_examples()[index]
    path = tmp_path / "example.json"
    path.write_text(text)
    s = load_schedule(path)
    assert s.collective == "allreduce"
    report = verify(s)
    assert report.operations == s.op_count
    # what the example text shows is what the format writes
    assert json.loads(dump_schedule(s)) == json.loads(text)


def test_documentation_names_every_field_and_op() -> None:
    text = DOC.read_text()
    doc = base_doc()
    names = set(doc) | set(doc["chunks"]) | set(doc["metadata"]) | {"peer", "src", "dst", "deps", "step", "ch", "enc"}
    names |= {"symmetry", "shape", "ranks", "classes"}
    names |= set(OP_RULES)
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"docs/schedule-format.md does not mention {missing}"

