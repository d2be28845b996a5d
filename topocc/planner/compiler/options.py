"""What a caller may ask of an algorithm: typed options, one dataclass per algorithm that has its own.

:class:`Options` is what every algorithm receives; the fields an algorithm does not understand it ignores.
``auto`` sets only the common fields (and the evaluator); the per-algorithm overrides are for experiments
and tests that pin one of an algorithm's own choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the evaluator's module imports the simulator; an algorithm that times receives one
    from topocc.planner.compiler.evaluate import Evaluator

__all__ = ["HierarchicalOptions", "McfOptions", "Options"]


@dataclass(frozen=True, slots=True)
class HierarchicalOptions:
    """Pins one of hierarchical's own choices (None or the default: it decides).

    ``layout``: a reduce-scatter's or all-reduce's buffer order, ``virtual`` or ``blocks``; ``waves``:
    whether a reduce-scatter of whole blocks may reduce its lower levels in waves; ``window``: the flow
    control's window (0: none); ``stage_method``: ``ring``, ``halving-doubling`` or ``direct`` for every
    level whose size allows it; ``direct_uncapped``: on a small collective on a fabric built by class, a
    direct level free of the caps on its messages (hierarchical also tries that by itself there).
    """

    layout: str | None = None
    waves: bool = True
    window: int | None = None
    stage_method: str | None = None
    direct_uncapped: bool = False


@dataclass(frozen=True, slots=True)
class McfOptions:
    """The flow model's solver and size (None: its defaults).

    ``solver``: a :data:`topocc.planner.solvers.BACKENDS` name; ``time_limit_s``: per solve; ``exact``: True
    solves the MILP, False the LP and rounds, None the MILP only for tiny models; ``pieces``: per source;
    ``max_variables``: the model's cap.
    """

    solver: str | None = None
    time_limit_s: float | None = None
    exact: bool | None = None
    pieces: int | None = None
    max_variables: int | None = None


@dataclass(frozen=True, slots=True)
class Options:
    """What a caller may ask of an algorithm; each algorithm reads the fields it understands.

    ``size_bytes`` is the buffer size the schedule is tuned for (nccl-tests
    convention: the larger of input and output); ``channels`` the number of
    parallel rings/trees (None: the algorithm decides from the fabric);
    ``pipeline`` the number of pieces each chunk is split into for pipelining
    (None: decided from the size); ``root`` the root of broadcast and reduce.
    ``evaluator`` times candidate schedules for an algorithm that chooses
    between its own by simulation (the compiler passes the one it times the
    result with, so that the choice is not simulated twice).
    """

    size_bytes: int = 64 << 20
    channels: int | None = None
    pipeline: int | None = None
    root: int = 0
    hierarchical: HierarchicalOptions = HierarchicalOptions()
    mcf: McfOptions = McfOptions()
    evaluator: Evaluator | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The options a schedule's metadata records: the common ones, then every per-algorithm field set."""
        out: dict[str, Any] = {"size_bytes": self.size_bytes, "root": self.root}
        if self.channels is not None:
            out["channels"] = self.channels
        if self.pipeline is not None:
            out["pipeline"] = self.pipeline
        for pinned in (self.hierarchical, self.mcf):
            default = type(pinned)()
            out.update({f.name: getattr(pinned, f.name) for f in fields(pinned)
                        if getattr(pinned, f.name) != getattr(default, f.name)})
        return out
