"""What a ``topocc`` process group did with its calls: per collective, how many ran a plan and how many went native.

``print(topocc.runtime.distributed.counters())`` after training shows whether the
plans carried the job's collectives, and why the rest did not (the first reason
seen per collective).  Torch-free, so a report can read it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Counters", "Tally"]


@dataclass
class Tally:
    """One collective's calls and bytes, planned and delegated, and the first reason a call was delegated."""

    planned: int = 0
    planned_bytes: int = 0
    delegated: int = 0
    delegated_bytes: int = 0
    why: str = ""


@dataclass
class Counters:
    """Per-collective tallies of one process group (global ranks ``group``)."""

    group: tuple[int, ...]
    by_collective: dict[str, Tally] = field(default_factory=dict)

    def count(self, collective: str, nbytes: int, why: str | None) -> None:
        """Count one call: planned when ``why`` is None, else delegated for that reason."""
        tally = self.by_collective.setdefault(collective, Tally())
        if why is None:
            tally.planned += 1
            tally.planned_bytes += nbytes
        else:
            tally.delegated += 1
            tally.delegated_bytes += nbytes
            tally.why = tally.why or why

    def planned(self, collective: str) -> int:
        tally = self.by_collective.get(collective)
        return tally.planned if tally else 0

    def delegated(self, collective: str) -> int:
        tally = self.by_collective.get(collective)
        return tally.delegated if tally else 0

    def as_dict(self) -> dict[str, dict[str, int | str]]:
        return {name: vars(t).copy() for name, t in sorted(self.by_collective.items())}

    def __str__(self) -> str:
        head = f"topocc process group of {len(self.group)} rank(s)"
        if not self.by_collective:
            return head + ": no collective calls yet"
        rows = [("collective", "planned", "MiB", "native", "MiB", "why native")]
        for name, t in sorted(self.by_collective.items()):
            rows.append((name, str(t.planned), f"{t.planned_bytes / 2**20:.1f}", str(t.delegated),
                         f"{t.delegated_bytes / 2**20:.1f}", t.why or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return head + "\n" + "\n".join(lines)
