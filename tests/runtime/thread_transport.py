"""An in-process transport for tests: every rank a thread, each message copied through a shared queue.

Sends are eager (copied out when started, complete at once); receives complete when their message is there.
It counts the bytes sent, so a test sees what encodings save on the wire.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np


class Hub:
    """What the ranks share: message queues by (sender, receiver, tag), and a barrier for the handshakes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.boxes: dict[tuple[int, int, int], deque[bytes]] = {}
        self.barrier = threading.Barrier(size)
        self.slots: list[Any] = [None] * size


class _Req:
    """One persistent message: its buffer, peer, tag and direction, and whether it completed."""

    __slots__ = ("buf", "done", "peer", "send", "tag")

    def __init__(self, buf: Any, peer: int, tag: int, send: bool) -> None:
        self.buf, self.peer, self.tag, self.send, self.done = buf, peer, tag, send, False


class ThreadTransport:
    """A :class:`~topocc.runtime.transports.Transport` between threads of one process."""

    name = "threads"
    tag_ub = (1 << 30) - 1

    def __init__(self, hub: Hub, rank: int) -> None:
        self.hub, self.rank, self.size = hub, rank, hub.size
        self.sent_bytes = 0

    def send_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Req(buf, peer, tag, True)

    def recv_init(self, buf: Any, peer: int, tag: int) -> Any:
        return _Req(buf, peer, tag, False)

    def start(self, requests: list[Any]) -> None:
        for req in requests:
            req.done = False
            if req.send:
                data = np.asarray(req.buf).view(np.uint8).tobytes()
                self.sent_bytes += len(data)
                with self.hub.lock:
                    self.hub.boxes.setdefault((self.rank, req.peer, req.tag), deque()).append(data)
                req.done = True

    def test_some(self, requests: list[Any]) -> list[int]:
        out = []
        for j, req in enumerate(requests):
            if not req.done and not req.send:
                with self.hub.lock:
                    box = self.hub.boxes.get((req.peer, self.rank, req.tag))
                    data = box.popleft() if box else None
                if data is not None:
                    view = np.asarray(req.buf).view(np.uint8)
                    assert view.nbytes == len(data), (view.nbytes, len(data))
                    view[:] = np.frombuffer(data, np.uint8)
                    req.done = True
            if req.done:
                out.append(j)
        return out

    def free(self, requests: Sequence[Any]) -> None:
        pass

    def allgather_ints(self, values: Sequence[int], timeout: float) -> list[tuple[int, ...]] | None:
        self.hub.slots[self.rank] = tuple(values)
        self.hub.barrier.wait(timeout)
        out = list(self.hub.slots)
        self.hub.barrier.wait(timeout)
        return out

    def barrier(self, timeout: float) -> bool:
        self.hub.barrier.wait(timeout)
        return True

    def max_float(self, value: float) -> float:
        return value


def run_ranks(schedule: Any, inputs: Sequence[Any], call: str = "allreduce", **kwargs: Any) -> tuple[list[Any], int]:
    """Every rank's result of ``call`` on its input, each rank a thread; and the bytes sent in all."""
    from topocc.runtime import Communicator

    hub = Hub(len(inputs))
    results: list[Any] = [None] * len(inputs)
    errors: list[BaseException] = []
    transports = [ThreadTransport(hub, r) for r in range(len(inputs))]

    def rank(r: int) -> None:
        try:
            comm = Communicator(schedule, transport=transports[r], timeout=60.0)
            results[r] = getattr(comm, call)(inputs[r], **kwargs)
        except BaseException as exc:
            errors.append(exc)
            hub.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, sum(t.sent_bytes for t in transports)
