"""``nvidia-smi topo -m`` output -> topology YAML.

The matrix gives, for every pair of GPUs and NICs, either the number of bonded
NVLinks (``NV#``) or how PCIe connects them: ``PIX`` (one switch), ``PXB``
(several switches, no host bridge), ``PHB`` (through a host bridge), ``NODE``
(between host bridges of one NUMA node), ``SYS`` / ``SOC`` (across the SMP
interconnect).  Where a pair has NVLink the PCIe relation is not shown.

The model built from it:

* one ``cpu`` per NUMA node: devices related by ``PIX``..``NODE``, or GPUs with the
  same NUMA (else CPU) affinity, share one; groups with no ``SYS`` between them
  are merged (an NVLink-only pair says nothing, so one CPU is the default);
  CPUs are joined all-to-all by SMP links;
* ``PIX`` groups hang off one PCIe switch, a ``PXB`` group of several of them off
  a further switch above; where a NUMA node shows ``NODE``, each host bridge
  group gets its own ``pcie`` device under the CPU;
* ``NV#``: ``#`` NVLink lanes.  Rule for NVSwitch: when every GPU pair shows the
  same ``NV#`` and ``# x (GPUs - 1)`` exceeds the NVLinks any GPU has
  (:data:`MAX_NVLINKS_PER_GPU`), the links cannot be direct, so the GPUs are
  switched (DGX-2: NV6 x 15 peers; DGX A100: NV12 x 7; HGX H100: NV18 x 7), and
  each GPU gets ``#`` lanes to one ``nvswitch``.  Otherwise (DGX-1's cube mesh,
  a 4-GPU NV4 full mesh, an NVLink bridge pair) the links are direct.
"""

from __future__ import annotations

import re
from pathlib import Path

from topocc.planner.errors import TopologyError
from topocc.planner.formats._emit import ImportedTopology, TopologyText
from topocc.planner.units import UnitError, parse_bandwidth

__all__ = ["MAX_NVLINKS_PER_GPU", "convert_nvidia_smi", "import_nvidia_smi"]

#: The most NVLinks one GPU has (H100/H200/B200: 18); more lanes than this to its peers means a switch.
MAX_NVLINKS_PER_GPU = 18
NVLINK_LATENCY = 0.7e-6  # per direct link; split over the two hops through an NVSwitch
PCIE_LATENCY = 0.5e-6  # per PCIe hop
SMP_LATENCY = 0.5e-6
_PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE")
_TRAILING = {"CPU", "NUMA", "GPU", "Affinity", "ID"}
_NV = re.compile(r"^NV(\d+)$")


def _bandwidth(value: str | float, what: str) -> float:
    """A bandwidth argument: text with its unit (``"25 GB/s"``), or a number of bytes/s (Python's own unit)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    try:
        return parse_bandwidth(value)
    except UnitError as exc:
        raise TopologyError(f"bad {what}: {exc}", fix="write e.g. '25 GB/s'") from None


def _text(text_or_path: str | Path) -> tuple[str, str]:
    """(text, name for messages): a Path or a one-line string is a file; text has newlines."""
    if isinstance(text_or_path, str) and "\n" in text_or_path:
        return text_or_path, "<nvidia-smi topo -m>"
    path = Path(text_or_path)
    try:
        return path.read_text(encoding="utf-8", errors="replace"), str(path)
    except FileNotFoundError:
        raise TopologyError("no such file", where=str(path), fix="save `nvidia-smi topo -m` output to it") from None
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror}", where=str(path)) from None


def import_nvidia_smi(text_or_path: str | Path, *, nvlink_bandwidth: str | float = "25 GB/s",
                      pcie_bandwidth: str | float | None = None, smp_bandwidth: str | float = "20 GB/s",
                      nvswitch: bool | None = None, name: str | None = None) -> str:
    """Topology YAML (explicit form) from ``nvidia-smi topo -m`` output (text or a file path).

    Bandwidths are text with a unit, or numbers of bytes/s.  ``nvlink_bandwidth`` is per lane;
    ``pcie_bandwidth`` defaults by NVLink generation
    (NV18: PCIe 5 x16, 64 GB/s; NV12: PCIe 4, 32 GB/s; else PCIe 3, 16 GB/s);
    ``nvswitch`` forces (True) or forbids (False) the NVSwitch model instead of the
    rule in the module docstring.

    >>> yaml_text = import_nvidia_smi("topo.txt")  # doctest: +SKIP
    """
    return convert_nvidia_smi(text_or_path, nvlink_bandwidth=nvlink_bandwidth, pcie_bandwidth=pcie_bandwidth,
                              smp_bandwidth=smp_bandwidth, nvswitch=nvswitch, name=name).yaml


class _Matrix:
    """The parsed table: device names, cells, trailing affinity columns per row."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        lines = text.splitlines()
        header_at = next((i for i, ln in enumerate(lines) if _is_header(ln.split())), None)
        if header_at is None:
            raise TopologyError("no header row with GPU0 found", where=source,
                                fix="pass the output of `nvidia-smi topo -m`")
        tokens = lines[header_at].split()
        n = next((i for i, t in enumerate(tokens) if t in _TRAILING), len(tokens))
        self.names = tokens[:n]
        trailing = " ".join(tokens[n:])
        self.extra = [label for label in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID") if label in trailing]
        self.cells: dict[str, list[str]] = {}
        self.affinity: dict[str, dict[str, str]] = {}
        self.legend: dict[str, str] = {}
        row = 0
        for lineno, line in enumerate(lines[header_at + 1:], start=header_at + 2):
            toks = line.split()
            if not toks:
                if row:
                    break
                continue
            if toks[0].rstrip(":") == "Legend":
                break
            where = f"{source}:{lineno}"
            if row >= len(self.names):
                raise TopologyError(f"unexpected row {toks[0]!r} after the {len(self.names)} device rows",
                                    where=where, fix="remove it, or add its column to the header")
            if toks[0] != self.names[row]:
                raise TopologyError(f"row {toks[0]!r} where the header says {self.names[row]!r}", where=where,
                                    fix="rows must follow the header's column order")
            if len(toks) < len(self.names) + 1:
                raise TopologyError(f"ragged row: {len(toks) - 1} cells for {len(self.names)} columns",
                                    where=where, fix="the table was truncated or mangled when copied")
            cells = toks[1:len(self.names) + 1]
            for j, cell in enumerate(cells):
                if cell != "X" and cell not in _PCIE_LEVELS and cell not in ("SYS", "SOC") and not _NV.match(cell):
                    raise TopologyError(f"unknown cell {cell!r} in column {self.names[j]}", where=where,
                                        fix="cells are X, NV#, PIX, PXB, PHB, NODE, SYS or SOC")
                if (cell == "X") != (j == row):
                    raise TopologyError(f"cell {cell!r} in column {self.names[j]}: 'X' belongs on the diagonal "
                                        "only", where=where)
            self.cells[toks[0]] = cells
            self.affinity[toks[0]] = dict(zip(self.extra, toks[len(self.names) + 1:]))
            row += 1
        if row < len(self.names):
            raise TopologyError(f"{row} rows for {len(self.names)} header columns (missing {self.names[row]})",
                                where=source, fix="paste the whole table")
        for line in lines:
            m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
            if m:
                self.legend[m.group(1)] = m.group(2)
        self.gpus = [x for x in self.names if re.fullmatch(r"GPU\d+", x)]
        if not self.gpus:
            raise TopologyError("no GPU rows", where=source, fix="pass the output of `nvidia-smi topo -m`")
        self.index = {x: i for i, x in enumerate(self.names)}
        for a in self.names:
            for b in self.names:
                if a < b and _NV.match(self.cell(a, b)) and self.cell(a, b) != self.cell(b, a):
                    raise TopologyError(f"{a}-{b} is {self.cell(a, b)} but {b}-{a} is {self.cell(b, a)}",
                                        where=source, fix="the matrix must be symmetric")

    def cell(self, a: str, b: str) -> str:
        return self.cells[a][self.index[b]]


def _is_header(tokens: list[str]) -> bool:
    return bool(tokens) and tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X")


class _Groups:
    """Union-find over device names."""

    def __init__(self, names: list[str]) -> None:
        self.parent = {x: x for x in names}

    def find(self, x: str) -> str:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb, key=self._order)] = min(ra, rb, key=self._order)

    def _order(self, x: str) -> int:
        return list(self.parent).index(x)

    def classes(self, members: list[str]) -> list[list[str]]:
        out: dict[str, list[str]] = {}
        for x in members:
            out.setdefault(self.find(x), []).append(x)
        return list(out.values())


def convert_nvidia_smi(text_or_path: str | Path, *, nvlink_bandwidth: str | float = "25 GB/s",
                       pcie_bandwidth: str | float | None = None, smp_bandwidth: str | float = "20 GB/s",
                       nvswitch: bool | None = None, name: str | None = None) -> ImportedTopology:
    """Like :func:`import_nvidia_smi`, also returning the notes (defaults used, assumptions)."""
    text, source = _text(text_or_path)
    m = _Matrix(text, source)
    nv_bw = _bandwidth(nvlink_bandwidth, "NVLink bandwidth")
    smp_bw = _bandwidth(smp_bandwidth, "SMP bandwidth")
    out = TopologyText(name or "nvidia-smi", f"imported from nvidia-smi topo -m ({Path(source).name})")
    lanes = {(a, b): int(nv.group(1))
             for a in m.gpus for b in m.gpus if a != b and (nv := _NV.match(m.cell(a, b)))}
    max_lanes = max(lanes.values(), default=0)
    if pcie_bandwidth is None:
        gen, pcie_bw = (5, 64e9) if max_lanes >= 18 else (4, 32e9) if max_lanes >= 12 else (3, 16e9)
        out.note(f"PCIe links default to PCIe {gen} x16, {pcie_bw / 1e9:g} GB/s (guessed from NV{max_lanes}; "
                 "override with pcie_bandwidth)")
    else:
        pcie_bw = _bandwidth(pcie_bandwidth, "PCIe bandwidth")
    out.note(f"NVLink: {nv_bw / 1e9:g} GB/s per lane; SMP (CPU-CPU) links: {smp_bw / 1e9:g} GB/s")
    if any(c == "SOC" for row in m.cells.values() for c in row):
        out.note("SOC (old drivers) read as SYS: across the SMP interconnect")

    host = "host0"
    gpu_name = {g: f"gpu{int(g[3:])}" for g in m.gpus}
    nics = [x for x in m.names if x not in gpu_name]
    nic_name = {x: _nic_name(m.legend.get(x, x)) for x in nics}
    dev_name = {**gpu_name, **nic_name}

    numa = _numa_groups(m)
    for g in m.gpus:
        out.device(gpu_name[g], "gpu", host)
    for x in nics:
        out.device(nic_name[x], "nic", host)
    cpus = []
    for i, group in enumerate(numa):
        cpu = out.device(f"cpu{i}", "cpu", host)
        cpus.append(cpu)
        _pcie_tree(m, out, group, cpu, dev_name, pcie_bw, host)
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            out.link(a, b, smp_bw, SMP_LATENCY, kind="smp")
    if len(numa) == 1 and len(m.gpus) > 1 and not any(c in _PCIE_LEVELS for r in m.cells.values() for c in r):
        out.note("the table shows no PCIe relation between devices; all are placed under one CPU")

    switched = _is_switched(m, lanes) if nvswitch is None else nvswitch and bool(lanes)
    if switched:
        k = max_lanes
        out.device("nvswitch", "nvswitch", host)
        for g in m.gpus:
            out.link(gpu_name[g], "nvswitch", nv_bw, NVLINK_LATENCY / 2, count=k, kind="nvlink")
        out.note(f"every GPU pair shows NV{k}: modelled as {k} NVLink lanes from each GPU to one NVSwitch")
    else:
        for (a, b), k in lanes.items():
            if a < b or (b, a) not in lanes:
                out.link(gpu_name[a], gpu_name[b], nv_bw, NVLINK_LATENCY, count=k, kind="nvlink")
    if not lanes and len(m.gpus) > 1:
        out.note("no NVLink in the table: GPUs communicate over PCIe")
    return out.result()


def _nic_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label)


def _is_switched(m: _Matrix, lanes: dict[tuple[str, str], int]) -> bool:
    """Every pair NV# with the same #, and more lanes than a GPU has: an NVSwitch (module docstring)."""
    n = len(m.gpus)
    if n < 3 or len(lanes) != n * (n - 1) or len(set(lanes.values())) != 1:
        return False
    k = next(iter(lanes.values()))
    return k * (n - 1) > MAX_NVLINKS_PER_GPU


def _numa_groups(m: _Matrix) -> list[list[str]]:
    """Devices per NUMA node (see the module docstring for the evidence used)."""
    g = _Groups(m.names)
    for a in m.names:
        for b in m.names:
            if m.cell(a, b) in _PCIE_LEVELS:
                g.union(a, b)
    for label in ("NUMA Affinity", "CPU Affinity"):
        values = {x: m.affinity[x].get(label, "N/A") for x in m.gpus}
        if any(v not in ("N/A", "") for v in values.values()):
            first: dict[str, str] = {}
            for x, v in values.items():
                if v not in ("N/A", ""):
                    g.union(x, first.setdefault(v, x))
            break
    far = {(g.find(a), g.find(b)) for a in m.names for b in m.names if m.cell(a, b) in ("SYS", "SOC")}
    for a, b in far:
        if a == b:
            x, y = next((x, y) for x in m.names for y in m.names
                        if g.find(x) == a and g.find(y) == a and m.cell(x, y) in ("SYS", "SOC"))
            raise TopologyError(f"{x} and {y} are {m.cell(x, y)} (different NUMA nodes) but other cells put "
                                "them on one NUMA node", where=m.source, fix="check the table for copy errors")
    roots = [r for r in dict.fromkeys(g.find(x) for x in m.names)]
    merged: list[list[str]] = []
    for r in roots:
        for group in merged:
            if not any((r, s) in far or (s, r) in far for s in group):
                group.append(r)
                break
        else:
            merged.append([r])
    return [[x for x in m.names if g.find(x) in group] for group in merged]


def _pcie_tree(m: _Matrix, out: TopologyText, members: list[str], cpu: str, dev_name: dict[str, str],
               bw: float, host: str) -> None:
    """Switches under one CPU: host bridges (where NODE shows), PXB groups, PIX groups."""
    def related(levels: tuple[str, ...]) -> list[list[str]]:
        g = _Groups(members)
        for a in members:
            for b in members:
                if m.cell(a, b) in levels:
                    g.union(a, b)
        return g.classes(members)

    node_seen = any(m.cell(a, b) == "NODE" for a in members for b in members)
    pxb = related(("PIX", "PXB"))
    pix = related(("PIX",))
    bridges = related(("PIX", "PXB", "PHB")) if node_seen else [members]
    for h, bridge in enumerate(bridges):
        top = cpu
        if node_seen:
            top = out.device(f"{cpu}_hb{h}", "pcie", host)
            out.link(top, cpu, bw, PCIE_LATENCY, kind="pcie")
        for s, group in enumerate(g for g in pxb if g[0] in bridge):
            if len(group) == 1:
                out.link(dev_name[group[0]], top, bw, PCIE_LATENCY, kind="pcie")
                continue
            sw = out.device(f"{top}_sw{s}", "pcie", host)
            out.link(sw, top, bw, PCIE_LATENCY, kind="pcie")
            leaves = [p for p in pix if p[0] in group]
            for t, leaf in enumerate(leaves):
                parent = sw
                if len(leaves) > 1 and len(leaf) > 1:
                    parent = out.device(f"{sw}_{t}", "pcie", host)
                    out.link(parent, sw, bw, PCIE_LATENCY, kind="pcie")
                for x in leaf:
                    out.link(dev_name[x], parent, bw, PCIE_LATENCY, kind="pcie")
