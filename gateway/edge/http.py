"""The HTTP API: one method per route (`Api`); `gateway.edge.app` lists the routes."""


from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from gateway.edge.answers import ack_frame, answer_error, error_response
from gateway.edge.auth import Principal
from gateway.edge.metrics import family, label
from gateway.edge.openapi import openapi_document
from gateway.edge.protocol import (
    ErrorFrame,
    load_json,
)
from gateway.edge.service import (
    CAUSE_PAGE,
    MAX_CAUSE_DECISIONS,
    MAX_CHART_AGENTS,
    MAX_SEARCH_TEXT,
    Service,
)
from gateway.edge.views import (
    agent_summary,
    event_json,
    gate_waits_of,
    provider_summary,
    queue_view,
    schedule_view,
    schedules_view,
)
from gateway.errors import (
    HTTP_STATUS,
    BadFrame,
    Forbidden,
    GatewayError,
    NotOwner,
    UnknownProvider,
    storage_fault_kind,
)
from gateway.runtime.blotter import BlotterBook, BlotterQuery, blotter_view, parse_query
from gateway.runtime.gate import GateMoved, ProviderGate
from gateway.runtime.history import (
    MAX_BUCKETS,
    agent_series,
    event_matcher,
    run_history,
    search_back,
)
from gateway.runtime.peers import FORWARDED_HEADER
from gateway.runtime.snapshots import state_after
from gateway.tools.story import (
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
from lanes import AgentConfig, AgentRequest, InvalidRequest, parse_request, status
from lanes.calltree import CALL_EVENT_TYPES, CallTrees
from lanes.events import DECISION_TYPES, INPUT_TYPES, OperatorAction
from lanes.gate import GateStatus, GateWait
from lanes.gate.events import GATE_DECISION_TYPES, GATE_INPUT_TYPES, GateLimits, lease_too_short
from lanes.requests import MAX_INT, ControlAction, WireModel
from lanes.schedules import Schedule
from lanes.state import AgentState
from lanes.streams import gate_stream, is_agent_stream
from store.port import RecordedEvent, StoreError

log = logging.getLogger("gateway.edge.http")


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


class Api:
    """One method per HTTP route. A route raises what went wrong; `exception_handlers`
    answers it (`gateway.edge.answers.error_response`), or passes the call on to the cluster
    member that owns its agent or gate."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.engine = service.engine
        self.blotters = BlotterBook()

    def exception_handlers(self) -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
        """Starlette's exception handlers for every route: the one place a route's failure
        becomes its answer (an unexpected one is answered 500 ``internal`` and re-raised by
        Starlette for the server's log)."""
        return {NotOwner: self._passed_on, GateMoved: self._passed_on, GatewayError: answer_error,
                InvalidRequest: answer_error, StoreError: answer_error, Exception: answer_error}

    async def _passed_on(self, request: Request, error: Exception) -> Response:
        assert isinstance(error, NotOwner | GateMoved)
        return await self._pass_on(request, error)

    async def _pass_on(self, request: Request, error: NotOwner | GateMoved) -> Response:
        """An operator's call for an agent (or provider gate) another process of the cluster
        owns, made there with the caller's own token, and its answer given back as it is
        (once: a call passed on is never passed on again)."""
        peers = self.service.peers
        if peers is None or request.headers.get(FORWARDED_HEADER):
            return error_response(error)
        stream = error.agent_id if isinstance(error, NotOwner) else gate_stream(error.provider)
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

    async def metrics(self, request: Request) -> Response:
        """Prometheus metrics (viewer or better)."""
        principal = self._principal(request)
        principal.check_read()
        return PlainTextResponse(self._metrics_text(principal),
                                 media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document of this API."""
        return JSONResponse(openapi_document())

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

    async def agent(self, request: Request) -> Response:
        """One agent: config, trading state and lane status."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        state = self.engine.state(agent_id)
        body = self._summary(agent_id, self.engine.clock.now_ms())
        body["config"] = state.config.model_dump(mode="json")
        body["schedules"] = schedules_view(state, self.engine.clock.now_ms())
        return _json(body)

    async def schedules(self, request: Request) -> Response:
        """An agent's schedules, with when each fired last and fires next."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return _json({"schedules": schedules_view(self.engine.state(agent_id),
                                                  self.engine.clock.now_ms())})

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

    async def delete_schedule(self, request: Request) -> Response:
        """Remove a schedule (admin)."""
        agent_id, schedule_id, principal = self._schedule_call(request, admin=True)
        await self.engine.set_schedule(agent_id, schedule_id, None, principal.name)
        return _json({"removed": schedule_id})

    async def pause_schedule(self, request: Request) -> Response:
        """Pause a schedule (admin): it fires no more until resumed, and catches nothing
        up then."""
        return await self._set_paused(request, True)

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

    async def queue(self, request: Request) -> Response:
        """Whether the lane is busy, the current run with its duration, the pending list."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return _json(queue_view(self.engine.state(agent_id), self.engine.clock.now_ms()))

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

    async def clear(self, request: Request) -> Response:
        """Drop every pending request (each drop is an event with the principal)."""
        return await self._operate(request, OperatorAction.CLEAR_QUEUE)

    async def release(self, request: Request) -> Response:
        """Force the lane idle: the active run is aborted (reason release)."""
        return await self._operate(request, OperatorAction.RELEASE)

    async def abort(self, request: Request) -> Response:
        """Abort a run, only if it is still the active one (409 otherwise)."""
        return await self._operate(request, OperatorAction.ABORT_RUN,
                                   str(request.path_params["run_id"]))

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

    async def providers(self, request: Request) -> Response:
        """Every provider gate: limits, usage in the current windows, waiting agents,
        breaker state and next retry."""
        principal = self._principal(request)
        principal.check_read()
        now = self.engine.clock.now_ms()
        return _json({"providers": [provider_summary(name, gate, now, principal)
                                    for name, gate in sorted(self.engine.gates.items())]})

    async def provider(self, request: Request) -> Response:
        """One provider gate (404 if there is none of that name)."""
        principal = self._principal(request)
        principal.check_read()
        gate = self._gate(request)
        return _json(provider_summary(gate.provider, gate, self.engine.clock.now_ms(),
                                      principal))

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

    async def charts(self, request: Request) -> Response:
        """Per-agent series from the log (`gateway.runtime.history.SERIES`) over [``from``, ``to``)
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
