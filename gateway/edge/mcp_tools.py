"""The gateway's tools as MCP serves them (`gateway.edge.mcp`): each tool's arguments (a wire
model: camelCase, unknown fields refused), who may call it, and what it does, through the same
code as the HTTP API (`gateway.edge.routes.Api`)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field

from gateway.base.roles import Role
from gateway.edge.answers import ack_frame
from gateway.edge.auth import Principal
from gateway.edge.http import ControlBody
from gateway.edge.routes import Api
from gateway.edge.views import queue_view
from gateway.errors import Busy, Forbidden
from gateway.runtime.acks import Ack
from lanes import AgentRequest
from lanes.codec import decode
from lanes.decisions import (
    RequestDropped,
    RequestRejected,
    RunAborted,
    RunFailed,
    RunStarted,
    RunSteered,
)
from lanes.inputs import RunFinished
from lanes.requests import AGENT_ID_PATTERN, ControlAction, Kind, Priority, WireModel

MAX_CALL_TIMEOUT_S = 300.0
"""The longest a ``call_agent`` waits for its answer."""
DEFAULT_FAN_OUT = 10
"""Calls an agent-scoped caller may have out at once when its name is no configured agent
(the default ``maxCallsPerRun`` of a run)."""
MAX_RETRY_AFTER_S = 60


class NoArgs(WireModel):
    """No arguments."""


class AgentArgs(WireModel):
    """One agent."""

    agent_id: str = Field(pattern=AGENT_ID_PATTERN, description="The agent's id.")


class MessageArgs(AgentArgs):
    """A message for an agent's reasoning lane."""

    message: str = Field(min_length=1, max_length=20_000)
    priority: Priority = Priority.NORMAL
    request_id: str | None = Field(default=None, min_length=1, max_length=128,
                                   description="Your id for it: sending it again is "
                                   "idempotent (the first decision is returned).")


class CallArgs(MessageArgs):
    """An ``agent_call``: a message for an agent, answered by the run that takes it."""

    timeout_seconds: float = Field(default=30.0, gt=0, le=MAX_CALL_TIMEOUT_S,
                                   description="How long to wait for the answer.")
    if_busy: Literal["reject", "queue"] = Field(
        default="reject", description="reject: a busy agent answers busy at once (retry "
        "after retryAfterSeconds); queue: wait in its queue.")


class ControlArgs(AgentArgs):
    """A control action on an agent."""

    reason: str | None = Field(default=None, max_length=500)


class ApprovalArgs(ControlArgs):
    """An order waiting for a human's approval."""

    approval_id: str = Field(min_length=1, max_length=256)


class ApprovalsArgs(WireModel):
    """Orders waiting for approval, of one agent or of every agent in scope."""

    agent_id: str | None = Field(default=None, pattern=AGENT_ID_PATTERN)


class StoryArgs(AgentArgs):
    """An agent's log as a story: around a position, or between two."""

    at: int | None = Field(default=None, ge=0, description="A log position: the group "
                           "holding it, with `around` groups each side.")
    around: int = Field(default=3, ge=0, le=100)
    from_: int | None = Field(default=None, ge=0, alias="from")
    to: int | None = Field(default=None, ge=0)
    limit: int = Field(default=50, ge=1, le=1000)


class SearchArgs(AgentArgs):
    """Events of an agent with a text in their type or data, newest first."""

    text: str = Field(min_length=1, max_length=200)
    limit: int = Field(default=20, ge=1, le=200)
    before: int | None = Field(default=None, ge=1, description="Search below this log "
                               "position (the `before` of the previous answer).")


Handler = Callable[[Principal, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its arguments, whether it only reads, and what it does."""

    name: str
    description: str
    args: type[WireModel]
    reads: bool
    run: Handler


def source_of(principal: Principal) -> str:
    """Who a caller is in the log: an agent-scoped token is an agent (``agent:<name>``, the
    sub-agent calls' source), any other token an MCP client (``mcp:<name>``)."""
    return f"agent:{principal.name}" if principal.agents is not None else \
        f"mcp:{principal.name}"


def ack_json(ack: Ack) -> dict[str, Any]:
    """An ack as MCP answers it: the HTTP API's ack frame."""
    body: dict[str, Any] = ack_frame(ack).model_dump(mode="json", exclude_none=True)
    return body


class Tools:
    """The tools, over the HTTP API's code (``api``)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.engine = api.engine
        self.out: Counter[str] = Counter()
        """Calls each agent-scoped caller has out now (its fan-out)."""
        self.specs = {spec.name: spec for spec in [
            ToolSpec("list_agents", "Every agent in the token's scope: trading state, lane, "
                     "queue length, and why it is blocked (halted, held, over budget, cooling "
                     "down, waiting at its provider's gate, its last run failed) with the "
                     "attention level.", NoArgs, True, self.list_agents),
            ToolSpec("agent_status", "One agent: its status with why it is blocked, the "
                     "active run and the pending queue.", AgentArgs, True, self.agent_status),
            ToolSpec("send_message", "Send a message to an agent's reasoning lane (a "
                     "user_control request); returns its ack once committed.", MessageArgs,
                     False, self.send_message),
            ToolSpec("call_agent", "Ask an agent (an agent_call request) and wait up to "
                     "timeoutSeconds for the answer of the run that takes it. A busy agent "
                     "or a full queue answers {status: busy, retryAfterSeconds}.", CallArgs,
                     False, self.call_agent),
            ToolSpec("emergency_stop", "Halt an agent at once: its run is aborted, no run "
                     "starts and no order goes out until resume.", ControlArgs, False,
                     self.control(ControlAction.EMERGENCY_STOP)),
            ToolSpec("resume", "Resume a halted, paused or held agent.", ControlArgs, False,
                     self.control(ControlAction.RESUME)),
            ToolSpec("list_approvals", "Orders waiting for a human's approval (of one agent, "
                     "or of every agent in scope), oldest first.", ApprovalsArgs, True,
                     self.list_approvals),
            ToolSpec("approve", "Approve an order waiting for approval (approvalId).",
                     ApprovalArgs, False, self.control(ControlAction.APPROVE)),
            ToolSpec("reject", "Reject an order waiting for approval (approvalId, reason).",
                     ApprovalArgs, False, self.control(ControlAction.REJECT)),
            ToolSpec("story", "An agent's log as a story, in `gateway timeline`'s words: "
                     "each input and what was decided of it; around a position (at, around) "
                     "or between two (from, to, limit).", StoryArgs, True, self.story),
            ToolSpec("search_log", "An agent's events with a text in their type or data "
                     "(request ids, order ids, reasons), newest first; a bounded look back, "
                     "go on with `before`.", SearchArgs, True, self.search_log),
        ]}

    def visible(self, principal: Principal) -> list[ToolSpec]:
        """The tools ``principal`` may call: a viewer the reading ones only."""
        if principal.role is Role.FEED:
            return []
        return [s for s in self.specs.values()
                if s.reads or principal.role in (Role.CONTROL, Role.ADMIN)]

    def _agent(self, principal: Principal, agent_id: str) -> str:
        """A readable agent that exists (nothing revealed outside the scope)."""
        principal.check_read(agent_id)
        self.engine.state(agent_id)  # UnknownAgent if it does not exist
        return agent_id

    async def list_agents(self, principal: Principal, _: NoArgs) -> dict[str, Any]:
        """`list_agents`."""
        principal.check_read()
        now = self.engine.clock.now_ms()
        return {"agents": [self.api._summary(a, now) for a in self.engine.agent_ids
                           if principal.may_see(a)]}

    async def agent_status(self, principal: Principal, args: AgentArgs) -> dict[str, Any]:
        """`agent_status`."""
        agent_id = self._agent(principal, args.agent_id)
        now = self.engine.clock.now_ms()
        body = self.api._summary(agent_id, now)
        body["queue"] = queue_view(self.engine.state(agent_id), now)
        return body

    def _request(self, principal: Principal, args: MessageArgs, kind: Kind,
                 payload: dict[str, Any], if_busy: str | None = None) -> AgentRequest:
        principal.check_agent(args.agent_id)
        self.engine.state(args.agent_id)
        return AgentRequest.model_validate({
            "requestId": args.request_id or f"mcp_{secrets.token_hex(8)}",
            "createdAt": datetime.now(UTC), "agentId": args.agent_id, "kind": kind,
            "priority": args.priority, "source": source_of(principal), "payload": payload,
            **({"ifBusy": if_busy} if if_busy else {})})

    async def send_message(self, principal: Principal, args: MessageArgs) -> dict[str, Any]:
        """`send_message`."""
        request = self._request(principal, args, Kind.USER_CONTROL, {"message": args.message})
        return ack_json(await self.api.submit_as(principal, request))

    def control(self, action: ControlAction) -> Handler:
        """A tool that applies ``action``."""
        async def run(principal: Principal, args: ControlArgs) -> dict[str, Any]:
            principal.check_operate(args.agent_id)
            self.engine.state(args.agent_id)
            body = ControlBody.model_validate({
                "action": action, "reason": args.reason,
                "approvalId": getattr(args, "approval_id", None)})
            ack = await self.api.control_as(principal, args.agent_id, body,
                                            f"ctl_{secrets.token_hex(8)}",
                                            source_of(principal))
            return ack_json(ack)
        return run

    async def list_approvals(self, principal: Principal, args: ApprovalsArgs
                             ) -> dict[str, Any]:
        """`list_approvals`."""
        return self.api.approvals_of(principal, args.agent_id)

    async def story(self, principal: Principal, args: StoryArgs) -> dict[str, Any]:
        """`story`."""
        agent_id = self._agent(principal, args.agent_id)
        query = {"limit": str(args.limit), "around": str(args.around)}
        for name, value in (("at", args.at), ("from", args.from_), ("to", args.to)):
            if value is not None:
                query[name] = str(value)
        return await self.api.story_of(agent_id, query, await self.api.log.last_position())

    async def search_log(self, principal: Principal, args: SearchArgs) -> dict[str, Any]:
        """`search_log`."""
        agent_id = self._agent(principal, args.agent_id)
        query = {"q": args.text}
        if args.before is not None:
            query["before"] = str(args.before)
        return await self.api.search_of(principal, query, args.limit, agent_id, None)

    # ----------------------------------------------------------------------- call_agent

    def _fan_out(self, principal: Principal) -> int:
        """How many calls an agent-scoped caller may have out at once: its agent's
        ``maxCallsPerRun`` when its name is a configured agent, else the default's."""
        if principal.name in self.engine.agent_ids:
            return self.engine.state(principal.name).config.max_calls_per_run
        return DEFAULT_FAN_OUT

    def _retry_after(self, agent_id: str) -> int:
        """A guess of when a busy agent is free: its active run's deadline, bounded."""
        run = self.engine.state(agent_id).active
        if run is None:
            return 1
        left = run.deadline - self.engine.clock.now_ms()
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(left / 1000)))

    def _busy(self, agent_id: str, request_id: str, reason: str,
              seconds: int | None = None) -> dict[str, Any]:
        return {"status": "busy", "agentId": agent_id, "requestId": request_id,
                "reason": reason, "retryAfterSeconds":
                    self._retry_after(agent_id) if seconds is None else seconds}

    async def call_agent(self, principal: Principal, args: CallArgs) -> dict[str, Any]:
        """`call_agent`: the call submitted (depth 1: the target's depth limit applies),
        then its answer awaited in the target's stream."""
        request = self._request(principal, args, Kind.AGENT_CALL,
                                {"message": args.message, "depth": 1},
                                "reject" if args.if_busy == "reject" else None)
        scoped = principal.agents is not None
        if scoped and self.out[principal.name] >= self._fan_out(principal):
            raise Forbidden(f"fan-out limit: {principal.name!r} has "
                            f"{self.out[principal.name]} calls out, its limit; wait for one")
        if scoped:
            self.out[principal.name] += 1
        try:
            try:
                ack = await self.api.submit_as(principal, request)
            except Busy as busy:
                return self._busy(args.agent_id, request.request_id, str(busy),
                                  max(1, math.ceil(busy.retry_after_ms / 1000)))
            if ack.decision in ("rejected", "dropped"):
                refused = await self._decision(args.agent_id, ack.position)
                reason = ack.reason or f"requestId {request.request_id!r} was used before: " \
                    f"its first decision ({ack.decision}) stands; send a new requestId"
                if _busy(refused, reason):
                    return self._busy(args.agent_id, request.request_id, reason)
                return {"status": "refused", "agentId": args.agent_id,
                        "requestId": request.request_id, "reason": reason}
            return await self._answer(args.agent_id, request.request_id, ack.position,
                                      args.timeout_seconds)
        finally:
            if scoped:
                self.out[principal.name] -= 1

    async def _decision(self, agent_id: str, position: int) -> Any:
        found = await self.api.log.read(after=position - 1, limit=1)
        if not found or found[0].stream != agent_id:
            return None
        return decode(found[0].type, found[0].data)

    async def _answer(self, agent_id: str, request_id: str, after: int,
                      timeout_s: float) -> dict[str, Any]:
        """Follow the target's stream from ``after`` until the run that took the request
        ends (a run aborted and requeued is waited past), or it is dropped, or time is up."""
        answer: dict[str, Any] = {"agentId": agent_id, "requestId": request_id}
        run_id: str | None = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                follow = self.api.log.follow(after - 1)
                async with contextlib.aclosing(follow):
                    async for record in follow:
                        if record.stream != agent_id:
                            continue
                        run_id, ended = _step(decode(record.type, record.data),
                                              request_id, run_id)
                        if ended is not None:
                            return {**answer, "runId": run_id, **ended,
                                    "position": record.position}
        return {**answer, "status": "timeout", "runId": run_id,
                "reason": f"no answer within {timeout_s:g} s; the request stays in the "
                "agent's queue (follow it with story or search_log)"}


def _busy(refused: object, reason: str) -> bool:
    """Whether a call was refused for want of room (its agent busy and the call says
    ``ifBusy: reject``, or a full queue), rather than for good."""
    if isinstance(refused, RequestDropped):  # (dropPolicy new: the incoming one dropped)
        return "dropped the incoming" in reason
    # (a transient refusal: busy, a full queue of high-priority requests, or a requestId
    # reused for a different request, which is no matter of room)
    return isinstance(refused, RequestRejected) and refused.transient and \
        not reason.startswith("requestId")


def _step(event: object, request_id: str, run_id: str | None
          ) -> tuple[str | None, dict[str, Any] | None]:
    """One event of a called agent's stream: the run that holds the call now, and how the
    call ended if this event ends it."""
    if (isinstance(event, RunStarted) and request_id in event.request_ids) or \
            (isinstance(event, RunSteered) and event.request_id == request_id):
        return event.run_id, None
    if isinstance(event, RequestDropped | RequestRejected) and event.request_id == request_id:
        return run_id, {"status": "refused", "reason": event.reason}
    if run_id is None or getattr(event, "run_id", None) != run_id:
        return run_id, None
    if isinstance(event, RunFinished):
        return run_id, {"status": "returned", "outcome": event.outcome.value,
                        "answer": event.answer}
    if isinstance(event, RunFailed):
        return run_id, {"status": "failed", "error": event.error}
    if isinstance(event, RunAborted):  # (requeued: the next run that takes it answers)
        return (None, None) if event.requeued else \
            (run_id, {"status": "aborted", "reason": event.reason.value})
    return run_id, None
