"""``topocc compile --compress``: the summary, ``--json``, the file written, the HTML report, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topocc.planner.cli import main
from topocc.runtime.plan import load_plan
from topocc.runtime.schedule import load_schedule


def test_compile_compress_writes_an_encoded_verified_schedule(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.json"
    assert main(["compile", "emu-racks", "-s", "1MiB", "-a", "ring", "--compress", "bf16@inter-rack", "-o",
                 str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    report = doc["compression"]
    assert report["policy"] == "bf16@inter-rack" and report["rules"] == [{"rule": "bf16@inter-rack",
                                                                         "classes": ["switch-1"]}]
    assert report["encoded_messages"] > 0 and report["rounding_copies"] > 0
    assert {c["link_class"] for c in report["encoded_classes"]} >= {"switch-1"}
    assert all(c["wire_bytes"] == pytest.approx(c["exact_bytes"] / 2, rel=1e-3) for c in report["encoded_classes"])
    assert doc["predicted_time_s"] == report["predicted_time_s"]
    schedule = load_schedule(out)
    assert json.loads(out.read_text())["version"] == 3
    assert sum(op.encoding == "bf16" for p in schedule.programs for op in p if op.kind == "send") == \
        report["encoded_messages"]
    assert main(["verify", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["approximate_chunks"] > 0
    html = tmp_path / "r.html"
    assert main(["inspect", str(out), "--html", str(html), "--baselines", ""]) == 0
    capsys.readouterr()
    page = html.read_text()
    assert "<section id='compression'>" in page and "bf16" in page and "saved" in page


def test_compile_compress_text_and_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "emu-racks", "-s", "1MiB", "-a", "ring", "--compress", "int8@slow"]) == 0
    text = capsys.readouterr().out
    assert "compression:    int8@slow (int8:block=256@slow -> switch-1)" in text
    assert "rounding copies keep the ranks bitwise equal" in text and "switch-1" in text
    out = tmp_path / "plan.json"
    assert main(["compile", "emu-racks", "-s", "256KiB:1MiB", "-a", "ring", "--compress", "bf16@inter-rack",
                 "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = load_plan(out)
    assert len(doc["compression"]) == len(plan.schedules) == len(doc["buckets"])
    assert all(any(op.encoding for p in s.programs for op in p) for s in plan.schedules)


@pytest.mark.parametrize(("argv", "code", "fragment"), [
    (["compile", "dgx1-v100", "-a", "ring", "--compress", "bf16@slow"], 6,
     "compression policy 'bf16@slow' selects no message of this plan (it crosses host:nvlink"),
    (["compile", "emu-racks", "--compress", "bf16"], 2, "'bf16' is not ENCODING@SCOPE"),
    (["compile", "emu-racks", "-a", "ring", "-s", "1MiB", "--compress", "bf16@rack"], 2,
     "compression scope 'rack' is neither slow"),
])
def test_refusals_are_one_line(argv: list[str], code: int, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err


def test_bundle_compress_compiles_every_plan_with_the_policy(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bundle"
    argv = ["bundle", "emu-racks", "-o", str(out), "-c", "allreduce", "-s", "256KiB:1MiB", "--group", "0-1",
            "--compress", "topk:budget=2%@inter-host"]
    assert main(argv) == 6  # the group 0-1 shares a host: nothing to compress there
    err = capsys.readouterr().err.strip()
    assert "plan 2/2 (allreduce on 0-1): compression policy 'topk:budget=2%@inter-host' selects no message" in err
    assert "--compress-else exact" in err and "\n" not in err
    assert main([*argv, "--compress-else", "exact", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    world, group = doc["plans"]
    assert all(r["encoded_messages"] > 0 for r in world["compression"])
    assert {c["encoding"] for r in world["compression"] for c in r["encoded_classes"]} <= {"topk:0.02", "topk:0.01"}
    assert all(r["encoded_messages"] == 0 for r in group["compression"])
    assert main([*argv, "--compress-else", "exact"]) == 0
    assert "compressed with topk:budget=2%@inter-host: 1 of 2 plans encode" in capsys.readouterr().out


def test_bundle_compress_else_needs_compress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bundle", "emu-racks", "-o", str(tmp_path / "b"), "--compress-else", "exact"]) == 2
    assert "--compress-else says what --compress does" in capsys.readouterr().err
