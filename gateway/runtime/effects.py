"""What the engine tells a client an accepted control did (part of its ack)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lanes.events import TradingState
from lanes.requests import WireModel


class FlattenOrder(WireModel):
    """A closing market order an operator's flatten sent."""

    order_id: str
    symbol: str
    side: Literal["buy", "sell"]
    qty: float


class ControlEffect(WireModel):
    """What an accepted control did, as committed: the trading state before and after, and
    what it set off. ``changed`` is false when it did nothing at all (a resume of an ACTIVE
    agent with nothing held and nothing to start, say)."""

    from_state: TradingState
    to_state: TradingState
    changed: bool
    aborted_run: str | None = None
    """The run it aborted (an emergency stop of a running agent)."""
    cancels_requested: int = 0
    """Open orders it asked the broker to cancel."""
    unheld: bool = False
    """It lifted a provider hold (a resume)."""
    started_run: str | None = None
    """The run it let start (a resume with work pending)."""
    calls_cancelled: int = 0
    """Sub-agent calls of the agent it ended (a stop)."""
    flatten_orders: list[FlattenOrder] = Field(default_factory=list)
    """The closing orders it sent (a flatten), one per symbol that was not flat."""
