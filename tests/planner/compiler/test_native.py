"""gloo's algorithms as schedules: each proved to compute its collective, with the shape gloo gives it."""

from __future__ import annotations

import pytest

from tests.runtime.training.launch import TOPOLOGY
from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.native import NATIVE_ALGORITHM, native_schedule
from topocc.planner.errors import TopoccError
from topocc.planner.routing.network import Network
from topocc.planner.topology.parse import parse_topology_text

COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall")


def network(hosts: int, gpus: int) -> Network:
    return Network(parse_topology_text(TOPOLOGY.format(hosts=hosts, gpus=gpus), f"t{hosts}x{gpus}"))


@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (3, 1), (2, 2), (5, 1)])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_native_schedule_computes_its_collective(shape: tuple[int, int], collective: str) -> None:
    net = network(*shape)
    p = net.topology.size
    roots = range(p) if collective in ("broadcast", "reduce") else [0]
    for root in roots:
        for size in (4 << 10, 8 << 20):  # one piece per block, and pipelined pieces
            schedule = native_schedule(net, collective, size, root)
            verify(schedule)
            assert schedule.ranks == p and schedule.collective == collective


def test_the_ring_runs_in_rank_order_and_pipelines_large_blocks() -> None:
    net = network(2, 2)
    small, large = (native_schedule(net, "allreduce", size) for size in (4 << 10, 64 << 20))
    assert small.metadata.algorithm == NATIVE_ALGORITHM and small.metadata.options["pipeline"] == 1
    assert large.metadata.options["pipeline"] == 16  # 16 MiB blocks in 1 MiB pieces
    # every rank sends to the next in rank order and to no other (the ring 0 -> 1 -> 2 -> 3 -> 0)
    for r, program in enumerate(small.programs):
        assert {op.peer for op in program if op.kind == "send"} == {(r + 1) % 4}
    # 2 (p - 1) steps of one block each: reduce-scatter, then all-gather
    assert sum(op.kind == "send" for op in small.programs[0]) == 2 * 3


def test_reduce_scatter_costs_what_the_all_reduce_of_its_input_does() -> None:
    """PyTorch's gloo backend all-reduces the input and keeps the rank's block: the same messages."""
    net = network(2, 2)
    sends = {c: sum(op.kind == "send" for prog in native_schedule(net, c, 1 << 20).programs for op in prog)
             for c in ("allreduce", "reducescatter", "allgather")}
    assert sends["reducescatter"] == sends["allreduce"] == 2 * sends["allgather"]


def test_broadcast_is_a_binomial_tree_from_the_root() -> None:
    schedule = native_schedule(network(5, 1), "broadcast", 1 << 20, root=3)
    sends = sorted((r, op.peer, op.step) for r, prog in enumerate(schedule.programs) for op in prog
                   if op.kind == "send")
    # ranks renumbered from the root (3 -> 0, 4 -> 1, 0 -> 2, 1 -> 3, 2 -> 4): round k doubles who has it
    assert sends == [(3, 0, 1), (3, 2, 2), (3, 4, 0), (4, 1, 1)]


def test_an_unknown_collective_is_refused() -> None:
    with pytest.raises(TopoccError, match="unknown collective 'allsum'"):
        native_schedule(network(2, 1), "allsum", 1024)
