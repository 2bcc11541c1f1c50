"""The gateway's errors: each says what was wrong and what to do; no internals leak."""

from __future__ import annotations

from lanes.requests import FieldError, InvalidRequest


class GatewayError(Exception):
    """Base of the errors a client may see; ``code`` is stable, the message is for people."""

    code = "internal"


class UnknownAgent(GatewayError):
    """The request names an agent this gateway does not have."""

    code = "unknown_agent"

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"unknown agent {agent_id!r}; list agents with GET /api/agents")
        self.agent_id = agent_id


class AgentUnavailable(GatewayError):
    """The agent is being rebuilt from the log after a storage failure; retry shortly."""

    code = "unavailable"

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent {agent_id!r} is recovering from a storage error; retry")
        self.agent_id = agent_id


class NotRunning(GatewayError):
    """The engine is not started, or is stopping."""

    code = "not_running"

    def __init__(self) -> None:
        super().__init__("the gateway is not accepting requests (starting or stopping)")


class StorageFailed(GatewayError):
    """The commit failed: the request was NOT accepted and may be retried as is."""

    code = "storage_failed"

    def __init__(self, detail: str) -> None:
        super().__init__(f"the request was not stored ({detail}); retry with the same requestId")


__all__ = [
    "AgentUnavailable",
    "FieldError",
    "GatewayError",
    "InvalidRequest",
    "NotRunning",
    "StorageFailed",
    "UnknownAgent",
]
