"""The measured choice: a planned call runs the plan only where it was measured faster than the native backend's.

The bundle's native threshold is the model's prediction; a host-driven replay can
miss it where the model leaves out what the replay spends per message (Python
per message, ranks sharing cores), so a plan predicted 2x ahead can measure 3x
behind.  A planned call must never cost more than the native call it replaces,
so the first calls of each *call class* (collective, root, device type and the
size's power of two) are trials: they alternate between the plan and the native backend
(:data:`TRIALS` each), each run alone (the group's earlier calls drained first)
and timed on every rank.  Then the ranks agree, with one small native
all-reduce (MIN), on each arm's time: a rank's best trial, and the fastest
rank's of those, because a rank that arrived last waited least for its peers,
so its time is the collective's own and not the others' lateness.  The class
runs the plan from then on only if its time is below the native one by
:data:`MARGIN`; every rank takes the same decision from the same agreed figures.

The native backend is gloo for CPU tensors and NCCL for CUDA tensors.  A CUDA
call returns with its work queued on the device, so a CUDA trial is timed from
a synchronised device to a synchronised device (the process group's
``_settle``): the time the call's work took, on NCCL's stream or the plan's.

``TOPOCC_TUNE=off`` trusts the model alone (no trials).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from topocc.runtime.errors import CommunicatorError

__all__ = ["MARGIN", "TRIALS", "TUNE_ENV", "Arm", "CallClass", "Choice", "NativeCalls", "Tuner", "call_class",
           "tuning_enabled"]

TUNE_ENV = "TOPOCC_TUNE"
#: Timed calls per arm before a class is decided.
TRIALS = 2
#: The plan must measure this much faster than the native backend (a fraction of its time) to be kept:
#: a tie goes native, and run-to-run noise on a shared host is of this order.
MARGIN = 0.05

#: What names a call class: collective, root (None if unrooted), device type (``cpu``, ``cuda``: each its own
#: native backend), and the size's bit length (powers of two).
CallClass = tuple[str, int | None, str, int]


def tuning_enabled() -> bool:
    """Whether ``TOPOCC_TUNE`` leaves the trials on (the default); ``off``/``0``/``false`` turns them off."""
    text = os.environ.get(TUNE_ENV, "on").strip().lower()
    if text in ("", "on", "1", "true", "yes"):
        return True
    if text in ("off", "0", "false", "no"):
        return False
    raise CommunicatorError(f"{TUNE_ENV}={text!r} is neither on nor off", where=TUNE_ENV,
                            fix=f"set {TUNE_ENV}=on (time plans against the native backend) or off (trust the model)")


class Arm(Enum):
    """What a call of a class does now."""

    PLAN = "plan"
    NATIVE = "native"
    TRY_PLAN = "try plan"
    TRY_NATIVE = "try native"


@dataclass(frozen=True, slots=True)
class Choice:
    """A decided class: the agreed times of the plan and the native backend (seconds) and what runs."""

    plan_s: float
    native_s: float

    @property
    def planned(self) -> bool:
        return self.plan_s < (1.0 - MARGIN) * self.native_s

    def why(self, native: str) -> str:
        """Why the class goes native (for the counters; the INFO line gives the times), ``native`` its name."""
        return f"measured no faster than {native} (TOPOCC_DEBUG=INFO prints both times)"


@dataclass(slots=True)
class _Trials:
    plan: list[float] = field(default_factory=list)
    native: list[float] = field(default_factory=list)


def call_class(collective: str, root: int | None, device: str, nbytes: int) -> CallClass:
    return (collective, root, device, nbytes.bit_length())


class Tuner:
    """The trials and decisions of one process group's call classes (caller thread only)."""

    def __init__(self, trials: int = TRIALS) -> None:
        self._trials_per_arm = trials
        self._trials: dict[CallClass, _Trials] = {}
        self.choices: dict[CallClass, Choice] = {}

    def arm(self, cls: CallClass) -> Arm:
        """What the next call of ``cls`` does: a trial, alternating native first, until the class is decided.

        Native first: a class's first call then costs what gloo's does, and the plan's communicator (its
        handshake with the peers) is made at the class's second call, not in the job's set-up."""
        choice = self.choices.get(cls)
        if choice is not None:
            return Arm.PLAN if choice.planned else Arm.NATIVE
        trials = self._trials.setdefault(cls, _Trials())
        return Arm.TRY_NATIVE if len(trials.native) <= len(trials.plan) else Arm.TRY_PLAN

    def record(self, cls: CallClass, arm: Arm, seconds: float,
               agree: Callable[[list[float]], list[float]]) -> Choice | None:
        """Note a trial's time on this rank; after the class's last trial, agree and return its choice.

        ``agree`` is a collective of the group: given this rank's ``[plan_s, native_s]`` it returns the MIN over
        the group's ranks; every rank calls it at the same call (its class's last trial), as collectives must.
        """
        trials = self._trials[cls]
        (trials.plan if arm is Arm.TRY_PLAN else trials.native).append(seconds)
        if min(len(trials.plan), len(trials.native)) < self._trials_per_arm:
            return None
        plan_s, native_s = agree([min(trials.plan), min(trials.native)])
        choice = self.choices[cls] = Choice(plan_s, native_s)
        del self._trials[cls]
        return choice


class NativeCalls:
    """The native backend as the process group calls it: each call's result goes to ``on_work`` (a method of
    the group) with the time the call was made, so the group can time a native trial.

    ``on_work`` is held weakly: the group holds this wrapper, and a cycle through it would leave the group, and
    its gloo threads, to the garbage collector, which may run it only as the interpreter finalizes.
    """

    def __init__(self, backend: Any, on_work: Callable[[Any, float], None]) -> None:
        self.backend = backend
        self._on_work = weakref.WeakMethod(on_work)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.backend, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = method(*args, **kwargs)
            on_work = self._on_work()
            if on_work is not None:
                on_work(result, start)
            return result

        return call
