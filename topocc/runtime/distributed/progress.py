"""The progress engine of a ``topocc`` process group: planned CPU calls run beside the caller, in call order.

A planned call on CPU tensors is replayed on the host (:mod:`topocc.runtime.executor`),
which takes as long as the collective.  Run on the caller's thread it would
block DDP's backward until each bucket is reduced; gloo's own calls return at
once and complete on gloo's threads.  So each process group has one worker
thread (:class:`Progress`) that runs its planned calls in the order they were
made: every rank makes a group's calls in the same order (torch's rule for
collectives), so the workers of a group's ranks meet on the same call, and a
call never starts before the one made before it on the group has ended.

The caller gets a :class:`PlannedWork` at once: ``wait()`` blocks until the
call has run and raises what it raised (a peer's failure, in topocc's one line),
``is_completed()`` polls, and ``get_future()`` is the future DDP's reducer and
comm hooks chain on (its value: the call's output tensors).  The caller must not
read the tensors before then, as with any ``async_op`` work; DDP waits on the
future before it copies a bucket back into the gradients.  The replay waits for
messages without the GIL (the gloo transport blocks on an event), so backward's
Python hooks keep running while a call is in flight.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["PlannedWork", "Progress"]

#: A queued call: what to run, the future it completes, and the value that future gets.
_Job = tuple[Callable[[], None], "torch.futures.Future[Any]", Any]


class PlannedWork(dist.Work):
    """The ``Work`` of a planned call: done when the progress thread has run it; ``wait()`` re-raises its error."""

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the call has run (``timeout`` is the process group's own: a failed peer ends the call)."""
        self._future.wait()  # raises the call's exception, unchanged
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.wait()
        except Exception:
            return False
        return True

    def exception(self) -> BaseException | None:
        """The call's exception once it has failed, else None."""
        if not self._future.done():
            return None
        try:
            self._future.wait()
        except Exception as exc:
            return exc
        return None

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future

    def result(self) -> Any:
        return self._future.wait()

    def synchronize(self) -> None:
        self.wait()


class Progress:
    """One daemon thread running a process group's planned calls in submission order (started on first use)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.submitted = 0

    def submit(self, run: Callable[[], None], result: Any) -> PlannedWork:
        """Queue ``run``; the returned work completes with ``result`` once it has run (or with its error)."""
        future: torch.futures.Future[Any] = torch.futures.Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self.submitted += 1
            self._jobs.put((run, future, result))
        return PlannedWork(future)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            run, future, result = job
            try:
                run()
            except BaseException as exc:  # handed to whoever waits; the thread goes on with the next call
                future.set_exception(exc)
            else:
                future.set_result(result)

    def drain(self) -> None:
        """Wait until every call submitted so far has run (their errors stay with their works)."""
        done = self.submit(lambda: None, None)
        done.get_future().wait()

    def close(self) -> None:
        """Run what is queued, then end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._jobs.put(None)
        thread.join()
