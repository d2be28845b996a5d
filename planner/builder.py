"""Build rank programs without writing dependencies by hand.

Algorithms emit operations in the order they mean them; the builder adds, for
each operation, the dependencies its data needs (the last write of every chunk
it reads, and every read and write since the last write of the chunk it
writes), so the verifier's race check holds by construction and the runtime may
run everything else concurrently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from planner.collectives import spec
from runtime.schedule import Chunk, Metadata, Op, Schedule, build_schedule

__all__ = ["ScheduleBuilder"]


class ScheduleBuilder:
    """Accumulates per-rank programs, inferring dependencies from data hazards.

    >>> b = ScheduleBuilder("allgather", ranks=2, input_chunks=1, output_chunks=2)
    >>> for r in range(2):
    ...     _ = b.copy(r, Chunk("i", 0), Chunk("o", r))
    >>> _ = b.transfer(0, 1, Chunk("o", 0), Chunk("o", 0))
    >>> _ = b.transfer(1, 0, Chunk("o", 1), Chunk("o", 1))
    >>> b.build("example").op_count
    6
    """

    def __init__(self, collective: str, ranks: int, input_chunks: int, output_chunks: int, *,
                 scratch_chunks: int = 0, root: int | None = None, inplace: bool = False) -> None:
        self.spec = spec(collective, ranks, input_chunks, output_chunks, root)
        self.collective = self.spec.collective
        self.ranks = ranks
        self.input_chunks = input_chunks
        self.output_chunks = output_chunks
        self.scratch_chunks = scratch_chunks
        self.root = self.spec.root
        self.inplace = inplace
        self.programs: list[list[Op]] = [[] for _ in range(ranks)]
        self._last_write: list[dict[tuple[str, int], int]] = [{} for _ in range(ranks)]
        self._readers: list[dict[tuple[str, int], list[int]]] = [{} for _ in range(ranks)]

    def _locations(self, rank: int, ref: Chunk) -> list[tuple[str, int]]:
        if not self.inplace:
            return [(ref.buffer, ref.index + j) for j in range(ref.count)]
        return [self.spec.alias(rank, ref.buffer, ref.index + j) for j in range(ref.count)]

    def _emit(self, rank: int, op: Op, reads: Iterable[Chunk], write: Chunk | None, after: Iterable[int]) -> int:
        k = len(self.programs[rank])
        deps = set(after)
        last_write, readers = self._last_write[rank], self._readers[rank]
        read_locs = [loc for ref in reads for loc in self._locations(rank, ref)]
        for loc in read_locs:
            if loc in last_write:
                deps.add(last_write[loc])
        if write is not None:
            for loc in self._locations(rank, write):
                if loc in last_write:
                    deps.add(last_write[loc])
                deps.update(readers.get(loc, ()))
        for loc in read_locs:
            readers.setdefault(loc, []).append(k)
        if write is not None:
            for loc in self._locations(rank, write):
                last_write[loc] = k
                readers[loc] = []
        deps.discard(k)
        self.programs[rank].append(Op(op.kind, op.peer, op.src, op.dst, tuple(sorted(deps)), op.step, op.channel))
        return k

    def send(self, rank: int, peer: int, src: Chunk, *, step: int = 0, channel: int = 0,
             after: Iterable[int] = ()) -> int:
        return self._emit(rank, Op("send", peer, src, None, (), step, channel), (src,), None, after)

    def recv(self, rank: int, peer: int, dst: Chunk, *, reduce: bool = False, step: int = 0, channel: int = 0,
             after: Iterable[int] = (), src: Chunk | None = None) -> int:
        """A receive into ``dst``; with ``reduce``, ``dst := (src or dst) (+) received``."""
        if src is not None and not reduce:
            raise ValueError("only a reducing receive takes a src operand")
        kind = "recv_reduce" if reduce else "recv"
        reads = () if not reduce else (dst,) if src is None else (src,)
        return self._emit(rank, Op(kind, peer, src, dst, (), step, channel), reads, dst, after)

    def copy(self, rank: int, src: Chunk, dst: Chunk, *, step: int = 0, after: Iterable[int] = ()) -> int:
        return self._emit(rank, Op("copy", None, src, dst, (), step), (src,), dst, after)

    def reduce(self, rank: int, src: Chunk, dst: Chunk, *, step: int = 0, after: Iterable[int] = ()) -> int:
        return self._emit(rank, Op("reduce", None, src, dst, (), step), (src, dst), dst, after)

    def transfer(self, src_rank: int, dst_rank: int, src: Chunk, dst: Chunk, *, reduce: bool = False,
                 step: int = 0, channel: int = 0) -> tuple[int, int]:
        """A send on ``src_rank`` and its matching receive (or receive-and-reduce) on ``dst_rank``."""
        s = self.send(src_rank, dst_rank, src, step=step, channel=channel)
        r = self.recv(dst_rank, src_rank, dst, reduce=reduce, step=step, channel=channel)
        return s, r

    def build(self, algorithm: str, options: Mapping[str, Any] | None = None, **metadata: Any) -> Schedule:
        return build_schedule(
            self.collective, self.ranks, self.input_chunks, self.output_chunks, self.programs,
            scratch_chunks=self.scratch_chunks, root=self.root, inplace=self.inplace,
            metadata=Metadata(algorithm=algorithm, options=dict(options or {}), **metadata),
        )
