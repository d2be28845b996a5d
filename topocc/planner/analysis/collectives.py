"""What each collective must compute, as data: symbolic pre- and postconditions.

A chunk's symbolic value is a pair ``(key, mask)``: ``key`` names one logical
piece of data (which chunk, and for gathers whose chunk), ``mask`` is the set of
ranks whose contributions it holds, as a bit mask.  Reducing two values needs
equal keys and disjoint masks; a postcondition names the exact value each output
chunk must hold (``None`` where the collective leaves it unspecified).
"""

from __future__ import annotations

from dataclasses import dataclass

from topocc.runtime.schedule import COLLECTIVES, ROOTED, canonical_collective

__all__ = ["COLLECTIVES", "ROOTED", "CollectiveSpec", "Value", "canonical_collective", "chunk_counts", "spec"]

Value = tuple[int, int]


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    """Pre/postconditions of one collective instance (ranks, chunking, root)."""

    collective: str
    ranks: int
    input_chunks: int
    output_chunks: int
    root: int | None = None

    @property
    def full(self) -> int:
        return (1 << self.ranks) - 1

    @property
    def per_rank(self) -> int:
        """Chunks per rank block for the collectives whose buffers are split by rank."""
        if self.collective == "allgather":
            return self.input_chunks
        if self.collective in ("reducescatter", "alltoall"):
            return self.output_chunks if self.collective == "reducescatter" else self.input_chunks // self.ranks
        return self.input_chunks

    def first_key(self, rank: int) -> int:
        """The key of ``rank``'s first input chunk; input chunk j holds key ``first_key + j``."""
        if self.collective == "allgather":
            return rank * self.per_rank
        if self.collective == "alltoall":
            return rank * self.input_chunks
        return 0

    def initial(self, rank: int) -> list[Value]:
        """The value of each input chunk on ``rank`` before the collective runs: its own contribution."""
        first, bit = self.first_key(rank), 1 << rank
        return [(first + j, bit) for j in range(self.input_chunks)]

    def expected(self, rank: int) -> list[Value | None]:
        """The value each output chunk on ``rank`` must hold afterwards (None: unspecified)."""
        n, k, p = self.output_chunks, self.per_rank, self.ranks
        c = self.collective
        if c == "allreduce":
            return [(i, self.full) for i in range(n)]
        if c == "reduce":
            return [(i, self.full) if rank == self.root else None for i in range(n)]
        if c == "broadcast":
            assert self.root is not None
            return [(i, 1 << self.root) for i in range(n)]
        if c == "allgather":
            return [(o, 1 << (o // k)) for o in range(n)]
        if c == "reducescatter":
            return [(rank * k + j, self.full) for j in range(n)]
        if c == "alltoall":
            # output block s on rank r is input block r of rank s
            return [(s * p * k + rank * k + j, 1 << s) for s in range(p) for j in range(k)]
        raise AssertionError(c)

    def alias(self, rank: int, buffer: str, index: int) -> tuple[str, int]:
        """Where an in-place collective stores ``buffer[index]`` (NCCL's in-place conventions)."""
        if buffer == "s":
            return buffer, index
        c, k = self.collective, self.per_rank
        if c == "allgather":
            return ("o", rank * k + index) if buffer == "i" else (buffer, index)
        if c == "reducescatter":
            return ("i", rank * k + index) if buffer == "o" else (buffer, index)
        return "o", index


def spec(collective: str, ranks: int, input_chunks: int, output_chunks: int, root: int | None = None) -> CollectiveSpec:
    """The :class:`CollectiveSpec` for a collective instance."""
    collective = canonical_collective(collective)
    if collective in ROOTED and root is None:
        root = 0
    return CollectiveSpec(collective, ranks, input_chunks, output_chunks, root)


def chunk_counts(collective: str, ranks: int, chunks_per_rank: int) -> tuple[int, int]:
    """(input, output) chunk counts.

    ``chunks_per_rank`` is the chunks of one rank's block for allgather,
    reducescatter and alltoall, and of the whole buffer for the others.
    """
    collective = canonical_collective(collective)
    k = chunks_per_rank
    if collective == "allgather":
        return k, k * ranks
    if collective == "reducescatter":
        return k * ranks, k
    if collective == "alltoall":
        return k * ranks, k * ranks
    return k, k
