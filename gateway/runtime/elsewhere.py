"""What the engine is told of the processes beside it, when several share the log."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gateway.errors import GatewayError
from gateway.runtime.acks import Ack
from lanes import AgentRequest, AgentState


class Elsewhere(Protocol):
    """The other processes sharing the log, as the engine sees them (`gateway.cluster`):
    what to answer for an agent it does not hold, and where its own requests go then."""

    def missing(self, agent_id: str) -> GatewayError:
        """The error for an agent this engine does not hold (`NotOwner`, `UnknownAgent`)."""
        ...

    def fenced(self, stream: str) -> None:
        """An append of ``stream`` was fenced: its lease is another process's."""
        ...

    def state(self, agent_id: str) -> AgentState | None:
        """The state of an agent decided elsewhere, as the log says (None: no such agent)."""
        ...

    def agent_ids(self) -> Iterable[str]:
        """Every agent decided elsewhere."""
        ...

    async def forward(self, request: AgentRequest, principal: str | None = None) -> Ack:
        """Take a request of the gateway's own (a call, an answer, a control held here for
        an agent that left) where its agent is."""
        ...
