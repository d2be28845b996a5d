"""Finding a schedule's rank classes: the symmetric form proves, simulates and replays as the per-rank one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.planner.compiler.test_builder import CONSTRUCTIONS
from topocc.planner.analysis.simulate import simulate
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.symmetrize import canonical_order, grid_shapes, symmetric_form, symmetrize
from topocc.planner.topology.catalogue import resolve_topology, schedule_topology
from topocc.runtime.schedule import PathChoice, Schedule, dump_schedule, load_schedule, parse_schedule

SCHEDULES = sorted((REPO / "schedules").glob("*.json*"))


def same_program(a: tuple, b: tuple) -> bool:
    """Whether ``b`` is ``a`` in another order that keeps every dependency and each stream's order."""
    if len(a) != len(b):
        return False
    places: dict[tuple, list[int]] = {}
    for k, op in reversed(list(enumerate(a))):
        places.setdefault((op.kind, op.peer, op.src, op.dst, op.step, op.channel, op.encoding), []).append(k)
    where = {}
    for k, op in enumerate(b):
        found = places.get((op.kind, op.peer, op.src, op.dst, op.step, op.channel, op.encoding))
        if not found:
            return False
        where[found.pop()] = k
    for k, op in enumerate(a):
        if sorted(where[d] for d in op.deps) != list(b[where[k]].deps):
            return False
    streams: dict[tuple, list[int]] = {}
    for k, op in enumerate(a):
        if op.peer is not None:
            streams.setdefault((op.kind == "send", op.peer, op.channel), []).append(where[k])
    return all(order == sorted(order) for order in streams.values())


def check_symmetric(original: Schedule, sym: Schedule, where: object) -> None:
    """The symmetric form: rank by rank the original reordered, proved, timed alike, read back the same."""
    assert sym.symmetry is not None
    assert sym.op_count == original.op_count
    for a, b in zip(original.programs, sym.programs):
        assert same_program(a, b)
    verify(sym)
    size = original.metadata.size_bytes or 1 << 20
    by_class, full = simulate(where, sym, size), simulate(where, original, size)  # type: ignore[arg-type]
    assert by_class.time_s == pytest.approx(full.time_s, rel=1e-12)  # replayed by orbit where it can be
    back = parse_schedule(json.loads(dump_schedule(sym)))
    assert back.symmetry == sym.symmetry and tuple(back.programs) == tuple(sym.programs)


@pytest.mark.parametrize("name", sorted(CONSTRUCTIONS))
@pytest.mark.parametrize("p", [4, 6, 8])
def test_canonical_order_is_the_same_program(name: str, p: int) -> None:
    s = CONSTRUCTIONS[name](p, 2)
    canonical = tuple(canonical_order(program) for program in s.programs)
    for a, b in zip(s.programs, canonical):
        assert same_program(a, b)
    verify(Schedule(s.collective, s.ranks, s.input_chunks, s.output_chunks, canonical, s.scratch_chunks, s.root,
                    s.inplace, s.metadata))


@pytest.mark.parametrize("name", sorted(CONSTRUCTIONS))
def test_each_rank_is_in_a_class_only_where_its_program_is_the_template_at_its_coordinates(name: str) -> None:
    s = CONSTRUCTIONS[name](8, 2)
    sym = symmetrize(s, [(8,), (2, 2, 2)])
    if name == "reduce-chain-root1":  # a chain of single receives and sends: each rank's program differs
        assert sym is s
        return
    assert sym.symmetry is not None  # a broadcast chain's middle ranks are one class
    assert sum(len(t) for t in sym.symmetry.templates) * 2 <= s.op_count
    assert tuple(sym.programs) == tuple(canonical_order(p) for p in s.programs)
    verify(sym)


def test_the_shipped_schedules_prove_and_simulate_alike_in_both_forms() -> None:
    symmetric = 0
    for path in SCHEDULES:
        original = load_schedule(path)
        topology = schedule_topology(original, path)
        if original.symmetry is not None:  # written symmetric: timed as the compiler timed the per-rank form
            size = original.metadata.size_bytes or 0
            predicted = original.metadata.predicted_time_s
            assert simulate(topology, original, size).time_s == pytest.approx(predicted, rel=1e-12), path.name
            symmetric += 1
            continue
        sym = symmetrize(original, grid_shapes(topology))
        if sym.symmetry is not None:
            check_symmetric(original, sym, topology)
            symmetric += 1
    assert symmetric >= 10, f"only {symmetric} of {len(SCHEDULES)} shipped schedules found symmetric"


@pytest.mark.parametrize("topology", ["dgx1-v100", "torus-4x4", "emu-uniform", "pcie-4x4-10gbe"])
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "broadcast", "alltoall"])
def test_other_collectives_prove_and_simulate_alike_in_both_forms(topology: str, collective: str) -> None:
    topo = resolve_topology(topology)
    original = compile_schedule(topo, collective, "auto", Options(size_bytes=1 << 20)).schedule
    sym = symmetrize(original, grid_shapes(topo))
    if sym.symmetry is None:
        assert sym is original
        return
    check_symmetric(original, sym, topo)


def test_the_grids_follow_the_hierarchy_then_its_prime_factors() -> None:
    assert grid_shapes(resolve_topology("ibm-s822lc-48x4")) == [(3, 2, 2, 2, 2, 2, 2), (3, 16, 4)]
    assert grid_shapes(resolve_topology("dgx1-v100")) == [(2, 2, 2), (8,)]


def test_written_symmetric_from_64_ranks_where_it_pays() -> None:
    shipped = next(p for p in SCHEDULES if p.name.startswith("ibm-s822lc-48x4"))
    s = load_schedule(shipped)
    assert s.symmetry is not None and s.ranks == 192  # as compile-shipped writes it
    plain = Schedule(s.collective, s.ranks, s.input_chunks, s.output_chunks, tuple(s.programs), s.scratch_chunks,
                     s.root, s.inplace, s.metadata)
    topo = schedule_topology(s, shipped)
    assert symmetric_form(plain, topo).symmetry == s.symmetry
    assert symmetric_form(plain, topo, min_ranks=256) is plain
    with_paths = plain.with_paths([PathChoice(0, 1, 0, ())])
    assert symmetrize(with_paths, grid_shapes(topo)) is with_paths


def test_compile_writes_the_symmetric_form_unless_asked_per_rank(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from topocc.planner.cli import cli

    runner = CliRunner()
    out = tmp_path / "s.json"
    done = runner.invoke(cli, ["compile", "torus-4x4", "-s", "1MiB", "-o", str(out), "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["written"] == {"form": "per-rank"}  # 16 ranks: below the form's 64
    done = runner.invoke(cli, ["compile", "ibm-s822lc-48x4", "-s", "64MiB", "-o", str(out), "--json"])
    assert done.exit_code == 0, done.output
    written = json.loads(done.output)["written"]
    assert written["form"] == "symmetric" and written["stored_operations"] * 2 <= json.loads(done.output)["operations"]
    assert json.loads(out.read_text())["version"] == 4
    done = runner.invoke(cli, ["compile", "ibm-s822lc-48x4", "-s", "64MiB", "-o", str(out), "--per-rank"])
    assert done.exit_code == 0, done.output
    assert json.loads(out.read_text())["version"] == 1


def test_msccl_export_expands_the_classes() -> None:
    from topocc.planner.formats.msccl_xml import export_msccl, parse_msccl

    shipped = next(p for p in SCHEDULES if p.name.startswith("ibm-s822lc-48x4"))
    sym = load_schedule(shipped)
    assert sym.symmetry is not None
    plain = Schedule(sym.collective, sym.ranks, sym.input_chunks, sym.output_chunks, tuple(sym.programs),
                     sym.scratch_chunks, sym.root, sym.inplace, sym.metadata)
    xml = export_msccl(sym)
    assert xml == export_msccl(plain) and xml.count("<gpu ") == 192
    verify(parse_msccl(xml))
