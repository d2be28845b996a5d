"""A plain user script: allreduce twice; rank DIE_RANK dies (os._exit or SIGKILL) after the first call.

Run as ``mpiexec -disable-auto-cleanup -n 4 python die_between.py SCHEDULE exit|kill TIMEOUT``; the
surviving ranks must fail within the timeout, naming the peer they waited for.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

from topocc.runtime import Communicator

DIE_RANK = 2

path, how, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
comm = Communicator(path, timeout=timeout)
x = np.ones(1001, dtype=np.float32)
comm.allreduce(x)
print(f"rank {comm.rank}: first allreduce ok", flush=True)
if comm.rank == DIE_RANK:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(9)
comm.allreduce(x)  # never completes: raises CommunicatorError after `timeout` seconds
print(f"rank {comm.rank}: second allreduce unexpectedly completed", flush=True)
