"""What each collective must compute, as data: symbolic pre- and postconditions of one collective instance.

The rules themselves (rank blocks, in-place aliasing, which value each chunk starts and ends with) belong to the
collective's description, :class:`topocc.runtime.collective.Collective`, which the runtime's executor replays
too; a :class:`CollectiveSpec` binds one to a rank count, a chunking and a root.  A chunk's symbolic value is a
pair ``(key, mask)``: ``key`` names one logical piece of data (which chunk, and for gathers whose chunk),
``mask`` is the set of ranks whose contributions it holds, as a bit mask.  Reducing two values needs equal keys
and disjoint masks; a postcondition names the exact value each output chunk must hold (``None`` where the
collective leaves it unspecified).
"""

from __future__ import annotations

from dataclasses import dataclass

from topocc.runtime.collective import Collective, Value
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import COLLECTIVES, ROOTED, canonical_collective

__all__ = ["COLLECTIVES", "ROOTED", "CollectiveSpec", "Value", "canonical_collective", "chunk_counts", "spec"]


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    """Pre/postconditions of one collective instance (ranks, chunking, root)."""

    collective: str
    ranks: int
    input_chunks: int
    output_chunks: int
    root: int | None = None

    @property
    def description(self) -> Collective:
        """What the collective means (its rules)."""
        return describe(self.collective)

    @property
    def full(self) -> int:
        return (1 << self.ranks) - 1

    @property
    def per_rank(self) -> int:
        """Chunks per rank block (:meth:`Collective.block`)."""
        return self.description.block(self.ranks, self.input_chunks, self.output_chunks)

    def first_key(self, rank: int) -> int:
        """The key of ``rank``'s first input chunk; input chunk j holds key ``first_key + j``."""
        return self.description.first_key(rank, self.input_chunks)

    def initial(self, rank: int) -> list[Value]:
        """The value of each input chunk on ``rank`` before the collective runs: its own contribution."""
        return self.description.initial(rank, self.input_chunks)

    def expected(self, rank: int) -> list[Value | None]:
        """The value each output chunk on ``rank`` must hold afterwards (None: unspecified)."""
        return self.description.expected(rank, self.ranks, self.input_chunks, self.output_chunks, self.root)

    def alias(self, rank: int, buffer: str, index: int) -> tuple[str, int]:
        """Where an in-place collective stores ``buffer[index]`` (NCCL's in-place conventions)."""
        return self.description.alias(rank, buffer, index, self.per_rank)


def spec(collective: str, ranks: int, input_chunks: int, output_chunks: int, root: int | None = None) -> CollectiveSpec:
    """The :class:`CollectiveSpec` for a collective instance (a rooted one's root defaults to rank 0)."""
    kind = describe(collective)
    if kind.rooted and root is None:
        root = 0
    return CollectiveSpec(kind.name, ranks, input_chunks, output_chunks, root)


def chunk_counts(collective: str, ranks: int, chunks_per_rank: int) -> tuple[int, int]:
    """(input, output) chunk counts.

    ``chunks_per_rank`` is the chunks of one rank's block for allgather,
    reducescatter and alltoall, and of the whole buffer for the others.
    """
    return describe(collective).sizes(ranks, chunks_per_rank)
