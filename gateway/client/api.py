"""The gateway's HTTP API as typed async calls (`HttpClient`; docs/protocol.md, "HTTP").

    async with HttpClient("http://127.0.0.1:8000", token) as api:
        for agent in await api.agents():
            print(agent.agent_id, agent.trading, [b.kind for b in agent.blocked])
        ack = await api.emergency_stop("agent_btc_5m", reason="risk")   # after its commit
        for waiting in await api.approvals():
            await api.approve(waiting.agent_id, waiting.approval_id)

Every answer is a model of `gateway.client.answers` or `gateway.client.desk`; a refusal
raises the `GatewayClientError` subclass of its code (`Forbidden`, `NotFound`, ...).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from gateway.client.answers import (
    Agent,
    AgentEvents,
    AgentSummary,
    CallTrees,
    Charts,
    Configured,
    Diff,
    EventCause,
    EventsFound,
    EventsPage,
    EventTypes,
    Found,
    LimitsChanged,
    Moment,
    Operated,
    Provider,
    Providers,
    Queue,
    Readiness,
    Removed,
    Replay,
    Runs,
    ScheduleChanged,
    ScheduleInfo,
    Schedules,
    Story,
)
from gateway.client.desk import (
    Alerts,
    Approval,
    Approvals,
    Blotter,
    Capacity,
    DeskBudget,
    DeskScope,
    Feed,
    HooksChanged,
    Pnl,
)
from gateway.client.drill import Market, OrderLife, RunDetail, WhatIf
from gateway.client.errors import GatewayClientError
from gateway.client.frames import AckFrame, DeskKillAck, JsonObject
from gateway.client.http import HttpBase, path
from gateway.client.wire import RequestLike, model_json, parse, request_json

ControlAction = Literal["emergency_stop", "pause", "resume", "cancel_order", "cancel_all",
                        "approve", "reject", "flatten"]
JumpKind = Literal["stop", "drop", "suppression"]
Body = Mapping[str, Any] | BaseModel
"""A body as its wire JSON object, or as a model (the server's ``AgentConfig``, say)."""


class AgentCalls(HttpBase):
    """Agents: status, requests, the control lane, the operator's actions, config and
    schedules."""

    async def agents(self) -> list[AgentSummary]:
        """Every agent in the token's scope, with its status."""
        data = await self._json("GET", "/api/agents")
        if not isinstance(data, list):
            raise GatewayClientError("protocol", "GET /api/agents answered no list")
        return [parse(AgentSummary, item) for item in data]

    async def agent(self, agent_id: str) -> Agent:
        """One agent: its status, config and schedules."""
        return await self._get(Agent, path("api", "agents", agent_id))

    async def queue(self, agent_id: str) -> Queue:
        """An agent's lane: busy or not, the active run, the pending list in order."""
        return await self._get(Queue, path("api", "agents", agent_id, "queue"))

    async def submit(self, request: RequestLike) -> AckFrame:
        """Submit one request to the agent it names; its ack after the commit (a mapping
        without ``requestId`` gets one, so a retry is idempotent)."""
        body = request_json(request)
        return await self._post(AckFrame, path("api", "agents", str(body.get("agentId")),
                                               "requests"), body, idempotent=True)

    async def control(self, agent_id: str, action: ControlAction, *,
                      order_id: str | None = None, approval_id: str | None = None,
                      reason: str | None = None, request_id: str | None = None) -> AckFrame:
        """A control-lane action on an agent; its ack (with the ``effect``) after the
        commit. Without ``request_id`` one is made, so a retry is idempotent."""
        body = {"action": action, "orderId": order_id, "approvalId": approval_id,
                "reason": reason, "requestId": request_id or f"ctl_{secrets.token_hex(8)}"}
        return await self._post(AckFrame, path("api", "agents", agent_id, "control"),
                                {k: v for k, v in body.items() if v is not None},
                                idempotent=True)

    async def emergency_stop(self, agent_id: str, reason: str | None = None) -> AckFrame:
        """Halt the agent: its run aborted, its open orders cancelled, no run until resume."""
        return await self.control(agent_id, "emergency_stop", reason=reason)

    async def pause(self, agent_id: str, reason: str | None = None) -> AckFrame:
        """Reduce-only: runs go on, new orders only if they reduce a position."""
        return await self.control(agent_id, "pause", reason=reason)

    async def resume(self, agent_id: str, reason: str | None = None) -> AckFrame:
        """Back to ACTIVE (the only way out of HALTED)."""
        return await self.control(agent_id, "resume", reason=reason)

    async def cancel_order(self, agent_id: str, order_id: str) -> AckFrame:
        """Cancel one open order."""
        return await self.control(agent_id, "cancel_order", order_id=order_id)

    async def cancel_all(self, agent_id: str) -> AckFrame:
        """Cancel every open order of the agent."""
        return await self.control(agent_id, "cancel_all")

    async def approve(self, agent_id: str, approval_id: str,
                      reason: str | None = None) -> AckFrame:
        """Approve an order waiting for a human (`approvals`): it goes to the broker."""
        return await self.control(agent_id, "approve", approval_id=approval_id, reason=reason)

    async def reject(self, agent_id: str, approval_id: str,
                     reason: str | None = None) -> AckFrame:
        """Reject an order waiting for a human: it never reaches the broker."""
        return await self.control(agent_id, "reject", approval_id=approval_id, reason=reason)

    async def clear_queue(self, agent_id: str) -> Operated:
        """Drop every pending request of the agent."""
        return await self._post(Operated, path("api", "agents", agent_id, "queue", "clear"))

    async def release(self, agent_id: str) -> Operated:
        """Free the lane: the active run is aborted (reason ``release``)."""
        return await self._post(Operated, path("api", "agents", agent_id, "release"))

    async def abort_run(self, agent_id: str, run_id: str) -> Operated:
        """Abort a run if it is still the active one (`Conflict` if not)."""
        return await self._post(Operated, path("api", "agents", agent_id, "runs", run_id,
                                               "abort"))

    async def configure(self, agent_id: str, config: Body) -> Configured:
        """Replace an agent's config (admin); it applies to requests arriving from now on."""
        return await self._post(Configured, path("api", "agents", agent_id, "config"),
                                model_json(config), idempotent=True)

    async def schedules(self, agent_id: str) -> list[ScheduleInfo]:
        """An agent's schedules, each with when it fired last and fires next."""
        return (await self._get(Schedules, path("api", "agents", agent_id,
                                                "schedules"))).schedules

    async def put_schedule(self, agent_id: str, schedule_id: str,
                           schedule: Body) -> ScheduleChanged:
        """Add or replace a schedule (admin): ``cron`` or ``everyMs``, ``payload``, ..."""
        data = await self._json("PUT", path("api", "agents", agent_id, "schedules",
                                            schedule_id), body=model_json(schedule),
                                idempotent=True)
        return parse(ScheduleChanged, data)

    async def delete_schedule(self, agent_id: str, schedule_id: str) -> str:
        """Remove a schedule (admin); the id removed."""
        data = await self._json("DELETE", path("api", "agents", agent_id, "schedules",
                                               schedule_id), idempotent=True)
        return parse(Removed, data).removed

    async def pause_schedule(self, agent_id: str, schedule_id: str) -> ScheduleChanged:
        """Pause a schedule (admin): no firing until resumed, none caught up then."""
        return await self._post(ScheduleChanged, path(
            "api", "agents", agent_id, "schedules", schedule_id, "pause"), idempotent=True)

    async def resume_schedule(self, agent_id: str, schedule_id: str) -> ScheduleChanged:
        """Resume a schedule (admin): it fires from its next time after now."""
        return await self._post(ScheduleChanged, path(
            "api", "agents", agent_id, "schedules", schedule_id, "resume"), idempotent=True)

    async def run_schedule(self, agent_id: str, schedule_id: str) -> AckFrame:
        """Fire a schedule now, by hand (its next automatic firing stays as it was)."""
        return await self._post(AckFrame, path("api", "agents", agent_id, "schedules",
                                               schedule_id, "run"))


class LogCalls(HttpBase):
    """The log and what is read from it: events, runs, calls, charts, replays, the story."""

    async def events(self, *, after: int | None = None, agent: str | None = None,
                     type: str | None = None, limit: int | None = None) -> EventsPage:
        """The log read forward from ``after``, oldest first (``next`` goes on)."""
        return await self._get(EventsPage, "/api/events", {
            "after": after, "agent": agent, "type": type, "limit": limit})

    async def search_events(self, q: str = "", *, before: int | None = None,
                            agent: str | None = None, type: str | None = None,
                            limit: int | None = None) -> EventsFound:
        """Events with ``q`` in their type, stream or data, newest first, below ``before``
        (the answer's ``before`` goes on; None: the start of the log was reached)."""
        return await self._get(EventsFound, "/api/events", {
            "q": q, "before": before, "agent": agent, "type": type, "limit": limit})

    async def event(self, position: int) -> EventCause:
        """The event at ``position``, the input that caused it and that input's decisions."""
        return await self._get(EventCause, path("api", "events", str(position)))

    async def event_types(self) -> EventTypes:
        """Which event types are inputs and which decisions."""
        return await self._get(EventTypes, "/api/event-types")

    async def agent_events(self, agent_id: str, *, before_version: int | None = None,
                           limit: int | None = None) -> AgentEvents:
        """One agent's stream, oldest first, the newest ``limit`` below ``before_version``."""
        return await self._get(AgentEvents, path("api", "agents", agent_id, "events"),
                               {"beforeVersion": before_version, "limit": limit})

    async def runs(self, agent_id: str, *, before: int | None = None,
                   limit: int | None = None) -> Runs:
        """An agent's runs, newest first: requests, outcome, tokens, gate time, steps."""
        return await self._get(Runs, path("api", "agents", agent_id, "runs"),
                               {"before": before, "limit": limit})

    async def calls(self, agent_id: str, *, run: str | None = None,
                    limit: int | None = None) -> CallTrees:
        """The sub-agent call trees of an agent's runs (or of the one ``run``)."""
        return await self._get(CallTrees, path("api", "agents", agent_id, "calls"),
                               {"run": run, "limit": limit})

    async def charts(self, agents: Sequence[str] = (), *, start: int | None = None,
                     end: int | None = None, step: int | None = None) -> Charts:
        """Per-agent series from the log over [``start``, ``end``) (ms since the epoch)."""
        return await self._get(Charts, "/api/charts", {
            "agent": ",".join(agents) or None, "from": start, "to": end, "step": step})

    async def replay(self, agent_id: str, *, position: int | None = None,
                     around: int | None = None) -> Replay:
        """An agent's status and queue as they were at a log position."""
        return await self._get(Replay, "/api/replay", {
            "agent": agent_id, "position": position, "around": around})

    async def story(self, agent_id: str, *, start: int | None = None, end: int | None = None,
                    limit: int | None = None, at: int | None = None,
                    around: int | None = None) -> Story:
        """An agent's log as groups (an input and its decisions in words): those in
        [``start``, ``end``], or, given ``at``, the group there with ``around`` each side."""
        return await self._get(Story, path("api", "agents", agent_id, "story"), {
            "from": start, "to": end, "limit": limit, "at": at, "around": around})

    async def story_find(self, agent_id: str, kind: JumpKind, *, after: int | None = None,
                         before: int | None = None) -> int | None:
        """The position of the next ``kind`` decision after ``after`` (or the previous one
        before ``before``); None if there is none."""
        return (await self._get(Found, path("api", "agents", agent_id, "story", "find"), {
            "kind": kind, "after": after, "before": before})).position

    async def moment(self, agent_id: str, position: int | None = None) -> Moment:
        """The agent replayed to ``position`` (default: the last)."""
        return await self._get(Moment, path("api", "agents", agent_id, "moment"),
                               {"position": position})

    async def diff(self, agent_id: str, start: int, end: int) -> Diff:
        """What changed in the agent between two log positions."""
        return await self._get(Diff, path("api", "agents", agent_id, "diff"),
                               {"from": start, "to": end})


class DeskCalls(HttpBase):
    """The desk: orders, P&L, approvals, the desk kill, budgets, alerts, the feed and the
    provider gates; and the probes."""

    async def orders(self, *, agent: str | None = None, symbol: str | None = None,
                     limit: int | None = None) -> Blotter:
        """The blotter of every agent in scope (or the one ``agent``)."""
        return await self._get(Blotter, "/api/orders",
                               {"agent": agent, "symbol": symbol, "limit": limit})

    async def approvals(self, agent: str | None = None) -> list[Approval]:
        """The orders waiting for a human's approval, the soonest to expire first."""
        return (await self._get(Approvals, "/api/approvals", {"agent": agent})).approvals

    async def pnl(self, agent: str | None = None) -> Pnl:
        """Positions marked to the feed's prices, per agent and for the desk."""
        return await self._get(Pnl, "/api/pnl", {"agent": agent})

    async def desk_kill_scope(self) -> DeskScope:
        """The agents a desk kill by this token would halt (what a confirm names)."""
        return await self._get(DeskScope, "/api/desk/kill")

    async def desk_kill(self, reason: str | None = None, *,
                        flatten: bool = False) -> DeskKillAck:
        """Halt every agent in the token's scope and cancel their open orders, then with
        ``flatten`` close each one's positions; answered after the commit of the kill's
        record."""
        body: dict[str, Any] = {} if reason is None else {"reason": reason}
        if flatten:
            body["flatten"] = True
        return await self._post(DeskKillAck, "/api/desk/kill", body)

    async def desk_budget(self) -> DeskBudget:
        """The desk's token and spend budgets, and until when runs are held back."""
        return await self._get(DeskBudget, "/api/desk/budget")

    async def alerts(self, *, limit: int | None = None, kind: str | None = None) -> Alerts:
        """The newest alerts, newest first (``kind`` keeps one kind)."""
        return await self._get(Alerts, "/api/alerts", {"limit": limit, "kind": kind})

    async def feed(self) -> Feed:
        """Feed health: connectors, each symbol's last data, warnings, the hook rules."""
        return await self._get(Feed, "/api/feed")

    async def order_life(self, agent_id: str, order_id: str) -> OrderLife:
        """An order's life from the log, and the run that decided it."""
        return await self._get(OrderLife, path("api", "agents", agent_id, "orders", order_id))

    async def run_detail(self, agent_id: str, run_id: str) -> RunDetail:
        """A run in full: its prompt, model calls, tool calls and results, steers, orders."""
        return await self._get(RunDetail, path("api", "agents", agent_id, "runs", run_id))

    async def whatif(self, agent_id: str, position: int, config: JsonObject) -> WhatIf:
        """What-if from a moment (a log position) under another lane config."""
        return await self._post(WhatIf, path("api", "agents", agent_id, "whatif"),
                                {"position": position, "config": config}, idempotent=True)

    async def market(self) -> Market:
        """Each symbol's tick."""
        return await self._get(Market, "/api/market")

    async def capacity(self, *, start: int | None = None, end: int | None = None,
                       step: int | None = None, agents: Sequence[str] = (),
                       providers: Sequence[str] = (), busiest: int | None = None
                       ) -> Capacity:
        """Capacity over time (ms since the epoch; ``step`` in ms): queue depth and run
        latency of the desk and of the named ``agents`` (else the ``busiest`` few), and the
        provider gates' waits and use of their limits, folded from the log."""
        return await self._get(Capacity, "/api/capacity", {
            "from": start, "to": end, "step": step, "busiest": busiest,
            "agent": ",".join(agents) or None, "provider": ",".join(providers) or None})

    async def set_hooks(self, paused: bool, reason: str | None = None) -> HooksChanged:
        """Pause or resume the hook rules (control or admin, not scoped)."""
        body: JsonObject = {"paused": paused}
        if reason is not None:
            body["reason"] = reason
        return await self._post(HooksChanged, "/api/feed/hooks", body, idempotent=True)

    async def providers(self) -> list[Provider]:
        """Every provider gate: limits, use, waiting agents, breaker."""
        return (await self._get(Providers, "/api/providers")).providers

    async def provider(self, name: str) -> Provider:
        """One provider gate."""
        return await self._get(Provider, path("api", "providers", name))

    async def set_provider_limits(self, name: str, limits: Body) -> LimitsChanged:
        """Replace some of a provider gate's limits (admin, not scoped)."""
        return await self._post(LimitsChanged, path("api", "providers", name, "limits"),
                                model_json(limits), idempotent=True)

    async def readiness(self) -> Readiness:
        """``/readyz``: whether the gateway is ready for traffic, or why not."""
        return parse(Readiness, await self._json("GET", "/readyz", accept=frozenset({503})))

    async def live(self) -> bool:
        """``/livez``: whether the process serves."""
        return bool((await self._json("GET", "/livez")).get("status") == "ok")

    async def openapi(self) -> JsonObject:
        """The OpenAPI document of the HTTP API."""
        document: JsonObject = await self._json("GET", "/openapi.json")
        return document

    async def metrics(self) -> str:
        """The Prometheus metrics, as text (viewer or better)."""
        return await self._text("/metrics")


class HttpClient(AgentCalls, LogCalls, DeskCalls):
    """The gateway's HTTP API, typed and async: one method per route (an async context
    manager; see `HttpBase` for retries and errors)."""
