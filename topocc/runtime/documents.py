"""Reading topocc's JSON documents (schedules, plans, bundle manifests, bucket plans) from files.

One reader for every kind, so each failure (an unreadable file, corrupt gzip data, text that is not UTF-8 or
not JSON, a non-finite number) is the same one-line error naming the file, the place and the fix.  It knows
no document's fields, so a process that only reads a bundle's manifest does not load the schedule format.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

from topocc.runtime.errors import ScheduleFormatError

__all__ = ["read_json_document"]


def read_json_document(path: str | Path, kind: str) -> Any:
    """Parse a (possibly gzip-compressed) JSON file, turning every failure into one error line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScheduleFormatError(f"cannot read {kind}: {exc.strerror}", where=str(path)) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ScheduleFormatError(
                f"corrupt gzip data ({exc})", where=str(path), fix="recompile or re-download the file"
            ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScheduleFormatError(
            f"not UTF-8 text at byte {exc.start}", where=str(path), fix=f"pass a topocc {kind} JSON file"
        ) from None
    if not text.strip():
        raise ScheduleFormatError("empty file", where=str(path), fix=f"pass a topocc {kind} JSON file")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ScheduleFormatError(
            f"invalid JSON: {exc.msg.removesuffix(' at')} at line {exc.lineno} column {exc.colno}",
            where=str(path),
            fix="the file is truncated or was edited by hand; recompile it",
        ) from None
    except ValueError as exc:
        raise ScheduleFormatError(str(exc), where=str(path)) from None
    except RecursionError:
        raise ScheduleFormatError("JSON nested too deeply", where=str(path)) from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON: {name} is not a number in a schedule")
