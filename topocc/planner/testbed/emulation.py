"""An emulated cluster on one Linux machine: network namespaces, veth pairs, bridges and tc shaping.

Each host of a :class:`~topocc.planner.topology.model.Topology` becomes a network namespace
holding its ranks; the host-level network (NICs' switch ports, leaf/rack
switches, spines) becomes Linux bridges in one dedicated *fabric* namespace,
joined by veth pairs.  Every veth end shapes its egress with a token bucket
(``tc qdisc ... tbf``) to the link's bandwidth times ``scale``, so that MPI
ranks launched with :meth:`EmulatedCluster.mpiexec_command` exchange
inter-host traffic over a network with the topology's *shape* (which links are
slow, which are shared) at a rate one machine can carry.  Nothing is created
in the machine's own namespace; leaving the context removes every namespace
(and with them every veth and bridge) it created, even on failure.

What is and is not emulated:

- **Bandwidth** of inter-host links (host <-> switch, switch <-> switch), per
  direction, scaled by ``scale``.  A host with several links to its switch
  (several NICs, or ``count: N``) gets one interface whose rate is their sum.
- **Intra-host links are not shaped**: ranks of one host share a namespace and
  talk over its loopback, which is far faster than any scaled network link.
  :meth:`EmulatedCluster.scaled_topology` keeps them at their real bandwidth,
  which is likewise far above the scaled network.
- **Latency is not emulated**: ``sch_netem`` is absent from the kernels this
  was built on, and at the message sizes that matter here (MiB) bandwidth
  dominates.  The emulated path's own latency (veth + bridge + TCP, tens of
  microseconds) stands in; :meth:`~EmulatedCluster.scaled_topology` keeps the
  topology's latencies.
- The switches must form a tree (Linux bridges without STP would flood a
  loop), and each host must hang off one switch (or one peer host).

Run it as root (``emulation_available()`` says why not).  If a process is
killed before it can clean up, :func:`cleanup_stale` removes what it left.

>>> with EmulatedCluster(topo, scale=1e-3) as cluster:  # doctest: +SKIP
...     out = cluster.run(cluster.mpiexec_command(["allreduce.py"]), timeout_s=60)
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

import networkx as nx

from topocc.planner.errors import TopologyError
from topocc.planner.topology.calibration import link_classes_of
from topocc.planner.topology.model import Link, Topology, build_topology
from topocc.runtime.errors import TopoccError
from topocc.runtime.harness.launch import find_mpiexec

__all__ = [
    "DEFAULT_SCALE",
    "MPI_ENV",
    "SUBNET",
    "EmulatedCluster",
    "EmulatedHost",
    "EmulationPlan",
    "Wire",
    "cleanup_stale",
    "emulation_available",
    "plan_emulation",
    "scale_for_rate",
]

#: Addresses of the host namespaces (host ``i`` gets ``10.213.i/256.i%256+1``); they exist only there.
SUBNET = "10.213.0.0/16"
#: Environment for every rank: no shared memory between ranks (so traffic takes the emulated
#: network), the OFI netmod over libfabric's TCP provider (which honours ``FI_TCP_IFACE``).
MPI_ENV: Mapping[str, str] = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
#: Default scale: 100 Gbit/s NICs become 100 Mbit/s, slow enough that a dozen ranks on two cores stay
#: network-bound (benchmarks/emulate_probe.py measures how much of the time scales with the rates; faster
#: links leave busy-polling ranks CPU-bound).
DEFAULT_SCALE = 1e-3
#: Default bound on each ``ip``/``tc`` call.
DEFAULT_TIMEOUT_S = 10.0
#: Token-bucket depth: at least this many bytes, or this many seconds at the shaped rate.
TBF_MIN_BURST = 32 * 1024
TBF_BURST_S = 0.002
#: Token-bucket queue: this many seconds at the shaped rate (at least a few bursts).
TBF_QUEUE_S = 0.05

#: ``tc -s qdisc show``: "Sent 123 bytes 4 pkt (dropped 5, overlimits 6 requeues 0)"
_QDISC_SENT_RE = re.compile(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+),")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_IFNAMSIZ = 15
_instances = itertools.count()


@dataclass(frozen=True)
class EmulatedHost:
    """One topology host: its namespace, the interface its ranks use and that interface's address."""

    name: str
    namespace: str
    interface: str
    address: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Wire:
    """A veth pair: end ``a`` in namespace ``a_ns`` (enslaved to bridge ``a_bridge`` if set), end ``b`` likewise.

    ``a_rate`` shapes what leaves end ``a`` (towards ``b``), in scaled bytes/s; ``what`` names the
    topology nodes it joins, for messages and :meth:`EmulationPlan.describe`.
    """

    a_ns: str
    a_dev: str
    a_bridge: str | None
    a_rate: float
    b_ns: str
    b_dev: str
    b_bridge: str | None
    b_rate: float
    what: str


@dataclass(frozen=True, slots=True)
class EmulationPlan:
    """What :class:`EmulatedCluster` builds, computed without touching the system (so it can be tested)."""

    hosts: tuple[EmulatedHost, ...]
    fabric: str | None
    bridges: tuple[tuple[str, str], ...]  # (device in the fabric namespace, topology switch name)
    wires: tuple[Wire, ...]
    scale: float

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace the plan creates, the fabric first."""
        return ((self.fabric,) if self.fabric else ()) + tuple(h.namespace for h in self.hosts)

    def describe(self) -> str:
        """The layout as text: namespaces, bridges, and each wire with its shaped rates (Mbit/s)."""
        lines = [f"fabric namespace {self.fabric}: bridges " + ", ".join(f"{d}={s}" for d, s in self.bridges)
                 if self.fabric else "no fabric (one host)"]
        for h in self.hosts:
            lines.append(f"host {h.name}: namespace {h.namespace}, {h.interface} {h.address}, ranks {list(h.ranks)}")
        for w in self.wires:
            lines.append(f"wire {w.what}: {w.a_ns}/{w.a_dev}{'@' + w.a_bridge if w.a_bridge else ''} "
                         f"-> {w.a_rate * 8e-6:.1f} Mbit/s, {w.b_ns}/{w.b_dev}{'@' + w.b_bridge if w.b_bridge else ''}"
                         f" -> {w.b_rate * 8e-6:.1f} Mbit/s")
        return "\n".join(lines)


# --------------------------------------------------------------------------- planning (pure)


def is_inter_host(topology: Topology, src: str, dst: str) -> bool:
    """Whether the link ``src -> dst`` belongs to the network between hosts (the part that is shaped)."""
    a, b = topology.device(src).domain, topology.device(dst).domain
    return a is None or b is None or a != b


def plan_emulation(topology: Topology, *, scale: float, prefix: str = "tcc", tag: str = "0") -> EmulationPlan:
    """Map ``topology`` onto namespaces, bridges and shaped veth pairs.

    Raises :class:`~topocc.planner.errors.TopologyError` for a network the emulation cannot build: a host
    wired to several switches, switches forming a loop, hosts the network does not join.
    """
    if not (scale > 0 and scale < float("inf")):
        raise TopologyError(f"scale must be a positive number, got {scale!r}")
    if not _PREFIX_RE.match(prefix):
        raise TopologyError(f"bad emulation prefix {prefix!r}", fix="use 1-8 lowercase letters and digits")
    where = topology.source or topology.name
    host_names = list(topology.hosts)
    hosted = set(host_names)
    # Aggregate directed inter-host bandwidth between nodes: ("h", host) or ("s", network device).
    rate: dict[tuple[tuple[str, str], tuple[str, str]], float] = {}
    for link in topology.datasheet or topology.links:  # a calibrated topology's cluster is the file's
        if not is_inter_host(topology, link.src, link.dst):
            continue
        ends = []
        for name in (link.src, link.dst):
            dom = topology.device(name).domain
            ends.append(("s", name) if dom is None else ("h", dom))
        if any(kind == "h" and n not in hosted for kind, n in ends):
            continue  # a host without ranks (storage, CPU-only) is not emulated
        key = (ends[0], ends[1])
        rate[key] = rate.get(key, 0.0) + link.bandwidth * scale
    graph: nx.Graph[tuple[str, str]] = nx.Graph()
    graph.add_nodes_from(("h", h) for h in host_names)
    graph.add_edges_from(rate)
    for h in host_names:
        peers = sorted(n for _, n in graph.adj[("h", h)])
        if len(peers) > 1:
            raise TopologyError(
                f"host {h!r} is wired to several switches or hosts ({', '.join(peers)})", where=where,
                fix="the emulation gives each host one interface on one switch; join its NICs to one switch")
    switches = graph.subgraph(n for n in graph if n[0] == "s")
    if switches.number_of_nodes() and not nx.is_forest(switches):
        loop = nx.find_cycle(switches)
        raise TopologyError(
            f"the switches form a loop ({' - '.join(a[1] for a, _ in loop)})", where=where,
            fix="the emulation bridges switches without spanning tree, so they must form a tree")
    first = ("h", host_names[0])
    reach = nx.node_connected_component(graph, first)
    for h in host_names:
        if ("h", h) not in reach:
            raise TopologyError(f"hosts {host_names[0]!r} and {h!r} are not joined by switches", where=where,
                                fix="the emulation routes only through switches and NICs outside hosts")

    base = f"{prefix}{os.getpid()}x{tag}"
    iface = f"{prefix}0"
    hosts: list[EmulatedHost] = []
    host_ns: dict[str, str] = {}
    for i, h in enumerate(host_names):
        ns = f"{base}-h{i}"
        host_ns[h] = ns
        hosts.append(EmulatedHost(h, ns, iface, f"10.213.{i // 256}.{i % 256 + 1}", topology.hosts[h]))
    if len(host_names) > 65000:
        raise TopologyError(f"{len(host_names)} hosts is too many to emulate", where=where)
    fabric = f"{base}-f" if any(n[0] == "s" for n in reach) else None
    bridge_of = {n: f"b{j}" for j, n in enumerate(sorted(n for n in reach if n[0] == "s"))}

    wires: list[Wire] = []
    seen: set[frozenset[tuple[str, str]]] = set()
    for x, y in sorted(rate):
        pair = frozenset((x, y))
        if pair in seen or x not in reach:
            continue
        seen.add(pair)
        forward = rate[(x, y)]
        backward = rate.get((y, x), forward)  # a one-way link: the veth is two-way, shape it alike
        if x[0] == "h" and y[0] == "s":
            x, y, forward, backward = y, x, backward, forward  # the fabric end first
        if x[0] == "s" and y[0] == "h":
            k = host_names.index(y[1])
            wires.append(Wire(fabric or "", f"p{k}", bridge_of[x], forward,
                              host_ns[y[1]], iface, None, backward, f"{x[1]} <-> host {y[1]}"))
        elif x[0] == "s":
            k = len(wires)
            wires.append(Wire(fabric or "", f"s{k}a", bridge_of[x], forward,
                              fabric or "", f"s{k}b", bridge_of[y], backward, f"{x[1]} <-> {y[1]}"))
        else:
            wires.append(Wire(host_ns[x[1]], iface, None, forward, host_ns[y[1]], iface, None, backward,
                              f"host {x[1]} <-> host {y[1]}"))
    for w in wires:
        for dev in (w.a_dev, w.b_dev):
            if len(dev) > _IFNAMSIZ:
                raise TopologyError(f"interface name {dev!r} is longer than {_IFNAMSIZ} characters")
    return EmulationPlan(tuple(hosts), fabric, tuple((d, n[1]) for n, d in bridge_of.items()), tuple(wires), scale)


def scaled_topology(topology: Topology, scale: float) -> Topology:
    """``topology`` with every inter-host link's bandwidth times ``scale``: what the emulated run should match.

    Intra-host links keep their bandwidth (the emulation does not shape the namespace loopback, which
    is far faster than the scaled network); latencies are kept (see the module notes).  A calibrated
    topology measured on an emulated cluster holds that cluster's figures (at the calibration's scale):
    its calibrated links are scaled by ``scale`` over that one, and it keeps its calibration.
    """
    cal = topology.calibration
    classes = link_classes_of(topology) if cal is not None else {}

    def factor(link: Link) -> float:
        if not is_inter_host(topology, link.src, link.dst):
            return 1.0
        if cal is not None and classes[(link.src, link.dst)] in cal.links:
            return scale / cal.scale
        return scale

    links = [replace(link, bandwidth=link.bandwidth * f) if (f := factor(link)) != 1.0 else link
             for link in topology.links]
    scaled = build_topology(f"{topology.name} (emulated x{scale:g})", topology.devices, links,
                            description=topology.description, source=topology.source, routing=topology.routing)
    return replace(scaled, calibration=cal, ranks=topology.ranks)  # a process group's subset stays one


def scale_for_rate(topology: Topology, bits_per_s: float) -> float:
    """The scale that makes the fastest inter-host link run at ``bits_per_s`` (e.g. ``100e6``)."""
    fastest = max((link.bandwidth for link in topology.links if is_inter_host(topology, link.src, link.dst)),
                  default=0.0)
    if fastest <= 0:
        raise TopologyError("the topology has no links between hosts to scale", where=topology.name)
    return bits_per_s / 8 / fastest


# --------------------------------------------------------------------------- system calls


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise TopoccError(f"'{name}' (iproute2) is not installed", fix="install iproute2")
    return path


def _call(argv: Sequence[str], timeout_s: float) -> str:
    """Run one ``ip``/``tc`` command, bounded; any failure is an :class:`TopoccError` naming it."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise TopoccError(f"'{shlex.join(argv)}' ran longer than {timeout_s:g} s") from None
    except OSError as exc:
        raise TopoccError(f"'{shlex.join(argv)}' could not start: {exc}") from None
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split())[:300]
        raise TopoccError(f"'{shlex.join(argv)}' failed (exit {done.returncode}): {detail}")
    return done.stdout


def _namespaces(timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Names of the existing network namespaces (``ip netns list`` prints ``name (id: N)``)."""
    return [line.split()[0] for line in _call([_tool("ip"), "netns", "list"], timeout_s).splitlines() if line.strip()]


def _namespace_pids(ns: str, timeout_s: float) -> list[int]:
    try:
        out = _call([_tool("ip"), "netns", "pids", ns], timeout_s)
    except TopoccError:
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_namespace_processes(namespaces: Iterable[str], timeout_s: float) -> None:
    """SIGKILL every process left inside our namespaces (all started by us), wait for them to go, and list the
    namespaces again until none is left: a process that entered one meanwhile (an ``ip netns exec`` started
    just before, between opening the namespace and joining it) would otherwise outlive it."""
    namespaces = list(namespaces)
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [p for ns in namespaces for p in _namespace_pids(ns, timeout_s)]
        if not pids or time.monotonic() >= deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) != "Z"]
            if pids:
                time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _delete_namespaces(namespaces: Iterable[str], timeout_s: float) -> list[str]:
    """Delete namespaces (their veths and bridges go with them); returns one message per failure."""
    namespaces = list(namespaces)
    _kill_namespace_processes(namespaces, timeout_s)
    errors = []
    for ns in namespaces:
        try:
            _call([_tool("ip"), "netns", "delete", ns], timeout_s)
        except TopoccError as exc:
            errors.append(exc.message)
    return errors


@functools.lru_cache(maxsize=1)
def emulation_available() -> str | None:
    """``None`` if this machine can build emulated clusters, else why not (tests skip with it).

    Checks for root, ``ip`` and ``tc``, then builds and removes a namespace with a bridge, a veth
    pair and a token bucket (the kernel may lack any of them).
    """
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            return f"'{tool}' (iproute2) is not installed"
    ns = f"tcc{os.getpid()}x0-probe"  # named so that cleanup_stale() finds it if this process dies here
    ip, tc = _tool("ip"), _tool("tc")
    try:
        _call([ip, "netns", "add", ns], DEFAULT_TIMEOUT_S)
        try:
            _call([ip, "-n", ns, "link", "add", "pb", "type", "bridge"], DEFAULT_TIMEOUT_S)
            _call([ip, "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pc"], DEFAULT_TIMEOUT_S)
            _call([tc, "-n", ns, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "1mbit", "burst", "32768",
                   "limit", "65536"], DEFAULT_TIMEOUT_S)
        finally:
            _call([ip, "netns", "delete", ns], DEFAULT_TIMEOUT_S)
    except TopoccError as exc:
        return f"cannot build an emulated network here: {exc.message}"
    return None


def cleanup_stale(prefix: str = "tcc", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Remove the namespaces (with their veths and bridges) of emulated clusters whose process has died.

    Names embed the owner's pid (``<prefix><pid>x<n>-...``); clusters of live processes are left
    alone, so this is safe beside running emulations.  Returns how many namespaces were removed.
    """
    if not _PREFIX_RE.match(prefix):
        raise TopoccError(f"bad emulation prefix {prefix!r}", fix="use 1-8 lowercase letters and digits")
    pattern = re.compile(rf"^{prefix}(\d+)x\d+-(f|h\d+|probe)$")
    stale = []
    for ns in _namespaces(timeout_s):
        m = pattern.match(ns)
        if m and not _alive(int(m.group(1))):
            stale.append(ns)
    errors = _delete_namespaces(stale, timeout_s)
    if errors:
        raise TopoccError("; ".join(errors))
    return len(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------- the cluster


class EmulatedCluster:
    """A topology's hosts as network namespaces joined by a shaped, bridged network (a context manager).

    ``scale`` multiplies every inter-host bandwidth (1e-3 turns 100 Gbit/s into 100 Mbit/s); pick it so
    that the emulated network, not the machine's CPUs, limits the run: on 2 cores keep the busiest links
    at a few hundred Mbit/s or less (:data:`DEFAULT_SCALE`; :func:`scale_for_rate` helps).
    ``timeout_s`` bounds each ``ip``/``tc`` call made to build or remove the cluster.
    """

    def __init__(self, topology: Topology, *, scale: float = DEFAULT_SCALE, prefix: str = "tcc",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.topology = topology
        self.scale = scale
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.plan = plan_emulation(topology, scale=scale, prefix=prefix, tag=str(next(_instances)))
        self._created: list[str] = []
        self._up = False

    @property
    def hosts(self) -> tuple[EmulatedHost, ...]:
        """The emulated hosts, in the order of their first rank."""
        return self.plan.hosts

    def host_of(self, rank: int) -> EmulatedHost:
        """The emulated host that runs ``rank``."""
        for h in self.plan.hosts:
            if rank in h.ranks:
                return h
        raise TopoccError(f"rank {rank} is not in the topology ({self.topology.size} ranks)")

    # ------------------------------------------------------------- lifecycle

    def __enter__(self) -> EmulatedCluster:
        if self._up:
            raise TopoccError("the emulated cluster is already up")
        try:
            self._build()
        except BaseException:
            self._teardown()
            raise
        self._up = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        errors = self._teardown()
        self._up = False
        if errors and exc is None:
            raise TopoccError("removing the emulated cluster failed: " + "; ".join(errors))

    def _ns_add(self, ns: str) -> None:
        _call([_tool("ip"), "netns", "add", ns], self.timeout_s)
        self._created.append(ns)

    def _build(self) -> None:
        ip, tc, t = _tool("ip"), _tool("tc"), self.timeout_s
        plan = self.plan
        if plan.fabric:
            self._ns_add(plan.fabric)
            for dev, _ in plan.bridges:
                _call([ip, "-n", plan.fabric, "link", "add", dev, "type", "bridge"], t)
                _call([ip, "-n", plan.fabric, "link", "set", dev, "up"], t)
        for h in plan.hosts:
            self._ns_add(h.namespace)
            _call([ip, "-n", h.namespace, "link", "set", "lo", "up"], t)
        for w in plan.wires:
            _call([ip, "-n", w.a_ns, "link", "add", w.a_dev, "type", "veth", "peer", "name", w.b_dev,
                   "netns", w.b_ns], t)
            for ns, dev, bridge, rate in ((w.a_ns, w.a_dev, w.a_bridge, w.a_rate),
                                          (w.b_ns, w.b_dev, w.b_bridge, w.b_rate)):
                if bridge:
                    _call([ip, "-n", ns, "link", "set", dev, "master", bridge], t)
                burst = int(max(TBF_MIN_BURST, rate * TBF_BURST_S))
                limit = int(max(4 * burst, rate * TBF_QUEUE_S))
                _call([tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{round(rate * 8)}bit",
                       "burst", str(burst), "limit", str(limit)], t)
                _call([ip, "-n", ns, "link", "set", dev, "up"], t)
        for h in plan.hosts:
            if any(h.namespace in (w.a_ns, w.b_ns) for w in plan.wires):
                _call([ip, "-n", h.namespace, "addr", "add", f"{h.address}/16", "dev", h.interface], t)

    def _teardown(self) -> list[str]:
        created, self._created = self._created, []
        return _delete_namespaces(reversed(created), self.timeout_s)

    def link_stats(self) -> dict[str, dict[str, int]]:
        """What the shaped network did so far: per wire end (``ns/dev``) the bytes sent and packets dropped by
        its token bucket, and per host namespace the TCP segments retransmitted (drops that cost a timeout)."""
        tc, ip, t = _tool("tc"), _tool("ip"), self.timeout_s
        stats: dict[str, dict[str, int]] = {}
        for w in self.plan.wires:
            for ns, dev in ((w.a_ns, w.a_dev), (w.b_ns, w.b_dev)):
                found = _QDISC_SENT_RE.search(_call([tc, "-s", "-n", ns, "qdisc", "show", "dev", dev], t))
                if found:
                    stats[f"{ns}/{dev}"] = {"sent_bytes": int(found[1]), "dropped": int(found[2])}
        for h in self.plan.hosts:
            rows = [line.split() for line in _call([ip, "netns", "exec", h.namespace, "cat", "/proc/net/snmp"],
                                                   t).splitlines() if line.startswith("Tcp:")]
            if len(rows) == 2 and "RetransSegs" in rows[0]:
                stats[h.namespace] = {"tcp_retransmitted": int(rows[1][rows[0].index("RetransSegs")])}
        return stats

    # ------------------------------------------------------------- commands

    def host_command(self, host: EmulatedHost | str | int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside a host's namespace (``host``: an :class:`EmulatedHost`, its name or index)."""
        if isinstance(host, int):
            host = self.plan.hosts[host]
        elif isinstance(host, str):
            found = [h for h in self.plan.hosts if h.name == host]
            if not found:
                raise TopoccError(f"no host {host!r} in the emulated cluster")
            host = found[0]
        return [_tool("ip"), "netns", "exec", host.namespace, *argv]

    def mpiexec_command(self, argv: Sequence[str], *, python: str = sys.executable,
                        env: Mapping[str, str] | None = None, mpiexec: str | None = None) -> list[str]:
        """An MPICH ``mpiexec`` line running ``python argv...`` as every rank, each in its host's namespace.

        One ``-n 1`` block per rank (``:``-separated), in rank order, each pinned by ``FI_TCP_IFACE``
        to its host's interface; :data:`MPI_ENV` (plus ``env``) for all, so that ranks on different
        hosts talk over the shaped network and ranks on one host over its loopback.
        """
        launcher = find_mpiexec(mpiexec, python=python)
        cmd = [launcher, "-launcher", "fork"]
        for key, value in {**MPI_ENV, **(env or {})}.items():
            cmd += ["-genv", key, str(value)]
        ip = _tool("ip")
        for rank in range(self.topology.size):
            h = self.host_of(rank)
            if rank:
                cmd.append(":")
            cmd += ["-n", "1", "-env", "FI_TCP_IFACE", h.interface, ip, "netns", "exec", h.namespace, python, *argv]
        return cmd

    def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (from the machine's namespace) while the cluster is up, killed after ``timeout_s``.

        Returns the completed process (output captured as text; a non-zero exit is the caller's to
        judge).  On timeout the command's process group and every process left in the cluster's
        namespaces are killed and :class:`TopoccError` is raised.
        """
        if not self._up:
            raise TopoccError("the emulated cluster is not up", fix="use it inside 'with EmulatedCluster(...)'")
        argv = [str(a) for a in argv]
        full_env = None if env is None else {**os.environ, **env}
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True, env=full_env, cwd=cwd)
        except OSError as exc:
            raise TopoccError(f"'{shlex.join(argv[:4])} ...' could not start: {exc}") from None
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._stop(proc)
            raise TopoccError(f"'{shlex.join(argv[:4])} ...' ran longer than {timeout_s:g} s; it was killed",
                              fix="raise timeout_s (a smaller scale makes runs longer)") from None
        except BaseException:
            self._stop(proc)
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def _stop(self, proc: subprocess.Popen[str]) -> None:
        """Kill a command started by :meth:`run`: its process group, then what it left in our namespaces."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_namespace_processes(self._created, self.timeout_s)
        try:
            proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=self.timeout_s)

    def scaled_topology(self) -> Topology:
        """The topology as emulated: inter-host bandwidths times ``scale`` (see :func:`scaled_topology`)."""
        return scaled_topology(self.topology, self.scale)

    def describe(self) -> str:
        """The network layout, one line per namespace and wire (see :meth:`EmulationPlan.describe`)."""
        return self.plan.describe()
