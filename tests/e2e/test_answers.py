"""Every typed answer in `/openapi.json` is what the routes send: live answers validate
against the models the document is built from (`gateway.edge.shapes`), which forbid fields
they do not name."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic import TypeAdapter, ValidationError

from gateway.config import parse_config
from gateway.edge.openapi import openapi_document
from gateway.edge.routes.feed import MarketJson
from gateway.edge.server import serving
from gateway.edge.shapes import (
    AgentEventsJson,
    AgentJson,
    AgentSummary,
    CallTreesJson,
    CapacityJson,
    ChartsJson,
    ConfiguredJson,
    EventCauseJson,
    EventsFound,
    EventsPage,
    EventTypesJson,
    LimitsJson,
    OperatedJson,
    ProviderJson,
    ProvidersJson,
    QueueJson,
    RemovedJson,
    ReplayJson,
    RunsJson,
    ScheduleChangedJson,
    SchedulesJson,
)
from gateway.reads.drill import OrderLifeJson, RunDetailJson
from gateway.reads.whatif import WhatIfJson
from gateway.wiring import build_service
from tests.e2e.live import START_TIMEOUT
from tests.e2e.test_wiring import GATED
from tests.gateway.support import next_event

ADMIN = {"Authorization": "Bearer admin-token-secret-5678"}


async def test_each_route_answers_in_the_shape_its_document_names(tmp_path: Path) -> None:
    service = build_service(parse_config(GATED), tmp_path / "events.db")
    async with serving(service) as running, httpx2.AsyncClient(
            base_url=running.url, timeout=START_TIMEOUT, headers=ADMIN) as http:
        # (the first what-if starts its worker process: a cold start, seconds under load)

        async def get(path: str, **params: Any) -> Any:
            answer = await http.get(path, params=params)
            assert answer.status_code == 200, answer.text
            return answer.json()

        async def send(method: str, path: str, body: Any = None) -> Any:
            answer = await http.request(method, path, json=body)
            assert answer.status_code == 200, answer.text
            return answer.json()

        await send("POST", "/api/agents/desk/requests", {
            "requestId": "r1", "createdAt": datetime.now(UTC).isoformat(), "agentId": "desk",
            "kind": "hook_trigger", "payload": {"symbol": "BTCUSD"}})
        await next_event(service.engine.store, "RunStarted")
        checks: list[tuple[type[Any], Any]] = [
            (RunsJson, await get("/api/agents/desk/runs")),  # the run in flight
            (list[AgentSummary], await get("/api/agents")),
            (AgentJson, await get("/api/agents/desk")),
            (QueueJson, await get("/api/agents/desk/queue")),
            (ProvidersJson, await get("/api/providers")),
            (ProviderJson, await get("/api/providers/sim")),
            (EventsPage, await get("/api/events", limit=5)),
            (EventsFound, await get("/api/events", q="desk")),
            (ScheduleChangedJson, await send("PUT", "/api/agents/desk/schedules/audit",
                                             {"id": "audit", "everyMs": 3_600_000})),
            (ScheduleChangedJson, await send(
                "POST", "/api/agents/desk/schedules/audit/pause")),
            (SchedulesJson, await get("/api/agents/desk/schedules")),
            (AgentJson, await get("/api/agents/desk")),  # now with a schedule
            (RemovedJson, await send("DELETE", "/api/agents/desk/schedules/audit")),
            (ConfiguredJson, await send("POST", "/api/agents/desk/config",
                                        {"mode": "followup"})),
            (LimitsJson, await send("POST", "/api/providers/sim/limits",
                                    {"requestsPerMinute": 60})),
            (OperatedJson, await send("POST", "/api/agents/desk/release")),
            (OperatedJson, await send("POST", "/api/agents/desk/queue/clear")),
            (EventCauseJson, await get("/api/events/6")),
            (EventTypesJson, await get("/api/event-types")),
            (AgentEventsJson, await get("/api/agents/desk/events", limit=3)),
            (CallTreesJson, await get("/api/agents/desk/calls")),
            (ReplayJson, await get("/api/replay", agent="desk", position=6, around=2)),
        ]
        await next_event(service.engine.store, "RunCompleted")
        await send("POST", "/api/agents/desk/control", {"action": "emergency_stop"})
        checks += [(RunsJson, await get("/api/agents/desk/runs")),  # ended, with its order
                   (ChartsJson, await get("/api/charts", agent="desk")),
                   (CapacityJson, await get("/api/capacity", agent="desk"))]
        assert checks[-2][1]["marks"], "the stop is marked"
        assert checks[-1][1]["marks"] and checks[-1][1]["gates"], "the stop and the gate"
        assert checks[-3][1]["runs"][0]["orders"], "the run's order is listed"
        ran = checks[-3][1]["runs"][0]
        [order] = ran["orders"]
        checks += [
            (OrderLifeJson, await get(f"/api/agents/desk/orders/{order['orderId']}")),
            (RunDetailJson, await get(f"/api/agents/desk/runs/{ran['runId']}")),
            (WhatIfJson, await send("POST", "/api/agents/desk/whatif",
                                    {"position": 6, "config": {"mode": "queue"}})),
            (MarketJson, await get("/api/market"))]
        for shape, body in checks:
            try:
                TypeAdapter(shape).validate_python(body)
            except ValidationError as error:
                pytest.fail(f"{shape}: {error}\n{json.dumps(body)[:2000]}")


def test_the_document_names_a_typed_answer_for_each_json_route() -> None:
    untyped = [f"{method.upper()} {path}"
               for path, operations in openapi_document()["paths"].items()
               for method, operation in operations.items()
               if operation.get("responses", {}).get("200", {}).get("content", {})
               .get("application/json", {}).get("schema") == {"type": "object"}]
    assert untyped == []
