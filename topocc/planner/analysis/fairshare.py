"""Max-min fair sharing of link bandwidth among the flows of a fluid network model (the simulator's engine).

:class:`Fabric` holds the flows on the wire in numpy arrays indexed by flow
slot, each with its bytes left, its rate and its finish time, so that the next
flow to end is one ``min`` and a rate change costs no event.  Fair shares are
recomputed, when flows start or end, only over the *components* touched
(messages linked by shared links: max-min fairness is decided per component, as
in SimGrid's lmm solver).  A small component gets :func:`fair_rates`, the
scalar progressive filling; larger ones get :func:`fair_rates_vector`, the
same filling a level at a time in numpy.  On a fat-tree under ECMP (hashed
paths collide on spine links) one component holds hundreds of flows and
changes at almost every message end; there the vector filling costs a few
numpy passes per distinct bottleneck share (at most 7 on fattree-1024) where
the scalar one costs a Python step per (flow, link) pair.

Rates are a function of the multiset of paths on the wire alone, so two
shortcuts change no result.  An instant that leaves as many flows on each path
as before (a connection's next message taking over from its last, most
instants under tree packing) keeps every rate, and its new flows take their
path's; and the vector filling gets each distinct path once, weighted by its
flows.  Where one component spans the fabric, the search that would find it
gives up at almost every instant, so after it gives up it is skipped a few
times (:data:`SEARCH_SKIPS`).

A filling also starts where the last one still holds: the flows that no change
since then can have reached keep their rates, and only the others are filled,
on what the kept ones leave of the links (:meth:`Fabric._refill`; the same
rates as a filling from scratch but for rounding).  That halves the simulation
of tree packing on ibm-s822lc-48x4 and cuts MultiTree's on mesh-4x4x4 by about a
quarter.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SAME_INSTANT", "Fabric", "Route", "Unshared", "fair_rates", "fair_rates_vector", "make_route"]

#: Events closer than this (relative) are one instant: floating-point noise must not split a step.
SAME_INSTANT = 1e-12

#: Components with at most this many flows (all the touched ones together) get the scalar filling: its
#: Python steps cost less than numpy's per-call overhead on a few flows, and much more on many.
SCALAR_FLOWS = 48
#: The component search gives up once it has reached this many links, and every flow on the wire is
#: reallocated by the vector filling: cheaper than walking a component that spans the fabric link by link
#: (rates are decided per component, so the flows of untouched components keep theirs).
SEARCH_LINKS = 64
#: After a search that gave up, the next one is skipped (every flow reallocated straight away) this many times,
#: doubling per further give-up up to :data:`SEARCH_SKIPS` and back to none after a search that succeeds: where
#: one component spans the fabric (a torus or mesh under tree packing, a fat-tree under ECMP) nearly every
#: search gives up, and each cost as much as a filling.  Rates are the same either way.
SEARCH_SKIPS = 8
#: Unchanged flows keep their rates only below the level ``theta`` less this (relative): ties at theta refill.
_THETA_MARGIN = 1e-9
#: A link whose unfixed flows' fractions sum to no more than this carries none (weighted flows leave rounding).
_EMPTY = 1e-9


def fair_rates(flows: Sequence[int], links: Collection[int], flow_links: Mapping[int, Sequence[int]],
               link_flows: Mapping[int, Collection[int]], bandwidth: Sequence[float], cap: list[float],
               cnt: list[float], flow_coefs: Mapping[int, Sequence[float]] | None = None) -> dict[int, float]:
    """Max-min fair rates of a component by progressive filling (Bertsekas & Gallager, Data Networks, 6.5.2).

    Repeatedly the link with the smallest fair share (remaining capacity / unfixed
    flows) saturates: its unfixed flows get that share and leave the problem.
    Fixing flows at the smallest share never lowers another link's share, so the
    heap is updated lazily: a link whose key is out of date is pushed back with
    its current share when it reaches the top.  ``cap`` and ``cnt`` are scratch
    arrays indexed by link, overwritten for the component's links.  Costs
    O(F h + L log L) for F flows of h hops on L links.

    A flow in ``flow_coefs`` puts that fraction of its rate on each of its links (in the order of
    ``flow_links``): a message sprayed over many paths as one flow.  A link's fair share is then its
    remaining capacity over the unfixed flows' fractions on it; the filling is otherwise the same.
    """
    coefs = flow_coefs or {}
    if len(flows) == 1:
        f = flows[0]
        if f in coefs:
            return {f: min(bandwidth[link] / c for link, c in zip(flow_links[f], coefs[f]))}
        return {f: min(bandwidth[link] for link in flow_links[f])}
    for link in links:
        cap[link] = bandwidth[link]
        cnt[link] = len(link_flows[link])
    for f, parts in coefs.items():  # a weighted flow is listed once per occurrence of a link: count c, not 1
        for link, c in zip(flow_links[f], parts):
            cnt[link] += c - 1
    heap = [(cap[link] / cnt[link], link) for link in links]
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush
    rates: dict[int, float] = {}
    floor = 0.0
    while heap:
        share, link = heappop(heap)
        n = cnt[link]
        if n <= _EMPTY:
            continue
        current = cap[link] / n
        if current > share * (1 + SAME_INSTANT):
            heappush(heap, (current, link))
            continue
        share = current if current > floor else floor  # shares never decrease; guard against rounding
        floor = share
        for f in link_flows[link]:
            if f in rates:
                continue
            rates[f] = share
            fractions = coefs.get(f)
            if fractions is None:
                for other in flow_links[f]:
                    cap[other] -= share
                    cnt[other] -= 1
            else:
                for other, c in zip(flow_links[f], fractions):
                    cap[other] -= share * c
                    cnt[other] -= c
    return rates


def fair_rates_vector(paths: np.ndarray, bandwidth: np.ndarray, weights: np.ndarray | None = None,
                      coefs: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rates of the flows whose paths are the rows of ``paths`` (link indices, -1 after the last).

    With ``weights``, row i stands for ``weights[i]`` flows on that path (flows on
    one path get one rate), so the caller passes each distinct path once.  With
    ``coefs`` (the shape of ``paths``), a flow puts that fraction of its rate on
    each link of its row (as :func:`fair_rates`' ``flow_coefs``); else all of it.

    The progressive filling of :func:`fair_rates`, in rounds: a link whose fair
    share is no larger (within a relative :data:`SAME_INSTANT`) than the share
    of any other link its unfixed flows cross is a bottleneck now, and all such
    links saturate at once, their flows fixed at their shares.  This is exact:
    flows fixed elsewhere cross none of those links and fixing flows never
    lowers a share, so the scalar filling reaches each of them at that same
    share (Bertsekas & Gallager 6.5.2; equal but for rounding).  The global
    bottleneck is always one, so every round fixes flows; the rounds are the
    length of the longest chain of bottlenecks (a few on a fat-tree, even under
    ECMP collisions), each a few numpy passes over the unfixed (flow, link) pairs.
    """
    n = paths.shape[0]
    links = bandwidth.size  # indexed by the fabric's own link numbers: no renumbering (a sort) per call
    rows = np.where(paths >= 0, paths, links).astype(np.int64)  # ``links`` pads a short path
    weight = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    # each (flow, link) entry's part of the flow's rate: 1 on a path (0 on the padding, which counts nothing)
    coef = (paths >= 0).astype(np.float64) if coefs is None else np.asarray(coefs, dtype=np.float64)
    cap = np.append(bandwidth.astype(np.float64), np.inf)
    cnt = np.bincount(rows.ravel(), (weight[:, None] * coef).ravel(), minlength=links + 1)
    cnt[links] = 0.0
    rates = np.zeros(n)
    flows = np.arange(n)  # the unfixed flows, whose rows ``rows`` and weights ``weight`` still hold
    # Per round a few numpy calls over the unfixed flows' (flow, link) pairs; the flows fixed leave the arrays.
    # The sums over the fixed flows' pairs add what summing over all pairs with zeros for the others adds, in
    # the same order (mesh-4x4x4 under MultiTree: nine rounds a filling over hundreds of flows, most fixed in
    # the first few).
    with np.errstate(divide="ignore", invalid="ignore"):
        while flows.size:
            share = cap / cnt  # inf for the padding and for links without unfixed flows
            shares = share[rows]
            least = shares.min(axis=1)  # each flow's bottleneck share now
            # a link is a bottleneck if none of its flows has a smaller share elsewhere
            above = np.bincount(rows[shares > (least * (1 + SAME_INSTANT))[:, None]], minlength=links + 1)
            bottleneck = above == 0
            bottleneck[links] = False
            take = bottleneck[rows].any(axis=1)
            fixed, used, fixed_least = rows[take].ravel(), weight[take][:, None] * coef[take], least[take]
            rates[flows[take]] = fixed_least
            cnt -= np.bincount(fixed, used.ravel(), minlength=links + 1)
            cap -= np.bincount(fixed, (used * fixed_least[:, None]).ravel(), minlength=links + 1)
            cnt[links] = 0.0  # the padding counts no flows
            cap[cnt <= _EMPTY] = np.inf
            keep = ~take
            rows, weight, coef, flows = rows[keep], weight[keep], coef[keep], flows[keep]
    return rates


@dataclass(slots=True)
class Route:
    """A connection's route as the fabric uses it: paths as link indices, its links once, and the latency of
    its slowest path.  With ``coefs``, each path is a flow that puts those fractions of its rate on its links
    (a message sprayed over more paths than are listed, as one flow over all their links); else all of it."""

    paths: tuple[tuple[int, ...], ...]
    latency: float
    links: tuple[int, ...]
    coefs: tuple[tuple[float, ...], ...] | None = None


def make_route(paths: tuple[tuple[int, ...], ...], latency: float,
               coefs: tuple[tuple[float, ...], ...] | None = None) -> Route:
    """A :class:`Route` of ``paths`` (each a tuple of link indices, at least one link), with ``coefs`` per path
    where a path's flow puts only a fraction of its rate on a link."""
    return Route(paths, latency, tuple(dict.fromkeys(link for path in paths for link in path)), coefs)


class Fabric:
    """The flows on the wire and their max-min fair rates; messages come and go, flows end by themselves.

    A message of k paths is k flows, one per path, each carrying an even share
    (a path with fractions, :attr:`Route.coefs`, puts only those on its links).
    A flow keeps its bytes left at time ``last``, its rate and its finish time
    ``fin`` (inf for a free slot).  The caller adds messages (:meth:`add`),
    asks when the next flow ends (:meth:`next_end`), retires the flows that end
    at an instant (:meth:`finish`), forgets messages whose flows all ended
    (:meth:`close`) and, once per instant, has the touched components
    reallocated (:meth:`reallocate`).
    """

    def __init__(self, bandwidth: list[float], messages: int, record: bool) -> None:
        self.bandwidth = bandwidth
        self.bandwidth_np = np.asarray(bandwidth, dtype=np.float64)
        self.rem = np.zeros(0)  # bytes left at time ``last``
        self.rate = np.zeros(0)
        self.last = np.zeros(0)
        self.fin = np.zeros(0)
        self.alive = np.zeros(0, dtype=bool)
        self.msg = np.zeros(0, dtype=np.int64)  # the message (its send's global id)
        self.pid = np.zeros(0, dtype=np.int64)  # the flow's path, by its id (see ``path_ids``)
        # with ``record``: (start, bytes) of each flow sending, and (send, path id, start, bytes) of each ended one
        self.begun: dict[int, tuple[float, float]] | None = {} if record else None
        self.ended: list[tuple[int, int, float, float]] = []
        self.free: list[int] = []
        self.mark = np.zeros(max(messages, 1), dtype=bool)  # scratch: messages of the components reallocated
        self.link_msgs: list[set[int]] = [set() for _ in bandwidth]
        self.route: dict[int, Route] = {}  # by message
        self.flows: dict[int, dict[int, int]] = {}  # by message: its flows sending, slot -> path id
        self.pending: list[tuple[int, Route, float]] = []  # messages added since the last reallocation
        self.touched: set[int] = set()  # links whose components must be reallocated
        self.scratch_cap = [0.0] * len(bandwidth)
        self.scratch_cnt = [0.0] * len(bandwidth)
        # Rates depend only on the multiset of paths on the wire (flows on one path get one rate), so an
        # instant at which as many flows start on each path as end on it (a connection's next message
        # following its last, the common case under tree packing) changes no rate: the new flows get the
        # rate of their path, and neither the component search nor a filling is needed.
        # each path that carried a flow, numbered from 0 (a path with fractions by the path and its fractions)
        self.path_ids: dict[object, int] = {}
        self.paths: list[tuple[int, ...]] = []  # by path id
        self.fractions: dict[int, tuple[float, ...]] = {}  # by path id, where a flow puts a fraction on its links
        self.path_rate = np.zeros(64)  # by path id: the rate of the flows on that path (when there are some)
        # by path id: the path's links, -1 after its last; the vector filling gets each distinct path once,
        # weighted by its flows (tree packing and MultiTree put tens of flows on one path)
        self.path_rows = np.full((64, 1), -1, dtype=np.int64)
        self.path_coefs = np.zeros((64, 1))  # by path id: the fraction of a flow's rate on each link of its row
        self.delta: dict[int, int] = {}  # by path id: flows started less flows ended since the last reallocation
        self.skips = 0  # component searches still to skip (see SEARCH_SKIPS)
        self.backoff = 0  # searches skipped after the last one that gave up

    # ---- messages on and off the wire

    def add(self, send: int, route: Route, share: float) -> None:
        """Message ``send`` starts: a flow of ``share`` bytes per path (given slots at :meth:`reallocate`)."""
        self.pending.append((send, route, share))
        self.route[send] = route
        link_msgs = self.link_msgs
        for link in route.links:
            link_msgs[link].add(send)
        self.touched.add(route.links[0])  # the search reaches the message's other links through it

    def next_end(self) -> float:
        """When the next flow sends its last byte (inf: none is sending)."""
        return float(self.fin.min()) if self.fin.size else float("inf")

    def finish(self, limit: float) -> list[tuple[float, int]]:
        """Retire the flows that end by ``limit``; return the messages whose last flow ended, as (time, send),
        in the order the instant handles them: by that flow's end, then by send."""
        ended = np.flatnonzero(self.fin <= limit)
        times = self.fin[ended]
        if ended.size > 1:
            order = np.argsort(times, kind="stable")
            ended, times = ended[order], times[order]
        msgs = self.msg[ended].tolist()
        delta = self.delta
        for pid in self.pid[ended].tolist():
            delta[pid] = delta.get(pid, 0) - 1
        self.alive[ended] = False
        self.fin[ended] = np.inf
        self.rate[ended] = 0.0
        slots = ended.tolist()
        self.free.extend(slots)
        done: list[tuple[float, int]] = []
        flows = self.flows
        for slot, m, t in zip(slots, msgs, times.tolist()):
            mine = flows[m]
            pid = mine.pop(slot)
            if self.begun is not None:
                self.ended.append((m, pid, *self.begun.pop(slot)))
            if mine:
                # the message keeps its other paths' links (its component may only be larger than need be,
                # which changes no rate); the others on this path may speed up
                self.touched.add(self.paths[pid][0])
            else:
                done.append((t, m))  # its last flow: the latest of its flows ending now
        done.sort()
        return done

    def close(self, send: int) -> float:
        """Forget a message whose flows have all ended; returns its latency."""
        route = self.route.pop(send)
        del self.flows[send]
        link_msgs = self.link_msgs
        for link in route.links:
            link_msgs[link].discard(send)
        self.touched.update(route.links)
        return route.latency

    # ---- fair shares

    def _grow(self, need: int) -> None:
        """Room for ``need`` more flows."""
        if len(self.free) >= need:
            return
        size = self.alive.size
        more = max(size, need - len(self.free), 64)
        for name in ("rem", "rate", "last", "msg", "pid"):
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.zeros(more, dtype=old.dtype)]))
        self.fin = np.concatenate([self.fin, np.full(more, np.inf)])
        self.alive = np.concatenate([self.alive, np.zeros(more, dtype=bool)])
        self.free[:0] = range(size + more - 1, size - 1, -1)  # low slots are taken first

    def _materialise(self, now: float) -> np.ndarray:
        """Give the messages added since the last reallocation their flow slots; returns those slots."""
        pending = self.pending
        counts = [len(route.paths) for _, route, _ in pending]
        total = sum(counts)
        self._grow(total)
        free = self.free
        taken = free[len(free) - total:]
        del free[len(free) - total:]
        slots = np.array(taken, dtype=np.int64)
        self.rem[slots] = np.repeat([share for _, _, share in pending], counts)
        self.msg[slots] = np.repeat([send for send, _, _ in pending], counts)
        self.rate[slots] = 0.0
        self.last[slots] = now
        self.alive[slots] = True
        path_ids, delta = self.path_ids, self.delta
        pids: list[int] = []
        at = 0
        for (send, route, share), k in zip(pending, counts):
            mine = taken[at:at + k]
            if self.begun is not None:
                self.begun.update((slot, (now, share)) for slot in mine)
            at += k
            first = len(pids)
            for i, path in enumerate(route.paths):
                coefs = None if route.coefs is None else route.coefs[i]
                pid = path_ids.get(path if coefs is None else (path, coefs))
                if pid is None:
                    pid = self._new_path(path, coefs)
                pids.append(pid)
                delta[pid] = delta.get(pid, 0) + 1
            self.flows[send] = dict(zip(mine, pids[first:]))
        self.pid[slots] = pids
        pending.clear()
        return slots

    def _new_path(self, path: tuple[int, ...], coefs: tuple[float, ...] | None) -> int:
        """Number a path not seen before (with its fractions, if any), and keep its row for the vector filling."""
        pid = self.path_ids[path if coefs is None else (path, coefs)] = len(self.paths)
        self.paths.append(path)
        if coefs is not None:
            self.fractions[pid] = coefs
        rows = self.path_rows
        if pid >= rows.shape[0] or len(path) > rows.shape[1]:
            height, width = max(2 * rows.shape[0], pid + 1), max(rows.shape[1], len(path))
            grown = np.full((height, width), -1, dtype=np.int64)
            grown[:rows.shape[0], :rows.shape[1]] = rows
            self.path_rows = rows = grown
            grown_coefs = np.zeros((height, width))
            grown_coefs[:self.path_coefs.shape[0], :self.path_coefs.shape[1]] = self.path_coefs
            self.path_coefs = grown_coefs
            self.path_rate = np.concatenate([self.path_rate, np.zeros(height - self.path_rate.size)])
        rows[pid, :len(path)] = path
        self.path_coefs[pid, :len(path)] = 1.0 if coefs is None else coefs
        return pid

    def _components(self) -> list[list[int]] | None:
        """The messages of each component holding a touched link; None once the search passes its budget."""
        link_msgs, route = self.link_msgs, self.route
        seen_links: set[int] = set()
        seen: set[int] = set()
        comps: list[list[int]] = []
        for start in self.touched:
            if start in seen_links or not link_msgs[start]:
                continue
            seen_links.add(start)
            stack = [start]
            comp: list[int] = []
            while stack:
                for m in link_msgs[stack.pop()]:
                    if m in seen:
                        continue
                    seen.add(m)
                    comp.append(m)
                    for other in route[m].links:
                        if other not in seen_links:
                            seen_links.add(other)
                            stack.append(other)
                if len(seen_links) > SEARCH_LINKS:
                    return None
            comps.append(comp)
        return comps

    def reallocate(self, now: float) -> None:
        """Recompute the fair rates of every component in which a flow started or ended since the last call."""
        new = self._materialise(now) if self.pending else None
        same = self._same_paths()
        delta, self.delta = self.delta, {}
        if same:  # the same rates as after the last call (see ``path_rate``): new flows take their path's
            self.touched.clear()
            if new is not None:
                self._apply(new, self.path_rate[self.pid[new]], now)
            return
        if self.skips:
            self.skips -= 1
            comps = None
        else:
            comps = self._components()
            if comps is None:
                self.skips = self.backoff = min(2 * self.backoff or 1, SEARCH_SKIPS)
            else:
                self.backoff = 0
        self.touched.clear()
        if comps is None:
            slots = np.flatnonzero(self.alive)
        else:
            flows = self.flows
            if sum(len(flows[m]) for comp in comps for m in comp) <= SCALAR_FLOWS:
                rates: dict[int, float] = {}
                for comp in comps:
                    rates.update(self._scalar_rates(comp))
                if rates:
                    self._apply(np.fromiter(rates, np.int64, len(rates)),
                                np.fromiter(rates.values(), np.float64, len(rates)), now)
                return
            members = [m for comp in comps for m in comp]
            mark = self.mark
            mark[members] = True
            slots = np.flatnonzero(self.alive & mark[self.msg])
            mark[members] = False
        if slots.size:
            pids = self.pid[slots]
            weight = np.bincount(pids)  # flows per path
            paths = np.flatnonzero(weight)
            path_rates = np.empty(weight.size)
            path_rates[paths] = self._refill(paths, weight, delta)
            self._apply(slots, path_rates[pids], now)

    def _refill(self, paths: np.ndarray, weight: np.ndarray, delta: dict[int, int]) -> np.ndarray:
        """Fair rates of the flows on ``paths`` (``weight[id]`` flows on path ``id``), given ``delta`` (flows
        started less flows ended per path since the last reallocation): the flows that no change can have
        reached keep their rates, and the filling runs on the others alone, over what those leave of the links.

        Progressive filling fixes flows in order of rate, so the new filling retraces the old one below a
        level theta, and every unchanged path whose rate is below it keeps that rate.  Below level s the
        filling is the same as long as no link saturates earlier than it did: no link of a path that lost
        flows saturated below their rate (they would have been fixed there); a link whose unchanged flows (n
        of them, using U of its bandwidth c) gain a flows on added paths has a fill at s of at most
        min(U, n s) + a s, so it cannot saturate below max((c - U) / a, c / (n + a)).  Where a change's
        cascade is short (ibm-s822lc-48x4 under tree packing) most flows keep their rates and the filling gets
        a fraction of the rows.
        """
        old, bandwidth = self.path_rate, self.bandwidth_np
        ids = np.fromiter(delta, np.int64, len(delta))
        step = np.fromiter(delta.values(), np.int64, len(delta))
        changed = np.zeros(len(self.path_ids), dtype=bool)
        changed[ids[step != 0]] = True
        rows, coefs = self.path_rows[paths], self.path_coefs[paths]
        link_sums = self._link_sums(rows, coefs)
        gone = ids[step < 0]
        theta = float(old[gone].min()) if gone.size else np.inf
        grown, more = ids[step > 0], step[step > 0].astype(np.float64)
        if grown.size:
            before = weight.astype(np.float64)  # flows on each path both before and after
            inside = grown < before.size
            before[grown[inside]] -= more[inside]
            added = self._link_sums(self.path_rows[grown], self.path_coefs[grown])(more)
            hit = np.flatnonzero(added)
            a, c = added[hit], bandwidth[hit]
            n, used = link_sums(before[paths])[hit], link_sums(before[paths] * old[paths])[hit]
            theta = min(theta, float(np.maximum((c - used) / a, c / (n + a)).min()))
        keep = ~changed[paths] & (old[paths] < theta * (1 - _THETA_MARGIN))
        if keep.any():
            rest = ~keep
            left = np.maximum(bandwidth - link_sums(np.where(keep, weight[paths] * old[paths], 0.0)), 0.0)
            got = fair_rates_vector(rows[rest], left, weight[paths[rest]], coefs[rest])
            if (got > 0).all():  # else rounding starved a flow: fill from scratch
                out = old[paths]
                out[rest] = got
                return out
        return fair_rates_vector(rows, bandwidth, weight[paths], coefs)

    def _link_sums(self, rows: np.ndarray, coefs: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """For paths given as ``rows`` (link indices, -1 after the last) with their flows' fractions ``coefs``:
        values per path (rates, flows) -> sums per link, each value times its fraction on the link."""
        on = rows >= 0
        links, fractions, per_row, size = rows[on], coefs[on], on.sum(axis=1), self.bandwidth_np.size
        return lambda values: np.bincount(links, np.repeat(values, per_row) * fractions, minlength=size)

    def _same_paths(self) -> bool:
        """Whether as many flows are on each path as after the last reallocation (rates are a function of that
        multiset of paths alone: max-min fair rates are unique, and flows on one path get one rate)."""
        return not any(self.delta.values())

    def _scalar_rates(self, comp: list[int]) -> dict[int, float]:
        """Fair rates of one component's flows by :func:`fair_rates`, by slot."""
        flow_links: dict[int, tuple[int, ...]] = {}
        link_flows: dict[int, list[int]] = {}
        flow_coefs: dict[int, tuple[float, ...]] = {}
        flows, paths, fractions = self.flows, self.paths, self.fractions
        for m in comp:
            for slot, pid in flows[m].items():
                flow_links[slot] = path = paths[pid]
                if pid in fractions:
                    flow_coefs[slot] = fractions[pid]
                for link in path:
                    found = link_flows.get(link)
                    if found is None:
                        link_flows[link] = [slot]
                    else:
                        found.append(slot)
        return fair_rates(list(flow_links), list(link_flows), flow_links, link_flows, self.bandwidth,
                          self.scratch_cap, self.scratch_cnt, flow_coefs)

    def _apply(self, slots: np.ndarray, rates: np.ndarray, now: float) -> None:
        """New rates for ``slots``: the flows whose rate changed (beyond rounding) get a new finish time."""
        self.path_rate[self.pid[slots]] = rates
        old = self.rate[slots]
        changed = np.abs(rates - old) > SAME_INSTANT * old
        if not changed.all():
            slots, rates, old = slots[changed], rates[changed], old[changed]
        left = np.maximum(self.rem[slots] - old * (now - self.last[slots]), 0.0)
        self.rem[slots] = left
        self.last[slots] = now
        self.rate[slots] = rates
        self.fin[slots] = now + left / rates


class Unshared:
    """:class:`Fabric`'s interface for flows that share nothing: each at its path's narrowest bandwidth, the most
    any fair share allows it, so a message's last byte is out a fixed time after it starts (the simulator's
    contention-free lower bound).  A heap of those times, no rates: thousands of messages at once cost no
    more than a few."""

    def __init__(self, bandwidth: list[float]) -> None:
        self.bandwidth = bandwidth
        self.narrowest: dict[object, float] = {}  # by path (and its fractions, where it has some)
        self.ends: list[tuple[float, int]] = []  # (when its last byte is out, send)
        self.route: dict[int, Route] = {}  # by message
        self.pending: list[tuple[int, Route, float]] = []  # messages added since the last reallocation
        self.touched: set[int] = set()  # always empty: nothing to reallocate
        self.ended: list[tuple[int, int, float, float]] = []  # never recorded

    def add(self, send: int, route: Route, share: float) -> None:
        """Message ``send`` starts: a flow of ``share`` bytes per path (timed at :meth:`reallocate`)."""
        self.pending.append((send, route, share))
        self.route[send] = route

    def reallocate(self, now: float) -> None:
        """Time the messages added since the last call from ``now``."""
        narrowest, bandwidth = self.narrowest, self.bandwidth
        for send, route, share in self.pending:
            slowest = 0.0
            for i, path in enumerate(route.paths):
                coefs = None if route.coefs is None else route.coefs[i]
                key = path if coefs is None else (path, coefs)
                rate = narrowest.get(key)
                if rate is None:
                    rate = narrowest[key] = min(bandwidth[link] for link in path) if coefs is None else \
                        min(bandwidth[link] / c for link, c in zip(path, coefs))
                slowest = max(slowest, share / rate)
            heapq.heappush(self.ends, (now + slowest, send))
        self.pending.clear()

    def next_end(self) -> float:
        """When the next message sends its last byte (inf: none is sending)."""
        return self.ends[0][0] if self.ends else float("inf")

    def finish(self, limit: float) -> list[tuple[float, int]]:
        """The messages whose last byte is out by ``limit``, as (time, send), by time then send."""
        ends, done = self.ends, []
        while ends and ends[0][0] <= limit:
            done.append(heapq.heappop(ends))
        return done

    def close(self, send: int) -> float:
        """Forget a message whose last byte is out; returns its latency."""
        return self.route.pop(send).latency
