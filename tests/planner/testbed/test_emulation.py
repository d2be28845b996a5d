"""The emulated cluster: its plan (anywhere), and as root the real namespaces, shaping, MPI and cleanup."""

from __future__ import annotations

import os
import random
import re
import string
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import must_search
from topocc.planner.errors import TopologyError
from topocc.planner.routing.network import Network
from topocc.planner.testbed.emulation import (
    EmulatedCluster,
    cleanup_stale,
    emulation_available,
    plan_emulation,
    scale_for_rate,
    scaled_topology,
)
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.errors import TopoccError

GBIT = 1e9 / 8


def racks_topology(racks: int, hosts: int, gpus: int, *, host_bw: str = "10 Gbit/s", uplink_bw: str = "5 Gbit/s",
                   nics: int = 1) -> Topology:
    """``racks`` x ``hosts`` x ``gpus`` GPUs; a host's GPUs share ``nics`` NICs to its rack switch; racks to a spine."""
    devices, links = [], []
    for r in range(racks):
        devices.append(f"{{name: leaf{r}, type: switch, rack: r{r}}}")
        links.append(f"{{ends: [leaf{r}, spine], bandwidth: {uplink_bw}, latency: 2 us}}")
        for h in range(hosts):
            host = f"h{r}{h}"
            for n in range(nics):
                devices.append(f"{{name: {host}n{n}, type: nic, host: {host}, rack: r{r}}}")
                links.append(f"{{ends: [{host}n{n}, leaf{r}], bandwidth: {host_bw}, latency: 1 us}}")
            for g in range(gpus):
                devices.append(f"{{name: {host}g{g}, type: gpu, host: {host}, rack: r{r}}}")
                for n in range(nics):
                    links.append(f"{{ends: [{host}g{g}, {host}n{n}], bandwidth: 16 GB/s}}")
            for g in range(1, gpus):
                links.append(f"{{ends: [{host}g0, {host}g{g}], bandwidth: 100 GB/s}}")
    if racks > 1:
        devices.append("{name: spine, type: switch}")
    else:
        links = [x for x in links if "spine" not in x]
    text = "name: racks\ndevices:\n" + "".join(f"  - {d}\n" for d in devices)
    text += "links:\n" + "".join(f"  - {x}\n" for x in links)
    return parse_topology_text(text, "racks.yaml")


# --------------------------------------------------------------------------- the plan (no root needed)


def test_plan_maps_hosts_switches_and_rates() -> None:
    topo = racks_topology(2, 2, 2, host_bw="10 Gbit/s", uplink_bw="5 Gbit/s", nics=2)
    plan = plan_emulation(topo, scale=1e-2, prefix="tcc", tag="7")
    assert [h.name for h in plan.hosts] == ["h00", "h01", "h10", "h11"]
    assert [h.ranks for h in plan.hosts] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert len({h.address for h in plan.hosts}) == 4
    assert all(h.namespace.startswith(f"tcc{os.getpid()}x7-h") for h in plan.hosts)
    assert sorted(s for _, s in plan.bridges) == ["leaf0", "leaf1", "spine"]
    host_wires = [w for w in plan.wires if "host" in w.what]
    uplinks = [w for w in plan.wires if "host" not in w.what]
    assert len(host_wires) == 4 and len(uplinks) == 2
    # Two 10 Gbit/s NICs per host become one interface at 2 x 100 Mbit/s each way.
    for w in host_wires:
        assert w.a_ns == plan.fabric and w.a_bridge is not None and w.b_bridge is None
        assert w.a_rate == pytest.approx(2 * 10 * GBIT * 1e-2) and w.b_rate == pytest.approx(w.a_rate)
    for w in uplinks:
        assert w.a_ns == w.b_ns == plan.fabric and "b2" in (w.a_bridge, w.b_bridge) and "spine" in w.what
        assert w.a_rate == pytest.approx(5 * GBIT * 1e-2)
    names = [d for w in plan.wires for d in (w.a_dev, w.b_dev)] + [d for d, _ in plan.bridges]
    assert all(len(n) <= 15 for n in names)
    assert "100.0 Mbit/s" not in plan.describe() and "200.0 Mbit/s" in plan.describe()


def test_plan_joins_two_hosts_cabled_directly() -> None:
    text = textwrap.dedent("""\
        name: direct
        devices:
          - {name: a.gpu, type: gpu, count: 2, host: a}
          - {name: b.gpu, type: gpu, count: 2, host: b}
        links:
          - {ends: [a.gpu0, a.gpu1], bandwidth: 50 GB/s}
          - {ends: [b.gpu0, b.gpu1], bandwidth: 50 GB/s}
          - {ends: [a.gpu0, b.gpu1], bandwidth: 1 GB/s}
        """)
    plan = plan_emulation(parse_topology_text(text), scale=1e-2)
    assert plan.fabric is None and plan.bridges == ()
    (wire,) = plan.wires
    assert (wire.a_ns, wire.b_ns) == (plan.hosts[0].namespace, plan.hosts[1].namespace)
    assert wire.a_rate == wire.b_rate == pytest.approx(1e7)


def test_plan_refuses_what_it_cannot_build() -> None:
    topo = racks_topology(2, 1, 1)
    text = textwrap.dedent("""\
        name: dual-homed
        devices:
          - {name: g0, type: gpu, host: a}
          - {name: g1, type: gpu, host: b}
          - {name: s0, type: switch}
          - {name: s1, type: switch}
        links:
          - {ends: [g0, s0], bandwidth: 1 GB/s}
          - {ends: [g0, s1], bandwidth: 1 GB/s}
          - {ends: [g1, s0], bandwidth: 1 GB/s}
        """)
    with pytest.raises(TopologyError, match="host 'a' is wired to several switches"):
        plan_emulation(parse_topology_text(text), scale=1e-2)
    loop = text.replace("name: dual-homed", "name: loop").replace("[g0, s1]", "[s0, s1]")
    loop += "  - {ends: [s1, s2], bandwidth: 1 GB/s}\n  - {ends: [s2, s0], bandwidth: 1 GB/s}\n"
    s1 = "  - {name: s1, type: switch}\n"
    loop = loop.replace(s1, s1 + s1.replace("s1", "s2"))
    with pytest.raises(TopologyError, match="switches form a loop"):
        plan_emulation(parse_topology_text(loop), scale=1e-2)
    with pytest.raises(TopologyError, match="scale"):
        plan_emulation(topo, scale=0)
    with pytest.raises(TopologyError, match="prefix"):
        plan_emulation(topo, scale=1e-2, prefix="Bad-Prefix")


def test_scaled_topology_scales_only_the_network() -> None:
    topo = racks_topology(2, 1, 2, host_bw="10 Gbit/s", uplink_bw="4 Gbit/s")
    net = Network(topo)
    scaled = scaled_topology(topo, 1e-3)
    for old, new in zip(topo.links, scaled.links):
        inter = "leaf" in old.src + old.dst or "spine" in old.src + old.dst
        assert new.bandwidth == pytest.approx(old.bandwidth * (1e-3 if inter else 1.0))
        assert new.latency == old.latency
    scaled_net = Network(scaled)
    assert scaled_net.route_bandwidth(0, 2) == pytest.approx(4 * GBIT * 1e-3)
    assert scaled_net.route_bandwidth(0, 1) == pytest.approx(net.route_bandwidth(0, 1))
    assert scale_for_rate(topo, 100e6) == pytest.approx(1e-2)
    group = scaled_topology(topo.subset([3, 0]), 1e-3)  # a process group (topocc calibrate 'FILE[3,0]') stays one
    assert group.ranks == topo.subset([3, 0]).ranks and group.size == 2


def test_mpiexec_command_puts_each_rank_in_its_host_namespace() -> None:
    topo = racks_topology(1, 2, 2)
    cluster = EmulatedCluster(topo, scale=1e-2)
    cmd = cluster.mpiexec_command(["job.py", "--x"], python="/opt/py/bin/python", env={"A": "1"},
                                  mpiexec="/opt/mpiexec")
    assert cmd[0] == "/opt/mpiexec"
    text = " ".join(cmd)
    for pair in ("MPIR_CVAR_NOLOCAL 1", "MPIR_CVAR_CH4_NETMOD ofi", "FI_PROVIDER tcp", "A 1"):
        assert f"-genv {pair}" in text
    blocks = text.split(" : ")
    assert len(blocks) == 4
    for rank, block in enumerate(blocks):
        host = cluster.host_of(rank)
        assert re.search(rf"-n 1 -env FI_TCP_IFACE {host.interface} \S*ip netns exec {host.namespace} "
                         r"/opt/py/bin/python job.py --x$", block), block
    assert cluster.host_of(1).namespace == cluster.host_of(0).namespace != cluster.host_of(2).namespace


# --------------------------------------------------------------------------- real namespaces (root)

needs_root = pytest.mark.skipif(emulation_available() is not None, reason=str(emulation_available()))

#: One TCP stream between two emulated hosts, its rate measured at the receiver. Server and client start
#: together: the client retries until the server listens, and each waits up to ``START_S`` for the other (the
#: interpreters' start under ``ip netns exec`` on a loaded machine), far more than an idle one needs.
START_S = 30
TCP_PAIR = textwrap.dedent("""\
    import socket, sys, time
    role, addr, seconds, start_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    if role == "server":
        srv = socket.create_server((addr, 5201))
        srv.settimeout(start_s)
        conn, _ = srv.accept()
        conn.settimeout(5)
        marks = []
        total = 0
        while chunk := conn.recv(1 << 16):
            total += len(chunk)
            marks.append((time.monotonic(), total))
        start = next(m for m in marks if m[0] >= marks[0][0] + 0.25)  # past slow start and the bucket's burst
        print(f"RATE {(total - start[1]) / (marks[-1][0] - start[0]):.0f}", flush=True)
    else:
        deadline = time.monotonic() + start_s
        while True:
            try:
                sock = socket.create_connection((addr, 5201), timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        block = bytes(1 << 16)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sock.sendall(block)
        sock.close()
    """)


def measure_tcp(cluster: EmulatedCluster, src: int, dst: int, tmp_path: Path, seconds: float = 1.5) -> float:
    """Bytes/s of one TCP stream from host ``src`` to host ``dst``, measured at the receiver."""
    script = tmp_path / "tcp_pair.py"
    script.write_text(TCP_PAIR)
    addr = cluster.hosts[dst].address
    server = " ".join(cluster.host_command(dst, [sys.executable, str(script), "server", addr, "0", str(START_S)]))
    client = " ".join(cluster.host_command(src, [sys.executable, str(script), "client", addr, str(seconds),
                                                 str(START_S)]))
    done = cluster.run(["sh", "-c", f"{server} & {client} && wait $!"], timeout_s=seconds + 2 * START_S)
    assert done.returncode == 0, done.stderr
    return float(must_search(r"RATE (\d+)", done.stdout).group(1))


def our_state() -> tuple[list[str], list[str]]:
    """Namespaces and the machine's own interfaces, to compare before and after."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10, check=True).stdout
    return sorted(netns.split("\n")), sorted(re.sub(r"^\d+: ", "", x).split(":")[0] for x in links.splitlines())


def assert_gone(cluster: EmulatedCluster, before: tuple[list[str], list[str]]) -> None:
    netns, links = our_state()
    assert not [ns for ns in cluster.plan.namespaces if any(line.startswith(ns + " ") or line == ns
                                                            for line in netns)]
    assert links == before[1]


@pytest.mark.root
@needs_root
@pytest.mark.parametrize(("shape", "src", "dst"), [("switch", 0, 1), ("racks", 0, 1)])
def test_tcp_rate_matches_the_shaped_rate(shape: str, src: int, dst: int, tmp_path: Path) -> None:
    if shape == "switch":  # two hosts on one switch: the host links (100 Mbit/s scaled) limit
        topo = racks_topology(1, 2, 1, host_bw="10 Gbit/s")
    else:  # one host per rack: the 4:1 rack uplink (25 Mbit/s scaled) limits
        topo = racks_topology(2, 1, 1, host_bw="10 Gbit/s", uplink_bw="2.5 Gbit/s")
    before = our_state()
    with EmulatedCluster(topo, scale=1e-2) as cluster:
        src_rank, dst_rank = cluster.hosts[src].ranks[0], cluster.hosts[dst].ranks[0]
        expected = Network(cluster.scaled_topology()).route_bandwidth(src_rank, dst_rank)
        rate = measure_tcp(cluster, src, dst, tmp_path)
    assert rate == pytest.approx(expected, rel=0.25), f"measured {rate * 8e-6:.1f} Mbit/s for {expected * 8e-6:.1f}"
    assert_gone(cluster, before)


MPI_JOB = textwrap.dedent("""\
    import os, numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    out = np.empty(1000, dtype=np.float32)
    comm.Allreduce(np.full(1000, comm.rank + 1, dtype=np.float32), out)
    iface = os.environ["FI_TCP_IFACE"]
    print(f"RANK {comm.rank}/{comm.size} {os.readlink('/proc/self/ns/net')} {iface} SUM {out[0]:g} {out[-1]:g}",
          flush=True)
    """)


@pytest.mark.root
@pytest.mark.mpi
@needs_root
def test_mpiexec_allreduce_across_namespaces(tmp_path: Path) -> None:
    topo = racks_topology(1, 2, 2)
    script = tmp_path / "job.py"
    script.write_text(MPI_JOB)
    with EmulatedCluster(topo, scale=1e-2) as cluster:
        done = cluster.run(cluster.mpiexec_command([str(script)]), timeout_s=25)
        assert done.returncode == 0, done.stderr[-2000:]
        assert cluster.plan.fabric is not None  # racks of hosts: switches in a namespace of their own
        sent = subprocess.run(["tc", "-s", "-n", cluster.plan.fabric, "qdisc", "show"], capture_output=True,
                              text=True, timeout=10, check=True).stdout
    ranks = sorted(re.findall(r"RANK (\d)/4 (net:\[\d+\]) tcc0 SUM (\d+) (\d+)", done.stdout))  # lines may interleave
    assert [r[0] for r in ranks] == ["0", "1", "2", "3"], done.stdout
    netns = [r[1] for r in ranks]
    assert netns[0] == netns[1] != netns[2] == netns[3]  # two namespaces, ranks of one host together
    assert all(r[2:] == ("10", "10") for r in ranks)
    # The allreduce crossed the shaped switch ports (each carried at least 1000 floats).
    port_bytes = {dev: int(b) for dev, b in re.findall(r"qdisc tbf \S+ dev (\S+) .*\n\s*Sent (\d+) bytes", sent)}
    assert sorted(port_bytes) == ["p0", "p1"] and min(port_bytes.values()) > 4000, sent


@pytest.mark.root
@needs_root
def test_cleanup_after_failure_timeout_and_exception() -> None:
    topo = racks_topology(2, 1, 1)
    before = our_state()
    with EmulatedCluster(topo, scale=1e-2) as cluster:
        done = cluster.run(cluster.host_command(0, ["sh", "-c", "echo nope >&2; exit 3"]), timeout_s=5)
        assert done.returncode == 3 and "nope" in done.stderr
        with pytest.raises(TopoccError, match=r"ran longer than 0\.5 s"):
            cluster.run(cluster.host_command(1, ["sleep", "30"]), timeout_s=0.5)
        pids = subprocess.run(["ip", "netns", "pids", cluster.hosts[1].namespace], capture_output=True, text=True,
                              timeout=10, check=True).stdout
        assert pids.split() == []
        # A process left running in a namespace when the block ends is killed with it (once it is inside:
        # under load ``ip netns exec`` may take a while to join).
        stray = subprocess.Popen(cluster.host_command(0, ["sleep", "30"]))
        inside = time.monotonic() + 5
        while str(stray.pid) not in subprocess.run(["ip", "netns", "pids", cluster.hosts[0].namespace],
                                                   capture_output=True, text=True, timeout=10).stdout.split():
            assert time.monotonic() < inside, "the stray process never joined its namespace"
            time.sleep(0.02)
    assert stray.wait(timeout=5) != 0
    assert_gone(cluster, before)

    with pytest.raises(RuntimeError, match="boom"), EmulatedCluster(topo, scale=1e-2) as failing:
        raise RuntimeError("boom")
    assert_gone(failing, before)


@pytest.mark.root
@needs_root
def test_failed_build_removes_only_what_it_made() -> None:
    topo = racks_topology(2, 1, 1)
    cluster = EmulatedCluster(topo, scale=1e-2)
    taken = cluster.hosts[1].namespace
    subprocess.run(["ip", "netns", "add", taken], timeout=10, check=True)

    def its_namespaces(netns: list[str]) -> set[str]:
        """The cluster's names among ``netns`` (a test run beside this one adds and removes its own)."""
        return {line.split()[0] for line in netns if line} & set(cluster.plan.namespaces)

    try:
        before = our_state()
        with pytest.raises(TopoccError, match=rf"'\S*ip netns add {taken}' failed"), cluster:
            pass
        netns, links = our_state()
        assert its_namespaces(netns) == its_namespaces(before[0]) == {taken}  # ours removed, the one in the way kept
        assert links == before[1]
    finally:
        subprocess.run(["ip", "netns", "delete", taken], timeout=10, check=True)


@pytest.mark.root
@needs_root
def test_cleanup_stale_removes_only_dead_owners() -> None:
    # a prefix of this run's own (a run of this test beside it has another), and an owner that cannot be alive:
    # the kernel gives out pids below pid_max only
    prefix = "tct" + "".join(random.choices(string.ascii_lowercase, k=5))
    dead = int(Path("/proc/sys/kernel/pid_max").read_text())
    stale, live = f"{prefix}{dead}x0-h0", f"{prefix}{os.getpid()}x99-h0"
    for ns in (stale, live):
        subprocess.run(["ip", "netns", "add", ns], timeout=10, check=True)
    try:
        assert cleanup_stale(prefix) == 1
        netns = our_state()[0]
        assert not any(x.split()[0] == stale for x in netns if x)
        assert any(x.split()[0] == live for x in netns if x)
    finally:
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "delete", ns], timeout=10, capture_output=True, check=False)


def test_emulation_unavailable_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert emulation_available.__wrapped__() == "network namespaces need root"


def test_link_stats_read_token_bucket_drops_and_tcp_retransmits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``link_stats`` parses ``tc -s qdisc`` per wire end and each host's TCP counters (commands stubbed)."""
    import topocc.planner.testbed.emulation as E

    cluster = EmulatedCluster(racks_topology(1, 2, 1), scale=1e-3)
    calls: list[list[str]] = []

    def fake_call(argv: list[str], timeout_s: float) -> str:
        calls.append(argv)
        if "qdisc" in argv:
            return ("qdisc tbf 8001: root refcnt 2 rate 8Mbit burst 32Kb lat 32.8ms\n"
                    " Sent 4096 bytes 3 pkt (dropped 2, overlimits 7 requeues 0)\n backlog 0b 0p requeues 0\n")
        return ("Tcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 5 0\n"
                "Udp: InDatagrams\nUdp: 3\n")

    monkeypatch.setattr(E, "_call", fake_call)
    monkeypatch.setattr(E, "_tool", lambda name: name)
    stats = cluster.link_stats()
    ends = [k for k, v in stats.items() if "sent_bytes" in v]
    hosts = [k for k, v in stats.items() if "tcp_retransmitted" in v]
    assert len(ends) == 2 * len(cluster.plan.wires) and len(hosts) == len(cluster.hosts) == 2
    assert all(stats[k] == {"sent_bytes": 4096, "dropped": 2} for k in ends)
    assert all(stats[k] == {"tcp_retransmitted": 5} for k in hosts)
    assert ["ip", "netns", "exec", cluster.hosts[0].namespace, "cat", "/proc/net/snmp"] in calls
