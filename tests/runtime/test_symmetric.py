"""The symmetric form of a schedule: formulas, rank classes, building one rank's program, the JSON section."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.planner.compiler.test_builder import ring_allreduce_schedule
from topocc.planner.analysis.verify import verify
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.matching import numbered, sequence_numbers, stream_key
from topocc.runtime.schedule import (
    Chunk,
    PathChoice,
    Recv,
    RecvReduce,
    Schedule,
    Send,
    dump_schedule,
    load_schedule,
    parse_schedule,
    save_schedule,
)
from topocc.runtime.symmetric import Formula, SymmetricPrograms, Symmetry, TemplateOp, TemplateRef


def ring(p: int) -> Schedule:
    """A ``p``-rank ring all-reduce written as one class: step s reduces chunk r - 1 - s from rank r - 1."""
    line = (p,)
    prev, nxt = Formula(p - 1, (1,)), Formula(1, (1,))
    ops = []
    for s in range(p - 1):  # reduce-scatter; the first step reduces the input into the output
        chunk = Formula(p - 1 - s, (1,))
        ops.append(TemplateOp("recv_reduce", prev, TemplateRef("i", chunk), TemplateRef("o", chunk), step=s))
        src = TemplateRef("i", Formula((p - s) % p, (1,))) if s == 0 else TemplateRef("o", Formula((p - s) % p, (1,)))
        ops.append(TemplateOp("send", nxt, src, deps=() if s == 0 else (2 * s - 2,), step=s))
    last = 2 * (p - 1) - 2  # the reduction that completes chunk r + 1 on rank r
    for s in range(p - 1):  # all-gather: pass on the chunk completed last
        ops.append(TemplateOp("send", nxt, TemplateRef("o", Formula((1 - s) % p, (1,))), deps=(last,),
                              step=p - 1 + s))
        # chunk r - s was reduced into at step s - 1 and sent on at step s of the reduce-scatter
        after = (2 * s - 2, 2 * s + 1) if s else ()
        ops.append(TemplateOp("recv", prev, dst=TemplateRef("o", Formula((p - s) % p, (1,))), deps=after,
                              step=p - 1 + s))
        last = len(ops) - 1
    sym = Symmetry(line, (tuple(ops),), ((0, p),), {"i": p, "o": p, "s": 0})
    return Schedule("allreduce", p, p, p, SymmetricPrograms(sym), symmetry=sym)


def test_formula_is_affine_in_the_coordinates_modulo() -> None:
    assert Formula(3, (4, 1)).at((2, 1), 8) == (3 + 8 + 1) % 8
    assert Formula(0, (7,)).at((3,), 8) == 21 % 8


def test_coordinates_are_row_major_and_runs_give_classes() -> None:
    t = ((TemplateOp("copy", src=TemplateRef("i", 0), dst=TemplateRef("o", 0)),),) * 2
    sym = Symmetry((2, 3), t, ((0, 2), (1, 3), (0, 1)), {"i": 1, "o": 1, "s": 0})
    assert [sym.coordinates(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [sym.class_of(r) for r in range(6)] == [0, 0, 1, 1, 1, 0]
    assert sym.class_sizes() == [3, 3]


@pytest.mark.parametrize("p", [2, 3, 4, 7])
def test_a_ring_written_once_verifies_and_matches_the_ring_built_rank_by_rank(p: int) -> None:
    s = ring(p)
    verify(s)
    assert s.op_count == sum(len(program) for program in s.programs) == p * 4 * (p - 1)
    # the same messages as the builder's ring, rank by rank (the order of independent operations may differ)
    built = ring_allreduce_schedule(p)
    for mine, theirs in zip(s.programs, built.programs):
        def messages(program: tuple) -> list:
            return sorted((op.kind, op.peer, str(op.src), str(op.dst)) for op in program if op.peer is not None)
        assert messages(mine) == messages(theirs)


def test_a_rank_builds_only_its_own_program(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "ring.json.gz"
    save_schedule(ring(64), path)
    built: list[int] = []
    original = Symmetry.program

    def counting(self: Symmetry, rank: int, source: str = "<schedule>") -> tuple:
        built.append(rank)
        return original(self, rank, source)

    monkeypatch.setattr(Symmetry, "program", counting)
    loaded = load_schedule(path)
    assert built == []
    program = loaded.programs[17]
    assert built == [17]
    assert loaded.programs[17] is program  # kept
    assert loaded.programs[-1] == loaded.programs[63]
    assert built == [17, 63]
    assert program[1] == Send(18, Chunk("i", 17), step=0)
    assert program[0] == RecvReduce(16, Chunk("o", 16), Chunk("i", 16), step=0)
    assert loaded.op_count == 64 * 4 * 63 and built == [17, 63]  # counted from the classes
    with pytest.raises(IndexError):
        loaded.programs[64]


def test_written_once_read_back_the_same(tmp_path: Path) -> None:
    s = ring(5).with_metadata(algorithm="ring", topology="five", size_bytes=1 << 20)
    text = dump_schedule(s)
    doc = json.loads(text)
    assert doc["version"] == 4 and "programs" not in doc
    assert doc["symmetry"]["shape"] == [5] and doc["symmetry"]["ranks"] == [[0, 5]]
    assert doc["symmetry"]["classes"][0][0]["peer"] == [4, 1]
    back = parse_schedule(doc, "five.json")
    assert back.symmetry == s.symmetry
    assert tuple(back.programs) == tuple(s.programs)
    assert dump_schedule(back) == text
    path = tmp_path / "five.json.gz"
    save_schedule(s, path)
    assert gzip.decompress(path.read_bytes()).decode() == text
    assert list(load_schedule(path).written_ops()) == list(s.symmetry.templates[0])  # type: ignore[union-attr]


def test_recorded_paths_are_written_rank_by_rank() -> None:
    s = ring(3).with_paths([PathChoice(0, 1, 0, ("switch",))])
    doc = json.loads(dump_schedule(s))
    assert doc["version"] == 2 and "symmetry" not in doc and len(doc["programs"]) == 3
    assert tuple(parse_schedule(doc).programs) == tuple(s.programs)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["symmetry"].update(shape=[]), "symmetry.shape: a grid of 0 ranks for 4 ranks"),
    (lambda d: d["symmetry"].update(classes=[]), "symmetry.classes: no class"),
    (lambda d: d["symmetry"].update(ranks=[[1, 4]]), "symmetry.ranks[0][0]: 1 is above the maximum 0"),
    (lambda d: d["symmetry"].update(ranks=[[0, 2, 2]]), "symmetry.ranks[0]: expected [class, count], got 3 items"),
    (lambda d: d["symmetry"]["classes"][0][0].update(peer=[4, 1]), "classes[0][0].peer[0]: 4 is above the maximum 3"),
    (lambda d: d["symmetry"]["classes"][0][0].pop("peer"), "symmetry.classes[0][0]: recv_reduce needs a peer"),
    (lambda d: d["symmetry"]["classes"][0][0].update(src=["x", 0]), "classes[0][0].src[0]: unknown or empty buffer"),
    (lambda d: d["symmetry"]["classes"][0][0].update(src=["s", 0]), "classes[0][0].src[0]: unknown or empty buffer"),
    (lambda d: d["symmetry"]["classes"][0][0].update(deps=[0]), "depends on operation 0, which is not earlier"),
    (lambda d: d["symmetry"]["classes"][0][0].update(enc="bf32"), "classes[0][0].enc"),
    (lambda d: d["symmetry"].update(extra=1), "symmetry: unknown field 'extra'"),
    (lambda d: d.update(version=3), "missing field 'programs'"),
    (lambda d: d.update(version=3, programs=[]), "symmetry: a version-3 schedule has no symmetry"),
])
def test_a_malformed_section_is_refused_with_its_place(change: object, message: str) -> None:
    doc = json.loads(dump_schedule(ring(4)))
    change(doc)  # type: ignore[operator]
    with pytest.raises(ScheduleFormatError) as info:
        parse_schedule(doc, "ring.json")
    text = str(info.value)
    assert text.startswith("ring.json") and "\n" not in text
    assert message in text, text


def test_a_formula_that_gives_a_rank_a_bad_program_is_refused_when_that_rank_is_built() -> None:
    doc = json.loads(dump_schedule(ring(4)))
    doc["symmetry"]["classes"][0][1]["peer"] = 2  # rank 2 would send to itself
    s = parse_schedule(doc, "ring.json")
    assert s.programs[0][1] == Send(2, Chunk("i", 0), step=0)
    with pytest.raises(ScheduleFormatError, match=r"^ring.json: symmetry.classes\[0\]\[1\].peer: rank 2 sends to "
                                                   r"itself \(fix: use copy or reduce for local data\)$"):
        s.programs[2]


def test_the_last_step_receives_what_the_ring_passes_on() -> None:
    s = ring(4)
    assert s.programs[0][-1] == Recv(3, Chunk("o", 2), deps=(2, 5), step=5)


def test_replayed_written_once_it_computes_the_all_reduce() -> None:
    from tests.runtime.thread_transport import run_ranks

    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(1003).astype(np.float32) for _ in range(7)]
    got, _ = run_ranks(ring(7), [x.copy() for x in inputs])
    truth = np.sum(np.array(inputs, np.float64), axis=0)
    assert all(np.allclose(r, truth, rtol=1e-5, atol=1e-5) for r in got)


def test_an_encoded_schedule_written_once_replays_bitwise_as_written_per_rank() -> None:
    from tests.runtime.test_executor_encoding import _inputs, _plans
    from tests.runtime.thread_transport import run_ranks
    from topocc.planner.compiler.symmetrize import symmetrize

    _, encoded = _plans("allreduce", "ring", "bf16@inter-rack")
    sym = symmetrize(encoded, [(12,), (3, 4)])
    assert sym.symmetry is not None and any(op.encoding for op in sym.written_ops())
    sym = parse_schedule(json.loads(dump_schedule(sym)))  # as a rank loads it
    inputs = _inputs("allreduce", 2003, ranks=12)
    want, sent = run_ranks(encoded, [x.copy() for x in inputs])
    got, sent_sym = run_ranks(sym, [x.copy() for x in inputs])
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got)) and sent_sym == sent


def test_a_bundle_keeps_a_plan_written_once(tmp_path: Path) -> None:
    from topocc.runtime.bundle import Bundle, BundlePlan, load_bundle, save_bundle
    from topocc.runtime.plan import Plan

    sym = ring(8)
    save_bundle(Bundle(8, (BundlePlan(Plan((sym,)), tuple(range(8))),)), tmp_path / "bundle")
    text = next((tmp_path / "bundle").glob("allreduce*")).read_text()
    assert '"symmetry"' in text and '"programs"' not in text
    plan = load_bundle(tmp_path / "bundle").find("allreduce", tuple(range(8)))
    assert plan is not None
    loaded = plan.select(1 << 20)
    assert loaded.symmetry == sym.symmetry and loaded.programs[3] == sym.programs[3]


def test_a_copy_that_replaces_the_programs_of_a_symmetric_schedule_expands_it_first() -> None:
    s = ring(4)
    with pytest.raises(ValueError, match="expand it"):
        replace(s, programs=tuple(s.programs))
    plain = replace(s.expanded(), programs=tuple(s.programs))
    assert plain.symmetry is None and tuple(plain.programs) == tuple(s.programs)
    assert plain.expanded() is plain


def test_programs_compare_rank_by_rank_in_either_form() -> None:
    # a plan merges neighbouring size buckets whose programs are the same, whatever their form
    assert ring(4).programs == ring(4).programs == tuple(ring(4).programs)
    assert tuple(ring(4).programs) == ring(4).programs
    assert ring(4).programs != ring(5).programs and ring(4).programs != tuple(ring(4).programs)[:3]


@pytest.mark.parametrize("p", [4, 8])
def test_stream_keys_name_a_rank_s_messages_as_its_program_does(p: int) -> None:
    """A rank's messages read from its class's template without building its chunks, all or those with some
    peers: the same places, streams and sequence numbers as its program's."""
    sym = ring(p).symmetry
    assert sym is not None
    for rank in range(p):
        program = sym.program(rank)
        messages = sym.stream_keys(rank)
        assert messages == [(k, stream_key(op)) for k, op in enumerate(program) if stream_key(op) is not None]
        seqs = sequence_numbers(program)
        assert numbered([key for _, key in messages]) == [seqs[k] for k, _ in messages]
        # among some peers only: their messages, numbered as in the whole program
        among = np.array([(rank + 1) % p])
        some = sym.stream_keys(rank, among)
        assert some == [(k, key) for k, key in messages if key[1] in among] and some
        assert numbered([key for _, key in some]) == [seqs[k] for k, _ in some]
