"""Human units: exact values, round trips through the formatters, and refusals."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topocc.planner.units import (
    UnitError,
    format_bandwidth,
    format_size,
    format_time,
    parse_bandwidth,
    parse_size,
    parse_size_range,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("25 GB/s", 25e9),
        ("25GB/s", 25e9),
        ("200 Gbit/s", 25e9),
        ("100 Gbps", 12.5e9),
        ("10 Gb/s", 1.25e9),
        ("1 GiB/s", 2**30),
        ("12.5 GBps", 12.5e9),
        ("1e3 MB/s", 1e9),
        ("+5 GB/s", 5e9),
    ],
)
def test_parse_bandwidth(text: object, expected: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("parse", "text", "message", "fix"),
    [(parse_bandwidth, 300, "300 has no unit", "write it with one, e.g. 300GB/s or 2400Gb/s"),
     (parse_bandwidth, "12.5", "12.5 has no unit", "write it with one, e.g. 12.5GB/s or 100Gb/s"),
     (parse_bandwidth, 2.5e9, "2500000000.0 has no unit", "write it with one, e.g. 2.5GB/s if it is bytes/s"),
     (parse_time, 0.7, "0.7 has no unit", "write it with one, e.g. 0.7us or 0.7ms"),
     (parse_time, "5", "5 has no unit", "write it with one, e.g. 5us or 5ms"),
     (parse_time, 7e-07, "7e-07 has no unit", "write it with one, e.g. 700ns if it is seconds")],
)
def test_a_bare_number_is_refused_with_what_to_write(parse: Any, text: object, message: str, fix: str) -> None:
    """bytes/s and seconds are never what ``bandwidth: 300`` or ``latency: 0.7`` meant: the unit is required."""
    with pytest.raises(UnitError) as refused:
        parse(text)
    assert (str(refused.value), refused.value.fix) == (message, fix)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.7 us", 0.7e-6), ("700ns", 700e-9), ("1 ms", 1e-3), ("2 s", 2.0), ("1 µs", 1e-6), (0, 0.0), ("0 us", 0.0),
     (0.0, 0.0), ("0", 0.0)],  # zero is zero in every unit
)
def test_parse_time(text: object, expected: float) -> None:
    assert parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64MiB", 64 * 2**20), ("1GB", 10**9), ("4096", 4096), (4096, 4096), ("1 KiB", 1024), ("1.5KiB", 1536),
     ("4096B", 4096), ("1KB", 1000), ("1kB", 1000), ("1.024MB", 1_024_000), ("2TB", 2 * 10**12),
     # nccl-tests (-b 8 -e 128M): a single letter is binary, in either case
     ("64M", 64 * 2**20), ("128m", 128 * 2**20), ("1G", 2**30), ("8K", 8192), ("8k", 8192), ("1T", 2**40),
     (" 64 M ", 64 * 2**20)],
)
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_range() -> None:
    assert parse_size_range("1KiB:1GiB") == (1024, 2**30)
    assert parse_size_range("64MiB") == (64 * 2**20, 64 * 2**20)


@pytest.mark.parametrize(
    "text",
    ["fast", "", "25", "25 GB", "25 G", "0 GB/s", "-25 GB/s", "1e999 GB/s", "GB/s", "25 GB/h", True, None, 0, -1,
     10**400, float("nan"), float("inf"), [25], 4096, 2.5e9],
)
def test_bad_bandwidth(text: object) -> None:
    with pytest.raises(UnitError):
        parse_bandwidth(text)


@pytest.mark.parametrize("text", ["soon", "1", "-1 us", "3 parsecs", "1 us/s", "1e999 s", True, -0.5, float("nan"), 0.7,
                                  1e-6])
def test_bad_time(text: object) -> None:
    with pytest.raises(UnitError):
        parse_time(text)


@pytest.mark.parametrize("text", ["big", "0", "-1", "0.5", "1.3B", "1 GB/s", "1e999", 0, True, 10**400, "64mb", "64Mi",
                                  "1.0000001M", "64 MiB/s"])
def test_bad_size(text: object) -> None:
    with pytest.raises(UnitError):
        parse_size(text)


@pytest.mark.parametrize("text", ["1GiB:1KiB", "1KiB:", ":1KiB", "a:b"])
def test_bad_size_range(text: str) -> None:
    with pytest.raises(UnitError):
        parse_size_range(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [(64 * 2**20, "64MiB"), (2**30, "1GiB"), (1536, "1.5KiB"), (100, "100B"),
     # decimal sizes stay decimal, exactly (not 61MiB); what neither family writes exactly prints in bytes
     (64 * 10**6, "64MB"), (10**9, "1GB"), (1000, "1KB"), (1_024_000, "1024KB"), (12345, "12345B"),
     (64 * 2**20 + 1, "67108865B"), (float(2**20), "1MiB")],
)
def test_format_size(value: int, text: str) -> None:
    assert format_size(value) == text


def test_format_size_of_a_fractional_amount_is_approximate() -> None:
    assert format_size(1.5 * 2**20 + 0.5) == "1.5MiB" and format_size(10.25) == "10.2B"


def test_format_bandwidth_and_time() -> None:
    assert format_bandwidth(25e9) == "25 GB/s"
    assert format_bandwidth(2.56e13) == "25.6 TB/s"  # not 2.56e+04 GB/s
    assert format_bandwidth(1.25e8) == "125 MB/s" and format_bandwidth(12.5) == "12.5 B/s"
    assert format_time(12345.6) == "12350 s" and format_time(0) == "0 ns"
    assert format_time(0.7e-6) == "700 ns"
    assert format_time(1.3e-6) == "1.3 us"
    assert format_time(1.5e-3) == "1.5 ms"
    assert format_time(2.0) == "2 s"
    assert format_time(5e-9) == "5 ns"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(min_value=1, max_value=2**63 - 1),
                 st.builds(lambda m, k, binary: m * (1024 if binary else 1000) ** k,
                           st.integers(1, 1023), st.integers(0, 4), st.booleans())))
def test_size_round_trip(size: int) -> None:
    """Every byte count prints exactly: parsing the text gives the same count back."""
    assert parse_size(format_size(size)) == size


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e3, max_value=1e15, allow_nan=False, allow_infinity=False))
def test_bandwidth_round_trip(value: float) -> None:
    """Formatting keeps 4 significant digits, so parsing back is within 0.05%."""
    assert math.isclose(parse_bandwidth(format_bandwidth(value)), value, rel_tol=5e-4)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e-9, max_value=1e3, allow_nan=False, allow_infinity=False))
def test_time_round_trip(value: float) -> None:
    assert math.isclose(parse_time(format_time(value)), value, rel_tol=5e-4)
