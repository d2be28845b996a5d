"""The job a ``topocc`` process group serves: its plan bundle, checked once at ``init_process_group``.

The world's group loads the bundle (from :class:`BackendOptions` or the
environment), refuses a bundle for another world size or topology, and checks
that every rank loaded the same one; the groups made later (``new_group``,
DeviceMesh, FSDP's hybrid sharding) serve the same job, which is why it is kept
per process (:meth:`Job.current`): torch builds those groups with no way to
pass it along.
"""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from topocc.runtime.bundle import Bundle, load_bundle
from topocc.runtime.distributed.topology_check import check_topology
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.feedback import FEEDBACK_ENV, FeedbackOptions, parse_feedback
from topocc.runtime.transports.store import StoreControl

__all__ = ["PLAN_ENV", "RECORD_ENV", "TIMEOUT_ENV", "TOPOLOGY_ENV", "BackendOptions", "Job"]

#: The bundle (a folder from ``topocc bundle``, or one plan or schedule file).
PLAN_ENV = "TOPOCC_PLAN"
#: The cluster this job runs on (the topology's name, fingerprint or file), checked against the bundle's.
TOPOLOGY_ENV = "TOPOCC_TOPOLOGY"
#: Where to record the calls the job makes (JSON lines, for ``topocc bundle --calls``).
RECORD_ENV = "TOPOCC_RECORD"
#: Seconds a planned call may wait for its peers (default: the process group's timeout).
TIMEOUT_ENV = "TOPOCC_TIMEOUT"

_COMPILE_HINT = "topocc bundle TOPOLOGY -o FOLDER"


def _env_timeout(rank: int) -> float | None:
    """``TOPOCC_TIMEOUT`` in seconds, or None where it is unset (then the process group's timeout holds)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise CommunicatorError(f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds", where=f"rank {rank}",
                                fix=f"set {TIMEOUT_ENV} to seconds, e.g. 60, or unset it")
    return seconds


@dataclass(frozen=True)
class BackendOptions:
    """What ``init_process_group("topocc", pg_options=BackendOptions(...))`` may set instead of the environment."""

    plan: str | Path | Bundle | None = None
    topology: str | None = None
    record: str | Path | None = None
    timeout: float | None = None
    #: Error feedback for encoded plans' all-reduces (``ef``, ``step-ahead``, ``error-avg:K``, ``threshold:N``,
    #: ``off``: :func:`~topocc.runtime.feedback.parse_feedback`); None: ``TOPOCC_ERROR_FEEDBACK``.
    error_feedback: str | None = None


@dataclass(frozen=True)
class Job:
    """The bundle every ``topocc`` group of this process replays, and how its calls are recorded and timed."""

    bundle: Bundle
    record: Path | None = None
    timeout_s: float | None = None
    feedback: FeedbackOptions | None = None

    _current: ClassVar[Job | None] = None

    @classmethod
    def current(cls) -> Job:
        """The job the world's group started (a subgroup serves the same one)."""
        if cls._current is None:
            raise CommunicatorError("a topocc subgroup was made before the world's group",
                                    fix='call torch.distributed.init_process_group("topocc") first')
        return cls._current

    @classmethod
    def start(cls, store: Any, rank: int, size: int, options: Any = None, wait_s: float = 300.0) -> Job:
        """Load and check the bundle for a world of ``size`` ranks (collective: every rank, through ``store``),
        waiting up to ``wait_s`` for every rank to arrive: the process group's own timeout, as gloo's and NCCL's
        rendezvous take (``TOPOCC_TIMEOUT`` bounds planned calls, and ranks' imports can end far apart)."""
        opts = options if isinstance(options, BackendOptions) else BackendOptions()
        source = opts.plan if opts.plan is not None else os.environ.get(PLAN_ENV)
        if not source:
            raise CommunicatorError(
                f"no plan bundle for the topocc process group (rank {rank})",
                fix=f"set {PLAN_ENV} to a folder compiled by `{_COMPILE_HINT}` "
                    "or pass pg_options=topocc.runtime.distributed.BackendOptions(plan=...)")
        bundle = source if isinstance(source, Bundle) else load_bundle(source)
        if bundle.world != size:
            raise CommunicatorError(
                f"the plan bundle is for {bundle.world} ranks but this job has {size}", where=bundle.source,
                fix=f"launch {bundle.world} ranks, or compile a bundle for a {size}-rank topology: {_COMPILE_HINT}")
        expected = opts.topology or os.environ.get(TOPOLOGY_ENV)
        if expected:
            check_topology(bundle, expected, TOPOLOGY_ENV, PLAN_ENV)
        timeout = opts.timeout if opts.timeout is not None else _env_timeout(rank)
        given = opts.error_feedback is not None
        feedback = parse_feedback(opts.error_feedback if given else os.environ.get(FEEDBACK_ENV),
                                  "error_feedback" if given else FEEDBACK_ENV)
        spec = zlib.crc32(feedback.spec.encode()) if feedback is not None else 0
        control = StoreControl(store, rank, size, prefix="topocc-job")
        rows = control.allgather_ints([bundle.digest, spec], wait_s)
        if rows is None:
            raise CommunicatorError(f"not every rank came to init_process_group within {wait_s:g} s",
                                    where=f"rank {rank}", fix="start every rank of the job")
        for r, (digest, theirs) in enumerate(rows):
            if digest != bundle.digest:
                raise CommunicatorError(f"rank {r} loaded a different plan bundle than rank {rank}",
                                        where=bundle.source, fix=f"give every rank the same {PLAN_ENV}")
            if theirs != spec:  # error averaging is collective: every rank must run the same options
                raise CommunicatorError(f"rank {r} runs other error-feedback options than rank {rank} "
                                        f"({feedback.spec if feedback else 'off'})", where=f"rank {rank}",
                                        fix=f"give every rank the same {FEEDBACK_ENV}")
        log = logging.getLogger("topocc.distributed")
        if log.isEnabledFor(logging.DEBUG):  # describing reads every plan, which a job otherwise reads on first use
            log.debug("rank %d loaded %s:\n%s", rank, bundle.source, bundle.describe())
        record = opts.record if opts.record is not None else os.environ.get(RECORD_ENV)
        job = cls(bundle, Path(record) if record else None, timeout, feedback)
        cls._current = job
        return job
