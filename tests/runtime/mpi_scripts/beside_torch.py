"""A script using topocc's Communicator beside torch.distributed, then a plain exit: communicators over MPI and
over gloo, torch's own all_reduce on the world and on a gloo group of the script's, torch's call last (the
case where gloo's worker thread may still hold that call's tensors when the interpreter finalizes).

Run under mpiexec, or ``topocc emulate``: ``beside_torch.py SCHEDULE [exit|destroy]``, SCHEDULE a ring
all-reduce for the world; ``destroy`` calls ``torch.distributed.destroy_process_group()`` before exiting (the
groups go before topocc's exit guard runs), ``exit`` (the default) leaves them to the guard. Rank 0's store binds
a free port itself and tells the others, so no port is picked, released and raced for; it listens on loopback,
or on the address of ``GLOO_SOCKET_IFNAME`` where that names an emulated host's interface. Each rank prints
``rank R done``, then, after the guard, what the guard left.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import socket
import struct
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from topocc.runtime.communicator import Communicator
from topocc.runtime.transports.gloo import GlooTransport

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
ending = sys.argv[2] if len(sys.argv) > 2 else "exit"
if ending not in ("exit", "destroy"):
    sys.exit(f"beside_torch.py: the ending is {ending!r} (fix: pass exit or destroy)")


def address() -> str:
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    if ifname == "lo":
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFADDR: the interface's IPv4 address
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))[20:24])


def rendezvous() -> dist.TCPStore:
    """torch's store, served by rank 0 on whichever port it gets, joined by every other rank."""
    timeout = timedelta(seconds=60)
    server = dist.TCPStore(address(), 0, size, True, timeout, wait_for_workers=False) if rank == 0 else None
    host, port = world.bcast((address(), server.port) if server is not None else None)
    return server if server is not None else dist.TCPStore(host, port, size, False, timeout)


def after_the_guard() -> None:
    """What topocc's exit guard left: registered before the first Communicator (which installs the guard), so
    atexit runs it after the guard."""
    gloo_group = "destroyed" if gloo.group is None else "kept"
    print(f"rank {rank} at exit: torch.distributed initialized {dist.is_initialized()}, topocc's gloo group "
          f"{gloo_group}", flush=True)


atexit.register(after_the_guard)
dist.init_process_group("gloo", store=rendezvous(), rank=rank, world_size=size)
over_mpi = Communicator(sys.argv[1], timeout=5.0)
gloo = GlooTransport(timeout=5.0)
over_gloo = Communicator(sys.argv[1], transport=gloo, timeout=5.0)
theirs = dist.new_group(backend="gloo")
for _ in range(3):
    a = over_mpi.allreduce(np.ones(1000, np.float32))
    t = over_gloo.allreduce(torch.ones(1000))
    dist.all_reduce(torch.ones(1000))
    dist.all_reduce(torch.ones(1000), group=theirs)
assert a[0] == size and t[0] == size
if ending == "destroy":
    dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
