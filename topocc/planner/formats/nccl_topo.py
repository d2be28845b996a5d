"""NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``) -> topology YAML.

``<system version="1">`` holds ``<cpu numaid arch vendor>`` elements, each a PCI
tree of ``<pci busid class link_speed link_width>``: bridges (class 0x0604..)
become ``pcie`` switches, display/3D controllers (0x03....) GPUs, network
controllers (0x02....) NICs.  A full dump adds ``<gpu sm rank>`` with
``<nvlink target count tclass>`` (tclass 0x068000, or the target
``fffffff:ff:ff.0`` that NVML cannot see, is an NVSwitch; all NVSwitches become
one ``nvswitch`` device, as NCCL itself merges them) and ``<nic><net speed>``.

Bandwidths the file does not give are defaults, each listed in the notes:
PCIe from ``link_speed`` x ``link_width`` (GT/s x lanes / 8 x line-code
efficiency: 8b/10b up to 5 GT/s, 128b/130b above), NVLink per lane by ``sm``,
NIC from ``speed`` (Mb/s), the inter-CPU (SMP) link by CPU vendor.  GPUs are
ranks in ``<gpu rank>`` order, else ``dev`` order, else PCI bus id order (the
order of ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from topocc.planner.errors import TopologyError
from topocc.planner.formats._emit import ImportedTopology, TopologyText
from topocc.planner.formats._xml import read_text, read_xml

__all__ = ["convert_nccl_topo", "import_nccl_topo", "nvlink_lane_bandwidth", "pcie_bandwidth"]

INVISIBLE_NVSWITCH = "fffffff:ff:ff.0"
NVSWITCH_CLASS = 0x068000
DEFAULT_PCIE = (16.0, 16)  # GT/s and lanes assumed where the file gives none (PCIe 4 x16)
#: Inter-socket bandwidth by CPU vendor (bytes/s): UPI/QPI for Intel, xGMI for AMD.
SMP_BANDWIDTH = {"GenuineIntel": 20e9, "AuthenticAMD": 32e9, "power": 32e9, "arm": 20e9}
SMP_DEFAULT = 20e9
NVLINK_LATENCY = 0.7e-6
PCIE_LATENCY = 0.5e-6
SMP_LATENCY = 0.5e-6
NIC_LATENCY = 0.5e-6


def pcie_bandwidth(link_speed: str, link_width: int) -> float:
    """Bytes/s of a PCIe link from NCCL's ``link_speed`` ("16 GT/s", "32.0 GT/s PCIe") and width.

    >>> round(pcie_bandwidth("16.0 GT/s PCIe", 16) / 1e9, 1)
    31.5
    """
    m = re.match(r"\s*([0-9.]+)\s*GT/s", link_speed)
    if not m:
        raise ValueError(link_speed)
    rate = float(m.group(1))
    efficiency = 0.8 if rate <= 5.0 else 128 / 130
    return rate * 1e9 * link_width * efficiency / 8


def nvlink_lane_bandwidth(sm: int | None) -> float:
    """Bytes/s per NVLink lane and direction by compute capability (NVLink 1: 20, 2-4: 25, 5: 50 GB/s)."""
    if sm is None:
        return 25e9
    if sm < 70:
        return 20e9
    if sm < 100:
        return 25e9
    return 50e9


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


@dataclass
class _Gpu:
    busid: str
    parent: str
    link_bw: float
    sm: int | None = None
    dev: int | None = None
    rank: int | None = None
    nvlinks: list[tuple[str, int, int | None]] = field(default_factory=list)  # target, count, tclass
    name: str = ""


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.out = TopologyText("nccl-topo", f"imported from NCCL topology XML ({Path(source).name})")
        self.gpus: list[_Gpu] = []
        self.nics: list[tuple[str, str, float]] = []  # (name, parent, bandwidth)
        self.host = "host0"
        self.nic_count = 0
        self.switch_count = 0
        self.noted: set[str] = set()

    def note(self, text: str, once: str | None = None) -> None:
        """Add a note; with ``once``, only the first note of that kind (later devices share it)."""
        if once is not None:
            if once in self.noted:
                return
            self.noted.add(once)
        self.out.note(text)

    def link_bw(self, el: ET.Element) -> float:
        speed, width = (el.get("link_speed") or "").strip(), _int(el.get("link_width"))
        busid = el.get("busid", "?")
        if not width:
            width = DEFAULT_PCIE[1]
            self.note(f"PCIe link width missing (first at {busid}): assumed x{width}", once="width")
        try:
            return pcie_bandwidth(speed, width)
        except ValueError:
            bw = pcie_bandwidth(f"{DEFAULT_PCIE[0]} GT/s", width)
            self.note(f"PCIe link speed missing or unreadable (first at {busid}): assumed "
                      f"{DEFAULT_PCIE[0]:g} GT/s, {bw / 1e9:.3g} GB/s at x{width}", once="speed")
            return bw

    def walk(self, el: ET.Element, parent: str) -> None:
        for child in el:
            if child.tag == "pci":
                self.pci(child, parent)
            elif child.tag == "nic":
                self.nic(child, parent, None)

    def pci(self, el: ET.Element, parent: str) -> None:
        busid = (el.get("busid") or "").strip().lower()
        cls = _int(el.get("class"), 16)
        if cls is None:
            raise TopologyError(f"<pci busid={busid!r}> has no readable class", where=self.source,
                                fix='add class="0x030200" (GPU), "0x020700" (NIC) or "0x060400" (bridge)')
        bw = self.link_bw(el)
        if cls >> 16 == 0x06 and (cls >> 8) & 0xFF == 0x04:
            self.switch_count += 1
            name = self.out.device(f"pcie{self.switch_count - 1}", "pcie", self.host)
            self.out.link(name, parent, bw, PCIE_LATENCY, kind="pcie")
            self.walk(el, name)
        elif cls >> 16 == 0x03:
            gpu = _Gpu(busid, parent, bw)
            g = el.find("gpu")
            if g is not None:
                gpu.sm, gpu.dev, gpu.rank = _int(g.get("sm")), _int(g.get("dev")), _int(g.get("rank"))
                for nv in g.iter("nvlink"):
                    gpu.nvlinks.append(((nv.get("target") or "").strip().lower(), _int(nv.get("count")) or 1,
                                        _int(nv.get("tclass"), 16)))
            self.gpus.append(gpu)
        elif cls >> 16 == 0x02:
            nic = el.find("nic")
            if nic is not None:
                self.nic(nic, parent, bw)
            else:
                self.add_nic(parent, bw, None)
        else:
            self.note(f"PCI device {busid} of class {cls:#08x} is neither bridge, GPU nor NIC: ignored")

    def nic(self, el: ET.Element, parent: str, pcie_bw: float | None) -> None:
        nets = el.findall("net")
        if not nets:
            self.add_nic(parent, pcie_bw, None)
        for net in nets:
            speed = _int(net.get("speed"))
            self.add_nic(parent, pcie_bw, speed * 1e6 / 8 if speed else None, net.get("name"))

    def add_nic(self, parent: str, pcie_bw: float | None, port_bw: float | None, label: str | None = None) -> None:
        if pcie_bw is None and port_bw is None:
            pcie_bw = pcie_bandwidth(f"{DEFAULT_PCIE[0]} GT/s", DEFAULT_PCIE[1])
            self.note(f"a NIC with neither PCIe link nor speed: assumed {pcie_bw / 1e9:.3g} GB/s")
        if port_bw is None:
            self.note("NIC port speeds are not in the file: a NIC's link is its PCIe link (set the network "
                      "bandwidth when combining hosts)")
        bw = min(b for b in (pcie_bw, port_bw) if b is not None)
        name = self.out.device(f"nic{self.nic_count}", "nic", self.host)
        if label:
            self.note(f"{name} is {label}")
        self.nic_count += 1
        self.out.link(name, parent, bw, NIC_LATENCY, kind="pcie")


def import_nccl_topo(path: str | Path) -> str:
    """Topology YAML (explicit form) from an NCCL topology XML file; the notes are YAML comments.

    >>> yaml_text = import_nccl_topo("ndv4-topo.xml")  # doctest: +SKIP
    """
    return convert_nccl_topo(path).yaml


def convert_nccl_topo(path: str | Path, *, name: str | None = None) -> ImportedTopology:
    """Like :func:`import_nccl_topo`, also returning the notes (defaults used, what the file lacks)."""
    source = str(path)
    root = read_xml(read_text(path, TopologyError, "NCCL topology XML file"), source, TopologyError,
                    "NCCL topology XML file")
    if root.tag != "system":
        raise TopologyError(f"root element is <{root.tag}>, not <system>", where=source,
                            fix="pass an NCCL topology file (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE)")
    if (root.get("version") or "").strip() != "1":
        raise TopologyError(f"unsupported <system version={root.get('version')!r}>", where=source,
                            fix='topocc reads version="1"')
    r = _Reader(source)
    if name:
        r.out.name = name
    cpus = root.findall("cpu")
    if not cpus:
        raise TopologyError("no <cpu> elements", where=source, fix="the file is empty or not an NCCL topology")
    vendors = set()
    cpu_names: list[str] = []
    for i, cpu in enumerate(cpus):
        numa = _int(cpu.get("numaid"))
        cname = r.out.device(f"cpu{numa if numa is not None else i}", "cpu", r.host)
        if cname in cpu_names:
            cname = r.out.device(f"cpu{i}_{len(cpu_names)}", "cpu", r.host)
        cpu_names.append(cname)
        vendors.add(cpu.get("vendor") or cpu.get("arch") or "")
        r.walk(cpu, cname)
    if not r.gpus:
        raise TopologyError("no GPUs found (no <pci> of class 0x03....)", where=source,
                            fix="pass the NCCL topology of a machine with GPUs")
    vendor = next(iter(vendors)) if len(vendors) == 1 else ""
    smp = SMP_BANDWIDTH.get(vendor, SMP_DEFAULT)
    if len(cpu_names) > 1:
        r.note(f"CPU-CPU (SMP) links: {smp / 1e9:g} GB/s (default for {vendor or 'unknown vendor'})")
    for i, a in enumerate(cpu_names):
        for b in cpu_names[i + 1:]:
            r.out.link(a, b, smp, SMP_LATENCY, kind="smp")
    _add_gpus(r)
    return r.out.result()


def _add_gpus(r: _Reader) -> None:
    gpus = r.gpus
    if all(g.rank is not None for g in gpus):
        gpus.sort(key=lambda g: g.rank)  # type: ignore[arg-type,return-value]  # all ranks known (checked above)
    elif all(g.dev is not None for g in gpus):
        gpus.sort(key=lambda g: g.dev)  # type: ignore[arg-type,return-value]  # all devs known (checked above)
    else:
        gpus.sort(key=lambda g: g.busid)
    # GPUs first in the device list would be tidier, but ranks only need declaration order among GPUs.
    for i, g in enumerate(gpus):
        g.name = r.out.device(f"gpu{i}", "gpu", r.host)
        r.out.link(g.name, g.parent, g.link_bw, PCIE_LATENCY, kind="pcie")
        r.note(f"{g.name} is PCI {g.busid}")
    by_bus = {g.busid: g for g in gpus}
    if not any(g.nvlinks for g in gpus):
        r.note("the file describes the PCI tree only: no NVLink information (NCCL detects NVLink at run time; "
               "import `nvidia-smi topo -m` output or an NCCL_TOPO_DUMP_FILE for it)")
        return
    seen: set[tuple[str, str]] = set()
    for g in gpus:
        lane = nvlink_lane_bandwidth(g.sm)
        r.note(f"NVLink {lane / 1e9:g} GB/s per lane (sm {g.sm})" if g.sm is not None
               else "NVLink 25 GB/s per lane (no sm in the file)")
        to_switch = 0
        for target, count, tclass in g.nvlinks:
            if tclass == NVSWITCH_CLASS or target == INVISIBLE_NVSWITCH:
                to_switch += count
            elif target == g.busid:
                r.note(f"{g.name}: NVLink to itself ignored")
            elif tclass is not None and tclass >> 8 == 0x0604:
                r.out.link(g.name, g.parent, lane, NVLINK_LATENCY, count=count, kind="nvlink")
            elif target in by_bus:
                lo, hi = sorted((g.busid, target))
                key = (lo, hi)
                if key not in seen:
                    seen.add(key)
                    r.out.link(g.name, by_bus[target].name, lane, NVLINK_LATENCY, count=count, kind="nvlink")
            else:
                r.note(f"{g.name}: NVLink target {target} is not a GPU in the file: ignored")
        if to_switch:
            r.out.device("nvswitch", "nvswitch", r.host)
            r.out.link(g.name, "nvswitch", lane, NVLINK_LATENCY / 2, count=to_switch, kind="nvlink")
