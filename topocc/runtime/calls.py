"""The collective calls a job made, as the ``topocc`` process group records them (JSON lines).

``TOPOCC_RECORD=calls.jsonl torchrun ... train.py`` makes every process group's
rank 0 append one line per distinct call it sees::

    {"collective": "reducescatter", "group": [0, 1, 2, 3], "size_bytes": 4194304, "dtype": "float32",
     "op": "sum", "root": null, "device": "cpu"}

and ``topocc bundle TOPOLOGY --calls calls.jsonl`` compiles a plan for each
(collective, group, root) over the sizes it saw.  Torch-free, so the planner
reads what the runtime writes.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeGuard

from topocc.runtime.collective import NAMES
from topocc.runtime.errors import ScheduleFormatError

__all__ = ["COLLECTIVES", "Call", "CallLog", "read_calls"]

#: The collectives a call names, as schedules name them.
COLLECTIVES = NAMES


@dataclass(frozen=True, slots=True)
class Call:
    """One collective call: what, on which group (global ranks), how many bytes (the larger buffer), how."""

    collective: str
    group: tuple[int, ...]
    size_bytes: int
    dtype: str
    op: str | None = None
    root: int | None = None
    device: str = "cpu"


class CallLog:
    """Appends each distinct :class:`Call` once to a JSON-lines file (several processes may share it)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: set[Call] = set()
        self._lock = threading.Lock()

    def add(self, call: Call) -> None:
        with self._lock:
            if call in self._seen:
                return
            self._seen.add(call)
            row = {**asdict(call), "group": list(call.group)}
            # one write per line on an O_APPEND descriptor: lines from several processes never interleave
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(row) + "\n").encode())
            finally:
                os.close(fd)


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def read_calls(path: str | Path) -> list[Call]:
    """The calls recorded in ``path``, each line checked (a bad line is named by its number)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ScheduleFormatError(f"cannot read the call record: {exc.strerror}", where=str(path)) from None
    calls: list[Call] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScheduleFormatError(f"invalid JSON ({exc.msg})", where=where,
                                      fix="record again with TOPOCC_RECORD, or delete the line") from None
        if not isinstance(row, dict) or row.get("collective") not in COLLECTIVES:
            raise ScheduleFormatError(f"collective must be one of {', '.join(COLLECTIVES)}", where=where)
        group, size = row.get("group"), row.get("size_bytes")
        if not isinstance(group, list) or not group or not all(_int(r) and r >= 0 for r in group):
            raise ScheduleFormatError("group must be a non-empty array of global ranks", where=where)
        if not _int(size) or size < 0:
            raise ScheduleFormatError("size_bytes must be a non-negative integer", where=where)
        root = row.get("root")
        if root is not None and not (_int(root) and 0 <= root < len(group)):
            raise ScheduleFormatError("root must be null or a rank of the group", where=where)
        calls.append(Call(row["collective"], tuple(group), size, str(row.get("dtype", "")), row.get("op"), root,
                          str(row.get("device", "cpu"))))
    return calls
