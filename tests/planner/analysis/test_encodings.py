"""The verifier on encoded schedules: the same dataflow as exact, every rank bitwise equal, and what is approximate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.runtime.test_schedule_encoding import encoded_allreduce
from topocc.planner.analysis.encodings import check_encodings, trace_lineages
from topocc.planner.analysis.verify import verify
from topocc.planner.errors import VerificationError
from topocc.runtime.schedule import Chunk, Schedule, build_schedule, operation


def _without_roundings(s: Schedule) -> Schedule:
    """``s`` with its rounding copies made exact copies (each rank keeps its own, exact, value)."""
    programs = [[replace(op, encoding=None) if op.kind == "copy" else op for op in p] for p in s.programs]
    return replace(s, programs=tuple(tuple(p) for p in programs))


@pytest.mark.parametrize("encoding", ["bf16", "fp16", "int8:block=256", "topk:0.5"])
def test_a_consistent_schedule_is_proved_and_its_approximate_chunks_reported(encoding: str) -> None:
    s = encoded_allreduce(encoding)
    proof = verify(s)
    assert proof.approximate_chunks == 4  # both output chunks on both ranks came through an encoding
    report = check_encodings(s)
    assert report.encoded_messages == 4 and report.rounding_copies == 2 and report.encodings == (encoding,)
    assert report.approximate == ((0, 1), (0, 1))


def test_an_owner_that_keeps_its_exact_value_is_refused() -> None:
    with pytest.raises(VerificationError, match=r"output chunk 0 differs between ranks: rank 0 holds it decoded from "
                                                r"bf16 message rank 1 op 2, rank 1 decoded from bf16 message rank 0 "
                                                r"op 4 .*fix: a rank that sends a chunk encoded must keep"):
        verify(_without_roundings(encoded_allreduce()))


def test_an_elementwise_encoding_twice_is_the_encoding_once_but_a_block_encoding_is_not() -> None:
    """Rank 0 sends its chunk encoded to rank 1 and keeps the decoded value; rank 1 forwards what it got to rank
    2 encoded again: bf16 of bf16 is bf16, so all agree; int8 of a different grouping (here, of the same two
    chunks, as two messages of one) is a new rounding, which rank 0 does not hold."""
    def chain(encoding: str, split: bool) -> Schedule:
        forward = ([operation("send", 2, Chunk("o", 0), None, (0,), 1, 0, encoding),
                    operation("send", 2, Chunk("o", 1), None, (0,), 1, 0, encoding)] if split
                   else [operation("send", 2, Chunk("o", 0, 2), None, (0,), 1, 0, encoding)])
        receive = ([operation("recv", 1, None, Chunk("o", 0), (), 1, 0, encoding),
                    operation("recv", 1, None, Chunk("o", 1), (), 1, 0, encoding)] if split
                   else [operation("recv", 1, None, Chunk("o", 0, 2), (), 1, 0, encoding)])
        return build_schedule("broadcast", 3, 2, 2, [
            [operation("copy", None, Chunk("i", 0, 2), Chunk("o", 0, 2), (), 0, 0, encoding),
             operation("send", 1, Chunk("o", 0, 2), None, (0,), 0, 0, encoding)],
            [operation("recv", 0, None, Chunk("o", 0, 2), (), 0, 0, encoding), *forward],
            receive,
        ], root=0)

    for encoding in ("bf16", "int8:block=256"):
        verify(chain(encoding, split=False))
    verify(chain("bf16", split=True))
    with pytest.raises(VerificationError, match="output chunk 0 differs between ranks: rank 0 holds it decoded from "
                                                "int8:block=256 rounding copy rank 0 op 0, rank 2 decoded from"):
        verify(chain("int8:block=256", split=True))


def test_refusals_of_what_cannot_carry_an_encoding() -> None:
    s = encoded_allreduce()
    with pytest.raises(VerificationError, match="rank 0 op 1: bf16 cannot carry int32 data"):
        check_encodings(s, ("int32", 4))
    check_encodings(s, ("float64", 8))
    mismatched = list(map(list, s.programs))
    received = mismatched[0][1]
    assert received.kind in ("recv", "recv_reduce")
    mismatched[0][1] = replace(received, encoding="fp16")
    with pytest.raises(VerificationError, match=r"rank 0 op 1 receives fp16 but its send \(rank 1 op 2\) sends bf16"):
        verify(build_schedule("allreduce", 2, 2, 2, mismatched))
    with pytest.raises(ValueError, match=r"no 'reduce' operation has .* encoding bf16"):  # a reduce holds none
        operation("reduce", None, Chunk("o", 1), Chunk("o", 0), (3, 5), 2, 0, "bf16")


def test_lineages_record_what_each_encoded_operation_read() -> None:
    trace = trace_lineages(encoded_allreduce())
    assert set(trace.encoded_inputs) == {(r, k) for r in range(2) for k in (2, 3, 4)}
    assert trace.outputs[0] == trace.outputs[1]
