"""What ``topocc torchbench`` measures: nccl-tests' sweep (``-b``, ``-e``, ``-f``, ``-n``, ``-w``, ``-d``, ``-o``,
``-r``) of one collective, the backends that run it, and the ranks.

A :class:`Sweep` is checked when it is made (every refusal one line, before anything starts) and travels to
the ranks as one JSON argument.  Sizes are nccl-tests' ``size``: bytes of the larger buffer, rounded down to
whole elements per rank where the collective splits the buffer (all-gather, reduce-scatter, all-to-all);
``count`` is nccl-tests' too, the elements per rank of the split buffer, else of the whole one.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from topocc.runtime.collective import NAMES, closest_collective
from topocc.runtime.collective import collective as describe
from topocc.runtime.errors import ScheduleFormatError, UsageError

__all__ = ["BACKENDS", "DATATYPES", "OPS", "Datatype", "Sweep", "make_sweep", "parse_backends", "parse_collective",
           "parse_datatype", "sweep_sizes"]

#: The backends a sweep may time: topocc's, and the two it stands beside.
BACKENDS = ("topocc", "gloo", "nccl")
#: Reductions (nccl-tests' ``-o``) every backend has.
OPS = ("sum", "prod", "max", "min")


@dataclass(frozen=True, slots=True)
class Datatype:
    """An element type: torch's name for it, nccl-tests' (what the table shows) and its bytes."""

    torch: str
    nccl: str
    itemsize: int


_TYPES = (Datatype("float32", "float", 4), Datatype("float16", "half", 2), Datatype("bfloat16", "bfloat16", 2),
          Datatype("float64", "double", 8), Datatype("int8", "int8", 1), Datatype("uint8", "uint8", 1),
          Datatype("int32", "int32", 4), Datatype("int64", "int64", 8))
#: ``-d``'s names: nccl-tests' (``float``, ``half``, ``double``, ...) and torch's (``float32``, ``float16``, ...).
DATATYPES: dict[str, Datatype] = {name: t for t in _TYPES for name in (t.nccl, t.torch)}


def _near(word: str, names: Sequence[str]) -> str:
    near = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def parse_datatype(text: str) -> Datatype:
    """``-d``'s datatype; another name is refused with the nearest one."""
    found = DATATYPES.get(text.strip().lower())
    if found is None:
        raise UsageError(f"-d/--datatype {text!r} is not a datatype{_near(text.strip().lower(), list(DATATYPES))}",
                         fix=f"pass one of {', '.join(DATATYPES)}")
    return found


def parse_collective(text: str) -> str:
    """The stored name of ``text`` in any common spelling (``all_reduce``, ``all-gather``, ``ReduceScatter``)."""
    try:
        return describe(text).name
    except ScheduleFormatError:
        near = closest_collective(text)
        raise UsageError(f"-c/--collective {text!r} is not a collective" + (f" (did you mean {near}?)" if near else ""),
                         fix=f"pass one of {', '.join(NAMES)} (torch's spellings, all_gather ..., too)") from None


def parse_backends(text: str) -> tuple[str, ...]:
    """``--backend``'s comma-separated list, in order, each once; an unknown name is refused with the nearest."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    if not names:
        raise UsageError("--backend names no backend", fix=f"pass some of {', '.join(BACKENDS)}, e.g. topocc,gloo")
    for name in names:
        if name not in BACKENDS:
            raise UsageError(f"--backend {name!r} is not a backend{_near(name, BACKENDS)}",
                             fix=f"pass some of {', '.join(BACKENDS)}, comma-separated")
    return names


def sweep_sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """nccl-tests' sizes: ``minbytes``, times ``factor`` while at most ``maxbytes`` (which ends it only if hit)."""
    if minbytes < 1:
        raise UsageError(f"-b/--minbytes {minbytes} is not a size", fix="pass a size of at least 1 byte, e.g. -b 1K")
    if minbytes > maxbytes:
        raise UsageError(f"-b/--minbytes {minbytes} is larger than -e/--maxbytes {maxbytes}",
                         fix=f"pass -b at most -e, e.g. -b {maxbytes} -e {minbytes}")
    if factor < 2:
        raise UsageError(f"-f/--stepfactor {factor} does not grow the size", fix="pass -f 2 or more")
    sizes = [minbytes]
    while sizes[-1] * factor <= maxbytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def _count(name: str, ranks: int, size: int, itemsize: int) -> int:
    """nccl-tests' count for ``size`` bytes: elements per rank of a split buffer, else of the whole one."""
    elements = size // itemsize
    return elements // ranks if describe(name).split else elements


def _size(name: str, ranks: int, count: int, itemsize: int) -> int:
    """nccl-tests' size for ``count``: bytes of the larger buffer."""
    return count * (ranks if describe(name).split else 1) * itemsize


@dataclass(frozen=True, slots=True)
class Sweep:
    """One collective over ``sizes`` (bytes) with ``counts`` (elements), on ``ranks`` ranks, for each of
    ``backends``: ``warmup`` untimed calls, ``iters`` timed ones, then one checked call per size and backend.
    ``device`` holds the tensors of topocc and gloo (NCCL's are always on the GPU); ``timeout_s`` is how long a
    rank waits for its peers."""

    collective: str
    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    dtype: str
    op: str
    root: int
    iters: int
    warmup: int
    ranks: int
    backends: tuple[str, ...]
    device: str = "cpu"
    timeout_s: float = 300.0

    @property
    def datatype(self) -> Datatype:
        return DATATYPES[self.dtype]

    @property
    def redop(self) -> str:
        """nccl-tests' redop column: the reduction, or ``none`` for a collective that does not reduce."""
        return self.op if describe(self.collective).reduces else "none"

    @property
    def shown_root(self) -> int:
        """nccl-tests' root column: the root of a broadcast or reduce, else -1."""
        return self.root if describe(self.collective).rooted else -1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Sweep:
        fields = dict(doc)
        for name in ("sizes", "counts", "backends"):
            fields[name] = tuple(fields[name])
        return cls(**fields)


def make_sweep(collective: str, minbytes: int, maxbytes: int, factor: int, *, ranks: int, datatype: str = "float",
               op: str = "sum", root: int = 0, iters: int = 20, warmup: int = 5, backends: str = "topocc,gloo",
               device: str = "cpu", timeout_s: float = 300.0) -> Sweep:
    """The checked sweep of nccl-tests' options; each refusal is a :class:`~topocc.runtime.errors.UsageError`.

    >>> make_sweep("all_gather", 1024, 4096, 4, ranks=2).sizes
    (1024, 4096)
    """
    name = parse_collective(collective)
    kind = parse_datatype(datatype)
    if ranks < 2:
        raise UsageError(f"--ranks {ranks}: a collective on one rank moves no data", fix="pass --ranks 2 or more")
    if op not in OPS:
        raise UsageError(f"-o/--op {op!r} is not a reduction{_near(op, OPS)}", fix=f"pass one of {', '.join(OPS)}")
    if describe(name).rooted and not 0 <= root < ranks:
        raise UsageError(f"-r/--root {root} is not one of the {ranks} ranks", fix=f"pass a root from 0 to {ranks - 1}")
    if iters < 1 or warmup < 0:
        raise UsageError(f"-n/--iters {iters}, -w/--warmup_iters {warmup}: at least one timed call is needed",
                         fix="pass -n 1 or more and -w 0 or more")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r} is not a device", fix="pass cpu or cuda")
    counts = [_count(name, ranks, s, kind.itemsize) for s in sweep_sizes(minbytes, maxbytes, factor)]
    if counts[0] < 1:
        least = _size(name, ranks, 1, kind.itemsize)
        raise UsageError(f"-b/--minbytes {minbytes} holds no {kind.nccl} element"
                         + (f" for each of {ranks} ranks" if describe(name).split else ""),
                         fix=f"pass -b {least} or more")
    return Sweep(name, tuple(_size(name, ranks, c, kind.itemsize) for c in counts), tuple(counts), kind.torch, op,
                 root, iters, warmup, ranks, parse_backends(backends), device, timeout_s)
