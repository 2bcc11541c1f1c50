"""P&L over HTTP (``GET /api/pnl``): each agent's positions from its blotter (the log),
marked to the latest prices the feed sent (`lanes.pnl`), with totals per agent and for the
desk; prices older than the market book's ``stale_ms`` are marked stale."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.market.book import MarketBook
from gateway.reads.blotter import _Answer
from lanes.blotter import Blotter
from lanes.pnl import Mark, PnlTotals, PositionPnl, mark, totals


class PositionPnlView(_Answer):
    """One position marked to the market (None where the price or cost is unknown)."""

    symbol: str
    net_qty: float
    avg_price: float | None = None
    mark: float | None = None
    """The symbol's latest price from the feed."""
    mark_age_ms: int | None = None
    stale: bool
    """The mark is older than ``staleMs`` (or missing while something is held)."""
    market_value: float | None = None
    exposure: float | None = None
    """Notional held: |net quantity| x mark."""
    unrealized: float | None = None
    realized: float
    complete: bool
    """False when a fill had no price: the P&L is then not known in full."""


class TotalsView(_Answer):
    """Sums of the known parts; ``complete`` false if any part was unknown."""

    market_value: float
    exposure: float
    unrealized: float
    realized: float
    total: float
    """Realized plus unrealized."""
    complete: bool
    stale: bool


class AgentPnlView(_Answer):
    """One agent's positions and totals."""

    agent_id: str
    positions: list[PositionPnlView]
    totals: TotalsView


class PnlView(_Answer):
    """The P&L of the agents in the token's scope and of them all together (the desk)."""

    at: int
    stale_ms: int
    agents: list[AgentPnlView]
    desk: TotalsView


def pnl_view(blotters: Sequence[tuple[str, Blotter]], market: MarketBook, now: int
             ) -> PnlView:
    """The answer for some agents' blotters, marked to ``market``'s prices at ``now``."""
    agents: list[AgentPnlView] = []
    every: list[PositionPnl] = []
    for agent, blotter in blotters:
        rows = []
        for position in sorted(blotter.positions.values(), key=lambda p: p.symbol):
            seen = market.price(position.symbol)
            rows.append(mark(position, None if seen is None else Mark(*seen), now,
                             market.stale_ms))
        every += rows
        agents.append(AgentPnlView(agent_id=agent, positions=[_row(r, now) for r in rows],
                                   totals=_totals(totals(rows))))
    return PnlView(at=now, stale_ms=market.stale_ms, agents=agents,
                   desk=_totals(totals(every)))


def _row(row: PositionPnl, now: int) -> PositionPnlView:
    return PositionPnlView(
        symbol=row.symbol, net_qty=row.net_qty, avg_price=row.avg_price, mark=row.mark,
        mark_age_ms=None if row.mark_at is None else max(0, now - row.mark_at),
        stale=row.stale, market_value=row.market_value, exposure=row.exposure,
        unrealized=row.unrealized, realized=row.realized, complete=row.complete)


def _totals(summed: PnlTotals) -> TotalsView:
    return TotalsView(market_value=summed.market_value, exposure=summed.exposure,
                      unrealized=summed.unrealized, realized=summed.realized,
                      total=summed.realized + summed.unrealized, complete=summed.complete,
                      stale=summed.stale)
