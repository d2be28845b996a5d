"""Prove a schedule correct by symbolic execution.

Three properties, each with a precise error when it fails:

* every send has exactly one matching receive (FIFO per rank pair and channel)
  of the same length, and no rank reads a chunk it has not received or computed;
* no data race: two operations of a rank that touch the same chunk, one of them
  writing, are ordered by that rank's dependencies (the runtime runs unordered
  operations concurrently);
* the schedule terminates under rendezvous semantics (no deadlock) and leaves
  every output chunk holding exactly the value the collective specifies: for a
  reduction, each rank's contribution exactly once;
* an encoded schedule (messages that carry an approximation) computes the same
  dataflow, and every rank ends with the same bits where the collective's
  output is the same everywhere (:mod:`topocc.planner.analysis.encodings`).

Sends (and receives) of one rank to (from) one peer on one channel are assumed
to be posted in program order, as a runtime that matches by posting order (MPI's
non-overtaking rule) must: a later one is posted only once the earlier one has
been, even when its own dependencies are met sooner.  A runtime that tags each
message with its sequence number needs less; proving the stricter rule keeps a
schedule deadlock-free on both.

Error messages are built only when a check fails, so a correct schedule costs no
string formatting: the proof's cost is that of the operations themselves.
"""

from __future__ import annotations

import gc
import itertools
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from topocc.planner.analysis.collectives import CollectiveSpec, Value, spec
from topocc.planner.analysis.encodings import check_encodings, is_encoded
from topocc.planner.analysis.hazards import ChunkRuns
from topocc.planner.errors import VerificationError
from topocc.runtime.schedule import BUFFERS, OP_RULES, Chunk, Op, OpFault, Schedule, chunking_problem

__all__ = ["VerifyReport", "verify"]

Programs = Sequence[tuple[Op, ...]]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What the verifier checked: sizes of the proof, for display; for an encoded schedule, how many output
    chunks (over all ranks) end approximate (:mod:`topocc.planner.analysis.encodings`)."""

    collective: str
    ranks: int
    operations: int
    messages: int
    chunks_sent: int
    approximate_chunks: int = 0


def _fail(schedule: Schedule, message: str, fix: str | None = None) -> VerificationError:
    name = schedule.metadata.algorithm
    return VerificationError(message, where=f"{schedule.collective} schedule ({name})", fix=fix)


def _describe(rank: int, k: int, op: Op) -> str:
    """``rank 2 op 5 (send to rank 3 o[1])``: how errors name an operation."""
    what: str = op.kind
    if op.peer is not None:
        what += f" {'to' if op.kind == 'send' else 'from'} rank {op.peer}"
        if op.channel:
            what += f" ch {op.channel}"
    refs = " ".join(str(c) for c in (op.src, op.dst) if c is not None)
    return f"rank {rank} op {k} ({what} {refs})" if refs else f"rank {rank} op {k} ({what})"


def _check_structure(schedule: Schedule, sp: CollectiveSpec) -> None:
    """Re-check what the loader checks, for schedules built in memory by an algorithm."""
    _check_header(schedule, sp)
    limits = dict(zip(BUFFERS, (schedule.input_chunks, schedule.output_chunks, schedule.scratch_chunks)))
    for rank, program in enumerate(schedule.programs):
        _check_program(schedule, rank, program, limits)


def _check_header(schedule: Schedule, sp: CollectiveSpec) -> None:
    """The rank count, the chunk counts and the root: what holds for the schedule, not per rank."""
    ranks = schedule.ranks
    if ranks < 1:
        raise _fail(schedule, f"a schedule needs at least one rank, got {ranks}")
    if len(schedule.programs) != ranks:
        raise _fail(schedule, f"{len(schedule.programs)} programs for {ranks} ranks", fix="one program per rank")
    counts = (schedule.input_chunks, schedule.output_chunks, schedule.scratch_chunks)
    if min(counts[:2]) < 1 or counts[2] < 0:
        raise _fail(schedule, f"invalid chunk counts (input {counts[0]}, output {counts[1]}, scratch {counts[2]})")
    problem = chunking_problem(schedule.collective, ranks, schedule.input_chunks, schedule.output_chunks)
    if problem:
        raise _fail(schedule, problem)
    if sp.root is not None and not 0 <= sp.root < ranks:
        raise _fail(schedule, f"root {sp.root} is not a rank of a {ranks}-rank schedule")


def _check_program(schedule: Schedule, rank: int, program: tuple[Op, ...], limits: dict[str, int]) -> None:
    """Each operation of ``rank``'s program against its kind's rule, its buffers' ``limits`` and its deps."""
    ranks = schedule.ranks
    for k, op in enumerate(program):
        rule = OP_RULES[op.kind]
        src, dst = op.src, op.dst
        fault = rule.peer_fault(op.peer is not None, op.peer, rank, ranks) or rule.refs_fault(src, dst)
        if fault is not None and fault is not OpFault.COUNTS_DIFFER:
            raise _fail(schedule, _op_fault(rank, k, op, fault))
        for ref in (src, dst):  # before unequal counts: a reference out of range is the likelier cause
            if ref is not None:
                limit = limits.get(ref.buffer)
                if limit is None or ref.index < 0 or ref.count < 1 or ref.index + ref.count > limit:
                    raise _fail(schedule, f"{_describe(rank, k, op)}: chunk reference {ref} out of range "
                                          f"(buffer {ref.buffer!r} has {limit or 0} chunks)")
        if fault is not None:
            raise _fail(schedule, _op_fault(rank, k, op, fault))
        for d in op.deps:
            if not 0 <= d < k:
                raise _fail(schedule, f"rank {rank} op {k}: dependency {d} does not name an earlier operation",
                            fix="dependencies must point to earlier operations of the same rank")
        if dst is not None and dst.buffer == "i" and not schedule.inplace:
            raise _fail(
                schedule, f"{_describe(rank, k, op)} writes the input buffer of an out-of-place collective",
                fix="write to output or scratch, or mark the schedule inplace",
            )


def _op_fault(rank: int, k: int, op: Op, fault: OpFault) -> str:
    """How the verifier words an operation that does not fit its kind's rule: a peer that is not another rank,
    or unequal counts (an operation's class holds no missing or stray field)."""
    if fault in (OpFault.NO_PEER, OpFault.PEER_OUT_OF_RANGE, OpFault.SELF_PEER):
        return f"rank {rank} op {k}: invalid peer {op.peer} for a {op.kind}"
    return f"{_describe(rank, k, op)}: src and dst lengths differ"


#: A run of chunks: (length, key of its first chunk or None where no data is held, mask).  Chunk j of
#: the run holds the value (key + j, mask): data moves in ranges, so keys stay consecutive.
Segment = tuple[int, int | None, int]


def _joins(a: Segment, b: Segment) -> bool:
    """Whether run ``b``, right after run ``a``, continues it (one run holds both)."""
    n, key, mask = a
    return (key is None and b[1] is None) or (key is not None and b[1] == key + n and (b[2] is mask or b[2] == mask))


def _values(segments: list[Segment]) -> list[Value | None]:
    """The runs chunk by chunk, for error messages (built only when a check fails)."""
    return [None if key is None else (key + j, mask) for n, key, mask in segments for j in range(n)]


class _Runs:
    """One buffer's symbolic values as maximal runs, so the proof costs per operation and run, not per chunk.

    Run m covers chunks ``starts[m]`` up to the next start (or ``size``); chunk
    a of it holds ``(keys[m] + a - starts[m], masks[m])``, or nothing where its
    key is None.  Neighbouring runs never continue each other (:func:`_joins`),
    so equal contents have equal runs.  Data moves in ranges, so a buffer holds a
    few runs where it has thousands of chunks: memory grows with the ranks, not
    with ranks times chunks.
    """

    __slots__ = ("keys", "masks", "size", "starts")

    def __init__(self, size: int) -> None:
        self.size = size
        self.starts = [0]
        self.keys: list[int | None] = [None]
        self.masks = [0]

    def _split(self, a: int) -> int:
        """Index of the run that starts at chunk ``a`` (the run count at the end), splitting the run holding it."""
        starts = self.starts
        if a >= self.size:
            return len(starts)
        m = bisect_right(starts, a) - 1
        first = starts[m]
        if first == a:
            return m
        key = self.keys[m]
        starts.insert(m + 1, a)
        self.keys.insert(m + 1, None if key is None else key + a - first)
        self.masks.insert(m + 1, self.masks[m])
        return m + 1

    def read(self, lo: int, hi: int) -> list[Segment]:
        """Chunks ``lo .. hi - 1`` as runs."""
        starts, keys, masks = self.starts, self.keys, self.masks
        m = bisect_right(starts, lo) - 1
        last = len(starts) - 1
        end = starts[m + 1] if m < last else self.size
        key = keys[m]
        if hi <= end:  # within one run: the usual case
            return [(hi - lo, None if key is None else key + lo - starts[m], masks[m])]
        out: list[Segment] = [(end - lo, None if key is None else key + lo - starts[m], masks[m])]
        while end < hi:
            m += 1
            a, end = end, starts[m + 1] if m < last else self.size
            if end > hi:
                end = hi
            out.append((end - a, keys[m], masks[m]))
        return out

    def write(self, lo: int, segments: list[Segment]) -> None:
        """Chunks from ``lo`` on now hold ``segments`` (maximal runs, as :meth:`read` and :func:`_reduced` give)."""
        starts, keys, masks = self.starts, self.keys, self.masks
        if len(segments) == 1:
            n, key, mask = segments[0]
            i = self._split(lo)
            j = self._split(lo + n)
            starts[i:j], keys[i:j], masks[i:j] = [lo], [key], [mask]
            new = 1
        else:
            firsts = list(itertools.accumulate((n for n, _, _ in segments), initial=lo))
            i = self._split(lo)
            j = self._split(firsts.pop())
            starts[i:j] = firsts
            keys[i:j] = [key for _, key, _ in segments]
            masks[i:j] = [mask for _, _, mask in segments]
            new = len(segments)
        # the run before the new ones may continue into them, or they into the next run (_joins, inline)
        for m in (i + new, i):
            if 0 < m < len(starts):
                before, key = keys[m - 1], keys[m]
                if (key is None and before is None) or (
                        before is not None and key == before + starts[m] - starts[m - 1] and masks[m] == masks[m - 1]):
                    del starts[m], keys[m], masks[m]


def _merged(segments: list[Segment]) -> list[Segment]:
    """``segments`` with every run that continues the one before it joined to it."""
    out = [segments[0]]
    for seg in segments[1:]:
        if _joins(out[-1], seg):
            n, key, mask = out[-1]
            out[-1] = (n + seg[0], key, mask)
        else:
            out.append(seg)
    return out


class _Memory:
    """One rank's buffers as runs (:class:`_Runs`), with in-place aliasing resolved to (storage, offset).

    Every chunk also has an integer address (input, then output, then scratch)
    that identifies it after aliasing, for race detection.
    """

    __slots__ = ("addr", "n_out", "size", "store")

    def __init__(self, schedule: Schedule, sp: CollectiveSpec, rank: int) -> None:
        inp, out = _Runs(schedule.input_chunks), _Runs(schedule.output_chunks)
        scratch = _Runs(schedule.scratch_chunks)
        base = {"i": 0, "o": inp.size, "s": inp.size + out.size}
        self.store = {"i": (inp, 0), "o": (out, 0), "s": (scratch, 0)}
        self.addr = dict(base)
        if schedule.inplace:
            for name in ("i", "o"):
                target, offset = sp.alias(rank, name, 0)
                if target != name:
                    self.store[name] = ({"i": inp, "o": out}[target], offset)
                    self.addr[name] = base[target] + offset
        self.size = inp.size + out.size + scratch.size
        self.n_out = schedule.output_chunks
        self.write(Chunk("i", 0, inp.size), [(inp.size, sp.first_key(rank), 1 << rank)])

    def read(self, ref: Chunk) -> list[Segment]:
        runs, offset = self.store[ref.buffer]
        start = offset + ref.index
        return runs.read(start, start + ref.count)

    def write(self, ref: Chunk, segments: list[Segment]) -> None:
        runs, offset = self.store[ref.buffer]
        runs.write(offset + ref.index, segments)

    def outputs(self) -> list[Segment]:
        runs, offset = self.store["o"]
        return runs.read(offset, offset + self.n_out)


def _check_races(schedule: Schedule, rank: int, program: tuple[Op, ...], memory: _Memory) -> None:
    """Conflicting accesses to a chunk must be ordered by the rank's dependency closure.

    Chunks are tracked as runs with one last writer and one list of readers
    (:class:`~topocc.planner.analysis.hazards.ChunkRuns`), so the check costs per operation, not
    per chunk; the first chunk reported is the first one, in operation and
    chunk order, that a per-chunk check would report.
    """
    ancestors: list[int] = []
    runs = ChunkRuns()
    starts, writer, readers = runs.starts, runs.writer, runs.readers
    addr = memory.addr
    for k, op in enumerate(program):
        mask = 0
        for d in op.deps:
            mask |= ancestors[d] | (1 << d)
        ancestors.append(mask)
        reads, write = op.reads, op.dst
        for ref in reads:
            start = addr[ref.buffer] + ref.index
            for m in runs.runs(start, start + ref.count):
                w = writer[m]
                if w >= 0 and not (mask >> w) & 1:
                    raise _race(schedule, rank, program, w, k, ref, starts[m] - start, "reads a chunk that", "writes")
        for ref in reads:
            start = addr[ref.buffer] + ref.index
            for m in runs.runs(start, start + ref.count):
                readers[m].append(k)
        if write is not None:
            start = addr[write.buffer] + write.index
            end = start + write.count
            for m in runs.runs(start, end):
                w = writer[m]
                if w >= 0 and w != k and not (mask >> w) & 1:
                    raise _race(schedule, rank, program, w, k, write, starts[m] - start, "writes a chunk that",
                                "writes")
                for reader in readers[m]:
                    if reader != k and not (mask >> reader) & 1:
                        raise _race(schedule, rank, program, reader, k, write, starts[m] - start,
                                    "overwrites a chunk that", "reads")
            runs.write(start, end, k)


def _race(schedule: Schedule, rank: int, program: tuple[Op, ...], first: int, second: int, ref: Chunk,
          offset: int, what: str, verb: str) -> VerificationError:
    chunk = Chunk(ref.buffer, ref.index + offset)
    return _fail(
        schedule,
        f"data race on {chunk}: {_describe(rank, second, program[second])} {what} "
        f"{_describe(rank, first, program[first])} {verb}, without depending on it",
        fix=f"add {first} to the deps of op {second} on rank {rank}",
    )


class _Matching:
    """Send/receive pairs, and the order in which each rank posts them."""

    __slots__ = ("messages", "next_in_queue", "partner", "prev_in_queue")

    @staticmethod
    def _unmatched(schedule: Schedule, sends: dict[tuple[int, int, int], list[int]],
                   recvs: dict[tuple[int, int, int], list[int]], key: tuple[int, int, int]) -> VerificationError:
        src, dst, ch = key
        s, r = sends.get(key, []), recvs.get(key, [])
        chan = f" on channel {ch}" if ch else ""
        excess = (src, s[len(r)]) if len(s) > len(r) else (dst, r[len(s)])
        op = schedule.programs[excess[0]][excess[1]]
        message = (f"unmatched message: rank {src} sends {len(s)} message(s) to rank {dst}{chan} but rank {dst} "
                   f"receives {len(r)} from rank {src}{chan}; the first without a partner is "
                   f"{_describe(excess[0], excess[1], op)}")
        channels = sorted({c for (a, b, c) in sends.keys() | recvs.keys() if (a, b) == (src, dst)})
        if len(channels) > 1:
            per = ", ".join(f"ch {c}: {len(sends.get((src, dst, c), []))}/{len(recvs.get((src, dst, c), []))}"
                            for c in channels)
            message += f"; per channel, rank {src} sends/rank {dst} receives: {per}"
        return _fail(schedule, message,
                     fix="every send needs exactly one matching receive (FIFO per rank pair and channel)")

    def __init__(self, schedule: Schedule) -> None:
        programs = schedule.programs
        sends: dict[tuple[int, int, int], list[int]] = {}
        recvs: dict[tuple[int, int, int], list[int]] = {}
        for rank, program in enumerate(programs):
            for k, op in enumerate(program):
                if op.kind == "send":
                    sends.setdefault((rank, op.peer, op.channel), []).append(k)
                elif op.kind == "recv" or op.kind == "recv_reduce":
                    recvs.setdefault((op.peer, rank, op.channel), []).append(k)
        self.partner: list[list[tuple[int, int] | None]] = [[None] * len(p) for p in programs]
        #: the next/previous operation of the same (rank, direction, peer, channel) queue, or -1
        self.next_in_queue = [[-1] * len(p) for p in programs]
        self.prev_in_queue = [[-1] * len(p) for p in programs]
        self.messages = 0
        for key in sorted(sends.keys() | recvs.keys()):
            src, dst, ch = key
            s, r = sends.get(key, []), recvs.get(key, [])
            if len(s) != len(r):
                raise self._unmatched(schedule, sends, recvs, key)
            sender, receiver = programs[src], programs[dst]
            for n, (ks, kr) in enumerate(zip(s, r)):
                send, recv = sender[ks], receiver[kr]
                if send.count != recv.count:
                    raise _fail(
                        schedule,
                        f"{_describe(src, ks, send)} sends {send.count} chunk(s) but its matching receive "
                        f"{_describe(dst, kr, recv)} receives {recv.count}",
                        fix=f"send and receive number {n} from rank {src} to rank {dst} on channel {ch} "
                            "must move the same number of chunks",
                    )
                self.partner[src][ks] = (dst, kr)
                self.partner[dst][kr] = (src, ks)
            for rank, queue in ((src, s), (dst, r)):
                nxt, prev = self.next_in_queue[rank], self.prev_in_queue[rank]
                for a, b in itertools.pairwise(queue):
                    nxt[a], prev[b] = b, a
            self.messages += len(s)


def _combine_error(schedule: Schedule, where: str, ref: Chunk, j: int, left: Value | None,
                   right: Value | None) -> VerificationError:
    """Why reducing ``right`` into ``left`` (chunk ``j`` of ``ref``) is wrong."""
    chunk = Chunk(ref.buffer, ref.index + j)
    if left is None or right is None:
        return _fail(schedule, f"{where} reduces into {chunk}, which holds no data yet",
                     fix="receive or copy into it first")
    if left[0] != right[0]:
        return _fail(schedule, f"{where} reduces logical chunk {right[0]} into logical chunk {left[0]} (at {chunk})",
                     fix="only the same logical chunk of different ranks may be reduced together")
    twice = _ranks(left[1] & right[1])
    return _fail(schedule, f"{where} counts the contribution of rank(s) {twice} twice (at {chunk})",
                 fix="each rank's data must enter a reduction exactly once")


def _reduced(schedule: Schedule, rank: int, k: int, ref: Chunk, left: list[Segment],
             right: list[Segment]) -> list[Segment]:
    """Element-wise reduction of two runs of symbolic chunks (of equal length), each pair checked.

    Walks both run lists at once: a stretch where neither changes run holds
    consecutive equal keys on both sides and one mask each, so one key and one
    mask test cover it.
    """
    if len(left) == 1 and len(right) == 1:  # one run each: the usual case
        (n, kl, ml), (_, kr, mr) = left[0], right[0]
        if kl is not None and kl == kr and not ml & mr:
            return [(n, kl, ml | mr)]
    out: list[Segment] = []
    lefts, rights = iter(left), iter(right)
    nl, kl, ml = next(lefts)
    nr, kr, mr = next(rights)
    done = 0
    while True:
        if kl is None or kr is None or kl != kr or ml & mr:
            j = done
            a, b = _values(left)[j], _values(right)[j]
            raise _combine_error(schedule, _describe(rank, k, schedule.programs[rank][k]), ref, j, a, b)
        n = nl if nl < nr else nr
        union = ml | mr
        if out and _joins(out[-1], (n, kl, union)):
            out[-1] = (out[-1][0] + n, out[-1][1], out[-1][2])
        else:
            out.append((n, kl, union))
        done += n
        nl -= n
        nr -= n
        if nl:
            kl += n
        else:
            seg = next(lefts, None)
            if seg is None:
                return out
            nl, kl, ml = seg
        if nr:
            kr += n
        else:
            nr, kr, mr = next(rights)


def _ranks(mask: int) -> str:
    ranks = [i for i in range(mask.bit_length()) if (mask >> i) & 1]
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def _empty(segments: list[Segment]) -> bool:
    """Whether some chunk of ``segments`` holds no data."""
    if len(segments) == 1:
        return segments[0][1] is None
    return any(key is None for _, key, _ in segments)


def _uninitialised(schedule: Schedule, rank: int, k: int, ref: Chunk, segments: list[Segment]) -> VerificationError:
    j = _values(segments).index(None)
    chunk = ref if ref.count == 1 else Chunk(ref.buffer, ref.index + j)
    return _fail(schedule, f"{_describe(rank, k, schedule.programs[rank][k])} reads {chunk}, which holds no data yet",
                 fix="receive, copy or compute it first, and depend on that operation")


def _run_local(schedule: Schedule, rank: int, k: int, op: Op, mem: _Memory) -> None:
    """Operation ``k`` of ``rank``, a copy or a reduction, on its memory: reads checked, values combined."""
    assert op.src is not None and op.dst is not None
    values = mem.read(op.src)
    if _empty(values):
        raise _uninitialised(schedule, rank, k, op.src, values)
    if op.kind == "reduce":
        values = _reduced(schedule, rank, k, op.dst, mem.read(op.dst), values)
    mem.write(op.dst, values)


def _land(schedule: Schedule, rank: int, k: int, recv: Op, mem: _Memory, payload: list[Segment]) -> None:
    """A message's ``payload`` as receive ``k`` of ``rank`` lands it: written, or reduced into its operand."""
    assert recv.dst is not None
    if recv.kind == "recv_reduce":
        left = recv.src if recv.src is not None else recv.dst
        payload = _reduced(schedule, rank, k, left, mem.read(left), payload)
    mem.write(recv.dst, payload)


def verify(schedule: Schedule) -> VerifyReport:
    """Prove that ``schedule`` implements its collective, every rank's program; raise
    :class:`VerificationError` if not.  :func:`~topocc.planner.analysis.verify_symmetric.prove` proves a
    schedule in the symmetric form one rank per orbit of its symmetries where it can.

    >>> from topocc.planner.compiler.algorithms import compile_schedule  # doctest: +SKIP
    >>> verify(compile_schedule(topology, "allreduce", "ring"))  # doctest: +SKIP
    """
    # the proof's bookkeeping (per operation: waits, dependents, partners) lives to the end:
    # cyclic garbage collection would only rescan it again and again
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _verify(schedule)
    finally:
        if collecting:
            gc.enable()


def _verify(schedule: Schedule) -> VerifyReport:
    sp = spec(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks, schedule.root)
    _check_structure(schedule, sp)
    matching = _Matching(schedule)
    memories = [_Memory(schedule, sp, r) for r in range(schedule.ranks)]
    for rank, program in enumerate(schedule.programs):
        _check_races(schedule, rank, program, memories[rank])

    programs = schedule.programs
    partner, next_in_queue = matching.partner, matching.next_in_queue
    waiting = [[len(op.deps) + (prev >= 0) for op, prev in zip(p, pq)]
               for p, pq in zip(programs, matching.prev_in_queue)]
    dependents: list[list[list[int]]] = [[[] for _ in p] for p in programs]
    for rank, program in enumerate(programs):
        rank_dependents = dependents[rank]
        for k, op in enumerate(program):
            for d in op.deps:
                rank_dependents[d].append(k)
    posted = [[False] * len(p) for p in programs]
    done = [[False] * len(p) for p in programs]
    ready = deque((r, k) for r, w in enumerate(waiting) for k, n in enumerate(w) if not n)
    completed = 0
    chunks_sent = 0

    def complete(r: int, k: int) -> None:
        done[r][k] = True
        rank_waiting = waiting[r]
        for j in dependents[r][k]:
            rank_waiting[j] -= 1
            if not rank_waiting[j]:
                ready.append((r, j))

    pop, push = ready.popleft, ready.append
    while ready:
        r, k = pop()
        op = programs[r][k]
        if op.kind == "copy" or op.kind == "reduce":
            _run_local(schedule, r, k, op, memories[r])
            complete(r, k)
            completed += 1
            continue
        nxt = next_in_queue[r][k]
        if nxt >= 0:  # posting this operation lets the next one of its FIFO queue be posted
            rank_waiting = waiting[r]
            rank_waiting[nxt] -= 1
            if not rank_waiting[nxt]:
                push((r, nxt))
        pr, pk = partner[r][k]  # type: ignore[misc]  # a message's partner is known once matching succeeded
        if not posted[pr][pk]:
            posted[r][k] = True
            continue
        send_r, send_k, recv_r, recv_k = (r, k, pr, pk) if op.kind == "send" else (pr, pk, r, k)
        send, recv = programs[send_r][send_k], programs[recv_r][recv_k]
        # matching paired each send with a receive
        assert send.kind == "send" and (recv.kind == "recv" or recv.kind == "recv_reduce")
        src = send.src
        payload = memories[send_r].read(src)
        if _empty(payload):
            raise _uninitialised(schedule, send_r, send_k, send.src, payload)
        _land(schedule, recv_r, recv_k, recv, memories[recv_r], payload)
        chunks_sent += src.count
        complete(send_r, send_k)
        complete(recv_r, recv_k)
        completed += 2

    total = schedule.op_count
    if completed != total:
        raise _fail(schedule, "deadlock: " + _explain_deadlock(programs, done, posted, matching),
                    fix="reorder the operations or their deps so that every wait can be met")

    expected: list[Value | None] | None = None
    runs: list[Segment] = []
    for rank, mem in enumerate(memories):
        if expected is None or not sp.description.replicates:  # else the same postcondition on every rank
            expected = sp.expected(rank)
            if all(want is None for want in expected):
                continue
            runs = _merged([(1, None, 0) if want is None else (1, *want) for want in expected])
        found = mem.outputs()
        if found == runs:  # maximal runs on both sides: equal values have equal runs
            continue
        actual = _values(found)
        for c, want in enumerate(expected):
            if want is None or actual[c] == want:
                continue
            raise _fail(schedule, f"rank {rank} output chunk {c}: " + _explain_value(sp, actual[c], want))
    # an encoded schedule: the same dataflow, and every rank ending with the same bits (its own proof)
    approximate = check_encodings(schedule).approximate_chunks if is_encoded(schedule) else 0
    return VerifyReport(schedule.collective, schedule.ranks, total, matching.messages, chunks_sent, approximate)


def _name_value(sp: CollectiveSpec, key: int) -> str:
    """A logical chunk in the collective's own terms."""
    if sp.description.output_split:  # the ranks' inputs are distinct data (Collective.first_key)
        q, j = divmod(key, sp.input_chunks)
        return f"input chunk {j} of rank {q}"
    return f"logical chunk {key}"


def _explain_value(sp: CollectiveSpec, actual: Value | None, want: Value) -> str:
    if actual is None:
        return "never written"
    if actual[0] != want[0]:
        return f"holds {_name_value(sp, actual[0])} instead of {_name_value(sp, want[0])}"
    if sp.description.from_root:
        return f"holds data from rank(s) {_ranks(actual[1])} instead of the root's (rank {sp.root})"
    missing, extra = want[1] & ~actual[1], actual[1] & ~want[1]
    parts = []
    if missing:
        parts.append(f"lacks the contribution of rank(s) {_ranks(missing)}")
    if extra:
        parts.append(f"wrongly includes rank(s) {_ranks(extra)}")
    return " and ".join(parts)


def _explain_deadlock(programs: Programs, done: list[list[bool]], posted: list[list[bool]],
                      matching: _Matching) -> str:
    """The cycle of waits that the first stuck operation leads into."""

    def waits_for(r: int, k: int) -> tuple[tuple[int, int], str]:
        op = programs[r][k]
        if posted[r][k]:
            return matching.partner[r][k], "its partner"  # type: ignore[return-value]  # a posted message has one
        pending = [d for d in op.deps if not done[r][d]]
        if pending:
            return (r, pending[0]), "its dependency"
        prev = matching.prev_in_queue[r][k]
        return (r, prev), "the earlier one of its FIFO queue to be posted"

    node = next((r, k) for r, p in enumerate(programs) for k in range(len(p)) if not done[r][k])
    path: list[tuple[int, int]] = []
    seen: dict[tuple[int, int], int] = {}
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = waits_for(*node)[0]
    cycle = path[seen[node]:]
    links = []
    for r, k in cycle[:6]:
        (wr, wk), how = waits_for(r, k)
        links.append(f"{_describe(r, k, programs[r][k])} waits for {how} {_describe(wr, wk, programs[wr][wk])}")
    more = f"; ... ({len(cycle) - 6} more)" if len(cycle) > 6 else ""
    return f"cycle of {len(cycle)} waits: " + "; ".join(links) + more
