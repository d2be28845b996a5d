"""A torchrun worker whose rank 1 fails between two planned all_reduces: ``die`` exits, ``hang`` sleeps.

The other ranks must fail the second call within ``TOPOCC_TIMEOUT`` seconds with one line naming rank 1,
and leave with exit 5.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import topocc.runtime.distributed  # noqa: F401  (registers the backend)

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
