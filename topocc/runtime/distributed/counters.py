"""What a ``topocc`` process group did with its calls: per collective, how many ran a plan and how many went native,
and of the planned calls whose plan names wire encodings, how many ran encoded and how many exact (and why).

``print(topocc.runtime.distributed.counters())`` after training shows whether the
plans carried the job's collectives, and why the rest did not (the first reason
seen per collective).  Torch-free, so a report can read it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TRIALS_ONLY", "Counters", "Tally"]

#: What the table says of native calls that were all trials (their class not decided yet: no reason is kept).
TRIALS_ONLY = "trials against the plan (not decided yet)"


@dataclass
class Tally:
    """One collective's calls and bytes, planned and delegated, and the first reason a call was delegated."""

    planned: int = 0
    planned_bytes: int = 0
    delegated: int = 0
    delegated_bytes: int = 0
    why: str = ""
    encoded: int = 0
    exact: int = 0
    why_exact: str = ""


@dataclass
class Counters:
    """Per-collective tallies of one process group (global ranks ``group``)."""

    group: tuple[int, ...]
    by_collective: dict[str, Tally] = field(default_factory=dict)

    def count(self, collective: str, nbytes: int, why: str | None, provisional: bool = False) -> None:
        """Count one call: planned when ``why`` is None, else delegated for that reason (not kept as the reason
        when ``provisional``: a trial's, which the measured choice then replaces)."""
        tally = self.by_collective.setdefault(collective, Tally())
        if why is None:
            tally.planned += 1
            tally.planned_bytes += nbytes
        else:
            tally.delegated += 1
            tally.delegated_bytes += nbytes
            if not provisional:
                tally.why = tally.why or why

    def encoding(self, collective: str, why_exact: str | None) -> None:
        """Count a planned call whose plan names encodings: run encoded when ``why_exact`` is None, else exact for
        that reason (a dtype, op or transport the encodings cannot carry)."""
        tally = self.by_collective.setdefault(collective, Tally())
        if why_exact is None:
            tally.encoded += 1
        else:
            tally.exact += 1
            tally.why_exact = tally.why_exact or why_exact

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
        rows: list[tuple[str, ...]] = [("collective", "planned", "MiB", "native", "MiB", "why native")]
        encodings = any(t.encoded or t.exact for t in self.by_collective.values())
        if encodings:  # only where some plan names encodings: an exact bundle's table stays as it was
            rows[0] += ("encoded", "exact", "why exact")
        for name, t in sorted(self.by_collective.items()):
            rows.append((name, str(t.planned), f"{t.planned_bytes / 2**20:.1f}", str(t.delegated),
                         f"{t.delegated_bytes / 2**20:.1f}", t.why or (TRIALS_ONLY if t.delegated else "-")))
            if encodings:
                rows[-1] += (str(t.encoded), str(t.exact), t.why_exact or "-")
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return head + "\n" + "\n".join(lines)
