"""``topocc inspect``: the terminal view, the HTML report with its baselines, the DOT drawing, from one run."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import topocc.planner.report.inspect as inspect
from tests.conftest import must_search
from tests.planner.report.conftest import SIZE
from topocc.planner.report.inspect import _baseline
from topocc.planner.topology.catalogue import resolve_topology


def test_inspect_writes_the_report_with_baselines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``topocc inspect --html``: the shipped DGX-1 plan against tree (simulated) and ring (its own algorithm)."""
    shipped = Path(__file__).resolve().parents[3] / "schedules" / "dgx1-v100-allreduce.json"
    out = tmp_path / "r.html"
    said = inspect.inspect_schedule(str(shipped), html=str(out), baselines=["ring", "tree", "no-such"])
    assert said == f"wrote {out}"
    table = must_search(r'<table id="comparison">.*?</table>', out.read_text(), re.S).group(0)
    assert "ring (this plan)" in table and re.search(r"<td>tree</td><td class=\"num\">[0-9.]+ ms</td>", table)
    # past the operation budget a baseline is timed by its busiest link alone, not simulated
    monkeypatch.setattr(inspect, "BASELINE_SIMULATE_OPS", 10)
    inspect.inspect_schedule(str(shipped), html=str(out), baselines=["tree"])
    assert re.search(r"<td>tree</td><td colspan=\"5\" class=\"note\">not simulated \([0-9,]+ operations\): its busiest "
                     r"link alone needs [0-9.]+ ms</td>", out.read_text())


def test_flat_baselines_are_not_built_at_1024_ranks() -> None:
    """A ring over 1024 ranks would cost minutes: the report says why it is not compared, without building it."""
    plan = SimpleNamespace(collective="allreduce", root=None)  # all a baseline reads of the plan
    note = _baseline(resolve_topology("fattree-1024"), plan, "ring", SIZE)  # type: ignore[arg-type]
    assert note == "not compared: above 256 ranks it takes minutes to build (auto skips it too)"
    assert _baseline(resolve_topology("fattree-1024"), plan, "no-such", SIZE) is None  # type: ignore[arg-type]
