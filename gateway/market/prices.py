"""Prices and money in the server's words, as the panel shows them: a price rounded to a whole
number of its symbol's ticks (``[market]``) with the tick's decimals ("64,012.50" at a tick
of 0.01, "64,012.5" at 0.5, "1.0842" at 0.0001), and money (notional, P&L, spend) to the
cent ("12,345.68"). Halves round away from zero. Pure: no clock, no I/O.

The story, the CLI timeline, the drill-down, alerts and the agents' tool answers word every
price through `PriceWords`, so that one price reads the same everywhere."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal

from lanes.events import ApprovalRequested, Event, OrderAccepted, OrderIntent

TICK = 0.01
"""The tick of a symbol with none configured."""
MONEY_DECIMALS = 2
"""Money (notional, P&L, spend) is worded to the cent."""
MAX_DECIMALS = 12
ORDERS_KEPT = 50_000
"""Orders whose symbol a `PriceWords` remembers (the newest; an older order's fill is worded
with the default tick)."""


def tick_decimals(tick: float) -> int:
    """The decimals of a tick: 2 for 0.01 and 0.25, 1 for 0.5, 0 for 1 and 5."""
    exponent = Decimal(repr(tick)).normalize().as_tuple().exponent
    assert isinstance(exponent, int)  # (a tick is finite)
    return min(MAX_DECIMALS, max(0, -exponent))


def _rounded(value: float, step: Decimal, decimals: int) -> str:
    if not math.isfinite(value):
        return str(value)
    steps = (Decimal(repr(value)) / step).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return f"{steps * step:,.{decimals}f}"


def price_text(value: float, tick: float = TICK) -> str:
    """``value`` rounded to a whole number of ``tick`` s, with the tick's decimals."""
    return _rounded(value, Decimal(repr(tick)), tick_decimals(tick))


def money_text(value: float) -> str:
    """An amount of money (notional, P&L, spend) to the cent, with thousands separators."""
    return _rounded(value, Decimal(1).scaleb(-MONEY_DECIMALS), MONEY_DECIMALS)


class PriceWords:
    """Each symbol's tick (and ``tick``, that of the rest), and the symbol of each order met
    (`learn`): fills and broker reports name the order only."""

    def __init__(self, tick: float = TICK, ticks: Mapping[str, float] | None = None,
                 orders: OrderedDict[str, str] | None = None) -> None:
        self.tick = tick
        self.ticks = dict(ticks or {})
        self.orders: OrderedDict[str, str] = OrderedDict() if orders is None else orders
        """Order id -> its symbol, the newest `ORDERS_KEPT`."""

    def with_orders(self, orders: OrderedDict[str, str]) -> PriceWords:
        """The same ticks, with the order symbols of ``orders`` (shared, not copied)."""
        return PriceWords(self.tick, self.ticks, orders)

    def tick_of(self, symbol: str | None) -> float:
        """The smallest step of ``symbol``'s price."""
        return self.tick if symbol is None else self.ticks.get(symbol, self.tick)

    def learn(self, event: Event) -> None:
        """Remember the symbol of an order an event places or sets waiting."""
        if isinstance(event, OrderAccepted | ApprovalRequested):
            self.note(event.order_id, event.intent.symbol)

    def note(self, order_id: str, symbol: str) -> None:
        """Remember that order ``order_id`` is of ``symbol``."""
        self.orders[order_id] = symbol
        if len(self.orders) > ORDERS_KEPT:
            self.orders.popitem(last=False)

    def price(self, value: float, symbol: str | None) -> str:
        """A price of ``symbol`` in words, to its tick."""
        return price_text(value, self.tick_of(symbol))

    def of_order(self, value: float, order_id: str) -> str:
        """A price of order ``order_id`` (of the symbol `learn` met it with) in words."""
        return self.price(value, self.orders.get(order_id))

    def intent(self, intent: OrderIntent) -> str:
        """An order intent in words: "buy 0.25 BTCUSD at market" or "sell 1 ETHUSD limit at
        3,120.50"."""
        limit = intent.limit_price
        at = "at market" if limit is None else \
            f"{intent.order_type} at {self.price(limit, intent.symbol)}"
        return f"{intent.side} {intent.qty:g} {intent.symbol} {at}"

    @staticmethod
    def money(value: float) -> str:
        """An amount of money in words (`money_text`)."""
        return money_text(value)


PLAIN = PriceWords()
"""Every symbol at the default tick and no order known, where no ``[market]`` is at hand
(shared: never `learn` into it)."""
