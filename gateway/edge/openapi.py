"""The OpenAPI document of the HTTP API, built from the same pydantic models it validates."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import TypeAdapter

from gateway.edge.protocol import AckFrame, DeskKillAck, DeskKillBody, DeskScope, ErrorFrame
from lanes import AgentConfig, AgentRequest
from lanes.gate.events import GateLimits
from lanes.schedules import Schedule

BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
JSON_RPC: dict[str, Any] = {
    "description": "A JSON-RPC 2.0 response of the Model Context Protocol (docs/mcp.md)",
    "type": "object", "required": ["jsonrpc", "id"],
    "properties": {"jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer"]},
                   "result": {"type": "object"}, "error": {"type": "object"}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _op(summary: str, ok: str | dict[str, Any], body: str | None = None,
        params: tuple[str, ...] = ("agent_id",), errors: tuple[int, ...] = (401, 403, 404),
        query: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "security": BEARER,
        "parameters": [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in params
        ] + [
            {"name": name, "in": "query", "required": False, "schema": {"type": kind}}
            for name, kind in query
        ],
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {
                "schema": _ref(ok) if isinstance(ok, str) else ok}}},
            **{str(code): {"description": "error", "content": {"application/json": {
                "schema": _ref("ErrorFrame")}}} for code in (*errors, 422, 503)},
        },
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": _ref(body)}}}
    return operation


@cache
def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 for every HTTP route (the WebSocket protocol is in docs/protocol.md)."""
    from gateway.edge.http import ControlBody
    from gateway.edge.routes.feed import HooksBody, MarketJson
    from gateway.edge.shapes import ANSWERS
    from gateway.reads.blotter import BlotterView
    from gateway.reads.drill import DRILL_ANSWERS
    from gateway.reads.pnl import PnlView
    from gateway.reads.story import RESPONSES  # the answers of the story routes
    from gateway.reads.whatif import WhatIfBody, WhatIfJson

    schemas: dict[str, Any] = {}

    def add(name: str, model: Any, mode: Literal["validation", "serialization"]) -> None:
        schema = TypeAdapter(model).json_schema(
            by_alias=True, mode=mode, ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema

    for name, model in (("AgentRequest", AgentRequest), ("AgentConfig", AgentConfig),
                        ("AckFrame", AckFrame), ("ErrorFrame", ErrorFrame),
                        ("ControlBody", ControlBody), ("GateLimits", GateLimits),
                        ("Schedule", Schedule), ("DeskKillBody", DeskKillBody),
                        ("HooksBody", HooksBody), ("WhatIfBody", WhatIfBody)):
        add(name, model, "validation")
    add("DeskKillAck", DeskKillAck, "serialization")
    add("DeskScope", DeskScope, "serialization")
    # Answers: described as they are sent (every field present, null when none).
    answers: dict[str, Any] = {**ANSWERS, **RESPONSES, **DRILL_ANSWERS,
                               "BlotterView": BlotterView, "PnlView": PnlView,
                               "WhatIfJson": WhatIfJson, "MarketJson": MarketJson}
    for name, shape in answers.items():
        add(name, shape, "serialization")
    agent = "/api/agents/{agent_id}"
    sched = ("agent_id", "schedule_id")
    return {
        "openapi": "3.1.0",
        "info": {"title": "Trading agent gateway", "version": "1"},
        "components": {"schemas": schemas, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/healthz": {"get": {"summary": "Health (kept for compatibility: see /livez, "
                                 "/readyz)", "responses": {
                "200": {"description": "running"},
                "503": {"description": "stopping, or the event log cannot be written"}}}},
            "/livez": {"get": {"summary": "Liveness probe: the process serves", "responses": {
                "200": {"description": "the event loop answers (always, while it does)"}}}},
            "/readyz": {"get": {"summary": "Readiness probe", "responses": {
                "200": {"description": "the log is writable, this process's agents are "
                                       "loaded, its reads are not behind the log"},
                "503": {"description": "not ready: `reason` says why (JSON)"}}}},
            "/metrics": {"get": _op("Prometheus metrics", {"type": "string"}, params=())},
            "/api/agents": {"get": _op("Every agent in scope with its status",
                                       {"type": "array", "items": _ref("AgentSummary")},
                                       params=())},
            agent: {"get": _op("Config, trading state and lane status", "AgentJson")},
            "/api/desk/kill": {
                "get": _op("The agents a desk kill by this token would halt (control, "
                           "admin)", "DeskScope", params=(), errors=(401, 403)),
                "post": _op("Desk kill: halt every agent in scope and cancel their open "
                            "orders; one DeskKilled event (ack after commit)", "DeskKillAck",
                            "DeskKillBody", params=(), errors=(401, 403))},
            f"{agent}/queue": {"get": _op("Busy, current run, pending list with ages",
                                          "QueueJson")},
            f"{agent}/requests": {"post": _op("Submit a request (ack after commit)",
                                              "AckFrame", "AgentRequest")},
            f"{agent}/control": {"post": _op("Control-lane action (ack after commit)",
                                             "AckFrame", "ControlBody")},
            f"{agent}/queue/clear": {"post": _op("Drop every pending request",
                                                 "OperatedJson")},
            f"{agent}/release": {"post": _op("Abort the active run, free the lane",
                                             "OperatedJson")},
            f"{agent}/runs/{{run_id}}/abort": {"post": _op(
                "Abort this run if it is still the active one (409 if not)", "OperatedJson",
                params=("agent_id", "run_id"), errors=(401, 403, 404, 409))},
            f"{agent}/config": {"post": _op("Replace the config (admin)", "ConfiguredJson",
                                            "AgentConfig")},
            f"{agent}/schedules": {"get": _op(
                "The agent's schedules, each with lastFireAt and nextFireAt",
                "SchedulesJson")},
            f"{agent}/schedules/{{schedule_id}}": {
                "put": _op("Add or replace a schedule (admin; the path names its id)",
                           "ScheduleChangedJson", "Schedule", params=sched),
                "delete": _op("Remove a schedule (admin)", "RemovedJson", params=sched)},
            f"{agent}/schedules/{{schedule_id}}/pause": {"post": _op(
                "Pause a schedule (admin)", "ScheduleChangedJson", params=sched)},
            f"{agent}/schedules/{{schedule_id}}/resume": {"post": _op(
                "Resume a schedule from its next fire time (admin)", "ScheduleChangedJson",
                params=sched)},
            f"{agent}/schedules/{{schedule_id}}/run": {"post": _op(
                "Fire a schedule now, by hand (an operator; ack after commit)", "AckFrame",
                params=sched)},
            "/api/events": {"get": _op(
                "The event log, paged (or, with q or before, searched back)",
                {"oneOf": [_ref("EventsPage"), _ref("EventsFound")]}, params=(),
                query=(("after", "integer"), ("agent", "string"), ("type", "string"),
                       ("limit", "integer"), ("q", "string"), ("before", "integer")))},
            "/api/events/{position}": {"get": _op(
                "One event, the input that caused it and that input's decisions", "EventCauseJson",
                params=("position",))},
            "/api/event-types": {"get": _op(
                "Which event types are inputs and which are decisions", "EventTypesJson",
                params=())},
            f"{agent}/events": {"get": _op(
                "One agent's log, newest last, paged back by version", "AgentEventsJson",
                query=(("beforeVersion", "integer"), ("limit", "integer")))},
            f"{agent}/calls": {"get": _op(
                "The sub-agent call trees of the agent's runs (each call's status, result "
                "and the calls made while serving it)", "CallTreesJson",
                query=(("run", "string"), ("limit", "integer")))},
            "/api/replay": {"get": _op(
                "An agent's status and queue as they were at a log position, with the "
                "events around it", "ReplayJson", params=(),
                query=(("agent", "string"), ("position", "integer"), ("around", "integer")))},
            f"{agent}/story": {"get": _op(
                "The agent's log as groups (an input and the decisions it caused), worded as "
                "the CLI timeline words them: a position range, or the groups around ``at``",
                "StoryJson", query=(("from", "integer"), ("to", "integer"), ("limit", "integer"),
                            ("at", "integer"), ("around", "integer")))},
            f"{agent}/story/find": {"get": _op(
                "The position of the next (after) or previous (before) stop, drop or "
                "suppression", "FoundJson",
                query=(("kind", "string"), ("after", "integer"), ("before", "integer")))},
            f"{agent}/moment": {"get": _op(
                "The agent at a log position, replayed: budgets, cooldown, suppression, "
                "hold, pending, orders, positions and its provider gate's view", "MomentJson",
                query=(("position", "integer"),))},
            f"{agent}/diff": {"get": _op(
                "What changed in the agent between two log positions (replayed states)",
                "DiffJson",
                query=(("from", "integer"), ("to", "integer")))},
            "/api/providers": {"get": _op(
                "Every provider gate: limits, window usage, waiting agents, breaker, next "
                "retry", "ProvidersJson", params=())},
            "/api/providers/{name}": {"get": _op("One provider gate", "ProviderJson",
                                                 params=("name",))},
            f"{agent}/runs": {"get": _op(
                "The agent's runs, newest first, from the log: requests, outcome, tokens, "
                "gate wait and model time, orders, calls and answer", "RunsJson",
                query=(("before", "integer"), ("limit", "integer")))},
            "/api/charts": {"get": _op(
                "Per-agent series (runs, tokens, requests, drops, failures) from the log, "
                "with stop, pause, resume and hold marks", "ChartsJson", params=(),
                query=(("agent", "string"), ("from", "integer"), ("to", "integer"),
                       ("step", "integer")))},
            "/api/capacity": {"get": _op(
                "Capacity over time from the log: pending requests and run latency (p50, "
                "p95) for the desk and the busiest or named agents, each provider gate's "
                "waiting requests, waits and use of its limits, with marks", "CapacityJson",
                params=(), query=(("from", "integer"), ("to", "integer"), ("step", "integer"),
                                  ("agent", "string"), ("provider", "string"),
                                  ("busiest", "integer")))},
            "/api/providers/{name}/limits": {"post": _op(
                "Replace a provider gate's limits (admin; for requests not yet granted)",
                "LimitsJson",
                "GateLimits", params=("name",))},
            "/api/orders": {"get": _op(
                "The desk's blotter: open orders, fills, cancels, rejections with reasons and "
                "positions of every agent in scope (or one), from the log", "BlotterView",
                params=(), query=(("agent", "string"), ("symbol", "string"),
                                  ("limit", "integer")))},
            "/api/pnl": {"get": _op(
                "P&L: each agent's positions in scope (or one agent's) marked to the feed's "
                "latest prices, realized and unrealized, exposure, totals per agent and for "
                "the desk", "PnlView", params=(), query=(("agent", "string"),))},
            "/mcp": {"post": _op(
                "The gateway's tools over MCP (Streamable HTTP: JSON-RPC 2.0 messages, "
                "answered in JSON; see docs/mcp.md), with the same tokens and roles",
                JSON_RPC, params=(), errors=(401, 403))},
            "/api/desk/budget": {"get": _op(
                "The desk's token and spend budgets: each one's use now, and until when every "
                "agent's runs are held back", "DeskBudgetJson", params=(), errors=(401, 403))},
            "/api/feed": {"get": _op(
                "Feed health: each connector's status, each symbol's last data and its age "
                "(stale past staleMs), warnings, whether the hook rules are paused",
                "FeedJson", params=(), errors=(401, 403))},
            "/api/alerts": {"get": _op(
                "The newest alerts (halts, refused orders, breakers, budgets, approvals "
                "waiting, the feed's connectors and stale symbols), from the log and the feed",
                "AlertsJson", params=(), errors=(401, 403),
                query=(("limit", "integer"), ("kind", "string")))},
            "/api/feed/hooks": {"post": _op(
                "Pause or resume the hook rules (control or admin, every agent in scope); "
                "logged with who and why", "HooksChangedJson", "HooksBody", params=(),
                errors=(401, 403))},
            "/api/approvals": {"get": _op(
                "The orders waiting for a human's approval in scope (or one agent's), the "
                "soonest to expire first; decide one with the control action approve or "
                "reject", "ApprovalsJson", params=(), query=(("agent", "string"),))},
            f"{agent}/orders": {"get": _op(
                "One agent's blotter (open orders, fills, cancels, rejections, positions)",
                "BlotterView", query=(("symbol", "string"), ("limit", "integer")))},
            f"{agent}/orders/{{order_id}}": {"get": _op(
                "One order's life from the log (placed, approval, broker reports, fills, "
                "cancels, how it closed, each with its cause) and the run that decided it",
                "OrderLifeJson", params=("agent_id", "order_id"))},
            f"{agent}/runs/{{run_id}}": {"get": _op(
                "One run in full from the log: the requests it started with as the model "
                "read them, each model call with its text and tool calls, steers, answer, "
                "orders", "RunDetailJson", params=("agent_id", "run_id"))},
            f"{agent}/whatif": {"post": _op(
                "What-if from a log position: the agent as it was there, its recorded inputs "
                "after it re-run under another config; recorded against what-if",
                "WhatIfJson", "WhatIfBody")},
            "/api/market": {"get": _op(
                "Each symbol's tick (its smallest price step), by which prices are rounded "
                "for people", "MarketJson", params=(), errors=(401, 403))},
        },
    }
