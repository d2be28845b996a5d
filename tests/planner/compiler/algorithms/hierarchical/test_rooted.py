"""Hierarchical broadcast and reduce: a scatter in the root's host, a chain per rail, a fan-out in every host."""

from __future__ import annotations

import functools

import pytest

from benchmarks.fabrics import fat_tree
from tests.conftest import peer_of
from tests.planner.compiler.algorithms.hierarchical.clusters import cluster
from tests.planner.compiler.algorithms.test_baselines import check_schedule
from topocc.planner.compiler.algorithms.hierarchical import hierarchical, rooted
from topocc.planner.compiler.algorithms.hierarchical.rooted import (
    CHAIN_HOSTS,
    MAX_TRANSFERS,
    SLOT_SLICES,
    _counting_tree,
    _routes,
    _slices,
)
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.errors import NotApplicableError
from topocc.planner.routing.network import Network
from topocc.planner.topology.model import Topology


@functools.cache
def leaves() -> Topology:
    """Six DGX-like hosts, three a leaf, 3:1 to the spines (fattree-48-3to1)."""
    return fat_tree(6, 3, 2, 3).topology()


def host_of(topology: Topology) -> dict[int, int]:
    return {r: h for h, ranks in enumerate(topology.hosts.values()) for r in ranks}


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
@pytest.mark.parametrize("root", [0, 13, 47])
def test_every_root_verifies_and_crosses_hosts_on_rails(collective: str, root: int) -> None:
    """From (to) any root the schedule verifies, and every message between hosts joins GPUs of one local index,
    each host entered once per rail and slice: the NICs carry N / k each way."""
    topology = leaves()
    net = Network(topology)
    schedule = hierarchical(net, collective, Options(size_bytes=16 << 20, root=root))
    check_schedule(topology, schedule, collective, "hierarchical")
    host = host_of(topology)
    local = {r: ranks.index(r) for ranks in topology.hosts.values() for r in ranks}
    crossing = [(r, peer_of(op)) for r, program in enumerate(schedule.programs) for op in program
                if op.kind == "send" and host[r] != host[peer_of(op)]]
    assert all(local[a] == local[b] for a, b in crossing)
    slices = schedule.metadata.options["pipeline"]
    assert len(crossing) == slices * 8 * (6 - 1)


def test_the_root_sends_its_buffer_once() -> None:
    """The root's piece goes to its host in parts, so the root's link to its switch carries N, not N plus
    (k - 1) / k N; and its NIC N / k, its rail's piece."""
    topology = leaves()
    net = Network(topology)
    schedule = hierarchical(net, "broadcast", Options(size_bytes=64 << 20, root=5))
    host = host_of(topology)
    sends = [op for op in schedule.programs[5] if op.kind == "send"]
    assert sum(op.count for op in sends if host[peer_of(op)] == host[5]) == schedule.output_chunks
    assert sum(op.count for op in sends if host[peer_of(op)] != host[5]) == schedule.output_chunks // 8


def test_the_chain_crosses_each_rack_boundary_once() -> None:
    """Hosts in rack order from the root's: a rail's chain leaves the root's leaf once."""
    topology = leaves()
    net = Network(topology)
    schedule = hierarchical(net, "broadcast", Options(size_bytes=1 << 20, root=40, pipeline=1))
    rack_of = {r: name for name, ranks in topology.racks.items() for r in ranks}
    host = host_of(topology)
    for rail in range(8):
        chain = [(r, peer_of(op)) for r, program in enumerate(schedule.programs) for op in program
                 if op.kind == "send" and host[r] != host[peer_of(op)] and op.channel == 1 and r % 8 == rail]
        leaving = [(a, b) for a, b in chain if rack_of[a] != rack_of[b]]
        assert len(leaving) == 1
        assert rack_of[leaving[0][0]] == rack_of[40]


def test_reduce_scratch_does_not_grow_with_slices() -> None:
    """A reduce's slots are reused every few slices: its scratch is the same at 8 and 64 slices."""
    topology = cluster([4, 4, 4])
    net = Network(topology)
    small, large = (hierarchical(net, "reduce", Options(size_bytes=64 << 20, pipeline=s)) for s in (8, 64))
    assert small.scratch_chunks == large.scratch_chunks == SLOT_SLICES * 4 * 3


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_near_the_bound_where_the_ring_chain_is_not(collective: str) -> None:
    """fattree-48-3to1 at 256 MiB, compiled (paths spread over the spines): the ring's 47-hop chain takes 1.5x
    the bound; the rails' 5-hop chains come within 10% of it."""
    topology = leaves()
    options = Options(size_bytes=256 << 20)
    ours, theirs = (compile_schedule(topology, collective, name, options) for name in ("hierarchical", "ring"))
    assert ours.bound.time_s / ours.sim.time_s >= 0.9
    assert ours.sim.time_s < 0.8 * theirs.sim.time_s


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_one_gpu_hosts_decline(collective: str) -> None:
    """With one GPU a host there are no rails to cross on: the tree and the ring cover that, in one line why."""
    with pytest.raises(NotApplicableError, match="hosts of several GPUs"):
        hierarchical(Network(cluster([1, 1, 1, 1])), collective, Options(root=2))


@pytest.mark.parametrize("n", range(1, 70))
def test_two_counting_trees_share_the_forwarding(n: int) -> None:
    """Over n nodes and the same shifted by one: trees of depth log2 n in which no node has more than two
    children in both together (so a rail's NIC sends one piece a slice, half down each tree)."""
    nodes = list(range(n))
    children = [0] * n
    for order in (nodes, nodes[1:] + nodes[:1]):
        top, parent = _counting_tree(order)
        assert set(parent) == set(nodes) - {top}
        for v in parent:
            hops, u = 0, v
            while u != top:
                u, hops = parent[u], hops + 1
            assert hops <= n.bit_length() - 1
            children[parent[v]] += 1
    assert max(children) <= 2


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_many_hosts_take_two_trees(collective: str) -> None:
    """Beyond CHAIN_HOSTS hosts a rail's piece crosses on two trees, half each: the schedule verifies, and no
    GPU sends more than one piece a slice to other hosts."""
    topology = cluster([2] * (CHAIN_HOSTS + 4))
    net = Network(topology)
    schedule = hierarchical(net, collective, Options(size_bytes=4 << 20, root=5, pipeline=2))
    check_schedule(topology, schedule, collective, "hierarchical")
    assert schedule.metadata.options["trees"] == 2
    host = host_of(topology)
    piece = schedule.output_chunks // (2 * 2)  # two slices of two pieces
    across = [sum(op.count for op in program if op.kind == "send" and host[peer_of(op)] != host[r])
              for r, program in enumerate(schedule.programs)]
    assert max(across) == 2 * piece


def test_many_hosts_fan_out_a_group_of_slices_at_once() -> None:
    """Where the message budget binds (32 hosts at 256 MiB), a host's fan-out covers several slices, so the
    rails get more slices within the budget; where it does not (4 hosts at 16 MiB), every slice has its
    own."""
    share = 2
    slices, group = _slices(Options(size_bytes=256 << 20), _routes(32), 32, 8)
    assert group > 1 and slices > 16
    assert slices * (8 * 31 * share + 49) + -(-slices // group) * 32 * 8 * 7 <= MAX_TRANSFERS
    assert _slices(Options(size_bytes=16 << 20), _routes(4), 4, 8)[1] == 1


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_grouped_fan_outs_verify(collective: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the budget cut so that fan-outs go a group of slices at a time, the schedule still verifies, and
    a host's messages inside it are one per group, rail and GPU."""
    monkeypatch.setattr(rooted, "MAX_TRANSFERS", 700)
    topology = cluster([4] * (CHAIN_HOSTS + 4))
    net = Network(topology)
    schedule = hierarchical(net, collective, Options(size_bytes=64 << 20, root=3))
    check_schedule(topology, schedule, collective, "hierarchical")
    slices, group = schedule.metadata.options["pipeline"], schedule.metadata.options["fan_out_slices"]
    assert group > 1
    host = host_of(topology)
    inside = sum(1 for r, program in enumerate(schedule.programs) for op in program
                 if op.kind == "send" and host[peer_of(op)] == host[r] and op.channel == 0)
    # a round: every host but the root's, each GPU its rail's pieces to the 3 others; the root's, the 3 other
    # rails' GPUs to the 2 GPUs but them and the root; and a slice, the root's scatter to the 3 other rails
    rounds = -(-slices // group)
    assert inside == rounds * (12 * (CHAIN_HOSTS + 3) + 6) + 3 * slices
