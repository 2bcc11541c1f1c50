"""Sub-agent calls on their way: a committed call delivered to its target, its answer back to
the caller, a call given up on withdrawn from its target.

Each is a request of the gateway's own, with an id fixed by the call's, so delivering one
twice (after a restart, a change of owner) is harmless. Delivery is tried again while the
target is unavailable (being rebuilt, or moving between processes), waiting on the `Clock`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Final

from gateway.base.clock import Clock
from gateway.errors import GatewayError
from gateway.runtime.acks import Ack
from lanes import AgentRequest
from lanes.events import (
    AgentCallDispatched,
    CallAnswered,
    CallEnded,
    CallUndeliverable,
    answer_id,
    withdrawal_id,
)
from lanes.requests import Kind

log = logging.getLogger("gateway.runtime.engine")

CALL_ATTEMPTS: Final = 10
"""How often delivering a sub-agent call is tried while the target is unavailable (being
rebuilt, or moving between the processes of a cluster: about 20 s in all)."""
CALL_BACKOFF_MAX_MS: Final = 4_000
RETRY_CALL_CODES: Final = frozenset({"unavailable", "storage_failed"})
"""What a call's delivery is tried again after (its target may take it a moment later)."""


class Calls:
    """Delivers the calls, answers and withdrawals the agents' decisions committed.

    ``submit`` takes a request wherever its agent is decided (this process or another);
    ``undeliverable`` records at the caller that a call could not be delivered."""

    def __init__(self, *, clock: Clock, submit: Callable[[AgentRequest], Awaitable[Ack]],
                 undeliverable: Callable[[str, CallUndeliverable], Awaitable[None]],
                 spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]) -> None:
        self._clock = clock
        self._submit = submit
        self._undeliverable = undeliverable
        self._spawn = spawn
        self.deliveries: set[asyncio.Task[None]] = set()
        """Deliveries under way."""

    def call(self, parent: str, call: AgentCallDispatched) -> None:
        """Deliver a committed sub-agent call; if it cannot be, the parent records why."""
        self._deliver(self._call(parent, call), f"call {call.call_id}")

    def answer(self, child: str, answer: CallAnswered) -> None:
        """Deliver a committed answer to the agent that made the call."""
        self._deliver(self._answer(child, answer), f"answer {answer.result.call_id}")

    def withdraw(self, caller: str, ended: CallEnded) -> None:
        """Tell the target of a call its caller gave up on."""
        self._deliver(self._withdraw(caller, ended), f"withdraw {ended.call_id}")

    def _deliver(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = self._spawn(coro, name)
        self.deliveries.add(task)
        task.add_done_callback(self.deliveries.discard)

    async def _call(self, parent: str, call: AgentCallDispatched) -> None:
        request = AgentRequest(
            request_id=call.call_id,
            created_at=utc(self._clock.now_ms()),
            agent_id=call.target,
            kind=Kind.AGENT_CALL,
            priority=call.priority,
            source=f"agent:{parent}",
            payload={**call.payload, "depth": call.depth, "parentRunId": call.run_id},
        )
        reason = await self._retrying(request)
        if reason is not None:
            await self._undeliverable(parent, CallUndeliverable(
                at=self._clock.now_ms(), call_id=call.call_id, run_id=call.run_id,
                target=call.target, reason=f"call {call.call_id} not delivered: {reason}"))

    async def _answer(self, child: str, answer: CallAnswered) -> None:
        """As a ``call_result`` request (taken wherever the caller is decided). A call its
        parent's runs did not make (their ids start ``<parent>-``), one sent over MCP with an
        agent-scoped token, is answered to nobody: its caller reads the answer from the log."""
        result = answer.result
        if not result.call_id.startswith(f"{answer.parent}-"):
            log.debug("call %s came from outside (%s): its answer is not delivered",
                      result.call_id, answer.parent)
            return
        request = AgentRequest(
            request_id=answer_id(result.call_id),
            created_at=utc(self._clock.now_ms()),
            agent_id=answer.parent,
            kind=Kind.CALL_RESULT,
            source=f"agent:{child}",
            payload=result.model_dump(mode="json", by_alias=True, exclude_none=True),
        )
        reason = await self._retrying(request)
        if reason is not None:  # the caller times the call out, if it has a timeout
            log.warning("the answer to call %s (%s) did not reach %s: %s", result.call_id,
                        result.status.value, answer.parent, reason)

    async def _withdraw(self, caller: str, ended: CallEnded) -> None:
        """A ``call_cancel`` request, so that the target drops what is still to do for it.
        Best effort: not sent again after a restart (the target's answer is then refused by
        the caller, as late)."""
        request = AgentRequest(
            request_id=withdrawal_id(ended.call_id),
            created_at=utc(self._clock.now_ms()),
            agent_id=ended.result.target,
            kind=Kind.CALL_CANCEL,
            source=f"agent:{caller}",
            payload={"callId": ended.call_id, "status": ended.result.status.value},
        )
        reason = await self._retrying(request)
        if reason is not None:
            log.warning("call %s was not withdrawn from %s: %s", ended.call_id,
                        ended.result.target, reason)

    async def _retrying(self, request: AgentRequest) -> str | None:
        """Submit ``request``, trying again while its agent is unavailable; why it could not
        be, or None once it is decided."""
        reason = ""
        for attempt in range(CALL_ATTEMPTS):
            try:
                await self._submit(request)
                return None
            except GatewayError as error:
                reason = str(error)
                if error.code not in RETRY_CALL_CODES:
                    break
                # (its agent is being rebuilt, or moves to another process: wait for it)
                await self._clock.sleep(min(CALL_BACKOFF_MAX_MS, 100 * 2**attempt))
        return reason


def utc(ms: int) -> datetime:
    """A time in ms since the epoch, as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)
