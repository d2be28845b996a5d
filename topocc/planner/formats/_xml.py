"""Safe XML reading shared by the MSCCL and NCCL importers.

Both formats are plain element trees with no DTD.  A file that declares a
``DOCTYPE`` or an ``ENTITY`` is refused before parsing: the standard library's
parser would expand internal entities (the "billion laughs" attack), and no
legitimate MSCCL or NCCL file needs them.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from topocc.runtime.errors import TopoccError

__all__ = ["read_text", "read_xml"]

_DTD = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def read_text(path: str | Path, error: type[TopoccError], what: str) -> str:
    """The UTF-8 text of ``path``; failures become one-line ``error``s."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("no such file", where=str(path), fix=f"check the path of the {what}") from None
    except IsADirectoryError:
        raise error(f"is a directory, not a {what}", where=str(path)) from None
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 text (byte {exc.start})", where=str(path), fix=f"pass a {what}") from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", where=str(path)) from None


def read_xml(text: str, source: str, error: type[TopoccError], what: str) -> ET.Element:
    """Parse ``text`` as XML after refusing DTDs; a syntax error names its line and column."""
    match = _DTD.search(text)
    if match:
        line = text.count("\n", 0, match.start()) + 1
        raise error(
            f"the file declares a {match.group(1).upper()}, which a {what} never needs",
            where=f"{source}:{line}", fix="remove the DOCTYPE/ENTITY declarations (refused for safety)",
        )
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        line, column = exc.position
        reason = str(exc).split(":")[0]
        raise error(f"invalid XML: {reason}", where=f"{source}:{line}:{column}",
                    fix=f"the {what} is truncated or malformed") from None
