"""The blotter over HTTP: each agent's `lanes.blotter.Blotter`, read from the log and kept up
to date by reading only what was appended since, and its answer (``GET /api/orders``,
``GET /api/agents/{id}/orders``; docs/protocol.md, "Orders and positions").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from pydantic import ConfigDict, Field

from gateway.base.quarantine import LogReader
from gateway.errors import BadFrame
from lanes.blotter import HISTORY, ORDER_EVENT_TYPES, Blotter, OrderRow
from lanes.events import INPUT_TYPES
from lanes.requests import WireModel
from store.port import LogReads, RecordedEvent

READ_PAGE = 5_000
"""Events read from a stream at a time while folding it."""
DEFAULT_LIMIT = 100
_INPUT_NAMES = frozenset(t.__name__ for t in INPUT_TYPES)
Side = Literal["buy", "sell"]
T = TypeVar("T")


class _Answer(WireModel):
    """An answer's part: every field is sent (null when none), and so required in its schema."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class OpenOrderView(_Answer):
    """An order still open at the broker."""

    agent_id: str
    order_id: str
    run_id: str
    symbol: str
    side: Side
    qty: float
    filled_qty: float
    order_type: str
    limit_price: float | None = None
    avg_fill_price: float | None = None
    placed_at: int
    """When the trading gate accepted it (ms since the epoch)."""
    age_ms: int
    cancel_requested_by: str | None = None
    """Who asked to cancel it (a principal, or the request id), while that is pending."""
    cancel_requested_at: int | None = None
    flatten_by: str | None = None
    """An operator's flatten placed it, not the agent (``runId`` is empty): who sent it."""


class FillView(_Answer):
    """Part or all of an order filled."""

    agent_id: str
    order_id: str
    symbol: str
    side: Side
    qty: float
    price: float | None = None
    """None when the broker gave no price."""
    at: int
    decision_price: float | None = None
    """The price the gateway had for the symbol when the run decided the order."""
    slippage: float | None = None
    """Per unit, how much worse than ``decision_price`` it filled (negative: better)."""


class CancelView(_Answer):
    """An order someone asked to cancel (``by``: a principal or request id; ``broker`` for a
    cancel nobody asked for), and how it closed (``status`` ``pending`` while still open:
    an order may fill before the cancel reaches the broker)."""

    agent_id: str
    order_id: str
    symbol: str
    side: Side
    qty: float
    filled_qty: float
    by: str
    action: str | None = None
    """The control that asked (``cancel_order``, ``cancel_all``, ``emergency_stop``)."""
    request_id: str | None = None
    requested_at: int
    status: Literal["pending", "cancelled", "filled", "rejected"]
    closed_at: int | None = None


class RejectionView(_Answer):
    """An order refused, with the reason: by the trading gate (``source`` ``gate``, no order
    id: it never opened) or by the broker (``broker``)."""

    agent_id: str
    source: Literal["gate", "broker"]
    run_id: str
    order_id: str | None = None
    symbol: str
    side: Side
    qty: float
    reason: str
    at: int


class PositionView(_Answer):
    """An agent's net quantity of a symbol (bought minus sold), from its fills."""

    agent_id: str
    symbol: str
    net_qty: float
    avg_price: float | None = None
    """Average price of the fills that opened what is held now; None when flat or unknown."""
    bought_qty: float
    sold_qty: float
    fills: int
    realized_pnl: float
    """P&L realized by the fills that reduced it (average cost; ``GET /api/pnl`` marks the
    rest to the market)."""


class BlotterView(_Answer):
    """Orders and positions of some agents, from the log. Open orders oldest first, every
    other list newest first and at most ``limit`` long (``truncated`` says if any was cut)."""

    agents: list[str]
    symbol: str | None = None
    at: int
    """The server's time of the answer (ms since the epoch): ages are counted to it."""
    open_orders: list[OpenOrderView]
    fills: list[FillView]
    cancels: list[CancelView]
    rejections: list[RejectionView]
    positions: list[PositionView]
    limit: int = Field(ge=1)
    truncated: bool


@dataclass(frozen=True, slots=True)
class BlotterQuery:
    """What a blotter request asks for."""

    agent: str | None = None
    symbol: str | None = None
    limit: int = DEFAULT_LIMIT


def parse_query(query: Mapping[str, str], allowed: Sequence[str]) -> BlotterQuery:
    """The blotter parameters of a query string (``agent``, ``symbol``, ``limit``: those in
    ``allowed``); an unknown, repeated or malformed parameter is a `BadFrame`."""
    for name in query:
        if name not in allowed:
            raise BadFrame("invalid", f"unknown parameter {name[:40]!r}; this route takes "
                           + ", ".join(allowed), field=name)
    multi = getattr(query, "getlist", None)
    if multi is not None:
        for name in allowed:
            if len(multi(name)) > 1:
                raise BadFrame("invalid", f"{name} is given more than once", field=name)
    symbol = query.get("symbol") or None
    if symbol is not None and (len(symbol) > 32 or not symbol.isprintable()):
        raise BadFrame("invalid", "symbol must be 1 to 32 printable characters",
                       field="symbol")
    raw = query.get("limit") or None
    limit = DEFAULT_LIMIT
    if raw is not None:
        if not raw.isdecimal() or not 1 <= int(raw) <= HISTORY:
            raise BadFrame("invalid", f"limit must be an integer from 1 to {HISTORY}, got "
                           f"{raw[:40]!r}", field="limit")
        limit = int(raw)
    return BlotterQuery(agent=query.get("agent") or None, symbol=symbol, limit=limit)


@dataclass(slots=True)
class _Folded:
    blotter: Blotter = field(default_factory=Blotter)
    version: int = 0
    cause: RecordedEvent | None = None
    """The last input read, not decoded unless an order decision follows it."""
    given: bool = False


class BlotterBook:
    """Every agent's blotter, each folded from its stream once and then only from the events
    appended since (a cache of a fold of the log, never the source of truth)."""

    def __init__(self) -> None:
        self._folded: dict[str, _Folded] = {}
        self._lock = asyncio.Lock()

    async def blotters(self, store: LogReads, reader: LogReader, agents: Iterable[str],
                       changed: Container[str] | None = None) -> list[tuple[str, Blotter]]:
        """The blotters of ``agents``, each up to date with what its stream holds now (with
        ``changed``: only those are read again, the others are as last read, if ever)."""
        async with self._lock:  # two folds of the same new events would count them twice
            found = []
            for agent in agents:
                folded = self._folded.get(agent)
                if changed is not None and folded is not None and agent not in changed:
                    found.append((agent, folded.blotter))
                else:
                    found.append((agent, await self._catch_up(store, reader, agent)))
            return found

    async def _catch_up(self, store: LogReads, reader: LogReader, agent: str) -> Blotter:
        folded = self._folded.get(agent)
        if folded is None:
            folded = self._folded[agent] = _Folded()
        while True:
            page = await store.read_stream(agent, after_version=folded.version, limit=READ_PAGE)
            for record in page:
                if record.type in _INPUT_NAMES:
                    folded.cause, folded.given = record, False
                elif record.type in ORDER_EVENT_TYPES:
                    if folded.cause is not None and not folded.given:
                        folded.blotter.add(reader.decode(folded.cause))
                        folded.given = True
                    folded.blotter.add(reader.decode(record))
            if page:
                folded.version = page[-1].version
            if len(page) < READ_PAGE:
                return folded.blotter


def _newest(items: Iterable[T], key: Callable[[T], int], limit: int) -> tuple[list[T], bool]:
    ordered = sorted(items, key=key, reverse=True)
    return ordered[:limit], len(ordered) > limit


def blotter_view(blotters: Sequence[tuple[str, Blotter]], now: int, query: BlotterQuery
                 ) -> BlotterView:
    """The answer for some agents' blotters, filtered to ``query.symbol`` if it names one."""
    symbol, limit = query.symbol, query.limit

    def wanted(item_symbol: str) -> bool:
        return symbol is None or item_symbol == symbol

    opened = [(a, o) for a, b in blotters for o in b.open.values() if wanted(o.symbol)]
    opened.sort(key=lambda pair: pair[1].placed_at)
    fills, cut_fills = _newest(((a, f) for a, b in blotters for f in b.fills
                                if wanted(f.symbol)), lambda pair: pair[1].at, limit)
    cancels, cut_cancels = _newest(((a, o) for a, b in blotters for o in b.cancels
                                    if wanted(o.symbol)),
                                   lambda pair: pair[1].cancel_at or 0, limit)
    rejections, cut_rejections = _newest(((a, r) for a, b in blotters for r in b.rejections
                                          if wanted(r.symbol)), lambda pair: pair[1].at, limit)
    return BlotterView(
        agents=[a for a, _ in blotters], symbol=symbol, at=now, limit=limit,
        truncated=cut_fills or cut_cancels or cut_rejections,
        open_orders=[_open_view(a, o, now) for a, o in opened],
        fills=[FillView(agent_id=a, order_id=f.order_id, symbol=f.symbol, side=f.side, qty=f.qty,
                        price=f.price, at=f.at, decision_price=f.decision_price,
                        slippage=f.slippage) for a, f in fills],
        cancels=[_cancel_view(a, o) for a, o in cancels],
        rejections=[RejectionView(agent_id=a, source=r.source, run_id=r.run_id,
                                  order_id=r.order_id, symbol=r.symbol, side=r.side, qty=r.qty,
                                  reason=r.reason, at=r.at) for a, r in rejections],
        positions=[PositionView(agent_id=a, symbol=p.symbol, net_qty=p.net_qty,
                                avg_price=p.avg_price, bought_qty=p.bought_qty,
                                sold_qty=p.sold_qty, fills=p.fills, realized_pnl=p.realized)
                   for a, b in blotters for p in sorted(b.positions.values(),
                                                        key=lambda p: p.symbol)
                   if wanted(p.symbol)],
    )


def _open_view(agent: str, order: OrderRow, now: int) -> OpenOrderView:
    return OpenOrderView(
        agent_id=agent, order_id=order.order_id, run_id=order.run_id, symbol=order.symbol,
        side=order.side, qty=order.qty, filled_qty=order.filled_qty,
        order_type=order.order_type, limit_price=order.limit_price,
        avg_fill_price=order.avg_price, placed_at=order.placed_at,
        age_ms=max(0, now - order.placed_at), cancel_requested_by=order.cancel_by,
        cancel_requested_at=order.cancel_at, flatten_by=order.flatten_by)


def _cancel_view(agent: str, order: OrderRow) -> CancelView:
    return CancelView(
        agent_id=agent, order_id=order.order_id, symbol=order.symbol, side=order.side,
        qty=order.qty, filled_qty=order.filled_qty, by=order.cancel_by or "",
        action=order.cancel_action, request_id=order.cancel_request,
        requested_at=order.cancel_at or 0,
        status="pending" if order.status == "open" else order.status,
        closed_at=order.closed_at)
