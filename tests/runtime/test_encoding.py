"""The wire encodings: exact byte counts, round trips that are idempotent bit for bit, and their refusals."""

from __future__ import annotations

import numpy as np
import pytest

from topocc.runtime.encoding import Bf16, Fp16, Int8Blocks, TopK, parse_encoding
from topocc.runtime.errors import ScheduleFormatError

SPECS = ["bf16", "fp16", "int8:block=256", "int8:block=7", "topk:0.01", "topk:0.3"]
FLOATS = [np.float32, np.float64, np.float16]


def _data(n: int, dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(dtype)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 7, 1000, 70001])
def test_round_trip_is_idempotent_and_fills_the_wire_exactly(spec: str, dtype: type, n: int) -> None:
    codec = parse_encoding(spec)
    x = _data(n, dtype)
    if n > 3:
        x[1], x[2] = np.nan, -0.0
    wire = np.full(codec.wire_bytes(n, x.itemsize), 0xAB, np.uint8)
    codec.encode(x, wire)
    once = np.full_like(x, 7)
    codec.decode(wire, once)
    twice = codec.round_trip(once)
    assert once.tobytes() == twice.tobytes()  # decode(encode(y)) == y for every decoded y
    again = np.empty_like(wire)
    codec.encode(x, again)
    assert again.tobytes() == wire.tobytes()  # a pure function of the data: every rank writes the same bytes


@pytest.mark.parametrize(("spec", "n", "itemsize", "expected"), [
    ("bf16", 1000, 4, 2000), ("fp16", 1000, 8, 2000),
    ("int8", 1000, 4, 1000 + 4 * 4), ("int8:block=7", 15, 4, 15 + 4 * 3), ("int8:block=7", 0, 4, 0),
    ("topk:0.01", 100_000, 4, 1000 * 4 + 1000 * 4),  # 1000 indices beat a 12500-byte bitmap
    ("topk:0.1", 100_000, 4, 10_000 * 4 + 12_500),  # a bitmap beats 10000 indices
    ("topk:0.01", 10, 4, 1 * 4 + 2), ("topk:0.01", 0, 4, 0),
])
def test_wire_bytes(spec: str, n: int, itemsize: int, expected: int) -> None:
    assert parse_encoding(spec).wire_bytes(n, itemsize) == expected


def test_errors_are_those_of_each_format() -> None:
    x = _data(1 << 16, np.float32, seed=3)
    err = {spec: float(np.linalg.norm(parse_encoding(spec).round_trip(x) - x) / np.linalg.norm(x))
           for spec in ("bf16", "fp16", "int8", "topk:0.01")}
    assert err["fp16"] < 1e-3 < err["bf16"] < 4e-3  # 11 and 8 bits of mantissa
    assert err["int8"] < 0.05  # 7 bits per block of 256, scales in powers of two
    assert 0.5 < err["topk:0.01"] < 1  # the 1% largest of normal data hold a small part of its energy
    assert Bf16().round_trip(np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8], np.float32)).tolist() == \
        [1.0, 1.0, 1 + 2**-6]  # ties round to even


def test_top_k_keeps_the_largest_exactly() -> None:
    x = np.array([0.5, -9.0, 1.0, 3.0, -0.0, 2.0], np.float32)
    assert TopK(0.5).round_trip(x).tolist() == [0.0, -9.0, 0.0, 3.0, 0.0, 2.0]
    big = _data(200_000, np.float32, seed=5)
    kept = TopK(0.01).round_trip(big)
    assert np.count_nonzero(kept) == 2000
    assert np.abs(big[kept != 0]).min() >= np.abs(big[kept == 0]).max()


@pytest.mark.parametrize("nonzero", [700, 2000, 2001, 5000])
def test_top_k_of_mostly_zero_data_keeps_its_largest(nonzero: int) -> None:
    """Data mostly zero (a sparse gradient, a value top-k decoded before) samples a zero threshold: fewer than
    k nonzeros travel whole, more give their k largest, as for dense data."""
    rng = np.random.default_rng(nonzero)
    x = np.zeros(200_000, np.float32)
    x[rng.choice(x.size, nonzero, replace=False)] = rng.standard_normal(nonzero).astype(np.float32)
    kept = TopK(0.01).round_trip(x)
    k = TopK(0.01).keep(x.size)
    if nonzero <= k:
        assert np.array_equal(kept, x)
    else:
        assert np.count_nonzero(kept) == k
        assert np.abs(x[kept != 0]).min() >= np.abs(x[kept == 0]).max()
        assert np.array_equal(kept[kept != 0], x[kept != 0])


def test_int8_blocks_scale_in_powers_of_two_and_mark_non_finite_blocks() -> None:
    x = np.array([1.0, -2.0, 100.0, 3.0, np.inf, 1.0, 0.3, 0.1, -0.2], np.float32)
    y = Int8Blocks(3).round_trip(x)
    assert y[:3].tolist() == [1.0, -2.0, 100.0]  # 100 / 127 rounds up to a scale of 1: integers stay exact
    scale = 2.0 ** -8  # the smallest power of two with 127 * scale >= 0.3
    assert (y[6:] / scale == np.rint(y[6:] / scale)).all() and np.abs(y[6:] - x[6:]).max() <= scale / 2
    assert np.isnan(y[3:6]).all()
    assert Int8Blocks(4).round_trip(np.zeros(5, np.float32)).tolist() == [0.0] * 5


def test_carries_only_floats_it_makes_smaller() -> None:
    assert Bf16().carries("float32", 4) and Fp16().carries("float64", 8)
    assert not Bf16().carries("float16", 2) and not Bf16().carries("bfloat16", 2)
    assert Int8Blocks().carries("float16", 2) and TopK(0.01).carries("bfloat16", 2)
    for dtype, size in (("int32", 4), ("int64", 8), ("uint8", 1), ("int8", 1)):
        assert not any(parse_encoding(s).carries(dtype, size) for s in SPECS)
    assert not TopK(1.0).carries("float32", 4)  # all values and a bitmap: more than exact


@pytest.mark.parametrize(("text", "spec"), [
    ("bf16", "bf16"), ("BF16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16"), ("int8", "int8:block=256"),
    ("int8:block=64", "int8:block=64"), ("topk:1%", "topk:0.01"), ("topk:0.01", "topk:0.01"), ("topk:1", "topk:1.0"),
])
def test_specs_are_canonical(text: str, spec: str) -> None:
    assert parse_encoding(text).spec == spec
    assert parse_encoding(spec) == parse_encoding(text)


@pytest.mark.parametrize(("text", "fragment"), [
    ("bf8", "unknown encoding 'bf8'"), ("int8:block=0", "bad int8 encoding"), ("int8:size=4", "bad int8 encoding"),
    ("topk:0", "bad top-k encoding"), ("topk:150%", "bad top-k encoding"), ("topk:x", "bad top-k encoding"),
    ("bf16:2", "unknown encoding"),
])
def test_bad_specs_say_what_to_write(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleFormatError, match=fragment) as info:
        parse_encoding(text)
    assert info.value.fix and ("topk" in info.value.fix or "int8:block=N" in info.value.fix)
    assert "\n" not in str(info.value)


def _decoded(codec: TopK, wire: np.ndarray, n: int, dtype: type = np.float32) -> np.ndarray:
    out: np.ndarray = np.empty(n, dtype)
    codec.decode(wire, out)
    return out


@pytest.mark.parametrize("n", [1000, 100_000])  # positions as int32 indices, then as a bitmap
def test_top_k_above_a_threshold_sends_what_passes_it_k_at_most(n: int) -> None:
    codec = TopK(0.05)
    k = codec.keep(n)
    x = _data(n, np.float32, seed=4)
    wire = np.empty(codec.wire_bytes(n, 4), np.uint8)
    threshold = codec.encode_refreshed(x, wire)  # a refresh is exact top-k, and keeps the k-th magnitude
    exact = np.empty_like(wire)
    codec.encode(x, exact)
    assert wire.tobytes() == exact.tobytes() and threshold == np.sort(np.abs(x))[-k]
    codec.encode_above(x * 0.5, wire, threshold)  # fewer pass: exactly those, the rest zero
    got = _decoded(codec, wire, n)
    passed = np.abs(x * 0.5) >= threshold
    assert 0 < passed.sum() < k and np.array_equal(got, np.where(passed, x * 0.5, 0))
    codec.encode_above(x * 2, wire, threshold)  # more pass: the k largest of them
    codec.encode(x * 2, exact)
    assert wire.tobytes() == exact.tobytes()


def test_top_k_above_a_threshold_passes_a_decoded_value_whole() -> None:
    """A value with at most k nonzeros (one decoded before) travels bit for bit whatever the threshold: the
    owner's rounding and every relay agree, as an encoded schedule's consistency needs."""
    codec = TopK(0.01)
    n = 5000
    x = _data(n, np.float32, seed=6)
    wire = np.empty(codec.wire_bytes(n, 4), np.uint8)
    codec.encode_above(x, wire, 0.5)
    once = _decoded(codec, wire, n)
    for threshold in (0.0, 0.5, 10.0, np.inf):
        codec.encode_above(once, wire, threshold)
        assert _decoded(codec, wire, n).tobytes() == once.tobytes()
    codec.encode(once, wire)
    assert _decoded(codec, wire, n).tobytes() == once.tobytes()
    nan = x.copy()
    nan[7] = np.nan
    codec.encode_above(nan, wire, np.inf)  # NaNs always pass, as they count largest
    assert np.isnan(_decoded(codec, wire, n)[7])
