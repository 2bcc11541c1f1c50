"""The gateway's tools as MCP serves them (`gateway.edge.mcp`): each tool's arguments (a wire
model: camelCase, unknown fields refused), who may call it, and what it does, through the same
code as the HTTP API (`gateway.edge.routes.Api`)."""

from __future__ import annotations

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
from gateway.edge.call_waits import CallWaits
from gateway.edge.http import ControlBody
from gateway.edge.routes import Api
from gateway.edge.views import queue_view
from gateway.errors import Busy, Forbidden, UnknownAgent
from gateway.runtime.acks import Ack
from lanes import AgentRequest
from lanes.codec import decode
from lanes.decisions import RequestDropped, RequestRejected
from lanes.requests import AGENT_ID_PATTERN, ControlAction, Kind, Priority, WireModel

MAX_CALL_TIMEOUT_S = 300.0
"""The longest a ``call_agent`` waits for its answer."""
DEFAULT_FAN_OUT = 10
"""Calls an agent-scoped caller in no run may have out at once when its name is no
configured agent (the default ``maxCallsPerRun`` of a run)."""
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
        self.waits = CallWaits(api.log, clock=api.engine.clock)
        """The ``call_agent`` calls waiting for their ends, on one follower of the log."""
        self.out: Counter[str] = Counter()
        """Calls each agent-scoped caller has out now (its fan-out)."""
        self.made: Counter[tuple[str, str]] = Counter()
        """(agent, run id) -> the calls an agent-scoped caller made in that run of its
        agent (it counts against the run's ``maxCallsPerRun``, as its own calls do)."""
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
        """The tools ``principal`` may call: a viewer the reading ones only; a feed or a
        worker token none (it reads no agent: each would be refused)."""
        if principal.role in (Role.FEED, Role.WORKER):
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
        return {"agents": [self.api._summary(a, now)
                           for a in principal.visible(self.engine.agent_ids)]}

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

    def _count_call(self, principal: Principal, parent: str | None) -> None:
        """Count an agent-scoped caller's call against its fan-out limits (`Forbidden`
        over one, nothing counted): at most ``maxCallsPerRun`` out at once, and in a run of
        its agent at most that many in the run, with the sub-agent calls the run sent."""
        name = principal.name
        limit = self._fan_out(principal)
        if self.out[name] >= limit:
            raise Forbidden(f"fan-out limit: {name!r} has {self.out[name]} calls out, its "
                            "limit; wait for one")
        for key in [k for k in self.made if k[0] == name and k[1] != parent]:
            del self.made[key]  # (runs of its agent that ended)
        if parent is not None:
            run = self.engine.state(name).active
            made = self.made[name, parent] + (run.sent if run is not None else 0)
            if made >= limit:
                raise Forbidden(f"fan-out limit: run {parent} of {name!r} made {made} "
                                f"calls, its maxCallsPerRun ({limit})")
            self.made[name, parent] += 1
        self.out[name] += 1

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

    def _depth(self, principal: Principal) -> tuple[int, str | None]:
        """The depth an agent-scoped caller's call goes at, and the run it comes from: one
        below the run its agent is in now (this gateway's own, or its replica's), so that a
        loop of calls through MCP is bounded as sub-agent calls are; 1 for a caller in no
        run, or whose name is no agent known here, and for any other token."""
        if principal.agents is None:
            return 1, None
        try:
            run = self.engine.state(principal.name).active
        except UnknownAgent:
            return 1, None
        return (1, None) if run is None else (run.depth + 1, run.run_id)

    async def call_agent(self, principal: Principal, args: CallArgs) -> dict[str, Any]:
        """`call_agent`: the call submitted (at the depth of `_depth`: the target's depth
        limit applies), then its end awaited in the target's stream (`CallWaits`)."""
        depth, parent = self._depth(principal)
        payload: dict[str, Any] = {"message": args.message, "depth": depth}
        if parent is not None:
            payload["parentRunId"] = parent
        request = self._request(principal, args, Kind.AGENT_CALL, payload,
                                "reject" if args.if_busy == "reject" else None)
        if self.waits.full:
            return self._busy(args.agent_id, request.request_id,
                              f"{self.waits.waiting} calls are waiting for their answers, "
                              "the most this gateway follows at once", 1)
        scoped = principal.agents is not None
        if scoped:
            self._count_call(principal, parent)
        try:
            async with self.waits.watch(args.agent_id, request.request_id) as wait:
                try:
                    ack = await self.api.submit_as(principal, request)
                except Busy as busy:
                    return self._busy(args.agent_id, request.request_id, str(busy),
                                      max(1, math.ceil(busy.retry_after_ms / 1000)))
                if ack.decision in ("rejected", "dropped"):
                    refused = await self._decision(args.agent_id, ack.position)
                    reason = ack.reason or f"requestId {request.request_id!r} was used " \
                        f"before: its first decision ({ack.decision}) stands; send a new " \
                        "requestId"
                    if _busy(refused, reason):
                        return self._busy(args.agent_id, request.request_id, reason)
                    return {"status": "refused", "agentId": args.agent_id,
                            "requestId": request.request_id, "reason": reason}
                answer: dict[str, Any] = {"agentId": args.agent_id,
                                          "requestId": request.request_id}
                ended = await wait.answer(args.timeout_seconds)
                if ended is not None:
                    return {**answer, "runId": wait.run_id, **ended[0], "position": ended[1]}
                return {**answer, "status": "timeout", "runId": wait.run_id,
                        "reason": f"no answer within {args.timeout_seconds:g} s; the request "
                        "stays in the agent's queue (follow it with story or search_log)"}
        finally:
            if scoped:
                self.out[principal.name] -= 1

    async def _decision(self, agent_id: str, position: int) -> Any:
        found = await self.api.log.read(after=position - 1, limit=1)
        if not found or found[0].stream != agent_id:
            return None
        return decode(found[0].type, found[0].data)


def _busy(refused: object, reason: str) -> bool:
    """Whether a call was refused for want of room (its agent busy and the call says
    ``ifBusy: reject``, or a full queue), rather than for good."""
    if isinstance(refused, RequestDropped):  # (dropPolicy new: the incoming one dropped)
        return "dropped the incoming" in reason
    # (a transient refusal: busy, a full queue of high-priority requests, or a requestId
    # reused for a different request, which is no matter of room)
    return isinstance(refused, RequestRejected) and refused.transient and \
        not reason.startswith("requestId")
