"""The checks every topology section shares: keys, quantities with units, names, choices, one link entry.

Each raises the :class:`~topocc.planner._yaml.Source`'s error, which names the file, the line and the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from topocc.planner._yaml import Source, YDict, YList
from topocc.planner.topology.model import Link
from topocc.planner.topology.plausible import gpu_fabric, warn_implausible
from topocc.planner.units import UnitError, parse_bandwidth, parse_time

__all__ = ["LinkDefaults", "check_figures", "check_keys", "choice", "close_match", "name_string", "parse_link",
           "positive_int", "quantity"]


def check_keys(src: Source, obj: Any, what: str, allowed: Iterable[str], required: Iterable[str] = ()) -> YDict:
    """``obj`` must be a mapping with only ``allowed`` keys and all ``required`` ones."""
    if not isinstance(obj, dict):
        raise src.error(obj, None, f"{what} must be a mapping, got {_kind(obj)}")
    allowed = tuple(allowed)
    for key in obj:
        if key not in allowed:
            hint = close_match(str(key), allowed)
            raise src.error(
                obj, key, f"unknown key {key!r} in {what}",
                fix=f"did you mean {hint!r}?" if hint else f"allowed keys: {', '.join(allowed)}",
            )
    for key in required:
        if key not in obj:
            raise src.error(obj, None, f"{what} lacks the required key {key!r}")
    return obj  # type: ignore[return-value]  # a mapping of loaded YAML is a YDict


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The one of ``choices`` nearest ``word``, if any is near: what a "did you mean" hint offers."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _kind(value: Any) -> str:
    return {dict: "a mapping", YDict: "a mapping", list: "a list", YList: "a list", str: "a string",
            type(None): "nothing"}.get(type(value), type(value).__name__)


def quantity(src: Source, obj: Any, key: str, parse: Any, default: Any = None) -> float:
    """Parse ``obj[key]`` with a unit parser, reporting the line on failure."""
    if key not in obj or obj[key] is None:
        if default is None:
            example = "0.7 us" if parse is parse_time else "25 GB/s" if parse is parse_bandwidth else "..."
            raise src.error(obj, None, f"missing {key}", fix=f"add '{key}: {example}'")
        return default
    try:
        return parse(obj[key])
    except UnitError as exc:
        raise src.error(obj, key, f"{src.path(obj, key)}: {exc}", fix=exc.fix) from None


def positive_int(src: Source, obj: Any, key: str, default: int | None = None, minimum: int = 1) -> int:
    value = obj.get(key, default) if isinstance(obj, dict) else default
    if value is None:
        raise src.error(obj, None, f"missing {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise src.error(obj, key, f"{key} must be a whole number >= {minimum}, got {value!r}")
    return value


def name_string(src: Source, obj: Any, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value).strip() == "":
        raise src.error(obj, key, f"{key} must be a non-empty name, got {value!r}")
    return str(value)


@dataclass(frozen=True, slots=True)
class LinkDefaults:
    """Values a link takes when it does not say (``defaults:`` at the top of a file; ``place``: that mapping,
    for messages about a value taken from it)."""

    latency: float = 0.0
    bandwidth: float | None = None
    place: Any = field(default=None, compare=False)


def check_figures(src: Source, obj: Any, defaults: LinkDefaults, bandwidth: float | None, latency: float,
                  fabric: bool, keys: tuple[str, str] = ("bandwidth", "latency")) -> None:
    """Warn of a bandwidth or latency implausible for its link (:mod:`~topocc.planner.topology.plausible`),
    at the place it was written: ``obj`` under ``keys``, else the defaults it was taken from."""
    for key, value in zip(keys, (bandwidth, latency)):
        base = key.rpartition("_")[2]  # attach_latency falls back on defaults' latency
        if value is None:
            continue
        if isinstance(obj, dict) and key in obj:
            warn_implausible(src, obj, key, value, fabric=fabric)
        elif isinstance(defaults.place, dict) and base in defaults.place and value == getattr(defaults, base):
            warn_implausible(src, defaults.place, base, value, fabric=fabric)


LINK_KEYS = ("ends", "bandwidth", "latency", "count", "direction", "kind", "dim")


def parse_link(src: Source, item: Any, defaults: LinkDefaults,
               types: Mapping[str, str] | None = None) -> tuple[list[Link], str, str]:
    """One ``links:`` entry -> its directed links (two for full duplex) and its two ends (``types``: the
    devices' types by name, to tell a GPU fabric link without a ``kind``)."""
    check_keys(src, item, "a link", LINK_KEYS, ("ends",))
    ends = item["ends"]
    if not isinstance(ends, list) or len(ends) != 2 or not all(isinstance(e, (str, int)) for e in ends):
        raise src.error(item, "ends", "ends must be a list of two device names, e.g. [gpu0, gpu1]")
    a, b = str(ends[0]), str(ends[1])
    if a == b:
        raise src.error(item, "ends", f"self-loop: link from {a} to itself", fix="a link joins two different devices")
    count = positive_int(src, item, "count", 1)
    per_lane = quantity(src, item, "bandwidth", parse_bandwidth, defaults.bandwidth)
    latency = quantity(src, item, "latency", parse_time, defaults.latency)
    kind = str(item.get("kind", ""))
    direction = item.get("direction", "both")
    if direction not in ("both", "forward"):
        raise src.error(item, "direction", f"direction must be 'both' or 'forward', got {direction!r}")
    dim = positive_int(src, item, "dim", minimum=0) if "dim" in item else None
    check_figures(src, item, defaults, per_lane, latency, gpu_fabric(kind, ((types or {}).get(e) for e in (a, b))))
    links = [Link(a, b, per_lane * count, latency, count, kind, dim)]
    if direction == "both":
        links.append(Link(b, a, per_lane * count, latency, count, kind, dim, ascending=False))
    return links, a, b


def choice(src: Source, obj: dict[Any, Any], key: str, choices: tuple[str, ...], default: str | None,
           what: str) -> str:
    """``obj[key]`` must be one of ``choices``; a near miss is suggested."""
    if key not in obj:
        if default is None:
            raise src.error(obj, None, f"missing {key}", fix=f"use one of {', '.join(choices)}")
        return default
    value = obj[key]
    if value not in choices:
        hint = close_match(str(value), choices)
        raise src.error(obj, key, f"unknown {what} {value!r}",
                        fix=f"did you mean {hint!r}?" if hint else f"use one of {', '.join(choices)}")
    return str(value)
