"""A script using topocc's Communicator beside torch.distributed: over MPI, over gloo, and torch's own
all_reduce, then a plain exit (run under mpiexec, or ``topocc emulate``; argv: a ring all-reduce schedule
for the world, and the port of torch's rendezvous at rank 0: on loopback, or on the address of
``GLOO_SOCKET_IFNAME`` where that names an emulated host's interface)."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from topocc.runtime.communicator import Communicator
from topocc.runtime.transports.gloo import GlooTransport

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

def address() -> str:
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    if ifname == "lo":
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFADDR: the interface's IPv4 address
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))[20:24])


host = world.bcast(f"{address()}:{sys.argv[2]}" if rank == 0 else None)
dist.init_process_group("gloo", init_method=f"tcp://{host}", rank=rank, world_size=size)
over_mpi = Communicator(sys.argv[1], timeout=5.0)
over_gloo = Communicator(sys.argv[1], transport=GlooTransport(timeout=5.0), timeout=5.0)
for _ in range(3):
    a = over_mpi.allreduce(np.ones(1000, np.float32))
    t = over_gloo.allreduce(torch.ones(1000))
    dist.all_reduce(torch.ones(1000))
assert a[0] == size and t[0] == size
print(f"rank {rank} done", flush=True)
