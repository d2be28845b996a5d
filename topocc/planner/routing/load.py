"""What the messages of a plan put on each link, and how long the busiest link needs for it.

One accumulator for every load the planner weighs: the lower bounds that price a
schedule or a stage by its busiest link, and the greedy choices (paths, channels,
rings) that put each next connection where the load after it is least.  A link is
any hashable key the caller routes by (a :class:`~topocc.planner.topology.model.Link`,
its ``(src, dst)`` pair, or an index); what is summed is the caller's unit (bytes,
chunks, a message's parts).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LinkLoad(Generic[K]):
    """An amount summed per link, in the order it is added.

    Every addition is one ``+`` of the amount exactly as given (a route share
    times an amount is multiplied as ``share * amount``), so a load summed here is
    bitwise the one the planner's bounds have always summed, and so are the
    schedules chosen from it.
    """

    __slots__ = ("amounts",)

    def __init__(self, amounts: Mapping[K, float] | None = None) -> None:
        #: Per link, the amount added so far; links never added are absent (their load is 0).
        self.amounts: dict[K, float] = dict(amounts) if amounts is not None else {}

    def add(self, link: K, amount: float) -> None:
        """Put ``amount`` on ``link``."""
        self.amounts[link] = self.amounts.get(link, 0.0) + amount

    def add_along(self, links: Iterable[K], amount: float) -> None:
        """Put ``amount`` on each of ``links`` (a path, or the links every path of a pair crosses)."""
        amounts = self.amounts
        for link in links:
            amounts[link] = amounts.get(link, 0.0) + amount

    def add_fractions(self, links: Iterable[K], fractions: Iterable[float], amount: float) -> None:
        """Put ``fraction * amount`` on each of ``links`` (a flow's links, each with its fraction of the flow)."""
        amounts = self.amounts
        for link, fraction in zip(links, fractions):
            amounts[link] = amounts.get(link, 0.0) + fraction * amount

    def add_shares(self, shares: Mapping[K, float], amount: float) -> None:
        """Put ``share * amount`` on each link of a route's ``shares`` (the fraction of its traffic each carries)."""
        amounts = self.amounts
        for link, share in shares.items():
            amounts[link] = amounts.get(link, 0.0) + share * amount

    def get(self, link: K) -> float:
        """The amount on ``link`` (0 where nothing was added)."""
        return self.amounts.get(link, 0.0)

    def copy(self) -> LinkLoad[K]:
        """An independent accumulator holding the same amounts."""
        return LinkLoad(self.amounts)

    def busiest(self, bandwidth: Callable[[K], float] | None = None) -> float:
        """The most any link carries over its ``bandwidth`` (per link; none: the amounts themselves), or 0 with
        nothing added: with bytes and bytes/s, the seconds no schedule of these messages can beat."""
        if bandwidth is None:
            return max(self.amounts.values(), default=0.0)
        return max((v / bandwidth(link) for link, v in self.amounts.items()), default=0.0)

    def times_after(self, shares: Mapping[K, float], amount: float, bandwidth: Callable[[K], float]) -> list[float]:
        """Per link of a candidate route, its load with the route's ``share * amount`` added over its
        ``bandwidth``, the load itself left as it is (a greedy choice weighs candidates this way)."""
        amounts = self.amounts
        return [(amounts.get(link, 0.0) + share * amount) / bandwidth(link) for link, share in shares.items()]
