"""Bundles: what to compile (from collectives and groups, or from a call record), and the compiled bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.runtime.training.launch import TOPOLOGY
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.bundling import (
    BundleRequest,
    CompiledPlan,
    compile_bundle,
    requests_for,
    requests_from_calls,
)
from topocc.planner.compiler.race import Progress
from topocc.planner.errors import UsageError
from topocc.planner.topology.catalogue import resolve_topology
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.bundle import Bundle, load_bundle, save_bundle
from topocc.runtime.calls import Call
from topocc.runtime.collective import collective

KIB = 1 << 10
TRAINING = ("allreduce", "reducescatter", "allgather", "broadcast")


def four_ranks() -> Topology:
    """2 hosts x 2 GPUs on one switch."""
    return parse_topology_text(TOPOLOGY.format(hosts=2, gpus=2), "t2x2")


@pytest.fixture(scope="module")
def compiled() -> tuple[Topology, Bundle, list[CompiledPlan]]:
    """Every training collective on the world and on two 2-rank groups (one out of order), root 1."""
    topology = four_ranks()
    requests = requests_for(4, TRAINING, KIB, 64 * KIB, groups=[(0, 1), (3, 1)], root=1)
    return (topology, *compile_bundle(topology, requests))


def check_bundle(topology: Topology, bundle: Bundle, plans: list[CompiledPlan]) -> None:
    """Every plan is proved, for its group's topology and root, and the bundle finds it by its key."""
    assert (bundle.world, bundle.topology, bundle.fingerprint) == (topology.size, topology.name, topology.fingerprint)
    assert [entry.plan for entry in bundle.plans] == [c.plan for c in plans]
    for c in plans:
        request, group = c.request, c.request.group
        assert c.plan.collective == request.collective and c.plan.ranks == len(group)
        assert len(c.buckets) == len(c.plan.schedules)
        for schedule in c.plan.schedules:
            verify(schedule)
            assert schedule.metadata.fingerprint == topology.subset(group).fingerprint
            assert schedule.root == request.root
        assert bundle.find(request.collective, group, request.root) is c.plan


def test_requests_for_the_world_and_groups() -> None:
    requests = requests_for(8, ["allreduce", "all-gather", "allgather", "reduce"], KIB, 4 * KIB,
                            groups=[(0, 1, 2, 3), tuple(range(8)), [7, 5]], root=1)
    assert [r.key() for r in requests] == [
        (c, g, 1 if c == "reduce" else None)
        for g in (tuple(range(8)), (0, 1, 2, 3), (7, 5)) for c in ("allreduce", "allgather", "reduce")]
    assert {(r.low, r.high) for r in requests} == {(KIB, 4 * KIB)}


def test_a_request_is_normalised_and_checked() -> None:
    listed = BundleRequest("reduce-scatter", [0, 1], 1, 2)  # type: ignore[arg-type]  # a list, made a tuple
    assert listed.key() == ("reducescatter", (0, 1), None)
    assert BundleRequest("broadcast", (2, 3), 1, 1) == BundleRequest("broadcast", (2, 3), 1, 1, root=0)
    cases: list[tuple[dict[str, Any], str]] = [({"collective": "gossip"}, "unknown collective 'gossip'"),
                                               ({"collective": "allreduce", "root": 1}, "allreduce has no root"),
                                               ({"root": 2}, "root 2 is not a rank of the 2-rank group 0-1"),
                                               ({"group": (3,)}, "moves no data"),
                                               ({"low": 0}, "starts below 1 byte"),
                                               ({"low": 9, "high": 8}, "the size range 9:8 is empty")]
    for kwargs, says in cases:
        args: dict[str, Any] = {"collective": "broadcast", "group": (0, 1), "low": 1, "high": 2} | kwargs
        with pytest.raises(UsageError, match=says) as info:
            BundleRequest(**args)
        assert "\n" not in info.value.one_line() and info.value.fix


def test_requests_from_calls_span_the_sizes_seen() -> None:
    calls = [
        Call("allreduce", (0, 1, 2, 3), 4096, "float32", "sum"),
        Call("allreduce", (0, 1, 2, 3), 1 << 20, "bfloat16", "sum"),
        Call("allreduce", (0, 1, 2, 3), 0, "float32", "sum"),
        Call("allgather", (2, 0), 512, "float32"),
        Call("broadcast", (0, 1, 2, 3), 64, "int64", root=2),
        Call("broadcast", (0, 1, 2, 3), 64, "int64", root=None),
        Call("reduce", (1, 3), 8, "float32", "max", root=1),
        Call("allreduce", (3,), 4096, "float32", "sum"),  # one rank: nothing to plan
    ]
    assert [(r.key(), r.low, r.high) for r in requests_from_calls(calls, 4)] == [
        (("allreduce", (0, 1, 2, 3), None), 1, 1 << 20),
        (("allgather", (2, 0), None), 512, 512),
        (("broadcast", (0, 1, 2, 3), 2), 64, 64),
        (("broadcast", (0, 1, 2, 3), 0), 64, 64),
        (("reduce", (1, 3), 1), 8, 8),
    ]
    assert requests_from_calls([], 4) == []


def test_a_call_on_a_rank_the_topology_lacks_names_the_fix() -> None:
    with pytest.raises(UsageError) as info:
        requests_from_calls([Call("allreduce", (0, 1), 8, "float32"), Call("allgather", (6, 7, 8, 9), 8, "float32")],
                            8)
    line = info.value.one_line()
    assert "allgather call on ranks 6-9 names rank 8, but the topology has 8 ranks" in line
    assert "compile the bundle for the topology the job ran on" in line and "\n" not in line


def test_compile_bundle_proves_every_plan(compiled: tuple[Topology, Bundle, list[CompiledPlan]]) -> None:
    topology, bundle, plans = compiled
    check_bundle(topology, bundle, plans)
    assert [(c.request.collective, c.request.group, c.request.root) for c in plans] == [
        (c, g, 1 if c == "broadcast" else None) for g in ((0, 1, 2, 3), (0, 1), (3, 1)) for c in TRAINING]
    assert bundle.find("allreduce", (1, 3)) is None and bundle.find("broadcast", (0, 1, 2, 3), 0) is None
    # the group's rank i is global rank group[i]: (3, 1)'s plan is for the GPUs of ranks 3 and 1, in that order
    meta = bundle.find("allreduce", (3, 1)).schedules[0].metadata  # type: ignore[union-attr]
    assert meta.topology == "t2x2[3,1]" and meta.fingerprint == topology.subset((3, 1)).fingerprint


def test_a_bundle_round_trips_through_its_folder(compiled: tuple[Topology, Bundle, list[CompiledPlan]],
                                                 tmp_path: Path) -> None:
    _, bundle, _ = compiled
    manifest = save_bundle(bundle, tmp_path / "bundle")
    loaded = load_bundle(tmp_path / "bundle")
    assert load_bundle(manifest).plans == loaded.plans
    assert [(e.key(), e.plan) for e in loaded.plans] == [(e.key(), e.plan) for e in bundle.plans]
    assert (loaded.world, loaded.topology, loaded.fingerprint) == (bundle.world, bundle.topology, bundle.fingerprint)
    for entry in bundle.plans:
        assert loaded.find(entry.collective, entry.group, entry.root) == entry.plan


def test_subsets_of_a_shipped_cluster() -> None:
    """Groups of emu-racks across hosts and racks, out of order, with a rooted collective."""
    topology = resolve_topology("emu-racks")
    requests = [BundleRequest("allreduce", (4, 5, 6, 7), KIB, 4 * KIB),
                BundleRequest("reduce", (8, 2, 5), KIB, KIB, root=2),
                BundleRequest("all-to-all", (0, 11), KIB, 16 * KIB)]
    events: list[Progress] = []
    bundle, plans = compile_bundle(topology, requests, progress=events.append)
    check_bundle(topology, bundle, plans)
    assert bundle.find("reduce", (8, 2, 5), 2).schedules[0].metadata.topology == "emu-racks[8,2,5]"  # type: ignore[union-attr]
    assert events and all(e.bucket.startswith("plan ") for e in events)
    assert any(e.bucket.startswith("plan 2/3 (reduce on 8,2,5 root 2) bucket 1/1") for e in events)


def test_compile_bundle_refuses_what_it_cannot_compile() -> None:
    topology = four_ranks()
    events: list[Progress] = []
    cases = [([], "nothing to compile"),
             ([BundleRequest("allreduce", (0, 1), 1, 1), BundleRequest("all-reduce", (0, 1), 2, 4)],
              "allreduce on ranks 0-1 is asked for twice"),
             ([BundleRequest("allreduce", (0, 1), 1, 1), BundleRequest("allgather", (2, 4), 1, 1)],
              r"rank 4 is not a rank of t2x2 \(0-3\)"),
             ([BundleRequest("allgather", (2, 1, 2), 1, 1)], "rank 2 is listed twice")]
    for requests, says in cases:
        with pytest.raises(UsageError, match=says):
            compile_bundle(topology, requests, progress=events.append)
    assert events == []  # refused before any plan was compiled


def test_a_compressed_bundle_encodes_its_slow_hops_and_leaves_the_rest_as_they_were(tmp_path: Path) -> None:
    """``compress``: the world's all-reduce crosses hosts and is encoded (format version 3); the group inside a
    host has no slow link, so the policy is refused there, or with ``exact_if_none`` its plan stays exact:
    the same bytes as without compression (plan hashes do not move)."""
    import json

    from topocc.planner.errors import NotApplicableError

    topology = four_ranks()
    requests = requests_for(4, ("allreduce",), 64 * KIB, 256 * KIB, groups=[(0, 1)])
    with pytest.raises(NotApplicableError, match=r"selects no message .* --compress-else exact") as info:
        compile_bundle(topology, requests, compress="bf16@slow")
    assert "plan 2/2 (allreduce on 0-1)" in info.value.one_line()
    bundle, plans = compile_bundle(topology, requests, compress="bf16@slow", exact_if_none=True)
    plain, _ = compile_bundle(topology, requests)
    check_bundle(topology, bundle, plans)
    world, group = plans
    assert all(r.encoded_messages > 0 for r in world.compression) and len(world.compression) == len(world.buckets)
    assert all(r.encoded_messages == 0 for r in group.compression)
    folder, exact = tmp_path / "compressed", tmp_path / "plain"
    save_bundle(bundle, folder)
    save_bundle(plain, exact)
    versions = {f.name: {b["version"] for b in json.loads(f.read_text())["buckets"]}
                for f in folder.iterdir() if f.name != "bundle.json"}
    assert versions == {"allreduce-world.json": {3}, "allreduce-ranks0-1.json": {1}}  # 3 only where encoded
    assert (folder / "allreduce-ranks0-1.json").read_bytes() == (exact / "allreduce-ranks0-1.json").read_bytes()
    world_plan = load_bundle(folder).find("allreduce", (0, 1, 2, 3))
    assert world_plan is not None and all(any(op.encoding for p in s.programs for op in p)
                                          for s in world_plan.schedules)


def test_a_compressed_bundle_encodes_gradients_only() -> None:
    """Only the collectives that reduce gradients (all-reduce, reduce-scatter) are encoded: the backend runs
    gathered and broadcast parameters exact, so their plans stay exact, byte for byte as without ``compress``."""
    topology = four_ranks()
    requests = requests_for(4, ("allreduce", "reducescatter", "allgather", "broadcast"), 64 * KIB, 64 * KIB)
    bundle, plans = compile_bundle(topology, requests, compress="bf16@slow")
    plain, _ = compile_bundle(topology, requests)
    check_bundle(topology, bundle, plans)
    encoded = {c.request.collective for c in plans if any(r.encoded_messages for r in c.compression)}
    assert encoded == {"allreduce", "reducescatter"}
    for compressed, exact in zip(bundle.plans, plain.plans):
        if not collective(compressed.plan.collective).carries_gradients:
            assert compressed.plan.schedules == exact.plan.schedules
