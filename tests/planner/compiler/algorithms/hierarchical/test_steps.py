"""The steps of one level's reduce-scatter and all-gather, per method."""

from __future__ import annotations

import pytest

from topocc.planner.compiler.algorithms.hierarchical.steps import METHODS, level_steps


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


@pytest.mark.parametrize("by_class", [False, True])
@pytest.mark.parametrize("method", ["ring", "halving-doubling", "direct"])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_phase_steps_reduce_and_gather(method: str, n: int, by_class: bool) -> None:
    rs = level_steps(method, n, False, by_class)
    assert _owners_after(rs, n) == [set(range(n))] * n
    assert len(rs) == {"ring": n - 1, "halving-doubling": n.bit_length() - 1, "direct": 1}[method]
    # the all-gather starts from each member's own part and ends with every part everywhere
    have = [{i} for i in range(n)]
    for step in level_steps(method, n, True, by_class):
        sent = [(k, set(range(a, e))) for i, k, a, e in step if set(range(a, e)) <= have[i]]
        assert len(sent) == len(step), "a member sends a part it does not hold yet"
        for k, parts in sent:
            have[k] |= parts
    assert have == [set(range(n))] * n


@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_a_direct_level_built_by_class_walks_its_peers_by_their_digits(n: int, gather: bool) -> None:
    """Built by class, a direct level of a power-of-two size is the same step, each member's k-th send and
    k-th receive with the member whose binary digits are its own with k's flipped (affine in its digits); the
    other levels are as ever."""
    (step,) = level_steps("direct", n, gather, True)
    assert sorted(step) == sorted(METHODS["direct"](n, gather)[0])
    for i in range(n):
        assert [k for s, k, _, _ in step if s == i] == [i ^ k for k in range(1, n)]
        assert [s for s, k, _, _ in step if k == i] == [i ^ k for k in range(1, n)]
    assert level_steps("direct", 6, gather, True) == METHODS["direct"](6, gather)
    assert level_steps("ring", n, gather, True) == METHODS["ring"](n, gather)
