"""A torchrun worker whose rank 1 fails between two planned all_reduces: ``die`` exits, ``hang`` sleeps.

The other ranks must fail the second call within ``TOPOCC_TIMEOUT`` seconds with one line naming rank 1,
and leave with exit 5. The ranks meet on torchrun's store before ``init_process_group``, whose check that every
rank loaded the same bundle is bounded by the same short timeout: on a loaded machine one rank's imports
can finish seconds after the other's.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import topocc.runtime.distributed  # noqa: F401  (registers the backend)


def meet() -> None:
    """Wait until every rank got here (torchrun's store: MASTER_ADDR, MASTER_PORT, WORLD_SIZE)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=60))
    if store.add("failure_job/arrived", 1) == int(os.environ["WORLD_SIZE"]):
        store.set("failure_job/go", "1")
    store.wait(["failure_job/go"])


meet()
dist.init_process_group("topocc")
dist.all_reduce(torch.ones(1000))
if dist.get_rank() == 1:
    if sys.argv[1] == "die":
        os._exit(0)
    time.sleep(120)
start = time.monotonic()
try:
    dist.all_reduce(torch.ones(1000))
except Exception as exc:
    print(f"ELAPSED {time.monotonic() - start:.1f}", flush=True)
    print(f"ERROR {exc}", flush=True)
    raise SystemExit(5) from None
