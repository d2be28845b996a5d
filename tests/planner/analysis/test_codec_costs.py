"""Encoded messages in the simulator: their encoding's bytes on the wire, and the hosts' encode and decode time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import TWO_GPUS
from tests.runtime.test_schedule_encoding import encoded_allreduce
from topocc.planner.analysis.codec_costs import codec_costs, codec_rate
from topocc.planner.analysis.simulate import simulate
from topocc.planner.topology.calibration import Calibration, HostCosts
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.encoding import parse_encoding
from topocc.runtime.schedule import Schedule, without_encoding

SIZE = 64 << 20  # two chunks of 32 MiB


def _exact(s: Schedule) -> Schedule:
    return replace(s, programs=tuple(tuple(map(without_encoding, p)) for p in s.programs))


@pytest.mark.parametrize("encoding", ["bf16", "int8:block=256", "topk:0.01"])
def test_encoded_messages_carry_their_encoding_bytes(encoding: str) -> None:
    topology = parse_topology_text(TWO_GPUS)
    s = encoded_allreduce(encoding)
    exact = simulate(topology, _exact(s), SIZE)
    encoded = simulate(topology, s, SIZE)
    wire = parse_encoding(encoding).wire_bytes((SIZE // 2) // 4, 4)
    assert exact.link_bytes[("g0", "g1")] == SIZE  # one chunk each way per phase
    assert encoded.link_bytes[("g0", "g1")] == pytest.approx(2 * wire)
    codec = parse_encoding(encoding)
    # per phase: the sender encodes, the wire carries, the receiver decodes; the owner rounds its chunk first
    per_chunk = (SIZE // 2) / codec.default_Bps
    wire_s = wire / 10e9
    assert encoded.time_s == pytest.approx(2 * (per_chunk + wire_s) + per_chunk, rel=0.05)


def test_codec_rates_follow_a_calibration() -> None:
    codec = parse_encoding("int8")
    assert codec_rate(codec, None) == codec.default_Bps
    cal = Calibration("now", "test", "mpi", HostCosts(copy_Bps=20e9), {}, {})
    assert codec_rate(codec, cal) == 20e9 / codec.cost
    costs = codec_costs(encoded_allreduce("int8:block=256").programs, [0, 6, 12], 1 << 20, cal)
    assert set(costs) == {2, 3, 4, 8, 9, 10}  # the sends and the rounding copies of both ranks
    assert costs[2].wire_bytes == codec.wire_bytes((1 << 20) // 4, 4) and costs[3].wire_bytes == 0.0
    assert costs[2].encode_s == costs[2].decode_s == pytest.approx((1 << 20) / (20e9 / codec.cost) / 2)


def test_an_encoding_that_does_not_shrink_float32_is_sent_exact() -> None:
    s = encoded_allreduce("topk:1.0")
    assert codec_costs(s.programs, [0, 6, 12], 1 << 20, None) == {}
