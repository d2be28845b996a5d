"""``topocc inspect`` in the terminal: structure per channel, busiest links, steps."""

from __future__ import annotations

from topocc.planner.report import terminal_summary
from topocc.planner.report._model import Message
from topocc.planner.report._run import link_step_bytes
from topocc.planner.report.text import describe_channel

from .conftest import Plan


def test_rings_are_listed_per_channel(dgx1_ring: Plan) -> None:
    p = dgx1_ring
    text = terminal_summary(p.topology, p.schedule, p.run, top=5)
    lines = text.splitlines()
    rings = [line for line in lines if "ring over 8 ranks: 0 -> " in line]
    assert len(rings) == 6
    for line in rings:
        order = [int(x) for x in line.split(": ", 2)[-1].split(" -> ")]
        assert order[0] == order[-1] == 0 and sorted(order[:-1]) == list(range(8))
    start = lines.index("busiest links (of 32 used):")
    assert len([line for line in lines[start + 3: start + 8] if "->" in line]) == 5
    step_rows = [line for line in lines if line.startswith("  ") and line.split()[0].isdigit()]
    assert len(step_rows) == len({s for _, _, s in link_step_bytes(p.run)})


def test_trees_are_recognised(dgx1_tree: Plan) -> None:
    p = dgx1_tree
    text = terminal_summary(p.topology, p.schedule, p.run)
    trees = [line for line in text.splitlines() if "tree over 8 ranks, root" in line]
    assert len(trees) == 2


def test_channel_shapes() -> None:
    def m(a: int, b: int, step: int = 0) -> Message:
        return Message(a, b, 0, 1, 1, step, step)

    assert describe_channel([m(0, 1), m(1, 2), m(2, 0)], 3) == "ring over 3 ranks: 0 -> 1 -> 2 -> 0"
    assert describe_channel([m(0, 1), m(0, 2), m(2, 3)], 4) == "tree over 4 ranks, root 0: 0->[1,2] 2->[3]"
    # reduce up then broadcast down: the parent is where a rank sends first
    up_down = [m(1, 0, 0), m(2, 0, 0), m(0, 1, 1), m(0, 2, 1)]
    assert describe_channel(up_down, 3) == "tree over 3 ranks, root 0: 0->[1,2]"
    assert describe_channel([m(0, 1), m(1, 0), m(0, 2), m(2, 0), m(1, 2)], 3).startswith("5 rank pairs: 0->1 0->2")
    many = [m(i, i + 1) for i in range(200)]
    assert "more)" in describe_channel(many, 201)
