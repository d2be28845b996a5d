"""The keys of one torchrun attempt: a restarted job must not read the store keys its killed attempt left.

torchrun's agent hosts the job's store and keeps it across restarts (``--max-restarts``), so the keys a
rendezvous writes in attempt 0 (gloo's addresses, the bundle check) are still there when attempt 1 reads
them: a rank reads a dead peer's address and fails to connect (pytorch/pytorch#135712, where a plain gloo
job fails the same way).  Every store key the ``topocc`` backend writes is therefore put under the attempt
torchrun numbers in ``TORCHELASTIC_RESTART_COUNT``, which every rank of a single-node job (torchrun
``--standalone``) shares.  Outside torchrun the store is used as it is.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

__all__ = ["RESTART_ENV", "attempt_store"]

#: torchrun's count of the job's restarts so far, set in every worker's environment.
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"


def attempt_store(store: Any) -> Any:
    """``store`` with this torchrun attempt's prefix (the store itself outside torchrun)."""
    attempt = os.environ.get(RESTART_ENV, "").strip()
    return dist.PrefixStore(f"topocc-attempt-{attempt}/", store) if attempt else store
