"""The Prophet block planner: coverage, priority order, the time model, baselines and profile files."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from topocc.planner.gradblocks.block_plan import (
    DDP_BUCKET_BYTES,
    block_plan_to_dict,
    ddp_blocks,
    format_block_plan,
    plan_blocks,
    prophet_blocks,
    simulate_blocks,
)
from topocc.planner.gradblocks.cost import LinearCost, fit_cost, plan_cost
from topocc.planner.gradblocks.profile_file import ProfileError, load_profile, parse_profile, profile_to_dict
from topocc.runtime.training import ParamProfile, Profile, load_block_plan

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "profile_example.yaml"
TEN_GBE = LinearCost(20e-6, 1.25e9)


def random_profile(seed: int) -> Profile:
    """A model of 2-8 layers with 1-3 parameters each, gradients ready in reverse layer order."""
    rng = random.Random(seed)
    layers = rng.randint(2, 8)
    params = []
    t = 0.0
    plan = [(layer, rng.randint(1, 3)) for layer in range(layers)]
    entries: list[tuple[int, int]] = []
    for layer, count in plan:
        entries += [(layer, rng.choice([4, 4096, 1 << 16, 1 << 20, 6 << 20]) + 4 * rng.randint(0, 99))
                    for _ in range(count)]
    ready = {}
    for idx in reversed(range(len(entries))):
        t += rng.uniform(1e-4, 2e-3)
        ready[idx] = t
    for idx, (layer, nbytes) in enumerate(entries):
        params.append(ParamProfile(f"p{idx}", layer, nbytes, ready[idx]))
    fwd = tuple(rng.uniform(1e-4, 3e-3) for _ in range(layers))
    return Profile(tuple(params), tuple(f"l{k}" for k in range(layers)), fwd, t + 1e-4, name=f"random{seed}")


def assert_covers(profile: Profile, blocks: Sequence[Sequence[tuple[int, int, int]]]) -> None:
    """Every parameter's bytes appear exactly once, as contiguous non-overlapping pieces."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for block in blocks:
        for p, lo, hi in block:
            assert hi > lo
            spans.setdefault(p, []).append((lo, hi))
    assert sorted(spans) == list(range(len(profile.params)))
    for p, got in spans.items():
        got.sort()
        assert got[0][0] == 0 and got[-1][1] == profile.params[p].nbytes
        for (_, a), (b, _) in itertools.pairwise(got):
            assert a == b, f"parameter {p}: gap or overlap at {a}/{b}"


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("cost", [TEN_GBE, LinearCost(5e-3, 1e9), LinearCost(1e-6, 100e9)])
def test_plan_covers_every_parameter_once_and_beats_both_baselines(seed: int, cost: LinearCost) -> None:
    profile = random_profile(seed)
    plan = plan_blocks(profile, cost)
    assert_covers(profile, [b.pieces for b in plan.blocks])
    assert plan.predicted_time_s <= plan.ddp_time_s + 1e-12
    assert plan.predicted_time_s <= plan.bytescheduler_time_s + 1e-12
    starts = [b.start_s for b in plan.blocks]
    assert starts == sorted(starts)
    for b in plan.blocks:  # a block never starts before its gradients exist, nor overlaps the previous one
        assert b.start_s >= b.ready_s - 1e-15
    for a, b in zip(plan.blocks, plan.blocks[1:]):
        assert b.start_s >= a.end_s - 1e-15


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("cap", [256 << 10, 1 << 20])
def test_prophet_sends_the_highest_priority_ready_gradients_first(seed: int, cap: int) -> None:
    """When a block starts, every piece still waiting that was already ready has lower priority."""
    profile = random_profile(seed)
    timeline = prophet_blocks(profile, TEN_GBE, cap)
    assert_covers(profile, [b.pieces for b in timeline.blocks])
    for j, block in enumerate(timeline.blocks):
        assert block.nbytes <= cap or len(block.pieces) == 1
        last = max((p, lo) for p, lo, _ in block.pieces)
        for later in timeline.blocks[j + 1:]:
            for p, lo, _ in later.pieces:
                if profile.params[p].ready_time_s <= block.start_s:
                    assert (p, lo) > last, f"piece {(p, lo)} was ready but waited behind block {j}"


def test_large_low_priority_gradient_is_split_into_chunks() -> None:
    """Preemption: a big late-layer gradient ready early must not hold the network when layer 0 arrives."""
    profile = Profile(
        (ParamProfile("w0", 0, 1 << 20, 0.010), ParamProfile("w1", 1, 64 << 20, 0.001)),
        ("l0", "l1"), (0.001, 0.001), 0.0101)
    plan = plan_blocks(profile, TEN_GBE)
    pieces_of_1 = [pc for b in plan.blocks for pc in b.pieces if pc[0] == 1]
    assert len(pieces_of_1) > 1
    w0 = next(b for b in plan.blocks if any(p == 0 for p, _, _ in b.pieces))
    assert w0.start_s - profile.params[0].ready_time_s < TEN_GBE(plan.chunk_bytes or 0) + 1e-12
    assert plan.predicted_time_s < plan.ddp_time_s


def test_example_profile_benefits_and_table_names_the_baselines() -> None:
    profile = load_profile(EXAMPLE)
    plan = plan_blocks(profile, TEN_GBE)
    assert plan.predicted_time_s < 0.9 * plan.ddp_time_s
    text = format_block_plan(plan, profile)
    assert "DDP default" in text and "per-tensor priority" in text and "Prophet" in text
    assert f"{plan.predicted_time_s * 1e3:.3f}" in text


def test_time_model_by_hand() -> None:
    """Two layers, cost 1 ms + 1 ms/MB: the numbers below are worked out on paper."""
    profile = Profile((ParamProfile("a", 0, 1_000_000, 0.004), ParamProfile("b", 1, 1_000_000, 0.001)),
                      ("l0", "l1"), (0.002, 0.003), 0.005)
    cost = LinearCost(1e-3, 1e9)
    # per tensor, layer-gated: b 1-3 ms, a 4-6 ms; layer 0 runs 6-8, layer 1 8-11
    per_tensor = simulate_blocks(profile, cost, [[(0, 0, 1_000_000)], [(1, 0, 1_000_000)]])
    assert [t for b in per_tensor.blocks for t in (b.start_s, b.end_s)] == pytest.approx([0.001, 0.003, 0.004, 0.006])
    assert per_tensor.iteration_s == pytest.approx(0.011)
    # DDP: one bucket (both) ready at 4 ms, 4-7 ms; forward after everything: 7 + 5 = 12 ms
    ddp = simulate_blocks(profile, cost, ddp_blocks(profile), policy="fifo", gating="global")
    assert len(ddp.blocks) == 1 and ddp.iteration_s == pytest.approx(0.012)
    plan = plan_blocks(profile, cost)
    assert plan.ddp_time_s == pytest.approx(0.012)
    assert plan.predicted_time_s == pytest.approx(0.011)


def test_ddp_buckets_fill_in_reverse_order_up_to_the_cap() -> None:
    profile = Profile(tuple(ParamProfile(f"p{i}", i, 10 << 20, 0.01 - i * 1e-3) for i in range(5)),
                      tuple(f"l{i}" for i in range(5)), (0.001,) * 5, 0.011)
    buckets = ddp_blocks(profile, DDP_BUCKET_BYTES)
    assert [[p for p, _, _ in b] for b in buckets] == [[4, 3], [2, 1], [0]]


def test_fit_cost_recovers_alpha_and_bandwidth() -> None:
    truth = LinearCost(30e-6, 2e9)
    fitted = fit_cost([(n, truth(n)) for n in (1 << 10, 1 << 16, 1 << 20, 1 << 24)])
    assert fitted.alpha_s == pytest.approx(30e-6, rel=1e-6)
    assert fitted.bytes_per_s == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(Exception, match="two distinct sizes"):
        fit_cost([(10, 1.0)])


def test_plan_cost_from_a_compiled_plan() -> None:
    from topocc.planner.compiler.size_buckets import compile_plan
    from topocc.planner.topology.parse import load_topology

    plan, _ = compile_plan(load_topology(REPO / "examples" / "two_hosts_2x2.yaml"), "allreduce", 1 << 12, 1 << 22)
    cost = plan_cost(plan, load_topology(REPO / "examples" / "two_hosts_2x2.yaml"), [1 << 12, 1 << 16, 1 << 20])
    assert cost.alpha_s > 0
    assert 0.1e9 < cost.bytes_per_s < 10e9  # 10 Gbit/s between hosts bounds the allreduce's bandwidth


def test_bucket_plan_round_trips_to_the_runtime(tmp_path: Path) -> None:
    import json

    profile = load_profile(EXAMPLE)
    plan = plan_blocks(profile, TEN_GBE)
    path = tmp_path / "blocks.json"
    path.write_text(json.dumps(block_plan_to_dict(plan, profile)))
    assert load_block_plan(path) == [list(b.pieces) for b in plan.blocks]


def test_profile_round_trips() -> None:
    profile = load_profile(EXAMPLE)
    assert parse_profile(profile_to_dict(profile)) == profile
    assert profile.params[0].nbytes == 8 << 20 and profile.layers[0] == "embed"


GOOD = EXAMPLE.read_text()


@pytest.mark.parametrize(("text", "message"), [
    (GOOD.replace("layer: fc1, bytes: 4 MiB", "layer: fc9, bytes: 4 MiB"), "unknown layer 'fc9'"),
    (GOOD.replace("bytes: 2 MiB", "bytes: -2"), "bytes"),
    (GOOD.replace("bytes: 1 KiB", "bytes: 3"), "multiple of the 4-byte item size"),
    (GOOD.replace("ready_time_s: 0.0020", "ready_time_s: soon"), "ready_time_s is not a time"),
    (GOOD.replace("ready_time_s: 0.0020", "ready_time_s: -1"), "must be a finite time >= 0"),
    (GOOD.replace("backward_time_s: 0.0110", "backward_time_s: 0.001"), "before the last gradient is ready"),
    (GOOD.replace("{name: head, forward_time_s: 0.0020}", "{name: head}"), "has no 'forward_time_s'"),
    (GOOD.replace("{name: head, forward_time_s: 0.0020}", "{name: head, forward_time_s: 0.002, gpu: 1}"),
     "unknown field 'gpu'"),
    (GOOD.replace("{name: fc2, forward_time_s: 0.0030}", "{name: fc1, forward_time_s: 0.0030}"), "duplicate layer"),
    ("layers: []\nparameters: []\n", "non-empty list"),
    ("layers: [\n", "invalid YAML"),
    ("- just a list\n", "must be a mapping"),
])
def test_bad_profiles_fail_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    line = str(err.value)
    assert message in line and "\n" not in line and str(path) in line


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(tmp_path / "nope.yaml")


def test_errors_point_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("bytes: 2 MiB", "bytes: lots"))
    line = next(i for i, t in enumerate(GOOD.splitlines(), 1) if "bytes: 2 MiB" in t)
    with pytest.raises(ProfileError, match=f"bad.yaml:{line}"):
        load_profile(path)
