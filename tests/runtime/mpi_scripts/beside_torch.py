"""A script using topocc's Communicator beside torch.distributed: over MPI, over gloo, and torch's own
all_reduce, then a plain exit (run under mpiexec; argv: a ring all-reduce schedule for the world)."""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from topocc.runtime.communicator import Communicator
from topocc.runtime.transports.gloo import GlooTransport

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
port = world.bcast(int(sys.argv[2]) if rank == 0 else None)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
over_mpi = Communicator(sys.argv[1], timeout=5.0)
over_gloo = Communicator(sys.argv[1], transport=GlooTransport(timeout=5.0), timeout=5.0)
for _ in range(3):
    a = over_mpi.allreduce(np.ones(1000, np.float32))
    t = over_gloo.allreduce(torch.ones(1000))
    dist.all_reduce(torch.ones(1000))
assert a[0] == size and t[0] == size
print(f"rank {rank} done", flush=True)
