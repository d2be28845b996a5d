"""A simulated run kept lean: one row of numbers per message, aggregated with numpy.

``simulate(record=True)`` returns an object per operation and per link
occupation (a 1024-rank, 256 MiB schedule: tens of millions of objects, minutes
and gigabytes).  The reports need far less: who sent to whom on which channel
and step, and when the data was on the wire.  :func:`record_run` collects just
that through the simulator's ``on_message`` hook, as typed columns (about 40
bytes per message), and the functions below derive everything else from them:
bytes per link and step (messages spread over their routes as the simulator
splits them) and busy time or carried bytes per time bin.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from topocc.planner.analysis.simulate import SimResult, chunk_bytes, simulate
from topocc.planner.routing.network import Network, network_of
from topocc.planner.topology.model import Topology
from topocc.runtime.schedule import Schedule

__all__ = ["Run", "link_bins", "link_step_bytes", "record_run", "route_matrix", "spread"]


@dataclass(frozen=True, eq=False)
class Run:
    """A simulation and its messages as parallel columns (one entry per message, in order of arrival).

    ``start`` is when a message went on the wire (both ends posted and its
    connection free), ``sent`` when its last byte left, ``end`` when it
    arrived (``sent`` plus the path latency); ``reduce`` says whether the
    receiver reduced it into its buffer (``recv_reduce``) rather than copied it.
    ``net`` is the network it ran on, whose routes spread each message over links.
    """

    net: Network
    result: SimResult
    src: np.ndarray
    dst: np.ndarray
    channel: np.ndarray
    step: np.ndarray
    reduce: np.ndarray
    nbytes: np.ndarray
    start: np.ndarray
    sent: np.ndarray
    end: np.ndarray

    @property
    def messages(self) -> int:
        return len(self.src)


class _Recorder:
    """The ``on_message`` hook: appends the few numbers a report needs to typed arrays."""

    def __init__(self, schedule: Schedule) -> None:
        self.programs = schedule.programs
        self.src, self.dst, self.channel, self.step = array("i"), array("i"), array("i"), array("i")
        self.reduce, self.chunks = array("b"), array("q")
        self.start, self.sent, self.end = array("d"), array("d"), array("d")

    def __call__(self, src: int, send: int, dst: int, recv: int, start_s: float, sent_s: float, end_s: float) -> None:
        op = self.programs[src][send]
        self.src.append(src)
        self.dst.append(dst)
        self.channel.append(op.channel)
        self.step.append(op.step)
        self.reduce.append(self.programs[dst][recv].kind == "recv_reduce")
        self.chunks.append(op.count)
        self.start.append(start_s)
        self.sent.append(sent_s)
        self.end.append(end_s)


def record_run(where: Topology | Network, schedule: Schedule, size_bytes: int) -> Run:
    """Simulate ``schedule`` at ``size_bytes`` and keep every message's endpoints, channel, step and timing."""
    net = network_of(where)
    rec = _Recorder(schedule)
    result = simulate(net, schedule, size_bytes, on_message=rec)
    return Run(
        net=net,
        result=result,
        src=np.frombuffer(rec.src, dtype=np.int32),
        dst=np.frombuffer(rec.dst, dtype=np.int32),
        channel=np.frombuffer(rec.channel, dtype=np.int32),
        step=np.frombuffer(rec.step, dtype=np.int32),
        reduce=np.frombuffer(rec.reduce, dtype=np.int8).astype(bool),
        nbytes=np.frombuffer(rec.chunks, dtype=np.int64) * chunk_bytes(schedule, size_bytes),
        start=np.frombuffer(rec.start, dtype=np.float64),
        sent=np.frombuffer(rec.sent, dtype=np.float64),
        end=np.frombuffer(rec.end, dtype=np.float64),
    )


def route_matrix(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """How each message's bytes split over the directed links (``topology.links`` indices).

    Returns ``(pair, ptr, link, share)``: message ``m`` travels between rank
    pair ``pair[m]``, whose links are ``link[ptr[p]:ptr[p + 1]]`` carrying the
    fractions ``share[...]`` of its bytes (as :meth:`~topocc.planner.routing.network.Network.route_shares`,
    which splits a message over its equal-cost paths as the simulator does).
    """
    net = run.net
    topology = net.topology
    n = max(topology.size, 1)
    keys = run.src.astype(np.int64) * n + run.dst
    pairs, pair = np.unique(keys, return_inverse=True)
    index = {(ln.src, ln.dst): i for i, ln in enumerate(topology.links)}
    ptr, links, shares = [0], [], []
    for key in pairs.tolist():
        for name, share in net.route_shares(key // n, key % n).items():
            links.append(index[name])
            shares.append(share)
        ptr.append(len(links))
    return pair, np.asarray(ptr, dtype=np.int64), np.asarray(links, dtype=np.int64), np.asarray(shares)


def link_step_bytes(run: Run) -> dict[tuple[str, str, int], float]:
    """Bytes each directed link carried in each algorithm step: the messages' bytes spread over their routes."""
    if not run.messages:
        return {}
    pair, ptr, links, shares = route_matrix(run)
    steps, step_of = np.unique(run.step, return_inverse=True)
    # bytes per (pair, step) first: far fewer entries than messages on pipelined schedules
    per_ps, ps_of = np.unique(pair * len(steps) + step_of, return_inverse=True)
    ps_bytes = np.bincount(ps_of, weights=run.nbytes, minlength=len(per_ps))
    ps_pair, ps_step = per_ps // len(steps), per_ps % len(steps)
    counts = ptr[ps_pair + 1] - ptr[ps_pair]
    rows = np.repeat(np.arange(len(per_ps)), counts)
    # position of each expanded entry inside its pair's slice of ``links``
    offsets = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    at = ptr[ps_pair][rows] + offsets
    keys, key_of = np.unique(links[at] * len(steps) + ps_step[rows], return_inverse=True)
    carried = np.bincount(key_of, weights=ps_bytes[rows] * shares[at], minlength=len(keys))
    names = [(ln.src, ln.dst) for ln in run.net.topology.links]
    return {(*names[k // len(steps)], int(steps[k % len(steps)])): float(b)
            for k, b in zip(keys.tolist(), carried.tolist())}


def spread(rows: np.ndarray, start: np.ndarray, end: np.ndarray, amount: np.ndarray, n_rows: int, t_end: float,
           bins: int) -> np.ndarray:
    """Each interval's ``amount`` spread evenly over its time, summed per row and time bin.

    Returns an ``(n_rows, bins)`` array over ``[0, t_end]``; an interval of no
    length puts its whole amount in its bin.  With ``amount = end - start``
    each bin holds the time its rows were covered; with bytes, what they moved.
    """
    out = np.zeros(n_rows * bins)
    if not len(rows) or t_end <= 0:
        return out.reshape(n_rows, bins)
    x0 = np.clip(start / t_end * bins, 0.0, bins)
    x1 = np.clip(end / t_end * bins, x0, bins)
    i0 = np.minimum(x0.astype(np.int64), bins - 1)
    i1 = np.minimum(x1.astype(np.int64), bins - 1)
    base = rows.astype(np.int64) * bins
    one = i0 == i1
    out += np.bincount(base[one] + i0[one], weights=amount[one], minlength=n_rows * bins)
    many = ~one
    density = amount[many] / (x1[many] - x0[many])  # per bin width; x1 > x0 wherever the bins differ
    b, j0, j1 = base[many], i0[many], i1[many]
    out += np.bincount(b + j0, weights=density * (j0 + 1 - x0[many]), minlength=n_rows * bins)
    out += np.bincount(b + j1, weights=density * (x1[many] - j1), minlength=n_rows * bins)
    # whole bins in between: +density from j0 + 1, -density from j1, then a running sum along each row
    full = j1 > j0 + 1
    wide = n_rows * (bins + 1)
    rb = rows[many][full].astype(np.int64) * (bins + 1)
    diff = (np.bincount(rb + j0[full] + 1, weights=density[full], minlength=wide)
            - np.bincount(rb + j1[full], weights=density[full], minlength=wide))
    out += np.cumsum(diff.reshape(n_rows, bins + 1), axis=1)[:, :bins].ravel()
    # the running sum leaves rounding residue (1e-10 of an amount) where intervals ended: no negative amounts
    return np.maximum(out, 0.0).reshape(n_rows, bins)


def link_bins(run: Run, links: list[int], bins: int) -> np.ndarray:
    """Bytes each of ``links`` (``topology.links`` indices) carried per time bin of the run, ``(len(links), bins)``.

    A message's bytes are split over its routes as the simulator splits them and
    spread evenly from its start until its last byte left; so each row adds up
    to what the link carried in all, and its shape is exact but for the rate
    changes inside a message.
    """
    chosen = np.asarray(links, dtype=np.int64)
    if not len(chosen) or not run.messages:
        return np.zeros((len(chosen), bins))
    pair, ptr, route_links, shares = route_matrix(run)
    # the route entries (pair, link) on a chosen link ...
    entry_pair = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    hit = np.isin(route_links, chosen)
    e_pair, e_share = entry_pair[hit], shares[hit]
    order = np.argsort(chosen)
    e_row = order[np.searchsorted(chosen[order], route_links[hit])]
    # ... each joined with every message of its pair
    by_pair = np.argsort(pair, kind="stable")
    count = np.bincount(pair, minlength=len(ptr) - 1)
    first = np.cumsum(count) - count
    n = count[e_pair]
    msg = by_pair[np.repeat(first[e_pair], n) + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)]
    return spread(np.repeat(e_row, n), run.start[msg], run.sent[msg], run.nbytes[msg] * np.repeat(e_share, n),
                  len(chosen), run.result.time_s, bins)
