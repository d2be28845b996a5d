"""What an encoded message costs in the simulator: its bytes on the wire, and its encode and decode time.

Sizes follow nccl-tests' convention (float32 elements), so a message of ``count`` chunks of a
``chunk_bytes`` schedule carries ``count * chunk_bytes / 4`` elements, and its encoding's exact
:meth:`~topocc.runtime.encoding.Encoding.wire_bytes` for them.  Encoding plus decoding runs on the hosts
at the topology's calibrated copy throughput divided by the encoding's ``cost`` (passes over the data),
or, on a topology that measured none, at the encoding's ``default_Bps``: the sender encodes before its
bytes go, the receiver decodes once they have arrived (half the time each), and a rounding copy does both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from topocc.planner.topology.calibration import Calibration
from topocc.runtime.encoding import Encoding, parse_encoding
from topocc.runtime.schedule import Op

__all__ = ["FLOAT32_BYTES", "CodecCost", "codec_costs", "codec_rate"]

#: Bytes per element the simulator assumes (nccl-tests' sizes are float32 elements).
FLOAT32_BYTES = 4


@dataclass(frozen=True, slots=True)
class CodecCost:
    """One encoded operation in the simulator: bytes on the wire (a message), and host seconds to encode
    (the sender's, before its bytes go) and to decode (the receiver's, after they arrived)."""

    wire_bytes: float
    encode_s: float
    decode_s: float


def codec_rate(encoding: Encoding, calibration: Calibration | None) -> float:
    """Bytes/s of encoding plus decoding (of the exact data): measured copies over the encoding's cost where
    the topology is calibrated, its default throughput otherwise."""
    if calibration is not None and math.isfinite(calibration.host.copy_Bps):
        return calibration.host.copy_Bps / encoding.cost
    return encoding.default_Bps


def codec_costs(programs: Sequence[Sequence[Op]], base: Sequence[int], chunk_bytes: float,
                calibration: Calibration | None) -> dict[int, CodecCost]:
    """Per encoded send and rounding copy (by the simulator's operation number, ``base[rank] + index``)."""
    out: dict[int, CodecCost] = {}
    for first, program in zip(base, programs):
        for k, op in enumerate(program):
            if op.encoding is None or op.kind not in ("send", "copy"):
                continue
            encoding = parse_encoding(op.encoding)
            if not encoding.carries("float32", FLOAT32_BYTES):  # the runtime sends it exact
                continue
            exact = op.count * chunk_bytes
            seconds = exact / codec_rate(encoding, calibration)
            elements = round(exact / FLOAT32_BYTES)
            wire = float(encoding.wire_bytes(elements, FLOAT32_BYTES)) if op.kind == "send" else 0.0
            out[first + k] = CodecCost(wire, seconds / 2, seconds / 2)
    return out
