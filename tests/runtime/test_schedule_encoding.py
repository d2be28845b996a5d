"""Encodings in the schedule format: version 3 and its ``enc`` field, exact schedules unchanged, and refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.planner.compiler.test_builder import CONSTRUCTIONS, direct_allreduce_schedule
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.schedule import (
    Chunk,
    PathChoice,
    Schedule,
    build_schedule,
    dump_schedule,
    load_schedule,
    operation,
    parse_schedule,
    save_schedule,
)


def encoded_allreduce(encoding: str = "bf16") -> Schedule:
    """2 ranks, 2 chunks: rank r reduces chunk r from an encoded message, rounds it (a rounding copy) and
    sends it encoded; so both ranks end with the same bits."""
    programs = []
    for r in range(2):
        q = 1 - r
        programs.append([
            operation("copy", None, Chunk("i", r), Chunk("o", r)),
            operation("recv_reduce", q, None, Chunk("o", r), (0,), 0, 0, encoding),
            operation("send", q, Chunk("i", q), None, (), 0, 0, encoding),
            operation("copy", None, Chunk("o", r), Chunk("o", r), (1,), 1, 0, encoding),
            operation("send", q, Chunk("o", r), None, (3,), 1, 0, encoding),
            operation("recv", q, None, Chunk("o", q), (), 1, 0, encoding),
        ])
    return build_schedule("allreduce", 2, 2, 2, programs)


def test_an_encoded_schedule_is_version_3_and_round_trips(tmp_path: Path) -> None:
    s = encoded_allreduce("int8:block=64")
    text = dump_schedule(s)
    doc = json.loads(text)
    assert doc["version"] == 3
    assert doc["programs"][0][1] == {"op": "recv_reduce", "peer": 1, "dst": ["o", 0], "deps": [0], "step": 0,
                                     "enc": "int8:block=64"}
    path = tmp_path / "enc.json.gz"
    save_schedule(s, path)
    loaded = load_schedule(path)
    assert loaded == s and dump_schedule(loaded) == text


@pytest.mark.parametrize("name", sorted(CONSTRUCTIONS))
def test_exact_schedules_keep_their_version_and_text(name: str) -> None:
    s = CONSTRUCTIONS[name](4, 2)
    text = dump_schedule(s)
    assert '"enc"' not in text and json.loads(text)["version"] == 1
    assert all(op.encoding is None for program in parse_schedule(json.loads(text)).programs for op in program)


def test_a_loose_spelling_loads_as_the_canonical_one() -> None:
    doc = json.loads(dump_schedule(encoded_allreduce("topk:0.01")))
    for program in doc["programs"]:
        for op in program:
            if "enc" in op:
                op["enc"] = "topk:1%"
    assert {op.encoding for p in parse_schedule(doc).programs for op in p} == {"topk:0.01", None}


def _mutated(mutate: Any) -> dict[str, Any]:
    doc = json.loads(dump_schedule(encoded_allreduce()))
    mutate(doc)
    return doc


@pytest.mark.parametrize(("mutate", "fragment"), [
    (lambda d: d.__setitem__("version", 2), "programs[0][1].enc: encodings need format version 3"),
    (lambda d: d["programs"][0][1].pop("enc"),
     "programs[0][1]: receives exact but its send programs[1][2] sends bf16 (fix: give both ends"),
    (lambda d: d["programs"][1][2].__setitem__("enc", "fp16"), "receives bf16 but its send programs[1][2] sends fp16"),
    (lambda d: d["programs"][0][1].__setitem__("enc", "bf8"), "programs[0][1].enc: unknown encoding 'bf8'"),
    (lambda d: d["programs"][0][1].__setitem__("enc", 16), "programs[0][1].enc: expected a string, got int"),
    (lambda d: d["programs"][0].append({"op": "reduce", "src": ["i", 0], "dst": ["o", 0], "enc": "bf16"}),
     "programs[0][6].enc: a reduce carries no encoding"),
])
def test_refusals_name_the_place_and_the_fix(mutate: Any, fragment: str) -> None:
    with pytest.raises(ScheduleFormatError) as info:
        parse_schedule(_mutated(mutate), source="s.json")
    text = str(info.value)
    assert fragment in text and text.startswith("s.json: ") and "\n" not in text


def test_paths_and_encodings_together_are_version_3() -> None:
    s = direct_allreduce_schedule(2)
    programs = [[op if op.kind == "copy" else operation(op.kind, op.peer, op.src, op.dst, op.deps, op.step, op.channel,
                                                 "fp16" if op.step == 0 else None) for op in p]
                for p in s.programs]
    encoded = build_schedule("allreduce", 2, 2, 2, programs, paths=[PathChoice(0, 1, 0, ("sw",))])
    doc = json.loads(dump_schedule(encoded))
    assert doc["version"] == 3 and doc["paths"] == [{"src": 0, "dst": 1, "via": ["sw"]}]
    assert parse_schedule(doc) == encoded
