"""Ranks disagree before any data moves: ``mismatch.py MODE SCHEDULE_A SCHEDULE_B``.

MODE ``schedule``: rank 1 loads SCHEDULE_B; ``dtype``: rank 1 calls with float64;
``count``: rank 1 calls with one element more.  Each rank prints ``untouched`` if
its buffer is still intact after the refusal (no data moved).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from topocc.runtime import Communicator, CommunicatorError

mode, path_a, path_b = sys.argv[1:4]
from mpi4py import MPI  # noqa: E402

rank = MPI.COMM_WORLD.Get_rank()
path = path_b if (mode == "schedule" and rank == 1) else path_a
try:
    comm = Communicator(path, timeout=10)
    dtype = np.float64 if (mode == "dtype" and rank == 1) else np.float32
    count = 1002 if (mode == "count" and rank == 1) else 1001
    x = np.full(count, rank + 1, dtype=dtype)
    try:
        comm.allreduce(x)
    finally:
        if np.all(x == rank + 1):
            os.write(1, f"rank {rank}: untouched\n".encode())  # one write: no interleaving
except CommunicatorError as err:
    os.write(1, f"REFUSED {err}\n".encode())
    raise
