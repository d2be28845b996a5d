"""``topocc torchbench``: a real sweep of topocc beside gloo on 2 ranks under torchrun (CPU), read back from
its table and its ``--json`` file; the other collectives and a rank's failure (slow); and every refusal is
one line with a non-zero exit."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_json_names import documented, undocumented
from topocc.planner.cli import main

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install torch)")
#: nccl-tests' busbw / algbw on 2 ranks.
FACTORS = {"allreduce": 1.0, "allgather": 0.5, "reducescatter": 0.5, "alltoall": 0.5, "broadcast": 1.0,
           "reduce": 1.0}
TINY = ["-b", "1K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1"]


def sweep(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str,
          ) -> tuple[list[list[str]], str, dict[str, Any]]:
    """Run ``topocc torchbench ARGS --json``: the table's data rows (split), all its text, and the JSON."""
    out = tmp_path / "rows.json"
    code = main(["torchbench", *args, "--json", str(out)])
    text, err = capsys.readouterr()
    assert code == 0, err
    rows = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    return rows, text, json.loads(out.read_text())


def check_columns(rows: list[list[str]], doc: dict[str, Any], collective: str, sizes: list[int]) -> None:
    """nccl-tests' columns, one group per backend (topocc's, then gloo's); busbw = algbw x the factor; no
    wrong element, in the table and in the JSON."""
    assert [int(r[0]) for r in rows] == sizes
    for row in rows:
        assert len(row) == 5 + 4 * 2 and row[2] == "float"
        for group in (5, 9):
            time_us, algbw, busbw, wrong = row[group:group + 4]
            assert float(time_us) > 0 and wrong == "0"
            assert float(busbw) == pytest.approx(float(algbw) * FACTORS[collective], abs=0.011)
    assert [r["backend"] for r in doc["rows"]] == ["topocc", "gloo"] * len(sizes)
    for row in doc["rows"]:
        assert row["wrong"] == 0 and row["size_bytes"] in sizes
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_s"] / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * FACTORS[collective])
    assert undocumented(doc, documented()) == []


@needs_torch
def test_a_two_rank_sweep_times_topocc_beside_gloo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows, text, doc = sweep(capsys, tmp_path, *TINY)
    check_columns(rows, doc, "allreduce", [1024, 4096, 16384, 65536])
    assert [r[1:5] for r in rows] == [[str(n), "float", "sum", "-1"] for n in (256, 1024, 4096, 16384)]
    assert "# topocc's plans: compiled for emu-uniform[0-1] (the default" in text
    assert "# Out of bounds values : 0 OK" in text and "# Avg bus bandwidth    : topocc " in text
    # every call of topocc's (a warm-up, two timed, one checked, per size) ran a plan or went to gloo, and
    # the footer counts them
    topocc = doc["backends"][0]
    assert topocc["planned"] + topocc["native"] == 4 * 4
    assert f"# topocc calls        : {topocc['planned']} of 16 ran a plan" in text


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize(("collective", "extra"), [("all_gather", []), ("reduce_scatter", ["-o", "max"]),
                                                   ("broadcast", ["-r", "1"]), ("reduce", ["-d", "bfloat16"]),
                                                   ("all_to_all", ["--force-plans"])])
def test_the_other_collectives_sweep_in_torchs_spelling(collective: str, extra: list[str], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    name = collective.replace("_", "")
    rows, text, doc = sweep(capsys, tmp_path, "-c", collective, "-b", "1K", "-e", "4K", "-f", "4", "-n", "1",
                            "-w", "4", *extra)
    datatype = "bfloat16" if "bfloat16" in extra else "float"
    if datatype == "float":
        check_columns(rows, doc, name, [1024, 4096])
    assert all(r["wrong"] == 0 for r in doc["rows"]) and doc["collective"] == name
    assert rows[0][2] == datatype and rows[0][4] == ("1" if name == "broadcast" else "0" if name == "reduce" else "-1")
    if "--force-plans" in extra:  # every call of topocc's ran its plan: no threshold, no trial
        assert doc["backends"][0]["native"] == 0 and doc["backends"][0]["planned"] == 2 * 6
        assert "every size runs the plan (--force-plans)" in text


@needs_torch
@pytest.mark.slow
def test_a_rank_that_fails_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOPOCC_TOPOLOGY", "some-other-cluster")  # the bundle is refused at init_process_group
    assert main(["torchbench", *TINY]) == 5
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("topocc: error: rank ") and "TOPOCC_TOPOLOGY names some-other-cluster" in err


@pytest.mark.parametrize(("args", "code", "message"), [
    (["-c", "allreduse"], 2, r"'allreduse' is not one of .* \(did you mean allreduce\?\)"),
    (["-c", "all_gathr"], 2, r"\(did you mean allgather\?\)"),
    (["-b", "1X"], 2, r"Invalid value for '-b' / '--minbytes': '1X' is not a size"),
    (["-b", "64K", "-e", "1K"], 2, r"-b/--minbytes 65536 is larger than -e/--maxbytes 1024 \(fix: pass -b at most"),
    (["-d", "floot"], 2, r"-d/--datatype 'floot' is not a datatype \(did you mean float\?\)"),
    (["--backend", "topocc,glo"], 2, r"--backend 'glo' is not a backend \(did you mean gloo\?\)"),
    (["--ranks", "4", "--topology", "emu-uniform"], 2, r"--topology emu-uniform has 8 ranks but --ranks is 4 "
                                                       r"\(fix: pass --ranks 8, or a process group of it"),
    (["--ranks", "12"], 2, r"the default topology \(emu-uniform\) has 8 ranks, not 12"),
    (["--backend", "gloo", "--topology", "emu-uniform"], 2, r"--backend leaves it out"),
    (["--torchrun", "/no/such/torchrun"], 1, r"--torchrun /no/such/torchrun: no such program"),
])
def test_bad_input_is_one_line_and_a_non_zero_exit(args: list[str], code: int, message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["torchbench", *args]) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("topocc: error: "), err
    assert re.search(message, err), err


def test_torch_missing_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what find_spec reports for a module that is not there
    assert main(["torchbench"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("topocc: error: torch is not installed for ") and len(err.splitlines()) == 1


@needs_torch
def test_nccl_without_a_gpu_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: nccl is not refused")
    assert main(["torchbench", "--backend", "topocc,nccl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("topocc: error: --backend nccl needs CUDA, and torch sees no GPU here (fix: leave nccl out of "
                   "--backend (e.g. --backend topocc,gloo) and use --device cpu, or run where "
                   "torch.cuda.is_available())")
