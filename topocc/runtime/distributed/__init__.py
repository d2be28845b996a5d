"""topocc as a ``torch.distributed`` backend: ``init_process_group("topocc")`` runs the compiled plans.

Importing this package registers the backend (CPU and CUDA)::

    import topocc.runtime.distributed  # registers "topocc"
    dist.init_process_group("topocc")  # TOPOCC_PLAN=bundle-folder, under torchrun or mpiexec
    ...
    print(topocc.runtime.distributed.counters())  # planned and native calls per collective

Plans come from a bundle (``topocc bundle TOPOLOGY -o FOLDER``) named by
``TOPOCC_PLAN`` or by ``pg_options=BackendOptions(plan=...)``; ``TOPOCC_RECORD``
records the calls a job makes, ``TOPOCC_LOG=debug`` logs every call that went to
the native backend and why.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch.distributed as dist

from topocc.runtime.distributed.counters import Counters, Tally
from topocc.runtime.distributed.job import BackendOptions, Job
from topocc.runtime.distributed.process_group import TopoccProcessGroup
from topocc.runtime.errors import CommunicatorError

__all__ = ["BACKEND", "BackendOptions", "Counters", "Tally", "TopoccProcessGroup", "counters", "register"]

#: The name ``init_process_group`` takes.
BACKEND = "topocc"
#: ``TOPOCC_LOG=debug`` prints the ``topocc.distributed`` logger's lines (each delegated call) on stderr.
LOG_ENV = "TOPOCC_LOG"


def _create(options: Any, backend_options: Any) -> TopoccProcessGroup:
    """torch's extended backend constructor: the world's group starts the job, later groups share it."""
    ranks = tuple(options.global_ranks_in_group)
    if ranks:
        job = Job.current()
    else:
        job = Job.start(options.store, options.group_rank, options.group_size, backend_options)
        ranks = tuple(range(options.group_size))
    return TopoccProcessGroup(options.store, options.group_rank, options.group_size, ranks, options.timeout, job)


def register() -> None:
    """Register the ``topocc`` backend with torch.distributed (done on import; harmless to repeat)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
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


register()
