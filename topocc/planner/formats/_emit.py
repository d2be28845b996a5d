"""Write topology YAML in the explicit ``devices:``/``links:`` form, for the importers.

Every importer builds a :class:`TopologyText`; it keeps the notes (defaults used,
information the source lacked) so the CLI can print them, and writes them as
comments at the top of the YAML too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

__all__ = ["ImportedTopology", "TopologyText", "fmt_bandwidth", "fmt_time"]


def fmt_bandwidth(bytes_per_s: float) -> str:
    """``25e9`` -> ``"25 GB/s"`` (enough digits to read back the same value to 1e-9)."""
    return f"{bytes_per_s / 1e9:.10g} GB/s"


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:.10g} us"


def _q(text: str) -> str:
    """A YAML scalar that always reads back as this exact string (JSON strings are YAML)."""
    return json.dumps(text)


@dataclass(frozen=True, slots=True)
class ImportedTopology:
    """An imported topology: its YAML text and what the importer had to assume."""

    yaml: str
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _LinkText:
    """One ``links:`` entry as it will be written."""

    a: str
    b: str
    bandwidth: float  # bytes/s per lane
    latency: float  # seconds
    count: int
    kind: str
    direction: str


@dataclass
class TopologyText:
    """Devices and links accumulated in order, written as explicit-form topology YAML."""

    name: str
    description: str = ""
    devices: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)
    links: list[_LinkText] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)

    def device(self, name: str, kind: str, host: str | None = None, rack: str | None = None) -> str:
        """Declare a device once; returns its name."""
        if name not in self._names:
            self._names.add(name)
            self.devices.append((name, kind, host, rack))
        return name

    def has(self, name: str) -> bool:
        return name in self._names

    def link(self, a: str, b: str, bandwidth: float, latency: float, *, count: int = 1, kind: str = "",
             direction: str = "both") -> None:
        """A link; ``bandwidth`` is per lane (bytes/s), ``count`` the lanes."""
        self.links.append(_LinkText(a, b, bandwidth, latency, count, kind, direction))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def text(self) -> str:
        lines = [f"# {n}" for n in self.notes]
        lines.append(f"name: {_q(self.name)}")
        if self.description:
            lines.append(f"description: {_q(self.description)}")
        lines.append("devices:")
        for name, kind, host, rack in self.devices:
            extra = "".join(f", {k}: {_q(v)}" for k, v in (("host", host), ("rack", rack)) if v is not None)
            lines.append(f"  - {{name: {_q(name)}, type: {kind}{extra}}}")
        lines.append("links:")
        for ln in self.links:
            parts = [f"ends: [{_q(ln.a)}, {_q(ln.b)}]", f"bandwidth: {fmt_bandwidth(ln.bandwidth)}",
                     f"latency: {fmt_time(ln.latency)}"]
            if ln.count != 1:
                parts.append(f"count: {ln.count}")
            if ln.direction != "both":
                parts.append(f"direction: {ln.direction}")
            if ln.kind:
                parts.append(f"kind: {ln.kind}")
            lines.append("  - {" + ", ".join(parts) + "}")
        return "\n".join(lines) + "\n"

    def result(self) -> ImportedTopology:
        return ImportedTopology(self.text(), tuple(self.notes))
