"""topocc as a ``torch.distributed`` backend: ``init_process_group("topocc")`` runs the compiled plans.

Installing topocc registers the backend (CPU and CUDA) at ``import torch``, through torch's
backend autoloading (:mod:`topocc._autoload`); importing this package registers it too::

    dist.init_process_group("topocc")  # TOPOCC_PLAN=bundle-folder, under torchrun or mpiexec
    ...
    print(topocc.runtime.distributed.counters())  # planned and native calls per collective

Plans come from a bundle (``topocc bundle TOPOLOGY -o FOLDER``) named by
``TOPOCC_PLAN`` or by ``pg_options=BackendOptions(plan=...)``; ``TOPOCC_RECORD``
records the calls a job makes, ``TOPOCC_DEBUG=INFO`` prints what ran each distinct
call (:mod:`~topocc.runtime.distributed.debug`), ``TOPOCC_LOG=debug`` logs every
call that went to the native backend and why.  With a bundle compiled ``--compress``,
``TOPOCC_ERROR_FEEDBACK=ef`` (or ``step-ahead``, ``error-avg:K``, ``threshold:N``) keeps the gradient
buckets' error feedback (:mod:`~topocc.runtime.distributed.residuals`); step ahead also needs
:func:`step_ahead` with the optimizer.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch.distributed as dist

from topocc.runtime.distributed.counters import Counters, Tally
from topocc.runtime.distributed.debug import debug_level, install_excepthook
from topocc.runtime.distributed.job import BackendOptions, Job
from topocc.runtime.distributed.process_group import TopoccProcessGroup
from topocc.runtime.distributed.residuals import step_ahead_over
from topocc.runtime.distributed.restarts import attempt_store
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.training.bucket_feedback import StepAhead

__all__ = ["BACKEND", "BackendOptions", "Counters", "Tally", "TopoccProcessGroup", "counters", "create_backend",
           "register", "step_ahead"]

#: The name ``init_process_group`` takes.
BACKEND = "topocc"
#: ``TOPOCC_LOG=debug`` prints the ``topocc.distributed`` logger's lines (each delegated call) on stderr.
LOG_ENV = "TOPOCC_LOG"


def create_backend(options: Any, backend_options: Any) -> TopoccProcessGroup:
    """torch's extended backend constructor: the world's group starts the job, later groups share it.

    Also the point where a job is known to use topocc: ``TOPOCC_DEBUG`` is checked, and an uncaught topocc
    failure from here on ends the output with its one line (:func:`.debug.install_excepthook`).
    """
    install_excepthook()
    debug_level()
    ranks = tuple(options.global_ranks_in_group)
    store = attempt_store(options.store)  # a restarted torchrun job must not read its killed attempt's keys
    if ranks:
        job = Job.current()
    else:
        job = Job.start(store, options.group_rank, options.group_size, backend_options,
                        wait_s=max(1.0, options.timeout.total_seconds()))
        ranks = tuple(range(options.group_size))
    return TopoccProcessGroup(store, options.group_rank, options.group_size, ranks, options.timeout, job)


def register() -> None:
    """Register the ``topocc`` backend with torch.distributed (done on import; harmless to repeat)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create_backend, extended_api=True, devices=["cpu", "cuda"])
    if os.environ.get(LOG_ENV, "").lower() == "debug":
        logger = logging.getLogger("topocc.distributed")
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("topocc: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)


def counters(group: Any = None) -> Counters:
    """The planned and native calls of ``group`` (default: the world), per collective; print it for a table."""
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, TopoccProcessGroup):
        raise CommunicatorError(f"the process group is {type(pg).__name__}, not topocc's",
                                fix='call torch.distributed.init_process_group("topocc")')
    return pg.stats


def step_ahead(optimizer: Any, group: Any = None) -> StepAhead:
    """Step ahead (:class:`~topocc.runtime.training.bucket_feedback.StepAhead`) on ``optimizer`` with the residuals of
    ``group`` (default: the world); the model must be ``DistributedDataParallel(..., gradient_as_bucket_view=True)``.

    >>> ahead = topocc.runtime.distributed.step_ahead(optimizer)   # doctest: +SKIP
    """
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, TopoccProcessGroup):
        raise CommunicatorError(f"the process group is {type(pg).__name__}, not topocc's",
                                fix='call torch.distributed.init_process_group("topocc")')
    return step_ahead_over(pg.feedback, optimizer)


register()
