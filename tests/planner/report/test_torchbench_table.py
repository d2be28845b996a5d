"""``topocc torchbench``'s table: nccl-tests' columns and number formats, one group per backend, busbw by
nccl-tests' factor per collective, the footer with topocc's planned and native calls; its JSON names are
documented; wrong elements are an error."""

from __future__ import annotations

import dataclasses

import pytest

from tests.test_json_names import documented, undocumented
from topocc.planner.report.torchbench_table import format_torchbench, torchbench_json, torchbench_wrong
from topocc.runtime.harness.torchbench.sweep import make_sweep
from topocc.runtime.harness.torchbench.torchrun import Row, TorchbenchResult

#: nccl-tests' busbw / algbw on 4 ranks.
FACTORS = {"allreduce": 1.5, "allgather": 0.75, "reducescatter": 0.75, "alltoall": 0.75, "broadcast": 1.0,
           "reduce": 1.0}


def result(collective: str, times: dict[str, list[float]], **rows: object) -> TorchbenchResult:
    sweep = make_sweep(collective, 1 << 20, 1 << 30, 1 << 10, ranks=4, backends=",".join(times))
    table = [Row(backend, size, count, times[backend][i], 0,
                 *((2, 3) if backend == "topocc" else (None, None)))
             for i, (size, count) in enumerate(zip(sweep.sizes, sweep.counts)) for backend in times]
    return TorchbenchResult(sweep, tuple(dataclasses.replace(r, **rows) for r in table),  # type: ignore[arg-type]
                            {collective: {"planned": 4, "delegated": 6, "why": "model predicts no gain"}},
                            "compiled for emu-uniform[0-3]", False, ("torchrun",), 1.0)


def data_lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("collective", sorted(FACTORS))
def test_columns_are_nccl_tests_with_busbw_by_its_factor(collective: str) -> None:
    # 1 MiB in 100 us and 1 GiB in 0.1 s: algbw 10.49 and 10.74 GB/s
    done = result(collective, {"topocc": [100e-6, 0.1], "gloo": [200e-6, 0.2]})
    text = format_torchbench(done)
    rows = data_lines(text)
    assert len(rows) == 2 and all(len(r) == 5 + 4 * 2 for r in rows)
    size, count, kind, redop, root = rows[0][:5]
    assert (int(size), kind, root) == (1 << 20, "float", "-1" if collective not in ("broadcast", "reduce") else "0")
    assert int(count) == (1 << 18) // (4 if collective in ("allgather", "reducescatter", "alltoall") else 1)
    assert redop == ("sum" if collective in ("allreduce", "reducescatter", "reduce") else "none")
    for row, seconds in zip(rows, (100e-6, 0.1)):
        algbw = int(row[0]) / seconds / 1e9
        for first, scale in ((5, 1), (9, 2)):  # topocc's group, then gloo's (twice the time)
            assert float(row[first + 1]) == pytest.approx(algbw / scale, abs=0.006)
            assert float(row[first + 2]) == pytest.approx(algbw / scale * FACTORS[collective], abs=0.006)
            assert row[first + 3] == "0"
    assert [r[5] for r in rows] == ["100.0", "100000"]  # nccl-tests' time: fewer decimals as it grows
    header = [line for line in text.splitlines() if line.startswith("#       size")]
    assert header and header[0].split()[1:] == ["size", "count", "type", "redop", "root"] + [
        "time", "algbw", "busbw", "#wrong"] * 2
    assert f"busbw = algbw x {FACTORS[collective]:g} (nccl-tests'" in text


def test_the_footer_has_the_average_busbw_and_topoccs_calls() -> None:
    done = result("allreduce", {"topocc": [100e-6, 0.1], "gloo": [200e-6, 0.2]})
    text = format_torchbench(done)
    assert "# Out of bounds values : 0 OK" in text
    average = (1 << 20) / 100e-6 / 1e9 * 1.5 / 2 + (1 << 30) / 0.1 / 1e9 * 1.5 / 2
    line = next(x for x in text.splitlines() if x.startswith("# Avg bus bandwidth"))
    assert line.split()[5] == "topocc" and float(line.split()[6]) == pytest.approx(average, rel=1e-3)
    assert ("# topocc calls        : 4 of 10 ran a plan (at every size), 6 went to gloo (model predicts no gain)"
            in text)
    assert "# topocc's plans: compiled for emu-uniform[0-3]" in text


def test_json_rows_use_documented_names_and_nccl_tests_bandwidths() -> None:
    done = result("allgather", {"topocc": [100e-6, 0.1], "gloo": [200e-6, 0.2]})
    doc = torchbench_json(done)
    assert undocumented(doc, documented()) == []
    assert len(doc["rows"]) == 4 and doc["root"] is None and doc["redop"] == "none"
    for row in doc["rows"]:
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 0.75)
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_s"] / 1e9)
    topocc, gloo = doc["backends"]
    assert (topocc["planned"], topocc["native"], topocc["why_native"]) == (4, 6, "model predicts no gain")
    assert gloo["planned"] is None and gloo["avg_busbw_GBps"] > 0


def test_wrong_elements_fail_the_sweep_naming_the_backend_and_size() -> None:
    done = result("allreduce", {"topocc": [1e-3, 1e-3], "gloo": [1e-3, 1e-3]})
    assert torchbench_wrong(done) is None
    bad = dataclasses.replace(done, rows=(dataclasses.replace(done.rows[0], wrong=7), *done.rows[1:]))
    assert "# Out of bounds values : 7 FAILED" in format_torchbench(bad)
    error = torchbench_wrong(bad)
    assert error is not None and error.exit_code == 7
    assert error.one_line().startswith("7 element(s) differ from the exact result: topocc at 1MiB (fix: ")
