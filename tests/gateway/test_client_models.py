"""The client's models read what the server's models write: the same fields under the same
wire names, for every frame and every answer of the HTTP API (the client has its own models,
so that it stands alone; these tests keep the two from drifting apart)."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic import BaseModel
from starlette.routing import Match, Route

from gateway.client import HttpClient, answers, desk, drill, frames
from gateway.client.errors import (
    ERROR_CLASSES,
    Conflict,
    GatewayClientError,
    InvalidInput,
    NotFound,
    Unavailable,
)
from gateway.edge import protocol, shapes, worker_protocol
from gateway.edge.app import create_app
from gateway.edge.auth import TokenBook
from gateway.edge.openapi import openapi_document
from gateway.edge.routes import feed as feed_routes
from gateway.edge.service import Service
from gateway.errors import CODES
from gateway.reads import blotter, pnl, story, whatif
from gateway.reads import drill as reads_drill
from gateway.runtime import desk as runtime_desk
from gateway.runtime import effects
from gateway.runtime.engine import Engine
from lanes import requests, vocabulary
from store import MemoryEventStore
from tests.test_architecture import CLIENT_DEPENDENCIES

PAIRS: list[tuple[type[BaseModel], type[BaseModel]]] = [
    # WebSocket frames
    (frames.Hello, protocol.Hello), (frames.ControlEffect, effects.ControlEffect),
    (frames.AckFrame, protocol.AckFrame), (frames.ErrorFrame, protocol.ErrorFrame),
    (frames.AcksFrame, protocol.AcksFrame), (frames.MarketAck, protocol.MarketAck),
    (frames.Snapshot, protocol.Snapshot), (frames.EventFrame, protocol.EventFrame),
    (frames.EventsFrame, protocol.EventsFrame), (frames.Pong, protocol.Pong),
    (frames.AgentKilled, runtime_desk.AgentKilled), (frames.DeskKilled, runtime_desk.DeskKilled),
    (frames.DeskKillAck, protocol.DeskKillAck),
    # /ws/worker
    (frames.Request, requests.AgentRequest), (frames.Summary, vocabulary.Summary),
    (frames.WorkerReady, worker_protocol.WorkerReady),
    (frames.WireToolSpec, worker_protocol.WireToolSpec),
    (frames.RunFrame, worker_protocol.RunFrame),
    (frames.WireToolResult, worker_protocol.WireToolResult),
    (frames.ToolResultsFrame, worker_protocol.ToolResultsFrame),
    # HTTP: agents, schedules, providers, the log
    (answers.ActiveRun, shapes.RunJson), (answers.CallCounts, shapes.CallsJson),
    (answers.AgentSummary, shapes.AgentSummary), (answers.ScheduleInfo, shapes.ScheduleJson),
    (answers.Agent, shapes.AgentJson), (answers.Queued, shapes.QueuedJson),
    (answers.QueueRun, shapes.QueueRunJson), (answers.Queue, shapes.QueueJson),
    (answers.Operated, shapes.OperatedJson), (answers.Configured, shapes.ConfiguredJson),
    (answers.ScheduleChanged, shapes.ScheduleChangedJson), (answers.Removed, shapes.RemovedJson),
    (answers.Schedules, shapes.SchedulesJson), (answers.WaitingAgent, shapes.WaitingAgentJson),
    (answers.Provider, shapes.ProviderJson), (answers.Providers, shapes.ProvidersJson),
    (answers.LimitsChanged, shapes.LimitsJson), (answers.Event, shapes.EventJson),
    (answers.EventsPage, shapes.EventsPage), (answers.EventsFound, shapes.EventsFound),
    (answers.EventCause, shapes.EventCauseJson), (answers.TypeNames, shapes.TypesJson),
    (answers.EventTypes, shapes.EventTypesJson), (answers.AgentEvents, shapes.AgentEventsJson),
    (answers.CallRun, shapes.CallRunJson), (answers.CallTrees, shapes.CallTreesJson),
    (answers.Replay, shapes.ReplayJson), (answers.Usage, shapes.UsageJson),
    (answers.RunGate, shapes.RunGateJson), (answers.Run, shapes.RunHistoryJson),
    (answers.Runs, shapes.RunsJson), (answers.AgentSeries, shapes.AgentSeriesJson),
    (answers.Charts, shapes.ChartsJson),
    # the story
    (answers.Said, story.SaidJson), (answers.StoryGroup, story.GroupJson),
    (answers.Story, story.StoryJson), (answers.Found, story.FoundJson),
    (answers.Moment, story.MomentJson), (answers.Diff, story.DiffJson),
    # the desk
    (desk.OpenOrder, blotter.OpenOrderView), (desk.Fill, blotter.FillView),
    (desk.Cancel, blotter.CancelView), (desk.Rejection, blotter.RejectionView),
    (desk.Position, blotter.PositionView), (desk.Blotter, blotter.BlotterView),
    (desk.PositionPnl, pnl.PositionPnlView), (desk.PnlTotals, pnl.TotalsView),
    (desk.AgentPnl, pnl.AgentPnlView), (desk.Pnl, pnl.PnlView),
    (desk.Approval, shapes.ApprovalJson), (desk.Approvals, shapes.ApprovalsJson),
    (desk.DeskScope, protocol.DeskScope), (desk.DeskBudgetRow, shapes.DeskBudgetRowJson),
    (desk.DeskBudget, shapes.DeskBudgetJson), (desk.Alert, shapes.AlertJson),
    (desk.Alerts, shapes.AlertsJson), (desk.Hooks, shapes.HooksJson), (desk.Feed, shapes.FeedJson),
    (desk.HooksChanged, shapes.HooksChangedJson),
    (desk.CapacitySeries, shapes.CapacitySeriesJson), (desk.GateCapacity, shapes.GateCapacityJson),
    (desk.Capacity, shapes.CapacityJson),
    (drill.LifeCause, reads_drill.LifeCause), (drill.LifeStep, reads_drill.LifeStep),
    (drill.OrderLife, reads_drill.OrderLifeJson), (drill.RunRequest, reads_drill.RequestJson),
    (drill.Prompt, reads_drill.PromptJson), (drill.RunToolCall, reads_drill.ToolCallJson),
    (drill.RunStep, reads_drill.StepJson), (drill.RunOrder, reads_drill.RunOrderJson),
    (drill.RunDetail, reads_drill.RunDetailJson), (drill.SettingChange, whatif.SettingChange),
    (drill.MeasureRow, whatif.MeasureRow), (drill.WhatIf, whatif.WhatIfJson),
    (drill.Market, feed_routes.MarketJson),
]
"""Each client model and the server model whose JSON it reads."""


def wire_names(model: type[BaseModel]) -> set[str]:
    """The names of a model's fields on the wire."""
    schema: dict[str, Any] = model.model_json_schema(by_alias=True, mode="serialization")
    return set(schema["properties"])


@pytest.mark.parametrize(("client", "server"), PAIRS, ids=lambda m: m.__name__)
def test_the_client_model_has_every_field_of_the_server_model(
        client: type[BaseModel], server: type[BaseModel]) -> None:
    assert wire_names(client) == wire_names(server)


def test_the_field_check_can_fail() -> None:
    assert wire_names(frames.Pong) != wire_names(protocol.Hello)


SERVER_ANSWERS: dict[str, type[BaseModel]] = {
    **shapes.ANSWERS, **story.RESPONSES, "BlotterView": blotter.BlotterView,
    "PnlView": pnl.PnlView, "DeskScope": protocol.DeskScope, "DeskKillAck": protocol.DeskKillAck,
    "AckFrame": protocol.AckFrame, **reads_drill.DRILL_ANSWERS, "WhatIfJson": whatif.WhatIfJson,
    "MarketJson": feed_routes.MarketJson}
"""The server's models of the answers `/openapi.json` names, by name."""


def refs(schema: Any) -> set[str]:
    """The component names a schema refers to, anywhere in it."""
    if isinstance(schema, dict):
        found = {schema["$ref"].rpartition("/")[2]} if "$ref" in schema else set()
        return found.union(*(refs(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(refs(v) for v in schema))
    return set()


def test_every_answer_of_every_route_has_a_client_model() -> None:
    """A route's new answer shape needs its client model (and its pair above)."""
    read = {server for _, server in PAIRS}
    answered = {name for route in openapi_document()["paths"].values()
                for operation in route.values()
                for name in refs(operation["responses"].get("200", {}))}
    assert "BlotterView" in answered and "AgentSummary" in answered
    assert answered - set(SERVER_ANSWERS) == set()
    assert sorted(name for name in answered if SERVER_ANSWERS[name] not in read) == []


def test_every_error_code_of_the_gateway_raises_the_class_of_its_kind() -> None:
    """The HTTP status of a code and the class its error raises in the client agree."""
    expected = {404: NotFound, 409: Conflict, 503: Unavailable}
    for code, meaning in CODES.items():
        error = GatewayClientError.from_json({"code": code, "message": "m"}, meaning.status)
        if meaning.status in expected:
            assert type(error) is expected[meaning.status], code
        elif meaning.status in (400, 413, 422):
            assert type(error) is InvalidInput, code
        elif code == "internal":
            assert type(error) is GatewayClientError
        else:
            assert type(error) is ERROR_CLASSES[code] and error.code == code, code
    assert set(ERROR_CLASSES) <= set(CODES)


ARGUMENTS: dict[str, Any] = {
    "agent_id": "a", "run_id": "r", "schedule_id": "s", "name": "p", "approval_id": "x",
    "order_id": "o", "position": 1, "start": 1, "end": 2, "action": "pause", "kind": "stop",
    "paused": True, "request": {"agentId": "a", "kind": "hook_trigger"}, "config": {},
    "schedule": {"everyMs": 1000}, "limits": {}}
"""An argument for each required parameter of the client's calls, by name."""
NOT_CALLED = {
    ("GET", "/healthz"): "kept for compatibility; the client reads /livez and /readyz",
    ("GET", "/api/agents/{agent_id}/orders"): "the same blotter as /api/orders?agent=",
}


def app() -> Any:
    """The gateway's app (no agent)."""
    return create_app(Service(engine=Engine(MemoryEventStore(), {}), tokens=TokenBook([])))


def http_routes() -> set[tuple[str, str]]:
    """Every (method, path) of the HTTP API but the cluster's internal routes (and /mcp, an
    app of its own for MCP clients: a route without methods)."""
    return {(method, route.path) for route in app().routes if isinstance(route, Route)
            and not route.path.startswith("/internal/") and route.methods
            for method in (route.methods or set()) - {"HEAD"}}


async def test_every_route_of_the_http_api_has_a_call_of_the_client() -> None:
    app_routes = [r for r in app().routes if isinstance(r, Route)]
    called: set[tuple[str, str]] = set()

    def answer(request: httpx2.Request) -> httpx2.Response:
        scope = {"type": "http", "method": request.method, "path": request.url.path}
        matched = [r for r in app_routes if r.matches(scope)[0] is Match.FULL]
        assert matched, f"{request.method} {request.url.path} is no route of the gateway"
        called.add((request.method, matched[0].path))
        return httpx2.Response(404, json={"type": "error", "code": "not_found", "message": "-"})

    async with HttpClient("http://gateway", "t", transport=httpx2.MockTransport(answer)) as api:
        for name, call in inspect.getmembers(api, inspect.iscoroutinefunction):
            if name.startswith("_") or name == "aclose":
                continue
            wanted = [p.name for p in inspect.signature(call).parameters.values()
                      if p.default is inspect.Parameter.empty]
            with pytest.raises(GatewayClientError):
                await call(*(ARGUMENTS[p] for p in wanted))
    assert http_routes() - called == set(NOT_CALLED)


def test_the_client_distribution_is_the_gateways_version_with_its_three_dependencies() -> None:
    root = Path(__file__).resolve().parents[2]
    client = tomllib.loads((root / "clients" / "python" / "pyproject.toml").read_text())
    server = tomllib.loads((root / "pyproject.toml").read_text())
    assert client["project"]["version"] == server["project"]["version"]
    names = {re.split(r"[<>=;\[ ]", d)[0] for d in client["project"]["dependencies"]}
    assert names == set(CLIENT_DEPENDENCIES)
    pinned = {re.split(r"[<>=;\[ ]", d)[0] for d in server["project"]["dependencies"]}
    assert names <= pinned  # (the versions the gateway's tests run the client with)
