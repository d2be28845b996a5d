"""The network: routes between ranks under each routing mode (spray, ECMP, dimension order, source)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest

from benchmarks.fabrics import fat_tree, rail_optimized
from tests.planner.topology.test_topology import ROOT, grid, load, two_paths
from topocc.planner.routing.network import MAX_PATHS, Memo, Network, _split_evenly, ecmp_hash
from topocc.planner.topology.model import Link
from topocc.planner.topology.parse import parse_topology_text


@pytest.mark.parametrize(
    "name", ["dgx1-v100.yaml", "dgx2.yaml", "dgx-a100-4node.yaml", "pcie-4x4-10gbe.yaml", "torus-4x4.yaml",
             "mesh-4x4.yaml", "emu-uniform.yaml", "emu-racks.yaml"],
)
def test_all_pairs_routable(name: str) -> None:
    topo = load(name)
    net = Network(topo)
    for a in range(topo.size):
        for b in range(topo.size):
            if a != b:
                assert net.has_route(a, b), (topo.ranks[a], topo.ranks[b])


def test_large_clusters_routable_from_a_sample() -> None:
    for name, sources in (("fattree-1024.yaml", (0, 5, 517, 1023)), ("ibm-s822lc-48x4.yaml", (0, 3, 100, 191)),
                          ("fattree-16384.yaml", (0, 9, 8191, 16383))):
        topo = load(name)
        net = Network(topo)
        for a in sources:
            assert all(net.has_route(a, b) for b in range(topo.size) if b != a), (name, a)


def test_dgx1_pcie_route() -> None:
    """GPUs 0 and 5 share no NVLink: their route crosses both PCIe trees and the QPI link."""
    topo = load("dgx1-v100.yaml")
    net = Network(topo)
    (path,) = net.routes(0, 5)
    assert [ln.dst for ln in path] == ["h0.pcie0", "h0.cpu0", "h0.cpu1", "h0.pcie2", "h0.gpu5"]
    assert net.route_bandwidth(0, 5) == pytest.approx(6e9)
    assert net.route_bandwidth(0, 3) == pytest.approx(50e9)


def test_rail_optimized_prefers_the_rail() -> None:
    """Same-rail GPUs talk through their rail switch; other rails go up through a spine."""
    topo = load("dgx-a100-4node.yaml")
    net = Network(topo)
    (same_rail,) = net.routes(0, 8 + 0)
    assert [ln.dst for ln in same_rail] == ["h0.nic0", "rail0", "h1.nic0", "h1.gpu0"]
    paths = net.routes(0, 8 + 1)
    assert sorted(ln.dst for path in paths for ln in path if ln.dst.startswith("spine")) == ["spine0", "spine1"]
    for path in paths:
        dsts = [ln.dst for ln in path]
        assert dsts[:2] == ["h0.nic0", "rail0"] and dsts[3:] == ["rail1", "h1.nic1", "h1.gpu1"]


def test_dimension_order_on_a_2x2_mesh_takes_one_path_where_spray_takes_two() -> None:
    """Rank 0 sits at (0, 0) and rank 3 at (1, 1): dimension 0 (rows, stride 2) is corrected first."""
    spray, ordered = Network(grid("mesh", [2, 2], "spray")), Network(grid("mesh", [2, 2]))
    assert ordered.topology.routing == "dimension-order"
    assert len(spray.connection_paths(0, 3)) == 2
    (path,) = ordered.connection_paths(0, 3)
    assert [ln.dst for ln in path] == ["h0.nic0", "r0", "r2", "r3", "h3.nic0", "h3.gpu0"]
    assert [ln.dim for ln in path if ln.dim is not None] == [0, 1]
    assert spray.route_shares(0, 3)[("r0", "r2")] == spray.route_shares(0, 3)[("r0", "r1")] == 0.5
    assert ordered.route_shares(0, 3)[("r0", "r2")] == 1.0 and ("r0", "r1") not in ordered.route_shares(0, 3)
    assert spray.route_bandwidth(0, 3) == 2 * ordered.route_bandwidth(0, 3) == 50e9
    assert ordered.connection_paths(0, 3, channel=5) == ordered.connection_paths(0, 3)


@pytest.mark.parametrize(("kind", "dims"), [("torus", [3, 4, 2]), ("mesh", [2, 3, 2]), ("torus", [4, 4])])
def test_dimension_order_corrects_each_dimension_in_turn(kind: str, dims: list[int]) -> None:
    """Every path: dimensions in increasing order, each moved in one direction, and as short as any route."""
    topo = grid(kind, dims)
    net = Network(topo)
    for a in range(topo.size):
        for b in range(topo.size):
            if a == b:
                continue
            (path,) = net.connection_paths(a, b)
            moves = [(ln.dim, ln.ascending) for ln in path if ln.dim is not None]
            assert [d for d, _ in moves] == sorted(d for d, _ in moves), (a, b)
            assert all(len({up for d2, up in moves if d2 == d}) == 1 for d, _ in moves), (a, b)
            assert len(path) == len(net.routes(a, b)[0])
            # a torus ring of 4 is as short either way at distance 2: the ascending direction wins
            if kind == "torus" and dims == [4, 4] and (a, b) == (0, 10):
                assert moves == [(0, True), (0, True), (1, True), (1, True)]


def test_ecmp_puts_each_connection_on_one_hashed_path() -> None:
    topo = two_paths("ecmp")
    net = Network(topo)
    assert len(net.routes(0, 1)) == 2
    via = {}
    for channel in range(16):
        (path,) = net.connection_paths(0, 1, channel)
        assert path in net.routes(0, 1)
        via[channel] = path[0].dst
        # the hash at g0, the one device with a choice, picks among its out-links in declaration order
        assert via[channel] == ("a", "b")[ecmp_hash(0, 1, channel, "g0") % 2]
        assert net.route_shares(0, 1, channel) == {(ln.src, ln.dst): 1.0 for ln in path}
        assert net.route_bandwidth(0, 1, channel) == (20e9 if via[channel] == "a" else 12e9)
    assert set(via.values()) == {"a", "b"}  # channels spread over both paths
    assert all(net.hashed_path(0, 1, c) == net.connection_paths(0, 1, c)[0] for c in range(16))  # uncached
    assert net.route_key(0, 1, 3) == (0, 1, 3) and net.route_key(1, 0, 3) == (1, 0, 3)
    spray = Network(two_paths("spray"))
    assert spray.route_key(0, 1, 3) == (0, 1, 0) and len(spray.connection_paths(0, 1, 3)) == 2


def test_ecmp_hash_is_documented_and_the_same_in_every_process() -> None:
    assert ecmp_hash(3, 7, 1, "leaf0") == zlib.crc32(b"3 7 1 leaf0")
    code = ("from topocc.planner.topology.parse import load_topology as l;"
            "from topocc.planner.routing.network import Network;"
            "t = l('topologies/dgx-a100-4node.yaml');"
            "n = Network(t);"
            "print([n.connection_paths(a, b, c)[0][2].dst for a in (0, 3) for b in (9, 30) for c in range(4)])")
    runs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        runs.add(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                                check=True).stdout)
    topo = load("dgx-a100-4node.yaml")
    net = Network(topo)
    here = [net.connection_paths(a, b, c)[0][2].dst for a in (0, 3) for b in (9, 30) for c in range(4)]
    assert runs == {f"{here}\n"}
    assert set(here) == {"spine0", "spine1"}


def test_source_routing_hashes_connections_without_a_recorded_path() -> None:
    ecmp = Network(two_paths("ecmp"))
    source = Network(two_paths("source"))
    assert all(source.connection_paths(0, 1, c) == ecmp.connection_paths(0, 1, c) for c in range(8))


def test_path_through_accepts_only_cheapest_paths() -> None:
    topo = two_paths("source")
    net = Network(topo)
    assert [ln.dst for ln in net.path_through(0, 1, ["b"])] == ["b", "g1"]  # type: ignore[union-attr]
    assert net.path_through(0, 1, ["a", "b"]) is None
    assert net.path_through(0, 1, ["nowhere"]) is None
    assert net.path_through(0, 1, []) is None  # no direct link
    assert {ln.dst for ln in net.equal_cost_links(0, 1)} == {"a", "b", "g1"}


def test_common_links_are_those_every_cheapest_path_crosses() -> None:
    """A fat-tree crossing: the GPU's and NIC's links at both ends, never a spine's (the spray spreads over
    those); a pair with one path: the whole path; no route: none."""
    from tests.planner.compiler.test_compile import FAT_TREE
    from tests.planner.routing.test_relay import chain

    topology = parse_topology_text(FAT_TREE.format(routing="spray"))
    net = Network(topology)
    across = topology.size - 1  # another leaf
    common = net.common_links(0, across)
    paths = net.routes(0, across)
    assert len(paths) > 1 and all(set(common) <= set(path) for path in paths)
    assert len(common) == 4 and not any("spine" in ln.src or "spine" in ln.dst for ln in common)
    (path,) = net.routes(0, 1)  # over the host's NVSwitch
    assert net.common_links(0, 1) == path
    assert Network(chain(3)).common_links(0, 2) == () and Network(chain(3)).common_links(1, 1) == ()


@pytest.mark.parametrize("name", ["dgx-a100-4node.yaml", "torus-4x4.yaml", "pcie-4x4-10gbe.yaml", "emu-racks.yaml"])
def test_spray_bandwidth_by_counting_paths_is_the_listed_paths_float(name: str) -> None:
    """Counting the cheapest paths through each link gives bit for bit the bandwidth the even split of the listed
    paths gives, and declines (None) exactly where :meth:`routes` keeps only the first MAX_PATHS paths."""
    topo = load(name).with_routing("spray")
    net = Network(topo)
    declined = 0
    for a in range(topo.size):
        for b in range(topo.size):
            counted = net._spray_bandwidth(a, b)
            if a == b or not net.has_route(a, b):
                assert counted is None
                continue
            listed = min(topo.bandwidth(*key) / share for key, share in net.route_shares(a, b).items())
            if counted is None:
                declined += 1
                assert len(net.routes(a, b)) == MAX_PATHS
            else:
                assert counted == listed
                assert net.route_bandwidth(a, b) == listed
    assert declined == (16 if name == "torus-4x4.yaml" else 0)  # the pairs with more than MAX_PATHS paths


def test_spray_bandwidth_on_a_fat_tree_sample() -> None:
    """Across leaves of fattree-1024 a pair has 16 paths (one per spine): counted as listed."""
    topo = load("fattree-1024.yaml")
    net = Network(topo)
    for a, b in [(0, 1), (0, 8), (0, 31), (0, 32), (5, 1000), (1023, 17)]:
        counted = net._spray_bandwidth(a, b)
        assert counted == min(topo.bandwidth(*key) / share for key, share in net.route_shares(a, b).items())


def test_a_pair_behind_more_than_16_spines_sprays_over_16_that_its_hash_picks() -> None:
    """20 spines: each pair across the leaves keeps 16 paths, not the same 16 for every pair, so that the pairs
    together load every spine (the first 16 alone would leave a fifth of the spine links idle)."""
    topo = parse_topology_text(fat_tree(4, 2, 20, 1).yaml, "fat-tree").with_routing("spray")
    net = Network(topo)
    used: dict[str, int] = {}
    for a in range(16):
        for b in range(16, 32):
            paths = net.routes(a, b)
            assert len(paths) == 16 and len(set(paths)) == 16
            for path in paths:
                assert [link.src for link in path[1:]] == [link.dst for link in path[:-1]]
                for link in path:
                    if link.dst.startswith("spine"):
                        used[link.dst] = used.get(link.dst, 0) + 1
    assert len(used) == 20
    assert max(used.values()) < 1.5 * min(used.values())


def test_a_memo_is_built_once_per_network_and_a_reversed_network_once() -> None:
    calls: list[Network] = []

    def build(net: Network) -> int:
        calls.append(net)
        return len(calls)

    table = Memo("test: counter", build)
    net, other = Network(load("dgx1-v100.yaml")), Network(load("dgx1-v100.yaml"))
    assert net.memo(table) == net.memo(table) == 1 and calls == [net]
    assert other.memo(table) == 2  # each network keeps its own tables
    assert net.reversed() is net  # every link full duplex: the reverse is the network itself
    one_way = Network(load("ndv2-2chassis.yaml"))
    assert one_way.reversed() is one_way.reversed() is not one_way
    assert one_way.reversed().topology.links[0].src == one_way.topology.links[0].dst


@pytest.mark.parametrize("name", ["dgx1-v100.yaml", "dgx2-2chassis.yaml", "ndv2-2chassis.yaml", "torus-4x4.yaml",
                                  "ibm-s822lc-48x4.yaml", "emu-racks.yaml", "rail-only"])
def test_a_route_exists_where_the_route_search_finds_one(name: str) -> None:
    """Whether a pair has a route is read from the parts of the fabric its ends touch where every link has a
    reverse (no search from the source), and from the search elsewhere (the 2-chassis boxes' one-way
    links): both say what the search says, for every pair, also where rails without spines leave pairs
    across rails none."""
    topo = rail_optimized(4, spines=0).topology() if name == "rail-only" else load(name)
    net = Network(topo)
    searched = Network(topo)
    searched._fabric_parts = None  # the cached property, set: the search decides
    found = [[net.has_route(a, b) for b in range(topo.size)] for a in range(topo.size)]
    assert found == [[searched.has_route(a, b) for b in range(topo.size)] for a in range(topo.size)]
    assert (net._fabric_parts is None) == (name in ("dgx2-2chassis.yaml", "ndv2-2chassis.yaml"))
    assert all(map(all, found)) == (name not in ("rail-only", "dgx2-2chassis.yaml", "ndv2-2chassis.yaml"))


def _every_path(net: Network, src: int, dst: int) -> list[tuple[Link, ...]]:
    """Every cheapest path of the pair, walked over the links on one (no cap on their number)."""
    links = net.equal_cost_links(src, dst)
    out: dict[str, list[Link]] = {}
    for link in links:
        out.setdefault(link.src, []).append(link)
    target = net.topology.ranks[dst]

    def walk(node: str) -> list[tuple[Link, ...]]:
        if node == target:
            return [()]
        return [(link, *rest) for link in out[node] for rest in walk(link.dst)]

    return walk(net.topology.ranks[src])


@pytest.mark.parametrize("spines", [17, 20])
def test_a_pair_sprayed_over_more_than_16_paths_counts_them_all(spines: int) -> None:
    """Behind more than MAX_PATHS spines a sprayed pair is one flow whose share on each link is the paths
    through it over all paths: the even split of every path (listed here without a cap), with the slowest
    path's latency; under ECMP the same pair is hashed onto one path, as before."""
    topo = parse_topology_text(fat_tree(4, 2, spines, 1).yaml, "fat-tree").with_routing("spray")
    net = Network(topo)
    for a, b in [(0, 16), (3, 31), (17, 2)]:
        every = _every_path(net, a, b)
        assert len(every) == spines > MAX_PATHS
        sprayed = net.sprayed(a, b)
        assert sprayed is not None
        expected = {key: pytest.approx(share, rel=1e-12) for key, share in _split_evenly(every).items()}
        assert net.route_shares(a, b) == expected and net.even_shares(a, b) == expected
        assert net.route_bandwidth(a, b) == pytest.approx(
            min(topo.bandwidth(*key) / share for key, share in _split_evenly(every).items()), rel=1e-12)
        assert net.route_latency(a, b) == pytest.approx(max(sum(ln.latency for ln in p) for p in every))
        assert net.routed_by_shape(a, b)
    assert net.sprayed(0, 1) is None  # within a host: one path, listed
    hashed = Network(topo.with_routing("ecmp"))
    assert hashed.sprayed(0, 16) is None and len(hashed.connection_paths(0, 16)) == 1


def test_a_torus_pair_with_more_than_16_paths_sprays_over_all() -> None:
    """On a 4x4 torus under spray, the 16 pairs two hops apart in both dimensions have 24 cheapest paths:
    their shares are the even split of all 24; every other pair lists its paths as before."""
    topo = load("torus-4x4.yaml").with_routing("spray")
    net = Network(topo)
    wide = 0
    for a in range(topo.size):
        for b in range(topo.size):
            if a == b:
                continue
            every = _every_path(net, a, b)
            sprayed = net.sprayed(a, b)
            assert (sprayed is not None) == (len(every) > MAX_PATHS)
            if sprayed is None:
                assert len(net.routes(a, b)) == len(every)
                continue
            wide += 1
            shares = dict(zip(((topo.links[k].src, topo.links[k].dst) for k in sprayed.links), sprayed.shares))
            assert shares == {key: pytest.approx(s, rel=1e-12) for key, s in _split_evenly(every).items()}
    assert wide == 16
