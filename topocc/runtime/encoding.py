"""Wire encodings: a message of a schedule may carry its chunks in fewer bytes than exact.

A send and its receive may name one encoding (the schedule's ``enc`` field): the sender encodes the
message's elements, in chunk order, into bytes, and the receiver decodes them before it stores or reduces
them, so it gets ``decode(encode(x))``, an approximation of ``x``.  A ``copy`` may name one too: its
destination then gets ``decode(encode(src))`` (a *rounding copy*), which lets the owner of a chunk keep
exactly the value it sends, so that every rank ends with bitwise the same result.

Every encoding here is a pure function of the elements (the same bits on every rank) and *idempotent*:
``decode(encode(decode(encode(x)))) == decode(encode(x))`` bit for bit, so a value that passes through
an encoding twice with the same element range is the value that passed once.  Their wire sizes depend
only on the element count and size, so both ends of a message know it in advance:

============================  ===========================================================================
spec                          bytes on the wire for ``n`` elements of ``s`` bytes
============================  ===========================================================================
``bf16``                      ``2n``: bfloat16, rounded to nearest even (float32 and float64 data only)
``fp16``                      ``2n``: IEEE half precision, rounded to nearest even (float32, float64)
``int8:block=B``              ``n + 4 * ceil(n / B)``: an int8 per element and a float32 scale per block of
                              ``B`` elements, a power of two (so that encoding twice changes nothing)
``topk:F``                    ``k * s + min(4k, ceil(n / 8))`` with ``k = ceil(F * n)``: the ``k`` values of
                              largest magnitude, exact, then their int32 indices or a bitmap, whichever is
                              smaller
============================  ===========================================================================

Integer data cannot be encoded (the runtime sends it exact), and neither can data an encoding would not
make smaller (``bf16`` of float16).  :func:`parse_encoding` reads a spec; each :class:`Encoding` has
``encode``, ``decode`` and ``wire_bytes``, the extension point for another encoding.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from topocc.runtime.errors import ScheduleFormatError

__all__ = ["FLOAT_NAMES", "Bf16", "Encoding", "Fp16", "Int8Blocks", "TopK", "parse_encoding", "why_exact"]

#: Element types an encoding may carry, by the runtime's names (integers go exact).
FLOAT_NAMES = frozenset({"float16", "bfloat16", "float32", "float64"})

#: Default block of ``int8`` when the spec names none.
DEFAULT_BLOCK = 256

_SPEC_FIX = "use bf16, fp16, int8:block=N or topk:FRACTION (e.g. topk:0.01 or topk:1%)"


class Encoding(ABC):
    """One wire encoding: a pure, idempotent function from elements to bytes and back.

    ``spec`` is its canonical text (as schedules store it); ``elementwise`` says whether an element's code
    depends on that element alone (then how a message groups its chunks does not matter); ``cost`` is the
    time of encoding plus decoding, in passes over the data at a copy's throughput (the simulator's model
    on a calibrated topology); ``default_Bps`` the throughput of encoding plus decoding it assumes on a
    topology that measured none.  Both are this numpy code's on one core, float32 messages of 4 MiB, against
    ``np.copyto`` on the same machine (``benchmarks/compression_bench.py --codecs`` measures them).
    """

    elementwise: bool
    cost: float
    default_Bps: float

    @property
    @abstractmethod
    def spec(self) -> str:
        """The canonical text of the encoding (as schedules store it)."""

    def carries(self, dtype_name: str, itemsize: int) -> bool:
        """Whether data of this dtype can travel encoded: a float type the encoding makes smaller."""
        return dtype_name in FLOAT_NAMES and self.ratio(itemsize) < 1.0

    def ratio(self, itemsize: int) -> float:
        """Bytes on the wire over exact bytes, for a long message of ``itemsize``-byte elements."""
        n = 1 << 20
        return self.wire_bytes(n, itemsize) / (n * itemsize)

    @abstractmethod
    def wire_bytes(self, n: int, itemsize: int) -> int:
        """Exact bytes on the wire for ``n`` elements of ``itemsize`` bytes."""

    @abstractmethod
    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        """Encode the 1-D float array ``x`` into ``out`` (uint8, :meth:`wire_bytes` long)."""

    @abstractmethod
    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        """Decode ``wire`` (as :meth:`encode` wrote it) into the 1-D float array ``out``, overwriting it."""

    def round_trip(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``decode(encode(x))`` into ``out`` (a new array if None): what a receiver of ``x`` gets."""
        wire = np.empty(self.wire_bytes(x.size, x.itemsize), np.uint8)
        self.encode(x, wire)
        target = np.empty_like(x) if out is None else out
        self.decode(wire, target)
        return target

    def __repr__(self) -> str:
        return f"Encoding({self.spec!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Encoding) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)


def _as_float32(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 (itself when it is), for the codecs that compute in float32."""
    return x if x.dtype == np.float32 else x.astype(np.float32)


class Bf16(Encoding):
    """bfloat16: the top 16 bits of a float32, rounded to nearest even; NaNs become one quiet NaN per sign."""

    spec = "bf16"
    elementwise = True
    cost = 8.0
    default_Bps = 2.0e9

    def wire_bytes(self, n: int, itemsize: int) -> int:
        return 2 * n

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        bits = _as_float32(x).view(np.uint32)
        # round to nearest even: add 0x7FFF plus the lowest kept bit, then drop the low half (in place: one
        # temporary)
        rounded = bits >> 16
        rounded &= 1
        rounded += 0x7FFF
        rounded += bits
        rounded >>= 16
        code = out.view(np.uint16)
        np.copyto(code, rounded, casting="unsafe")
        nan = np.isnan(x)
        if nan.any():  # the addition may carry out of a NaN's payload: keep its sign, quiet it
            code[nan] = ((bits[nan] >> 16) & 0x8000) | 0x7FC0

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        full = wire.view(np.uint16).astype(np.uint32) << 16
        np.copyto(out, full.view(np.float32), casting="unsafe")


class Fp16(Encoding):
    """IEEE half precision (numpy's conversion: nearest even, overflow to infinity)."""

    spec = "fp16"
    elementwise = True
    cost = 12.0
    default_Bps = 1.2e9

    def wire_bytes(self, n: int, itemsize: int) -> int:
        return 2 * n

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(out.view(np.float16), x, casting="unsafe")

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, wire.view(np.float16), casting="unsafe")


@dataclass(frozen=True, eq=False, repr=False)
class Int8Blocks(Encoding):
    """An int8 per element and a power-of-two float32 scale per block of ``block`` elements.

    The scale is the smallest power of two ``s`` with ``127 * s >= max |x|`` over the block, so every
    decoded value ``q * s`` is exact and encoding it again finds a scale that divides it: the round trip is
    idempotent.  A block holding a NaN or an infinity decodes to NaNs; the scale stays within float32's
    normal range (float64 data beyond it saturates).
    """

    block: int = DEFAULT_BLOCK
    elementwise = False
    cost = 10.0
    default_Bps = 1.6e9

    @property
    def spec(self) -> str:
        return f"int8:block={self.block}"

    def wire_bytes(self, n: int, itemsize: int) -> int:
        return n + 4 * -(-n // self.block)

    def _layout(self, n: int, wire: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        blocks = -(-n // self.block)
        return wire[:4 * blocks].view(np.float32), wire[4 * blocks:4 * blocks + n].view(np.int8)

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        n = x.size
        if not n:
            return
        scales, codes = self._layout(n, out)
        work = x if x.dtype == np.float64 else _as_float32(x)
        padded = _blocks(work, self.block)
        amax = np.abs(padded).max(axis=1)
        finite = np.isfinite(amax)
        # the smallest e with 127 * 2**e >= amax: amax = m * 2**p with m in [0.5, 1) gives e = p - 7 or p - 6
        _, p = np.frexp(np.where(finite, amax, 0.0))
        e = np.where(np.ldexp(127.0, p - 7) >= amax, p - 7, p - 6)
        e = np.clip(e, -149, 127)
        scale = np.ldexp(np.ones_like(amax), e)
        scale[amax == 0] = 1.0
        with np.errstate(invalid="ignore"):
            q = np.clip(np.rint(padded / scale[:, None]), -127, 127)
        q[~finite] = 0
        np.copyto(codes, q.reshape(-1)[:n], casting="unsafe")
        np.copyto(scales, np.where(finite, scale, np.nan), casting="unsafe")

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        n = out.size
        if not n:
            return
        scales, codes = self._layout(n, wire)
        work = np.float64 if out.dtype == np.float64 else np.float32
        values = _blocks(codes.astype(work), self.block) * scales.astype(work)[:, None]
        np.copyto(out, values.reshape(-1)[:n], casting="unsafe")


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    """``x`` as rows of ``block`` elements, the last row padded with zeros."""
    rows = -(-x.size // block)
    if rows * block == x.size:
        return x.reshape(rows, block)
    padded = np.zeros(rows * block, x.dtype)
    padded[:x.size] = x
    return padded.reshape(rows, block)


@dataclass(frozen=True, eq=False, repr=False)
class TopK(Encoding):
    """The ``ceil(fraction * n)`` values of largest magnitude, exact, and where they are; zeros elsewhere.

    Values come first (the data's own type), then their positions: ascending int32 indices, or a bitmap
    of ``n`` bits, whichever is smaller (both ends know which from ``n``).  NaNs count as largest; a
    selected ``-0.0`` is sent as ``+0.0``, so that a second round trip gives the same bits.
    """

    fraction: float = 0.01
    elementwise = False
    cost = 10.0
    default_Bps = 1.5e9

    @property
    def spec(self) -> str:
        return f"topk:{self.fraction!r}"

    def keep(self, n: int) -> int:
        """How many values a message of ``n`` elements keeps."""
        return min(n, max(1, math.ceil(self.fraction * n))) if n else 0

    def _bitmap(self, n: int) -> bool:
        """Whether positions travel as a bitmap (else as int32 indices)."""
        return -(-n // 8) < 4 * self.keep(n)

    def wire_bytes(self, n: int, itemsize: int) -> int:
        k = self.keep(n)
        return k * itemsize + min(4 * k, -(-n // 8))

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        k = self.keep(x.size)
        if k:
            self._write(x, _largest(_magnitude(x), k), out)

    def encode_refreshed(self, x: np.ndarray, out: np.ndarray) -> float:
        """:meth:`encode`, and the threshold DCT keeps until its next refresh: the smallest magnitude kept (the
        k-th largest; 0 where fewer than k elements are nonzero; infinity where every kept value is NaN)."""
        k = self.keep(x.size)
        if not k:
            return math.inf
        magnitude = _magnitude(x)
        where = _largest(magnitude, k)
        self._write(x, where, out)
        kept = magnitude[where]
        kept = kept[~np.isnan(kept)]
        return float(kept.min()) if kept.size else math.inf

    def encode_above(self, x: np.ndarray, out: np.ndarray, threshold: float) -> None:
        """DCT's thresholded top-k (Gupta et al., KDD 2021, "DCT"): the elements whose magnitude is at least
        ``threshold`` (NaNs too), the ``k`` largest of them where more pass; in the same wire layout, the unused
        slots naming the first unselected positions with the value zero.

        A value with at most ``k`` nonzeros travels whole, whatever the threshold: so a value decoded once (by
        this or by :meth:`encode`) passes every later encoding unchanged, on any rank, as the consistency of an
        encoded schedule needs (the owner keeps what it sends; relays forward it bit for bit).
        """
        n, k = x.size, self.keep(x.size)
        if not k:
            return
        magnitude = _magnitude(x)
        if np.isnan(magnitude.max()):  # NaNs pass whatever the threshold (they count largest)
            chosen = np.flatnonzero(~(magnitude < threshold))
        else:
            chosen = np.flatnonzero(magnitude >= threshold)
        if chosen.size > k:
            chosen = chosen[np.argpartition(magnitude[chosen], chosen.size - k)[chosen.size - k:]]
            chosen.sort()
        elif chosen.size < k and np.count_nonzero(magnitude) <= k:  # NaN counts as nonzero
            chosen = np.flatnonzero(magnitude)
        if chosen.size == k:
            self._write(x, chosen, out)
            return
        where = np.concatenate([chosen, _unchosen(n, chosen, k - chosen.size)])
        order = np.argsort(where, kind="stable")
        self._write(x, where[order], out, padded=order >= chosen.size)

    def _write(self, x: np.ndarray, where: np.ndarray, out: np.ndarray, padded: np.ndarray | None = None) -> None:
        """The values of ``x`` at the ascending positions ``where`` (``k`` of them), and the positions, into
        ``out``; the values at ``padded`` positions are sent as zero."""
        n, k = x.size, where.size
        values = out[:k * x.itemsize].view(x.dtype)
        np.add(x[where], x.dtype.type(0), out=values)  # -0.0 + 0.0 is +0.0
        if padded is not None:
            values[padded] = 0
        positions = out[k * x.itemsize:]
        if self._bitmap(n):
            mask = np.zeros(n, np.uint8)
            mask[where] = 1
            positions[:] = np.packbits(mask, bitorder="little")
        else:
            np.copyto(positions.view(np.int32), where, casting="unsafe")

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        n, k = out.size, self.keep(out.size)
        out[:] = 0
        if not k:
            return
        values = wire[:k * out.itemsize].view(out.dtype)
        positions = wire[k * out.itemsize:]
        if self._bitmap(n):
            where = np.flatnonzero(np.unpackbits(positions, count=n, bitorder="little"))
        else:
            where = positions.view(np.int32)
        out[where] = values


def _magnitude(x: np.ndarray) -> np.ndarray:
    """``|x|``, computed in float32 at least (float16's absolute values compare alike, but sort faster so)."""
    return np.abs(x if x.itemsize >= 4 else x.astype(np.float32))


#: Elements of a strided sample that :func:`_largest` estimates its threshold from.
_SAMPLE = 1 << 14


def _unchosen(n: int, chosen: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` positions of ``n`` that are not in ``chosen`` (a top-k message's padding)."""
    free = np.ones(n, bool)
    free[chosen] = False
    return np.flatnonzero(free)[:count]


def _largest(magnitude: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` largest of ``magnitude`` (NaNs largest), ascending, by a deterministic rule.

    A threshold from a strided sample, a little below the k-th largest, leaves a few times ``k`` candidates
    that hold every one of the ``k`` largest when there are at least ``k`` of them (then the k-th largest is
    at least the threshold); only those are partitioned, several times faster than the whole array.  Where
    the sample's threshold is zero (data mostly zero: a sparse gradient, a value top-k decoded before), the
    candidates are the nonzeros; fewer than ``k`` of them go with the first zeros, the value any choice of
    the ``k`` largest carries.
    """
    n = magnitude.size
    if k == n:
        return np.arange(n)
    if n >= 64 * k and n >= 1024 and not np.isnan(magnitude).any():  # a few k among many: sample first
        sample = magnitude[:: max(1, n // _SAMPLE, min(8, n // (32 * k)))]
        keep = min(sample.size - 1, max(1, 2 * k * sample.size // n))
        threshold = np.partition(sample, sample.size - keep)[sample.size - keep]
        candidates = np.flatnonzero(magnitude >= threshold if threshold > 0 else magnitude)
        if candidates.size < k and threshold <= 0:
            chosen = np.concatenate([candidates, _unchosen(n, candidates, k - candidates.size)])
            chosen.sort()
            return chosen
        if candidates.size >= k:
            chosen = candidates[np.argpartition(magnitude[candidates], candidates.size - k)[candidates.size - k:]]
            chosen.sort()
            return chosen
    where = np.argpartition(magnitude, n - k)[n - k:]
    where.sort()
    return where


def why_exact(specs: Iterable[str], dtype_name: str, itemsize: int, op: str | None = None) -> str | None:
    """Why a call of ``dtype_name`` data (``op``: its reduction, None for data only moved) runs a schedule naming
    the encodings ``specs`` exact, as the runtime decides it; None where some encoding carries it."""
    if op not in (None, "sum", "avg"):
        return f"op {op} (encodings carry sums and moved data)"
    if not any(parse_encoding(spec).carries(dtype_name, itemsize) for spec in specs):
        return f"{dtype_name} data (encodings carry float data they make smaller)"
    return None


def parse_encoding(text: str) -> Encoding:
    """The encoding a spec names (``bf16``, ``fp16``, ``int8``, ``int8:block=256``, ``topk:0.01``, ``topk:1%``).

    Raises :class:`~topocc.runtime.errors.ScheduleFormatError` with the fix for anything else.

    >>> parse_encoding("topk:1%").spec, parse_encoding("int8").wire_bytes(1000, 4)
    ('topk:0.01', 1016)
    """
    if not isinstance(text, str):
        raise ScheduleFormatError(f"an encoding is a string, got {type(text).__name__}", fix=_SPEC_FIX)
    return _parse(text)


@lru_cache(maxsize=256)
def _parse(text: str) -> Encoding:
    """:func:`parse_encoding` of a string (schedules name a few encodings many times)."""
    name, _, arg = text.strip().partition(":")
    name = name.lower()
    if name in ("bf16", "bfloat16") and not arg:
        return Bf16()
    if name in ("fp16", "float16") and not arg:
        return Fp16()
    if name == "int8":
        return Int8Blocks(_block(text, arg))
    if name == "topk":
        return TopK(_fraction(text, arg))
    raise ScheduleFormatError(f"unknown encoding {text!r}", fix=_SPEC_FIX)


def _block(text: str, arg: str) -> int:
    """The block size of an ``int8`` spec (``block=N``; none given: :data:`DEFAULT_BLOCK`)."""
    if not arg:
        return DEFAULT_BLOCK
    key, _, value = arg.partition("=")
    if key.strip() != "block" or not value.strip().isdigit() or not 1 <= int(value) <= 1 << 24:
        raise ScheduleFormatError(f"bad int8 encoding {text!r}", fix="write int8:block=N with N from 1 to 16777216")
    return int(value)


def _fraction(text: str, arg: str) -> float:
    """The kept fraction of a ``topk`` spec: ``0.01`` or ``1%``, in (0, 1]."""
    arg = arg.strip()
    try:
        value = float(arg[:-1]) / 100 if arg.endswith("%") else float(arg)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise ScheduleFormatError(f"bad top-k encoding {text!r}",
                                  fix="write topk:F with F in (0, 1], or a percentage such as topk:1%")
    return value
