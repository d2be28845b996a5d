"""What each collective means, as one frozen description per collective: every layer asks it, none compares names.

A collective's buffers are made of rank blocks: one block, or one block per rank where the buffer is *split*
(the input of reduce-scatter and all-to-all, the output of all-gather and all-to-all).  Every other property
follows from four facts: whether the input is split, whether the output is split, whether contributions are
reduced, and whether one rank (the root) is the only source or destination.  So the rules that the verifier
proves and the executor replays (rank blocks, in-place aliasing, the pre- and postconditions) are written once,
here, over those facts.

Symbolic values (the pre- and postconditions): a chunk's value is a pair ``(key, mask)``, ``key`` naming one
logical piece of data and ``mask`` the ranks whose contributions it holds, as a bit mask.  Rank ``r``'s input
chunk ``j`` starts as ``(first_key(r) + j, 1 << r)``; a postcondition names the value each output chunk must
hold (None where the collective leaves it unspecified: a reduce's output off the root).

>>> collective("all_reduce").bus_factor(8)
1.75
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from topocc.runtime.errors import ScheduleFormatError

__all__ = [
    "ALLGATHER",
    "ALLREDUCE",
    "ALLTOALL",
    "BROADCAST",
    "BY_NAME",
    "DESCRIPTIONS",
    "NAMES",
    "REDUCE",
    "REDUCESCATTER",
    "ROOTED",
    "Collective",
    "Value",
    "closest_collective",
    "collective",
]

#: A chunk's symbolic value: (key, mask of the contributing ranks).
Value = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective: its names, the shape of its buffers, and what it computes.

    ``input_split``/``output_split``: the buffer holds one block per rank (input block ``r`` is for rank ``r``,
    output block ``s`` comes from rank ``s``), else one block.  ``reduces``: the output combines the ranks'
    contributions with the reduction operator.  ``rooted``: one rank, the root, is the only source (a
    broadcast) or the only destination (a reduce) of the data.
    """

    name: str
    aliases: tuple[str, ...]
    input_split: bool
    output_split: bool
    reduces: bool
    rooted: bool

    # ------------------------------------------------------------------ what it does, in words the call sites use

    @property
    def split(self) -> bool:
        """Its larger buffer holds one block per rank (every collective but all-reduce, broadcast and reduce)."""
        return self.input_split or self.output_split

    @property
    def gathers(self) -> bool:
        """Each rank's block lands in a block of its own on every rank: the output is ranks x the input."""
        return self.output_split and not self.input_split

    @property
    def scatters(self) -> bool:
        """Each rank keeps one block of the (reduced) input: the input is ranks x the output."""
        return self.input_split and not self.output_split

    @property
    def exchanges(self) -> bool:
        """Every rank sends a block to every rank (all-to-all): both buffers are split."""
        return self.input_split and self.output_split

    @property
    def symmetric_sizes(self) -> bool:
        """The input and the output have the same size."""
        return self.input_split == self.output_split

    @property
    def replicates(self) -> bool:
        """Every rank ends with the same output (all-reduce, all-gather, broadcast): the collective ends by
        spreading data to everyone."""
        return not self.input_split and not (self.rooted and self.reduces)

    @property
    def from_root(self) -> bool:
        """The root's data goes to every rank (broadcast)."""
        return self.rooted and not self.reduces

    @property
    def to_root(self) -> bool:
        """Every rank's data is reduced onto the root (reduce)."""
        return self.rooted and self.reduces

    @property
    def carries_gradients(self) -> bool:
        """Data-parallel training reduces its gradients with it (all-reduce, reduce-scatter): the collectives a
        compressed bundle encodes; parameters gathered or broadcast stay exact."""
        return self.reduces and not self.rooted

    @property
    def passes(self) -> int:
        """How often each byte crosses an optimal algorithm's links, in (n-1)/n units: 2 where the collective
        both reduces and replicates (a reduce-scatter, then an all-gather), else 1."""
        return 2 if self.reduces and self.replicates else 1

    def bus_factor(self, ranks: int) -> float:
        """busbw / algbw as nccl-tests defines it (doc/PERFORMANCE.md there): ``passes x (n-1)/n``, and 1 for a
        rooted collective (the root's data crosses each link once)."""
        return 1.0 if self.rooted else self.passes * (ranks - 1) / ranks

    # ------------------------------------------------------------------ buffers: rank blocks and aliasing

    def block(self, ranks: int, inputs: int, outputs: int) -> int:
        """The size of one rank block, from the sizes of the input and output (in chunks, or in elements):
        the size of an unsplit buffer, or the input's share of one rank where both are split."""
        if not self.input_split:
            return inputs
        if not self.output_split:
            return outputs
        return inputs // ranks

    def sizes(self, ranks: int, block: int) -> tuple[int, int]:
        """(input, output) sizes for rank blocks of ``block`` (chunks or elements)."""
        return block * ranks if self.input_split else block, block * ranks if self.output_split else block

    def chunking_problem(self, ranks: int, inputs: int, outputs: int) -> str | None:
        """Why ``inputs``/``outputs`` chunks do not fit the collective's shape, or None if they do."""
        name = self.name
        if self.exchanges:
            if inputs != outputs or inputs % ranks:
                return f"{name} needs equal input and output chunks, a multiple of {ranks} ({inputs}, {outputs})"
        elif self.gathers:
            if outputs != inputs * ranks:
                return f"{name} needs output chunks = ranks x input chunks ({outputs} != {ranks} x {inputs})"
        elif self.scatters:
            if inputs != outputs * ranks:
                return f"{name} needs input chunks = ranks x output chunks ({inputs} != {ranks} x {outputs})"
        elif inputs != outputs:
            return f"{name} needs as many output chunks as input chunks ({outputs} != {inputs})"
        return None

    def alias(self, rank: int, buffer: str, index: int, block: int) -> tuple[str, int]:
        """Where an in-place collective keeps chunk ``index`` of ``buffer`` (``i``, ``o`` or ``s``) on ``rank``,
        with rank blocks of ``block`` chunks (NCCL's in-place conventions): the smaller buffer is rank
        ``rank``'s block of the larger one (all-gather's input, reduce-scatter's output), and buffers of one
        size are one buffer, the output.  Scratch is never aliased."""
        if buffer == "s":
            return buffer, index
        if self.gathers:
            return ("o", rank * block + index) if buffer == "i" else (buffer, index)
        if self.scatters:
            return ("i", rank * block + index) if buffer == "o" else (buffer, index)
        return "o", index

    # ------------------------------------------------------------------ pre- and postconditions

    def first_key(self, rank: int, inputs: int) -> int:
        """The key of ``rank``'s input chunk 0 (input chunk ``j`` holds key ``first_key + j``): the ranks'
        inputs are distinct data where the output keeps them apart (gathers, exchanges), else one piece of
        data that each rank contributes to."""
        return rank * inputs if self.output_split else 0

    def initial(self, rank: int, inputs: int) -> list[Value]:
        """The value of each of ``inputs`` input chunks on ``rank`` before the collective runs: its own."""
        first, bit = self.first_key(rank, inputs), 1 << rank
        return [(first + j, bit) for j in range(inputs)]

    def expected(self, rank: int, ranks: int, inputs: int, outputs: int, root: int | None) -> list[Value | None]:
        """The value each output chunk on ``rank`` must hold afterwards (None: unspecified).

        Output chunk ``j`` of block ``s`` holds input chunk ``j`` of the input block for ``rank`` (of the whole
        input where it is not split), from rank ``s`` where the output is split, from the root where the
        collective is rooted, and reduced over every rank where it reduces.
        """
        if self.to_root and rank != root:
            return [None] * outputs
        k = self.block(ranks, inputs, outputs)
        full = (1 << ranks) - 1
        base = rank * k if self.input_split else 0
        out: list[Value | None] = []
        for o in range(outputs):
            source, j = divmod(o, k) if self.output_split else (root, o)
            key = base + j + (self.first_key(source, inputs) if source is not None else 0)
            if self.reduces:
                out.append((key, full))
            else:
                assert source is not None  # a collective that does not reduce is rooted or splits its output
                out.append((key, 1 << source))
        return out


ALLREDUCE = Collective("allreduce", ("all_reduce", "all-reduce"), input_split=False, output_split=False,
                       reduces=True, rooted=False)
REDUCESCATTER = Collective("reducescatter", ("reduce_scatter", "reduce-scatter"), input_split=True,
                           output_split=False, reduces=True, rooted=False)
ALLGATHER = Collective("allgather", ("all_gather", "all-gather"), input_split=False, output_split=True,
                       reduces=False, rooted=False)
BROADCAST = Collective("broadcast", (), input_split=False, output_split=False, reduces=False, rooted=True)
REDUCE = Collective("reduce", (), input_split=False, output_split=False, reduces=True, rooted=True)
ALLTOALL = Collective("alltoall", ("all_to_all", "all-to-all"), input_split=True, output_split=True,
                      reduces=False, rooted=False)

#: Every collective, in the order the format and the CLI list them.
DESCRIPTIONS: tuple[Collective, ...] = (ALLREDUCE, REDUCESCATTER, ALLGATHER, BROADCAST, REDUCE, ALLTOALL)
#: Their stored names, in that order.
NAMES: tuple[str, ...] = tuple(c.name for c in DESCRIPTIONS)
#: The stored names of the rooted ones (whose plans hold for one root only).
ROOTED: tuple[str, ...] = tuple(c.name for c in DESCRIPTIONS if c.rooted)


def _key(spelling: str) -> str:
    """A spelling without case, hyphens, underscores or spaces: ``All-Reduce``, ``all_reduce`` are ``allreduce``."""
    return spelling.lower().replace("-", "").replace("_", "").replace(" ", "")


#: Each description by its stored name (the format's spelling only).
BY_NAME: Mapping[str, Collective] = {c.name: c for c in DESCRIPTIONS}
#: Each description by the key of each of its names (any spelling).
_BY_KEY: Mapping[str, Collective] = {_key(n): c for c in DESCRIPTIONS for n in (c.name, *c.aliases)}


def closest_collective(name: str) -> str | None:
    """The stored name closest to a spelling that names no collective, if one is close."""
    near = difflib.get_close_matches(_key(name), list(_BY_KEY), n=1, cutoff=0.6)
    return _BY_KEY[near[0]].name if near else None


def collective(name: str | Collective) -> Collective:
    """The description of a collective, by any of its spellings (``allreduce``, ``all-reduce``, torch's
    ``all_reduce``, ``AllReduce``); an unknown name is a one-line :class:`ScheduleFormatError` that lists the
    known ones (and the closest).

    >>> collective("reduce_scatter") is REDUCESCATTER
    True
    """
    if isinstance(name, Collective):
        return name
    found = BY_NAME.get(name) or _BY_KEY.get(_key(name))
    if found is None:
        near = closest_collective(name)
        raise ScheduleFormatError(f"unknown collective {name!r}" + (f" (did you mean {near}?)" if near else ""),
                                  fix=f"use one of {', '.join(NAMES)}")
    return found
