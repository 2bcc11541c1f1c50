"""Profit and loss: an agent's positions (`lanes.blotter.Position`, folded from its fills)
marked to the market's prices.

Average cost: a fill that adds to a position moves its average price; one that reduces it
realizes ``(fill price - average price) x quantity closed`` (the other way round for a
short); one past flat closes the position and opens the rest at its own price. So for every
sequence of priced fills, realized + unrealized = the cash the fills paid and received plus
what is held at the mark (``tests/lanes/test_pnl.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lanes.blotter import FLAT, Position


@dataclass(frozen=True, slots=True)
class Mark:
    """A symbol's latest price and when it was seen (ms since the epoch)."""

    price: float
    at: int


@dataclass(frozen=True, slots=True)
class PositionPnl:
    """One position marked to a price (None where the price or the cost is not known)."""

    symbol: str
    net_qty: float
    avg_price: float | None
    mark: float | None
    mark_at: int | None
    stale: bool
    """The mark is older than the allowed age (or there is none while something is held)."""
    market_value: float | None
    exposure: float | None
    """Notional held: |net quantity| x mark."""
    unrealized: float | None
    realized: float
    complete: bool
    """False when a fill had no price (or closed a position of unknown cost)."""


@dataclass(frozen=True, slots=True)
class PnlTotals:
    """Sums over some positions (only the parts known; ``complete`` says if all were)."""

    market_value: float
    exposure: float
    unrealized: float
    realized: float
    complete: bool
    stale: bool


def mark(position: Position, seen: Mark | None, now: int, stale_ms: int) -> PositionPnl:
    """``position`` marked to ``seen`` (the latest price of its symbol) at ``now``."""
    net = position.net_qty
    flat = abs(net) <= FLAT
    price = None if seen is None else seen.price
    value = None if price is None else (0.0 if flat else net * price)
    unrealized = 0.0 if flat else (
        None if price is None or position.avg_price is None
        else (price - position.avg_price) * net)
    return PositionPnl(
        symbol=position.symbol, net_qty=0.0 if flat else net, avg_price=position.avg_price,
        mark=price, mark_at=None if seen is None else seen.at,
        stale=not flat and (seen is None or now - seen.at > stale_ms),
        market_value=value, exposure=None if value is None else abs(value),
        unrealized=unrealized, realized=position.realized,
        complete=position.unpriced == 0 and (flat or position.avg_price is not None))


def totals(rows: Iterable[PositionPnl]) -> PnlTotals:
    """The sums of ``rows``."""
    value = exposure = unrealized = realized = 0.0
    complete, stale = True, False
    for row in rows:
        value += row.market_value or 0.0
        exposure += row.exposure or 0.0
        unrealized += row.unrealized or 0.0
        realized += row.realized
        complete = complete and row.complete and row.unrealized is not None
        stale = stale or row.stale
    return PnlTotals(value, exposure, unrealized, realized, complete, stale)


def marks(prices: Mapping[str, tuple[float, int]]) -> dict[str, Mark]:
    """Marks from ``symbol -> (price, at)``."""
    return {symbol: Mark(price, at) for symbol, (price, at) in prices.items()}
