"""A torchrun worker that leaves a topocc failure uncaught: ``dead_peer`` (rank 1 exits between two planned
all_reduces) or ``bad_bundle`` (``init_process_group`` refuses the bundle).  Each surviving rank's output must
end with topocc's one line, not with a traceback."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

if sys.argv[1] == "bad_bundle":
    os.environ["TOPOCC_TOPOLOGY"] = "some-other-cluster"
dist.init_process_group("topocc")
dist.all_reduce(torch.ones(1000))
if dist.get_rank() == 1:
    os._exit(0)
dist.all_reduce(torch.ones(1000))
