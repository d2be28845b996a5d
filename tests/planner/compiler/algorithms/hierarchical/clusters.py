"""Small clusters for hierarchical's tests: hosts of GPUs on a switch each, their NICs on one top switch."""

from __future__ import annotations

from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text


def cluster(gpus: list[int], racks: int = 0) -> Topology:
    """Hosts of ``gpus[h]`` GPUs on a switch, NICs on a top switch, ``racks`` racks (0: no rack info)."""
    devices, links = ["devices:"], ["links:"]
    for h, n in enumerate(gpus):
        place = f"host: h{h}" + (f", rack: r{h * racks // len(gpus)}" if racks else "")
        devices += [f"  - {{name: h{h}g, type: gpu, count: {n}, {place}}}",
                    f"  - {{name: h{h}sw, type: nvswitch, {place}}}"]
        links += [f"  - {{ends: [h{h}g{i}, h{h}sw], bandwidth: 100 GB/s, latency: 1 us}}" for i in range(n)]
        links.append(f"  - {{ends: [h{h}sw, top], bandwidth: 10 GB/s, latency: 5 us}}")
    devices.append("  - {name: top, type: switch}")
    return parse_topology_text("\n".join(["name: cluster", *devices, *links]))
