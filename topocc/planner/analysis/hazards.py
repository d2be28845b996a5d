"""Which operation last wrote each chunk of a rank's buffers, and which read it since: kept as runs of chunks.

The schedule builder derives dependencies from these hazards, and the verifier checks with them that no two
operations of a rank race on a chunk; both cost per operation, not per chunk, because algorithms move
aligned ranges and a run splits at most twice per reference.
"""

from __future__ import annotations

import bisect

__all__ = ["ChunkRuns"]


class ChunkRuns:
    """One rank's chunk addresses as runs of equal hazard state: the last writer and the readers since.

    The builder's cost then follows the operations, not the chunks they cover: a
    reference to a run of chunks splits at most two runs and visits the runs it
    covers (few, since algorithms move aligned ranges), where a per-chunk map
    visits every chunk (ranks x chunks work, far too slow on large pipelined plans).
    """

    __slots__ = ("readers", "starts", "writer")

    def __init__(self) -> None:
        self.starts: list[int] = [0]  # run m covers [starts[m], starts[m + 1]); the last run is open-ended
        self.writer: list[int] = [-1]
        self.readers: list[list[int]] = [[]]

    def _split(self, address: int) -> int:
        """Index of the run that starts at ``address``, splitting the run that contains it."""
        starts = self.starts
        m = bisect.bisect_right(starts, address) - 1
        if starts[m] == address:
            return m
        starts.insert(m + 1, address)
        self.writer.insert(m + 1, self.writer[m])
        self.readers.insert(m + 1, list(self.readers[m]))
        return m + 1

    def runs(self, start: int, end: int) -> range:
        """The runs covering exactly ``[start, end)``."""
        first = self._split(start)
        last = self._split(end)  # inserts after ``first``, so ``first`` stays valid
        return range(first, last)

    def write(self, start: int, end: int, op: int) -> None:
        """``op`` is now the last writer of ``[start, end)``, with no reader since."""
        runs = self.runs(start, end)
        self.replace(runs.start, runs.stop, op)

    def replace(self, first: int, stop: int, op: int) -> None:
        """Runs ``first .. stop`` become one, written last by ``op``, with no reader since."""
        del self.starts[first + 1:stop]
        del self.writer[first + 1:stop]
        del self.readers[first + 1:stop]
        self.writer[first] = op
        self.readers[first] = []
