"""Human units: bandwidths ("25 GB/s", "200 Gbit/s"), latencies ("0.7 us"), sizes ("64MiB").

Decimal prefixes are powers of 1000 and binary ones (KiB, MiB, ...) powers of
1024, as in nccl-tests; bandwidths are returned in bytes per second, times in
seconds, sizes in bytes.
"""

from __future__ import annotations

import math
import re

__all__ = ["format_bandwidth", "format_size", "format_time", "parse_bandwidth", "parse_size", "parse_size_range",
           "parse_time"]

_DECIMAL = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_BANDWIDTH = re.compile(
    _NUMBER + r"\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?\s*(B|bit|b|bps|Bps)?\s*(/\s*s|ps)?$"
)
_TIME = re.compile(_NUMBER + r"\s*(s|ms|us|µs|ns)$")
_SIZE = re.compile(_NUMBER + r"\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?(B)?$")
_TIME_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class UnitError(ValueError):
    """A quantity that does not parse; callers add the file and place."""


def _number(value: int | float | str) -> float:
    """``float(value)``, with numbers too large for a float reported as a :class:`UnitError`."""
    try:
        return float(value)
    except OverflowError:
        raise UnitError(f"{value!r} is too large") from None


def _prefix(prefix: str | None) -> float:
    if not prefix:
        return 1.0
    return float(_BINARY[prefix]) if prefix in _BINARY else _DECIMAL[prefix]


def parse_bandwidth(text: object) -> float:
    """Bytes per second from ``"25 GB/s"``, ``"200 Gbit/s"``, ``"100 Gbps"`` or a bare number (bytes/s)."""
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a bandwidth")
    if isinstance(text, (int, float)):
        value = _number(text)
    else:
        match = _BANDWIDTH.match(str(text).strip())
        if not match or (match.group(3) is None and match.group(4) is None and match.group(2)):
            raise UnitError(f"{text!r} is not a bandwidth (write e.g. '25 GB/s' or '200 Gbit/s')")
        number, prefix, unit, per_second = match.groups()
        if unit in ("bps",):
            unit, per_second = "bit", "/s"
        elif unit == "Bps":
            unit, per_second = "B", "/s"
        if unit is None or per_second is None:
            raise UnitError(f"{text!r} is not a bandwidth (write e.g. '25 GB/s' or '200 Gbit/s')")
        value = _number(number) * _prefix(prefix) / (8.0 if unit in ("bit", "b") else 1.0)
    if not math.isfinite(value) or value <= 0:
        raise UnitError(f"bandwidth must be positive, got {text!r}")
    return value


def parse_time(text: object) -> float:
    """Seconds from ``"0.7 us"``, ``"700ns"``, ``"1 ms"`` or a bare number (seconds)."""
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a time")
    if isinstance(text, (int, float)):
        value = _number(text)
    else:
        match = _TIME.match(str(text).strip())
        if not match:
            raise UnitError(f"{text!r} is not a time (write e.g. '0.7 us', '700 ns' or '1 ms')")
        value = _number(match.group(1)) * _TIME_SCALE[match.group(2)]
    if not math.isfinite(value) or value < 0:
        raise UnitError(f"time must be zero or positive, got {text!r}")
    return value


def parse_size(text: object) -> int:
    """Bytes from ``"64MiB"``, ``"1GB"``, ``"4096"``; must be a positive whole number of bytes."""
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a size")
    if isinstance(text, int):
        value = _number(text)
    else:
        match = _SIZE.match(str(text).strip())
        if not match:
            raise UnitError(f"{text!r} is not a size (write e.g. 64MiB, 1GB or 4096)")
        value = _number(match.group(1)) * _prefix(match.group(2))
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise UnitError(f"size must be a positive whole number of bytes, got {text!r}")
    return int(value)


def parse_size_range(text: str) -> tuple[int, int]:
    """``"1KiB:1GiB"`` -> (1024, 2**30); a single size gives (size, size)."""
    low, sep, high = str(text).partition(":")
    lo = parse_size(low)
    hi = parse_size(high) if sep else lo
    if hi < lo:
        raise UnitError(f"size range {text!r} ends below its start")
    return lo, hi


def format_size(nbytes: float) -> str:
    """``67108864`` -> ``"64MiB"`` (binary units, as nccl-tests prints sizes)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{int(nbytes)}B"


def format_bandwidth(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.4g} GB/s"


def format_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds * 1e9:.4g} ns"
