"""The link-load accumulator: sums in the order given, the busiest link's time, and loads after a candidate."""

from __future__ import annotations

import random

import pytest

from topocc.planner.routing.load import LinkLoad


def test_amounts_sum_per_link_in_the_order_added() -> None:
    load: LinkLoad[str] = LinkLoad()
    load.add("a", 1.0)
    load.add_along(["a", "b"], 2.0)
    load.add_shares({"b": 0.5, "c": 0.25}, 4.0)
    assert load.amounts == {"a": 3.0, "b": 4.0, "c": 1.0}
    assert load.get("a") == 3.0 and load.get("never") == 0.0


def test_sums_are_bitwise_those_of_a_plain_loop() -> None:
    """Every amount is one ``+`` of ``share * amount``: the bounds and greedy choices built on it keep their
    floating-point results (and so the schedules chosen from them) exactly."""
    rng = random.Random(7)
    load: LinkLoad[int] = LinkLoad()
    plain: dict[int, float] = {}
    for _ in range(2000):
        shares = {rng.randrange(20): rng.choice((1.0, 1 / 3, 0.5, 1 / 7)) for _ in range(rng.randrange(1, 4))}
        amount = rng.random() * 1e6
        load.add_shares(shares, amount)
        for link, share in shares.items():
            plain[link] = plain.get(link, 0.0) + share * amount
    assert load.amounts == plain  # exact equality, not approximate


def test_busiest_is_the_largest_time_over_bandwidth() -> None:
    load: LinkLoad[str] = LinkLoad({"fast": 100.0, "slow": 30.0})
    bandwidth = {"fast": 50.0, "slow": 10.0}
    assert load.busiest(bandwidth.__getitem__) == pytest.approx(3.0)  # the slow link binds, not the fuller one
    assert load.busiest() == 100.0  # no bandwidth: the amounts themselves
    assert LinkLoad[str]().busiest(bandwidth.__getitem__) == 0.0


def test_times_after_a_candidate_leave_the_load_alone() -> None:
    load: LinkLoad[str] = LinkLoad({"x": 2.0})
    bandwidth = {"x": 2.0, "y": 4.0}
    assert load.times_after({"x": 1.0, "y": 0.5}, 2.0, bandwidth.__getitem__) == [2.0, 0.25]
    assert load.amounts == {"x": 2.0}


def test_a_copy_is_independent() -> None:
    load: LinkLoad[str] = LinkLoad({"x": 1.0})
    other = load.copy()
    other.add("x", 1.0)
    assert load.get("x") == 1.0 and other.get("x") == 2.0
