"""The Starlette app: WebSocket feed and control protocol, HTTP queue API, metrics.

Everything here is translation: wire frames and HTTP bodies in, engine calls, answers out.
Nothing is decided here that `lanes` decides.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

import pydantic_core
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway.auth import Principal, Role, TokenBook
from gateway.blocked import blocked_view
from gateway.blotter import BlotterBook, BlotterQuery, blotter_view, parse_query
from gateway.cluster import Cluster
from gateway.engine import Ack, Engine
from gateway.errors import (
    HTTP_STATUS,
    BadFrame,
    Busy,
    Forbidden,
    GatewayError,
    NotOwner,
    StorageUnreadable,
    Unauthorized,
    UnknownProvider,
    storage_fault_kind,
)
from gateway.gate import GateMoved, ProviderGate
from gateway.history import (
    MAX_BUCKETS,
    agent_series,
    event_matcher,
    run_history,
    search_back,
)
from gateway.hooks import HookEngine
from gateway.intake import BUDGET_MS, Intake
from gateway.internal import internal_routes
from gateway.llm import LLMClient
from gateway.market import MarketEvent, event_time, from_ms, iso, to_ms
from gateway.metrics import family, label
from gateway.openapi import openapi_document
from gateway.pacing import Pacer
from gateway.peers import FORWARDED_HEADER, Peers
from gateway.protocol import (
    CLIENT_FRAME,
    CLIENT_TYPES,
    EVENTS_PER_FRAME,
    MAX_BATCH,
    AckFrame,
    AcksFrame,
    Auth,
    BusyFrame,
    ErrorFrame,
    Heartbeat,
    Hello,
    Market,
    MarketAck,
    Ping,
    Pong,
    Snapshot,
    Submit,
    SubmitMany,
    Subscribe,
    Unsubscribe,
    load_json,
)
from gateway.schedules import next_fire_at
from gateway.snapshots import state_after
from gateway.story import (
    JUMP_KINDS,
    DiffJson,
    FoundJson,
    MomentJson,
    StoryJson,
    answer,
    around,
    diff_json,
    find,
    gate_at,
    gate_json,
    group_json,
    moment_json,
    spans,
    told,
)
from gateway.tasks import spawn
from lanes import AgentConfig, AgentRequest, InvalidRequest, parse_request, status
from lanes.calltree import CALL_EVENT_TYPES, CallTrees
from lanes.events import DECISION_TYPES, INPUT_TYPES, OperatorAction
from lanes.gate import GateStatus, GateWait, gate_status, gate_waits
from lanes.gate.events import GATE_DECISION_TYPES, GATE_INPUT_TYPES, GateLimits, lease_too_short
from lanes.requests import MAX_INT, ControlAction, FieldError, WireModel
from lanes.schedules import Schedule
from lanes.state import AgentState
from lanes.streams import is_agent_stream
from store.port import RecordedEvent, StoreError

log = logging.getLogger("gateway.app")
WEB = Path(__file__).resolve().parents[1] / "web"
POLICY_VIOLATION = 1008
TOO_BIG = 1009
TRY_AGAIN_LATER = 1013
AUTH_TIMEOUT_S = 10.0
"""Default time a connection has to authenticate (`Service.auth_timeout_s`)."""
MAX_CONNECTIONS = 1_000
"""Default WebSocket connections open at once (`Service.max_connections`)."""
SUBPROTOCOL = "gateway.v1"
"""The WebSocket subprotocol a browser offers with `TOKEN_SUBPROTOCOL` (it is answered)."""
TOKEN_SUBPROTOCOL = "bearer."
"""A browser cannot set ``Authorization`` on a WebSocket: it offers the subprotocol
``bearer.<its token in base64url>`` instead, next to `SUBPROTOCOL`, and is authenticated
at the handshake like a client with the header."""
MAX_UNAUTHENTICATED = 100
"""Default connections waiting for their auth frame (`Service.max_unauthenticated`)."""
MAX_BAD_FRAMES = 20
"""Bad frames in a row before a connection is closed as abusive."""
MAX_CLOCK_SKEW_MS = 60_000
"""How far in the future a market event may be dated."""
MAX_IN_FLIGHT = 2_000
"""Frames one connection may have waiting for their commit before reading pauses."""
MAX_IN_FLIGHT_BYTES = 32 << 20
"""Bytes of frames one connection may have waiting before reading pauses."""
SEND_TIMEOUT_S = 10.0
"""Default time a client may leave a frame untaken before it is closed as a slow reader
(`Service.send_timeout_s`)."""
HEARTBEAT_S = 2.0
"""Default longest silence of a subscription before a heartbeat frame (`Service.heartbeat_s`)."""
REQUEST_TIMEOUT_S = 10.0
"""Default time a connection has to send a whole request (`Service.request_timeout_s`)."""
ENDPOINTS = ("feed", "control")
CAUSE_PAGE = 256
"""Events read per step when walking back from an event to the input that caused it."""
MAX_CAUSE_DECISIONS = 1_000
"""Decisions of one input returned with it (a queue clear may make many)."""
SUMMARIES_PER_STEP = 200
"""Agent summaries a snapshot builds before it lets other work run."""
MAX_SEARCH_TEXT = 200
"""Characters of a search of the log (``GET /api/events?q=``)."""
MAX_CHART_AGENTS = 20
"""Agents in one answer of ``GET /api/charts``."""


@dataclass
class Connections:
    """The WebSocket connections open now and how many ended for each limit (for /metrics)."""

    open: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENDPOINTS, 0))
    unauthenticated: int = 0
    """Open connections still waiting for their auth frame."""
    refused: int = 0
    """Handshakes answered 503: a connection cap was full."""
    auth_timeouts: int = 0
    slow_readers: int = 0

    @property
    def total(self) -> int:
        """Connections open on every endpoint."""
        return sum(self.open.values())


@dataclass
class Service:
    """What the app serves: the engine and everything around it."""

    engine: Engine
    tokens: TokenBook
    hooks: HookEngine | None = None
    on_market: Callable[[MarketEvent], None] | None = None
    """Also told of every market event (the paper broker's prices)."""
    allowed_origins: frozenset[str] = frozenset()
    """Browser origins let in besides the gateway's own (`server.allowed_origins`)."""
    own_origins: frozenset[str] = frozenset()
    """The origins the gateway is served at, set when it binds (`own_origins`): never taken
    from a request's ``Host`` header, which a DNS-rebinding page controls."""
    max_frame_bytes: int = 1 << 20
    intake_budget_ms: int = BUDGET_MS
    """Feed work is taken only while what waits for the log commits within this long
    (`gateway.intake`); beyond it feed frames, and reasoning requests from elsewhere, are
    answered ``busy``."""
    clients: Mapping[str, LLMClient] = field(default_factory=dict)
    """The LLM clients of the providers, closed when serving ends."""
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    max_connections: int = MAX_CONNECTIONS
    """WebSocket connections open at once (both endpoints); past it a handshake is answered
    503 with ``Retry-After``, so a flood of connections cannot grow memory without bound."""
    max_unauthenticated: int = MAX_UNAUTHENTICATED
    """Of those, connections waiting for their auth frame (a token in the header or the
    ``bearer.`` subprotocol is checked at once); past it a handshake without either is
    answered 503."""
    auth_timeout_s: float = AUTH_TIMEOUT_S
    """A connection that has not authenticated in this long is closed (1008)."""
    send_timeout_s: float = SEND_TIMEOUT_S
    """A client that leaves a frame untaken this long is closed as a slow reader (1008)."""
    heartbeat_s: float = HEARTBEAT_S
    """A subscription that had nothing to send for this long is sent a heartbeat frame, so a
    client can tell a quiet gateway from a frozen one (0: no heartbeats)."""
    request_timeout_s: float = REQUEST_TIMEOUT_S
    """A connection must send a whole HTTP request (or WebSocket handshake) within this long
    of connecting or of the request's first bytes (enforced by `gateway.server`)."""
    connections: Connections = field(default_factory=lambda: Connections())
    cluster_secret: str | None = None
    """Several processes share the log: the secret they call each other's internal API with
    (`gateway.internal`; None: not in a cluster, the internal routes do not exist)."""
    peers: Peers | None = None
    """Clients to the other processes of the cluster (an operator's HTTP call for an agent
    owned elsewhere is passed on to its owner)."""
    cluster_lease_ms: int = 5_000
    """The member lease of this process in its cluster (`gateway.cluster.Cluster`)."""
    advertise: str | None = None
    """The URL the other processes reach this one at (default: where it is bound)."""
    cluster: Cluster | None = None
    """This process's membership of its log's cluster (several processes on one PostgreSQL
    log), once it joined."""
    intake: Intake = field(init=False)
    pacer: Pacer = field(default_factory=Pacer)
    """The feed's work takes turns on the event loop, so that a control waits for at most
    one unit of it (`gateway.pacing`)."""

    def __post_init__(self) -> None:
        self.intake = Intake(self.engine.store, self.intake_budget_ms)

    def origin_allowed(self, origin: str | None) -> bool:
        """Whether a browser ``Origin`` may send WebSocket frames and mutating requests (no
        ``Origin``: not a browser, or the same page's GET)."""
        return not origin or origin in self.allowed_origins or origin in self.own_origins

    busy_backlog: int = 40_000
    """Events waiting for the log beyond which reasoning work from outside the feed (an
    operator's message, an HTTP submit) is answered ``busy``: a ceiling on memory, not a
    latency budget (the feed's frames are admitted by the intake, long before this)."""

    def check_capacity(self) -> None:
        """Refuse reasoning work from outside the feed while the log is far behind (flow
        control, never unbounded); the control lane is never refused."""
        backlog = self.engine.store.backlog
        if backlog > self.busy_backlog:
            rate = self.engine.store.commit_rate or 10_000.0
            raise Busy(retry_after_ms=int(min(5_000, 50 + backlog * 1000 / rate)))


def create_app(service: Service, lifespan: Any = None) -> Starlette:
    """The ASGI app over a started (or, with ``lifespan``, to-be-started) engine."""
    api = _Api(service)
    routes = [
        Route("/healthz", api.healthz),
        Route("/metrics", api.metrics),
        Route("/openapi.json", api.openapi),
        Route("/api/agents", api.agents),
        Route("/api/agents/{agent_id}", api.agent),
        Route("/api/agents/{agent_id}/queue", api.queue),
        Route("/api/agents/{agent_id}/requests", api.submit, methods=["POST"]),
        Route("/api/agents/{agent_id}/control", api.control, methods=["POST"]),
        Route("/api/agents/{agent_id}/queue/clear", api.clear, methods=["POST"]),
        Route("/api/agents/{agent_id}/release", api.release, methods=["POST"]),
        Route("/api/agents/{agent_id}/runs/{run_id}/abort", api.abort, methods=["POST"]),
        Route("/api/agents/{agent_id}/config", api.configure, methods=["POST"]),
        Route("/api/agents/{agent_id}/schedules", api.schedules),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}", api.put_schedule,
              methods=["PUT"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}", api.delete_schedule,
              methods=["DELETE"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}/pause", api.pause_schedule,
              methods=["POST"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}/resume", api.resume_schedule,
              methods=["POST"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}/run", api.run_schedule,
              methods=["POST"]),
        Route("/api/events", api.events),
        Route("/api/events/{position:int}", api.event_cause),
        Route("/api/event-types", api.event_types),
        Route("/api/agents/{agent_id}/events", api.agent_events),
        Route("/api/agents/{agent_id}/calls", api.calls),
        Route("/api/replay", api.replay),
        # time travel as a story (gateway.story)
        Route("/api/agents/{agent_id}/story", api.story),
        Route("/api/agents/{agent_id}/story/find", api.story_find),
        Route("/api/agents/{agent_id}/moment", api.moment),
        Route("/api/agents/{agent_id}/diff", api.diff),
        Route("/api/providers", api.providers),
        Route("/api/providers/{name}", api.provider),
        Route("/api/providers/{name}/limits", api.provider_limits, methods=["POST"]),
        # Histories for people, from the log (gateway.history): runs and chart series.
        Route("/api/agents/{agent_id}/runs", api.runs),
        Route("/api/charts", api.charts),
        Route("/api/orders", api.orders),
        Route("/api/agents/{agent_id}/orders", api.agent_orders),
        WebSocketRoute("/ws/feed", partial_ws(service, "feed")),
        WebSocketRoute("/ws/control", partial_ws(service, "control")),
        *internal_routes(service),
    ]
    if WEB.is_dir():
        routes.append(Mount("/", StaticFiles(directory=WEB, html=True), name="web"))
    return Starlette(routes=routes, lifespan=lifespan)


# --------------------------------------------------------------------------------- HTTP


def error_response(error: Exception, request_id: str | None = None) -> JSONResponse:
    """The one place a failure becomes an HTTP answer; no internals leak."""
    frame = error_frame(error, request_id=request_id)
    response = JSONResponse(frame.model_dump(mode="json", exclude_none=True),
                            status_code=HTTP_STATUS.get(frame.code, 500))
    if isinstance(error, Busy):
        response.headers["Retry-After"] = str(max(1, error.retry_after_ms // 1000))
    if isinstance(error, Unauthorized):
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def error_frame(error: Exception, id: str | None = None,
                request_id: str | None = None) -> ErrorFrame:
    """The error frame for any failure (an unexpected one is logged, not shown)."""
    if isinstance(error, InvalidRequest):
        first = error.errors[0] if error.errors else None
        return ErrorFrame(id=id, code="invalid", message=str(error), request_id=request_id,
                          field=first.field if first else None)
    if isinstance(error, BadFrame):
        return ErrorFrame(id=id, code=error.code, message=str(error), field=error.field,
                          request_id=request_id)
    if isinstance(error, StoreError):  # a read of the log failed (a write is StorageFailed)
        error = StorageUnreadable(str(error))
    if isinstance(error, GatewayError):
        return ErrorFrame(id=id, code=error.code, message=str(error), request_id=request_id)
    log.exception("unexpected error", exc_info=error)
    return ErrorFrame(id=id, code="internal", request_id=request_id,
                      message="internal error; the request was not taken; retry")


def ack_frame(ack: Ack, id: str | None = None) -> AckFrame:
    """An engine ack on the wire."""
    return AckFrame(id=id, request_id=ack.request_id, decision=ack.decision,  # type: ignore[arg-type]
                    position=ack.position, reason=ack.reason, repeated=ack.repeated,
                    effect=ack.effect)


class ControlBody(WireModel):
    """Body of ``POST /api/agents/{id}/control``."""

    action: ControlAction
    order_id: str | None = Field(default=None, min_length=1, max_length=128)
    request_id: str | None = Field(default=None, min_length=1, max_length=128)
    reason: str | None = Field(default=None, max_length=500)


def _json(model: BaseModel | dict[str, Any] | list[Any], status_code: int = 200) -> JSONResponse:
    body = model.model_dump(mode="json", exclude_none=True) if isinstance(model, BaseModel) \
        else model
    return JSONResponse(body, status_code=status_code)


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Callable[[_Api, Request], Awaitable[Response]]) -> Any:
    async def wrapped(self: _Api, request: Request) -> Response:
        try:
            return await handler(self, request)
        except (NotOwner, GateMoved) as error:  # another process owns it: ask it there
            return await self._pass_on(request, error)
        except Exception as error:
            return error_response(error)

    wrapped.__doc__ = handler.__doc__
    wrapped.__name__ = handler.__name__
    return wrapped


class _Api:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.engine = service.engine
        self.blotters = BlotterBook()

    async def _pass_on(self, request: Request, error: NotOwner | GateMoved) -> Response:
        """An operator's call for an agent (or provider gate) another process of the cluster
        owns, made there with the caller's own token, and its answer given back as it is
        (once: a call passed on is never passed on again)."""
        peers = self.service.peers
        if peers is None or request.headers.get(FORWARDED_HEADER):
            return error_response(error)
        stream = error.agent_id if isinstance(error, NotOwner) else \
            f"provider:{error.provider}"
        owner = (error.owner if isinstance(error, NotOwner) else None) or \
            await self.engine.locate(stream)
        if owner is None:
            return error_response(error)
        headers = {FORWARDED_HEADER: "1"}
        for name in ("authorization", "content-type"):
            if name in request.headers:
                headers[name] = request.headers[name]
        try:
            answer = await peers.request(request.method, owner + request.url.path,
                                         params=request.query_params,
                                         content=await request.body(), headers=headers)
        except GatewayError as failed:
            return error_response(failed)
        passed = {k: v for k, v in answer.headers.items()
                  if k.lower() in ("content-type", "retry-after", "www-authenticate")}
        return Response(answer.content, status_code=answer.status_code, headers=passed)

    def _principal(self, request: Request) -> Principal:
        origin = request.headers.get("origin")
        if request.method != "GET" and not self.service.origin_allowed(origin):
            raise Forbidden(f"origin {origin!r} is not allowed; list it in "
                            "server.allowed_origins")
        return self.service.tokens.from_header(request.headers.get("authorization"))

    def _agent_id(self, request: Request) -> str:
        """The path's agent, after authentication and the scope check (so nothing about
        agents outside the scope, not even whether they exist, is revealed)."""
        agent_id = str(request.path_params["agent_id"])
        self._principal(request).check_agent(agent_id)
        self.engine.state(agent_id)  # UnknownAgent if it does not exist
        return agent_id

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        data = await self._json_body(request)
        try:
            return model.model_validate(data)
        except ValidationError as error:
            raise InvalidRequest.from_validation_error(error) from None

    async def _json_body(self, request: Request) -> Any:
        try:
            raw = await request.body()
        except ClientDisconnect:  # gone, or cut off by the server's request timeout
            raise BadFrame("invalid", "the body ended before its Content-Length") from None
        if len(raw) > self.service.max_frame_bytes:
            raise BadFrame("too_large", f"body over {self.service.max_frame_bytes} bytes")
        return load_json(raw, "the body")

    async def healthz(self, request: Request) -> Response:
        """200 while the engine takes inputs; 503 while it stops, or while the event log
        cannot be written (``storage`` says why; reads go on)."""
        running = self.engine.running
        body: dict[str, Any] = {"status": "ok" if running else "stopping"}
        fault = self.engine.storage_fault
        try:
            body["position"] = await self.engine.store.last_position()
        except StoreError as error:
            log.warning("health check: %s", error)
            body["storage"] = "the event log cannot be read (the server's log says why)"
        if fault is not None:  # anyone may ask: the kind of fault, not paths or limits
            body["storage"] = f"the event log cannot be written: {storage_fault_kind(fault.reason)}"
            since = datetime.fromtimestamp(fault.since / 1000, UTC)
            body["storageFailingSince"] = since.isoformat()
        cluster = self.service.cluster
        if cluster is not None:  # who this is, and how much of the cluster it carries
            body["cluster"] = {"member": cluster.member, "owns": len(cluster.owned),
                               "members": len(cluster.view.members)}
        if running and "storage" in body:
            body["status"] = "degraded"
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @_guarded
    async def metrics(self, request: Request) -> Response:
        """Prometheus metrics (viewer or better)."""
        principal = self._principal(request)
        principal.check_read()
        return PlainTextResponse(self._metrics_text(principal),
                                 media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document of this API."""
        return JSONResponse(openapi_document())

    @_guarded
    async def agents(self, request: Request) -> Response:
        """Every agent in the token's scope, with its status."""
        principal = self._principal(request)
        principal.check_read()
        now = self.engine.clock.now_ms()
        waits = gate_waits_of(self.engine, now)
        return _json([self._summary(a, now, waits) for a in self.engine.agent_ids
                      if principal.may_see(a)])

    def _summary(self, agent_id: str, now: int,
                 waits: dict[str, tuple[str, GateWait]] | None = None) -> dict[str, Any]:
        """`agent_summary`, and in a cluster which process serves the agent (``servedBy``:
        its URL; null while it moves)."""
        if waits is None:
            waits = gate_waits_of(self.engine, now)
        body = agent_summary(self.engine.state(agent_id), now, waits.get(agent_id))
        cluster = self.service.cluster
        if cluster is not None:
            body["servedBy"] = cluster.owner_of(agent_id)
        return body

    @_guarded
    async def agent(self, request: Request) -> Response:
        """One agent: config, trading state and lane status."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        state = self.engine.state(agent_id)
        body = self._summary(agent_id, self.engine.clock.now_ms())
        body["config"] = state.config.model_dump(mode="json")
        body["schedules"] = schedules_view(state, self.engine.clock.now_ms())
        return _json(body)

    @_guarded
    async def schedules(self, request: Request) -> Response:
        """An agent's schedules, with when each fired last and fires next."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return _json({"schedules": schedules_view(self.engine.state(agent_id),
                                                  self.engine.clock.now_ms())})

    @_guarded
    async def put_schedule(self, request: Request) -> Response:
        """Add or replace a schedule (admin); recorded as `ScheduleChanged`, lasts until
        removed (one the config file defines goes back to the file's at a start)."""
        agent_id, schedule_id, principal = self._schedule_call(request, admin=True)
        raw = await self._json_body(request)
        if not isinstance(raw, dict):
            raise BadFrame("invalid", "the body must be a JSON object (a schedule)")
        data = {"id": schedule_id, **raw}
        try:
            schedule = Schedule.model_validate(data)
        except ValidationError as error:
            raise InvalidRequest.from_validation_error(error) from None
        changed = await self.engine.set_schedule(agent_id, schedule_id, schedule,
                                                 principal.name)
        return self._schedule_answer(agent_id, schedule_id, changed)

    @_guarded
    async def delete_schedule(self, request: Request) -> Response:
        """Remove a schedule (admin)."""
        agent_id, schedule_id, principal = self._schedule_call(request, admin=True)
        await self.engine.set_schedule(agent_id, schedule_id, None, principal.name)
        return _json({"removed": schedule_id})

    @_guarded
    async def pause_schedule(self, request: Request) -> Response:
        """Pause a schedule (admin): it fires no more until resumed, and catches nothing
        up then."""
        return await self._set_paused(request, True)

    @_guarded
    async def resume_schedule(self, request: Request) -> Response:
        """Resume a paused schedule (admin): it fires from its next time after now."""
        return await self._set_paused(request, False)

    async def _set_paused(self, request: Request, paused: bool) -> Response:
        agent_id, schedule_id, principal = self._schedule_call(request, admin=True)
        schedule = self.engine.schedule(agent_id, schedule_id)
        changed = await self.engine.set_schedule(
            agent_id, schedule_id, schedule.model_copy(update={"paused": paused}),
            principal.name)
        return self._schedule_answer(agent_id, schedule_id, changed)

    @_guarded
    async def run_schedule(self, request: Request) -> Response:
        """Fire a schedule now (an operator): a ``scheduled_audit`` request like its
        firings, marked ``manual``; its next automatic firing stays as it was."""
        agent_id, schedule_id, principal = self._schedule_call(request, admin=False)
        return _json(ack_frame(await self.engine.run_schedule(agent_id, schedule_id,
                                                              principal.name)))

    def _schedule_call(self, request: Request, *, admin: bool) -> tuple[str, str, Principal]:
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        if admin:
            principal.check_admin()
        else:
            principal.check_operate(agent_id)
        return agent_id, str(request.path_params["schedule_id"]), principal

    def _schedule_answer(self, agent_id: str, schedule_id: str, changed: bool) -> Response:
        view = schedule_view(self.engine.state(agent_id), schedule_id,
                             self.engine.clock.now_ms())
        return _json({"changed": changed, "schedule": view})

    @_guarded
    async def queue(self, request: Request) -> Response:
        """Whether the lane is busy, the current run with its duration, the pending list."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return _json(queue_view(self.engine.state(agent_id), self.engine.clock.now_ms()))

    @_guarded
    async def submit(self, request: Request) -> Response:
        """Submit one request to this agent; answered after its commit."""
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        body = await self._body(request, AgentRequest)
        if body.agent_id != agent_id:
            raise BadFrame("invalid", f"agentId {body.agent_id!r} does not match the path",
                           field="agentId")
        principal.check_submit(body)
        try:
            if body.action is None:  # the control lane is never refused as busy
                self.service.check_capacity()
            return _json(ack_frame(await self.engine.submit(body, principal.name)))
        except GatewayError as error:
            return error_response(error, body.request_id)

    @_guarded
    async def control(self, request: Request) -> Response:
        """A control-lane action (emergency_stop, pause, resume, cancel_order, cancel_all)."""
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        principal.check_operate(agent_id)
        body: ControlBody = await self._body(request, ControlBody)
        payload: dict[str, Any] = {"action": body.action.value}
        if body.order_id is not None:
            payload["orderId"] = body.order_id
        if body.reason is not None:
            payload["reason"] = body.reason
        request_id = body.request_id or f"ctl_{secrets.token_hex(8)}"
        agent_request = parse_request({
            "requestId": request_id, "createdAt": datetime.now(UTC), "agentId": agent_id,
            "kind": "user_control", "priority": "high", "source": f"http:{principal.name}",
            "payload": payload,
        })
        try:
            with self.service.pacer.urgent():  # the feed's bulk work waits for its answer
                ack = await self.engine.submit(agent_request, principal.name)
            return _json(ack_frame(ack))
        except GatewayError as error:  # with the id it was given: a retry is idempotent
            return error_response(error, request_id)

    async def _operate(self, request: Request, action: OperatorAction,
                       run_id: str | None = None) -> Response:
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        principal.check_operate(agent_id)
        decisions = await self.engine.operate(agent_id, action, principal.name, run_id)
        first = decisions[0]
        if type(first).__name__ == "OperatorRejected":
            frame = ErrorFrame(code="conflict", message=getattr(first, "reason", ""))
            return _json(frame, HTTP_STATUS["conflict"])
        return _json({"applied": True, "events": [type(d).__name__ for d in decisions],
                      "detail": getattr(first, "detail", "")})

    @_guarded
    async def clear(self, request: Request) -> Response:
        """Drop every pending request (each drop is an event with the principal)."""
        return await self._operate(request, OperatorAction.CLEAR_QUEUE)

    @_guarded
    async def release(self, request: Request) -> Response:
        """Force the lane idle: the active run is aborted (reason release)."""
        return await self._operate(request, OperatorAction.RELEASE)

    @_guarded
    async def abort(self, request: Request) -> Response:
        """Abort a run, only if it is still the active one (409 otherwise)."""
        return await self._operate(request, OperatorAction.ABORT_RUN,
                                   str(request.path_params["run_id"]))

    @_guarded
    async def configure(self, request: Request) -> Response:
        """Replace an agent's config (admin); applies to requests arriving from now on."""
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        principal.check_admin()
        principal.check_agent(agent_id)
        config = await self._body(request, AgentConfig)
        gate = self.engine.gate_of(agent_id)
        short = None if gate is None else lease_too_short(
            gate.limits.lease_ms, config.run_timeout_ms, agent_id, gate.provider)
        if short is not None:
            raise BadFrame("invalid", f"runTimeoutMs: {short}", field="runTimeoutMs")
        changed = await self.engine.configure(agent_id, config, principal.name)
        return _json({"changed": changed, "config": config.model_dump(mode="json")})

    @_guarded
    async def events(self, request: Request) -> Response:
        """The log, paged: ``after`` (position), ``agent``, ``type``, ``limit`` (<= 1000).
        With ``q`` (text) or ``before`` (position): a search back over the whole log,
        newest first (`search_events`)."""
        principal = self._principal(request)
        principal.check_read()
        query = request.query_params
        after = _int_param(query, "after", 0)
        limit = min(max(_int_param(query, "limit", 100), 1), 1000)
        agent, kind = query.get("agent") or None, query.get("type") or None
        if agent is not None:
            principal.check_read(agent)
        if "q" in query or "before" in query:
            if "after" in query:
                raise BadFrame("invalid", "give after (read forward) or before/q (search "
                               "back), not both", field="after")
            return await self.search_events(principal, query, limit, agent, kind)
        found: list[dict[str, Any]] = []
        cursor, scanned = after, 0
        while len(found) < limit and scanned < 20_000:
            page = await self.engine.store.read(after=cursor, limit=1000)
            if not page:
                break
            for record in page:
                cursor = record.position
                if (agent is None or record.stream == agent) and \
                        (kind is None or record.type == kind) and principal.may_see(record.stream):
                    found.append(event_json(record))
                    if len(found) == limit:
                        break
            scanned += len(page)
        return _json({"events": found, "next": cursor})

    @_guarded
    async def event_cause(self, request: Request) -> Response:
        """One event, the input that caused it (itself, if it is an input) and every
        decision made of that input: the events of one input are consecutive in its
        stream, so the input is the nearest earlier event of an input type."""
        principal = self._principal(request)
        principal.check_read()
        position = int(request.path_params["position"])
        found = [] if position > MAX_INT else \
            await self.engine.store.read(after=max(0, position - 1), limit=1)
        if not found or found[0].position != position or not principal.may_see(found[0].stream):
            raise BadFrame("not_found", f"no event at position {position} that this token "
                           "may see; list events with GET /api/events")
        record = found[0]
        inputs = _input_types(record.stream)
        cause: RecordedEvent | None = None
        top = record.version
        while cause is None and top > 0:  # walk back a page at a time
            page = await self.engine.store.read_stream(
                record.stream, after_version=max(0, top - CAUSE_PAGE), limit=CAUSE_PAGE)
            for earlier in reversed([r for r in page if r.version <= top]):
                if earlier.type in inputs:
                    cause = earlier
                    break
            top -= CAUSE_PAGE
        decisions: list[RecordedEvent] = []
        if cause is not None:
            after = await self.engine.store.read_stream(
                record.stream, after_version=cause.version, limit=MAX_CAUSE_DECISIONS + 1)
            for later in after:
                if later.type in inputs:
                    break
                decisions.append(later)
        return _json({
            "event": event_json(record),
            "input": None if cause is None else event_json(cause),
            "decisions": [event_json(r) for r in decisions[:MAX_CAUSE_DECISIONS]],
            "truncated": len(decisions) > MAX_CAUSE_DECISIONS,
        })

    @_guarded
    async def event_types(self, request: Request) -> Response:
        """Which event types are inputs and which are decisions, for agent streams and
        provider gate streams (a client classifies events without a copy of the list)."""
        self._principal(request).check_read()
        return _json({
            "agent": {"inputs": [t.__name__ for t in INPUT_TYPES],
                      "decisions": [t.__name__ for t in DECISION_TYPES]},
            "provider": {"inputs": [t.__name__ for t in GATE_INPUT_TYPES],
                         "decisions": [t.__name__ for t in GATE_DECISION_TYPES]},
        })

    @_guarded
    async def agent_events(self, request: Request) -> Response:
        """One agent's stream, newest last: the ``limit`` (<= 2000, default 500) events with
        a version below ``beforeVersion`` (default: the newest). Page back with the first
        version you got."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        query = request.query_params
        limit = min(max(_int_param(query, "limit", 500), 1), 2000)
        before = _int_param(query, "beforeVersion", 0)
        # The state's version may run ahead of the commit, never behind it.
        top = self.engine.state(agent_id).version if before == 0 else before - 1
        records = [r for r in await self.engine.store.read_stream(
            agent_id, after_version=max(0, top - limit), limit=limit) if r.version <= top]
        return _json({"agentId": agent_id, "events": [event_json(r) for r in records],
                      "more": bool(records) and records[0].version > 1})

    @_guarded
    async def calls(self, request: Request) -> Response:
        """The sub-agent call trees of an agent's runs, from the log: its newest ``limit``
        (<= 200, default 20) runs that made calls, or the one ``run``; each call with its
        status, result and the calls its target made while serving it (agents outside the
        token's scope are not followed)."""
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        principal.check_read(agent_id)
        query = request.query_params
        limit = min(max(_int_param(query, "limit", 20), 1), 200)
        known = set(self.engine.agent_ids)
        trees = CallTrees()
        followed: set[str] = set()
        waiting = [agent_id]
        while waiting:
            stream = waiting.pop()
            followed.add(stream)
            records = await self.engine.store.read_stream(stream)
            reader = self.engine.reader
            trees.add(stream, [reader.decode(r) for r in records if r.type in CALL_EVENT_TYPES])
            waiting = sorted({t for t in trees.targets() - followed
                              if t in known and principal.may_see(t)})
        return _json(trees.tree(agent_id, query.get("run"), limit))

    @_guarded
    async def replay(self, request: Request) -> Response:
        """An agent's queue exactly as it was at a log position (``agent``, ``position``:
        default the last), rebuilt from the log, with the events around that position
        (``around``, default 10 each side)."""
        principal = self._principal(request)
        query = request.query_params
        agent_id = query.get("agent")
        if not agent_id:
            raise BadFrame("invalid", "agent is required", field="agent")
        principal.check_read(agent_id)
        self.engine.state(agent_id)  # UnknownAgent if it does not exist
        last = await self.engine.store.last_position()
        position = _int_param(query, "position", last)
        around = min(_int_param(query, "around", 10), 200)
        records = await self.engine.store.read_stream(agent_id)
        upto = [r for r in records if r.position <= position]
        state = await state_after(self.engine.store, agent_id, upto,  # a snapshot if worth it
                                  reader=self.engine.reader)
        index = len(upto)
        nearby = records[max(0, index - around):index + around]
        return _json({
            "agentId": agent_id,
            "position": position,
            "eventPosition": upto[-1].position if upto else 0,
            "version": state.version,
            "at": state.now,
            "status": agent_summary(state, state.now),
            "queue": queue_view(state, state.now),
            "around": [event_json(r) for r in nearby],
        })

    # ------------------------------------------------------------ time travel as a story

    async def _story_read(self, request: Request) -> tuple[str, int]:
        """The path's agent (readable by the caller) and the log's last position."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return agent_id, await self.engine.store.last_position()

    async def _state_at(self, agent_id: str, position: int) -> tuple[AgentState, int]:
        """The agent replayed from the log up to ``position``, and the position of its last
        event folded (0: none)."""
        records = [r for r in await self.engine.store.read_stream(agent_id)
                   if r.position <= position]
        state = await state_after(self.engine.store, agent_id, records,
                                  reader=self.engine.reader)
        return state, records[-1].position if records else 0

    @_guarded
    async def story(self, request: Request) -> Response:
        """An agent's stream as groups, each an input and the decisions it caused, worded as
        ``gateway timeline`` words them: those with their input in [``from``, ``to``] (at
        most ``limit``, <= 1000, default 200), or, given ``at``, the group holding that
        position with ``around`` (<= 100, default 3) groups each side."""
        agent_id, last = await self._story_read(request)
        query = request.query_params
        reader = self.engine.reader
        records = await self.engine.store.read_stream(agent_id)
        found = spans(records, reader)
        if query.get("at"):
            at = _position_param(query, "at", last, last)
            count = min(_int_param(query, "around", 3), 100)
            chosen, index = around(records, found, at, count)
            return _json(answer(StoryJson, {
                "agentId": agent_id, "at": at, "index": index, "more": False,
                "groups": [group_json(g) for g in told(records, chosen, reader)]}))
        start = _position_param(query, "from", 0, last)
        upto = _position_param(query, "to", last, last)
        limit = min(max(_int_param(query, "limit", 200), 1), 1000)
        inside = [span for span in found if start <= records[span[0]].position <= upto]
        return _json(answer(StoryJson, {
            "agentId": agent_id, "from": start, "to": upto, "more": len(inside) > limit,
            "groups": [group_json(g) for g in told(records, inside[:limit], reader)]}))

    @_guarded
    async def story_find(self, request: Request) -> Response:
        """The position of the next decision of a ``kind`` (stop, drop or suppression) after
        ``after``, or of the previous one before ``before`` (null: none)."""
        agent_id, last = await self._story_read(request)
        query = request.query_params
        kind = query.get("kind", "")
        if kind not in JUMP_KINDS:
            raise BadFrame("invalid", f"kind must be one of {', '.join(JUMP_KINDS)}, got "
                           f"{kind[:40]!r}", field="kind")
        if ("after" in query) == ("before" in query):
            raise BadFrame("invalid", "give after (the next one) or before (the previous "
                           "one), not both", field="after")
        after = _position_param(query, "after", 0, last) if "after" in query else None
        before = _position_param(query, "before", 0, last + 1) if "before" in query else None
        records = await self.engine.store.read_stream(agent_id)
        return _json(answer(FoundJson, {
            "agentId": agent_id, "kind": kind,
            "position": find(records, self.engine.reader, kind, after, before)}))

    @_guarded
    async def moment(self, request: Request) -> Response:
        """An agent as it was at a log ``position`` (default the last), replayed from the
        log: trading, lane and why it waits, runs in the last hour and day against their
        budgets, cooldown, suppression, hold, pending list, orders, positions, and what its
        provider gate held for it then."""
        agent_id, last = await self._story_read(request)
        position = _position_param(request.query_params, "position", last, last)
        state, folded = await self._state_at(agent_id, position)
        gate = self.engine.gate_of(agent_id)
        gate_state = None
        if gate is not None and state.active is not None:  # only a run asks for slots
            gate_state = gate_at(gate.stream, [
                r for r in await self.engine.store.read_stream(gate.stream)
                if r.position <= position])
        view = gate_json(agent_id, None if gate is None else gate.provider, gate_state)
        return _json(answer(MomentJson, moment_json(state, view, position, folded)))

    @_guarded
    async def diff(self, request: Request) -> Response:
        """What changed in an agent between two log positions (``from``, ``to``), each state
        replayed from the log: facts that differ, pending requests added and removed, orders
        opened, closed and filled, positions per symbol."""
        agent_id, last = await self._story_read(request)
        query = request.query_params
        for name in ("from", "to"):
            if not query.get(name):
                raise BadFrame("invalid", f"{name} (a log position) is required", field=name)
        start = _position_param(query, "from", 0, last)
        upto = _position_param(query, "to", last, last)
        before, before_at = await self._state_at(agent_id, start)
        after, after_at = await self._state_at(agent_id, upto)
        return _json(answer(DiffJson, diff_json(
            before, after,
            {"position": start, "eventPosition": before_at, "version": before.version,
             "at": before.now},
            {"position": upto, "eventPosition": after_at, "version": after.version,
             "at": after.now})))

    @_guarded
    async def orders(self, request: Request) -> Response:
        """The desk's blotter: open orders, fills, cancels, rejections and positions of every
        agent in the token's scope (or the one ``agent``), from the log; ``symbol`` keeps
        one symbol, ``limit`` (1-1000, default 100) bounds each history list."""
        principal = self._principal(request)
        principal.check_read()
        query = parse_query(request.query_params, ("agent", "symbol", "limit"))
        if query.agent is not None:
            principal.check_read(query.agent)
            self.engine.state(query.agent)  # UnknownAgent if it does not exist
            agents = [query.agent]
        else:
            agents = [a for a in self.engine.agent_ids if principal.may_see(a)]
        return await self._blotter(agents, query)

    @_guarded
    async def agent_orders(self, request: Request) -> Response:
        """One agent's blotter (as `orders` for that agent; ``symbol``, ``limit``)."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return await self._blotter([agent_id], parse_query(request.query_params,
                                                           ("symbol", "limit")))

    async def _blotter(self, agents: list[str], query: BlotterQuery) -> Response:
        blotters = await self.blotters.blotters(self.engine.store, self.engine.reader, agents)
        view = blotter_view(blotters, self.engine.clock.now_ms(), query)
        return JSONResponse(view.model_dump(mode="json"))

    def _gate(self, request: Request) -> ProviderGate:
        name = str(request.path_params["name"])
        gate = self.engine.gates.get(name)
        if gate is None:
            raise UnknownProvider(name)
        return gate

    @_guarded
    async def providers(self, request: Request) -> Response:
        """Every provider gate: limits, usage in the current windows, waiting agents,
        breaker state and next retry."""
        principal = self._principal(request)
        principal.check_read()
        now = self.engine.clock.now_ms()
        return _json({"providers": [provider_summary(name, gate, now, principal)
                                    for name, gate in sorted(self.engine.gates.items())]})

    @_guarded
    async def provider(self, request: Request) -> Response:
        """One provider gate (404 if there is none of that name)."""
        principal = self._principal(request)
        principal.check_read()
        gate = self._gate(request)
        return _json(provider_summary(gate.provider, gate, self.engine.clock.now_ms(),
                                      principal))

    @_guarded
    async def provider_limits(self, request: Request) -> Response:
        """Replace a provider gate's limits (admin); they apply to requests not yet granted
        (recorded as ``GateLimitsChanged`` in the provider's stream)."""
        principal = self._principal(request)
        principal.check_admin()
        if principal.agents is not None:
            raise Forbidden("a token scoped to some agents cannot change a provider's limits "
                            "(they are shared by every agent)")
        gate = self._gate(request)
        given = await self._body(request, GateLimits)
        try:  # the keys given replace those in force; the others stay
            limits = GateLimits.model_validate({
                **gate.limits.model_dump(by_alias=False),
                **{name: getattr(given, name) for name in given.model_fields_set}})
        except ValidationError as error:
            raise InvalidRequest.from_validation_error(error) from None
        for agent_id in self.engine.agent_ids:
            short = None if self.engine.gate_of(agent_id) is not gate else lease_too_short(
                limits.lease_ms, self.engine.state(agent_id).config.run_timeout_ms, agent_id,
                gate.provider)
            if short is not None:
                raise BadFrame("invalid", f"leaseMs: {short}", field="leaseMs")
        changed = await gate.set_limits(limits)
        return _json({"changed": changed, "limits": limits.model_dump(mode="json")})

    # Histories for people, from the log (gateway.history).

    async def search_events(self, principal: Principal, query: Mapping[str, str], limit: int,
                            agent: str | None, kind: str | None) -> Response:
        """The newest ``limit`` events below position ``before`` (default: all) with ``q``
        in their type, stream or data, of ``agent`` and ``type`` if given, in the token's
        scope, newest first; ``before`` in the answer goes on (None: the start of the log
        was reached). Each answer looks at a bounded number of events (``scanned``)."""
        text = query.get("q", "")
        if len(text) > MAX_SEARCH_TEXT:
            raise BadFrame("invalid", f"q is at most {MAX_SEARCH_TEXT} characters", field="q")
        store = self.engine.store
        before = _int_param(query, "before", 0) or await store.last_position() + 1
        matches = event_matcher(text, agent, kind, principal.may_see)
        found, more, scanned = await search_back(
            lambda after, size: store.read(after=after, limit=size), before, limit, matches)
        return _json({"events": [event_json(r) for r in found], "before": more,
                      "scanned": scanned})

    @_guarded
    async def runs(self, request: Request) -> Response:
        """An agent's runs, newest first, from the log: ``limit`` (<= 100, default 20) runs
        started below version ``before``; each with its requests, outcome, tokens, time
        waiting at the provider gate and in the model, orders, calls and answer."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        query = request.query_params
        limit = _int_param(query, "limit", 20)
        if not 1 <= limit <= 100:
            raise BadFrame("invalid", "limit must be between 1 and 100", field="limit")
        before = _int_param(query, "before", 0) or None
        gate = self.engine.gate_of(agent_id)
        return _json(await run_history(
            self.engine.store, agent_id, self.engine.state(agent_id).version, before=before,
            limit=limit, gate=None if gate is None else (gate.stream, gate.state.version)))

    @_guarded
    async def charts(self, request: Request) -> Response:
        """Per-agent series from the log (`gateway.history.SERIES`) over [``from``, ``to``)
        (ms since the epoch; default the last hour) in steps of ``step`` ms (default: 120
        points), for the ``agent``s named (comma-separated; default every one in the
        token's scope, at most `MAX_CHART_AGENTS`), with stop, pause, resume and hold
        marks (who and when)."""
        principal = self._principal(request)
        principal.check_read()
        query = request.query_params
        now = self.engine.clock.now_ms()
        end = _int_param(query, "to", now)
        start = _int_param(query, "from", max(0, end - 3_600_000))
        if start >= end:
            raise BadFrame("invalid", "from must be before to", field="from")
        step = _int_param(query, "step", max(1_000, -(-(end - start) // 120)))
        if step < 1_000:
            raise BadFrame("invalid", "step must be at least 1000 ms", field="step")
        if -(-(end - start) // step) > MAX_BUCKETS:
            raise BadFrame("invalid", f"from..to holds more than {MAX_BUCKETS} steps; "
                           "make step larger or the window shorter", field="step")
        named = [a for a in query.get("agent", "").split(",") if a]
        if len(named) > MAX_CHART_AGENTS:
            raise BadFrame("invalid", f"at most {MAX_CHART_AGENTS} agents at once",
                           field="agent")
        for agent_id in named:
            principal.check_read(agent_id)
            self.engine.state(agent_id)  # UnknownAgent if it does not exist
        agents = named or [a for a in self.engine.agent_ids if principal.may_see(a)][
            :MAX_CHART_AGENTS]
        found = [await agent_series(self.engine.store, a, self.engine.state(a).version,
                                    start=start, end=end, step=step) for a in agents]
        marks = sorted((m for f in found for m in f.pop("marks")), key=lambda m: m["at"])
        return _json({"from": start, "to": end, "step": step, "agents": found,
                      "marks": marks})

    def _metrics_text(self, principal: Principal) -> str:
        engine = self.engine
        now = engine.clock.now_ms()
        views = [status(engine.state(a), now) for a in engine.agent_ids
                 if principal.may_see(a)]

        def per_agent(get: Callable[[Any], float]) -> list[str]:
            return [f'{{agent="{label(v.agent_id)}"}} {get(v)}' for v in views]

        def gauge(name: str, help_text: str, get: Callable[[Any], float],
                  kind: str = "gauge") -> list[str]:
            return family(name, kind, help_text, (name + s for s in per_agent(get)))

        lines = [
            *gauge("gateway_pending_requests", "Requests waiting in the reasoning lane.",
                   lambda v: v.pending),
            *gauge("gateway_oldest_pending_seconds", "Age of the oldest pending request.",
                   lambda v: (v.oldest_pending_age_ms or 0) / 1000),
            *gauge("gateway_active_run_seconds", "Duration of the active run (0: idle).",
                   lambda v: v.active_run.duration_ms / 1000 if v.active_run else 0),
            *gauge("gateway_halted", "1 while the agent is HALTED.",
                   lambda v: int(v.trading.value == "HALTED")),
            *gauge("gateway_runs_total", "Runs started.", lambda v: v.counters.runs, "counter"),
            *gauge("gateway_aborts_total", "Runs aborted.", lambda v: v.counters.aborts,
                   "counter"),
            *gauge("gateway_drops_total", "Requests dropped.", lambda v: v.counters.drops,
                   "counter"),
            *gauge("gateway_dedupes_total", "Requests deduped.", lambda v: v.counters.dedupes,
                   "counter"),
            *gauge("gateway_budget_suppressions_total", "Times runs were held by a budget.",
                   lambda v: v.counters.suppressions, "counter"),
            *gauge("gateway_suppressed", "1 while a budget suppresses the agent's runs.",
                   lambda v: int(v.suppressed_until is not None)),
            *gauge("gateway_held", "1 while the agent's runs are held until a resume "
                   "(the provider refused for spend).", lambda v: int(v.held is not None)),
            *family("gateway_agents", "gauge",
                    "Agents now, by what holds them: HALTED, REDUCING, suppressed by a "
                    "budget, held until a resume (an alert on any of them needs no other "
                    "series).",
                    [f'gateway_agents{{state="{name}"}} {count}' for name, count in (
                        ("halted", sum(v.trading.value == "HALTED" for v in views)),
                        ("reducing", sum(v.trading.value == "REDUCING" for v in views)),
                        ("suppressed", sum(v.suppressed_until is not None for v in views)),
                        ("held", sum(v.held is not None for v in views)))]),
            *family("gateway_requests_received_total", "counter",
                    "Requests received (its rate is the ingest rate).",
                    [f"gateway_requests_received_total {engine.requests_received}"]),
            *family("gateway_commit_backlog", "gauge", "Appends waiting for their commit.",
                    [f"gateway_commit_backlog {engine.backlog}"]),
            *family("gateway_log_backlog_events", "gauge",
                    "Events appended and not committed yet.",
                    [f"gateway_log_backlog_events {engine.store.backlog}"]),
            *family("gateway_log_commit_rate_events_per_second", "gauge",
                    "Events the log commits per second of its writer's busy time, lately.",
                    [f"gateway_log_commit_rate_events_per_second "
                     f"{engine.store.commit_rate or 0:.0f}"]),
            *family("gateway_intake_budget_events", "gauge",
                    "Events the log commits in the intake's latency budget: feed frames past "
                    "it are answered busy.",
                    [f"gateway_intake_budget_events {self.service.intake.budget()}"]),
            *family("gateway_intake_busy_total", "counter",
                    "Frames and requests answered busy by the intake (nothing taken).",
                    [f"gateway_intake_busy_total {self.service.intake.refused}"]),
            *family("gateway_commit_latency_seconds", "histogram",
                    "From a decision to the commit that holds it.",
                    engine.commit_latency.lines("gateway_commit_latency_seconds")),
            *family("gateway_control_commit_latency_seconds", "histogram",
                    "From a control-lane decision (stop, pause, resume, cancel) to its commit.",
                    engine.control_commit_latency.lines(
                        "gateway_control_commit_latency_seconds")),
            *family("gateway_run_duration_seconds", "histogram", "Run durations.",
                    engine.run_durations.lines("gateway_run_duration_seconds")),
            *gauge("gateway_runs_held", "1 while runs are held after a provider spend limit.",
                   lambda v: int(v.held is not None)),
            *self._connection_metrics(),
            *self._cluster_metrics(),
            *self._gate_metrics(now),
        ]
        return "\n".join(lines) + "\n"

    def _connection_metrics(self) -> list[str]:
        connections = self.service.connections
        return [
            *family("gateway_websocket_connections", "gauge",
                    "WebSocket connections open (authenticated or not).",
                    [f'gateway_websocket_connections{{endpoint="{e}"}} {n}'
                     for e, n in connections.open.items()]),
            *family("gateway_websocket_unauthenticated", "gauge",
                    "WebSocket connections waiting for their auth frame.",
                    [f"gateway_websocket_unauthenticated {connections.unauthenticated}"]),
            *family("gateway_websocket_refused_total", "counter",
                    "WebSocket handshakes answered 503: a connection cap was full.",
                    [f"gateway_websocket_refused_total {connections.refused}"]),
            *family("gateway_websocket_closed_total", "counter",
                    "WebSocket connections closed by a limit (1008).",
                    [f'gateway_websocket_closed_total{{reason="auth_timeout"}} '
                     f"{connections.auth_timeouts}",
                     f'gateway_websocket_closed_total{{reason="slow_reader"}} '
                     f"{connections.slow_readers}"]),
            *family("gateway_asyncio_tasks", "gauge",
                    "Tasks alive in the server's event loop (connections, commits, runs).",
                    [f"gateway_asyncio_tasks {len(asyncio.all_tasks())}"]),
        ]

    def _cluster_metrics(self) -> list[str]:
        cluster = self.service.cluster
        if cluster is None:
            return []
        return [
            *family("gateway_cluster_members", "gauge",
                    "Live processes of this log's cluster, as this one last read them.",
                    [f"gateway_cluster_members {len(cluster.view.members)}"]),
            *family("gateway_cluster_owned_streams", "gauge",
                    "Agents and provider gates this process owns now.",
                    [f"gateway_cluster_owned_streams {len(cluster.owned)}"]),
            *family("gateway_cluster_takeovers_total", "counter",
                    "Streams this process adopted (at its start, a hand-over or a failover).",
                    [f"gateway_cluster_takeovers_total {cluster.takeovers}"]),
        ]

    def _gate_metrics(self, now: int) -> list[str]:
        statuses = [(name, gate.status()) for name, gate in sorted(self.engine.gates.items())]
        if not statuses:
            return []

        def per_gate(name: str, kind: str, help_text: str,
                     get: Callable[[GateStatus], float | None]) -> list[str]:
            samples = [(n, get(v)) for n, v in statuses]
            return family(name, kind, help_text,
                          [f'{name}{{provider="{label(n)}"}} {value}'
                           for n, value in samples if value is not None])

        return [
            *per_gate("gateway_provider_window_requests", "gauge",
                      "Requests granted in the last 60 s.", lambda v: v.window_requests),
            *per_gate("gateway_provider_requests_per_minute_limit", "gauge",
                      "The requests-per-minute limit.", lambda v: v.limits.requests_per_minute),
            *per_gate("gateway_provider_window_input_tokens", "gauge",
                      "Input tokens charged in the last 60 s.", lambda v: v.window_input_tokens),
            *per_gate("gateway_provider_window_output_tokens", "gauge",
                      "Output tokens charged in the last 60 s.",
                      lambda v: v.window_output_tokens),
            *per_gate("gateway_provider_in_flight", "gauge", "Slots granted and not given back.",
                      lambda v: v.in_flight),
            *per_gate("gateway_provider_waiting", "gauge", "Requests waiting for a slot.",
                      lambda v: v.waiting),
            *per_gate("gateway_provider_oldest_wait_seconds", "gauge",
                      "The longest current wait for a slot.",
                      lambda v: max((a.oldest_wait_ms for a in v.waiting_agents), default=0)
                      / 1000),
            *per_gate("gateway_provider_breaker_open", "gauge",
                      "Circuit breaker: 0 closed, 1 open, 0.5 half-open.",
                      lambda v: {"closed": 0, "open": 1}.get(v.breaker.value, 0.5)),
            *per_gate("gateway_provider_backoff_seconds", "gauge",
                      "Time left of a running backoff.",
                      lambda v: max(0, (v.next_retry or now) - now) / 1000),
            *per_gate("gateway_provider_granted_total", "counter", "Slots granted.",
                      lambda v: v.counters.granted),
            *per_gate("gateway_provider_refused_total", "counter", "Slot requests refused.",
                      lambda v: v.counters.refused),
            *per_gate("gateway_provider_backoffs_total", "counter", "Backoffs scheduled.",
                      lambda v: v.counters.backoffs),
            *per_gate("gateway_provider_breaker_opens_total", "counter",
                      "Times the breaker opened.", lambda v: v.counters.breaker_opens),
            *per_gate("gateway_provider_spend_limits_total", "counter",
                      "Spend-limit answers.", lambda v: v.counters.spend_limits),
            *per_gate("gateway_provider_expired_total", "counter",
                      "Slots freed by their lease deadline (leaks caught).",
                      lambda v: v.counters.expired),
            *per_gate("gateway_provider_input_tokens_total", "counter",
                      "Input tokens reported by the provider.", lambda v: v.counters.input_tokens),
            *per_gate("gateway_provider_output_tokens_total", "counter",
                      "Output tokens reported by the provider.",
                      lambda v: v.counters.output_tokens),
        ]


def _int_param(query: Mapping[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadFrame("invalid", f"{name} must be an integer, got {raw[:40]!r}",
                       field=name) from None
    if not 0 <= value <= MAX_INT:
        raise BadFrame("invalid", f"{name} must be between 0 and 2^63-1", field=name)
    return value


def _position_param(query: Mapping[str, str], name: str, default: int, last: int) -> int:
    """A log position from the query, no later than ``last`` (the end of the log)."""
    value = _int_param(query, name, default)
    if value > last:
        raise BadFrame("invalid", f"{name} {value} is past the end of the log (position "
                       f"{last})", field=name)
    return value


def _input_types(stream: str) -> frozenset[str]:
    """The names of the input event types of a stream (agent or provider gate)."""
    types = INPUT_TYPES if is_agent_stream(stream) else GATE_INPUT_TYPES
    return frozenset(t.__name__ for t in types)


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def own_origins(host: str, port: int) -> frozenset[str]:
    """The origins of a gateway bound to ``host``:``port``: its own address, every loopback
    name when it is bound to a loopback or to every interface, and the machine's name when
    bound to every interface. Other names (a proxy's, a LAN address) go in
    ``server.allowed_origins``."""
    shown = f"[{host}]" if ":" in host else host
    names = {shown}
    everywhere = host in ("0.0.0.0", "::")
    if everywhere or shown in LOOPBACK_NAMES or host.startswith("127."):
        names.update(LOOPBACK_NAMES)
    if everywhere:
        names.add(socket.gethostname())
    return frozenset(f"{scheme}://{name}:{port}" for name in names for scheme in ("http", "https"))


# ------------------------------------------------------------------------------ views


def gate_waits_of(engine: Engine, now: int) -> dict[str, tuple[str, GateWait]]:
    """Agent id -> (provider, why its calls wait there), for the agents waiting at a gate."""
    return {agent_id: (name, wait) for name, gate in engine.gates.items()
            for agent_id, wait in gate_waits(gate.state, now).items()}


def agent_summary(state: AgentState, now: int,
                  wait: tuple[str, GateWait] | None = None) -> dict[str, Any]:
    """An agent's status as JSON (camelCase, as everything on the wire), with why it is
    blocked (``blocked``, ``attention``: see `gateway.blocked`; ``wait`` is its provider and
    why its calls wait at that gate, if they do)."""
    view = status(state, now)
    body: dict[str, Any] = _camel(asdict(view))
    body["blocked"], body["attention"] = blocked_view(
        state, now, *(wait if wait is not None else (None, None)))
    body["budgets"] = state.config.budgets.model_dump(mode="json")
    book = state.calls
    body["calls"] = {"queued": len(book.queue), "out": book.out,
                     "ended": {s.value: n for s, n in book.ended.items()},
                     "answered": book.answered}
    return body


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {to_camel(k): _camel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_camel(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def provider_summary(name: str, gate: ProviderGate, now: int,
                     principal: Principal | None = None) -> dict[str, Any]:
    """A provider gate's status as JSON; waiting agents outside the principal's scope are
    counted but not named."""
    view = gate_status(gate.state, now)
    body: dict[str, Any] = _camel({**asdict(view), "limits": {}})
    body["name"] = name
    body["stream"] = gate.stream
    body["limits"] = view.limits.model_dump(mode="json")
    if principal is not None:
        body["waitingAgents"] = [a for a in body["waitingAgents"]
                                 if principal.may_see(a["agentId"])]
    return body


def schedules_view(state: AgentState, now: int) -> list[dict[str, Any]]:
    """An agent's schedules as JSON (`schedule_view` of each)."""
    return [schedule_view(state, schedule_id, now) for schedule_id in state.schedules]


def schedule_view(state: AgentState, schedule_id: str, now: int) -> dict[str, Any]:
    """One schedule as JSON: its definition, with ``lastFireAt``, ``nextFireAt`` (None while
    paused), ``fired``, ``since`` (ISO times) and ``fromFile``."""
    entry = state.schedules[schedule_id]
    view = entry.schedule.model_dump(mode="json", by_alias=True)
    next_at = next_fire_at(state, schedule_id, now)
    view.update(since=iso(from_ms(entry.since)), fired=entry.fired,
                lastFireAt=None if entry.last_fire is None else iso(from_ms(entry.last_fire)),
                nextFireAt=None if next_at is None else iso(from_ms(next_at)),
                fromFile=entry.from_file)
    return view


def queue_view(state: AgentState, now: int) -> dict[str, Any]:
    """Busy or not, the current run with its duration, the pending list with ages."""
    run = state.active
    return {
        "agentId": state.agent_id,
        "busy": run is not None,
        "trading": state.trading.value,
        "run": None if run is None else {
            "runId": run.run_id, "startedAt": run.started_at,
            "durationMs": max(0, now - run.started_at), "deadline": run.deadline,
            "steerable": run.steerable, "steers": run.steers,
            "requests": [p.request.request_id for p in run.requests],
        },
        "pending": [
            {"requestId": p.request.request_id, "kind": p.request.kind.value,
             "priority": p.request.priority.value, "mode": p.mode.value,
             "dedupeKey": p.request.dedupe_key, "ageMs": max(0, now - p.at)}
            for p in state.pending
        ],
    }


def event_json(record: RecordedEvent) -> dict[str, Any]:
    """A committed event as JSON."""
    return {"position": record.position, "stream": record.stream, "version": record.version,
            "type": record.type, "data": json.loads(record.data),
            "recordedAt": record.recorded_at}


FRAME_TEXT_BUDGET = 256 * 1024
"""An `EventsFrame` holds no more characters of events than this (unless one alone has)."""


def event_frame_text(record: RecordedEvent) -> str:
    """``record`` as the JSON text of an `EventFrame`, built around the stored JSON of its
    data: the same JSON as the model gives, without parsing and encoding the data again.

    Data that may not be strict JSON is encoded again as the model would: ``NaN`` and
    ``Infinity`` (an import before they were refused could store them) become ``null``.
    Data that is not a JSON object raises `ValueError`."""
    data = record.data
    if not (data.startswith("{") and data.endswith("}")) or "NaN" in data or \
            "Infinity" in data:
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError(f"the data of the event at position {record.position} is not "
                             "a JSON object")
        data = pydantic_core.to_json(value, inf_nan_mode="null").decode()
    return (f'{{"type":"event","position":{record.position},"stream":{json.dumps(record.stream)},'
            f'"version":{record.version},"eventType":{json.dumps(record.type)},'
            f'"data":{data},"recordedAt":{record.recorded_at}}}')


def events_frames(texts: list[str]) -> Iterator[str]:
    """The texts of `EventsFrame`s holding the event frame ``texts`` in order: at most
    `EVENTS_PER_FRAME` events and about `FRAME_TEXT_BUDGET` characters each."""
    start = size = 0
    for index, text in enumerate(texts):
        if index > start and (index - start == EVENTS_PER_FRAME
                              or size + len(text) > FRAME_TEXT_BUDGET):
            yield '{"type":"events","events":[' + ",".join(texts[start:index]) + "]}"
            start, size = index, 0
        size += len(text)
    if start < len(texts):
        yield '{"type":"events","events":[' + ",".join(texts[start:]) + "]}"


# ---------------------------------------------------------------------------- WebSocket


def partial_ws(service: Service, endpoint: str) -> Callable[[WebSocket], Awaitable[None]]:
    """The handler of one WebSocket endpoint (``feed`` or ``control``)."""

    async def handle(websocket: WebSocket) -> None:
        await Session(service, websocket, endpoint).run()

    return handle


class Session:
    """One WebSocket connection: authenticate, then frames in, answers out."""

    def __init__(self, service: Service, websocket: WebSocket, endpoint: str) -> None:
        self.service = service
        self.engine = service.engine
        self.ws = websocket
        self.endpoint = endpoint
        self.principal: Principal | None = None
        self.bad_frames = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.inflight_bytes = 0
        self.drained = asyncio.Event()
        self.send_lock = asyncio.Lock()
        self.closing = False
        self.subscription: asyncio.Task[None] | None = None
        self.last_sent = 0.0
        """When the last frame went out (the event loop's clock)."""

    async def run(self) -> None:
        """Serve the connection until it closes."""
        if not self.service.origin_allowed(self.ws.headers.get("origin")):
            await self.ws.close(code=POLICY_VIOLATION, reason="origin not allowed")
            return
        connections = self.service.connections
        # A token in the header (or a subprotocol) is checked at once; only a client that
        # authenticates by its first frame waits unauthenticated, and those have a smaller
        # share, so that anonymous connections cannot take every place from clients with
        # tokens.
        by_frame = not self.ws.headers.get("authorization") and self._offered_token() is None
        if connections.total >= self.service.max_connections:
            await self._refuse(f"{self.service.max_connections} WebSocket connections are "
                               "open, the most this gateway takes (server.max_connections)")
            return
        if by_frame and connections.unauthenticated >= self.service.max_unauthenticated:
            await self._refuse(f"{self.service.max_unauthenticated} WebSocket connections are "
                               "waiting for their auth frame, the most this gateway takes "
                               "(server.max_unauthenticated); a client that sends its token "
                               "in the Authorization header (or a browser, as the "
                               "subprotocol bearer.<base64url token>) is not counted")
            return
        connections.open[self.endpoint] += 1
        if by_frame:
            connections.unauthenticated += 1
        try:
            try:
                # A browser that sent its token as a subprotocol is answered with the
                # protocol's own name (never the token): it fails the connection otherwise.
                await self.ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in
                                     self.ws.scope.get("subprotocols", ()) else None)
                authenticated = await self._authenticate()
            finally:
                if by_frame:
                    connections.unauthenticated -= 1
            if authenticated:
                await self._serve()
        except WebSocketDisconnect:
            pass
        finally:
            connections.open[self.endpoint] -= 1
            for task in [*self.tasks, *([self.subscription] if self.subscription else [])]:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _offered_token(self) -> str | None:
        """The ``bearer.<base64url token>`` subprotocol the client offered, if any."""
        for offered in self.ws.scope.get("subprotocols", ()):
            if offered.startswith(TOKEN_SUBPROTOCOL):
                return str(offered)
        return None

    async def _refuse(self, why: str) -> None:
        """Answer the handshake 503 (``busy``, ``Retry-After``): a connection cap is full."""
        self.service.connections.refused += 1
        frame = ErrorFrame(code="busy", message=f"{why}; retry later")
        response = JSONResponse(frame.model_dump(mode="json", exclude_none=True),
                                status_code=HTTP_STATUS["busy"], headers={"Retry-After": "1"})
        try:
            await self.ws.send_denial_response(response)
        except RuntimeError:  # a server without the denial extension: a plain refusal (403)
            await self.ws.close(code=TRY_AGAIN_LATER, reason="too many connections")

    async def _authenticate(self) -> bool:
        tokens = self.service.tokens
        try:
            header = self.ws.headers.get("authorization")
            offered = self._offered_token()
            if header:
                principal = tokens.from_header(header)
            elif offered is not None:
                principal = tokens.authenticate(_subprotocol_token(offered))
            else:
                message = await asyncio.wait_for(self.ws.receive(),
                                                 self.service.auth_timeout_s)
                if message["type"] == "websocket.disconnect":
                    return False
                frame = await self._validate(load_json(_raw(message)))
                if not isinstance(frame, Auth):
                    raise Unauthorized("the first frame must be {\"type\": \"auth\", ...}")
                principal = tokens.authenticate(frame.token)
            if self.endpoint == "feed":
                principal.check_feed()
            elif principal.role is Role.FEED:
                raise Forbidden("a feed token connects to /ws/feed; /ws/control takes viewer, "
                                "control and admin tokens")
        except (GatewayError, InvalidRequest, TimeoutError, WebSocketDisconnect) as error:
            if isinstance(error, WebSocketDisconnect):
                return False
            if isinstance(error, TimeoutError):
                self.service.connections.auth_timeouts += 1
                error = Unauthorized("no auth frame in time")
            await self._send(error_frame(error))
            await self.ws.close(code=POLICY_VIOLATION, reason=getattr(error, "code", "auth"))
            return False
        self.principal = principal
        scope = None if principal.agents is None else sorted(principal.agents)
        beat = self.service.heartbeat_s
        await self._send(Hello(principal=principal.name, role=principal.role.value,
                               agents=scope, heartbeat_ms=round(beat * 1000) if beat else None))
        return True

    async def _serve(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect" or self.closing:
                return  # closing: a slow reader; what it sent after that is not taken
            raw = _raw(message)
            try:
                limit = self.service.max_frame_bytes
                if len(raw) > limit or (isinstance(raw, str) and 4 * len(raw) > limit
                                        and len(raw.encode()) > limit):
                    raise BadFrame("too_large", f"frame over {self.service.max_frame_bytes} "
                                   "bytes; split it")
                if self.endpoint == "feed":
                    async with self.service.pacer.turn():
                        data = load_json(raw)
                    if isinstance(data, dict) and data.get("type") in WORK_TYPES:
                        retry = self.service.intake.admit(self)
                        if retry is not None:  # nothing taken: the client sends it later
                            await self._send(BusyFrame(id=_frame_id(data),
                                                       retry_after_ms=retry))
                            continue
                else:
                    data = load_json(raw)
                frame = await self._validate(data)
            except (BadFrame, InvalidRequest) as error:
                self.bad_frames += 1
                await self._send(error_frame(error, id=_guess_id(raw)))
                if self.bad_frames >= MAX_BAD_FRAMES:
                    await self.ws.close(code=POLICY_VIOLATION, reason="too many bad frames")
                    return
                continue
            self.bad_frames = 0
            await self.slots.acquire()
            while self.inflight_bytes > MAX_IN_FLIGHT_BYTES:  # backpressure by size too
                self.drained.clear()
                await self.drained.wait()
            self.inflight_bytes += len(raw)
            if isinstance(frame, Submit) and frame.request.action is not None:
                answering = self._control_now(frame)  # decided here, not a loop turn later
            else:
                answering = self._answer(frame)
            task = asyncio.create_task(answering)
            self.tasks.add(task)
            task.add_done_callback(functools.partial(self._done, len(raw)))

    def _done(self, size: int, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.slots.release()
        self.inflight_bytes -= size
        self.drained.set()

    async def _validate(self, data: Any) -> Any:
        """The client frame of a frame's JSON value (`InvalidRequest` / `BadFrame`)."""
        if not isinstance(data, dict):
            raise BadFrame("invalid", "a frame is a JSON object with a 'type'", field="type")
        kind = data.get("type")
        if kind not in CLIENT_TYPES:
            raise BadFrame("unknown_type", f"unknown frame type {kind!r}; expected one of "
                           f"{', '.join(CLIENT_TYPES)}", field="type")
        batch = BATCHES.get(kind)
        items = data.get(batch[0]) if batch is not None else None
        if batch is not None and isinstance(items, list) and \
                VALIDATE_STEP < len(items) <= MAX_BATCH:
            data = {**data, batch[0]: await _validate_items(batch[0], batch[1], items,
                                                            self._turn)}
        try:
            async with self._turn():
                return CLIENT_FRAME.validate_python(data)
        except ValidationError as error:
            invalid = InvalidRequest.from_validation_error(error)
            # Drop the frame type pydantic puts first in each location ("submit.request...").
            raise InvalidRequest([FieldError(e.field.split(".", 1)[-1], e.message)
                                  for e in invalid.errors]) from None

    def _turn(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A turn of the pacer for a feed connection's work; nothing to wait for otherwise."""
        return self.service.pacer.turn() if self.endpoint == "feed" else _NO_TURN

    async def _send(self, frame: BaseModel) -> None:
        # Optional fields that are None are left out; Hello's scope is always sent.
        await self._send_text(frame.model_dump_json(exclude_none=not isinstance(frame, Hello)))

    async def _send_paced(self, frame: BaseModel) -> None:
        """`_send`, the encoding in a turn of the pacer (a feed's big answers)."""
        async with self._turn():
            text = frame.model_dump_json(exclude_none=True)
        await self._send_text(text)

    async def _send_text(self, text: str) -> None:
        async with self.send_lock:
            if self.closing or self.ws.application_state is not WebSocketState.CONNECTED:
                return
            try:
                # (asyncio.timeout, not wait_for: that runs the send as a task of its own,
                # a turn of the loop later, several ms under a flood for every answer)
                async with asyncio.timeout(self.service.send_timeout_s):
                    await self.ws.send_text(text)
                self.last_sent = asyncio.get_running_loop().time()
            except (RuntimeError, WebSocketDisconnect):
                return
            except TimeoutError:
                self.closing = True
                self.service.connections.slow_readers += 1
                log.warning("closing a connection that does not read its frames")
                # Under `gateway.server` the close is queued behind the frames the client
                # has not taken and the connection is dropped if it never takes them; a
                # server that waits for room before a close gives up here.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self.ws.close(code=POLICY_VIOLATION, reason="slow reader"), 1.0)

    def _control_now(self, frame: Submit) -> Coroutine[Any, Any, None]:
        """A control (stop, pause, resume, cancel) decided at once, as it is read: its run is
        cancelled there and then; what it returns sends its ack after the commit."""
        principal = self.principal
        assert principal is not None
        request = frame.request
        pacer = self.service.pacer
        pacer.hold()  # the feed's bulk work waits until this ack is out
        try:
            principal.check_submit(request)
            pending = self.engine.decide_now(request, principal.name)
        except Exception as error:
            pacer.release()
            return self._send(error_frame(error, id=frame.id, request_id=request.request_id))
        return self._acked(frame, pending)

    async def _acked(self, frame: Submit, pending: Awaitable[Ack]) -> None:
        """Send the ack of a control decided by `_control_now` (which held the pacer)."""
        try:
            try:
                ack = await pending
            except asyncio.CancelledError:
                raise
            except Exception as error:
                await self._send(error_frame(error, id=frame.id,
                                             request_id=frame.request.request_id))
            else:
                await self._send(ack_frame(ack, frame.id))
        finally:
            self.service.pacer.release()

    async def _answer(self, frame: Any) -> None:
        try:
            await self._handle(frame)
        except asyncio.CancelledError:
            raise
        except Busy as error:
            await self._send(BusyFrame(id=frame.id, retry_after_ms=error.retry_after_ms))
        except Exception as error:
            request_id = frame.request.request_id if isinstance(frame, Submit) else None
            await self._send(error_frame(error, id=frame.id, request_id=request_id))

    async def _handle(self, frame: Any) -> None:
        principal = self.principal
        assert principal is not None
        engine = self.engine
        if isinstance(frame, Ping):
            await self._send(Pong(id=frame.id, position=await engine.store.last_position()))
        elif isinstance(frame, Auth):
            raise BadFrame("invalid", "already authenticated")
        elif isinstance(frame, Submit):
            principal.check_submit(frame.request)
            if frame.request.action is None and self.endpoint != "feed":
                self.service.check_capacity()  # the control lane is never refused as busy
            with self._holding(1):
                ack = await engine.submit(frame.request, principal.name)
            await self._send(ack_frame(ack, frame.id))
        elif isinstance(frame, SubmitMany):
            await self._send_paced(AcksFrame(id=frame.id,
                                             results=await self._submit_all(frame.requests)))
        elif isinstance(frame, Market):
            principal.check_feed()
            if principal.agents is not None:
                raise Forbidden("market events drive every agent's hook rules and the "
                                "broker's prices; a token scoped to some agents cannot send "
                                "them")
            self._check_times(frame.events)
            if self.endpoint != "feed":
                self.service.check_capacity()
            requests: list[AgentRequest] = []
            for start in range(0, len(frame.events), VALIDATE_STEP):
                async with self._turn():
                    for event in frame.events[start:start + VALIDATE_STEP]:
                        if self.service.on_market is not None:
                            self.service.on_market(event)
                        if self.service.hooks is not None:
                            requests += self.service.hooks.on_event(event)
            triggered = await self._submit_all(requests) if requests else []
            await self._send_paced(MarketAck(id=frame.id, events=len(frame.events),
                                             triggered=triggered))
        elif isinstance(frame, Subscribe):
            await self._subscribe(frame)
        elif isinstance(frame, Unsubscribe):
            if self.subscription is not None:
                self.subscription.cancel()
                self.subscription = None
            await self._send(Pong(id=frame.id, position=await engine.store.last_position()))

    def _check_times(self, events: list[MarketEvent]) -> None:
        """Refuse market events dated in the future (they would stall every hook rule)."""
        latest = self.engine.clock.now_ms() + MAX_CLOCK_SKEW_MS
        for index, event in enumerate(events):
            if to_ms(event_time(event)) > latest:
                raise BadFrame("invalid", f"events[{index}] is dated more than "
                               f"{MAX_CLOCK_SKEW_MS // 1000} s in the future",
                               field=f"events.{index}")

    @contextlib.contextmanager
    def _holding(self, requests: int) -> Iterator[None]:
        """A feed connection's work waiting for its commit, for the intake's shares."""
        if self.endpoint != "feed":
            yield
            return
        events = 2 * requests  # a request and its decision, most often
        self.service.intake.took(self, events)
        try:
            yield
        finally:
            self.service.intake.settled(self, events)

    async def _submit_all(self, requests: list[AgentRequest]) -> list[AckFrame | ErrorFrame]:
        principal = self.principal
        assert principal is not None
        saturated: Busy | None = None
        if self.endpoint != "feed":  # a feed frame was admitted whole by the intake
            try:
                self.service.check_capacity()
            except Busy as busy:
                saturated = busy
        allowed: list[AgentRequest] = []
        refused: dict[int, ErrorFrame] = {}
        for index, request in enumerate(requests):
            try:
                principal.check_submit(request)
                if saturated is not None and request.action is None:
                    raise saturated  # the control lane is never refused as busy
                allowed.append(request)
            except GatewayError as error:
                refused[index] = error_frame(error, request_id=request.request_id)
        with self._holding(len(allowed)):
            answers = iter(await self.engine.submit_many(
                allowed, principal.name,
                pacer=self.service.pacer if self.endpoint == "feed" else None))
        results: list[AckFrame | ErrorFrame] = []
        for index, request in enumerate(requests):
            if index in refused:
                results.append(refused[index])
                continue
            answer = next(answers)
            results.append(ack_frame(answer) if isinstance(answer, Ack)
                           else error_frame(answer, request_id=request.request_id))
        return results

    async def _subscribe(self, frame: Subscribe) -> None:
        principal = self.principal
        assert principal is not None
        principal.check_read()
        known = self.engine.agent_ids
        if frame.agents is None:
            wanted = [a for a in known if principal.may_see(a)]
        else:
            wanted = list(dict.fromkeys(frame.agents))  # each once, in the order given
            if len(wanted) > len(known):
                raise BadFrame("invalid", f"agents lists {len(wanted)} different ids and this "
                               f"gateway has {len(known)} agents; leave agents out to follow "
                               "every agent in scope", field="agents")
        for agent_id in wanted:
            principal.check_read(agent_id)
            self.engine.state(agent_id)
        if frame.providers and principal.agents is not None:
            raise Forbidden("a token scoped to some agents cannot follow the provider gates "
                            "(they serve every agent); subscribe without providers")
        # Swap subscriptions with no await in between: one follower per connection, always.
        if self.subscription is not None:
            self.subscription.cancel()
        self.subscription = asyncio.create_task(self._follow(frame, wanted))

    async def _follow(self, frame: Subscribe, wanted: list[str]) -> None:
        position = await self.engine.store.last_position()
        now = self.engine.clock.now_ms()
        gates = self.engine.gates if frame.providers else {}
        summaries: list[dict[str, Any]] = []
        waits = gate_waits_of(self.engine, now)
        for start in range(0, len(wanted), SUMMARIES_PER_STEP):
            if start:  # a big desk's snapshot does not hold the loop (stops come first)
                await asyncio.sleep(0)
            summaries += [agent_summary(self.engine.state(a), now, waits.get(a))
                          for a in wanted[start:start + SUMMARIES_PER_STEP]]
        await self._send(Snapshot(id=frame.id, position=position, agents=summaries,
                                  providers=[provider_summary(n, g, now)
                                             for n, g in sorted(gates.items())]))
        agents = set(wanted) | {gate.stream for gate in gates.values()}
        after = frame.after if frame.after is not None else position
        # Lists of a frame's worth: the batch in hand, and its texts, stay small.
        follow = self.engine.store.follow_batches(after, EVENTS_PER_FRAME)
        beating = spawn(self._heartbeats(asyncio.current_task()), "heartbeats") \
            if self.service.heartbeat_s else None
        try:
            async with contextlib.aclosing(follow) as batches:
                async for batch in batches:
                    texts = [event_frame_text(r) for r in batch if r.stream in agents]
                    for text in events_frames(texts) if frame.batch else texts:
                        if self.closing:
                            return
                        await self._send_text(text)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("subscription ended: %r", error)
            await self._send(ErrorFrame(
                id=frame.id, code="unavailable",
                message="the subscription ended (the log could not be read); subscribe "
                        "again with 'after' set to the last position you received"))
        finally:
            if beating is not None:
                beating.cancel()

    async def _heartbeats(self, follower: asyncio.Task[Any] | None) -> None:
        """A heartbeat whenever the subscription (its ``follower``) has sent nothing for
        `Service.heartbeat_s`: a client that hears nothing for longer knows the link or the
        gateway is stuck. None once the subscription is replaced or ended."""
        loop = asyncio.get_running_loop()
        every = self.service.heartbeat_s
        while not self.closing and self.subscription is follower:
            quiet = loop.time() - self.last_sent
            if quiet < every:
                await asyncio.sleep(every - quiet)
                continue
            committed = await self.engine.store.last_position()
            if self.subscription is not follower:
                return
            await self._send(Heartbeat(committed=committed,
                                       at=from_ms(self.engine.clock.now_ms())))
            self.last_sent = loop.time()  # (also when the send was skipped: no busy loop)


_NO_TURN = contextlib.nullcontext()
WORK_TYPES = frozenset({"submit", "submit_many", "market"})
"""Frame types that make work for the log (a feed connection's are admitted by the intake)."""
VALIDATE_STEP = 50
"""Items of a batch frame validated before other work may run (well under 1 ms of the loop)."""
BATCHES: dict[str, tuple[str, TypeAdapter[Any]]] = {
    "submit_many": ("requests", TypeAdapter(AgentRequest)),
    "market": ("events", TypeAdapter(MarketEvent)),
}
"""The list member of each batch frame and the model of its items."""


async def _validate_items(name: str, adapter: TypeAdapter[Any], items: list[Any],
                          turn: Callable[[], contextlib.AbstractAsyncContextManager[None]]
                          ) -> list[Any]:
    """The items of a batch frame validated `VALIDATE_STEP` at a time, each step in a
    ``turn`` (other work runs in between); `InvalidRequest` naming each bad field
    (``requests.3.kind``) as the frame's own validation would."""
    checked: list[Any] = []
    errors: list[FieldError] = []
    for start in range(0, len(items), VALIDATE_STEP):
        if start:
            await asyncio.sleep(0)
        async with turn():
            for index in range(start, min(start + VALIDATE_STEP, len(items))):
                try:
                    checked.append(adapter.validate_python(items[index]))
                except ValidationError as error:
                    errors += [FieldError(f"{name}.{index}" if e.field == "(request)"
                                          else f"{name}.{index}.{e.field}", e.message)
                               for e in InvalidRequest.from_validation_error(error).errors]
    if errors:
        raise InvalidRequest(errors)
    return checked


def _subprotocol_token(offered: str) -> str:
    """The token in a ``bearer.<base64url>`` subprotocol (`Unauthorized` if it is not one)."""
    encoded = offered[len(TOKEN_SUBPROTOCOL):]
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise Unauthorized(f"the {TOKEN_SUBPROTOCOL}... subprotocol must hold the token in "
                           "base64url (RFC 4648 section 5)") from None


def _raw(message: Any) -> str | bytes:
    """The data of a WebSocket message: text, or the bytes of a binary frame (read as
    UTF-8 by `load_json`, which refuses anything else)."""
    text = message.get("text")
    if text is not None:
        return str(text)
    return bytes(message.get("bytes") or b"")


def _guess_id(raw: str | bytes) -> str | None:
    """The client's frame id, if the frame is JSON enough to have one."""
    with contextlib.suppress(BadFrame):
        value = load_json(raw)
        if isinstance(value, dict):
            return _frame_id(value)
    return None


def _frame_id(data: dict[str, Any]) -> str | None:
    """The ``id`` of a frame's JSON object, if it is one a client may give."""
    found = data.get("id")
    return found if isinstance(found, str) and len(found) <= 128 else None


__all__ = ["Role", "Service", "create_app"]
