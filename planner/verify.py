"""Prove a schedule correct by symbolic execution.

Three properties, each with a precise error when it fails:

* every send has exactly one matching receive (FIFO per rank pair and channel)
  of the same length, and no rank reads a chunk it has not received or computed;
* no data race: two operations of a rank that touch the same chunk, one of them
  writing, are ordered by that rank's dependencies (the runtime runs unordered
  operations concurrently);
* the schedule terminates under rendezvous semantics (no deadlock) and leaves
  every output chunk holding exactly the value the collective specifies: for a
  reduction, each rank's contribution exactly once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from planner.collectives import CollectiveSpec, Value, spec
from planner.errors import VerificationError
from runtime.schedule import OP_KINDS, Chunk, Op, Schedule, chunking_problem

__all__ = ["VerifyReport", "verify"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What the verifier checked: sizes of the proof, for display."""

    collective: str
    ranks: int
    operations: int
    messages: int
    chunks_sent: int


def _fail(schedule: Schedule, message: str, fix: str | None = None) -> VerificationError:
    name = schedule.metadata.algorithm
    return VerificationError(message, where=f"{schedule.collective} schedule ({name})", fix=fix)


def _describe(rank: int, k: int, op: Op) -> str:
    what = op.kind
    if op.peer is not None:
        what += f" {'to' if op.kind == 'send' else 'from'} rank {op.peer}"
        if op.channel:
            what += f" ch {op.channel}"
    refs = " ".join(str(c) for c in (op.src, op.dst) if c is not None)
    return f"rank {rank} op {k} ({what} {refs})"


def _check_structure(schedule: Schedule, sp: CollectiveSpec) -> None:
    """Re-check what the loader checks, for schedules built in memory by an algorithm."""
    if len(schedule.programs) != schedule.ranks:
        raise _fail(schedule, f"{len(schedule.programs)} programs for {schedule.ranks} ranks")
    problem = chunking_problem(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks)
    if problem:
        raise _fail(schedule, problem)
    for rank, program in enumerate(schedule.programs):
        for k, op in enumerate(program):
            has_peer, has_src, has_dst = OP_KINDS.get(op.kind, (None, None, None))
            if has_peer is None:
                raise _fail(schedule, f"rank {rank} op {k}: unknown operation {op.kind!r}")
            if has_peer and (op.peer is None or not 0 <= op.peer < schedule.ranks or op.peer == rank):
                raise _fail(schedule, f"rank {rank} op {k}: invalid peer {op.peer}")
            if (has_src and op.src is None) or (has_dst and op.dst is None):
                raise _fail(schedule, f"rank {rank} op {k}: {op.kind} lacks a chunk reference")
            for ref in (op.src, op.dst):
                if ref is not None and not (
                    ref.buffer in ("i", "o", "s") and ref.index >= 0 and ref.count >= 1
                    and ref.index + ref.count <= schedule.chunk_count(ref.buffer)
                ):
                    raise _fail(schedule, f"{_describe(rank, k, op)}: chunk reference out of range")
            if op.src is not None and op.dst is not None and op.src.count != op.dst.count:
                raise _fail(schedule, f"{_describe(rank, k, op)}: src and dst lengths differ")
            if any(not 0 <= d < k for d in op.deps):
                raise _fail(schedule, f"rank {rank} op {k}: dependencies must name earlier operations")
            if not schedule.inplace and op.dst is not None and op.dst.buffer == "i":
                raise _fail(
                    schedule, f"{_describe(rank, k, op)} writes the input buffer of an out-of-place collective",
                    fix="write to output or scratch, or mark the schedule inplace",
                )


class _Memory:
    """One rank's buffers, with in-place aliasing resolved to (storage, offset)."""

    def __init__(self, schedule: Schedule, sp: CollectiveSpec, rank: int) -> None:
        inp: list[Value | None] = [None] * schedule.input_chunks
        out: list[Value | None] = [None] * schedule.output_chunks
        scratch: list[Value | None] = [None] * schedule.scratch_chunks
        self.store = {"i": (inp, 0), "o": (out, 0), "s": (scratch, 0)}
        if schedule.inplace:
            for name in ("i", "o"):
                target, offset = sp.alias(rank, name, 0)
                if target != name:
                    self.store[name] = ({"i": inp, "o": out}[target], offset)
        base, offset = self.store["i"]
        for j, value in enumerate(sp.initial(rank)):
            base[offset + j] = value
        self.n_out = schedule.output_chunks

    def locations(self, ref: Chunk) -> list[tuple[int, int]]:
        """Identity of each chunk of ``ref`` after aliasing, for race detection."""
        base, offset = self.store[ref.buffer]
        return [(id(base), offset + ref.index + j) for j in range(ref.count)]

    def read(self, ref: Chunk) -> list[Value | None]:
        base, offset = self.store[ref.buffer]
        start = offset + ref.index
        return base[start:start + ref.count]

    def write(self, ref: Chunk, values: list[Value]) -> None:
        base, offset = self.store[ref.buffer]
        start = offset + ref.index
        base[start:start + ref.count] = values

    def outputs(self) -> list[Value | None]:
        base, offset = self.store["o"]
        return base[offset:offset + self.n_out]


def _accesses(op: Op) -> tuple[tuple[Chunk, ...], Chunk | None]:
    """(chunks read, chunk written) by an operation."""
    if op.kind == "send":
        return (op.src,), None  # type: ignore[return-value]
    if op.kind == "recv":
        return (), op.dst
    if op.kind == "recv_reduce":
        return tuple(c for c in (op.src, op.dst) if c is not None), op.dst
    if op.kind == "copy":
        return (op.src,), op.dst  # type: ignore[return-value]
    return (op.src, op.dst), op.dst  # type: ignore[return-value]


def _check_races(schedule: Schedule, rank: int, program: tuple[Op, ...], memory: _Memory) -> None:
    """Conflicting accesses to a chunk must be ordered by the rank's dependency closure."""
    ancestors: list[int] = []
    last_write: dict[tuple[int, int], int] = {}
    readers: dict[tuple[int, int], list[int]] = {}
    for k, op in enumerate(program):
        mask = 0
        for d in op.deps:
            mask |= ancestors[d] | (1 << d)
        ancestors.append(mask)
        reads, write = _accesses(op)
        for ref in reads:
            for loc in memory.locations(ref):
                w = last_write.get(loc)
                if w is not None and not (mask >> w) & 1:
                    raise _race(schedule, rank, program, w, k, "reads a chunk that")
                readers.setdefault(loc, []).append(k)
        if write is not None:
            for loc in memory.locations(write):
                w = last_write.get(loc)
                if w is not None and w != k and not (mask >> w) & 1:
                    raise _race(schedule, rank, program, w, k, "writes a chunk that")
                for reader in readers.get(loc, ()):
                    if reader != k and not (mask >> reader) & 1:
                        raise _race(schedule, rank, program, reader, k, "overwrites a chunk that", "reads")
                last_write[loc] = k
                readers[loc] = []


def _race(schedule: Schedule, rank: int, program: tuple[Op, ...], first: int, second: int, what: str,
          verb: str = "writes") -> VerificationError:
    return _fail(
        schedule,
        f"data race: {_describe(rank, second, program[second])} {what} "
        f"{_describe(rank, first, program[first])} {verb}, without depending on it",
        fix=f"add {first} to the deps of op {second}",
    )


def _match(schedule: Schedule) -> tuple[list[list[tuple[int, int] | None]], int]:
    """Pair every send with its receive (FIFO per (sender, receiver, channel))."""
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for rank, program in enumerate(schedule.programs):
        for k, op in enumerate(program):
            if op.kind == "send":
                sends.setdefault((rank, op.peer, op.channel), []).append(k)  # type: ignore[arg-type]
            elif op.kind in ("recv", "recv_reduce"):
                recvs.setdefault((op.peer, rank, op.channel), []).append(k)  # type: ignore[arg-type]
    partner: list[list[tuple[int, int] | None]] = [[None] * len(p) for p in schedule.programs]
    messages = 0
    for key in sends.keys() | recvs.keys():
        src, dst, ch = key
        s, r = sends.get(key, []), recvs.get(key, [])
        if len(s) != len(r):
            chan = f" on channel {ch}" if ch else ""
            raise _fail(
                schedule,
                f"rank {src} sends {len(s)} message(s) to rank {dst}{chan} but rank {dst} receives {len(r)}",
                fix="every send needs exactly one matching receive",
            )
        for ks, kr in zip(s, r):
            send, recv = schedule.programs[src][ks], schedule.programs[dst][kr]
            if send.count != recv.count:
                raise _fail(
                    schedule,
                    f"{_describe(src, ks, send)} sends {send.count} chunk(s) but "
                    f"{_describe(dst, kr, recv)} receives {recv.count}",
                )
            partner[src][ks] = (dst, kr)
            partner[dst][kr] = (src, ks)
            messages += 1
    return partner, messages


def _combine(schedule: Schedule, where: str, left: Value | None, right: Value | None) -> Value:
    if left is None or right is None:
        raise _fail(schedule, f"{where} reduces a chunk that holds no data yet", fix="receive or copy into it first")
    if left[0] != right[0]:
        raise _fail(schedule, f"{where} reduces logical chunk {right[0]} into logical chunk {left[0]}")
    if left[1] & right[1]:
        twice = _ranks(left[1] & right[1])
        raise _fail(schedule, f"{where} counts the contribution of rank(s) {twice} twice")
    return left[0], left[1] | right[1]


def _ranks(mask: int) -> str:
    ranks = [i for i in range(mask.bit_length()) if (mask >> i) & 1]
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def _read_defined(schedule: Schedule, memory: _Memory, ref: Chunk, where: str) -> list[Value]:
    values = memory.read(ref)
    if any(v is None for v in values):
        raise _fail(schedule, f"{where} reads {ref}, which holds no data yet")
    return values  # type: ignore[return-value]


def verify(schedule: Schedule) -> VerifyReport:
    """Prove that ``schedule`` implements its collective; raise :class:`VerificationError` if not.

    >>> from planner.algorithms import compile_schedule  # doctest: +SKIP
    >>> verify(compile_schedule(topology, "allreduce", "ring"))  # doctest: +SKIP
    """
    sp = spec(schedule.collective, schedule.ranks, schedule.input_chunks, schedule.output_chunks, schedule.root)
    _check_structure(schedule, sp)
    partner, messages = _match(schedule)
    memories = [_Memory(schedule, sp, r) for r in range(schedule.ranks)]
    for rank, program in enumerate(schedule.programs):
        _check_races(schedule, rank, program, memories[rank])

    programs = schedule.programs
    waiting = [[len(op.deps) for op in p] for p in programs]
    dependents: list[list[list[int]]] = [[[] for _ in p] for p in programs]
    for rank, program in enumerate(programs):
        for k, op in enumerate(program):
            for d in op.deps:
                dependents[rank][d].append(k)
    posted = [[False] * len(p) for p in programs]
    done = [[False] * len(p) for p in programs]
    ready = deque((r, k) for r, p in enumerate(programs) for k, op in enumerate(p) if not op.deps)
    completed = 0
    chunks_sent = 0

    def complete(r: int, k: int) -> None:
        nonlocal completed
        done[r][k] = True
        completed += 1
        for j in dependents[r][k]:
            waiting[r][j] -= 1
            if not waiting[r][j]:
                ready.append((r, j))

    while ready:
        r, k = ready.popleft()
        op = programs[r][k]
        mem = memories[r]
        where = _describe(r, k, op)
        if op.kind in ("copy", "reduce"):
            values = _read_defined(schedule, mem, op.src, where)  # type: ignore[arg-type]
            if op.kind == "reduce":
                values = [_combine(schedule, where, a, b) for a, b in zip(mem.read(op.dst), values)]  # type: ignore[arg-type]
            mem.write(op.dst, values)  # type: ignore[arg-type]
            complete(r, k)
            continue
        pr, pk = partner[r][k]  # type: ignore[misc]
        if not posted[pr][pk]:
            posted[r][k] = True
            continue
        send_r, send_k, recv_r, recv_k = (r, k, pr, pk) if op.kind == "send" else (pr, pk, r, k)
        send, recv = programs[send_r][send_k], programs[recv_r][recv_k]
        rwhere = _describe(recv_r, recv_k, recv)
        payload = _read_defined(schedule, memories[send_r], send.src, _describe(send_r, send_k, send))  # type: ignore[arg-type]
        rmem = memories[recv_r]
        if recv.kind == "recv_reduce":
            base = rmem.read(recv.src if recv.src is not None else recv.dst)  # type: ignore[arg-type]
            payload = [_combine(schedule, rwhere, a, b) for a, b in zip(base, payload)]
        rmem.write(recv.dst, payload)  # type: ignore[arg-type]
        chunks_sent += send.count
        complete(send_r, send_k)
        complete(recv_r, recv_k)

    total = schedule.op_count
    if completed != total:
        raise _fail(schedule, "deadlock: " + _explain_deadlock(programs, done, posted, partner))

    for rank, mem in enumerate(memories):
        actual = mem.outputs()
        for c, want in enumerate(sp.expected(rank)):
            if want is None or actual[c] == want:
                continue
            raise _fail(schedule, f"rank {rank} output chunk {c}: " + _explain_value(actual[c], want))
    return VerifyReport(schedule.collective, schedule.ranks, total, messages, chunks_sent)


def _explain_value(actual: Value | None, want: Value) -> str:
    if actual is None:
        return "never written"
    if actual[0] != want[0]:
        return f"holds logical chunk {actual[0]} instead of {want[0]}"
    missing, extra = want[1] & ~actual[1], actual[1] & ~want[1]
    parts = []
    if missing:
        parts.append(f"lacks the contribution of rank(s) {_ranks(missing)}")
    if extra:
        parts.append(f"wrongly includes rank(s) {_ranks(extra)}")
    return " and ".join(parts)


def _explain_deadlock(programs: tuple[tuple[Op, ...], ...], done: list[list[bool]], posted: list[list[bool]],
                      partner: list[list[tuple[int, int] | None]]) -> str:
    """Follow the chain of waits from the first stuck operation, a few links deep."""
    r, k = next((r, k) for r, p in enumerate(programs) for k in range(len(p)) if not done[r][k])
    chain: list[str] = []
    seen: set[tuple[int, int]] = set()
    while (r, k) not in seen and len(chain) < 4:
        seen.add((r, k))
        op = programs[r][k]
        pending = [d for d in op.deps if not done[r][d]]
        if pending:
            chain.append(f"{_describe(r, k, op)} waits for its dependency op {pending[0]}")
            k = pending[0]
            continue
        pr, pk = partner[r][k]  # type: ignore[misc]
        chain.append(f"{_describe(r, k, op)} waits for {_describe(pr, pk, programs[pr][pk])}")
        r, k = pr, pk
    return "; ".join(chain)
