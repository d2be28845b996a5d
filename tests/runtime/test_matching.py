"""The matching rule: the k-th send of a (sender, receiver, channel) stream meets its k-th receive."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from topocc.runtime.matching import Stream, sequence_numbers, streams
from topocc.runtime.schedule import Chunk, Copy, Op, Recv, RecvReduce, Schedule, Send, build_schedule, operation

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("runtime_test_schedules", HERE / "mpi_scripts" / "schedules.py")
assert _spec is not None and _spec.loader is not None
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)


def two_channels() -> Schedule:
    """Rank 0 sends three messages to rank 1, on channels 0, 1, 0; rank 1 posts its receives in another order
    (channel 1 first) and does a local copy in between; rank 1 also sends one message back."""
    i, o = Chunk("i", 0), Chunk("o", 0)
    rank0: list[Op] = [Send(1, i), Send(1, i, channel=1), Send(1, i), Recv(1, o)]
    rank1: list[Op] = [Recv(0, o, channel=1), Copy(i, o), RecvReduce(0, o), Send(0, i), Recv(0, o)]
    return build_schedule("allreduce", 2, 1, 1, [rank0, rank1])


def test_streams_pair_the_kth_send_with_the_kth_receive_per_channel() -> None:
    found = streams(two_channels())
    assert found == {(0, 1, 0): Stream([0, 2], [2, 4]), (0, 1, 1): Stream([1], [0]), (1, 0, 0): Stream([3], [3])}
    assert list(found[(0, 1, 0)].messages()) == [(0, 2), (2, 4)]
    assert all(stream.matched for stream in found.values())


def test_an_unmatched_stream_says_so_and_pairs_only_its_first_messages() -> None:
    i, o = Chunk("i", 0), Chunk("o", 0)
    schedule = build_schedule("allreduce", 2, 1, 1, [[operation("send", 1, src=i), operation("send", 1, src=i)],
                                                     [operation("recv", 0, dst=o)]])
    stream = streams(schedule)[(0, 1, 0)]
    assert not stream.matched
    assert list(stream.messages()) == [(0, 0)]


def test_sequence_numbers_name_a_message_alike_at_both_ends() -> None:
    """Per rank, a send's or receive's position in its stream; both ends of every message agree on it."""
    assert sequence_numbers(two_channels().programs[1]) == [0, -1, 0, 0, 1]
    for schedule in (two_channels(), S.ring_allreduce(4, 3, channels=2), S.direct_alltoall(4, 2),
                     S.direct_allreduce_scratch(3)):
        seqs = [sequence_numbers(program) for program in schedule.programs]
        messages = 0
        for (a, b, _), stream in streams(schedule).items():
            for n, (ks, kr) in enumerate(stream.messages()):
                assert seqs[a][ks] == seqs[b][kr] == n
                messages += 1
        assert messages == sum(op.kind == "send" for p in schedule.programs for op in p)

