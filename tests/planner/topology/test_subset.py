"""A process group's topology (``Topology.subset``), and the rank lists that name groups (``0-3,8``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topocc.planner.errors import UsageError
from topocc.planner.topology.catalogue import resolve_topology, split_ranks
from topocc.planner.topology.model import parse_rank_ranges
from topocc.runtime.bundle import rank_ranges

CLUSTER = resolve_topology("dgx-a100-4node")  # 32 ranks on 4 hosts


@st.composite
def groups(draw: st.DrawFn, size: int = CLUSTER.size) -> list[int]:
    """Distinct ranks of a ``size``-rank topology in any order, often runs of consecutive ranks."""
    if draw(st.booleans()):
        start = draw(st.integers(0, size - 1))
        return list(range(start, draw(st.integers(start + 1, size))))
    return draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size, unique=True))


@settings(max_examples=100, deadline=None)
@given(groups())
def test_a_subset_keeps_the_fabric_and_the_given_ranks_in_order(ranks: list[int]) -> None:
    sub = CLUSTER.subset(ranks)
    assert sub.ranks == tuple(CLUSTER.ranks[r] for r in ranks) and sub.size == len(ranks)
    assert (sub.devices, sub.links, sub.routing) == (CLUSTER.devices, CLUSTER.links, CLUSTER.routing)
    assert all(sub.rank_device(i) == CLUSTER.rank_device(r) for i, r in enumerate(ranks))
    whole = ranks == list(range(CLUSTER.size))
    assert (sub.fingerprint == CLUSTER.fingerprint) == whole
    assert sub.name == (CLUSTER.name if whole else f"{CLUSTER.name}[{rank_ranges(ranks)}]")
    assert sub.with_routing("spray").ranks == sub.ranks


@settings(max_examples=100, deadline=None)
@given(groups(), groups())
def test_different_groups_have_different_fingerprints(a: list[int], b: list[int]) -> None:
    assert (CLUSTER.subset(a).fingerprint == CLUSTER.subset(b).fingerprint) == (a == b)


@settings(max_examples=150, deadline=None)
@given(groups(size=64))
def test_rank_ranges_read_back(ranks: list[int]) -> None:
    text = rank_ranges(ranks)
    assert parse_rank_ranges(text) == tuple(ranks)
    assert parse_rank_ranges(text.replace(",", ", ")) == tuple(ranks)


def test_rank_ranges_examples() -> None:
    assert rank_ranges([0, 1, 2, 3, 8]) == "0-3,8"
    assert rank_ranges([8, 9, 10, 11, 20]) == "8-11,20" and rank_ranges([3, 1]) == "3,1"
    assert parse_rank_ranges("0-3") == parse_rank_ranges("0,1,2,3") == (0, 1, 2, 3)
    assert parse_rank_ranges("8-11,20") == (8, 9, 10, 11, 20) and parse_rank_ranges("5") == (5,)


@pytest.mark.parametrize("text, says", [("", "cannot read ranks ''"), ("0-", "cannot read ranks"),
                                        ("a,b", "cannot read ranks"), ("1,,2", "cannot read ranks"),
                                        ("-1", "cannot read ranks"), ("3-1", "rank range '3-1' runs backwards")])
def test_bad_rank_text(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says) as info:
        parse_rank_ranges(text)
    assert info.value.fix and "\n" not in info.value.one_line()


@pytest.mark.parametrize("ranks, says", [([], "needs at least one rank"), ([1, 2, 1], "rank 1 is listed twice"),
                                         ([0, 32], r"rank 32 is not a rank of dgx-a100-4node \(0-31\)"),
                                         ([-1], "rank -1 is not a rank"), ([True], "rank True is not a rank")])
def test_bad_subsets(ranks: list[int], says: str) -> None:
    with pytest.raises(UsageError, match=says) as info:
        CLUSTER.subset(ranks)
    assert info.value.fix and "\n" not in info.value.one_line()


def test_a_subset_resolves_by_name_and_by_file() -> None:
    """A group plan records ``emu-racks[0-3]`` and its file with the ranks: both load the group's topology."""
    whole = resolve_topology("emu-racks")
    sub = whole.subset([4, 5, 6, 7])
    assert sub.source is not None and sub.source.endswith("emu-racks.yaml[4-7]")
    for name in ("emu-racks[4-7]", "emu-racks[4,5,6,7]", sub.source):
        loaded = resolve_topology(name)
        assert (loaded.name, loaded.ranks, loaded.fingerprint) == (sub.name, sub.ranks, sub.fingerprint)
    assert resolve_topology("emu-racks[4-7][1,0]").ranks == whole.subset([5, 4]).ranks
    with pytest.raises(UsageError, match="rank 12 is not a rank of emu-racks"):
        resolve_topology("emu-racks[0,12]")


def test_split_ranks_parts_a_topology_argument_from_its_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``topocc calibrate`` reads a topology argument as: the file and the ranks, unless the whole argument
    is a file's name."""
    assert split_ranks("cluster.yaml[0-1,4-5]") == ("cluster.yaml", (0, 1, 4, 5))
    assert split_ranks("emu-racks") == ("emu-racks", None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "odd[1].yaml").write_text("")
    assert split_ranks("odd[1].yaml") == ("odd[1].yaml", None)
    (tmp_path / "odd[2]").write_text("")
    assert split_ranks("odd[2]") == ("odd[2]", None)
