"""The broker port, and a paper broker that fills orders at the feed's prices.

Whatever a broker does to an order comes back as a `lanes.events.BrokerReport` through
the ``report`` callback (the engine records each as an input event of the agent).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.base.clock import Clock
from gateway.base.tasks import spawn
from gateway.market.events import Candle, MarketEvent, Tick
from lanes.events import BrokerReport, OrderIntent

log = logging.getLogger("gateway.market.broker")

Report = Callable[[str, BrokerReport], Awaitable[None]]
"""``report(agent_id, report)``: hand a broker report to the gateway."""
Status = Literal["filled", "partially_filled", "cancelled", "rejected"]
REMEMBERED_ORDERS = 10_000
"""How many closed order ids the paper broker remembers (to ignore repeated places)."""


class Broker(Protocol):
    """Places and cancels orders; reports fills and cancels through its report callback."""

    async def place(self, agent_id: str, order_id: str, intent: OrderIntent) -> None:
        """Place ``intent`` as order ``order_id`` of ``agent_id`` (idempotent by order id)."""

    async def cancel(self, agent_id: str, order_id: str) -> None:
        """Cancel an open order; no-op for an unknown or already closed one."""


@dataclass(frozen=True, slots=True)
class PaperOrder:
    """An open order of the paper broker."""

    agent_id: str
    order_id: str
    intent: OrderIntent


class PaperBroker:
    """Fills orders against the last prices of the market feed, instantly and in full.

    - A market order fills at the last price of its symbol (a tick's price or a candle's
      close); with no price yet it rests until the next price arrives, then fills at it.
    - A limit order that is marketable when placed (buy: last <= limit, sell: last >=
      limit) fills at once at the last price; otherwise it rests and fills at its limit
      when a tick reaches it (buy: price <= limit, sell: price >= limit).
    - `cancel` closes an open order of that agent with a ``cancelled`` report.

    The paper broker keeps no positions. A failing ``report`` is logged and does not stop
    the other reports.
    """

    def __init__(self, report: Report, clock: Clock) -> None:
        self._report = report
        self._clock = clock
        self._last: dict[str, float] = {}
        self._open: dict[str, PaperOrder] = {}
        self._by_symbol: dict[str, dict[str, PaperOrder]] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()

    def last_price(self, symbol: str) -> float | None:
        """The last price seen for ``symbol``, if any."""
        return self._last.get(symbol)

    def open_orders(self) -> list[PaperOrder]:
        """Orders still open, oldest first."""
        return list(self._open.values())

    async def place(self, agent_id: str, order_id: str, intent: OrderIntent) -> None:
        """Place an order; fill it now if it can be, else let it rest.

        Placing an order id that is open or was closed recently does nothing.
        """
        if order_id in self._open or order_id in self._closed:
            return
        order = PaperOrder(agent_id, order_id, intent)
        if intent.order_type == "limit" and intent.limit_price is None:
            self._close(order_id)
            await self._send(order, "rejected", reason="a limit order needs a limitPrice")
            return
        last = self._last.get(intent.symbol)
        if last is not None and _marketable(intent, last):
            self._close(order_id)
            await self._send(order, "filled", intent.qty, last)
            return
        self._open[order_id] = order
        self._by_symbol.setdefault(intent.symbol, {})[order_id] = order

    async def cancel(self, agent_id: str, order_id: str) -> None:
        """Cancel an open order of ``agent_id``; unknown or closed orders are ignored."""
        order = self._open.get(order_id)
        if order is None or order.agent_id != agent_id:
            return
        self._close(order_id)
        await self._send(order, "cancelled")

    async def on_market_event(self, event: MarketEvent) -> None:
        """Take a price from a tick or candle, fill the resting orders it reaches, and
        report the fills."""
        for order, price in self._take(event):
            await self._send(order, "filled", order.intent.qty, price)

    def observe(self, event: MarketEvent) -> asyncio.Task[None] | None:
        """`on_market_event` for a synchronous caller: the fills are decided now, in event
        order, and reported from a task (returned, or None when nothing filled)."""
        fills = self._take(event)
        if not fills:
            return None
        return spawn(self._send_fills(fills), "paper-broker-fills")

    async def _send_fills(self, fills: list[tuple[PaperOrder, float]]) -> None:
        for order, price in fills:
            await self._send(order, "filled", order.intent.qty, price)

    def _take(self, event: MarketEvent) -> list[tuple[PaperOrder, float]]:
        """Record the event's price; close and return the resting orders it fills."""
        if isinstance(event, Tick):
            price = event.price
        elif isinstance(event, Candle):
            price = event.close
        else:
            return []
        self._last[event.symbol] = price
        resting = self._by_symbol.get(event.symbol)
        if not resting:
            return []
        fills: list[tuple[PaperOrder, float]] = []
        for order in list(resting.values()):
            intent = order.intent
            if intent.order_type == "market":
                fills.append((order, price))
            elif isinstance(event, Tick) and _marketable(intent, price):
                assert intent.limit_price is not None
                fills.append((order, intent.limit_price))
        for order, _ in fills:
            self._close(order.order_id)
        return fills

    def _close(self, order_id: str) -> None:
        order = self._open.pop(order_id, None)
        if order is not None:
            resting = self._by_symbol[order.intent.symbol]
            del resting[order_id]
            if not resting:
                del self._by_symbol[order.intent.symbol]
        self._closed[order_id] = None
        if len(self._closed) > REMEMBERED_ORDERS:
            self._closed.popitem(last=False)

    async def _send(
        self,
        order: PaperOrder,
        status: Status,
        filled_qty: float = 0.0,
        price: float | None = None,
        reason: str | None = None,
    ) -> None:
        report = BrokerReport(
            at=self._clock.now_ms(), order_id=order.order_id, status=status,
            filled_qty=filled_qty, price=price, reason=reason,
        )
        try:
            await self._report(order.agent_id, report)
        except Exception:
            log.exception("reporting %s of order %s failed", status, order.order_id)


def _marketable(intent: OrderIntent, price: float) -> bool:
    if intent.order_type == "market":
        return True
    limit = intent.limit_price
    if limit is None:
        return False
    return price <= limit if intent.side == "buy" else price >= limit
