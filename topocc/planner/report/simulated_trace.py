"""A simulated run as a Chrome trace (open it in Perfetto or ``chrome://tracing``).

One process per host holds a track per rank (its operations, split into lanes
where they overlap) and a track per link leaving a device of that host; links
between switches go to a ``network`` process.  Operation slices run from the
moment the data starts to move (the later of the send and its receive being
posted, as the simulator's rendezvous) to its arrival; the time posted is kept
in ``args``.  Link slices are the busy periods of a link in one algorithm step
(the flows of that step, merged), named ``step S: a -> b`` with the bytes
carried.  The writer is :mod:`topocc.runtime.chrome_trace`, which the runtime uses for
measured runs, so both traces look alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from topocc.planner.analysis.simulate import SimResult
from topocc.planner.collector import collector_paused
from topocc.planner.report._model import transfer_starts
from topocc.planner.topology.model import Topology
from topocc.runtime.chrome_trace import Slice, TraceWriter, op_slice_name
from topocc.runtime.schedule import Schedule

__all__ = ["simulated_trace"]

#: Link slices kept at most (a 1024-rank run records millions of flows); the busiest links are kept whole.
MAX_LINK_SLICES = 200_000
#: Operation slices kept at most; ranks past the budget are left out (and listed in ``otherData``).
MAX_OP_SLICES = 400_000


def simulated_trace(topology: Topology, schedule: Schedule, result: SimResult, *,
                    max_link_slices: int = MAX_LINK_SLICES, max_op_slices: int = MAX_OP_SLICES) -> dict[str, Any]:
    """The trace document (``{"traceEvents": [...]}``) of a recorded simulation.

    ``result`` must come from ``simulate(topology, schedule, size, record=True)``.
    Times are microseconds from the start of the collective.

    >>> result = simulate(topology, schedule, 1 << 26, record=True)  # doctest: +SKIP
    >>> trace = simulated_trace(topology, schedule, result)  # doctest: +SKIP
    >>> topocc.runtime.chrome_trace.write_trace("run.json", trace)  # doctest: +SKIP
    """
    with collector_paused():
        return _trace(topology, schedule, result, max_link_slices, max_op_slices)


def _trace(topology: Topology, schedule: Schedule, result: SimResult, max_link_slices: int,
           max_op_slices: int) -> dict[str, Any]:
    w = TraceWriter()
    host_of = {r: h for h, ranks in topology.hosts.items() for r in ranks}
    for h in topology.hosts:  # processes in host order, so Perfetto lists them as the cluster is laid out
        w.process(f"host {h}")
    starts = transfer_starts(schedule, result.op_events)

    by_rank: dict[int, list[Slice]] = defaultdict(list)
    for e in result.op_events:
        begin = starts.get((e.rank, e.index), e.start_s)
        args = {"rank": e.rank, "index": e.index, "kind": e.kind, "step": e.step, "channel": e.channel,
                "chunk": e.chunk, "posted_us": round(e.start_s * 1e6, 4)}
        if e.peer is not None:
            args["peer"] = e.peer
        by_rank[e.rank].append(Slice(op_slice_name(e), begin, e.end_s, e.kind, args))
    kept_ops = 0
    dropped_ranks = []
    for rank in sorted(by_rank):
        if kept_ops + len(by_rank[rank]) > max_op_slices:
            dropped_ranks.append(rank)
            continue
        kept_ops += len(by_rank[rank])
        w.track(w.process(f"host {host_of[rank]}"), f"rank {rank}", by_rank[rank])

    # links: flows merged per (link, step) into busy periods, bytes summed
    flows: dict[tuple[str, str, int], list[tuple[float, float, float]]] = defaultdict(list)
    for flow in result.link_events:
        flows[(flow.src, flow.dst, flow.step)].append((flow.start_s, flow.end_s, flow.bytes))
    per_link: dict[tuple[str, str], list[Slice]] = defaultdict(list)
    for (src, dst, step), items in flows.items():
        periods: list[list[float]] = []  # [start, end, bytes, flows]: overlapping flows merged, in one sweep
        for a, b, n in sorted(items):
            if periods and a <= periods[-1][1]:
                p = periods[-1]
                p[1] = max(p[1], b)
                p[2] += n
                p[3] += 1
            else:
                periods.append([a, b, n, 1])
        for a, b, n, count in periods:
            per_link[(src, dst)].append(Slice(f"step {step}: {src} -> {dst}", a, b, "link",
                                              {"step": step, "bytes": round(n), "flows": int(count)}))
    order = sorted(per_link, key=lambda k: (-result.link_bytes.get(k, 0.0), k))
    kept: list[tuple[str, str]] = []
    total = 0
    for key in order:
        if total + len(per_link[key]) > max_link_slices:
            continue
        kept.append(key)
        total += len(per_link[key])
    for src, dst in sorted(kept, key=lambda k: (_home(topology, k[0]), k)):
        link = topology.link(src, dst)
        name = f"link {src} -> {dst}" + (f" ({link.kind})" if link is not None and link.kind else "")
        w.track(w.process(_home(topology, src)), name, per_link[(src, dst)])
    other: Mapping[str, Any] = {
        "topology": topology.name, "collective": schedule.collective, "algorithm": schedule.metadata.algorithm,
        "ranks": schedule.ranks, "size_bytes": result.size_bytes, "predicted_time_us": result.time_s * 1e6,
        "links_left_out": len(per_link) - len(kept), "ranks_left_out": dropped_ranks,
    }
    return w.to_dict(otherData=dict(other))


def _home(topology: Topology, device: str) -> str:
    """The process a link's track belongs to: its source's host, else the network."""
    host = topology.device(device).host
    return f"host {host}" if host is not None else "network"
