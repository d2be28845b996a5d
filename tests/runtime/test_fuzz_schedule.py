"""Fuzz the schedule loader and verifier: whatever the input, only TopoccError subclasses may escape.

Inputs are random bytes (plain and behind a gzip header), random JSON documents
(free-form and schedule-shaped), and mutations of valid schedule documents:
fields dropped, replaced by random JSON, retyped, operations shuffled.  Sizes are
bounded so that no example can run long.
"""

from __future__ import annotations

import copy
import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.planner.compiler.test_builder import CONSTRUCTIONS
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.symmetrize import symmetrize
from topocc.runtime.errors import ScheduleFormatError, TopoccError
from topocc.runtime.schedule import VERSION, Schedule, dump_schedule, load_schedule, parse_schedule

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BASES = [
    json.loads(dump_schedule(CONSTRUCTIONS[name](3, 1)))
    for name in ("allreduce-ring-2ch", "allgather-ring-inplace", "reducescatter-ring", "broadcast-chain-root2",
                 "reduce-chain-root1", "alltoall-direct", "allreduce-direct")
] + [  # the symmetric form (format version 4): classes, formulas and the map of ranks to classes
    json.loads(dump_schedule(symmetrize(CONSTRUCTIONS[name](4, 1), [(4,), (2, 2)])))
    for name in ("allreduce-ring", "allgather-ring", "reducescatter-ring-inplace", "alltoall-direct")
]

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.integers(), st.floats(allow_nan=False),
    st.text(max_size=8), st.sampled_from(["i", "o", "s", "send", "recv", "recv_reduce", "copy", "reduce",
                                          "allreduce", "topocc-schedule"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20,
)


def _small_enough(s: Schedule) -> bool:
    """Verification allocates every chunk of every rank: skip what would be slow, not what is wrong."""
    return s.ranks * (s.input_chunks + s.output_chunks + s.scratch_chunks) <= 20_000


def check(doc: Any) -> None:
    """Parse and, if that succeeds, verify: only TopoccError may escape, with a one-line message."""
    try:
        schedule = parse_schedule(doc, source="fuzz.json")
        if _small_enough(schedule):
            verify(schedule)
    except TopoccError as exc:
        assert "\n" not in str(exc)


def check_file(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    try:
        schedule = load_schedule(path)
        if _small_enough(schedule):
            verify(schedule)
    except TopoccError as exc:
        text = str(exc)
        assert "\n" not in text and str(path) in text


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "schedule.json"


@FUZZ
@given(content=st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=300).map(lambda b: b"\x1f\x8b" + b),
    st.binary(max_size=300).map(lambda b: gzip.compress(b, mtime=0)),
    st.binary(max_size=300).map(lambda b: zlib.compress(b)),
))
def test_random_bytes(fuzz_file: Path, content: bytes) -> None:
    check_file(fuzz_file, content)


@FUZZ
@given(doc=json_values)
def test_random_json_documents(fuzz_file: Path, doc: Any) -> None:
    check(doc)
    check_file(fuzz_file, json.dumps(doc).encode())


schedule_shaped = st.fixed_dictionaries(
    {"format": st.just("topocc-schedule"), "version": st.just(1),
     "collective": st.sampled_from(["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"]),
     "ranks": st.integers(1, 3),
     "chunks": st.fixed_dictionaries({"input": st.integers(1, 6), "output": st.integers(1, 6)},
                                     optional={"scratch": st.integers(0, 3)}),
     "programs": st.lists(st.lists(st.fixed_dictionaries(
         {"op": st.sampled_from(["send", "recv", "recv_reduce", "copy", "reduce"])},
         optional={"peer": st.integers(0, 2), "src": st.tuples(st.sampled_from("ios"), st.integers(0, 5)).map(list),
                   "dst": st.tuples(st.sampled_from("ios"), st.integers(0, 5)).map(list),
                   "deps": st.lists(st.integers(0, 6), max_size=2), "ch": st.integers(0, 1)}),
         max_size=6), min_size=1, max_size=3)},
    optional={"root": st.one_of(st.none(), st.integers(0, 2)), "inplace": st.booleans()},
)


@FUZZ
@given(doc=schedule_shaped)
def test_random_schedule_shaped_documents(doc: dict[str, Any]) -> None:
    """Documents that often get past the loader, so the verifier sees arbitrary programs."""
    doc["ranks"] = len(doc["programs"])
    check(doc)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document."""
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*prefix, i))
    return found


def _retype(value: Any) -> Any:
    """The same content with another JSON type."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value.values())
    return False


@FUZZ
@given(data=st.data(), base=st.sampled_from(BASES))
def test_mutated_valid_documents(data: st.DataObject, base: dict[str, Any]) -> None:
    doc = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(doc)
        path = data.draw(st.sampled_from(paths), label="path")
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        action = data.draw(st.sampled_from(["drop", "replace", "retype", "shuffle", "bump"]), label="action")
        if action == "drop":
            del parent[key]
        elif action == "replace":
            parent[key] = data.draw(json_values, label="value")
        elif action == "retype":
            parent[key] = _retype(parent[key])
        elif action == "bump" and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] += data.draw(st.sampled_from([-1, 1, 2, 1 << 30]), label="bump")
        elif action == "shuffle":
            programs = doc.get("programs")
            if isinstance(programs, list) and programs:
                rank = data.draw(st.integers(0, len(programs) - 1), label="rank")
                if isinstance(programs[rank], list):
                    programs[rank] = data.draw(st.permutations(programs[rank]), label="order")
        if not isinstance(doc, dict) or not _paths(doc):
            break
    check(doc)


def test_mutations_reach_the_verifier() -> None:
    """The fuzzer's unchanged bases load and verify, so mutations start from schedules that pass."""
    for doc in BASES:
        verify(parse_schedule(copy.deepcopy(doc)))
    assert sum(doc["version"] == 4 for doc in BASES) == 4
    with pytest.raises(ScheduleFormatError):
        parse_schedule({**BASES[0], "version": VERSION + 1})


edge_values: st.SearchStrategy[object] = st.sampled_from([
    -1, 0, 1, 2, 3, 4, 5, 6, 1 << 16, (1 << 16) + 1, True, False, None, "1", 1.0, "i", "x", "send", [], [0], ["i", 0],
    ["o", 4, 2], ["s", 1, 1], {}])


@settings(FUZZ, max_examples=1500)
@given(data=st.data())
def test_the_quick_op_check_is_as_strict_as_the_full_one(data: st.DataObject) -> None:
    """Loading checks each operation with a quick test first and the full one (which names what is wrong)
    only where that fails: whatever the quick test accepts, the full one must accept as the same operation.
    Operations are valid ones with up to two fields dropped, replaced, edited or extended at their edges."""
    from topocc.runtime.schedule import OP_RULES, Ref, _parse_op, _quick_op, _Reader

    limits, rank, k = {"i": 4, "o": 5, "s": 2}, 1, 3
    kind = data.draw(st.sampled_from(sorted(OP_RULES)), label="kind")
    rule = OP_RULES[kind]
    count = data.draw(st.integers(1, 2), label="count")

    def ref() -> list[Any]:
        buffer, n = data.draw(st.sampled_from("ios")), data.draw(st.sampled_from([count, count, 1, 2]))
        return [buffer, data.draw(st.integers(0, limits[buffer] - n))] + [n] * (n > 1)

    doc: dict[str, Any] = {"op": kind}
    if rule.peer:
        doc["peer"] = data.draw(st.sampled_from([0, 2]))
    if rule.src is Ref.REQUIRED or (rule.src is Ref.OPTIONAL and data.draw(st.booleans())):
        doc["src"] = ref()
    if rule.dst is not Ref.ABSENT:
        doc["dst"] = ref()
    doc.update(data.draw(st.fixed_dictionaries({}, optional={
        "deps": st.lists(st.integers(0, k - 1), max_size=2), "step": st.integers(0, 3), "ch": st.integers(0, 2)})))
    for _ in range(data.draw(st.integers(0, 2), label="mutations")):
        key = data.draw(st.sampled_from(["op", "peer", "src", "dst", "deps", "step", "ch", "extra"]), label="key")
        action = data.draw(st.sampled_from(["drop", "set", "edit", "append"]), label="action")
        if action == "drop":
            doc.pop(key, None)
        elif action == "append" and isinstance(doc.get(key), list):
            doc[key].append(data.draw(edge_values, label="value"))
        elif action in ("set", "append") or not isinstance(doc.get(key), list) or not doc[key]:
            doc[key] = data.draw(edge_values, label="value")
        else:
            doc[key][data.draw(st.integers(0, len(doc[key]) - 1), label="at")] = data.draw(edge_values, label="value")
    quick = _quick_op(doc, rank, k, 3, limits)
    try:
        full = _parse_op(_Reader("fuzz.json"), doc, "op", rank, k, 3, limits)
    except ScheduleFormatError:
        full = None
    assert quick is None or quick == full
