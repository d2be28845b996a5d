"""Lower a schedule into groups of sends and receives that NCCL can run without deadlock.

NCCL runs a rank's calls in issue order on one CUDA stream; the sends and
receives between ``ncclGroupStart``/``ncclGroupEnd`` progress together and the
group ends when all of them have; a send may wait until its receive is posted;
and the k-th send from rank a to rank b meets the k-th receive that b posts from
a, whatever the schedule's channels.  The executor's dataflow replay (start an
operation as soon as its dependencies complete, match by tag) cannot run there:
each rank would batch what is ready into groups that its peers' groups do not
mirror, and stall.  So the schedule is lowered once, at set-up, into
a sequence of groups per rank:

* group ``g`` of a rank posts its sends and receives together, then (after they
  complete) finishes its receives (unpacks staged messages, applies each
  ``recv_reduce``'s reduction) and runs its local copies and reductions;
* every group carries a *round*; both ends of every message sit in groups of the
  same round, and a rank's groups come in increasing rounds (a rank skips the
  rounds it has no part in; round 0 holds the local operations that need no
  message);
* the sends of a rank to one peer, and that peer's receives from it, are issued
  in the same order: by round, then by the schedule's (channel, sequence
  number), so NCCL's per-pair matching pairs exactly the messages the schedule
  pairs.

Rounds are assigned as soon as possible: a message goes in the first round
after everything its send or its receive depends on (messages: their round;
local operations: the round they run after), and a local operation right after
the latest round it depends on.  One more rule keeps pipelining without
degenerating to lock-step: each (sender, receiver, channel) stream takes its
messages in order and carries at most ``chunks_per_round`` chunks per round (a
message larger than that takes a round alone).  A pipelined chain then moves
piece j over hop h in round ``h + j`` (a wavefront: every link busy), where
plain as-soon-as-possible rounds would move the whole buffer hop by hop; a
pipelined ring sends one piece per round and direction instead of one step's
worth.  A large ``chunks_per_round`` trades pipelining for fewer, larger groups
(what small messages want); :func:`chunks_per_round_for` picks it from a byte
target per stream and round.

Why it cannot deadlock (the checker, ``topocc.planner.analysis.verify_lowered``, proves it for
each lowering): order messages by (round, position within their pair's
sequence, NCCL's peer round).  Take the first message that never completes:
every message before it completes, so on both of its ranks every earlier group
completes and its own group (or the kernel NCCL cut from it) is posted; its
predecessors on the pair have completed; so it meets its partner.  The argument
does not depend on where NCCL cuts a large group into several kernels, because
NCCL cuts in an order (epoch, peer round) that both ends of a message share.
The host side is safe for the same reason: the first time a pair is used, NCCL
connects it inside ``ncclGroupEnd``, which waits for the peer to do the same;
both ends do so in the same round, and every host passes its rounds in order.

The lowering only reorders what the dependencies leave free: each operation
starts after every operation it depends on has completed (stream order), and
operations in one group are unordered in the schedule too, so a race-free
schedule computes the same values.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.matching import sequence_numbers, streams
from topocc.runtime.schedule import Message, Op, Schedule

__all__ = ["DEFAULT_GROUP_BYTES", "Group", "Lowering", "RankLowering", "chunks_per_round_for", "lower",
           "message_keys"]

#: Bytes a (sender, receiver, channel) stream carries per round at least, unless a message alone is larger:
#: below it, NCCL's cost per group (a kernel launch and a handshake per peer, tens of microseconds over
#: sockets) outweighs the pipelining that smaller groups buy; above it, a group waits longer for its slowest
#: message and the pipeline fills later.  A message must also fill NCCL's channels to a peer (four of them,
#: with 512 KiB chunks each: its ``P2P_TUNING``) to go at speed.  A ring all-reduce lowered so came closest
#: to NCCL's own at this size, against groups of half and of twice as much.
DEFAULT_GROUP_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Group:
    """One NCCL group of a rank and what runs after it.

    ``p2p`` are the indices of the sends and receives posted together, in issue
    order; ``local`` the copies and reductions that run after the group's
    receives are finished (unpacked, reduced), in this order.  A group with no
    ``p2p`` (round 0) only runs local operations.
    """

    round: int
    p2p: tuple[int, ...]
    local: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RankLowering:
    """One rank's groups, in execution order (increasing rounds)."""

    groups: tuple[Group, ...]

    @property
    def p2p_groups(self) -> int:
        """Groups that post sends or receives (NCCL groups)."""
        return sum(1 for g in self.groups if g.p2p)


@dataclass(frozen=True, slots=True)
class Lowering:
    """Every rank's groups, and the stream capacity they were cut with."""

    ranks: tuple[RankLowering, ...]
    chunks_per_round: int

    @property
    def rounds(self) -> int:
        """The last round: how many rounds the lowered schedule takes."""
        return max((g.round for r in self.ranks for g in r.groups), default=0)

    @property
    def max_groups(self) -> int:
        """NCCL groups of the rank that has the most."""
        return max((r.p2p_groups for r in self.ranks), default=0)


def chunks_per_round_for(chunk_bytes: float, group_bytes: int = DEFAULT_GROUP_BYTES) -> int:
    """Chunks a stream carries per round so that a round moves about ``group_bytes`` on it (at least 1)."""
    if not chunk_bytes > 0:
        return 1
    return max(1, int(group_bytes // chunk_bytes))


def message_keys(schedule: Schedule) -> list[list[tuple[int, int]]]:
    """For every operation, its (channel, sequence number) on its (sender, receiver, channel) stream.

    Local operations get ``(-1, -1)``.  A key names a message identically on both of its ranks
    (:func:`topocc.runtime.matching.sequence_numbers`).
    """
    keys: list[list[tuple[int, int]]] = []
    for program in schedule.programs:
        seqs = sequence_numbers(program)
        keys.append([(op.channel, seq) if seq >= 0 else (-1, -1) for op, seq in zip(program, seqs)])
    return keys


def lower(schedule: Schedule, chunks_per_round: int = 1) -> Lowering:
    """Lower ``schedule`` into groups for every rank (see the module docstring).

    Every rank computes the same lowering from the same schedule, so the ranks
    agree on it without communicating.  Raises :class:`CommunicatorError` if the
    schedule cannot be lowered (unmatched messages, or dependencies that wait
    on themselves through messages: a schedule the verifier rejects).

    >>> lowering = lower(schedule, chunks_per_round=4)   # doctest: +SKIP
    >>> [len(g.p2p) for g in lowering.ranks[0].groups]   # doctest: +SKIP
    """
    if chunks_per_round < 1:
        raise CommunicatorError(f"chunks_per_round must be at least 1, got {chunks_per_round}")
    graph = _Graph.of(schedule)
    value = graph.rounds(chunks_per_round)
    keys = message_keys(schedule)
    ranks = tuple(_rank_groups(program, graph.node[rank], value, keys[rank])
                  for rank, program in enumerate(schedule.programs))
    return Lowering(ranks, chunks_per_round)


@dataclass(frozen=True, slots=True)
class _Graph:
    """The schedule as one graph: a node per local operation and one per message (its send and its receive).

    A node depends on the nodes of its operations' dependencies (``succ`` runs the other way) and a message
    on the one before it on its stream (``follower`` is the next).
    """

    node: list[list[int]]  # per rank and operation: its node
    size: list[int]  # per node: the chunks a message moves (0 for a local operation)
    stream_of: list[int]  # per node: the number of its message's stream (-1 for a local operation)
    follower: list[int]  # per node: the next message of its stream (-1 if none)
    succ: list[list[int]]  # per node: the nodes that depend on it

    @staticmethod
    def of(schedule: Schedule) -> _Graph:
        """Messages first, numbered along their streams, then local operations; raises on unmatched messages."""
        programs = schedule.programs
        found = streams(schedule)
        unmatched = [(*key, min(len(s.sends), len(s.recvs))) for key, s in found.items() if not s.matched]
        if unmatched:
            sender, receiver, channel, seq = min(unmatched)
            raise CommunicatorError(
                f"cannot lower the schedule: message {seq} from rank {sender} to rank {receiver} on channel "
                f"{channel} has no partner", fix="verify the schedule with topocc verify")
        node = [[-1] * len(p) for p in programs]
        size: list[int] = []
        stream_of: list[int] = []
        follower: list[int] = []
        for number, ((sender, receiver, _), stream) in enumerate(found.items()):
            for ks, kr in stream.messages():
                node[sender][ks] = node[receiver][kr] = len(size)
                size.append(programs[sender][ks].count)
                stream_of.append(number)
                follower.append(len(size))
            follower[-1] = -1  # the stream's last message
        for mine in node:
            for k, n in enumerate(mine):
                if n < 0:
                    mine[k] = len(size)
                    size.append(0)
                    stream_of.append(-1)
                    follower.append(-1)
        succ: list[list[int]] = [[] for _ in size]
        for mine, program in zip(node, programs):
            for k, op in enumerate(program):
                for d in op.deps:
                    succ[mine[d]].append(mine[k])
        return _Graph(node, size, stream_of, follower, succ)

    def rounds(self, chunks_per_round: int) -> list[int]:
        """Every node's value: a message's round, a local operation's the round it runs after.

        Nodes are taken in dependency order (a message after its stream's previous one); ``after[i]`` is the
        largest value among node i's dependencies, and a stream's state its last round and the chunks used there.
        """
        size, stream_of, follower, succ = self.size, self.stream_of, self.follower, self.succ
        n = len(size)
        indegree = [0] * n
        for i in range(n):
            for t in succ[i]:
                indegree[t] += 1
            if follower[i] >= 0:
                indegree[follower[i]] += 1
        value = [0] * n
        after = [0] * n
        state: dict[int, tuple[int, int]] = {}
        ready = deque(i for i in range(n) if indegree[i] == 0)
        done = 0
        while ready:
            i = ready.popleft()
            done += 1
            stream = stream_of[i]
            if stream < 0:
                value[i] = after[i]
            else:
                earliest = after[i] + 1
                last, used = state.get(stream, (0, 0))
                if earliest > last:
                    value[i], used = earliest, size[i]
                elif used + size[i] <= chunks_per_round:
                    value[i], used = last, used + size[i]
                else:
                    value[i], used = last + 1, size[i]
                state[stream] = (value[i], used)
                nxt = follower[i]
                if nxt >= 0:
                    indegree[nxt] -= 1
                    if indegree[nxt] == 0:
                        ready.append(nxt)
            for t in succ[i]:
                if value[i] > after[t]:
                    after[t] = value[i]
                indegree[t] -= 1
                if indegree[t] == 0:
                    ready.append(t)
        if done != n:
            raise CommunicatorError("cannot lower the schedule: its dependencies wait on themselves through messages",
                                    fix="verify the schedule with topocc verify")
        return value


def _rank_groups(program: Sequence[Op], node: list[int], value: list[int],
                 keys: list[tuple[int, int]]) -> RankLowering:
    """One rank's groups: its operations by round, the sends and receives of each in issue order (by peer,
    then the schedule's (channel, sequence number), so both ends of a pair issue its messages alike)."""
    p2p: dict[int, list[int]] = defaultdict(list)
    local: dict[int, list[int]] = defaultdict(list)
    for k, op in enumerate(program):
        (p2p if isinstance(op, Message) else local)[value[node[k]]].append(k)
    groups = []
    for r in sorted(p2p.keys() | local.keys()):
        issued = sorted(p2p.get(r, ()), key=lambda k: (program[k].peer, keys[k], program[k].kind == "send"))
        groups.append(Group(r, tuple(issued), tuple(local.get(r, ()))))
    return RankLowering(tuple(groups))
