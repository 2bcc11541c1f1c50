"""What the HTTP API answers about the desk, as the client reads it: the blotter, P&L,
orders awaiting approval, the desk kill's scope, budgets, alerts, feed health and capacity
over time."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.client.frames import Answer, JsonObject

# ------------------------------------------------------------------------------ blotter


class OpenOrder(Answer):
    """An open order (``ageMs`` counted to the blotter's ``at``)."""

    agent_id: str
    order_id: str
    run_id: str
    symbol: str
    side: str
    qty: float
    filled_qty: float
    order_type: str
    limit_price: float | None = None
    avg_fill_price: float | None = None
    placed_at: int
    age_ms: int
    cancel_requested_by: str | None = None
    cancel_requested_at: int | None = None
    flatten_by: str | None = None
    """An operator's flatten placed it (``run_id`` is empty): who sent it."""


class Fill(Answer):
    """A fill, with the price the run decided at and the slippage against it."""

    agent_id: str
    order_id: str
    symbol: str
    side: str
    qty: float
    price: float | None = None
    at: int
    decision_price: float | None = None
    slippage: float | None = None


class Cancel(Answer):
    """A cancel asked for (``by`` whom), and how the order closed (``status``)."""

    agent_id: str
    order_id: str
    symbol: str
    side: str
    qty: float
    filled_qty: float
    by: str
    action: str | None = None
    request_id: str | None = None
    requested_at: int
    status: Literal["pending", "cancelled", "filled", "rejected"]
    closed_at: int | None = None


class Rejection(Answer):
    """An order refused by the trading gate (``source`` ``gate``) or the broker."""

    agent_id: str
    source: Literal["gate", "broker"]
    run_id: str
    order_id: str | None = None
    symbol: str
    side: str
    qty: float
    reason: str
    at: int


class Position(Answer):
    """An agent's net position in a symbol, from its fills."""

    agent_id: str
    symbol: str
    net_qty: float
    avg_price: float | None = None
    bought_qty: float
    sold_qty: float
    fills: int
    realized_pnl: float


class Blotter(Answer):
    """Open orders, fills, cancels, rejections and positions of some agents, from the log
    (``truncated``: a history list was cut at ``limit``)."""

    agents: list[str]
    symbol: str | None = None
    at: int
    open_orders: list[OpenOrder]
    fills: list[Fill]
    cancels: list[Cancel]
    rejections: list[Rejection]
    positions: list[Position]
    limit: int
    truncated: bool


# ---------------------------------------------------------------------------------- P&L


class PositionPnl(Answer):
    """A position marked to the feed's latest price (None where a price or cost is not
    known)."""

    symbol: str
    net_qty: float
    avg_price: float | None = None
    mark: float | None = None
    mark_age_ms: int | None = None
    stale: bool
    market_value: float | None = None
    exposure: float | None = None
    unrealized: float | None = None
    realized: float
    complete: bool


class PnlTotals(Answer):
    """Totals of some positions."""

    market_value: float
    exposure: float
    unrealized: float
    realized: float
    total: float
    complete: bool
    stale: bool


class AgentPnl(Answer):
    """One agent's positions and totals."""

    agent_id: str
    positions: list[PositionPnl]
    totals: PnlTotals


class Pnl(Answer):
    """P&L of the agents in scope and of the desk."""

    at: int
    stale_ms: int
    agents: list[AgentPnl]
    desk: PnlTotals


# ----------------------------------------------------------------------- desk controls


class Approval(Answer):
    """An order waiting for a human's approval (approve or reject it by ``approvalId``)."""

    agent_id: str
    approval_id: str
    order_id: str
    run_id: str
    order: JsonObject
    notional: float | None
    expires_at: int
    expires_in_ms: int


class Approvals(Answer):
    """The orders waiting for approval, the soonest to expire first."""

    approvals: list[Approval]


class DeskScope(Answer):
    """The agents a desk kill by this token would halt (``scoped``: the token's own)."""

    agents: list[str]
    scoped: bool


class DeskBudgetRow(Answer):
    """One desk budget's use now."""

    budget: str
    window: str
    used: float
    limit: float
    fraction: float


class DeskBudget(Answer):
    """The desk's token and spend budgets, and until when runs are held back."""

    configured: bool
    budgets: list[DeskBudgetRow]
    alert_at: list[float] | None = None
    held_until: int | None = None
    detail: str | None = None


# ----------------------------------------------------------------------- alerts, feed


class Alert(Answer):
    """One alert (a halt, a refused order, a breaker, a budget, an approval waiting, a
    connector down, a stale symbol)."""

    id: str
    kind: str
    severity: Literal["critical", "warning", "info"]
    at: int
    text: str
    agent_id: str | None = None
    position: int | None = None


class Alerts(Answer):
    """The newest alerts, newest first, and the kinds raised."""

    alerts: list[Alert]
    rules: list[str]


class Hooks(Answer):
    """Whether the hook rules are paused (by whom, when, why), and requests not sent."""

    paused: bool
    by: str | None = None
    at: int | None = None
    reason: str | None = None
    suppressed: int


class Feed(Answer):
    """Feed health: connectors, each symbol's last data and age, warnings, the hooks."""

    at: int
    stale_ms: int
    connectors: list[JsonObject]
    symbols: list[JsonObject]
    warnings: list[str]
    hooks: Hooks


class HooksChanged(Answer):
    """The answer to a pause or resume of the hook rules."""

    changed: bool
    hooks: Hooks


# ------------------------------------------------------------------------------ capacity


class CapacitySeries(Answer):
    """The desk's (``agents``: how many) or one agent's (``agent_id``) capacity per step:
    pending requests, runs ended and their latency p50/p95 (ms; None: none ended)."""

    agent_id: str | None = None
    agents: int | None = None
    depth: list[int]
    runs: list[int]
    p50: list[int | None]
    p95: list[int | None]


class GateCapacity(Answer):
    """A provider gate's capacity per step: requests waiting, waits ended and their p50/p95
    (ms), requests and tokens granted in the 60 s window and their share of the limits."""

    provider: str
    limits: dict[str, int | None]
    waiting: list[int]
    waits: list[int]
    wait_p50: list[int | None]
    wait_p95: list[int | None]
    requests: list[int]
    input_tokens: list[int]
    output_tokens: list[int]
    request_use: list[float | None]
    token_use: list[float | None]


class Capacity(Answer):
    """Capacity over ``from_``..``to`` in steps of ``step`` ms, folded from the log up to
    ``position`` (``behind``: events still to read; ask again), with the window's marks."""

    from_: int = Field(alias="from")
    to: int
    step: int
    position: int
    since: int | None
    behind: int
    busiest: bool
    desk: CapacitySeries
    agents: list[CapacitySeries]
    gates: list[GateCapacity]
    marks: list[JsonObject]
