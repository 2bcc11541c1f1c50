"""An engine's orders on their way to the broker: sent after the commit that accepts or
cancels them, and the open ones sent again when an agent comes to this process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from gateway.runtime.agents import Agent
from lanes.events import OrderAccepted, OrderCancelRequested

if TYPE_CHECKING:
    from gateway.market.broker import Broker


class Orders:
    """Sends committed order decisions to ``broker`` (none: orders stay open)."""

    def __init__(self, broker: Broker | None,
                 spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]) -> None:
        self.broker = broker
        self._spawn = spawn

    def send(self, agent_id: str, decision: OrderAccepted | OrderCancelRequested) -> None:
        """A committed order decision to the broker: a new order placed, or a cancel."""
        broker = self.broker
        if broker is None:
            return
        if isinstance(decision, OrderAccepted):
            self._spawn(broker.place(agent_id, decision.order_id, decision.intent),
                        f"place {decision.order_id}")
        else:
            self._spawn(broker.cancel(agent_id, decision.order_id),
                        f"cancel {decision.order_id}")

    def place_open(self, agent: Agent) -> None:
        """The agent's orders still open in the log go to the broker (again)."""
        if self.broker is None:
            return
        for order in agent.state.orders.values():
            self._spawn(self.broker.place(agent.agent_id, order.order_id, order.intent),
                        f"place {order.order_id}")
