"""docs/describe-a-cluster.md stays true: every YAML block loads without a warning and compiles an all-reduce,
and the ``topo show`` it quotes is what topocc prints for its first block."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO
from topocc.planner.cli import main
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.errors import TopoccWarning
from topocc.planner.topology.parse import parse_topology_text

PAGE = REPO / "docs" / "describe-a-cluster.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def blocks(lang: str) -> list[tuple[int, str]]:
    """The page's fenced blocks of ``lang``: (line of the block's first line, text)."""
    text = PAGE.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == lang]


def test_the_page_shows_each_kind_of_cluster() -> None:
    names = [re.search(r"^name: (\S+)", text, re.M).group(1) for _, text in blocks("yaml")]  # type: ignore[union-attr]
    assert names == ["lab-6x4", "h100-rails", "pcie-servers", "two-racks-double-uplinks"]


@pytest.mark.parametrize(("line", "text"), blocks("yaml"), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_every_yaml_block_loads_quietly_and_compiles_an_allreduce(line: int, text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", TopoccWarning)
        topology = parse_topology_text(text, f"{PAGE.name}:{line}")
    compiled = compile_schedule(topology, "allreduce", "auto", Options(size_bytes=1 << 20))  # verified, or raises
    assert compiled.proof.operations > 0 and compiled.sim.time_s > 0 and compiled.schedule.ranks == topology.size


def test_the_topo_show_it_quotes_is_what_topocc_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (_, quoted), = blocks("text")
    (_, first), *_ = blocks("yaml")
    path = tmp_path / "lab-6x4.yaml"
    path.write_text(first)
    assert main(["topo", "show", str(path)]) == 0
    printed = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    shown = [" ".join(line.split()) for line in quoted.splitlines()[1:] if line.strip() != "..."]
    assert shown and all(line in printed for line in shown), "\n".join(set(shown) - set(printed))
