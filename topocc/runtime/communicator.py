"""The public face of the runtime: a communicator that replays compiled schedules.

Over a :class:`~topocc.runtime.transports.Transport` (MPI, gloo) it replays a rank's
program as dataflow (``topocc.runtime.executor``); over a
:class:`~topocc.runtime.transports.GroupTransport` (NCCL, or MPI with NCCL's
semantics) it replays the schedule's lowering group by group
(``topocc.runtime.lowering``, ``topocc.runtime.group_executor``).

>>> comm = Communicator("schedules/ring_allreduce.json")      # doctest: +SKIP
>>> comm.allreduce(grad)                                        # doctest: +SKIP

Failure behaviour
-----------------
* Refused before any data moves (:class:`~topocc.runtime.errors.CommunicatorError`):
  a communicator size different from the schedule's rank count, a topology
  fingerprint mismatch, ranks holding different schedules (checked once, at
  construction), an unsupported dtype or op, sizes that do not fit the
  collective, and ranks calling with different dtypes or sizes (checked by a
  set-up handshake the first time each (schedule, dtype, size) is used).
* Everything else that goes wrong with a peer (it died, hangs, or runs a
  different schedule) ends in a ``timeout``: the rank raises a one-line
  CommunicatorError naming the peers it was still waiting for, and the
  communicator refuses further calls.  A stream-ordered transport (NCCL)
  returns before the data has moved, so its watchdog finds the failure: the
  same line goes to stderr at once, and the next call raises it.
* At interpreter exit, a process whose communicator failed prints that line
  again and leaves with ``os._exit(5)`` instead of running ``MPI_Finalize``
  (which would wait forever for the dead peer); a healthy process first checks,
  with a barrier bounded by ``timeout``, that every peer reached its exit too,
  then closes its communicators and, where every rank of torch.distributed's
  world is at exit, destroys torch's process groups (gloo or topocc's) before
  the interpreter finalizes (see ``_release_torch_groups``: gloo's worker threads
  otherwise abort the process with std::terminate).

With MPICH's hydra ``mpiexec``, the death of a rank makes hydra kill every other
rank at once unless ``-disable-auto-cleanup`` is given; pass it to see each
surviving rank's message (``topocc.runtime.harness.launch`` always does).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import os
import sys
import time
import weakref
import zlib
from collections.abc import Callable
from typing import Any

from topocc.runtime.arrays import DTYPE_NAMES, NUMPY_OPS, ArrayOps, same_memory
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.executor import Program, block_elements, message_tag_space
from topocc.runtime.feedback import Residual
from topocc.runtime.group_executor import Work
from topocc.runtime.lowering import DEFAULT_GROUP_BYTES
from topocc.runtime.plan import AnyPlan, LazyPlan, PlanSource, as_plan
from topocc.runtime.replay import DataflowReplay, Events, LoweredReplay, Replay
from topocc.runtime.schedule import Schedule, dump_schedule
from topocc.runtime.transports import GroupTransport, PeerFailure, Transport

__all__ = ["Communicator", "PlanSource", "select_schedule"]


def select_schedule(plan: AnyPlan, nbytes: int) -> Schedule:
    """The schedule for a call moving ``nbytes`` (the larger of the input and output buffers, as nccl-tests)."""
    return plan.select(nbytes)


#: Open communicators by creation number: every rank creates its communicators in the same order, so the exit
#: guard's barriers (one per communicator, possibly over different transports) meet in the same order everywhere.
_LIVE: weakref.WeakValueDictionary[int, Communicator] = weakref.WeakValueDictionary()
_CREATED = itertools.count()
_FAILURES: list[CommunicatorError] = []
_GUARD_INSTALLED = False


def _exit_guard() -> None:
    """At exit: skip MPI_Finalize after a failure; otherwise bound the wait for peers, then tear down."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if _FAILURES:
        err = _FAILURES[0]
        os.write(2, f"topocc: {err.one_line()} [exiting without MPI_Finalize]\n".encode())
        os._exit(err.exit_code)
    met: list[Communicator] = []  # the open communicators whose every peer reached exit, in creation order
    for _, comm in sorted(_LIVE.items()):
        if comm._closed:
            continue
        try:
            reached = comm.transport.barrier(comm.timeout)
        except PeerFailure:
            reached = False
        except Exception:  # the transport was torn down under it (a destroyed process group): nothing to wait for
            continue
        if not reached:
            os.write(2, f"topocc: rank {comm.rank}: not every peer reached exit within {comm.timeout:g} s "
                        "(a rank died or hangs); exiting without MPI_Finalize\n".encode())
            os._exit(CommunicatorError.exit_code)
        met.append(comm)
    _tear_down(met)


def _tear_down(met: list[Communicator]) -> None:
    """Once every peer reached exit: close ``met`` in creation order (every rank closes the same ones in the same
    order, as collective closes need), then release torch.distributed's groups (:func:`_release_torch_groups`)."""
    for comm in met:
        try:
            comm.close()
        except Exception as exc:  # one line, as every failure at exit; MPI_Finalize could wait on what failed
            os.write(2, f"topocc: rank {comm.rank}: closing at exit: {exc}; exiting without MPI_Finalize\n".encode())
            os._exit(CommunicatorError.exit_code)
    _release_torch_groups(max((comm.size for comm in met), default=0))


def _release_torch_groups(ranks_at_exit: int) -> None:
    """Destroy torch.distributed's process groups, then collect, where every rank of its world is at exit (the
    largest communicator whose exit barrier passed, ``ranks_at_exit`` ranks, spans it) and its backends are gloo
    or topocc's.

    gloo runs a collective on a worker thread, which drops the call's tensors a moment after the caller saw it
    complete; dropping the last hold on a tensor whose Python object is gone takes the GIL, and a thread that
    takes the GIL once the interpreter finalizes ends the process in std::terminate ("terminate called without
    an active exception"). A group freed here, while threads may still take the GIL, joins its worker threads
    first; one the program still holds (in a variable, a DDP model) is freed at finalization, as without this.
    """
    dist = sys.modules.get("torch.distributed")  # loaded by the program, or not at all: never imported here
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    backends = {part.rpartition(":")[2] for part in str(dist.get_backend()).split(",")}
    if dist.get_world_size() > ranks_at_exit or not backends <= {"gloo", "topocc"}:
        return
    try:
        dist.destroy_process_group()
    except Exception as exc:  # the groups then go at finalization, as without this: say so, in one line
        os.write(2, f"topocc: could not destroy torch.distributed's process groups at exit: {exc}\n".encode())
        return
    gc.collect()


def _install_guard() -> None:
    global _GUARD_INSTALLED
    if not _GUARD_INSTALLED:
        atexit.register(_exit_guard)  # after mpi4py's import, so it runs before MPI finalizes
        _GUARD_INSTALLED = True


#: One traced operation: (rank, call number, collective, algorithm, op index, kind, peer, channel, elements,
#: start, end); times are ``time.perf_counter()`` seconds, one clock for every process of a machine.
TraceRecord = tuple[int, int, str, str, int, str, int | None, int, int, float, float]


def _rank_count_fix(ranks: int, size: int, on_mpi: bool) -> str:
    """The fix for a communicator of ``size`` ranks given a schedule for ``ranks``.

    Under torchrun (which sets ``WORLD_SIZE``) there is no mpiexec: MPI sees each process alone, so the
    default MPI transport has one rank and the fix is a torch transport, not ``mpiexec -n``.
    """
    if on_mpi and size == 1 and os.environ.get("WORLD_SIZE", "1") != "1":
        return ("under torchrun MPI sees one rank per process: use init_process_group(\"topocc\") "
                "(README, With torchrun), or pass transport=GlooTransport() "
                "(topocc.runtime.transports.gloo, CPU tensors) or NCCLTransport() "
                "(topocc.runtime.transports.nccl, CUDA tensors)")
    return f"launch with -n {ranks} or compile for {size} ranks"


class Communicator:
    """Replays compiled schedules over MPI (or another transport).

    Parameters
    ----------
    source:
        A schedule or plan file, a :class:`~topocc.runtime.schedule.Schedule`, a
        :class:`~topocc.runtime.plan.Plan`, or a list of schedules with
        ``metadata.min_bytes``/``max_bytes`` buckets (picked per call by size).
    mpi_comm:
        The mpi4py communicator to run on (default ``MPI.COMM_WORLD``); it is
        duplicated, so the runtime's messages never meet the application's.
    fingerprint:
        If given, every schedule's ``metadata.fingerprint`` must equal it.
    timeout:
        Seconds a call (or the set-up handshake) may wait for peers before failing.
    transport:
        A ready transport instead of MPI's.  A :class:`~topocc.runtime.transports.Transport` replays the
        schedule as dataflow (gloo: :class:`~topocc.runtime.transports.gloo.GlooTransport`); a
        :class:`~topocc.runtime.transports.GroupTransport` replays its lowering (:mod:`topocc.runtime.lowering`)
        group by group (NCCL: :class:`~topocc.runtime.transports.nccl.NCCLTransport`;
        :class:`~topocc.runtime.transports.mpi.MPIGroupTransport` runs the same on CPU).  Its ``array_ops``
        attribute, if any, says how to allocate, copy and reduce its buffers (numpy by default).
    group_bytes:
        With a group transport: bytes each (sender, receiver, channel) stream carries per group, at
        least (:func:`~topocc.runtime.lowering.chunks_per_round_for`); every rank must pass the same.
    on_failure:
        Restates the error that ends the communicator before it is raised and kept (the ``topocc``
        process group names the rank the job lost, agreed with the other ranks).

    >>> comm = Communicator("ring.json", timeout=10.0)   # doctest: +SKIP
    >>> x = comm.allreduce(np.ones(1001, np.float32))    # doctest: +SKIP
    """

    def __init__(self, source: PlanSource | LazyPlan, mpi_comm: Any = None, *, fingerprint: str | None = None,
                 timeout: float = 30.0, transport: Transport | GroupTransport | None = None,
                 group_bytes: int = DEFAULT_GROUP_BYTES,
                 on_failure: Callable[[CommunicatorError], CommunicatorError] | None = None) -> None:
        if not timeout > 0:
            raise CommunicatorError(f"timeout must be positive, got {timeout}")
        self.timeout = float(timeout)
        self._closed = True
        self._failed: CommunicatorError | None = None
        self._pending_failure: CommunicatorError | None = None  # found by a transport's watchdog thread
        self._on_failure = on_failure
        self.plan: AnyPlan = source if isinstance(source, LazyPlan) else as_plan(source)
        if fingerprint is not None:
            for i, theirs in enumerate(self.plan.fingerprints):
                if theirs != fingerprint:
                    raise CommunicatorError(
                        f"topology fingerprint mismatch: the schedule was compiled for "
                        f"{theirs or 'an unknown topology'}, this machine is {fingerprint}",
                        where=f"{self.plan.collective} plan, bucket {i + 1} of {len(self.plan.fingerprints)}",
                        fix="recompile the schedule for this topology",
                    )
        on_mpi = transport is None
        if transport is None:
            # mpi4py, loaded only for this default: importing it starts MPI, which a gloo or NCCL job must not
            from topocc.runtime.transports.mpi import MPITransport

            transport = MPITransport(mpi_comm)
        self.transport: Transport | GroupTransport = transport
        if not group_bytes > 0:
            raise CommunicatorError(f"group_bytes must be positive, got {group_bytes}")
        self.group_bytes = int(group_bytes)
        # the replay mode, chosen once: the lowering over a group transport, else dataflow
        self._replay: Replay = (LoweredReplay(transport, self.timeout, self.group_bytes)
                                if isinstance(transport, GroupTransport) else DataflowReplay(transport, self.timeout))
        self.grouped = self._replay.grouped
        self.ops: ArrayOps = getattr(transport, "array_ops", None) or NUMPY_OPS
        self._trace: list[TraceRecord] | None = None
        self._calls = 0
        self.rank = transport.rank
        self.size = transport.size
        if self.size != self.plan.ranks:
            raise CommunicatorError(
                f"the schedule is for {self.plan.ranks} ranks but the communicator has {self.size}",
                where=f"rank {self.rank}", fix=_rank_count_fix(self.plan.ranks, self.size, on_mpi),
            )
        # what the ranks agree on: the plan here, each schedule at its first call (a lazy plan parses it then)
        self._digests: dict[int, int] = {}
        self._programs: dict[tuple[int, str, int, bool], Program] = {}
        digest = (self.plan.digest if isinstance(self.plan, LazyPlan)
                  else zlib.crc32(b"".join(self._digest(s).to_bytes(4, "little") for s in self.plan.schedules)))
        grouping = self._replay.grouping

        def explain(r: int, theirs: tuple[int, ...]) -> str:
            if theirs[1] != digest:
                return f"rank {r} loaded a different schedule or plan than rank {self.rank}"
            return f"rank {r} lowers with group_bytes={theirs[3]}, rank {self.rank} with {grouping}"

        _install_guard()  # before the first handshake: a failed one must still skip waiting on the dead peer at exit
        self._agree((0, digest, self.size, grouping), "construct the communicator", explain)
        self._closed = False
        _LIVE[next(_CREATED)] = self

    # ------------------------------------------------------------------ set-up

    @property
    def collective(self) -> str:
        """The collective every schedule of the plan computes."""
        return self.plan.collective

    def _fail(self, err: CommunicatorError) -> CommunicatorError:
        if self._on_failure is not None:
            err = self._on_failure(err)
        self._failed = err
        _FAILURES.append(err)
        return err

    def _agree(self, values: tuple[int, ...], doing: str, explain: Any) -> None:
        """Check that every rank passes the same values, within the timeout (a set-up handshake)."""
        try:
            rows = self.transport.allgather_ints(values, self.timeout)
        except PeerFailure as exc:
            raise self._fail(CommunicatorError(f"{doing}: {exc}", where=f"rank {self.rank}",
                                               fix="a peer died or left; check its output")) from None
        if rows is None:
            raise self._fail(CommunicatorError(
                f"not every rank came to {doing} within {self.timeout:g} s",
                where=f"rank {self.rank}",
                fix="all ranks must make the same calls in the same order with the same dtype and size",
            ))
        for r, row in enumerate(rows):
            if row != tuple(values):
                raise self._fail(CommunicatorError(explain(r, row), where=f"rank {self.rank}",
                                                   fix="all ranks must call with the same schedule, dtype and size"))

    def _digest(self, schedule: Schedule) -> int:
        """A checksum of ``schedule`` as written (kept per schedule: ranks compare them before its first call)."""
        digest = self._digests.get(id(schedule))
        if digest is None:
            digest = self._digests[id(schedule)] = zlib.crc32(dump_schedule(schedule).encode())
        return digest

    def _program(self, schedule: Schedule, dtype: Any, block: int, encode: bool = False) -> Program:
        name = self.ops.dtype_name(dtype)
        key = (id(schedule), name, block, encode)
        program = self._programs.get(key)
        if program is None:
            code = DTYPE_NAMES.index(name)
            mine = (1, self._digest(schedule), code, block, int(encode))

            def explain(r: int, row: tuple[int, ...]) -> str:
                theirs = DTYPE_NAMES[row[2]] if 0 <= row[2] < len(DTYPE_NAMES) else "?"
                if row[2:4] == (code, block):
                    return (f"{schedule.collective} replays its encodings on rank {r} "
                            f"{'but not' if encode else 'and'} on rank {self.rank} (a different reduction op)")
                return (f"{schedule.collective} called with {row[3]} x {theirs} per rank block on rank {r} "
                        f"but {block} x {name} on rank {self.rank}")

            self._agree(mine, f"set up {schedule.collective} for {block} x {name}", explain)
            program = Program(schedule, self.rank, dtype, block, tag_ub=self._replay.tag_ub,
                              channels=message_tag_space(schedule), ops=self.ops, encode=encode)
            self._replay.adopt(program)
            self._programs[key] = program
        return program

    def _check(self, collective: str) -> None:
        if self._failed is None and self._pending_failure is not None:
            self._failed = self._pending_failure
        if self._failed is not None:
            raise CommunicatorError(f"the communicator failed earlier: {self._failed.message}",
                                    where=self._failed.where)
        if self._closed:
            raise CommunicatorError("the communicator is closed")
        if collective != self.plan.collective:
            raise CommunicatorError(
                f"{collective} called on a communicator whose schedule computes {self.plan.collective}",
                where=f"rank {self.rank}", fix=f"compile a {collective} schedule, or call {self.plan.collective}",
            )

    def _reduction(self, op: str, dtype: Any) -> Any:
        reductions = self.ops.reductions
        if op not in reductions:
            raise CommunicatorError(f"unknown reduction op {op!r}", fix=f"use one of {', '.join(reductions)}")
        if op == "avg" and self.ops.is_integer(dtype):
            raise CommunicatorError(f"avg on {self.ops.dtype_name(dtype)} is refused (an integer mean would round)",
                                    fix="use op='sum' and divide, or a float dtype")
        return reductions[op]

    def _run(self, program: Program, buffers: dict[str, Any], op: str, count: int, *,
             async_op: bool = False, epilogue: Callable[[], None] | None = None,
             feedback: Residual | None = None) -> Work | None:
        s = program.schedule
        what = f"{s.collective} ({s.metadata.algorithm}, {count} x {self.ops.dtype_name(program.dtype)})"
        reduce = self.ops.reductions.get(op, self.ops.reductions["sum"])
        events: Events | None = [] if self._trace is not None else None
        work = self._replay.run(program, buffers, reduce, what, async_op=async_op, epilogue=epilogue, events=events,
                                fail=self._fail, fail_later=self._fail_later, feedback=feedback)
        self._calls += 1
        if events is not None and self._trace is not None:
            self._record(program, events)
        return work

    def _fail_later(self, err: CommunicatorError) -> None:
        """From a transport's watchdog: report now (one line on stderr), raise at the next call."""
        if self._pending_failure is None and self._failed is None:
            self._pending_failure = err
            _FAILURES.append(err)
            os.write(2, f"topocc: {err.one_line()}\n".encode())

    # ------------------------------------------------------------------ tracing

    def start_trace(self) -> None:
        """Record every later call's operations (start and end per op); off by default, and free when off."""
        if self.grouped:
            raise CommunicatorError(f"tracing records dataflow replays; the {self.transport.name} transport runs "
                                    "whole groups", fix="trace with the MPI or gloo transport")
        self._trace = []

    def stop_trace(self) -> list[TraceRecord]:
        """Stop recording and return what was recorded (see :data:`TraceRecord`)."""
        records, self._trace = self._trace or [], None
        return records

    def _record(self, program: Program, events: Events) -> None:
        assert self._trace is not None
        s = program.schedule
        ops = s.programs[self.rank]
        for k, start, end in events:
            op = ops[k]
            self._trace.append((self.rank, self._calls, s.collective, s.metadata.algorithm, k, op.kind, op.peer,
                                op.channel, program.msg_len[k], start, end))

    def _inputs(self, program: Program, user: Any, *, aliased: bool, needed: bool = True) -> Any:
        """The input buffer to bind: the user's, or a private copy when the schedule would clobber it."""
        if not aliased and "i" not in program.writes:
            return user
        own = program.owned("i")
        if needed:
            self.ops.copyto(own, user)
        return own

    def _prepare(self, collective: str, send: Any, recv: Any, op: str | None,
                 exact: bool = False) -> tuple[Schedule, Program, Any]:
        dtype = self.ops.dtype_of(send)
        if recv is not None and recv.dtype != send.dtype:
            raise CommunicatorError(f"{collective}: send buffer is {send.dtype} but receive buffer is {recv.dtype}")
        if op is not None:
            self._reduction(op, dtype)
        in_count = self.ops.count(send)
        out_count = self.ops.count(recv) if recv is not None else in_count
        schedule = select_schedule(self.plan, max(in_count, out_count) * self.ops.itemsize(send))
        block = block_elements(schedule, in_count, out_count)
        # the schedule's encodings apply to sums and to data that is only moved; min, max and prod go exact, as
        # does the lowered replay (the encodings are host code)
        encode = not self.grouped and op in (None, "sum", "avg") and not exact
        return schedule, self._program(schedule, dtype, block, encode), dtype

    # ------------------------------------------------------------------ collectives

    def allreduce(self, array: Any, op: str = "sum", *, async_op: bool = False, exact: bool = False,
                  feedback: Residual | None = None) -> Any:
        """Reduce ``array`` over all ranks, in place; returns ``array``, or a :class:`Work` with ``async_op``.

        ``op`` is sum, prod, max, min or avg (avg sums, then divides once; refused for integers).  ``exact``
        replays an encoded plan's messages exact (every rank must pass the same).  ``feedback``: the bucket's
        error-feedback residual (:mod:`topocc.runtime.feedback`), added to ``array`` first and refilled with what
        the encodings drop, where the call runs encoded; untouched where it runs exact.

        With a stream-ordered transport (NCCL) the call only enqueues, as ``torch.distributed.all_reduce``:
        without ``async_op`` the caller's current CUDA stream is ordered after the collective; with it, the
        returned :class:`~topocc.runtime.group_executor.Work` does that in ``wait()`` (``synchronize()`` blocks the
        host).  Over MPI the call returns once the result is in ``array`` (and ``async_op`` returns a
        completed Work with a group transport).
        """
        self._check("allreduce")
        if async_op and not self.grouped:
            raise CommunicatorError(f"async_op needs a group transport (NCCL); the {self.transport.name} transport "
                                    "replays on the host", fix="call without async_op")
        a = self.ops.check(array, "allreduce buffer")
        schedule, program, _ = self._prepare("allreduce", a, None, op, exact)
        host = self.ops.host(a) if feedback is not None and program.encoded else None
        if feedback is not None and host is not None:  # encoded calls run on host memory (numpy views)
            feedback.inject(host)
        else:
            feedback = None
        buffers = {"o": a}
        if not schedule.inplace:
            # the program may copy its input onto the output first: then the input is the output's memory
            buffers["i"] = a if self._replay.input_in_place(program) else self._inputs(program, a, aliased=True)
        divide = (lambda: self.ops.divide(a, self.size)) if op == "avg" else None
        work = self._run(program, buffers, op, self.ops.count(a), async_op=async_op, epilogue=divide,
                         feedback=feedback)
        return work if async_op else array

    def broadcast(self, array: Any, *, exact: bool = False) -> Any:
        """Copy the root's ``array`` to every rank, in place; returns ``array``.  ``exact`` as for
        :meth:`allreduce`."""
        self._check("broadcast")
        a = self.ops.check(array, "broadcast buffer")
        schedule, program, _ = self._prepare("broadcast", a, None, None, exact)
        buffers = {"o": a}
        if not schedule.inplace:
            buffers["i"] = self._inputs(program, a, aliased=True, needed=self.rank == schedule.root)
        self._run(program, buffers, "sum", self.ops.count(a))
        return array

    def reduce(self, array: Any, op: str = "sum", *, exact: bool = False) -> Any:
        """Reduce ``array`` onto the root, in place there; returns ``array``.

        On the other ranks the array's contents afterwards are unspecified when
        the schedule is in place (NCCL's convention), and unchanged otherwise.
        ``exact`` as for :meth:`allreduce`.
        """
        self._check("reduce")
        a = self.ops.check(array, "reduce buffer")
        schedule, program, _ = self._prepare("reduce", a, None, op, exact)
        root = self.rank == schedule.root
        if schedule.inplace:
            buffers = {"o": a}
        elif root:
            buffers = {"o": a, "i": self._inputs(program, a, aliased=True)}
        else:
            buffers = {"o": program.owned("o"), "i": self._inputs(program, a, aliased=False)}
        self._run(program, buffers, op, self.ops.count(a))
        if op == "avg" and root:
            self.ops.divide(a, self.size)
        return array

    def allgather(self, sendbuf: Any, recvbuf: Any = None, *, exact: bool = False) -> Any:
        """Gather every rank's ``sendbuf`` into ``recvbuf`` (rank order; allocated if None); returns it.
        ``exact`` as for :meth:`allreduce`."""
        self._check("allgather")
        s = self.ops.check(sendbuf, "allgather send buffer")
        if recvbuf is None:
            recvbuf = self.ops.empty_like(s, self.ops.count(s) * self.size)
        r = self.ops.check(recvbuf, "allgather receive buffer")
        schedule, program, _ = self._prepare("allgather", s, r, None, exact)
        if schedule.inplace:
            mine = r[self.rank * self.ops.count(s):(self.rank + 1) * self.ops.count(s)]
            if not same_memory(self.ops, mine, s):
                self.ops.copyto(mine, s)
            buffers = {"o": r}
        else:
            buffers = {"i": self._inputs(program, s, aliased=False), "o": r}
        self._run(program, buffers, "sum", self.ops.count(s))
        return recvbuf

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any = None, op: str = "sum", *, exact: bool = False,
                       feedback: Residual | None = None) -> Any:
        """Reduce ``sendbuf`` over ranks; rank r gets block r in ``recvbuf`` (allocated if None); returns it.
        ``exact`` as for :meth:`allreduce`.  ``feedback``: the error-feedback residual of ``sendbuf``'s elements,
        added to a private copy of it where the call runs encoded (``sendbuf`` is left as it was) and refilled
        with what the encodings drop."""
        self._check("reducescatter")
        s = self.ops.check(sendbuf, "reduce_scatter send buffer")
        if self.ops.count(s) % self.size:
            raise CommunicatorError(f"reduce_scatter needs a send buffer divisible by {self.size} ranks, "
                                    f"got {self.ops.count(s)} elements")
        if recvbuf is None:
            recvbuf = self.ops.empty_like(s, self.ops.count(s) // self.size)
        r = self.ops.check(recvbuf, "reduce_scatter receive buffer")
        schedule, program, _ = self._prepare("reducescatter", s, r, op, exact)
        if feedback is not None and program.encoded:  # the residual goes into a copy: the caller's input stays
            inputs = self._inputs(program, s, aliased=True)
            host = self.ops.host(inputs)
            if host is None:  # not host memory: the encodings cannot run here, nor the residual
                feedback = None
            else:
                feedback.inject(host)
        else:
            feedback, inputs = None, None
        count = self.ops.count(r)
        if schedule.inplace:
            mine = s[self.rank * count:(self.rank + 1) * count]
            work = inputs if inputs is not None else (
                s if same_memory(self.ops, mine, r) else self._inputs(program, s, aliased=True))
            self._run(program, {"i": work}, op, count, feedback=feedback)
            result = work[self.rank * count:(self.rank + 1) * count]
            if not same_memory(self.ops, result, r):
                self.ops.copyto(r, result)
        else:
            work = inputs if inputs is not None else self._inputs(program, s, aliased=False)
            self._run(program, {"i": work, "o": r}, op, count, feedback=feedback)
        if op == "avg":
            self.ops.divide(r, self.size)
        return recvbuf

    def alltoall(self, sendbuf: Any, recvbuf: Any = None, *, exact: bool = False) -> Any:
        """Block j of ``sendbuf`` goes to rank j; block j of ``recvbuf`` comes from rank j; returns ``recvbuf``.
        ``exact`` as for :meth:`allreduce`."""
        self._check("alltoall")
        s = self.ops.check(sendbuf, "alltoall send buffer")
        if recvbuf is None:
            recvbuf = self.ops.empty_like(s)
        r = self.ops.check(recvbuf, "alltoall receive buffer")
        schedule, program, _ = self._prepare("alltoall", s, r, None, exact)
        if schedule.inplace:
            if not same_memory(self.ops, r, s):
                self.ops.copyto(r, s)
            buffers = {"o": r}
        else:
            buffers = {"i": self._inputs(program, s, aliased=False), "o": r}
        self._run(program, buffers, "sum", self.ops.count(s))
        return recvbuf

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free persistent requests and the duplicated communicator (collective: call on every rank)."""
        if self._closed:
            return
        self._closed = True
        if self._failed is None and self._pending_failure is None:
            # a stream-ordered transport may still be using the programs' buffers: finish before freeing them
            try:
                self._replay.drain(time.monotonic() + self.timeout)
            except PeerFailure as exc:
                raise self._fail(CommunicatorError(f"closing: {exc}", where=f"rank {self.rank}")) from None
        for program in self._programs.values():
            program.free()
        self._programs.clear()
        self._replay.forget()
        if self._failed is None and self._pending_failure is None:
            close = getattr(self.transport, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
