"""Build rank programs without writing dependencies by hand.

Algorithms emit operations in the order they mean them; the builder adds, for
each operation, the dependencies its data needs (the last write of every chunk
it reads, and every read and write since the last write of the chunk it
writes), so the verifier's race check holds by construction and the runtime may
run everything else concurrently.

Such programs cannot deadlock: every dependency points to an operation emitted
earlier, and a transfer emits its send and its receive together, so in emission
order each operation can run (or meet its partner) once all earlier ones have.

A transfer between ranks without a GPU-free route is relayed: given the ranks
to pass through (``relay``, e.g. :func:`topocc.planner.routing.relay.relay_path`), the builder
lowers it into a send to the first relay, which receives into a scratch slot
and sends on, and so on to the receiver, which alone reduces.  Slots come from a
small ring buffer per relaying rank, channel and next rank at the end of the
scratch buffer: a slot is reused once its last send has completed (the hazard
tracking orders that), so memory stays bounded while consecutive pieces overlap.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from topocc.planner.analysis.collectives import spec
from topocc.planner.analysis.hazards import ChunkRuns
from topocc.planner.compiler.symmetrize import one_class
from topocc.runtime.schedule import Chunk, Metadata, Op, Schedule, build_schedule, operation
from topocc.runtime.symmetric import SymmetricPrograms

__all__ = ["RELAY_SLOTS", "Relay", "ScheduleBuilder"]

#: Messages a relaying rank can hold per channel and next rank (slots of its scratch ring buffer), so that
#: it receives the next pieces while it forwards earlier ones: too few slots serialise a relayed pipeline,
#: many more gain little or lose.  A ring buffer per next rank, not one for all: a NIC GPU relaying for
#: several GPUs both ways would otherwise hold a piece bound for its NVSwitch until a slot that waits on the
#: slower network frees.
RELAY_SLOTS = 8

#: The ranks a transfer from one rank to another passes through (empty: straight there).
Relay = Callable[[int, int], Sequence[int]]


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
                 scratch_chunks: int = 0, root: int | None = None, inplace: bool = False,
                 relay: Relay | None = None, focus: frozenset[int] | None = None) -> None:
        self.spec = spec(collective, ranks, input_chunks, output_chunks, root)
        self.collective = self.spec.collective
        self.ranks = ranks
        self.input_chunks = input_chunks
        self.output_chunks = output_chunks
        self.scratch_chunks = scratch_chunks
        self.root = self.spec.root
        self.inplace = inplace
        #: the ranks whose programs are written (None: every rank's); the others' operations are dropped
        self.focus = focus
        self.programs: list[list[Op]] = [[] for _ in range(ranks)]
        self._hazards = [ChunkRuns() for _ in range(ranks)]
        self._relay = relay
        self._relay_end = [scratch_chunks] * ranks  # where each rank's next relay ring buffer goes
        self._rings: dict[tuple[int, int, int], list[int]] = {}  # (rank, channel, next) -> [start, capacity, cursor]
        # every chunk has an address (input, then output, then scratch); in place, a buffer's chunks
        # sit at an offset in the buffer they alias (the same resolution the verifier makes)
        base = {"i": 0, "o": input_chunks, "s": input_chunks + output_chunks}
        self._base: list[dict[str, int]] = []
        for r in range(ranks):
            at = dict(base)
            if inplace:
                for name in ("i", "o"):
                    target, offset = self.spec.alias(r, name, 0)
                    at[name] = base[target] + offset
            self._base.append(at)

    def _emit(self, rank: int, kind: str, peer: int | None, src: Chunk | None, dst: Chunk | None,
              step: int, channel: int, reads: tuple[Chunk, ...], write: Chunk | None, after: Iterable[int]) -> int:
        """Append an operation that depends on ``after`` and on every earlier conflicting access (none, -1, for
        a rank outside the focus)."""
        if self.focus is not None and rank not in self.focus:
            return -1
        program = self.programs[rank]
        k = len(program)
        deps = set(after)
        hazards, base = self._hazards[rank], self._base[rank]
        writer, readers, split = hazards.writer, hazards.readers, hazards._split
        # split the runs at every bound first, so that each access's runs are found once (later splits would
        # shift the indices); the order of the splits changes no run
        spans = [(base[ref.buffer] + ref.index, base[ref.buffer] + ref.index + ref.count) for ref in reads]
        for a, e in spans:
            split(a)
            split(e)
        if write is not None:
            wa = base[write.buffer] + write.index
            we = wa + write.count
            split(wa)
            split(we)
        starts, find = hazards.starts, bisect.bisect_left
        for a, e in spans:
            for m in range(find(starts, a), find(starts, e)):
                deps.add(writer[m])
                readers[m].append(k)
        if write is not None:
            first, stop = find(starts, wa), find(starts, we)
            for m in range(first, stop):
                deps.add(writer[m])
                deps.update(readers[m])
            hazards.replace(first, stop, k)
        deps.discard(k)
        deps.discard(-1)
        program.append(operation(kind, peer, src, dst, tuple(sorted(deps)), step, channel))
        return k

    def send(self, rank: int, peer: int, src: Chunk, *, step: int = 0, channel: int = 0,
             after: Iterable[int] = ()) -> int:
        return self._emit(rank, "send", peer, src, None, step, channel, (src,), None, after)

    def recv(self, rank: int, peer: int, dst: Chunk, *, reduce: bool = False, step: int = 0, channel: int = 0,
             after: Iterable[int] = (), src: Chunk | None = None) -> int:
        """A receive into ``dst``; with ``reduce``, ``dst := (src or dst) (+) received``."""
        if src is not None and not reduce:
            raise ValueError("only a reducing receive takes a src operand")
        kind = "recv_reduce" if reduce else "recv"
        reads = () if not reduce else (dst,) if src is None else (src,)
        return self._emit(rank, kind, peer, src, dst, step, channel, reads, dst, after)

    def copy(self, rank: int, src: Chunk, dst: Chunk, *, step: int = 0, after: Iterable[int] = ()) -> int:
        return self._emit(rank, "copy", None, src, dst, step, 0, (src,), dst, after)

    def reduce(self, rank: int, src: Chunk, dst: Chunk, *, step: int = 0, after: Iterable[int] = ()) -> int:
        return self._emit(rank, "reduce", None, src, dst, step, 0, (src, dst), dst, after)

    def transfer(self, src_rank: int, dst_rank: int, src: Chunk, dst: Chunk, *, reduce: bool = False,
                 step: int = 0, channel: int = 0, after: Iterable[int] = (),
                 recv_after: Iterable[int] = ()) -> tuple[int, int]:
        """A send on ``src_rank`` and its matching receive (or receive-and-reduce) on ``dst_rank``.

        Relayed when the builder's ``relay`` names ranks to pass through: each
        receives into a scratch slot and sends on, on the same channel.  Returns
        the indices of the send on ``src_rank`` and of the receive on ``dst_rank``.
        ``after`` are operations of ``src_rank`` the send also waits for (flow control),
        ``recv_after`` those of ``dst_rank`` the receive waits for.
        """
        via = self._relay(src_rank, dst_rank) if self._relay is not None else ()
        chain = (src_rank, *via, dst_rank)
        refs = (src, *(Chunk("s", self._slot(hop, channel, after_hop, src.count), src.count)
                       for hop, after_hop in zip(via, chain[2:])), dst)
        first = self.send(src_rank, chain[1], src, step=step, channel=channel, after=after)
        for i in range(1, len(chain) - 1):  # the relays: receive into a slot, send on from it
            self.recv(chain[i], chain[i - 1], refs[i], step=step, channel=channel)
            self.send(chain[i], chain[i + 1], refs[i], step=step, channel=channel)
        last = self.recv(dst_rank, chain[-2], dst, reduce=reduce, step=step, channel=channel, after=recv_after)
        return first, last

    def _slot(self, rank: int, channel: int, onward: int, count: int) -> int:
        """Scratch index of ``count`` free chunks in ``rank``'s relay ring buffer for ``channel`` towards ``onward``.

        The buffer holds :data:`RELAY_SLOTS` of the largest message seen; a
        larger one moves the buffer to a fresh place twice as large (the old
        one is abandoned), so a rank's relay scratch stays within a small
        multiple of what its largest messages need.
        """
        ring = self._rings.get((rank, channel, onward))
        if ring is None or ring[1] < RELAY_SLOTS * count:
            capacity = max(RELAY_SLOTS * count, 2 * ring[1] if ring is not None else 0)
            ring = self._rings[(rank, channel, onward)] = [self._relay_end[rank], capacity, 0]
            self._relay_end[rank] += capacity
        start, capacity, cursor = ring
        if cursor + count > capacity:
            cursor = 0
        ring[2] = cursor + count
        return start + cursor

    def build(self, algorithm: str, options: Mapping[str, Any] | None = None, **metadata: Any) -> Schedule:
        assert self.focus is None, "a focused builder holds a few ranks' programs (build_class)"
        return build_schedule(
            self.collective, self.ranks, self.input_chunks, self.output_chunks, self.programs,
            scratch_chunks=max(self._relay_end), root=self.root, inplace=self.inplace,
            metadata=Metadata(algorithm=algorithm, options=dict(options or {}), **metadata),
        )

    def build_class(self, algorithm: str, shape: tuple[int, ...], options: Mapping[str, Any] | None = None,
                    **metadata: Any) -> Schedule | None:
        """The schedule in the symmetric form of one class over ``shape``, fitted from the focus ranks' programs
        (:func:`~topocc.planner.compiler.symmetrize.one_class`), or None where they are not one class."""
        assert self.focus is not None
        programs = {r: tuple(self.programs[r]) for r in self.focus}
        limits = {"i": self.input_chunks, "o": self.output_chunks,
                  "s": max(self._relay_end[r] for r in self.focus)}
        sym = one_class(programs, shape, limits)
        if sym is None:
            return None
        return Schedule(self.collective, self.ranks, self.input_chunks, self.output_chunks, SymmetricPrograms(sym),
                        limits["s"], self.root, self.inplace,
                        Metadata(algorithm=algorithm, options=dict(options or {}), **metadata), (), sym)
