"""The replay of encoded schedules: every rank ends bitwise equal, close to the exact result, with fewer bytes
sent; integers and min/max go exact.  Ranks are threads of this process (:mod:`tests.runtime.thread_transport`)
replaying plans the compression pass made for emu-racks (12 ranks, 3 racks)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tests.runtime.test_schedule_encoding import encoded_allreduce
from tests.runtime.thread_transport import run_ranks
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.compress import compress
from topocc.planner.compiler.options import Options
from topocc.planner.routing.network import Network, network_of
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.executor import Program
from topocc.runtime.schedule import Schedule

RANKS = 12


@cache
def _net(topology: str = "emu-racks") -> Network:
    return network_of(resolve_topology(topology))


@cache
def _plans(collective: str, algorithm: str, policy: str, topology: str = "emu-racks") -> tuple[Schedule, Schedule]:
    """The exact plan and its compressed twin, tuned for 1 MiB."""
    exact = compile_schedule(_net(topology), collective, algorithm, Options(size_bytes=1 << 20))
    return exact.schedule, compress(_net(topology), exact, policy).compiled.schedule


def _inputs(collective: str, n: int, dtype: type = np.float32, ranks: int = RANKS) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-1000, 1000, n).astype(dtype) for _ in range(ranks)]
    return [rng.standard_normal(n).astype(dtype) for _ in range(ranks)]


def _same_everywhere(results: list[np.ndarray]) -> bool:
    return all(r.tobytes() == results[0].tobytes() for r in results)


@pytest.mark.parametrize(("algorithm", "policy", "topology"), [
    ("ring", "bf16@inter-rack", "emu-racks"), ("ring", "int8@inter-rack", "emu-racks"),
    ("hierarchical", "topk:1%@inter-rack", "emu-racks"), ("hierarchical", "int8@inter-host", "emu-racks"),
    ("halving-doubling", "bf16@inter-rack", "emu-racks"), ("tree", "int8@inter-rack", "emu-racks"),
    ("multitree", "fp16@inter-rack", "emu-racks"), ("treepack", "bf16@slow", "emu-racks"),
    ("direct", "bf16@inter-rack", "emu-racks"), ("bucket", "bf16@inter-host", "torus-4x4"),
    ("mcf", "int8@host-switch", "emu-uniform"),
])
def test_allreduce_ends_bitwise_equal_on_every_rank(algorithm: str, policy: str, topology: str) -> None:
    exact_plan, plan = _plans("allreduce", algorithm, policy, topology)
    inputs = _inputs("allreduce", 3 * 1001 + 7, ranks=plan.ranks)  # chunks of unequal sizes
    exact, exact_bytes = run_ranks(exact_plan, [x.copy() for x in inputs])
    got, sent = run_ranks(plan, [x.copy() for x in inputs])
    assert _same_everywhere(got)
    truth = np.sum(np.array(inputs, np.float64), axis=0)
    error = np.linalg.norm(got[0] - truth) / np.linalg.norm(truth)
    assert error < {"bf16": 0.01, "fp16": 0.002, "int8": 0.05, "topk": 1.0}[policy.split("@")[0].split(":")[0]]
    assert error > np.linalg.norm(exact[0] - truth) / np.linalg.norm(truth)  # it did travel encoded
    assert sent < exact_bytes


@pytest.mark.parametrize(("collective", "algorithm", "policy"), [
    ("allgather", "ring", "bf16@inter-rack"), ("allgather", "hierarchical", "int8@inter-rack"),
    ("broadcast", "hierarchical", "bf16@inter-rack"), ("reducescatter", "ring", "int8@inter-rack"),
    # out of place, the input cannot be rounded: the copy of it in the output is, and the sends read that
    ("broadcast", "ring", "int8@inter-rack"), ("broadcast", "tree", "bf16@inter-rack"),
    ("allgather", "direct", "bf16@inter-rack"), ("allgather", "multitree", "int8@inter-rack"),
])
def test_other_collectives(collective: str, algorithm: str, policy: str) -> None:
    _, plan = _plans(collective, algorithm, policy)
    n = 1001
    inputs = _inputs(collective, n * RANKS if collective == "reducescatter" else n)
    call = {"allgather": "allgather", "broadcast": "broadcast", "reducescatter": "reduce_scatter"}[collective]
    got, _ = run_ranks(plan, inputs, call)
    if collective == "reducescatter":  # each rank its own block: nothing to agree on, only to be close
        truth = np.sum(np.array(inputs, np.float64), axis=0).reshape(RANKS, n)
        assert all(np.linalg.norm(got[r] - truth[r]) / np.linalg.norm(truth[r]) < 0.05 for r in range(RANKS))
        return
    assert _same_everywhere(got)
    truth = np.concatenate(inputs) if collective == "allgather" else inputs[0]
    assert np.linalg.norm(got[0] - truth) / np.linalg.norm(truth) < 0.05


def test_integers_and_min_max_go_exact() -> None:
    _, plan = _plans("allreduce", "ring", "int8@inter-rack")
    ints = _inputs("allreduce", 2003, np.int32)
    got, _ = run_ranks(plan, [x.copy() for x in ints])
    assert all(np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32)) for r in got)
    floats = _inputs("allreduce", 2003)
    got, _ = run_ranks(plan, [x.copy() for x in floats], op="max")
    assert all(np.array_equal(r, np.max(floats, axis=0)) for r in got)


def test_a_program_encodes_only_what_its_dtype_lets_it() -> None:
    s = encoded_allreduce("bf16")
    assert set(Program(s, 0, np.dtype("float32"), 10, tag_ub=100, channels=1, encode=True).codecs) == {1, 2, 3, 4, 5}
    for dtype, encode in (("float16", True), ("int64", True), ("float32", False)):
        assert not Program(s, 0, np.dtype(dtype), 10, tag_ub=100, channels=1, encode=encode).codecs
    wire = Program(s, 0, np.dtype("float64"), 10, tag_ub=100, channels=1, encode=True).wire
    assert {k: w.nbytes for k, w in wire.items()} == dict.fromkeys((1, 2, 3, 4, 5), 10)  # 5 elements, 2 bytes each


@pytest.mark.parametrize(("collective", "algorithm"), [
    ("allgather", "hierarchical"), ("broadcast", "ring"), ("reducescatter", "ring"), ("allreduce", "hierarchical"),
])
def test_an_exact_call_replays_an_encoded_plan_exact(collective: str, algorithm: str) -> None:
    """``exact=True`` (what the ``topocc`` backend passes for all but gradients) sends every byte of an encoded
    plan exact: the exact plan's result, bit for bit, and its bytes on the wire."""
    exact_plan, plan = _plans(collective, algorithm, "int8@inter-rack")
    n = 1001
    inputs = _inputs(collective, n * RANKS if collective == "reducescatter" else n)
    call = {"reducescatter": "reduce_scatter"}.get(collective, collective)
    want, want_bytes = run_ranks(exact_plan, [x.copy() for x in inputs], call)
    got, sent = run_ranks(plan, [x.copy() for x in inputs], call, exact=True)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want)) and sent == want_bytes
    encoded, fewer = run_ranks(plan, [x.copy() for x in inputs], call)
    assert fewer < sent and any(e.tobytes() != w.tobytes() for e, w in zip(encoded, want))
