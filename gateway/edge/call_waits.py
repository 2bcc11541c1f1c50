"""The ends of MCP ``call_agent`` calls in flight, read from the log by one follower for all
of them (`CallWaits`).

A call is watched from before its request is submitted, so every event of it commits after
the follower (started then, or already following) is positioned: none is missed, however
the commits and the answers to the callers interleave. The follower decodes only the events
of agents that a call waits on, hands each to the calls it names (by request id, then by the
run that took the request), and stops a while after the last call stopped waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.base.clock import Clock, SystemClock, Timer, timeout
from gateway.base.tasks import spawn, start
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
from store.port import LogReads, RecordedEvent

log = logging.getLogger("gateway.edge.call_waits")

MAX_WAITS: Final = 1_000
"""Calls waiting for their answers at once; past it ``call_agent`` answers busy."""
LINGER_S: Final = 5.0
"""How long the follower stays after the last call stopped waiting (calls one after
another share it too)."""

Ended = tuple[dict[str, Any], int]
"""How a call ended (``status`` and what goes with it) and the log position that says so."""
Key = tuple[str, str]
"""(agent id, request id or run id)."""


@dataclass(eq=False, slots=True)
class CallWait:
    """One call waiting for its end: the run that holds it now, and the end once read."""

    agent_id: str
    request_id: str
    clock: Clock
    """Whose time `answer`'s timeout counts."""
    run_id: str | None = None
    ended: asyncio.Future[Ended | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    """Its end, or None if the log ended first (the store closed)."""

    async def answer(self, timeout_s: float) -> Ended | None:
        """The call's end, or None if none was read within ``timeout_s`` of the clock (it
        goes on)."""
        with contextlib.suppress(TimeoutError):
            async with timeout(self.clock, timeout_s * 1_000):
                return await asyncio.shield(self.ended)
        return None


class CallWaits:
    """The calls waiting for their ends (at most ``limit``), and the one follower of the
    log that reads them all; their timeouts and the follower's linger count ``clock``'s time."""

    def __init__(self, log: LogReads, *, limit: int = MAX_WAITS,
                 linger_s: float = LINGER_S, clock: Clock | None = None) -> None:
        self.log = log
        self.clock: Clock = clock or SystemClock()
        self.limit = limit
        self.linger_s = linger_s
        self._calls: dict[Key, list[CallWait]] = {}
        self._runs: dict[Key, list[CallWait]] = {}
        self._streams: dict[str, int] = {}
        """Calls waiting on each agent: only their events are decoded."""
        self._count = 0
        self._tail: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._idle: Timer | None = None

    @property
    def waiting(self) -> int:
        """Calls waiting now."""
        return self._count

    @property
    def full(self) -> bool:
        """Whether another call would be one too many."""
        return self._count >= self.limit

    @contextlib.asynccontextmanager
    async def watch(self, agent_id: str, request_id: str) -> AsyncIterator[CallWait]:
        """Watch a call to ``agent_id`` with ``request_id`` while the block runs; submit its
        request inside the block (everything of it that commits from then on is read)."""
        wait = CallWait(agent_id, request_id, self.clock)
        self._add(wait)
        try:
            await self._following()
            yield wait
        finally:
            self._remove(wait)

    async def stop(self) -> None:
        """Stop the follower (the calls still waiting time out)."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        tail, self._tail = self._tail, None
        if tail is not None:
            tail.cancel()
            await asyncio.gather(tail, return_exceptions=True)

    # ------------------------------------------------------------------- bookkeeping

    def _add(self, wait: CallWait) -> None:
        self._calls.setdefault((wait.agent_id, wait.request_id), []).append(wait)
        self._streams[wait.agent_id] = self._streams.get(wait.agent_id, 0) + 1
        self._count += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _remove(self, wait: CallWait) -> None:
        if not _discard(self._calls, (wait.agent_id, wait.request_id), wait):
            return  # (removed before)
        if wait.run_id is not None:
            _discard(self._runs, (wait.agent_id, wait.run_id), wait)
        left = self._streams[wait.agent_id] - 1
        if left:
            self._streams[wait.agent_id] = left
        else:
            del self._streams[wait.agent_id]
        self._count -= 1
        if not self._count and self._tail is not None:
            clock = self.clock
            self._idle = clock.call_at(clock.now_ms() + round(self.linger_s * 1_000),
                                       self._linger)

    def _linger(self) -> None:
        """Nobody waited for a while: the follower stops (the next call starts one)."""
        self._idle = None
        if not self._count and self._tail is not None:
            self._tail.cancel()
            self._tail = None

    async def _following(self) -> None:
        """Make sure the follower runs, positioned before anything submitted from now."""
        while self._tail is None or self._tail.done():
            if self._starting is None:
                self._starting = start(self._start(), "call waits: follow the log")
            starting = self._starting
            try:
                await asyncio.shield(starting)
            finally:
                if self._starting is starting and starting.done():
                    self._starting = None

    async def _start(self) -> None:
        after = await self.log.last_position()
        self._tail = spawn(self._follow(after), "call_agent follower")

    # --------------------------------------------------------------------- the tail

    async def _follow(self, after: int) -> None:
        """Every event after ``after``, handed to the calls it concerns, until stopped; if
        the log ends or fails, every call waiting is told (None, or the error)."""
        me = asyncio.current_task()
        try:
            async with contextlib.aclosing(self.log.follow_batches(after)) as batches:
                async for batch in batches:
                    self._read(batch)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("the follower of call_agent answers failed: %r", error)
            self._end_all(error)
        else:
            self._end_all(None)
        finally:
            if self._tail is me:
                self._tail = None

    def _read(self, batch: list[RecordedEvent]) -> None:
        streams = self._streams
        for record in batch:
            if record.stream not in streams:
                continue
            event = decode(record.type, record.data)
            for wait in self._concerned(record.stream, event):
                before = wait.run_id
                run_id, ended = progress(event, wait.request_id, before)
                if ended is not None:
                    self._remove(wait)
                    wait.run_id = run_id
                    if not wait.ended.done():
                        wait.ended.set_result((ended, record.position))
                elif run_id != before:
                    if before is not None:
                        _discard(self._runs, (wait.agent_id, before), wait)
                    if run_id is not None:
                        self._runs.setdefault((wait.agent_id, run_id), []).append(wait)
                    wait.run_id = run_id

    def _concerned(self, stream: str, event: object) -> list[CallWait]:
        """The calls an event may move on: those it names by request id, and those held
        by the run it is of."""
        found: list[CallWait] = []
        if isinstance(event, RunStarted):
            for request_id in event.request_ids:
                found += self._calls.get((stream, request_id), ())
        elif isinstance(event, RunSteered | RequestDropped | RequestRejected):
            found += self._calls.get((stream, event.request_id), ())
        run_id = getattr(event, "run_id", None)
        if isinstance(run_id, str):
            found += [w for w in self._runs.get((stream, run_id), ()) if w not in found]
        return found

    def _end_all(self, error: Exception | None) -> None:
        for waits in list(self._calls.values()):
            for wait in waits:
                if wait.ended.done():
                    continue
                if error is None:
                    wait.ended.set_result(None)
                else:
                    wait.ended.set_exception(error)
                    wait.ended.exception()  # (retrieved: a call that timed out never reads it)


def _discard(index: dict[Key, list[CallWait]], key: Key, wait: CallWait) -> bool:
    waits = index.get(key)
    if waits is None or wait not in waits:
        return False
    waits.remove(wait)
    if not waits:
        del index[key]
    return True


def progress(event: object, request_id: str, run_id: str | None
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
