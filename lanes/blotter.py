"""The blotter: an agent's orders, fills, cancels, rejections and positions, folded from the
order events of its stream (a projection of the log, like `lanes.calltree`).

Decisions carry no time of their own: each happens at the time of the input that caused it,
so the fold is given that input before its order decisions (`Blotter.add` of an input only
remembers it). Every list of what happened keeps the newest `HISTORY` entries; open orders
and positions are always complete.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from lanes.events import (
    Event,
    OrderAccepted,
    OrderCancelRequested,
    OrderClosed,
    OrderFilled,
    OrderRejected,
    RequestReceived,
    is_input,
)

ORDER_EVENT_TYPES = frozenset(cls.__name__ for cls in (
    OrderAccepted, OrderRejected, OrderCancelRequested, OrderFilled, OrderClosed))
"""The decision types a blotter is folded from (with the input before each; the other events
can be left undecoded)."""
HISTORY = 1_000
"""Fills, cancels, rejections and closed orders kept per agent (the newest)."""
FLAT = 1e-9
"""A net quantity this close to zero is a flat position (fills are floats)."""

Side = Literal["buy", "sell"]


@dataclass(slots=True)
class OrderRow:
    """One order the trading gate accepted: open until the broker closes it."""

    order_id: str
    run_id: str
    symbol: str
    side: Side
    qty: float
    order_type: str
    limit_price: float | None
    placed_at: int
    decision_price: float | None = None
    """The price the gateway had for its symbol when the run decided it (None: none)."""
    filled_qty: float = 0.0
    priced_qty: float = 0.0
    """Of ``filled_qty``, what was filled at a known price."""
    cost: float = 0.0
    """Sum of price x qty of its priced fills."""
    status: Literal["open", "filled", "cancelled", "rejected"] = "open"
    closed_at: int | None = None
    reason: str | None = None
    cancel_by: str | None = None
    """Who asked to cancel it: the principal of the request (else its id), or ``broker``
    for a cancel nobody asked for."""
    cancel_request: str | None = None
    cancel_action: str | None = None
    cancel_at: int | None = None
    flatten_by: str | None = None
    """An operator's flatten placed it (no run did): the principal of its request (else
    the request's id)."""

    @property
    def avg_price(self) -> float | None:
        """The average price of its priced fills (None before any)."""
        return self.cost / self.priced_qty if self.priced_qty > 0 else None


@dataclass(frozen=True, slots=True)
class Fill:
    """Part or all of an order filled (``price`` None: the broker gave none)."""

    at: int
    order_id: str
    symbol: str
    side: Side
    qty: float
    price: float | None
    decision_price: float | None = None
    """The price the gateway had when the order was decided (`OrderRow.decision_price`)."""

    @property
    def slippage(self) -> float | None:
        """Per unit, how much worse than the decision price it filled (negative: better)."""
        if self.price is None or self.decision_price is None:
            return None
        moved = self.price - self.decision_price
        return moved if self.side == "buy" else -moved


@dataclass(frozen=True, slots=True)
class Rejection:
    """An order refused: by the trading gate (no order id: it never opened) or by the
    broker (the order closed ``rejected``)."""

    at: int
    source: Literal["gate", "broker"]
    run_id: str
    order_id: str | None
    symbol: str
    side: Side
    qty: float
    reason: str


@dataclass(slots=True)
class Position:
    """The net quantity of one symbol (bought minus sold) and what it cost on average.

    ``avg_price`` is the average price of the fills that opened the position now held
    (reducing fills leave it, a fill past flat starts it again at that fill's price); None
    when flat, or when a fill that added to it had no price."""

    symbol: str
    net_qty: float = 0.0
    avg_price: float | None = None
    bought_qty: float = 0.0
    sold_qty: float = 0.0
    fills: int = 0
    realized: float = 0.0
    """P&L realized by the fills that reduced it, against ``avg_price`` (average cost)."""
    unpriced: int = 0
    """Fills without a price, or that reduced a position of unknown cost: while any, the
    P&L is not known in full."""

    def apply(self, signed: float, price: float | None) -> None:
        """Take one fill (``signed``: positive bought, negative sold)."""
        before = self.net_qty
        after = before + signed  # (the same sum as `lanes.evolve`: the same floats)
        if abs(before) > FLAT and (before > 0) != (signed > 0):  # it reduced what was held
            closed = min(abs(signed), abs(before))
            if price is None or self.avg_price is None:
                self.unpriced += 1
            else:
                self.realized += (price - self.avg_price) * closed * (1 if before > 0 else -1)
        elif price is None:
            self.unpriced += 1
        if abs(after) <= FLAT:
            self.avg_price = None
        elif abs(before) <= FLAT or (before > 0) != (after > 0):
            self.avg_price = price  # opened, or turned past flat: the rest is at this price
        elif (before > 0) == (signed > 0):  # added to it
            self.avg_price = None if price is None or self.avg_price is None else (
                (self.avg_price * abs(before) + price * abs(signed)) / abs(after))
        self.net_qty = after
        if signed > 0:
            self.bought_qty += signed
        else:
            self.sold_qty -= signed
        self.fills += 1


@dataclass(slots=True)
class Blotter:
    """One agent's orders and positions, folded from its order events."""

    open: dict[str, OrderRow] = field(default_factory=dict)
    """Open orders by id, oldest first."""
    closed: deque[OrderRow] = field(default_factory=lambda: deque(maxlen=HISTORY))
    fills: deque[Fill] = field(default_factory=lambda: deque(maxlen=HISTORY))
    cancels: deque[OrderRow] = field(default_factory=lambda: deque(maxlen=HISTORY))
    """Orders someone asked to cancel (or the broker cancelled), in the order asked."""
    rejections: deque[Rejection] = field(default_factory=lambda: deque(maxlen=HISTORY))
    positions: dict[str, Position] = field(default_factory=dict)
    now: int = 0
    """The time of the last input given: when the decisions after it happened."""
    cause: Event | None = None
    """The last input given (a cancel's request names who asked)."""

    def fold(self, events: Iterable[Event]) -> Blotter:
        """`add` each event, in stream order."""
        for event in events:
            self.add(event)
        return self

    def add(self, event: Event) -> None:
        """Take one event of the stream: an input sets the time of the decisions after it;
        order decisions change the blotter; anything else is ignored."""
        if is_input(event):
            self.now, self.cause = event.at, event
        elif isinstance(event, OrderAccepted):
            intent = event.intent
            prices = getattr(self.cause, "prices", None) or {}
            self.open[event.order_id] = OrderRow(
                event.order_id, event.run_id, intent.symbol, intent.side, intent.qty,
                intent.order_type, intent.limit_price, self.now,
                decision_price=prices.get(intent.symbol),
                flatten_by=None if event.by is None else self._asker(event.by)[0])
        elif isinstance(event, OrderRejected):
            intent = event.intent
            self.rejections.append(Rejection(self.now, "gate", event.run_id, None, intent.symbol,
                                             intent.side, intent.qty, event.reason))
        elif isinstance(event, OrderCancelRequested):
            order = self.open.get(event.order_id)
            if order is not None and order.cancel_at is None:
                order.cancel_request, order.cancel_at = event.by, self.now
                order.cancel_by, order.cancel_action = self._asker(event.by)
                self.cancels.append(order)
        elif isinstance(event, OrderFilled):
            self._filled(event)
        elif isinstance(event, OrderClosed):
            self._closed(event)

    def _asker(self, request_id: str) -> tuple[str, str | None]:
        """Who sent request ``request_id`` (its principal if known) and what it asked."""
        cause = self.cause
        if isinstance(cause, RequestReceived) and cause.request.request_id == request_id:
            action = cause.request.payload.get("action")
            return cause.principal or request_id, None if action is None else str(action)
        return request_id, None

    def _filled(self, event: OrderFilled) -> None:
        order = self.open.get(event.order_id)
        if order is None:  # (a log the engine would refuse: nothing to show it against)
            return
        order.filled_qty += event.qty
        if event.price is not None:
            order.priced_qty += event.qty
            order.cost += event.price * event.qty
        self.fills.append(Fill(self.now, order.order_id, order.symbol, order.side, event.qty,
                               event.price, order.decision_price))
        position = self.positions.get(order.symbol)
        if position is None:
            position = self.positions[order.symbol] = Position(order.symbol)
        position.apply(event.qty if order.side == "buy" else -event.qty, event.price)

    def _closed(self, event: OrderClosed) -> None:
        order = self.open.pop(event.order_id, None)
        if order is None:
            return
        order.status, order.closed_at, order.reason = event.status, self.now, event.reason
        self.closed.append(order)
        if event.status == "rejected":
            self.rejections.append(Rejection(
                self.now, "broker", order.run_id, order.order_id, order.symbol, order.side,
                order.qty, event.reason or "rejected by the broker (no reason given)"))
        elif event.status == "cancelled" and order.cancel_at is None:
            order.cancel_by, order.cancel_at = "broker", self.now
            self.cancels.append(order)
