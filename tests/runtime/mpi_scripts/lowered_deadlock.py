"""Two ranks replay an exchange lowered badly (each posts its send alone, before its receive) over MPIGroupTransport.

Run as ``mpiexec -n 2 python lowered_deadlock.py TIMEOUT``.  The transport's sends are synchronous (NCCL's
rendezvous), so both ranks wait in their first group and each must fail after TIMEOUT with one
``topocc:`` line naming the other; with sends that could complete eagerly the exchange would pass.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.executor import Program
from topocc.runtime.group_executor import GroupProgram
from topocc.runtime.lowering import Group, RankLowering
from topocc.runtime.schedule import Chunk, build_schedule, operation
from topocc.runtime.transports import PeerFailure
from topocc.runtime.transports.mpi import MPIGroupTransport

timeout = float(sys.argv[1])
transport = MPIGroupTransport()
rank = transport.rank
schedule = build_schedule("allgather", 2, 1, 2, [
    [operation("send", 1 - r, Chunk("i", 0)), operation("recv", 1 - r, None, Chunk("o", 1 - r))] for r in range(2)])
program = GroupProgram(Program(schedule, rank, np.dtype("float32"), 16, tag_ub=1 << 30, channels=1),
                       RankLowering((Group(1, (0,), ()), Group(2, (1,), ()))))
data, out = np.full(16, rank, np.float32), np.zeros(32, np.float32)
binding = program.bind(transport, {"i": data, "o": out})
start = time.monotonic()
try:
    program.start(binding, np.add, time.monotonic() + timeout)
    print(f"rank {rank}: the exchange completed", flush=True)
except PeerFailure as exc:
    err: CommunicatorError = program.failure(exc, timeout, "allgather (bad lowering)")
    os.write(2, f"topocc: {err.one_line()} after {time.monotonic() - start:.1f} s\n".encode())
    os._exit(err.exit_code)
