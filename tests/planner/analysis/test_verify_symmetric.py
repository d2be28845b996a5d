"""Proving by class: a symmetric schedule proved one rank per orbit of its symmetries, against the proof of
every rank, on correct schedules and on schedules broken in one place."""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.test_symmetric import ring
from topocc.planner.analysis import verify_symmetric
from topocc.planner.analysis.verify import spec, verify
from topocc.planner.analysis.verify_symmetric import (
    _MESSAGE_KINDS,
    Twisted,
    _block_units,
    _by_blocks,
    _Grid,
    prove,
    verify_by_class,
)
from topocc.planner.compiler.algorithms.hierarchical import _own as hierarchical_own
from topocc.planner.compiler.algorithms.hierarchical.levels import stages
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import HierarchicalOptions, Options
from topocc.planner.compiler.symmetrize import grid_shapes, symmetrize
from topocc.planner.errors import NotApplicableError, VerificationError
from topocc.planner.routing.network import Network
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.errors import ScheduleFormatError
from topocc.runtime.schedule import Schedule, load_schedule
from topocc.runtime.symmetric import Formula, SymmetricPrograms, Symmetry, TemplateOp, TemplateRef, grid_strides

SCHEDULES = Path(__file__).resolve().parents[3] / "schedules"
FABRICS = ["dgx2-2chassis", "dgx-a100-4node", "emu-racks", "ndv2-2chassis", "torus-4x4", "mesh-4x4"]
ALGORITHMS = ["ring", "halving-doubling", "hierarchical"]
COLLECTIVES = ["allreduce", "allgather", "reducescatter"]


@cache
def symmetric(fabric: str, algorithm: str, collective: str) -> Schedule | None:
    """``algorithm``'s ``collective`` on ``fabric`` in the symmetric form, or None where it has none."""
    topo = resolve_topology(fabric)
    try:
        built = compile_schedule(Network(topo), collective, algorithm, Options(size_bytes=4 << 20)).schedule
    except NotApplicableError:
        return None
    form = symmetrize(built, grid_shapes(topo))
    return form if form.symmetry is not None else None


@cache
def whole_blocks(fabric: str) -> Schedule:
    """Hierarchical's all-reduce of whole blocks by halving-doubling on ``fabric``, in the symmetric form."""
    topo = resolve_topology(fabric)
    options = Options(size_bytes=4 << 20, hierarchical=HierarchicalOptions(layout="blocks",
                                                                          stage_method="halving-doubling"))
    form = symmetrize(compile_schedule(Network(topo), "allreduce", "hierarchical", options).schedule,
                      grid_shapes(topo))
    assert form.symmetry is not None
    return form


@cache
def direct_uncapped() -> Schedule:
    """fattree-1024's all-reduce of 1 MiB as hierarchical's own choice with direct levels uncapped, one class:
    its blocks in virtual order (the last level's digits highest), each direct step's parts reduced from
    scratch chunks fixed at every rank, in four slices (the buffer one copy of the blocks' layout per slice;
    four, not the sixteen it would take, to keep every rank's proof short)."""
    topo = resolve_topology("fattree-1024")
    options = Options(size_bytes=1 << 20, pipeline=4, hierarchical=HierarchicalOptions(direct_uncapped=True))
    net = Network(topo)
    built = hierarchical_own(net, "allreduce", stages(net), options, False)
    assert built is not None and built.symmetry is not None
    return built


@pytest.mark.parametrize("fabric", FABRICS)
def test_by_class_proves_what_every_rank_proves(fabric: str) -> None:
    by_class = 0
    for algorithm in ALGORITHMS:
        for collective in COLLECTIVES:
            if fabric in ("dgx2-2chassis", "dgx-a100-4node") and algorithm == "ring":
                continue  # no symmetric form, and the longest compiles
            form = symmetric(fabric, algorithm, collective)
            if form is None:
                continue
            full = verify(form)
            report = verify_by_class(form)
            if report is not None:
                by_class += 1
                assert report == full, (algorithm, collective)
            assert prove(form) == full
    if fabric != "mesh-4x4":  # a mesh's edges leave its programs no translation
        assert by_class >= 1


@pytest.mark.parametrize("fabric", ["dgx-a100-4node", "emu-racks", "torus-4x4"])
def test_an_all_reduce_of_whole_blocks_is_proved_by_blocks(fabric: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An all-reduce's input and output laid out by blocks (its reduce-scatter of whole blocks) are moved as
    blocks digit by digit, without the search, and the proof by class reports what every rank's does."""
    form = whole_blocks(fabric)
    monkeypatch.setattr(verify_symmetric, "_chunk_permutations", lambda *args: None)  # the search: never
    report = verify_by_class(form)
    assert report is not None and report == verify(form)


def test_blocks_in_another_order_and_scratch_paired_with_them_are_proved_by_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each digit's translation moves the blocks along the block digit the formulas set from it, in every
    slice alike, and the scratch chunks reduced into a run of blocks as that run, so one representative
    proves the whole, without the search, as every rank's proof does."""
    form = direct_uncapped()
    monkeypatch.setattr(verify_symmetric, "_chunk_permutations", lambda *args: None)  # the search: never
    report = verify_by_class(form)
    assert report is not None and report == verify(form)
    sym = form.symmetry
    assert sym is not None
    slices = form.metadata.options["pipeline"]
    assert slices > 1 and form.input_chunks == slices * form.ranks
    sp = spec(form.collective, form.ranks, form.input_chunks, form.output_chunks, form.root)
    grid = _Grid(sym, {"i": form.input_chunks, "o": form.output_chunks, "s": form.scratch_chunks}, _block_units(sp))
    assert grid.units == {"i": 1, "o": 1} and grid.repeats == {"i": slices, "o": slices}  # a copy per slice
    assert any(grid.block_digits(d)[1:-1] for d in range(len(sym.shape)))  # some digit sets another's blocks


def test_shipped_fattree_is_proved_with_one_representative() -> None:
    schedule = load_schedule(SCHEDULES / "fattree-1024-allreduce.json.gz")
    report = verify_by_class(schedule)
    assert report is not None
    assert report.operations == schedule.op_count and report.ranks == 1024
    assert report.messages == sum(1 for op in schedule.written_ops() if op.kind == "send") * 1024


def test_a_ring_is_proved_by_one_rank() -> None:
    report = verify_by_class(ring(8))
    assert report == verify(ring(8))


# --------------------------------------------------------------------------- broken in one place


def _with_template(schedule: Schedule, k: int, op: TemplateOp | None) -> Schedule:
    """``schedule`` (one class) with its operation ``k`` replaced by ``op`` (removed where None)."""
    sym = schedule.symmetry
    assert sym is not None and len(sym.templates) == 1
    ops = list(sym.templates[0])
    if op is None:
        del ops[k]
        ops = [replace(o, deps=tuple(d - (d > k) for d in o.deps if d != k)) for o in ops]
    else:
        ops[k] = op
    broken = Symmetry(sym.shape, (tuple(ops),), sym.runs, sym.limits)
    return replace(schedule, programs=SymmetricPrograms(broken), symmetry=broken)


def _moved(f: int | Formula, by: int) -> int | Formula:
    return f + by if isinstance(f, int) else Formula(f.offset + by, f.coefs)


def _breakages(schedule: Schedule) -> list[tuple[str, Schedule]]:
    """One-place breakages of a one-class schedule: a receive into the wrong chunk, a lost dependency, a
    message to the wrong peer, a lost operation."""
    sym = schedule.symmetry
    assert sym is not None
    ops = sym.templates[0]
    out = []
    recv = next(k for kind in ("recv_reduce", "recv") for k, t in enumerate(ops)
                if t.kind == kind and t.dst is not None)
    t = ops[recv]
    assert t.dst is not None
    out.append(("wrong chunk", _with_template(schedule, recv, replace(t, dst=TemplateRef(
        t.dst.buffer, _moved(t.dst.index, t.dst.count), t.dst.count)))))
    dep = next(k for k, t in enumerate(ops) if t.deps and t.kind == "send")
    out.append(("lost dependency", _with_template(schedule, dep, replace(ops[dep], deps=()))))
    send = next(k for k, t in enumerate(ops) if t.kind == "send" and isinstance(t.peer, Formula))
    peer = ops[send].peer
    assert peer is not None
    out.append(("wrong peer", _with_template(schedule, send, replace(ops[send], peer=_moved(peer, 1)))))
    out.append(("lost operation", _with_template(schedule, send, None)))
    for k, t in enumerate(ops):  # a message of the wrong data: the next chunk of the input, read-only
        if t.kind == "send" and t.src is not None and t.src.buffer == "i":
            wrong = TemplateRef("i", _moved(t.src.index, t.src.count), t.src.count)
            out.append(("wrong data", _with_template(schedule, k, replace(t, src=wrong))))
            break
    return out


@pytest.mark.parametrize("case", [("ring",), ("dgx-a100-4node", "halving-doubling", "allreduce"),
                                  ("emu-racks", "ring", "allreduce"),
                                  ("dgx-a100-4node", "halving-doubling", "allgather"),
                                  ("dgx-a100-4node", "halving-doubling", "reducescatter"),
                                  ("dgx-a100-4node", "hierarchical", "whole blocks"),
                                  ("torus-4x4", "halving-doubling", "reducescatter"),
                                  ("fattree-1024", "direct uncapped")])
def test_a_broken_schedule_is_refused_by_class_as_rank_by_rank(case: tuple[str, ...]) -> None:
    schedule = (ring(8) if case == ("ring",) else whole_blocks(case[0]) if case[2:] == ("whole blocks",)
                else direct_uncapped() if case[1:] == ("direct uncapped",) else symmetric(*case))
    assert schedule is not None and verify_by_class(schedule) is not None
    refused = 0
    for what, broken in _breakages(schedule):
        with pytest.raises((VerificationError, ScheduleFormatError)):  # a rank's program may not even build
            verify(broken)
        try:
            report = verify_by_class(broken)
        except (VerificationError, ScheduleFormatError):  # the latter as the loader words a rank it refuses
            refused += 1
            continue
        assert report is None, what  # never a proof of a broken schedule; at most no proof by class
    assert refused >= 2


def test_wrong_data_from_another_orbit_member_is_named() -> None:
    broken = dict(_breakages(ring(8)))["wrong data"]
    with pytest.raises(VerificationError, match="reduces logical chunk"):
        verify_by_class(broken)


# --------------------------------------------------------------------------- chunk permutations by blocks


def _carried(sym: Symmetry, digit: int, pis: dict[str, np.ndarray], twisted: Twisted) -> bool:
    """Whether the translation of ``digit`` with ``pis`` carries every rank's operations onto its image's
    (messages in order unless twisted, both sides of an operation alike), checked rank by rank."""
    for rank in range(sym.ranks):
        here = sym.coordinates(rank)
        there = list(here)
        there[digit] = (there[digit] + 1) % sym.shape[digit]
        cls = sym.class_of(rank)
        for k, t in enumerate(sym.templates[cls]):
            sides = []
            for ref in (t.src, t.dst):
                if ref is None:
                    continue
                limit = sym.limits[ref.buffer]
                a, b = (ref.index if isinstance(ref.index, int) else ref.index.at(p, limit) for p in (here, there))
                moved = pis[ref.buffer][np.arange(a, a + ref.count)]
                if sorted(moved.tolist()) != list(range(b, b + ref.count)):
                    return False
                sides.append(moved - b)
            if t.kind in _MESSAGE_KINDS and (cls, k) not in twisted and any(
                    (side != np.arange(side.size)).any() for side in sides):
                return False
            if len(sides) == 2 and not np.array_equal(sides[0], sides[1]):
                return False
    return True


def _in_range(sym: Symmetry) -> bool:
    """Whether every rank's references stay inside their buffers."""
    for rank in range(sym.ranks):
        for t in sym.templates[0]:
            for ref in (t.src, t.dst):
                if ref is not None:
                    limit = sym.limits[ref.buffer]
                    at = ref.index if isinstance(ref.index, int) else ref.index.at(sym.coordinates(rank), limit)
                    if at + ref.count > limit:
                        return False
    return True


def _random_ref(rng: random.Random, shape: tuple[int, ...], buffer: str, unit: int, limit: int,
                noisy: bool, blocks: Sequence[int], copies: int = 1) -> TemplateRef:
    """A reference into a buffer of blocks (``copies`` of their layout one after the other): a digit-wise
    formula over one block's chunks or a run of whole low digits in one copy, or whole copies, each digit ``e``
    keeping or (binary ones) flipping block digit ``blocks[e]``; where ``noisy``, also fixing it, and now and
    then moved off by one chunk or one coefficient."""
    period = unit * math.prod(shape)
    if copies > 1 and rng.random() < 0.15:  # whole copies
        first = rng.randrange(copies)
        return TemplateRef(buffer, first * period, period * rng.randrange(1, copies - first + 1))
    strides = grid_strides(shape)
    low = rng.randrange(len(shape) + 1)  # the run's first digit (len(shape): within a block)
    offset, coefs = 0, []
    for e, n in enumerate(shape):
        s = strides[blocks[e]]
        kinds = ["keep", "flip", "fix"] if noisy else ["keep"] + (["flip"] if n == 2 else [])
        kind = "fix0" if blocks[e] >= low else rng.choice(kinds)
        start = {"keep": 0, "flip": n - 1, "fix0": 0}.get(kind, rng.randrange(n))
        coefs.append({"keep": unit * s, "flip": -unit * s}.get(kind, 0))
        offset += unit * s * start
    count = unit * math.prod(shape[low:]) if low < len(shape) else rng.randrange(1, unit + 1)
    if low == len(shape):
        offset += rng.randrange(unit - count + 1)
    if copies > 1:
        offset += period * rng.randrange(copies)
    if noisy and rng.random() < 0.3:
        offset += rng.choice([1, unit])
    if noisy and rng.random() < 0.3:
        e = rng.randrange(len(shape))
        coefs[e] += rng.choice([1, unit, -unit])
    return TemplateRef(buffer, Formula(offset % limit, tuple(c % limit for c in coefs)), count)


@pytest.mark.parametrize("copies", [1, 3])
@pytest.mark.parametrize("shape", [(2, 2, 2), (2, 4, 2), (4, 2, 3), (3, 2, 3)])
def test_chunks_moved_by_blocks_carry_every_rank(shape: tuple[int, ...], copies: int) -> None:
    """Random templates over an all-gather's buffers (or ``copies`` of the output's layout, as an all-reduce's
    slices in virtual order), their blocks in the ranks' order or another (each digit setting another block
    digit of its size), some reduced from fixed scratch chunks: where the permutations are decided by blocks,
    every rank's operations go onto its image's; and they are decided for templates that keep the digits, in
    either order and with scratch."""
    rng = random.Random(sum(shape) * 31 + len(shape) + copies)
    ranks, unit = math.prod(shape), 2
    limits = {"i": unit, "o": unit * ranks * copies, "s": unit * ranks * copies}
    decided: collections.Counter[tuple[bool, bool, bool]] = collections.Counter()
    for _ in range(120):
        ops = []
        noisy = rng.random() < 0.5
        blocks = list(range(len(shape)))
        if rng.random() < 0.5:  # each digit sets another block digit of its size
            for n in set(shape):
                same = [e for e in blocks if shape[e] == n]
                for e, f in zip(same, rng.sample(same, len(same))):
                    blocks[e] = f
        kinds = ["send", "recv", "copy"] + (["reduce"] if rng.random() < 0.5 else [])
        for _ in range(rng.randrange(1, 6)):
            ref = _random_ref(rng, shape, "o", unit, limits["o"], noisy, blocks, copies)
            kind = rng.choice(kinds)
            if kind == "send":
                ops.append(TemplateOp("send", peer=0, src=ref))
            elif kind == "recv":
                ops.append(TemplateOp("recv", peer=0, dst=ref))
            elif kind == "copy":
                ops.append(TemplateOp("copy", src=TemplateRef("i", 0, min(unit, ref.count)), dst=replace(
                    ref, count=min(unit, ref.count))))
            else:  # scratch chunks fixed at every rank, reduced into the reference
                at = rng.randrange(limits["s"] - ref.count + 1)
                ops.append(TemplateOp("reduce", src=TemplateRef("s", at, ref.count), dst=ref))
        sym = Symmetry(shape, (tuple(ops),), ((0, ranks),), limits)
        if not _in_range(sym):
            continue  # the loader refuses it (and the proof, first: _Grid.check_ranges)
        grid = _Grid(sym, limits, {("o",): [(unit, copies)]})
        for digit in range(len(shape)):
            for block in grid.block_digits(digit):
                found = _by_blocks(grid, digit, block)
                if found is not None:
                    decided[blocks != sorted(blocks), "reduce" in kinds, block is None] += 1
                    assert _carried(sym, digit, *found), (ops, digit, block)
    assert decided[False, False, False] >= 15 and decided[False, True, False] >= 5
    if len(set(shape)) < len(shape):  # digits of one size, which may set each other's block digits
        assert decided[True, False, False] >= 5 and decided[True, True, False] >= 5
