"""The compression pass: policies, which links each scope selects, refusals, and what its report says."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.compile import Compiled, compile_schedule
from topocc.planner.compiler.compress import compress, parse_policy
from topocc.planner.compiler.options import Options
from topocc.planner.compiler.rounding import make_consistent
from topocc.planner.errors import NotApplicableError, UsageError
from topocc.planner.routing.network import Network, network_of
from topocc.planner.topology.calibration import link_classes_of
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.schedule import dump_schedule


@cache
def _net(name: str) -> Network:
    return network_of(resolve_topology(name))


@cache
def _compiled(name: str, collective: str = "allreduce", algorithm: str = "ring") -> Compiled:
    return compile_schedule(_net(name), collective, algorithm, Options(size_bytes=1 << 20))


def test_policies_parse_to_canonical_rules() -> None:
    policy = parse_policy("topk:1%@inter-rack, int8@links<=25Gb/s,fp16@host-switch")
    assert [(r.encoding, r.scope) for r in policy.rules] == [
        ("topk:0.01", "inter-rack"), ("int8:block=256", "links<=25Gb/s"), ("fp16", "host-switch")]
    assert policy.rules[1].max_bandwidth == 25e9 / 8


@pytest.mark.parametrize(("text", "fragment"), [
    ("bf16", "'bf16' is not ENCODING@SCOPE"), ("@slow", "is not ENCODING@SCOPE"),
    ("bf12@slow", "unknown encoding 'bf12'"), ("int8@links<=fast", "is not a bandwidth"),
])
def test_bad_policies_are_one_line_with_a_fix(text: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment) as info:
        parse_policy(text)
    assert info.value.fix and "\n" not in str(info.value)


@pytest.mark.parametrize(("policy", "classes"), [
    ("bf16@inter-rack", ("switch-1",)), ("bf16@slow", ("switch-1",)), ("bf16@links<=50Gb/s", ("switch-1",)),
    ("bf16@host-switch", ("host-switch",)), ("bf16@inter-host", ("host-switch", "switch-1")),
])
def test_each_scope_selects_its_links(policy: str, classes: tuple[str, ...]) -> None:
    report = compress(_net("emu-racks"), _compiled("emu-racks"), policy).report
    assert report.rules == ((policy, classes),)
    assert report.encoded_messages > 0 and report.approximate_chunks > 0
    assert {c.encoding for c in report.classes} == {"bf16"}
    assert all(c.saved == pytest.approx(0.5, abs=1e-3) for c in report.classes)
    crossed = {c.link_class for c in report.classes}
    assert set(classes) <= crossed  # encoded messages cross the selected classes (and those on their way)


def test_the_first_rule_that_selects_a_message_wins() -> None:
    report = compress(_net("emu-racks"), _compiled("emu-racks"), "int8@inter-rack,bf16@inter-host").report
    encodings = {(c.link_class, c.encoding) for c in report.classes}
    assert ("switch-1", "int8:block=256") in encodings and ("switch-1", "bf16") not in encodings
    assert ("host-switch", "bf16") in encodings  # messages between hosts of one rack


def test_the_result_is_verified_consistent_and_the_input_plan_untouched() -> None:
    compiled = _compiled("emu-racks")
    before = dump_schedule(compiled.schedule)
    done = compress(_net("emu-racks"), compiled, "bf16@inter-rack")
    assert dump_schedule(compiled.schedule) == before
    result = done.compiled.schedule
    assert verify(result).approximate_chunks == done.report.approximate_chunks
    assert result.metadata.options["compress"] == "bf16@inter-rack"
    assert result.metadata.predicted_time_s == done.compiled.sim.time_s == done.report.predicted_time_s
    assert done.report.exact_time_s == compiled.sim.time_s
    assert done.report.roundings > 0  # ring's owners keep what they send along the ring
    doc = done.report.to_json()
    assert doc["encoded_messages"] == done.report.encoded_messages and doc["encoded_links"]


def test_no_slow_links_and_nothing_selected_are_refused() -> None:
    with pytest.raises(NotApplicableError, match=r"compression policy 'bf16@slow' selects no message of this plan "
                                                 r"\(it crosses host:nvlink") as info:
        compress(_net("dgx1-v100"), _compiled("dgx1-v100"), "bf16@slow")
    assert "leave --compress out" in (info.value.fix or "")
    with pytest.raises(NotApplicableError, match="selects no message"):
        compress(_net("emu-racks"), _compiled("emu-racks"), "int8@links<=1Gb/s")
    with pytest.raises(UsageError, match=r"'nvlink' is neither .* its link classes: host-switch, host:pcie"):
        compress(_net("emu-racks"), _compiled("emu-racks"), "bf16@nvlink")


def test_collectives_without_a_shared_result_need_no_rounding() -> None:
    compiled = _compiled("emu-racks", "reducescatter")
    sends = {(r, k): "int8:block=256" for r, p in enumerate(compiled.schedule.programs) for k, op in enumerate(p)
             if op.kind == "send"}
    done = make_consistent(compiled.schedule, sends)
    assert (done.roundings, done.kept_exact) == (0, 0)
    assert verify(done.schedule).approximate_chunks == compiled.schedule.ranks * compiled.schedule.output_chunks


@pytest.mark.parametrize(("collective", "algorithm"), [("broadcast", "ring"), ("allgather", "direct")])
def test_sends_of_an_out_of_place_input_read_its_rounded_copy(collective: str, algorithm: str) -> None:
    """The input cannot be rounded in place: the sends that carry it read the output chunk it was copied to,
    rounded there; with that way closed, those messages go exact."""
    compiled = _compiled("emu-racks", collective, algorithm)
    done = compress(_net("emu-racks"), compiled, "bf16@inter-rack")
    assert done.report.encoded_messages > 0 and done.report.kept_exact == 0
    moved = [op for p in done.compiled.schedule.programs for op in p if op.kind == "send" and op.encoding
             and op.src.buffer == "o"]
    original = [op for p in compiled.schedule.programs for op in p if op.kind == "send" and op.src.buffer == "i"]
    assert original and moved
    sends = {(r, k): "bf16" for r, p in enumerate(compiled.schedule.programs) for k, op in enumerate(p)
             if op.kind == "send"}
    closed = make_consistent(compiled.schedule, sends, redirect=False)
    assert closed.kept_exact > 0
    verify(closed.schedule)


def test_a_budget_sizes_top_k_by_each_class_bandwidth() -> None:
    """DLion's per-link budget: on emu-racks the rack uplinks (switch-1, 50 Gb/s) are half as fast as the host
    links (host-switch, 100 Gb/s), so messages crossing them keep half the fraction."""
    assert parse_policy("topk:budget@inter-rack").rules[0].budget == 0.01
    rule = parse_policy("topk:budget=2%@inter-host").rules[0]
    assert (rule.encoding, rule.budget, str(rule)) == ("topk:budget=0.02", 0.02, "topk:budget=0.02@inter-host")
    net = _net("emu-racks")
    classes = link_classes_of(net.topology)
    speed = {classes[(link.src, link.dst)]: link.bandwidth for link in net.topology.links}
    assert speed["switch-1"] * 2 == speed["host-switch"]
    done = compress(net, _compiled("emu-racks"), "topk:budget=2%@inter-host")
    result = done.compiled.schedule
    fractions = {op.encoding for p in result.programs for op in p if op.encoding}
    assert fractions == {"topk:0.02", "topk:0.01"}
    by_class = {(c.link_class, c.encoding) for c in done.report.classes}
    assert ("switch-1", "topk:0.01") in by_class and ("switch-1", "topk:0.02") not in by_class
    assert ("host-switch", "topk:0.02") in by_class  # between the hosts of a rack: the full budget
    verify(result)  # consistent and exact where a value would need two budgets (kept exact)
    assert done.report.kept_exact > 0
    one = compress(net, _compiled("emu-racks"), "topk:budget=2%@inter-rack").compiled.schedule
    assert {op.encoding for p in one.programs for op in p if op.encoding} == {"topk:0.02"}  # one class: F itself


@pytest.mark.parametrize(("text", "fragment"), [
    ("topk:budget=0@slow", "bad top-k encoding 'topk:0'"), ("topk:budget=x%@slow", "bad top-k encoding"),
])
def test_bad_budgets_are_one_line(text: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment) as info:
        parse_policy(text)
    assert "topk:budget=1%" in (info.value.fix or "")


def test_a_plan_without_slow_links_is_refused_or_left_exact_by_choice() -> None:
    from topocc.planner.compiler.compress import compress_all

    net = _net("dgx1-v100")
    buckets = [_compiled("dgx1-v100")]
    with pytest.raises(NotApplicableError, match="selects no message"):
        compress_all(net, buckets, "bf16@slow")
    done = compress_all(net, buckets, "bf16@slow", exact_if_none=True)
    assert done[0].compiled is buckets[0] and done[0].report.encoded_messages == 0
    assert dump_schedule(done[0].compiled.schedule) == dump_schedule(buckets[0].schedule)


CALIBRATED = """
calibration:
  measured: "2026-11-29T00:00:00Z"
  how: "by hand"
  transport: "MPI (test)"
  links:
    host-switch: {bandwidth: 12 GB/s, latency: 5 us}
    switch-1: {bandwidth: 3 GB/s, latency: 5 us}
"""


def test_a_budget_follows_the_calibrated_bandwidths() -> None:
    """Measured figures replace the file's: a rack uplink measured at a quarter of the host links' bandwidth
    keeps a quarter of the budget."""
    from topocc.planner.topology.catalogue import shipped_topologies
    from topocc.planner.topology.parse import parse_topology_text

    text = Path(shipped_topologies()["emu-racks"]).read_text() + CALIBRATED
    net = network_of(parse_topology_text(text, "emu-racks-calibrated.yaml"))
    compiled = compile_schedule(net, "allreduce", "ring", Options(size_bytes=1 << 20))
    result = compress(net, compiled, "topk:budget=4%@inter-host").compiled.schedule
    assert {op.encoding for p in result.programs for op in p if op.encoding} == {"topk:0.04", "topk:0.01"}


def test_a_schedule_compiled_in_the_symmetric_form_compresses_and_writes_its_encodings() -> None:
    import json

    from tests.planner.analysis.test_automorphisms import compiled_by_class
    from topocc.planner.compiler.symmetrize import symmetric_form
    from topocc.runtime.schedule import parse_schedule

    net, compiled = compiled_by_class()
    assert compiled.schedule.symmetry is not None  # timed, and kept, in the form it is written in
    result = compress(net, compiled, "bf16@inter-host").compiled.schedule
    encoded = sum(op.encoding is not None for program in result.programs for op in program)
    assert encoded > 0
    written = parse_schedule(json.loads(dump_schedule(symmetric_form(result, net.topology))))
    assert sum(op.encoding is not None for program in written.programs for op in program) == encoded
    verify(written)
