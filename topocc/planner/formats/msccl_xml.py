"""MSCCL XML algorithms (the interchange format of MSCCL and RCCL), both ways.

An MSCCL file gives each GPU thread blocks (``<tb send recv chan>``), each an
ordered list of steps; a step may wait for one step of another thread block of
the same GPU (``depid``/``deps``).  Every ``(sender, receiver, chan)`` connection
belongs to exactly one thread block on each side, so MSCCL's FIFO matching per
connection is exactly our FIFO matching per ``(src, dst, channel)`` with
``Op.channel = chan``.

Import turns each step into operations (``rcs`` is a receive then a send, ``rrs``
a receive-reduce into a private scratch chunk then a send of it, ``nop`` only
dependency edges) and orders them as MSCCL does: steps of a thread block in
sequence, plus the cross-thread-block dependencies.  One difference is
deliberate: MSCCL sends are buffered (a send step finishes once its data is in
the connection's FIFO), while our execution model is rendezvous.  So a step
after a send does not wait for the send itself, only for what the send waited
for, except where it touches the chunk the send reads (then it depends on the
send, as MSCCL's ordering guarantees).  Without this, any thread block that
sends and then receives from a peer doing the same would deadlock.

Export partitions each rank's program into thread blocks (one per send
connection, one per receive connection, and chains of local copies and
reductions that add no ordering our schedule lacks), writes cross-thread-block
dependencies as ``depid``/``deps``, and inserts ``nop`` steps where an operation
waits for more than one other thread block.
"""

from __future__ import annotations

import heapq
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from topocc.planner.analysis.collectives import CollectiveSpec, spec
from topocc.planner.errors import ScheduleFormatError, VerificationError
from topocc.planner.formats._xml import read_text, read_xml
from topocc.runtime.collective import collective as describe
from topocc.runtime.schedule import Chunk, Copy, Metadata, Op, Schedule, build_schedule, operation

__all__ = ["MSCCL_COLLECTIVES", "STEP_TYPES", "export_msccl", "import_msccl", "parse_msccl"]

#: MSCCL ``coll`` names -> ours.
MSCCL_COLLECTIVES = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "reduce_scatter": "reducescatter",
    "reducescatter": "reducescatter",
    "alltoall": "alltoall",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
_EXPORT_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
                 "alltoall": "alltoall", "broadcast": "broadcast", "reduce": "reduce"}
#: The step types topocc reads.
STEP_TYPES = ("s", "r", "rcs", "rrc", "rrs", "rrcs", "cpy", "re", "nop")
#: maxBytes written when the schedule does not bound its sizes.
UNBOUNDED_BYTES = 1 << 40


def _mult(collective: str, ngpus: int) -> int:
    """MSCCL's chunk-size multiplier: chunks per loop cover ngpus x count for these collectives."""
    return ngpus if describe(collective).split else 1


def _shape(collective: str, ngpus: int, per_loop: int) -> tuple[int, int] | None:
    """(input chunks, output chunks) for ``nchunksperloop``, or None if it does not divide."""
    kind = describe(collective)
    if not kind.split:
        return per_loop, per_loop
    # the larger buffer holds ngpus rank blocks
    return kind.sizes(ngpus, per_loop // ngpus) if per_loop % ngpus == 0 else None


# --------------------------------------------------------------------------- import


@dataclass(frozen=True, slots=True)
class _Step:
    """One parsed ``<step>``; ``where`` names it for messages."""

    type: str
    src: Chunk | None
    dst: Chunk | None
    depid: int
    deps: int
    where: str


@dataclass(frozen=True, slots=True)
class _Tb:
    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[_Step, ...]
    where: str


@dataclass(slots=True)
class _Node:
    """An operation being built, with its MSCCL predecessors (``orig``) and its emitted deps."""

    op: Op
    orig: frozenset[int]
    where: str


class _Attrs:
    """Typed attribute access that names the element on failure."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str, fix: str | None = None) -> ScheduleFormatError:
        return ScheduleFormatError(message, where=f"{self.source}: {where}" if where else self.source, fix=fix)

    def int(self, elem: ET.Element, name: str, where: str, default: int | None = None, low: int | None = None) -> int:
        raw = elem.get(name)
        if raw is None:
            if default is None:
                raise self.fail(where, f"missing attribute {name!r}", fix=f"add {name}=\"...\"")
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            raise self.fail(where, f"attribute {name}={raw!r} is not an integer") from None
        if low is not None and value < low:
            raise self.fail(where, f"attribute {name}={value} is below {low}")
        return value


def import_msccl(path: str | Path) -> Schedule:
    """Read an MSCCL XML algorithm as a topocc :class:`Schedule` (verify it with ``topocc.planner.analysis.verify``).

    >>> s = import_msccl("ndv4-r48ll.xml")  # doctest: +SKIP
    >>> s.collective, s.ranks  # doctest: +SKIP
    ('allreduce', 8)
    """
    text = read_text(path, ScheduleFormatError, "MSCCL XML file")
    return parse_msccl(text, str(path))


def parse_msccl(text: str, source: str = "<msccl>") -> Schedule:
    """Like :func:`import_msccl`, from the XML text (``source`` names it in messages)."""
    root = read_xml(text, source, ScheduleFormatError, "MSCCL XML file")
    a = _Attrs(source)
    if root.tag != "algo":
        raise a.fail("", f"root element is <{root.tag}>, not <algo>", fix="pass an MSCCL algorithm XML file")
    coll_name = (root.get("coll") or "").strip()
    collective = MSCCL_COLLECTIVES.get(coll_name.lower())
    if collective is None:
        raise a.fail("algo", f"unsupported collective {coll_name!r}",
                     fix=f"topocc imports {', '.join(sorted(set(MSCCL_COLLECTIVES)))}")
    ngpus = a.int(root, "ngpus", "algo", low=1)
    per_loop = a.int(root, "nchunksperloop", "algo", low=1)
    shape = _shape(collective, ngpus, per_loop)
    if shape is None:
        raise a.fail("algo", f"nchunksperloop={per_loop} is not a multiple of ngpus={ngpus} for {coll_name}")
    n_in, n_out = shape
    inplace = root.get("inplace", "0").strip() == "1"
    gpus = [g for g in root if g.tag == "gpu"]
    seen: dict[int, ET.Element] = {}
    for g in gpus:
        gid = a.int(g, "id", "gpu", low=0)
        if gid >= ngpus:
            raise a.fail(f"gpu {gid}", f"gpu id {gid} is out of range (ngpus={ngpus})")
        if gid in seen:
            raise a.fail(f"gpu {gid}", "declared twice", fix="one <gpu> element per rank")
        seen[gid] = g
    if len(seen) != ngpus:
        missing = next(i for i in range(ngpus) if i not in seen)
        raise a.fail("algo", f"ngpus={ngpus} but gpu {missing} is missing", fix="one <gpu> element per rank")
    scratch_declared = max(a.int(g, "s_chunks", f"gpu {i}", 0, 0) for i, g in seen.items())

    parsed = {gid: _parse_gpu(a, seen[gid], gid, ngpus, n_in, n_out, scratch_declared) for gid in range(ngpus)}
    writes_input = (not inplace) and any(
        s.dst is not None and s.dst.buffer == "i" and s.type not in ("s", "nop")
        for tbs, _ in parsed.values() for tb in tbs for s in tb.steps
    )
    _check_connections(a, parsed)
    # Private scratch: a copy of the input (out-of-place files that write it), then per-tb rrs temporaries.
    input_copy = scratch_declared if writes_input else None
    base = scratch_declared + (n_in if writes_input else 0)
    scratch_total = base
    programs: list[list[Op]] = []
    sp = spec(collective, ngpus, n_in, n_out, _root(root, collective, parsed, a))
    for gid in range(ngpus):
        tbs, copies = parsed[gid]
        program, used = _lower_gpu(a, sp, inplace, gid, tbs, copies, input_copy, base)
        scratch_total = max(scratch_total, used)
        programs.append(program)
    meta = Metadata(
        algorithm=root.get("name") or "msccl",
        options={"source": "msccl-xml", "proto": root.get("proto", "Simple"),
                 "nchannels": a.int(root, "nchannels", "algo", 1), "nchunksperloop": per_loop},
        min_bytes=a.int(root, "minBytes", "algo", 0, 0),
        max_bytes=a.int(root, "maxBytes", "algo", -1) if root.get("maxBytes") is not None else None,
    )
    if meta.max_bytes is not None and meta.max_bytes < 0:
        meta = Metadata(meta.algorithm, meta.options, min_bytes=meta.min_bytes)
    return build_schedule(collective, ngpus, n_in, n_out, programs, scratch_chunks=scratch_total,
                          root=sp.root, inplace=inplace, metadata=meta)


def _root(root: ET.Element, collective: str, parsed: dict[int, tuple[list[_Tb], list[tuple[Chunk, Chunk]]]],
          a: _Attrs) -> int | None:
    """The root of broadcast/reduce: the ``root`` attribute, or the one rank that never receives (sends)."""
    kind = describe(collective)
    if not kind.rooted:
        return None
    if root.get("root") is not None:
        return a.int(root, "root", "algo", low=0)
    role = "recv" if kind.from_root else "send"
    quiet = [g for g, (tbs, _) in parsed.items()
             if not any(getattr(tb, role) >= 0 and any(s.type != "nop" for s in tb.steps) for tb in tbs)]
    return quiet[0] if len(quiet) == 1 else 0


def _parse_gpu(a: _Attrs, g: ET.Element, gid: int, ngpus: int, n_in: int, n_out: int,
               n_scratch: int) -> tuple[list[_Tb], list[tuple[Chunk, Chunk]]]:
    """Thread blocks of one ``<gpu>`` (sorted by id) and its TE-CCL style ``<copy i_off o_off>`` preamble."""
    limits = {"i": n_in, "o": n_out, "s": n_scratch}
    tbs: dict[int, _Tb] = {}
    copies: list[tuple[Chunk, Chunk]] = []
    for child in g:
        if child.tag == "copy":
            where = f"gpu {gid} copy"
            src = _chunk(a, "i", a.int(child, "i_off", where, low=0), 1, limits, where)
            dst = _chunk(a, "o", a.int(child, "o_off", where, low=0), 1, limits, where)
            copies.append((src, dst))
            continue
        if child.tag != "tb":
            continue
        tid = a.int(child, "id", f"gpu {gid} tb", low=0)
        where = f"gpu {gid} tb {tid}"
        if tid in tbs:
            raise a.fail(where, "thread block declared twice", fix="give each <tb> of a gpu a unique id")
        send = a.int(child, "send", where, -1, -1)
        recv = a.int(child, "recv", where, -1, -1)
        for role, peer in (("send", send), ("recv", recv)):
            if peer >= ngpus or peer == gid:
                raise a.fail(where, f"{role} peer {peer} is not another rank (ngpus={ngpus})")
        chan = a.int(child, "chan", where, 0, 0)
        steps = []
        for k, st in enumerate(x for x in child if x.tag == "step"):
            swhere = f"{where} step {k}"
            s_attr = a.int(st, "s", swhere, k)
            if s_attr != k:
                raise a.fail(swhere, f"step s={s_attr} is out of order (expected {k})", fix="number steps 0, 1, 2, ...")
            steps.append(_parse_step(a, st, swhere, limits, send, recv))
        tbs[tid] = _Tb(tid, send, recv, chan, tuple(steps), where)
    for tb in tbs.values():
        for step in tb.steps:
            if step.depid < 0:
                continue
            target = tbs.get(step.depid)
            if target is None or step.depid == tb.id:
                raise a.fail(step.where, f"depid={step.depid} names no other thread block of gpu {gid}")
            if not 0 <= step.deps < len(target.steps):
                raise a.fail(step.where, f"deps={step.deps} is not a step of gpu {gid} tb {step.depid} "
                                         f"(it has {len(target.steps)})")
    return [tbs[t] for t in sorted(tbs)], copies


_NEEDS = {  # step type -> (needs send peer, needs recv peer, uses src, uses dst)
    "s": (True, False, True, False),
    "r": (False, True, False, True),
    "rcs": (True, True, False, True),
    "rrc": (False, True, True, True),
    "rrs": (True, True, True, False),
    "rrcs": (True, True, True, True),
    "cpy": (False, False, True, True),
    "re": (False, False, True, True),
    "nop": (False, False, False, False),
}


def _chunk(a: _Attrs, buffer: str, index: int, count: int, limits: dict[str, int], where: str) -> Chunk:
    if buffer not in limits:
        raise a.fail(where, f"unknown buffer {buffer!r}", fix="use i (input), o (output) or s (scratch)")
    limit = limits[buffer]
    if index < 0 or index + count > limit:
        raise a.fail(where, f"chunks {index}..{index + count - 1} of buffer {buffer!r} are out of range "
                            f"(it has {limit})", fix="check the offsets, cnt and the gpu's i/o/s_chunks")
    return Chunk(buffer, index, count)


def _parse_step(a: _Attrs, st: ET.Element, where: str, limits: dict[str, int], send: int, recv: int) -> _Step:
    kind = (st.get("type") or "").strip()
    if kind not in _NEEDS:
        raise a.fail(where, f"unknown step type {kind!r}", fix=f"use one of {', '.join(STEP_TYPES)}")
    needs_send, needs_recv, uses_src, uses_dst = _NEEDS[kind]
    if needs_send and send < 0:
        raise a.fail(where, f"step type {kind} sends but the thread block has send=-1",
                     fix="set the tb's send peer")
    if needs_recv and recv < 0:
        raise a.fail(where, f"step type {kind} receives but the thread block has recv=-1",
                     fix="set the tb's recv peer")
    depid = a.int(st, "depid", where, -1, -1)
    deps = a.int(st, "deps", where, -1, -1)
    if (depid < 0) != (deps < 0):
        raise a.fail(where, f"depid={depid} and deps={deps} must both be -1 or both name a step")
    if kind == "nop":
        return _Step(kind, None, None, depid, deps, where)
    cnt = a.int(st, "cnt", where, 1, 1)
    src = dst = None
    if uses_src:
        src = _chunk(a, (st.get("srcbuf") or "").strip(), a.int(st, "srcoff", where), cnt, limits, where)
    if uses_dst:
        dst = _chunk(a, (st.get("dstbuf") or "").strip(), a.int(st, "dstoff", where), cnt, limits, where)
    return _Step(kind, src, dst, depid, deps, where)


def _check_connections(a: _Attrs, parsed: dict[int, tuple[list[_Tb], list[tuple[Chunk, Chunk]]]]) -> None:
    """Each (peer, chan) send or receive connection may belong to one thread block of a gpu."""
    for tbs, _ in parsed.values():
        owner: dict[tuple[str, int, int], int] = {}
        for tb in tbs:
            for role, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer < 0 or not any(_NEEDS[s.type][0 if role == "send" else 1] for s in tb.steps):
                    continue
                key = (role, peer, tb.chan)
                if key in owner:
                    raise a.fail(tb.where, f"{role} connection to gpu {peer} on chan {tb.chan} is also used by "
                                           f"tb {owner[key]}; MSCCL's FIFO matching would be ambiguous",
                                 fix="give each (peer, chan) connection to a single thread block")
                owner[key] = tb.id


def _lower_gpu(a: _Attrs, sp: CollectiveSpec, inplace: bool, gid: int, tbs: list[_Tb],
               copies: list[tuple[Chunk, Chunk]], input_copy: int | None, temp_base: int) -> tuple[list[Op], int]:
    """Turn one gpu's thread blocks into a program; returns it and the scratch chunks it uses."""
    nodes: list[_Node] = []
    preamble: set[int] = set()

    def redirect(ref: Chunk | None) -> Chunk | None:
        if ref is None or input_copy is None or ref.buffer != "i":
            return ref
        return Chunk("s", input_copy + ref.index, ref.count)

    if input_copy is not None:
        n_in = sp.input_chunks
        nodes.append(_Node(Copy(Chunk("i", 0, n_in), Chunk("s", input_copy, n_in)), frozenset(),
                           f"gpu {gid} input copy"))
        preamble.add(0)
    for src, dst in copies:
        if inplace and sp.alias(gid, src.buffer, src.index) == sp.alias(gid, dst.buffer, dst.index):
            continue  # TE-CCL's in-place "copy" of a chunk onto itself
        nodes.append(_Node(operation("copy", None, redirect(src), dst), frozenset(preamble), f"gpu {gid} copy"))
        preamble = {len(nodes) - 1}
    start = frozenset(preamble)

    # rrs reduces into a scratch temporary private to its thread block (MSCCL writes nothing there).
    temps: dict[int, int] = {}
    used = temp_base
    for tb in tbs:
        size = max((s.src.count for s in tb.steps if s.type == "rrs" and s.src is not None), default=0)
        if size:
            temps[tb.id] = used
            used += size

    by_id = {tb.id: tb for tb in tbs}
    done: dict[tuple[int, int], frozenset[int]] = {}
    for tid, k in _step_order(a, gid, tbs):
        tb, st = by_id[tid], by_id[tid].steps[k]
        before = done[(tid, k - 1)] if k else start
        if st.depid >= 0:
            before = before | done[(st.depid, st.deps)]
        ops = _expand(st, tb, temps.get(tid), redirect)
        for j, op in enumerate(ops):
            nodes.append(_Node(replace(op, step=k, channel=tb.chan),
                               before if j == 0 else frozenset({len(nodes) - 1}), st.where))
        done[(tid, k)] = frozenset({len(nodes) - 1}) if ops else before
    return _emit_deps(a, sp, inplace, gid, nodes), used


def _step_order(a: _Attrs, gid: int, tbs: list[_Tb]) -> list[tuple[int, int]]:
    """All (tb, step) of a gpu in an order respecting MSCCL's: step by step, thread blocks by id."""
    waiting: dict[tuple[int, int], int] = {}
    after: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for tb in tbs:
        for k, st in enumerate(tb.steps):
            preds = ([(tb.id, k - 1)] if k else []) + ([(st.depid, st.deps)] if st.depid >= 0 else [])
            waiting[(tb.id, k)] = len(preds)
            for p in preds:
                after.setdefault(p, []).append((tb.id, k))
    heap = [(k, t) for (t, k), n in waiting.items() if n == 0]
    heapq.heapify(heap)
    order: list[tuple[int, int]] = []
    while heap:
        k, t = heapq.heappop(heap)
        order.append((t, k))
        for nxt in after.get((t, k), ()):
            waiting[nxt] -= 1
            if not waiting[nxt]:
                heapq.heappush(heap, (nxt[1], nxt[0]))
    if len(order) != len(waiting):
        t, k = next(key for key, n in waiting.items() if n > 0)
        raise a.fail(f"gpu {gid} tb {t} step {k}", "cyclic depid/deps: this step waits (through other "
                     "steps) for itself", fix="remove the cycle from the dependencies")
    return order


def _expand(st: _Step, tb: _Tb, temp: int | None, redirect: Callable[[Chunk | None], Chunk | None]) -> list[Op]:
    """The operations of one step (peers and buffers filled in; deps and channel set by the caller).

    ``redirect`` maps the input buffer to its scratch copy where an out-of-place file writes its input.
    """
    src, dst = redirect(st.src), redirect(st.dst)
    t = st.type
    if t == "s":
        return [operation("send", tb.send, src)]
    if t == "r":
        return [operation("recv", tb.recv, None, dst)]
    if t == "rcs":
        return [operation("recv", tb.recv, None, dst), operation("send", tb.send, dst)]
    if t in ("rrc", "rrcs"):
        left = None if src == dst else src
        ops = [operation("recv_reduce", tb.recv, left, dst)]
        return [*ops, operation("send", tb.send, dst)] if t == "rrcs" else ops
    if t == "rrs":
        assert temp is not None and src is not None
        tmp = Chunk("s", temp, src.count)
        return [operation("recv_reduce", tb.recv, src, tmp), operation("send", tb.send, tmp)]
    if t == "cpy":
        return [operation("copy", None, src, dst)]
    if t == "re":
        return [operation("reduce", None, src, dst)]
    return []


def _accesses(op: Op) -> tuple[list[Chunk], Chunk | None]:
    if op.kind == "send":
        return [op.src], None
    if op.kind == "recv":
        return [], op.dst
    return [c for c in (op.src, op.dst) if c is not None], op.dst


def _emit_deps(a: _Attrs, sp: CollectiveSpec, inplace: bool, gid: int, nodes: list[_Node]) -> list[Op]:
    """Dependencies for our model: MSCCL's order, relaxed past buffered sends except for data hazards."""
    n = len(nodes)
    orig_anc = [0] * n  # MSCCL happens-before
    anc = [0] * n  # what our deps imply
    deps: list[set[int]] = [set() for _ in range(n)]
    last_write: dict[tuple[str, int], int] = {}
    readers: dict[tuple[str, int], list[int]] = {}

    def locations(ref: Chunk) -> list[tuple[str, int]]:
        if inplace:
            return [sp.alias(gid, ref.buffer, ref.index + j) for j in range(ref.count)]
        return [(ref.buffer, ref.index + j) for j in range(ref.count)]

    for k, node in enumerate(nodes):
        mask = 0
        for p in node.orig:
            mask |= orig_anc[p] | (1 << p)
            # A buffered send holds up nobody: inherit what it waited for instead.
            deps[k].update(deps[p] if nodes[p].op.kind == "send" else (p,))
        orig_anc[k] = mask
        have = 0
        for d in deps[k]:
            have |= anc[d] | (1 << d)

        def need(other: int, what: str, node: _Node = node, k: int = k) -> None:
            nonlocal have
            if (have >> other) & 1:
                return
            if not (orig_anc[k] >> other) & 1:
                raise VerificationError(
                    f"{node.where} {what} {nodes[other].where} touches, and no depid/deps chain orders them "
                    "(MSCCL would run them concurrently: a data race)",
                    where=a.source, fix=f"add a dependency of {node.where} on {nodes[other].where}",
                )
            deps[k].add(other)
            have |= anc[other] | (1 << other)

        reads, write = _accesses(node.op)
        for ref in reads:
            for loc in locations(ref):
                if loc in last_write:
                    need(last_write[loc], "reads a chunk that")
        if write is not None:
            for loc in locations(write):
                if loc in last_write and last_write[loc] != k:
                    need(last_write[loc], "writes a chunk that")
                for r in readers.get(loc, ()):
                    if r != k:
                        need(r, "overwrites a chunk that")
        for ref in reads:
            for loc in locations(ref):
                readers.setdefault(loc, []).append(k)
        if write is not None:
            for loc in locations(write):
                last_write[loc] = k
                readers[loc] = []
        anc[k] = have
    program = []
    for k, node in enumerate(nodes):
        kept = tuple(sorted(d for d in deps[k] if not any((anc[e] >> d) & 1 for e in deps[k] if e != d)))
        program.append(replace(node.op, deps=kept))
    return program


# --------------------------------------------------------------------------- export


def _match(schedule: Schedule) -> dict[tuple[int, int], tuple[int, int]]:
    """Partner of every send and receive, FIFO per (src, dst, channel)."""
    queues: dict[tuple[int, int, int], tuple[list[int], list[int]]] = {}
    for rank, program in enumerate(schedule.programs):
        for k, op in enumerate(program):
            if op.kind == "send":
                queues.setdefault((rank, op.peer, op.channel), ([], []))[0].append(k)
            elif op.kind in ("recv", "recv_reduce"):
                queues.setdefault((op.peer, rank, op.channel), ([], []))[1].append(k)
    partner: dict[tuple[int, int], tuple[int, int]] = {}
    for (src, dst, ch), (sends, recvs) in queues.items():
        if len(sends) != len(recvs):
            raise ScheduleFormatError(
                f"rank {src} sends {len(sends)} message(s) to rank {dst} on channel {ch} but rank {dst} "
                f"receives {len(recvs)}", where=f"{schedule.collective} schedule ({schedule.metadata.algorithm})",
                fix="verify the schedule before exporting it")
        for s, r in zip(sends, recvs):
            partner[(src, s)] = (dst, r)
            partner[(dst, r)] = (src, s)
    return partner


@dataclass(slots=True)
class _OutTb:
    send: int
    recv: int
    chan: int
    entries: list[tuple[int | None, int | None]]  # (op index, or None for a nop; the op it waits for)


def _partition(program: tuple[Op, ...], chan_index: dict[int, int]) -> tuple[list[_OutTb], list[int]]:
    """Thread blocks of one rank and the thread block of each op."""
    tbs: list[_OutTb] = []
    keyed: dict[tuple[str, int, int], int] = {}
    tb_of: list[int] = []
    anc: list[int] = []
    local_tails: list[int] = []  # tb indices of local chains
    for k, op in enumerate(program):
        mask = 0
        for d in op.deps:
            mask |= anc[d] | (1 << d)
        anc.append(mask)
        if op.kind in ("send", "recv", "recv_reduce"):
            role = "s" if op.kind == "send" else "r"
            key: tuple[str, int, int] = (role, op.peer, op.channel)
            if key not in keyed:
                keyed[key] = len(tbs)
                chan = chan_index[op.channel]
                tbs.append(_OutTb(key[1] if role == "s" else -1, key[1] if role == "r" else -1, chan, []))
            t = keyed[key]
        else:
            # A chain of local ops may only grow by an op that already waits for the chain's last op.
            t = next((c for c in local_tails if (mask >> tbs[c].entries[-1][0]) & 1), -1)  # type: ignore[operator]  # no nops yet
            if t < 0:
                t = len(tbs)
                tbs.append(_OutTb(-1, -1, 0, []))
                local_tails.append(t)
        tbs[t].entries.append((k, None))
        tb_of.append(t)
    return tbs, tb_of


def export_msccl(schedule: Schedule, *, proto: str = "Simple", name: str | None = None,
                 min_bytes: int | None = None, max_bytes: int | None = None) -> str:
    """MSCCL XML text for ``schedule`` (load it with MSCCL/RCCL's ``MSCCL_XML_FILES``).

    >>> xml = export_msccl(schedule, proto="LL")  # doctest: +SKIP
    """
    if proto not in ("Simple", "LL", "LL128"):
        raise ScheduleFormatError(f"unknown MSCCL protocol {proto!r}", fix="use Simple, LL or LL128")
    n = schedule.ranks
    partner = _match(schedule)
    channels = sorted({op.channel for p in schedule.programs for op in p if op.peer is not None}) or [0]
    chan_index = {c: i for i, c in enumerate(channels)}
    per_loop = schedule.output_chunks if describe(schedule.collective).gathers else schedule.input_chunks
    meta = schedule.metadata
    lo = meta.min_bytes if min_bytes is None else min_bytes
    hi = (meta.max_bytes if meta.max_bytes is not None else UNBOUNDED_BYTES) if max_bytes is None else max_bytes
    attrs = {
        "name": name or meta.algorithm, "proto": proto, "nchannels": str(len(channels)),
        "nchunksperloop": str(per_loop), "ngpus": str(n), "coll": _EXPORT_NAMES[schedule.collective],
        "inplace": "1" if schedule.inplace else "0", "outofplace": "0" if schedule.inplace else "1",
        "minBytes": str(lo), "maxBytes": str(hi),
    }
    if schedule.root is not None:
        attrs["root"] = str(schedule.root)
    algo = ET.Element("algo", attrs)
    for rank, program in enumerate(schedule.programs):
        tbs, tb_of = _partition(program, chan_index)
        _add_cross_deps(program, tbs, tb_of)
        position: dict[int, tuple[int, int]] = {}
        for t, tb in enumerate(tbs):
            for s, (k, _) in enumerate(tb.entries):
                if k is not None:
                    position[k] = (t, s)
        targets = {position[d] for tb in tbs for _, d in tb.entries if d is not None}
        gpu = ET.SubElement(algo, "gpu", {
            "id": str(rank), "i_chunks": str(schedule.input_chunks), "o_chunks": str(schedule.output_chunks),
            "s_chunks": str(schedule.scratch_chunks)})
        for t, tb in enumerate(tbs):
            el = ET.SubElement(gpu, "tb", {"id": str(t), "send": str(tb.send), "recv": str(tb.recv),
                                          "chan": str(tb.chan)})
            for s, (k, dep) in enumerate(tb.entries):
                dep_at = position[dep] if dep is not None else (-1, -1)
                step = _step_attrs(schedule, rank, k, partner)
                step.update({"depid": str(dep_at[0]), "deps": str(dep_at[1]),
                             "hasdep": "1" if (t, s) in targets else "0"})
                ET.SubElement(el, "step", {"s": str(s), **step})
    ET.indent(algo, space="  ")
    return ET.tostring(algo, encoding="unicode") + "\n"


def _add_cross_deps(program: tuple[Op, ...], tbs: list[_OutTb], tb_of: list[int]) -> None:
    """Rewrite each tb's entries so every cross-tb dependency is one depid/deps, adding nops for extras.

    Dependencies already implied (by the tb's own order or through other dependencies) are dropped.
    """
    anc = [0] * len(program)
    last_in_tb: dict[int, int] = {}
    new_entries: list[list[tuple[int | None, int | None]]] = [[] for _ in tbs]
    for k, op in enumerate(program):
        t = tb_of[k]
        have = 0
        prev = last_in_tb.get(t)
        if prev is not None:
            have = anc[prev] | (1 << prev)
        cands = sorted((d for d in op.deps if not (have >> d) & 1), reverse=True)
        kept: list[int] = []
        implied = 0
        for d in cands:  # latest first: its ancestors cover earlier candidates
            if (implied >> d) & 1:
                continue
            kept.append(d)
            implied |= anc[d] | (1 << d)
        for d in kept[1:]:
            new_entries[t].append((None, d))
        new_entries[t].append((k, kept[0] if kept else None))
        anc[k] = have | implied
        last_in_tb[t] = k
    for t, tb in enumerate(tbs):
        tb.entries = new_entries[t]


def _ref(chunk: Chunk | None) -> tuple[str, str]:
    return (chunk.buffer, str(chunk.index)) if chunk is not None else ("i", "-1")


def _step_attrs(schedule: Schedule, rank: int, k: int | None,
                partner: dict[tuple[int, int], tuple[int, int]]) -> dict[str, str]:
    """type/srcbuf/srcoff/dstbuf/dstoff/cnt of one step (a nop when ``k`` is None)."""
    if k is None:
        return {"type": "nop", "srcbuf": "i", "srcoff": "-1", "dstbuf": "o", "dstoff": "-1", "cnt": "0"}
    op = schedule.programs[rank][k]
    src: Chunk | None
    dst: Chunk | None
    if op.kind == "send":
        pr, pk = partner[(rank, k)]
        kind, src, dst = "s", op.src, schedule.programs[pr][pk].dst
    elif op.kind == "recv":
        pr, pk = partner[(rank, k)]
        kind, src, dst = "r", schedule.programs[pr][pk].src, op.dst
    elif op.kind == "recv_reduce":
        kind, src, dst = "rrc", op.src if op.src is not None else op.dst, op.dst
    elif op.kind == "copy":
        kind, src, dst = "cpy", op.src, op.dst
    else:
        kind, src, dst = "re", op.src, op.dst
    (sb, so), (db, do) = _ref(src), _ref(dst)
    return {"type": kind, "srcbuf": sb, "srcoff": so, "dstbuf": db, "dstoff": do, "cnt": str(op.count)}

