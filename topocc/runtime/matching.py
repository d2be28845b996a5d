"""Which send meets which receive: the schedule format's matching rule, stated once.

A message of a schedule is one send and one receive.  The sends from rank a to
rank b on channel c, in a's program order, and the receives that b posts from a
on channel c, in b's program order, form the *stream* of the connection
``(a, b, c)``; the k-th send of a stream meets its k-th receive (FIFO, as on an
MPI pair or an NCCL channel).  The simulator, the executor, the lowering and the
verifiers all pair messages with the functions here, so they agree on every pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from topocc.runtime.schedule import Message, Op, Receive, Schedule, Send

__all__ = ["Connection", "Stream", "StreamKey", "numbered", "sequence_numbers", "stream_key", "streams"]

#: A connection: (sender, receiver, channel).
Connection = tuple[int, int, int]
#: A message's stream as one of its ranks names it: (whether the rank sends, the peer, the channel).
StreamKey = tuple[bool, int, int]


@dataclass(slots=True)
class Stream:
    """One connection's operations: the sender's sends and the receiver's receives, by index in program order.

    (Not frozen: its lists grow as :func:`streams` reads the programs, and a frozen dataclass costs several
    times more to make, which shows where every message has a connection of its own.)
    """

    sends: list[int]
    recvs: list[int]

    @property
    def matched(self) -> bool:
        """Whether every send has its receive and every receive its send."""
        return len(self.sends) == len(self.recvs)

    def messages(self) -> Iterator[tuple[int, int]]:
        """(send index, receive index) of each message, in stream order: the k-th send meets the k-th receive.

        On an unmatched stream the surplus operations are left out.
        """
        return zip(self.sends, self.recvs)


def streams(schedule: Schedule) -> dict[Connection, Stream]:
    """Every connection's stream, in order of first use (by rank, then program order).

    Peers are taken as they are, unchecked (a caller that must name a bad peer finds it in the keys).
    """
    found: dict[Connection, Stream] = {}
    get = found.get
    for rank, program in enumerate(schedule.programs):
        for k, op in enumerate(program):
            if isinstance(op, Send):
                key: Connection = (rank, op.peer, op.channel)
                stream = get(key)
                if stream is None:
                    stream = found[key] = Stream([], [])
                stream.sends.append(k)
            elif isinstance(op, Receive):
                key = (op.peer, rank, op.channel)
                stream = get(key)
                if stream is None:
                    stream = found[key] = Stream([], [])
                stream.recvs.append(k)
    return found


def sequence_numbers(program: Sequence[Op]) -> list[int]:
    """Every operation's position in its stream (k for the k-th send of a stream), -1 for a local operation.

    A message's (connection, sequence number) is the same at both of its ends, so a rank names a message
    without looking at its peer's program.
    """
    return numbered(map(stream_key, program))


def stream_key(op: Op) -> StreamKey | None:
    """``op``'s stream as its rank names it, None for a local operation."""
    return (op.kind == "send", op.peer, op.channel) if isinstance(op, Message) else None


def numbered(keys: Iterable[StreamKey | None]) -> list[int]:
    """:func:`sequence_numbers` of a program given as each operation's stream key in program order (None for a
    local operation), for a caller that knows the keys without the operations."""
    counters: dict[StreamKey, int] = {}
    seqs = []
    for key in keys:
        if key is None:
            seqs.append(-1)
            continue
        seq = counters.get(key, 0)
        seqs.append(seq)
        counters[key] = seq + 1
    return seqs
