"""Human units: bandwidths ("25 GB/s", "200 Gbit/s"), latencies ("0.7 us"), sizes ("64MiB", "64M", "64MB").

Bandwidths are returned in bytes per second, times in seconds, sizes in bytes.
A bandwidth or a time must carry its unit: a bare ``300`` is refused
(:class:`UnitError` with the fix), since bytes/s and seconds are never what a
person writing ``bandwidth: 300`` or ``latency: 0.7`` meant; a time of ``0`` is
zero in every unit and needs none.  A size may be bare (bytes, as nccl-tests
reads ``-b 4096``).
Bandwidth prefixes are decimal (``GB/s`` is 10^9 bytes a second, as links are
specified).  Sizes follow nccl-tests (``-b 8 -e 128M``): a single-letter suffix
(``K``, ``M``, ``G``, ``T``, either case) is binary, 2^10 ... 2^40; ``KiB``,
``MiB``, ``GiB``, ``TiB`` are binary and ``KB``/``kB``, ``MB``, ``GB``, ``TB``
decimal, both exact.  Sizes print exactly (:func:`format_size`): ``64MB`` stays
``64MB`` and ``64M`` prints ``64MiB``, never a rounded conversion into the other
family; times and bandwidths print with four significant digits in the unit
that keeps them between 1 and 1000, never in exponent notation.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["UnitError", "format_bandwidth", "format_size", "format_time", "parse_bandwidth", "parse_size",
           "parse_size_range", "parse_time"]

_DECIMAL = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_BANDWIDTH = re.compile(
    _NUMBER + r"\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?\s*(B|bit|b|bps|Bps)?\s*(/\s*s|ps)?$"
)
_TIME = re.compile(_NUMBER + r"\s*(s|ms|us|µs|ns)$")
_SIZE = re.compile(_NUMBER + r"\s*([A-Za-z]*)$")
#: Size suffixes and their multipliers: nccl-tests' single letters are binary, ``KiB``... binary, ``KB``... decimal.
SIZE_UNITS = {
    "": 1, "B": 1,
    "K": 2**10, "k": 2**10, "M": 2**20, "m": 2**20, "G": 2**30, "g": 2**30, "T": 2**40, "t": 2**40,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
    "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
#: The largest size accepted: what a signed 64-bit byte count holds.
MAX_SIZE = 2**63 - 1
#: Units :func:`format_size` may print, binary first (it prefers them on a tie, as nccl-tests prints sizes).
_SIZE_FORMS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10),
               ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
_TIME_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class UnitError(ValueError):
    """A quantity that does not parse; callers add the file and place.  ``fix`` says what to write instead,
    where the error knows better than its caller (a number without a unit)."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


def _bare(text: object) -> float | None:
    """The number ``text`` is when it is only a number (``300``, ``"0.7"``, YAML's ``2.5e9``), else None."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)) or (isinstance(text, str) and re.fullmatch(_NUMBER, text.strip())):
        return _number(text)
    return None


def _written(text: object) -> str:
    """A bare number as it was written (YAML's ``300``, ``0.7``, ``2.5e9``)."""
    return text.strip() if isinstance(text, str) else repr(text)


def _plain(value: float) -> str:
    """``value`` as a person writes it: ``300``, ``0.7``, ``2400``."""
    return _digits(value, 6)


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
    """Bytes per second from ``"25 GB/s"``, ``"200 Gbit/s"`` or ``"100 Gbps"``; a number without a unit is refused.

    >>> parse_bandwidth("200 Gbit/s")
    25000000000.0
    """
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a bandwidth")
    bare = _bare(text)
    if bare is not None:
        if not math.isfinite(bare) or bare <= 0:
            raise UnitError(f"bandwidth must be positive, got {text!r}")
        # a figure in the millions was meant as bytes/s (a script's 25e9); a small one as GB/s or Gb/s
        fix = (f"write it with one, e.g. {format_bandwidth(bare).replace(' ', '')} if it is bytes/s"
               if bare >= 1e6 else f"write it with one, e.g. {_plain(bare)}GB/s or {_plain(bare * 8)}Gb/s")
        raise UnitError(f"{_written(text)} has no unit", fix=fix)
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
    """Seconds from ``"0.7 us"``, ``"700ns"`` or ``"1 ms"``; a number without a unit is refused, except 0.

    >>> parse_time("0.7 us"), parse_time(0)
    (7e-07, 0.0)
    """
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a time")
    bare = _bare(text)
    if bare == 0:
        return 0.0
    if bare is not None:
        if not math.isfinite(bare) or bare < 0:
            raise UnitError(f"time must be zero or positive, got {text!r}")
        # below a millisecond it was meant as seconds (a script's 7e-07); else as us or ms
        fix = (f"write it with one, e.g. {format_time(bare).replace(' ', '')} if it is seconds"
               if bare < 1e-3 else f"write it with one, e.g. {_plain(bare)}us or {_plain(bare)}ms")
        raise UnitError(f"{_written(text)} has no unit", fix=fix)
    match = _TIME.match(str(text).strip())
    if not match:
        raise UnitError(f"{text!r} is not a time (write e.g. '0.7 us', '700 ns' or '1 ms')")
    value = _number(match.group(1)) * _TIME_SCALE[match.group(2)]
    if not math.isfinite(value) or value < 0:
        raise UnitError(f"time must be zero or positive, got {text!r}")
    return value


def parse_size(text: object) -> int:
    """Bytes from ``"64M"`` (nccl-tests: 64 x 2^20), ``"64MiB"``, ``"64MB"`` (64 x 10^6) or ``"4096"``.

    The value is exact (``"1.5KiB"`` is 1536, ``"1.024MB"`` 1024000) and must be a
    positive whole number of bytes.

    >>> parse_size("128M"), parse_size("128MB"), parse_size("1.5KiB")
    (134217728, 128000000, 1536)
    """
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a size")
    if isinstance(text, int):
        value = Fraction(text)
    else:
        match = _SIZE.match(str(text).strip())
        if not match or match.group(2) not in SIZE_UNITS:
            raise UnitError(f"{text!r} is not a size (write e.g. 64M or 64MiB (binary), 64MB (decimal) or 4096)")
        value = Fraction(match.group(1)) * SIZE_UNITS[match.group(2)]
    if value < 1 or value.denominator != 1:
        raise UnitError(f"size must be a positive whole number of bytes, got {text!r}")
    if value > MAX_SIZE:
        raise UnitError(f"{text!r} is too large (at most {MAX_SIZE} bytes)")
    return int(value)


def parse_size_range(text: str) -> tuple[int, int]:
    """``"1KiB:1GiB"`` -> (1024, 2**30); a single size gives (size, size)."""
    low, sep, high = str(text).partition(":")
    lo = parse_size(low)
    hi = parse_size(high) if sep else lo
    if hi < lo:
        raise UnitError(f"size range {text!r} ends below its start")
    return lo, hi


def _exact_decimal(value: Fraction) -> str | None:
    """``value`` written with at most three decimals and four digits (``1.5``, ``1000``, ``1.024``), or None."""
    thousandths = value * 1000
    if thousandths.denominator != 1:
        return None
    whole, frac = divmod(int(thousandths), 1000)
    text = str(whole) + (f".{frac:03d}".rstrip("0") if frac else "")
    return text if sum(c.isdigit() for c in text) <= 4 else None


def format_size(nbytes: float) -> str:
    """A byte count exactly, in the shortest form that :func:`parse_size` reads back to the same count.

    Binary (``64MiB``) or decimal (``64MB``), whichever is exact, the binary one on
    a tie; exact bytes (``67108865B``) when neither is.  Never a rounded
    conversion: ``64MB`` does not become ``61MiB``.  A fractional amount (bytes a
    link carries on average) is approximate: three significant digits, binary.

    >>> format_size(64 << 20), format_size(64 * 10**6), format_size(1536), format_size(67108865)
    ('64MiB', '64MB', '1.5KiB', '67108865B')
    """
    if nbytes != int(nbytes):
        for unit, scale in _SIZE_FORMS[:4]:
            if nbytes >= scale:
                return f"{_digits(nbytes / scale, 3)}{unit}"
        return f"{_digits(nbytes, 3)}B"
    count = int(nbytes)
    forms = [f"{text}{unit}" for unit, scale in _SIZE_FORMS
             if count >= scale and (text := _exact_decimal(Fraction(count, scale))) is not None]
    return min(forms, key=len) if forms else f"{count}B"


def _digits(value: float, significant: int = 4) -> str:
    """``value`` to ``significant`` digits, never in exponent notation: ``25.6``, ``12350``, ``0.0007``."""
    text = f"{value:.{significant}g}"
    if "e" in text:
        text = f"{float(text):f}".rstrip("0").rstrip(".")
    return text


def format_bandwidth(bytes_per_s: float) -> str:
    """``2.56e13`` -> ``"25.6 TB/s"``: decimal prefixes, four significant digits, the unit that keeps it below 1000.

    >>> format_bandwidth(25e9), format_bandwidth(2.56e13), format_bandwidth(1.25e5)
    ('25 GB/s', '25.6 TB/s', '125 KB/s')
    """
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{_digits(bytes_per_s / scale)} {unit}"
    return f"{_digits(bytes_per_s)} B/s"


def format_time(seconds: float) -> str:
    """``1.3e-6`` -> ``"1.3 us"``: four significant digits in s, ms, us or ns, never in exponent notation."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{_digits(seconds / scale)} {unit}"
    return f"{_digits(seconds * 1e9)} ns"
