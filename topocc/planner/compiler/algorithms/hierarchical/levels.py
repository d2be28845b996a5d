"""The hierarchy's levels (host, rack, cluster) and the virtual blocks that number the ranks across them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from topocc.planner.compiler.algorithms._order import find_cycle, host_size
from topocc.planner.routing.network import Network
from topocc.runtime.collective import collective as describe

__all__ = ["Phase", "Stage", "VirtualBlocks", "phases_of", "ringed", "spans", "split", "stages", "virtual_blocks"]


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


class Phase(NamedTuple):
    """One level's reduce-scatter (``gather`` false) or all-gather: the unit that gets its own channels."""

    level: int
    gather: bool


def stages(net: Network) -> list[Stage]:
    """The non-trivial levels (host, rack, cluster), innermost first.

    Where racks differ in host count (a last leaf only partly filled, as real
    clusters grow), or a host spans racks, the racks are not a level: the
    hosts form one level above the host level, as if on one switch, since
    racks cut into unequal pieces would leave some groups short of members
    (see docs/algorithms.md).  Raises :class:`NotApplicableError` when hosts
    differ in size.
    """
    topology = net.topology
    hosts = list(topology.hosts.values())
    host_size(net, "hierarchical")
    racks = _racks(net, hosts)
    out: list[Stage] = []
    coord: dict[int, tuple[int, ...]] = {r: () for r in range(topology.size)}
    _add_level(net, out, coord, "host", [list(h) for h in hosts])
    # level 2: within a rack, the ranks with the same host-level coordinate, one per host
    rack_groups: list[list[int]] = []
    for rack_hosts in racks:
        rack_groups.extend(_by_coordinate(coord, rack_hosts).values())
    _add_level(net, out, coord, "rack", rack_groups)
    # level 3: across racks, the ranks with the same coordinates inside their rack
    _add_level(net, out, coord, "cluster", list(_by_coordinate(coord, [h for rh in racks for h in rh]).values()))
    return out


def _racks(net: Network, hosts: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """The hosts of each rack, or all hosts as one rack where racks differ in size or a host spans two."""
    rack_of = {r: name for name, ranks in net.topology.racks.items() for r in ranks}
    racks: dict[str, list[tuple[int, ...]]] = {}
    for h in hosts:
        racks.setdefault(rack_of[h[0]], []).append(h)
    if len({len(v) for v in racks.values()}) != 1 or any(len({rack_of[r] for r in h}) != 1 for h in hosts):
        return [hosts]
    return list(racks.values())


def _by_coordinate(coord: dict[int, tuple[int, ...]], hosts: list[tuple[int, ...]]) -> dict[tuple[int, ...], list[int]]:
    """The ranks of ``hosts`` grouped by their coordinates at the levels so far (in host order)."""
    by: dict[tuple[int, ...], list[int]] = {}
    for h in hosts:
        for r in h:
            by.setdefault(coord[r], []).append(r)
    return by


def _add_level(net: Network, out: list[Stage], coord: dict[int, tuple[int, ...]], level: str,
               groups: list[list[int]]) -> None:
    """Append the level of ``groups`` (each as a ring) unless it is trivial, extending every rank's coordinates."""
    if len(groups[0]) == 1:
        return
    stage = ringed(net, Stage(level, tuple(tuple(g) for g in groups)))
    for rg in stage.groups:
        for i, r in enumerate(rg):
            coord[r] = (*coord[r], i)
    out.append(stage)


def ringed(net: Network, stage: Stage) -> Stage:
    """``stage`` with each group reordered into a ring
    (:func:`~topocc.planner.compiler.algorithms._order.find_cycle`)."""
    return Stage(stage.level, tuple(tuple(find_cycle(net, g)) for g in stage.groups))


def split(stage: Stage, a: int) -> tuple[Stage, Stage]:
    """``stage`` as two levels: each group's ``a`` consecutive members, then the members ``a`` apart (groups in
    ``stage``'s order, not yet rings)."""
    n = stage.size
    return (Stage(stage.level, tuple(g[k * a:(k + 1) * a] for g in stage.groups for k in range(n // a))),
            Stage(stage.level, tuple(g[j::a] for g in stage.groups for j in range(a))))


def spans(levels: Sequence[Stage], p: int) -> list[int]:
    """The virtual blocks one group of each level covers."""
    out = [p]
    for s in levels[:-1]:
        out.append(out[-1] // s.size)
    return out


def phases_of(collective: str, levels: Sequence[Stage]) -> list[Phase]:
    """The phases in pipeline order: reduce-scatter up the levels, all-gather back down."""
    out: list[Phase] = []
    kind = describe(collective)
    if kind.reduces:
        out += [Phase(si, False) for si in range(len(levels))]
    if kind.replicates:
        out += [Phase(si, True) for si in reversed(range(len(levels)))]
    return out


@dataclass(frozen=True, slots=True)
class VirtualBlocks:
    """Each rank's position in its group at every level, and its virtual block (and the block's owner)."""

    position: list[dict[int, int]]
    block: dict[int, int]
    owner: dict[int, int]


def virtual_blocks(levels: Sequence[Stage], p: int) -> VirtualBlocks:
    """A rank's virtual block: its coordinates read as a mixed-radix number, innermost level most significant,
    so that every stage's group shares one contiguous range of virtual blocks."""
    position = [{r: i for g in s.groups for i, r in enumerate(g)} for s in levels]
    block: dict[int, int] = {}
    for r in range(p):
        v = 0
        for s, pos in zip(levels, position):
            v = v * s.size + pos[r]
        block[r] = v
    return VirtualBlocks(position, block, {v: r for r, v in block.items()})
