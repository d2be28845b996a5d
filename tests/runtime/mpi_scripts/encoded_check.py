"""One rank of an encoded replay: an allreduce of the compressed schedule SCHEDULE over MPI or gloo.

``python encoded_check.py SCHEDULE mpi`` (under mpiexec) or ``... SCHEDULE gloo RANK WORLD INIT_METHOD`` (one
process per rank).  Every rank allreduces its seeded float32 input (an odd size) and an int32 one; rank 0 prints
``RESULT {json}``: whether every rank's float result is bitwise the same (crc32 of its bytes), its relative L2
error against the float64 sum, and whether the int32 result is exact.
"""

from __future__ import annotations

import json
import sys
import zlib

import numpy as np

from topocc.runtime.communicator import Communicator

N = 4099


def main() -> None:
    path, transport = sys.argv[1], sys.argv[2]
    if transport == "mpi":
        from mpi4py import MPI

        rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        comm = Communicator(path, timeout=60.0)
        wrap, unwrap = (lambda a: a), (lambda a: a)
    else:
        import torch
        import torch.distributed as dist

        from topocc.runtime.transports.gloo import GlooTransport

        rank, world = int(sys.argv[3]), int(sys.argv[4])
        dist.init_process_group("gloo", init_method=sys.argv[5], rank=rank, world_size=world)
        comm = Communicator(path, transport=GlooTransport(timeout=60.0), timeout=60.0)
        wrap, unwrap = torch.from_numpy, (lambda t: t.numpy())
    xs = [np.random.default_rng([3, r]).standard_normal(N).astype(np.float32) for r in range(world)]
    ints = [np.random.default_rng([4, r]).integers(-100, 100, N).astype(np.int32) for r in range(world)]
    got = unwrap(comm.allreduce(wrap(xs[rank].copy())))
    got_int = unwrap(comm.allreduce(wrap(ints[rank].copy())))
    truth = np.sum(np.array(xs, np.float64), axis=0)
    row = [zlib.crc32(got.tobytes()), int(np.array_equal(got_int, np.sum(ints, axis=0, dtype=np.int32)))]
    rows = comm.transport.allgather_ints(row, 60.0)
    comm.close()
    if rank == 0 and rows is not None:
        print("RESULT " + json.dumps({"consistent": len({r[0] for r in rows}) == 1,
                                      "ints_exact": all(r[1] for r in rows),
                                      "error": float(np.linalg.norm(got - truth) / np.linalg.norm(truth))}),
              flush=True)


if __name__ == "__main__":
    main()
