"""benchmarks/scale_bench.py on a small shipped cluster: a compiled and loaded row, and a capped one."""

from __future__ import annotations

import pytest

from benchmarks import scale_bench as S


def test_a_case_is_compiled_and_loaded_in_capped_processes() -> None:
    row = S.row("emu-racks", "allreduce", 1 << 20, limit=300, memory_gib=8)
    assert len(row) == len(S.HEADERS)
    figures = dict(zip(S.HEADERS, row))
    assert figures["topology"] == "emu-racks" and figures["auto chose"] != "-"
    assert int(str(figures["operations"]).replace(",", "")) > 0
    share = float(str(figures["of bound"]).rstrip("%"))
    assert 0 < share <= 100 + 1e-9
    assert float(str(figures["x bound"])) == pytest.approx(100 / share, abs=0.01)
    assert str(figures["load (a rank)"]).endswith(" s") and str(figures["load RSS"]).endswith(" GiB")
    assert figures["form"] == "per-rank"  # 12 ranks: below the symmetric form's 64


def test_a_case_over_its_memory_cap_is_a_row_that_says_so() -> None:
    row = S.row("emu-racks", "allreduce", 1 << 20, limit=300, memory_gib=0.05)
    assert row[:3] == ("emu-racks", "allreduce", "1MiB")
    assert row[3] != "-" and all(cell == "-" for cell in row[4:]), row


def test_the_table_lists_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert S.main(["--topologies", "emu-uniform", "--collectives", "allgather,reducescatter", "--sizes", "64KiB",
                   "--limit", "300"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["topology", "collective", "size"]
    assert [line.split()[1] for line in table[2:]] == ["allgather", "reducescatter"]
