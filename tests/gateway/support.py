"""Test doubles for the runtime: a reasoner the test finishes by hand, request makers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from gateway.llm.reasoner import RunContext, RunResult
from lanes import AgentRequest, Entry, parse_request
from lanes.codec import decode
from lanes.events import Outcome
from lanes.streams import is_agent_stream
from store import EventStore, RecordedEvent

TIMEOUT = 10.0
T = TypeVar("T")
_ids = itertools.count(1)


class ManualReasoner:
    """Each run waits until the test finishes it; the test sees each run start."""

    def __init__(self) -> None:
        self.results: dict[str, asyncio.Future[RunResult]] = {}
        self.contexts: dict[str, RunContext] = {}
        self.cancelled: list[str] = []
        self._started: asyncio.Queue[str] = asyncio.Queue()

    @classmethod
    def per_agent(cls) -> Callable[[str], ManualReasoner]:
        """A factory giving every agent the same new manual reasoner."""
        shared = cls()
        return lambda _agent_id: shared

    async def run(self, ctx: RunContext) -> RunResult:
        future: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self.results[ctx.run_id] = future
        self.contexts[ctx.run_id] = ctx
        self._started.put_nowait(ctx.run_id)
        try:
            return await future
        except asyncio.CancelledError:
            self.cancelled.append(ctx.run_id)
            raise

    async def started(self) -> RunContext:
        """The next run that starts (fails the test if none does in time)."""
        run_id = await asyncio.wait_for(self._started.get(), TIMEOUT)
        return self.contexts[run_id]

    def finish(self, run_id: str, outcome: str = "no_trade", **result: Any) -> None:
        """Let a run return."""
        self.results[run_id].set_result(RunResult(outcome=Outcome(outcome), **result))


def request(agent: str, kind: str = "hook_trigger", **fields: Any) -> AgentRequest:
    """A valid request with a fresh id."""
    data: dict[str, Any] = {
        "requestId": f"rq_{next(_ids)}",
        "createdAt": datetime(2026, 2, 17, 3, 10, tzinfo=UTC).isoformat(),
        "agentId": agent,
        "kind": kind,
        **fields,
    }
    return parse_request(data)


def control(agent: str, action: str, **payload: Any) -> AgentRequest:
    """A control-lane request."""
    return request(agent, "user_control", payload={"action": action, **payload})


async def log_of(store: EventStore) -> list[Entry]:
    """The agents' log, decoded (provider gate streams left out)."""
    return [Entry(r.position, r.stream, decode(r.type, r.data)) for r in await store.read()
            if is_agent_stream(r.stream)]


async def next_event(store: EventStore, type_name: str, after: int = 0,
                     within_s: float = TIMEOUT) -> RecordedEvent:
    """The first committed event of that type after ``after`` (waits for it, for up to
    ``within_s`` seconds)."""

    async def find() -> RecordedEvent:
        async with contextlib.aclosing(store.follow(after)) as events:
            async for record in events:
                if record.type == type_name:
                    return record
        raise AssertionError(f"the store closed before a {type_name} was committed")

    return await asyncio.wait_for(find(), within_s)


async def until(probe: Callable[[], Awaitable[T | None]], what: str,
                within_s: float = TIMEOUT) -> T:
    """The first truthy result of ``probe``, polled for up to ``within_s`` seconds (then the
    test fails): for a condition no event announces (a socket's state, a metric)."""
    deadline = time.monotonic() + within_s
    while True:
        found = await probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)  # polling a condition, with a deadline


async def turns(count: int = 5) -> None:
    """Let what is ready run for ``count`` turns of the loop: to see that something did not
    happen (real time passes meanwhile, a fake clock's does not)."""
    for _ in range(count):
        await asyncio.sleep(0)
