"""Large schedules are proved in a forked child, with the same verdict as inline."""

from __future__ import annotations

import dataclasses

import pytest

import topocc.planner.compiler.proof as proof_module
from tests.planner.compiler.algorithms.test_baselines import switch_cluster
from tests.planner.compiler.test_builder import ring_allreduce_schedule
from topocc.planner.analysis.verify import VerifyReport, verify
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.proof import Proof
from topocc.planner.errors import VerificationError
from topocc.runtime.schedule import Recv, Schedule


def broken(schedule: Schedule) -> Schedule:
    """The schedule with rank 0's last receive turned into a plain receive: its sum misses a contribution."""
    programs = [list(program) for program in schedule.programs]
    k = max(i for i, op in enumerate(programs[0]) if op.kind == "recv_reduce")
    op = programs[0][k]
    assert op.kind == "recv_reduce"
    programs[0][k] = Recv(op.peer, op.dst, deps=op.deps, step=op.step, channel=op.channel)
    return dataclasses.replace(schedule, programs=tuple(tuple(p) for p in programs))


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proof_module, "PARALLEL_VERIFY_OPS", 1)


def test_forked_proof_matches_inline(forking: None) -> None:
    schedule = ring_allreduce_schedule(4, 2)
    proof = Proof(schedule)
    assert proof._child is not None
    assert proof.result() == verify(schedule)
    assert proof._child is None


def test_forked_proof_reports_the_same_error(forking: None) -> None:
    bad = broken(ring_allreduce_schedule(4))
    with pytest.raises(VerificationError) as inline:
        verify(bad)
    with pytest.raises(VerificationError) as forked:
        Proof(bad).result()
    assert forked.value.one_line() == inline.value.one_line()


def test_cancel_stops_the_child(forking: None) -> None:
    proof = Proof(ring_allreduce_schedule(8, 4))
    child = proof._child
    assert child is not None
    proof.cancel()
    assert not child.is_alive()
    proof.cancel()  # twice is harmless


def test_auto_with_forked_proofs_picks_the_same_winner(forking: None, monkeypatch: pytest.MonkeyPatch) -> None:
    topology = switch_cluster(4, hosts=2)
    options = Options(size_bytes=1 << 20)
    forked = compile_schedule(topology, "allreduce", "auto", options)
    monkeypatch.setattr(proof_module, "PARALLEL_VERIFY_OPS", 10**12)
    inline = compile_schedule(topology, "allreduce", "auto", options)
    assert forked.schedule.programs == inline.schedule.programs
    assert forked.proof == inline.proof




def test_a_symmetric_form_is_proved_by_class_else_its_built_schedule_rank_by_rank(
        forking: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.runtime.test_symmetric import ring

    form = ring(8)
    built = form.expanded()
    assert Proof(form, built).result() == verify(built)
    proved: list[Schedule] = []
    monkeypatch.setattr(proof_module, "PARALLEL_VERIFY_OPS", 10**9)  # inline, to see what it proves
    monkeypatch.setattr(proof_module, "verify_by_class", lambda schedule: None)  # a form it cannot prove by class

    def recorded(schedule: Schedule) -> VerifyReport:
        proved.append(schedule)
        return verify(schedule)

    monkeypatch.setattr(proof_module, "verify", recorded)
    assert Proof(form, built).result() == verify(built)
    assert proved[0] is built  # its programs at hand, not the form's built anew
