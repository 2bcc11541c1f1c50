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

With ``flatten``, once every stop has answered, each agent that was stopped gets the
operator's ``flatten`` control (`lanes.flatten`; request id the kill's id with
`FLATTEN_SUFFIX`): one closing market order per symbol it holds, decided on its control
lane although it is HALTED (the operator's, and it only reduces), sent to the broker after
the commit like every order. The record says, per agent, the closing orders sent, or why
there were none (``nothing to flatten``). Click-to-HALTED does not wait for the flatten:
the stops are all committed before any flatten is taken.
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
from gateway.runtime.effects import ControlEffect, FlattenOrder
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
FLATTEN_SUFFIX = "_flatten"
"""Of the request id of each agent's flatten (after the kill's id)."""


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
    flatten_orders: list[FlattenOrder] | None = None
    """With ``flatten``: the closing orders sent for it (None: no flatten was taken)."""
    flatten_note: str | None = None
    """With ``flatten``: why no closing order was sent (nothing to flatten, refused)."""

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
    flatten: bool = False
    """Each stopped agent's positions were flattened too."""
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

    @property
    def flatten_orders(self) -> int:
        """Closing orders the kill's flatten sent."""
        return sum(len(a.flatten_orders or ()) for a in self.agents)


def new_kill_id() -> str:
    """A fresh desk kill id."""
    return KILL_PREFIX + secrets.token_hex(8)


async def desk_kill(engine: Engine, way_in: WayIn, agents: Sequence[str], principal: str,
                    reason: str | None = None, scope: Sequence[str] | None = None,
                    kill_id: str | None = None, flatten: bool = False) -> DeskKilled:
    """Stop every agent of ``agents`` at once (through ``way_in``: the engine, or a
    cluster's router), then (``flatten``) flatten each one stopped, and record one
    `DeskKilled` in ``engine``'s log with what each did (an agent that does not exist or
    cannot be stopped now is recorded with its error); answered after that record's
    commit, which follows every stop's and flatten's."""
    kill_id = kill_id or new_kill_id()
    at = engine.clock.now_ms()
    answers = await _controls(way_in, agents, principal, kill_id, at, "emergency_stop",
                              reason)
    killed = [_killed(a, answer) for a, answer in zip(agents, answers, strict=True)]
    if flatten:
        killed = await _flatten(way_in, killed, principal, kill_id, at, reason)
    record = DeskKilled(kill_id=kill_id, at=at, principal=principal, reason=reason,
                        scope=None if scope is None else sorted(scope), flatten=flatten,
                        agents=killed)
    text = record.model_dump_json(exclude_none=True, exclude={"position"})
    append = Append(DESK_STREAM, [NewEvent(kill_id, RECORD_TYPE, text)], None, urgent=True)
    recorded = await engine.store.append(append)
    refused = [a.agent_id for a in record.agents if a.error is not None]
    log.warning("desk kill %s by %s: %d of %d agents HALTED, %d cancels sent%s%s", kill_id,
                principal, record.halted, len(agents), record.cancels_requested,
                f", {record.flatten_orders} flatten orders sent" if flatten else "",
                f"; not halted: {', '.join(refused)}" if refused else "")
    return record.model_copy(update={"position": recorded[0].position})


async def _controls(way_in: WayIn, agents: Sequence[str], principal: str, request_id: str,
                    at: int, action: str, reason: str | None) -> list[Ack | GatewayError]:
    """One ``action`` control for each of ``agents``, all at once, each answered."""
    created = datetime.fromtimestamp(at / 1000, UTC)
    payload = {"action": action, "reason": reason or "desk kill"}
    requests = [parse_request({
        "requestId": request_id, "createdAt": created, "agentId": agent_id,
        "kind": "user_control", "priority": "high", "source": f"desk:{principal}",
        "payload": payload}) for agent_id in agents]
    return await settled(await in_steps(way_in, requests, principal))


async def _flatten(way_in: WayIn, killed: list[AgentKilled], principal: str, kill_id: str,
                   at: int, reason: str | None) -> list[AgentKilled]:
    """Flatten each agent the kill stopped; ``killed`` with what each flatten did."""
    stopped = [a.agent_id for a in killed if a.error is None]
    answers = dict(zip(stopped, await _controls(way_in, stopped, principal,
                                                kill_id + FLATTEN_SUFFIX, at, "flatten",
                                                reason), strict=True))
    return [a if a.agent_id not in answers else a.model_copy(update=_flattened(
        answers[a.agent_id])) for a in killed]


def _flattened(answer: Ack | GatewayError) -> dict[str, object]:
    if isinstance(answer, GatewayError):
        return {"flatten_orders": [], "flatten_note": f"{answer.code}: {answer}"}
    orders = [] if answer.effect is None else answer.effect.flatten_orders
    note = None if answer.decision == "accepted" else answer.reason or answer.decision
    return {"flatten_orders": orders, "flatten_note": note}


def _killed(agent_id: str, answer: Ack | GatewayError) -> AgentKilled:
    if isinstance(answer, GatewayError):
        return AgentKilled(agent_id=agent_id, error=answer.code, message=str(answer))
    return AgentKilled(agent_id=agent_id, decision=answer.decision, position=answer.position,
                       effect=answer.effect)


def read_kill(data: str | bytes) -> DeskKilled:
    """A `DeskKilled` from its record's JSON (``ValueError`` if it does not read)."""
    return DeskKilled.model_validate_json(data)
