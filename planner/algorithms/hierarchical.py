"""BlueConnect: reduce-scatter level by level up the hierarchy, all-gather back down.

Cho et al., "BlueConnect: Decomposing all-reduce for deep learning on
heterogeneous network hierarchy", SysML 2019, section 3: factor ``p = p1 x p2 x
p3`` along the hierarchy (GPUs in a host, hosts in a rack, racks), then run a
reduce-scatter among the ranks that differ only in the level-1 coordinate,
then among those that differ only in the level-2 coordinate on the part each
now owns, and so on; the all-gather retraces the stages in reverse.  Every
stage is a ring (a direct exchange for two members) on its own fabric, so each
level's links carry only that level's share of the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.algorithms import Options
from planner.algorithms._order import (
    chunk_runs,
    find_cycle,
    pieces,
    ring_all_gather,
    ring_reduce_scatter,
    single_rank,
    split,
)
from planner.builder import ScheduleBuilder
from planner.collectives import canonical_collective
from planner.errors import NotApplicableError
from planner.topology import Topology
from runtime.schedule import Chunk, Schedule

__all__ = ["Stage", "hierarchical", "stages"]

_MAX_CHUNKS = 4096


@dataclass(frozen=True, slots=True)
class Stage:
    """One level of the decomposition: its name and its groups, each a ring of ranks.

    A rank's position in its group's ring is its coordinate at this level.
    """

    level: str
    groups: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return len(self.groups[0])


def _ring(topology: Topology, members: list[int], level: str) -> tuple[int, ...]:
    if len(members) == 1:
        return tuple(members)
    found = find_cycle(topology, members)
    if found is None:
        raise NotApplicableError(
            f"hierarchical: the {level} group of ranks {members[:8]} has no ring over routable pairs"
        )
    return tuple(found)


def stages(topology: Topology) -> list[Stage]:
    """The non-trivial levels (host, rack, cluster), innermost first.

    Raises :class:`NotApplicableError` when hosts differ in size, racks in host
    count, or a host spans racks.
    """
    hosts = list(topology.hosts.values())
    sizes = {len(h) for h in hosts}
    if len(sizes) != 1:
        raise NotApplicableError(f"hierarchical needs equal-sized hosts (host sizes {sorted(sizes)})")
    rack_of: dict[int, str] = {}
    for name, ranks in topology.racks.items():
        for r in ranks:
            rack_of[r] = name
    racks: dict[str, list[tuple[int, ...]]] = {}
    for h in hosts:
        if len({rack_of[r] for r in h}) != 1:
            raise NotApplicableError(f"hierarchical: host of rank {h[0]} spans several racks")
        racks.setdefault(rack_of[h[0]], []).append(h)
    if len({len(v) for v in racks.values()}) != 1:
        raise NotApplicableError("hierarchical needs the same number of hosts in every rack")

    out: list[Stage] = []
    coord: dict[int, tuple[int, ...]] = {r: () for r in range(topology.size)}

    def add(level: str, groups: list[list[int]]) -> None:
        if len(groups[0]) == 1:
            return
        rings = tuple(_ring(topology, g, level) for g in groups)
        for rg in rings:
            for i, r in enumerate(rg):
                coord[r] = (*coord[r], i)
        out.append(Stage(level, rings))

    add("host", [list(h) for h in hosts])
    # level 2: within a rack, the ranks with the same host-level coordinate, one per host
    rack_groups: list[list[int]] = []
    for rack_hosts in racks.values():
        by: dict[tuple[int, ...], list[int]] = {}
        for h in rack_hosts:
            for r in h:
                by.setdefault(coord[r], []).append(r)
        rack_groups.extend(by.values())
    add("rack", rack_groups)
    # level 3: across racks, the ranks with the same coordinates inside their rack
    by3: dict[tuple[int, ...], list[int]] = {}
    for rack_hosts in racks.values():
        for h in rack_hosts:
            for r in h:
                by3.setdefault(coord[r], []).append(r)
    add("cluster", list(by3.values()))
    return out


def hierarchical(topology: Topology, collective: str, options: Options) -> Schedule:
    """BlueConnect schedule for allreduce, reducescatter or allgather."""
    collective = canonical_collective(collective)
    if collective not in ("allreduce", "reducescatter", "allgather"):
        raise NotApplicableError(
            f"hierarchical does not implement {collective} (it builds allreduce, reducescatter, allgather)"
        )
    p = topology.size
    meta = options.as_dict()
    if p == 1:
        return single_rank(collective, 1, 1, "hierarchical", meta)
    levels = stages(topology)
    meta["levels"] = [f"{s.level}:{s.size}" for s in levels]

    # A rank's virtual block: its coordinates read as a mixed-radix number, innermost level most
    # significant, so that every stage's group shares one contiguous range of virtual blocks.
    position: list[dict[int, int]] = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block: dict[int, int] = {}
    for r in range(p):
        v = 0
        for s, pos in zip(levels, position):
            v = v * s.size + pos[r]
        block[r] = v
    owner = {v: r for r, v in block.items()}

    if collective == "allreduce":
        q = pieces(options.pipeline, options.size_bytes / p, max(1, _MAX_CHUNKS // p))
        k, buffer = q, "o"
        b = ScheduleBuilder(collective, p, p * q, p * q)
        for r in range(p):
            b.copy(r, Chunk("i", 0, p * q), Chunk("o", 0, p * q))

        def refs(lo: int, hi: int) -> list[Chunk]:
            # a part travels as q pieces whatever its size, so later stages pipeline as well as the first
            return split(lo * q, (hi - lo) * q, q)
    else:
        k, buffer = 1, "s" if collective == "reducescatter" else "o"
        if collective == "reducescatter":
            b = ScheduleBuilder(collective, p, p, 1, scratch_chunks=p)
            for r in range(p):
                b.copy(r, Chunk("i", 0, p), Chunk("s", 0, p))
        else:
            b = ScheduleBuilder(collective, p, 1, p)
            for r in range(p):
                b.copy(r, Chunk("i", 0), Chunk("o", r))

        def refs(lo: int, hi: int) -> list[Chunk]:
            # virtual blocks lo..hi are the physical blocks of their owners
            return chunk_runs(buffer, [owner[v] for v in range(lo, hi)])
    meta["pipeline"] = k

    def part_ranges(stage: int, group: Sequence[int]) -> list[tuple[int, int]]:
        """The virtual-block range each member of ``group`` owns after ``stage``'s reduce-scatter."""
        span = 1
        for s in levels[stage:]:
            span *= s.size
        base = block[group[0]] // span * span
        sub = span // levels[stage].size
        return [(base + i * sub, base + (i + 1) * sub) for i in range(len(group))]

    step = 0
    if collective != "allgather":
        for si, s in enumerate(levels):
            for g in s.groups:
                parts = [refs(lo, hi) for lo, hi in part_ranges(si, g)]
                ring_reduce_scatter(b, g, parts, step=step)
            step += s.size - 1
    if collective == "reducescatter":
        for r in range(p):
            b.copy(r, Chunk("s", r), Chunk("o", 0), step=step)
        return b.build("hierarchical", meta)
    for si in reversed(range(len(levels))):
        s = levels[si]
        for g in s.groups:
            parts = [refs(lo, hi) for lo, hi in part_ranges(si, g)]
            ring_all_gather(b, g, parts, step=step)
        step += s.size - 1
    return b.build("hierarchical", meta)
