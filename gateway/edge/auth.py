"""Who is calling and what they may do: bearer tokens with a role and an optional scope."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.base.roles import Role
from gateway.errors import Forbidden, Unauthorized
from lanes.requests import AgentRequest, Kind
from lanes.schedules import MANUAL_SOURCE, SCHEDULE_SOURCE


def is_schedule_firing(request: AgentRequest) -> bool:
    """Whether a request looks like a firing of a schedule (which only the gateway makes)."""
    return (request.request_id.startswith(f"{SCHEDULE_SOURCE}:")
            or (request.dedupe_key or "").startswith(f"{SCHEDULE_SOURCE}:")
            or request.source in (SCHEDULE_SOURCE, MANUAL_SOURCE))


FEED_KINDS = frozenset({Kind.HOOK_TRIGGER, Kind.SYSTEM_ALERT})
GATEWAY_KINDS = frozenset({Kind.CALL_RESULT, Kind.CALL_CANCEL, Kind.APPROVAL_RESULT})
"""Kinds only the gateway itself sends (sub-agent call results and withdrawals, the
outcomes of approvals)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its name (recorded in events), role and agent scope."""

    name: str
    role: Role
    agents: frozenset[str] | None = None
    """None: every agent."""

    def may_see(self, agent_id: str) -> bool:
        """Whether this caller's scope includes the agent."""
        return self.agents is None or agent_id in self.agents

    def visible(self, agent_ids: Iterable[str]) -> list[str]:
        """Those of ``agent_ids`` in this caller's scope, in their order (a big desk's list
        is filtered without a call per agent: 10,000 calls of `may_see` held the loop for
        3-4 ms)."""
        scope = self.agents
        return list(agent_ids) if scope is None else [a for a in agent_ids if a in scope]

    def check_agent(self, agent_id: str) -> None:
        """Refuse an agent outside the scope."""
        if not self.may_see(agent_id):
            raise Forbidden(f"token {self.name!r} is not scoped to agent {agent_id!r}")

    def _not_worker(self) -> None:
        if self.role is Role.WORKER:
            raise Forbidden("a worker token only connects to /ws/worker, to do the runs of "
                            "its agents")

    def check_worker(self) -> None:
        """Doing runs on ``/ws/worker``: worker tokens only."""
        if self.role is not Role.WORKER:
            raise Forbidden(f"/ws/worker takes worker tokens; a {self.role.value} token "
                            "connects to /ws/control or /ws/feed")

    def check_read(self, agent_id: str | None = None) -> None:
        """Reading status and events: viewer, control and admin."""
        self._not_worker()
        if self.role is Role.FEED:
            raise Forbidden("a feed token cannot read agent state; use a viewer token")
        if agent_id is not None:
            self.check_agent(agent_id)

    def check_submit(self, request: AgentRequest) -> None:
        """Submitting a request: feed tokens only triggers and alerts; viewers nothing."""
        self._not_worker()
        self.check_agent(request.agent_id)
        if self.role is Role.VIEWER:
            raise Forbidden("a viewer token cannot submit requests")
        if self.role is Role.FEED and request.kind not in FEED_KINDS:
            raise Forbidden(
                f"a feed token may submit hook_trigger and system_alert only, not "
                f"{request.kind.value}"
            )
        if request.kind in GATEWAY_KINDS:
            raise Forbidden(f"{request.kind.value} requests are the gateway's own (the "
                            "results and withdrawals of sub-agent calls, the outcomes of "
                            "approvals); no token sends them")
        if is_schedule_firing(request):
            raise Forbidden("requests with a requestId or dedupeKey starting 'schedule:', or "
                            "the source 'schedule', are the scheduler's own (firings of "
                            "schedules); fire one with POST /api/agents/{id}/schedules/{id}/run")

    def check_operate(self, agent_id: str) -> None:
        """Controls, release, abort, clear: control and admin."""
        self.check_control()
        self.check_agent(agent_id)

    def check_control(self) -> None:
        """Acting on every agent of the scope at once (a desk kill): control and admin."""
        if self.role not in (Role.CONTROL, Role.ADMIN):
            raise Forbidden(f"a {self.role.value} token cannot act on agents")

    def check_admin(self) -> None:
        """Changing config: admin only."""
        if self.role is not Role.ADMIN:
            raise Forbidden("only an admin token can change configuration")

    def check_feed(self) -> None:
        """Pushing market events: feed, control and admin."""
        self._not_worker()
        if self.role is Role.VIEWER:
            raise Forbidden("a viewer token cannot push market events")


class TokenBook:
    """Looks bearer tokens up in constant time per token; never logs or returns a secret."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        self._entries = [(secret.encode(), principal) for secret, principal in entries]

    def __repr__(self) -> str:
        return f"TokenBook({len(self._entries)} tokens)"

    def authenticate(self, token: str | None) -> Principal:
        """The principal of a token, or `Unauthorized`."""
        if not token:
            raise Unauthorized()
        given = token.encode()
        found = None
        for secret, principal in self._entries:
            if hmac.compare_digest(secret, given):
                found = principal
        if found is None:
            raise Unauthorized("unknown token")
        return found

    def from_header(self, value: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer ...`` header value."""
        if not value or not value.lower().startswith("bearer "):
            raise Unauthorized("send 'Authorization: Bearer <token>'")
        return self.authenticate(value[7:].strip())
