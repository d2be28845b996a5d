"""A control plane over a key-value store: the set-up agreement and timing collectives, without MPI.

A group transport (NCCL) moves data itself but needs a control plane for the
rest: handing the NCCL unique id to every rank, the communicator's set-up
handshakes, barriers and the benchmarks' maxima.  :class:`MPITransport`
provides one over MPI; :class:`StoreControl` provides the same three calls over
any ``torch.distributed`` store (``FileStore``, ``TCPStore``, or the default
process group's), for programs launched without ``mpiexec`` (one process per
rank in its own network namespace, as the emulated GPU benchmarks run).

Every rank must make the same calls in the same order: call ``n`` writes its
value under ``<prefix>/<n>/<rank>`` and reads every rank's.  Keys are never
deleted (a control plane makes few calls; the store goes with the job).

>>> store = torch.distributed.FileStore("/tmp/rendezvous", 4)              # doctest: +SKIP
>>> control = StoreControl(store, rank, 4)                                  # doctest: +SKIP
>>> comm = Communicator(plan, transport=NCCLTransport(control))             # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from topocc.runtime.errors import CommunicatorError
from topocc.runtime.transports import PeerFailure

__all__ = ["StoreControl"]

#: How long one read waits for a key that ``wait`` reported present (the store's own latency).
_READ_TIMEOUT_S = 30.0


class StoreControl:
    """``allgather_ints``, ``barrier`` and ``max_float`` over a ``torch.distributed`` store.

    Parameters
    ----------
    store:
        The store every rank shares.
    rank, size:
        This process's rank and the number of ranks.
    prefix:
        A namespace for the keys, so that several control planes may share one store.
    """

    name = "store"

    def __init__(self, store: Any, rank: int, size: int, *, prefix: str = "topocc") -> None:
        if not 0 <= rank < size:
            raise CommunicatorError(f"rank {rank} is not in 0..{size - 1}", where="StoreControl")
        self.store = store
        self.rank = rank
        self.size = size
        self.prefix = prefix
        self._calls = 0

    def _exchange(self, value: Any, timeout: float) -> list[Any] | None:
        """Every rank's JSON ``value`` in rank order, or None if not all wrote it within ``timeout`` seconds."""
        call = self._calls
        self._calls += 1
        keys = [f"{self.prefix}/{call}/{r}" for r in range(self.size)]
        self.store.set(keys[self.rank], json.dumps(value))
        deadline = time.monotonic() + timeout
        try:
            # the store raises on its own timeout; wait in slices so ``timeout`` (not the store's) rules
            while not self.store.check(keys):
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.001)
            self.store.set_timeout(timedelta(seconds=_READ_TIMEOUT_S))
            return [json.loads(self.store.get(k)) for k in keys]
        except Exception as exc:  # the store's server or file went away: a peer failure
            text = str(exc).strip()
            raise PeerFailure(f"store: {text.splitlines()[0][:160] if text else type(exc).__name__}") from None

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None:
        rows = self._exchange([int(v) for v in values], timeout)
        return None if rows is None else [tuple(int(v) for v in row) for row in rows]

    def barrier(self, timeout: float) -> bool:
        return self._exchange(0, timeout) is not None

    def max_float(self, value: float, timeout: float = 300.0) -> float:
        rows = self._exchange(float(value), timeout)
        if rows is None:
            raise PeerFailure(f"not every rank reported a value within {timeout:g} s")
        return max(float(v) for v in rows)
