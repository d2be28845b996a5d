"""Text tables and cells for people: what every plain-text view in topocc prints with."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RATIO", "format_table", "indent", "opt_cell", "percent"]


#: How a ratio of two times prints in tables.
RATIO = "{:.2f}"


def opt_cell(value: float | None, fmt: Callable[[float], str]) -> str:
    """A table cell for a value that may be missing: ``fmt(value)``, or ``n/a``."""
    return fmt(value) if value else "n/a"


def format_table(rows: Sequence[Sequence[Any]], header: Sequence[str], align: str = "") -> str:
    """A text table; ``align`` has one ``<`` (left, the default) or ``>`` (right) per column."""
    cells = [[str(h) for h in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    sides = align.ljust(len(header), "<")
    lines = ["  ".join(c.rjust(w) if side == ">" else c.ljust(w) for c, w, side in zip(row, widths, sides)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)



def indent(text: str, by: str = "  ") -> str:
    """``text`` with every line indented ``by``."""
    return "\n".join(by + line for line in text.splitlines())



def percent(value: float) -> str:
    """A share printed as ``97.3%``."""
    return f"{value:.1f}%"
