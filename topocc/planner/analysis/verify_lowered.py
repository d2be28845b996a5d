"""Prove a lowering (:mod:`topocc.runtime.lowering`) right: NCCL runs it to the end, computing what its schedule does.

The model is NCCL's semantics, taken at its strictest:

* **stream order**: a rank posts its groups one after another; group ``g + 1``
  is posted only once every send and receive of group ``g`` has completed and
  its local operations have run.  Local operations never wait for a peer.
* **groups**: the sends and receives of one group are posted together and
  progress together; the group completes when all of them have.
* **one queue per pair**: NCCL knows no channels.  The k-th send rank a issues
  to rank b, counted over all its groups in issue order, meets the k-th receive
  that b issues from a, and a pair's messages complete in that order (one
  connection moves them one after another).
* **rendezvous**: a send completes only together with its receive, and neither
  before both are posted, i.e. before the groups holding them are both current.
  A runtime with eager (buffered) sends only completes operations sooner, and
  progress here is monotone, so what completes under rendezvous completes there.
* **split groups**: NCCL may cut a large group into several kernels that run one
  after the other, at points that differ between ranks.  It cuts in the order
  (epoch: the message's position among the group's messages with that peer;
  peer round: a permutation of the peers that puts the send to one peer and the
  receive from the peer it pairs with in the same round, the same round at both
  ends of a message).  A lowering is safe under every such cut when every
  message's send and receive sit in groups of the same ``round`` and every
  rank's rounds increase (*aligned*): order the messages by (round, epoch, peer
  round), then the first message that never completed would have everything
  before it completed, so both of its kernels are posted and it completes.
  Aligned lowerings are what :func:`topocc.runtime.lowering.lower` makes;
  ``split_safe=False`` drops the requirement, for lowerings that are only
  meant to run as whole groups.

:func:`verify_lowering` checks, each failure a one-line
:class:`~topocc.planner.errors.VerificationError`:

1. **coverage**: every operation of every rank appears exactly once, sends and
   receives among a group's posted operations, copies and reductions among its
   local ones;
2. **order**: every operation starts after each of its dependencies has
   completed (a posted operation completes with its group; a received
   message's unpacking or reduction runs right after its group; local
   operations run in the listed order).  Operations of one group are unordered
   in the schedule too, so a schedule that ``topocc.planner.analysis.verify`` proves race-free
   and correct computes the same values lowered;
3. **matching**: the per-pair issue order pairs exactly the messages the
   schedule pairs (its FIFO per pair and channel);
4. **alignment** (unless ``split_safe=False``);
5. **progress**: a symbolic execution under the model above completes every
   group of every rank; otherwise the error shows the cycle of ranks waiting
   for each other.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from topocc.planner.errors import VerificationError
from topocc.runtime.lowering import Lowering
from topocc.runtime.matching import streams
from topocc.runtime.schedule import Message, Op, Receive, Schedule

__all__ = ["LoweringReport", "verify_lowering"]


@dataclass(frozen=True, slots=True)
class LoweringReport:
    """What the proof covered."""

    ranks: int
    groups: int
    max_groups: int
    messages: int
    rounds: int


def _fail(schedule: Schedule, message: str, fix: str | None = None) -> VerificationError:
    return VerificationError(message, where=f"lowered {schedule.collective} schedule ({schedule.metadata.algorithm})",
                             fix=fix)


def _name(rank: int, k: int, op: Op) -> str:
    what: str = op.kind
    if op.peer is not None:
        what += f" {'to' if op.kind == 'send' else 'from'} rank {op.peer}"
        if op.channel:
            what += f" ch {op.channel}"
    return f"rank {rank} op {k} ({what})"


def verify_lowering(schedule: Schedule, lowering: Lowering, *, split_safe: bool = True) -> LoweringReport:
    """Prove that ``lowering`` runs ``schedule`` under NCCL's semantics; raise VerificationError if not.

    The schedule itself should be proven with :func:`topocc.planner.analysis.verify.verify`; this
    proves that the lowering preserves what that proof established.

    >>> verify_lowering(schedule, lower(schedule))   # doctest: +SKIP
    """
    if len(lowering.ranks) != schedule.ranks:
        raise _fail(schedule, f"the lowering has {len(lowering.ranks)} ranks, the schedule {schedule.ranks}")
    group_of = _check_coverage(schedule, lowering)
    _check_order(schedule, lowering, group_of)
    sends, recvs = _check_matching(schedule, lowering)
    if split_safe:
        _check_alignment(schedule, lowering, group_of, sends, recvs)
    _run(schedule, lowering, group_of, sends, recvs)
    groups = [sum(1 for g in r.groups if g.p2p) for r in lowering.ranks]
    return LoweringReport(schedule.ranks, sum(groups), max(groups, default=0), sum(len(q) for q in sends.values()),
                          lowering.rounds)


def _check_coverage(schedule: Schedule, lowering: Lowering) -> list[list[int]]:
    """Each operation once, in the right list; returns every operation's group index per rank."""
    group_of: list[list[int]] = []
    for rank, (program, lowered) in enumerate(zip(schedule.programs, lowering.ranks)):
        where = [-1] * len(program)
        last_round = None
        for g, group in enumerate(lowered.groups):
            if last_round is not None and group.round <= last_round:
                raise _fail(schedule, f"rank {rank} group {g} has round {group.round} after round {last_round}",
                            fix="a rank's groups must come in increasing rounds")
            last_round = group.round
            for posted, ops in ((True, group.p2p), (False, group.local)):
                for k in ops:
                    if not 0 <= k < len(program):
                        raise _fail(schedule, f"rank {rank} group {g} names op {k}; the program has {len(program)}")
                    if where[k] >= 0:
                        raise _fail(schedule, f"{_name(rank, k, program[k])} appears twice (groups {where[k]} "
                                              f"and {g})")
                    if isinstance(program[k], Message) != posted:
                        place = "posted operations" if posted else "local operations"
                        raise _fail(schedule, f"{_name(rank, k, program[k])} is among group {g}'s {place}",
                                    fix="sends and receives are posted in a group, copies and reductions run after")
                    where[k] = g
        if -1 in where:
            k = where.index(-1)
            raise _fail(schedule, f"{_name(rank, k, program[k])} is in no group")
        group_of.append(where)
    return group_of


def _check_order(schedule: Schedule, lowering: Lowering, group_of: list[list[int]]) -> None:
    """Every dependency completes before its dependent starts, in stream order."""
    for rank, (program, lowered) in enumerate(zip(schedule.programs, lowering.ranks)):
        # (group, slot): a posted operation starts at slot 0 and completes at slot 1 (its receive is finished
        # there too); the i-th local operation runs at slot 2 + i
        slot = [0] * len(program)
        for group in lowered.groups:
            for i, k in enumerate(group.local):
                slot[k] = 2 + i
        where = group_of[rank]
        for k, op in enumerate(program):
            start = (where[k], slot[k])
            for d in op.deps:
                end = (where[d], slot[d] or 1)
                if not end < start:
                    raise _fail(
                        schedule, f"{_name(rank, k, op)} in group {where[k]} runs before its dependency "
                                  f"{_name(rank, d, program[d])} in group {where[d]} has completed",
                        fix="an operation must come in a later group than what it depends on (or, if local, "
                            "after it in the same group)")


Queue = dict[tuple[int, int], list[tuple[int, int]]]


def _check_matching(schedule: Schedule, lowering: Lowering) -> tuple[Queue, Queue]:
    """The per-pair issue order pairs what the schedule pairs; returns both ends' queues per (sender, receiver)."""
    partner: dict[tuple[int, int], tuple[int, int]] = {}
    for (a, b, ch), stream in streams(schedule).items():
        if not stream.matched:
            raise _fail(schedule, f"rank {a} sends {len(stream.sends)} message(s) to rank {b} on channel {ch} but "
                                  f"rank {b} receives {len(stream.recvs)}",
                        fix="verify the schedule first (topocc verify)")
        for ks, kr in stream.messages():
            partner[(a, ks)] = (b, kr)
    sends: Queue = defaultdict(list)
    recvs: Queue = defaultdict(list)
    for rank, (program, lowered) in enumerate(zip(schedule.programs, lowering.ranks)):
        for group in lowered.groups:
            for k in group.p2p:
                op = program[k]
                if op.kind == "send":
                    sends[(rank, op.peer)].append((rank, k))
                elif isinstance(op, Receive):
                    recvs[(op.peer, rank)].append((rank, k))
    for pair in sends.keys() | recvs.keys():
        for n, (send, recv) in enumerate(zip(sends.get(pair, ()), recvs.get(pair, ()))):
            if partner[send] != recv:
                a, b = pair
                want = partner[send]
                raise _fail(
                    schedule,
                    f"rank {a}'s send number {n} to rank {b}, {_name(a, send[1], schedule.programs[a][send[1]])}, "
                    f"meets {_name(b, recv[1], schedule.programs[b][recv[1]])} in NCCL's per-pair order, but the "
                    f"schedule pairs it with rank {b} op {want[1]}",
                    fix="issue a pair's sends and its receives in the same order on both ranks")
    return sends, recvs


def _check_alignment(schedule: Schedule, lowering: Lowering, group_of: list[list[int]], sends: Queue,
                     recvs: Queue) -> None:
    """Both ends of every message in groups of the same round (safe wherever NCCL cuts a group)."""
    for pair, queue in sends.items():
        for (a, ks), (b, kr) in zip(queue, recvs[pair]):
            ra = lowering.ranks[a].groups[group_of[a][ks]].round
            rb = lowering.ranks[b].groups[group_of[b][kr]].round
            if ra != rb:
                raise _fail(
                    schedule,
                    f"{_name(a, ks, schedule.programs[a][ks])} is in round {ra} but its receive "
                    f"{_name(b, kr, schedule.programs[b][kr])} in round {rb}: NCCL may cut a group into kernels "
                    "at different points on the two ranks and deadlock",
                    fix="put both ends of a message in groups of the same round (topocc.runtime.lowering.lower does)")


def _run(schedule: Schedule, lowering: Lowering, group_of: list[list[int]], sends: Queue, recvs: Queue) -> None:
    """Symbolic execution under the group model; raise with the cycle of waits if it stalls."""
    groups = [r.groups for r in lowering.ranks]
    remaining = [[len(g.p2p) for g in gs] for gs in groups]
    current = [0] * len(groups)
    # pairs each group touches, and each pair's next message to complete
    touches: list[list[set[tuple[int, int]]]] = [[set() for _ in gs] for gs in groups]
    for pair, queue in sends.items():
        for (a, ks), (b, kr) in zip(queue, recvs[pair]):
            touches[a][group_of[a][ks]].add(pair)
            touches[b][group_of[b][kr]].add(pair)
    position: dict[tuple[int, int], int] = dict.fromkeys(sends, 0)
    work: list[tuple[int, int]] = []

    def settle(rank: int) -> None:
        """Skip the rank's groups with nothing left to wait for; queue the pairs of the group it stops at."""
        gs = remaining[rank]
        while current[rank] < len(gs) and gs[current[rank]] == 0:
            current[rank] += 1
        if current[rank] < len(gs):
            work.extend(touches[rank][current[rank]])

    for rank in range(len(groups)):
        settle(rank)
    while work:
        pair = work.pop()
        queue, other = sends[pair], recvs[pair]
        j = position[pair]
        while j < len(queue):
            (a, ks), (b, kr) = queue[j], other[j]
            ga, gb = group_of[a][ks], group_of[b][kr]
            if current[a] != ga or current[b] != gb:
                break
            j += 1
            remaining[a][ga] -= 1
            remaining[b][gb] -= 1
            if not remaining[a][ga]:
                settle(a)
            if not remaining[b][gb]:
                settle(b)
        position[pair] = j
    stuck = [r for r, gs in enumerate(groups) if current[r] < len(gs)]
    if stuck:
        raise _fail(schedule, "deadlock under NCCL's group semantics: " + _explain(schedule, lowering, group_of,
                    current, sends, recvs, position, stuck[0]),
                    fix="lower the schedule with topocc.runtime.lowering.lower, whose groups line up across ranks")


def _explain(schedule: Schedule, lowering: Lowering, group_of: list[list[int]], current: list[int], sends: Queue,
             recvs: Queue, position: dict[tuple[int, int], int], start: int) -> str:
    """The cycle of ranks each waiting, in its current group, for a peer stuck in an earlier group."""

    def blocker(rank: int) -> tuple[int, str]:
        g = current[rank]
        group = lowering.ranks[rank].groups[g]
        program = schedule.programs[rank]
        for k in group.p2p:
            op = program[k]
            assert isinstance(op, Message)  # a group's p2p operations are messages
            pair = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
            j = position[pair]
            (a, ks), (b, kr) = sends[pair][j], recvs[pair][j]
            mine, theirs = ((a, ks), (b, kr)) if a == rank else ((b, kr), (a, ks))
            if group_of[mine[0]][mine[1]] != g:
                continue
            peer, pk = theirs
            return peer, (f"rank {rank} in group {g} waits for rank {peer}: "
                          f"{_name(mine[0], mine[1], schedule.programs[mine[0]][mine[1]])} meets "
                          f"{_name(peer, pk, schedule.programs[peer][pk])} in its group {group_of[peer][pk]}, "
                          f"but rank {peer} is in group {current[peer]}")
        raise AssertionError("a stuck group has an operation that cannot complete")  # pragma: no cover

    seen: dict[int, int] = {}
    path: list[str] = []
    rank = start
    while rank not in seen:
        seen[rank] = len(path)
        peer, text = blocker(rank)
        path.append(text)
        rank = peer
    cycle = path[seen[rank]:]
    more = f"; ... ({len(cycle) - 6} more)" if len(cycle) > 6 else ""
    return f"cycle of {len(cycle)} waits: " + "; ".join(cycle[:6]) + more
