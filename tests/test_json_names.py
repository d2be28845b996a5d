"""Every command's ``--json`` uses only the names docs/json.md lists, and the names say their unit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from topocc.planner.cli import main
from topocc.planner.testbed.bench import EmulatedRow

DOC = REPO / "docs" / "json.md"
DGX1 = str(REPO / "schedules" / "dgx1-v100-allreduce.json")
EMU = str(REPO / "schedules" / "emu-uniform-allreduce.json")


def documented() -> dict[str, str]:
    """name -> its type and unit, from the table of fields."""
    rows = re.findall(r"^\| `([a-z_A-Z#]+)` \| ([^|]+) \|", DOC.read_text(), re.M)
    return {name: kind.strip() for name, kind in rows}


def undocumented(doc: Any, names: dict[str, str], path: str = "") -> list[str]:
    """Every key of ``doc`` (nested) that is not documented; keys of "keyed by" objects are data, not names."""
    if isinstance(doc, list):
        return [bad for item in doc for bad in undocumented(item, names, path)]
    if not isinstance(doc, dict):
        return []
    bad = []
    for key, value in doc.items():
        if key not in names:
            bad.append(f"{path}{key}")
        elif "keyed by" in names[key]:
            bad += [b for v in value.values() for b in undocumented(v, names, f"{path}{key}.*.")]
        else:
            bad += undocumented(value, names, f"{path}{key}.")
    return bad


def test_names_say_their_unit() -> None:
    names = documented()
    assert len(names) > 50
    for name, kind in names.items():
        for unit, suffix in (("seconds", "_s"), ("bytes", "_bytes"), ("GB/s", "_GBps")):
            assert (unit in kind.split(", ")[-1]) == name.endswith(suffix), (name, kind)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_every_command_uses_documented_names(tmp_path: Path, two_rank_schedule: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "s.json")
    docs = {
        "compile": _json(capsys, "compile", "emu-uniform", "-s", "1MiB", "-o", out),
        "compile plan": _json(capsys, "compile", "emu-uniform", "-a", "ring", "-s", "1MiB:4MiB"),
        "simulate": _json(capsys, "simulate", DGX1, "-t", "emu-uniform", "--what-if", "-s", "1MiB", "--candidates",
                          "--trace", str(tmp_path / "t.json")),
        "verify": _json(capsys, "verify", out),
        "topo show": _json(capsys, "topo", "show", "emu-uniform", "--html", str(tmp_path / "t.html")),
        "plan-buckets": _json(capsys, "plan-buckets", str(REPO / "examples" / "profile_example.yaml"), "--plan", EMU),
        "algorithms": _json(capsys, "algorithms"),
        "bundle": _json(capsys, "bundle", "emu-uniform", "-o", str(tmp_path / "bundle"), "-c", "allreduce", "-c",
                        "broadcast", "-s", "1KiB:4KiB", "--group", "0-3"),
        "run": _json(capsys, "run", str(two_rank_schedule), "-s", "4KiB", "--iters", "1"),
        "bench": _json(capsys, "bench", str(two_rank_schedule), "--sizes", "4KiB", "--iters", "1", "--warmup", "0"),
        "bench --emulate": [EmulatedRow(1024, "ring", 1e-3, 2e-3, None, 9e-4, 0.0, 0, 5, "network-bound").to_json()],
    }
    names = documented()
    bad = {command: undocumented(doc, names) for command, doc in docs.items()}
    assert bad == {command: [] for command in docs}
    # the table of commands on that page names exactly the top-level fields each one prints
    # (the commands' table comes first; a field of the same name, such as torchbench's `bundle`, comes later)
    table: dict[str, str] = {}
    rows = re.findall(r"^\| `([a-z -]+(?:--[a-z]+)?(?: LOW:HIGH)?)` \| (.+) \|$", DOC.read_text(), re.M)
    for command, fields in rows:
        table.setdefault(command, fields)
    for command, doc in docs.items():
        first = doc[0] if isinstance(doc, list) else doc
        key = "compile --size LOW:HIGH" if command == "compile plan" else command
        listed = set(re.findall(r"`([a-z_A-Z]+)`", table[key]))
        assert set(first) <= listed, (command, set(first) - listed)
