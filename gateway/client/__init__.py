"""Python clients of the gateway: its HTTP API (`HttpClient`), its WebSocket protocol v1
(`ControlClient` on ``/ws/control``, `FeedClient` on ``/ws/feed``) and workers of
``/ws/worker`` (`Worker`).

    async with HttpClient("http://127.0.0.1:8000", token) as api:
        agents = await api.agents()                  # typed answers (pydantic models)
        ack = await api.emergency_stop("agent_btc_5m")

    async with ControlClient("ws://127.0.0.1:8000", token) as client:
        ack = await client.submit(request)          # after its commit
        async with client.subscribe(["agent_btc_5m"]) as events:
            async for event in events: ...

The package stands alone: it needs pydantic, websockets and httpx2, and nothing else of the
gateway (it is also built as a distribution of its own, ``clients/python``). A refusal raises
the `GatewayClientError` subclass of its code, carrying the gateway's code and message.
"""

from __future__ import annotations

from gateway.client.answers import Agent, AgentSummary, Event, Run, ScheduleInfo
from gateway.client.api import HttpClient
from gateway.client.connection import ControlClient, FeedClient, GatewayClient
from gateway.client.desk import Approval, Blotter, Pnl
from gateway.client.errors import (
    Conflict,
    ConnectionLost,
    Forbidden,
    GatewayClientError,
    InvalidInput,
    NotFound,
    Unauthorized,
    Unavailable,
)
from gateway.client.frames import AckFrame, ErrorFrame, EventFrame, Hello, Snapshot
from gateway.client.subscription import Subscription
from gateway.client.wire import endpoint_url, request_json
from gateway.client.worker import Worker, WorkerRun

__all__ = [
    "AckFrame",
    "Agent",
    "AgentSummary",
    "Approval",
    "Blotter",
    "Conflict",
    "ConnectionLost",
    "ControlClient",
    "ErrorFrame",
    "Event",
    "EventFrame",
    "FeedClient",
    "Forbidden",
    "GatewayClient",
    "GatewayClientError",
    "Hello",
    "HttpClient",
    "InvalidInput",
    "NotFound",
    "Pnl",
    "Run",
    "ScheduleInfo",
    "Snapshot",
    "Subscription",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "WorkerRun",
    "endpoint_url",
    "request_json",
]
