"""Agents, their queues and the operator's actions on them."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.answers import ack_frame, error_response
from gateway.edge.auth import Principal
from gateway.edge.http import ControlBody, Routes, _int_param, _json, streamed
from gateway.edge.protocol import ErrorFrame
from gateway.edge.views import (
    gate_waits_of,
    json_pieces,
    queue_view,
    schedules_view,
    starlette_json,
)
from gateway.errors import HTTP_STATUS, BadFrame, GatewayError
from gateway.runtime.acks import Ack
from lanes import AgentConfig, AgentRequest, parse_request
from lanes.calltree import CallTrees
from lanes.events import OperatorAction
from lanes.gate.events import lease_too_short


class AgentRoutes(Routes):
    """Agents, their queues and the operator's actions on them."""

    async def agents(self, request: Request) -> Response:
        """Every agent in the token's scope, with its status."""
        principal = self._principal(request)
        principal.check_read()
        now = self.engine.clock.now_ms()
        waits = gate_waits_of(self.engine, now)
        seen = principal.visible(self.engine.agent_ids)
        return await streamed(
            json_pieces(seen, lambda a: self._summary(a, now, waits), starlette_json),
            "application/json")

    async def agent(self, request: Request) -> Response:
        """One agent: config, trading state and lane status."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        state = self.engine.state(agent_id)
        body = self._summary(agent_id, self.engine.clock.now_ms())
        body["config"] = state.config.model_dump(mode="json")
        body["schedules"] = schedules_view(state, self.engine.clock.now_ms())
        return _json(body)

    async def queue(self, request: Request) -> Response:
        """Whether the lane is busy, the current run with its duration, the pending list."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return _json(self.service.said_behind(
            agent_id, queue_view(self.engine.state(agent_id), self.engine.clock.now_ms())))

    async def submit(self, request: Request) -> Response:
        """Submit one request to this agent; answered after its commit."""
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        body = await self._body(request, AgentRequest)
        if body.agent_id != agent_id:
            raise BadFrame("invalid", f"agentId {body.agent_id!r} does not match the path",
                           field="agentId")
        try:
            return _json(ack_frame(await self.submit_as(principal, body, parsed=True)))
        except GatewayError as error:
            return error_response(error, body.request_id)

    async def submit_as(self, principal: Principal, body: AgentRequest,
                        parsed: bool = False) -> Ack:
        """One request from ``principal`` (its role and scope checked; reasoning work refused
        while the log is far behind), awaited to its ack (HTTP and MCP; ``parsed``: the
        body was just parsed from JSON text by `gateway.edge.protocol.load_json`, as
        `gateway.runtime.intake.Intake.take` says)."""
        self.service.admit(principal, body)  # (the control lane is never refused)
        return await self.service.submit(body, principal.name, parsed)

    async def control(self, request: Request) -> Response:
        """A control-lane action (emergency_stop, pause, resume, cancel_order, cancel_all,
        approve, reject, flatten)."""
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        principal.check_operate(agent_id)
        body: ControlBody = await self._body(request, ControlBody)
        request_id = body.request_id or f"ctl_{secrets.token_hex(8)}"
        try:
            ack = await self.control_as(principal, agent_id, body, request_id,
                                        f"http:{principal.name}")
            return _json(ack_frame(ack))
        except GatewayError as error:  # with the id it was given: a retry is idempotent
            return error_response(error, request_id)

    async def control_as(self, principal: Principal, agent_id: str, body: ControlBody,
                         request_id: str, source: str) -> Ack:
        """A control-lane action of ``principal`` on an agent (its role and scope checked),
        recorded with ``source``, awaited to its ack ahead of the feed's bulk work (HTTP
        and MCP)."""
        principal.check_operate(agent_id)
        payload: dict[str, Any] = {"action": body.action.value}
        if body.order_id is not None:
            payload["orderId"] = body.order_id
        if body.approval_id is not None:
            payload["approvalId"] = body.approval_id
        if body.reason is not None:
            payload["reason"] = body.reason
        agent_request = parse_request({
            "requestId": request_id, "createdAt": datetime.now(UTC), "agentId": agent_id,
            "kind": "user_control", "priority": "high", "source": source,
            "payload": payload,
        })
        with self.service.pacer.urgent():  # the feed's bulk work waits for its answer
            return await self.service.submit(agent_request, principal.name)

    async def _operate(self, request: Request, action: OperatorAction,
                       run_id: str | None = None) -> Response:
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        principal.check_operate(agent_id)
        self.service.decided_here(agent_id)
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
        self.service.decided_here(agent_id)
        changed = await self.engine.configure(agent_id, config, principal.name)
        return _json({"changed": changed, "config": config.model_dump(mode="json")})

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
            calls, _ = await self.call_events.get(self.log, self.engine.reader, stream)
            trees.add(stream, calls.events)
            waiting = sorted({t for t in trees.targets() - followed
                              if t in known and principal.may_see(t)})
        return _json(trees.tree(agent_id, query.get("run"), limit))
