"""The order in which a reduce-scatter's lower levels reduce the blocks: in waves, as the levels above need them.

Reduced all at once, every block of a phase is final only at its end, and the
phases run one after the other.  In waves the phase above starts on the first
wave while the phase below reduces the next, as an all-gather's lower phases
pass blocks on as they arrive: so even one slice keeps every level busy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from topocc.planner.compiler.algorithms._order import Send
from topocc.planner.compiler.algorithms.hierarchical.levels import Phase, Stage

__all__ = ["waves"]


def waves(levels: Sequence[Stage], phases: Sequence[Phase], steps: Mapping[Phase, list[list[Send]]],
          spans: Sequence[int], position: Sequence[Mapping[int, int]], block: Mapping[int, int],
          in_turn: bool, focus: frozenset[int] | None = None) -> dict[tuple[int, int], list[set[int]]]:
    """The virtual blocks of each group of a reduce-scatter's phases below the last, in *waves*: ``(phase,
    group's first rank) -> sets of virtual blocks``, in the order the phases above need them; only the groups
    with a rank of ``focus`` where it is given (a group's blocks span up to every rank's, so every group's
    waves take the groups times the ranks).

    A block's need is the step at which the last phase sends it on from where
    the phases below leave it (its send step there, or after the last step if
    its holder keeps it), then the same for the phase before, and so on down:
    so a host reduces first what its rack must pass on across the cluster
    first.  ``in_turn``: a direct phase's sends, all one step, count in the
    order a member walks its peers, so that a level below feeds that phase's
    first peer first (only with few slices: with many it timed slower).
    """
    first = _first_sends(levels, phases, steps, in_turn)
    group_of = {(si, r): g for si, s in enumerate(levels) for g in s.groups for r in g}

    def need(f: int, r: int, v: int) -> tuple[int, ...]:
        """Block ``v``'s need from phase ``f`` up, held by rank ``r`` as that phase starts: last phase first."""
        if f == len(phases):
            return ()
        si = phases[f][0]
        sub = spans[si] // levels[si].size
        part = (v - block[r] // spans[si] * spans[si]) // sub
        return (*need(f + 1, group_of[(si, r)][part], v), first[(si, position[si][r])][part])

    out: dict[tuple[int, int], list[set[int]]] = {}
    for f, (si, _) in enumerate(phases[:-1]):
        sub = spans[si] // levels[si].size
        for g in levels[si].groups:
            if focus is not None and focus.isdisjoint(g):
                continue
            base = block[g[0]] // spans[si] * spans[si]
            keyed: dict[tuple[int, ...], set[int]] = {}
            for v in range(base, base + spans[si]):
                keyed.setdefault(need(f + 1, g[(v - base) // sub], v), set()).add(v)
            out[(f, g[0])] = [keyed[key] for key in sorted(keyed)]
    return out


def _first_sends(levels: Sequence[Stage], phases: Sequence[Phase], steps: Mapping[Phase, list[list[Send]]],
                 in_turn: bool) -> dict[tuple[int, int], list[int]]:
    """``(level, member) -> [the step at which that member first sends each part]`` (never: the step count),
    a direct step's sends in turn where ``in_turn``."""
    first: dict[tuple[int, int], list[int]] = {}
    for key in phases:
        si = key[0]
        n, phase = levels[si].size, steps[key]
        for i in range(n):
            at = [len(phase) * n] * n
            for t in reversed(range(len(phase))):
                sends = [(a, e) for src, _, a, e in phase[t] if src == i]
                for x, (a, e) in reversed(list(enumerate(sends))):
                    at[a:e] = [t * n + (x if in_turn else 0)] * (e - a)
            first[(si, i)] = at
    return first
