"""Which rank a failed planned call lost, agreed through the job's store, so that every survivor names it.

A rank killed inside a planned collective breaks the links of the peers that were exchanging with it; those
peers fail at once, leave, and so break the links of the peers waiting on *them*, and so on.  Each rank's
own view names the peers it was waiting for, which after the first hop are survivors.  So every rank whose
planned call fails first posts what it saw under ``topocc-lost/<group rank>`` in the process group's store:
the ranks whose link broke and which had posted nothing (a failing rank posts before it leaves, so a broken
link to a rank that never posted is the loss itself).  The rank then names, in this order:

1. the ranks whose links broke without a post (its own evidence), at once;
2. else the ranks another rank posted as lost, as soon as one does;
3. else (a timeout: a rank hangs rather than dies), after ``window_s`` or once every other rank has
   posted, the ranks it waited for that posted nothing, else every rank that posted nothing.

Store errors (its server died with the job) leave the call's own error as it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from topocc.runtime.errors import CommunicatorError, PeerError

__all__ = ["LostRanks"]

#: Seconds between reads of the store while waiting for another rank's findings.
_POLL_S = 0.02
#: A rank that timed out waits at least this long for the others' posts (their deadlines differ by the skew of
#: their calls' starts), even when every rank it could hear from has already posted.
_SETTLE_S = 1.0


class LostRanks:
    """The ranks of one process group post and read their findings here (one per group, made with it).

    ``store`` is the group's own (keys ``topocc-lost/<group rank>``), ``rank`` this process's group rank and
    ``group`` the group's global ranks, which the messages name.
    """

    def __init__(self, store: Any, rank: int, group: Sequence[int], window_s: float) -> None:
        self._store = store
        self._rank = rank
        self._group = tuple(group)
        self._window_s = window_s
        self._lost: tuple[int, ...] | None = None

    def restate(self, err: CommunicatorError) -> CommunicatorError:
        """``err`` as one line that names the lost rank(s) first (global ranks); posts this rank's findings.

        Collective in spirit: every rank of the group whose call fails calls it once (later failures of the
        same group reuse the first answer)."""
        if self._lost is None:
            try:
                self._lost = self._agree(err)
            except Exception:  # the store went with the job: keep the call's own view
                return err
        if not self._lost:
            return err
        names = ", ".join(str(self._group[r]) for r in self._lost)
        return PeerError(f"lost rank(s) {names}: {err.message}", where=err.where,
                         fix=f"rank(s) {names} died or hang: check their output; restart the job from its last "
                             "checkpoint (torchrun --max-restarts)",
                         failed=getattr(err, "failed", ()), waiting=getattr(err, "waiting", ()))

    def _key(self, rank: int) -> str:
        return f"topocc-lost/{rank}"

    def _posts(self) -> dict[int, list[int]]:
        """Every rank's posted findings (the ranks it saw lost), by group rank."""
        found = {}
        for r in range(len(self._group)):
            if self._store.check([self._key(r)]):
                found[r] = json.loads(self._store.get(self._key(r)))
        return found

    def _agree(self, err: CommunicatorError) -> tuple[int, ...]:
        failed = set(err.failed) if isinstance(err, PeerError) else set()
        waiting = set(err.waiting) if isinstance(err, PeerError) else set()
        posts = self._posts()
        mine = sorted(failed - set(posts) - {self._rank})
        self._store.set(self._key(self._rank), json.dumps(mine))
        if mine:
            return tuple(mine)
        start = time.monotonic()
        others = set(range(len(self._group))) - {self._rank}
        while True:
            posts = self._posts()
            reported = sorted({r for found in posts.values() for r in found} - set(posts))
            if reported:
                return tuple(reported)
            silent = others - set(posts)
            elapsed = time.monotonic() - start
            if elapsed > self._window_s or (elapsed > _SETTLE_S and silent <= waiting):
                return tuple(sorted(silent & waiting or silent))
            time.sleep(_POLL_S)
