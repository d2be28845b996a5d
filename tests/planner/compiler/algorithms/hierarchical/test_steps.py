"""The steps of one level's reduce-scatter and all-gather, per method."""

from __future__ import annotations

import pytest

from topocc.planner.compiler.algorithms.hierarchical.steps import METHODS


def _owners_after(steps: list[list[tuple[int, int, int, int]]], n: int) -> list[set[int]]:
    """Run reduce-scatter steps on sets of contributions: which members each member's own part holds."""
    holds = [[{i} for _ in range(n)] for i in range(n)]  # holds[member][part] = contributions
    for step in steps:
        sent = [(k, a, e, [set(holds[i][x]) for x in range(a, e)]) for i, k, a, e in step]
        for k, a, e, values in sent:
            for x, value in zip(range(a, e), values):
                assert not holds[k][x] & value, "a contribution would be counted twice"
                holds[k][x] |= value
    return [holds[i][i] for i in range(n)]


@pytest.mark.parametrize("method", ["ring", "halving-doubling", "direct"])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_phase_steps_reduce_and_gather(method: str, n: int) -> None:
    rs = METHODS[method](n, False)
    assert _owners_after(rs, n) == [set(range(n))] * n
    assert len(rs) == {"ring": n - 1, "halving-doubling": n.bit_length() - 1, "direct": 1}[method]
    # the all-gather starts from each member's own part and ends with every part everywhere
    have = [{i} for i in range(n)]
    for step in METHODS[method](n, True):
        sent = [(k, set(range(a, e))) for i, k, a, e in step if set(range(a, e)) <= have[i]]
        assert len(sent) == len(step), "a member sends a part it does not hold yet"
        for k, parts in sent:
            have[k] |= parts
    assert have == [set(range(n))] * n
