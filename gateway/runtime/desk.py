"""One desk kill: an emergency stop of every agent in a scope at once, recorded as one
operator event that says what it did to each agent.

Each agent's stop is an ordinary ``user_control`` ``emergency_stop`` request (one request
id for the whole kill), so it goes where every stop goes: decided on the agent's control
lane, its run aborted there and then, every open order's cancel sent after the commit,
HALTED across restarts, re-decided by ``gateway verify``. All the stops are taken in one
step, each answered after its own commit: no stop waits for another agent's.

Once every agent has answered (or was refused), one ``DeskKilled`` event is appended to
`lanes.streams.DESK_STREAM` with each agent's effect (its trading state before and after,
the run aborted, the cancels requested) or why it was refused (an unknown agent, one not
available now). It is a record for people and tools, never an input of any agent: replay
and verify read past it (verify checks that it reads back).

Flattening positions is not part of it: a HALTED agent may place no order at all (the
control lane's table in the design), so there is no order a kill could flatten with that
the agents' own rules would accept; a broker adapter that closes positions by itself would
be the place for it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import Field

from gateway.errors import GatewayError
from gateway.runtime.acks import Ack
from gateway.runtime.effects import ControlEffect
from gateway.runtime.intake import WayIn, in_steps, settled
from lanes import parse_request
from lanes.events import TradingState
from lanes.requests import WireModel
from lanes.streams import DESK_STREAM
from store.port import Append, NewEvent

if TYPE_CHECKING:
    from gateway.runtime.engine import Engine

log = logging.getLogger("gateway.controls")

RECORD_TYPE = "DeskKilled"
"""The type of a desk kill's event in `DESK_STREAM`."""
KILL_PREFIX = "desk_kill_"
"""Of a desk kill's id, which is also the request id of each agent's stop."""


class AgentKilled(WireModel):
    """What a desk kill did to one agent: its stop's ack (``effect`` for an accepted stop
    that was not a repeat) or the error it was refused with (``error``, ``message``)."""

    agent_id: str
    decision: str | None = None
    """``accepted`` (or what else the agent's control lane decided); None if refused."""
    position: int | None = None
    """Of the stop's decision in the log."""
    effect: ControlEffect | None = None
    error: str | None = None
    """The error code it was refused with (``unknown_agent``, ``unavailable``, ...)."""
    message: str | None = None

    @property
    def halted(self) -> bool:
        """Whether the agent is HALTED by (or since before) this kill."""
        return self.effect is not None and self.effect.to_state is TradingState.HALTED


class DeskKilled(WireModel):
    """One desk kill, as recorded in `DESK_STREAM` and answered to its caller."""

    kill_id: str = Field(min_length=1, max_length=128)
    """Also the request id of every agent's emergency stop."""
    at: int
    """Gateway time (ms) it was taken."""
    principal: str
    reason: str | None = None
    scope: list[str] | None = None
    """The caller's scope (None: every agent)."""
    agents: list[AgentKilled]
    """Every agent of the scope, in id order, with what the kill did to it."""
    position: int | None = None
    """Of this record in the log (set once it is committed; not stored)."""

    @property
    def halted(self) -> int:
        """Agents HALTED now (by this kill or already)."""
        return sum(a.halted for a in self.agents)

    @property
    def cancels_requested(self) -> int:
        """Open orders whose cancel the kill sent."""
        return sum(a.effect.cancels_requested for a in self.agents if a.effect is not None)


def new_kill_id() -> str:
    """A fresh desk kill id."""
    return KILL_PREFIX + secrets.token_hex(8)


async def desk_kill(engine: Engine, way_in: WayIn, agents: Sequence[str], principal: str,
                    reason: str | None = None, scope: Sequence[str] | None = None,
                    kill_id: str | None = None) -> DeskKilled:
    """Stop every agent of ``agents`` at once (through ``way_in``: the engine, or a
    cluster's router) and record one `DeskKilled` in ``engine``'s log with what each stop
    did (an agent that does not exist or cannot be stopped now is recorded with its
    error); answered after that record's commit, which follows every stop's."""
    kill_id = kill_id or new_kill_id()
    at = engine.clock.now_ms()
    created = datetime.fromtimestamp(at / 1000, UTC)
    payload = {"action": "emergency_stop", "reason": reason or "desk kill"}
    requests = [parse_request({
        "requestId": kill_id, "createdAt": created, "agentId": agent_id,
        "kind": "user_control", "priority": "high", "source": f"desk:{principal}",
        "payload": payload}) for agent_id in agents]
    answers = await settled(await in_steps(way_in, requests, principal))
    record = DeskKilled(kill_id=kill_id, at=at, principal=principal, reason=reason,
                        scope=None if scope is None else sorted(scope),
                        agents=[_killed(a, answer) for a, answer in zip(agents, answers,
                                                                        strict=True)])
    text = record.model_dump_json(exclude_none=True, exclude={"position"})
    append = Append(DESK_STREAM, [NewEvent(kill_id, RECORD_TYPE, text)], None, urgent=True)
    recorded = await engine.store.append(append)
    refused = [a.agent_id for a in record.agents if a.error is not None]
    log.warning("desk kill %s by %s: %d of %d agents HALTED, %d cancels sent%s", kill_id,
                principal, record.halted, len(agents), record.cancels_requested,
                f"; not halted: {', '.join(refused)}" if refused else "")
    return record.model_copy(update={"position": recorded[0].position})


def _killed(agent_id: str, answer: Ack | GatewayError) -> AgentKilled:
    if isinstance(answer, GatewayError):
        return AgentKilled(agent_id=agent_id, error=answer.code, message=str(answer))
    return AgentKilled(agent_id=agent_id, decision=answer.decision, position=answer.position,
                       effect=answer.effect)


def read_kill(data: str | bytes) -> DeskKilled:
    """A `DeskKilled` from its record's JSON (``ValueError`` if it does not read)."""
    return DeskKilled.model_validate_json(data)
