"""The lean recording behind the reports: the simulator's message hook, and the numpy aggregation over it."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from topocc.planner.analysis.simulate import simulate
from topocc.planner.report._run import link_bins, link_step_bytes, spread
from topocc.planner.report._timeline import timeline_doc

from .conftest import SIZE, Plan


def test_spread_puts_each_amount_in_its_bins() -> None:
    rows = np.array([0, 0, 1, 1])
    start = np.array([0.0, 0.25, 0.5, 0.1])
    end = np.array([0.5, 0.25, 1.0, 0.9])
    amount = np.array([1.0, 2.0, 3.0, 8.0])
    got = spread(rows, start, end, amount, 2, 1.0, 4)
    # row 0: 1 over bins 0-1 evenly, 2 at an instant in bin 1; row 1: 3 over bins 2-3,
    # 8 over 0.1-0.9: 0.15, 0.25, 0.25 and 0.15 of its 0.8 s in bins 0 to 3
    assert got == pytest.approx(np.array([[0.5, 2.5, 0.0, 0.0], [1.5, 2.5, 4.0, 3.0]]))
    assert got.sum() == pytest.approx(amount.sum())


def test_hook_sees_every_message_once(dgx1_ring: Plan) -> None:
    """The lean run keeps one row per message with the times the full recording gives its send and receive."""
    p = dgx1_ring
    full = simulate(p.topology, p.schedule, SIZE, record=True)
    assert p.run.result.time_s == full.time_s
    sends = sum(1 for program in p.schedule.programs for op in program if op.kind == "send")
    assert p.run.messages == sends
    assert (p.run.start >= 0).all() and (p.run.start <= p.run.end).all() and (p.run.end <= full.time_s).all()
    want = Counter((e.rank, e.peer, e.channel, e.step, e.end_s) for e in full.op_events if e.kind == "send")
    columns = (p.run.src, p.run.dst, p.run.channel, p.run.step, p.run.end)
    assert Counter(zip(*(c.tolist() for c in columns))) == want
    assert p.run.reduce.sum() == sum(1 for e in full.op_events if e.kind == "recv_reduce")


def test_link_bytes_per_step_match_the_recorded_flows(racks_plan: Plan) -> None:
    """Bytes per link and step from messages spread over their routes = the full recording's flows, summed."""
    p = racks_plan
    full = simulate(p.topology, p.schedule, SIZE, record=True)
    want: dict[tuple[str, str, int], float] = defaultdict(float)
    for e in full.link_events:
        want[(e.src, e.dst, e.step)] += e.bytes
    got = link_step_bytes(p.run)
    assert set(got) == set(want)
    for key, nbytes in want.items():
        assert got[key] == pytest.approx(nbytes, rel=1e-9)


def test_host_and_rack_strips_account_for_every_byte(racks_plan: Plan) -> None:
    """Each host's and rack's strips: what its ranks send out of it and within it, every byte once."""
    import base64

    p = racks_plan
    doc = timeline_doc(p.topology, p.run)
    views = {v["id"]: v for v in doc["views"]}
    assert set(views) == {"lanes", "ranks", "host", "rack"}
    sent, run_s = float(p.run.nbytes.sum()), p.result.time_s
    for v in (views["host"], views["rack"]):
        assert sum(r["mean_out"] + r["mean_in"] for r in v["rows"]) * run_s == pytest.approx(sent)
        for r in v["rows"]:  # the strip at its scale averages to the row's rate, less the few bins drawn as full
            for side in ("out", "in"):
                level = np.frombuffer(base64.b64decode(r[side]), np.uint8) / 255 * v[f"peak_{side}"]
                assert 0.85 * r[f"mean_{side}"] - 1e6 <= level.mean() <= 1.01 * r[f"mean_{side}"] + 1e6
    # what leaves a rack leaves its host, and some of what leaves a host stays in its rack
    host_out = sum(r["mean_out"] for r in views["host"]["rows"])
    assert 0 < sum(r["mean_out"] for r in views["rack"]["rows"]) < host_out
    # the busiest link's strip: near its utilisation over the run (less only where smoothing overflows a bin)
    busiest = doc["links"]["rows"][0]
    level = np.frombuffer(base64.b64decode(busiest["v"]), np.uint8) / 255
    assert busiest["mean"] == pytest.approx(max(p.result.link_utilisation.values()), abs=1e-4)
    assert busiest["mean"] - 0.05 < level.mean() <= busiest["mean"] + 0.005


def test_link_bins_add_up_to_the_bytes_carried(racks_plan: Plan) -> None:
    p = racks_plan
    used = [i for i, ln in enumerate(p.topology.links) if p.result.link_bytes[(ln.src, ln.dst)] > 0]
    carried = link_bins(p.run, used, 500)
    want = [p.result.link_bytes[(p.topology.links[i].src, p.topology.links[i].dst)] for i in used]
    assert carried.sum(axis=1) == pytest.approx(want, rel=1e-9)
    assert (carried >= 0).all()
    # a link that carries nothing in the first bin (the racks' uplinks wait for the hosts' first level) shows so
    uplinks = [j for j, i in enumerate(used) if p.topology.links[i].dst.startswith("spine")]
    assert uplinks and all(carried[j, 0] == 0 for j in uplinks)
