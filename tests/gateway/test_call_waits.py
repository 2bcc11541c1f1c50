"""The ends of MCP ``call_agent`` calls, read from the log by one follower for all of them
(`gateway.edge.call_waits`): each call gets its own end, whatever the others do; the calls
in flight share one follower; there are at most so many; the follower goes once idle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest

from gateway.base.clock import FakeClock, SystemClock
from gateway.edge.call_waits import CallWait, CallWaits
from gateway.runtime.engine import Engine
from lanes import AgentConfig, AgentRequest, Mode
from store import MemoryEventStore, RecordedEvent, StoreError
from tests.gateway.support import TIMEOUT, ManualReasoner, control, request, turns, until

AGENTS = {"a": AgentConfig(mode=Mode.FOLLOWUP), "b": AgentConfig(mode=Mode.FOLLOWUP)}


class Counted:
    """A store whose followers are counted."""

    def __init__(self, store: MemoryEventStore) -> None:
        self.store = store
        self.follows = 0
        self.open = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def follow_batches(self, after: int = 0, limit: int = 2000
                       ) -> AsyncGenerator[list[RecordedEvent], None]:
        self.follows += 1
        return self._counting(self.store.follow_batches(after, limit))

    async def _counting(self, batches: AsyncGenerator[list[RecordedEvent], None]
                        ) -> AsyncGenerator[list[RecordedEvent], None]:
        self.open += 1
        try:
            async for batch in batches:
                yield batch
        finally:
            self.open -= 1
            await batches.aclose()


@asynccontextmanager
async def desk(**waits: Any) -> AsyncIterator[tuple[Engine, ManualReasoner, CallWaits,
                                                     Counted]]:
    store = MemoryEventStore()
    reasoner = ManualReasoner()
    engine = Engine(store, AGENTS, clock=SystemClock(), reasoners=lambda _: reasoner)
    await engine.start()
    log = Counted(store)
    calls = CallWaits(log, **waits)
    try:
        yield engine, reasoner, calls, log
    finally:
        await calls.stop()
        await engine.stop()


async def submitted(stack: AsyncExitStack, engine: Engine, calls: CallWaits,
                    call: AgentRequest) -> CallWait:
    """``call`` submitted while watched, as ``call_agent`` does."""
    wait = await stack.enter_async_context(calls.watch(call.agent_id, call.request_id))
    await engine.submit(call)
    return wait


def status(ended: tuple[dict[str, Any], int] | None) -> Any:
    assert ended is not None
    return ended[0]["status"]


async def test_calls_in_flight_share_one_follower_and_each_gets_its_own_end() -> None:
    async with desk() as (engine, reasoner, calls, log), AsyncExitStack() as stack:
        first = await submitted(stack, engine, calls, request("a", "agent_call", requestId="c1"))
        run_a = await reasoner.started()
        queued = await submitted(stack, engine, calls, request("a", "agent_call",
                                                               requestId="c2"))
        # the same request id at another agent is another call
        other = await submitted(stack, engine, calls, request("b", "agent_call",
                                                              requestId="c1"))
        run_b = await reasoner.started()
        assert calls.waiting == 3 and log.follows == 1 and log.open == 1
        reasoner.finish(run_b.run_id, answer="from b")
        assert await other.answer(TIMEOUT) is not None and other.run_id == run_b.run_id
        assert not first.ended.done() and not queued.ended.done()
        # a run aborted and requeued is waited past: the run that takes the call answers
        await engine.submit(control("a", "emergency_stop"))
        await engine.submit(control("a", "resume"))
        ended = await first.answer(TIMEOUT)
        assert ended is not None and ended[0] == {"status": "aborted",
                                                  "reason": "emergency_stop"}
        rerun = await reasoner.started()
        assert rerun.requests[0].request_id == "c2"
        reasoner.finish(rerun.run_id, answer="second")
        done = await queued.answer(TIMEOUT)
        assert done is not None and done[0]["answer"] == "second"
        assert queued.run_id == rerun.run_id and run_a.run_id != rerun.run_id
        assert log.follows == 1


async def test_a_call_refused_at_its_agent_ends_refused_and_one_not_ended_times_out() -> None:
    clock = FakeClock()
    async with desk(clock=clock) as (engine, reasoner, calls, _log), AsyncExitStack() as stack:
        deep = await submitted(stack, engine, calls, request(
            "a", "agent_call", requestId="deep", payload={"depth": 9}))
        assert status(await deep.answer(TIMEOUT)) == "refused"
        slow = await submitted(stack, engine, calls, request("b", "agent_call",
                                                             requestId="slow"))
        run = await reasoner.started()
        answer = asyncio.ensure_future(slow.answer(600))
        await turns()
        clock.advance(599_999)
        await turns()
        assert not answer.done()  # (real time passes, the clock's does not)
        clock.advance(1)
        assert await asyncio.wait_for(answer, TIMEOUT) is None and slow.run_id == run.run_id
        reasoner.finish(run.run_id)  # (still waited for after a timed-out answer)
        assert status(await slow.answer(TIMEOUT)) == "returned"


async def test_at_most_limit_calls_wait_and_the_follower_goes_when_idle() -> None:
    async with desk(limit=2, linger_s=0.0) as (engine, reasoner, calls, log):
        async with AsyncExitStack() as stack:
            await submitted(stack, engine, calls, request("a", "agent_call"))
            assert not calls.full
            await submitted(stack, engine, calls, request("b", "agent_call"))
            assert calls.full and calls.waiting == 2
        assert calls.waiting == 0 and not calls.full

        async def gone() -> bool:
            return log.open == 0
        await until(gone, "the idle follower to stop")
        async with AsyncExitStack() as stack:  # the next call follows again
            wait = await submitted(stack, engine, calls, request("b", "agent_call"))
            assert log.follows == 2 and log.open == 1
            for _ in range(3):  # (a's run, b's, then the run of this call)
                run = await reasoner.started()
                reasoner.finish(run.run_id)
            assert status(await wait.answer(TIMEOUT)) == "returned"


async def test_the_idle_follower_lingers_for_the_clocks_time() -> None:
    clock = FakeClock()
    async with desk(linger_s=600.0, clock=clock) as (engine, _reasoner, calls, log):
        async with AsyncExitStack() as stack:
            await submitted(stack, engine, calls, request("a", "agent_call"))
        await turns()
        clock.advance(599_999)
        await turns()
        assert log.open == 1  # (real time passes, the clock's does not)
        clock.advance(1)

        async def gone() -> bool:
            return log.open == 0
        await until(gone, "the idle follower to stop")


class Failing:
    """A log whose follower fails once it has started."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def last_position(self) -> int:
        return 0

    async def follow_batches(self, after: int = 0, limit: int = 2000
                             ) -> AsyncGenerator[list[RecordedEvent], None]:
        await self.go.wait()
        raise StoreError("the log is gone")
        yield []  # (an async generator)


@pytest.mark.parametrize("fail", [True, False])
async def test_a_follower_that_fails_or_ends_tells_every_call_waiting(fail: bool) -> None:
    log = Failing()
    calls = CallWaits(log)  # type: ignore[arg-type]
    if not fail:
        async def ended(after: int = 0, limit: int = 2000
                        ) -> AsyncGenerator[list[RecordedEvent], None]:
            await log.go.wait()
            return
            yield []
        log.follow_batches = ended  # type: ignore[method-assign]
    async with calls.watch("a", "c1") as one, calls.watch("b", "c2") as two:
        log.go.set()
        for wait in (one, two):
            if fail:
                with pytest.raises(StoreError):
                    await wait.answer(TIMEOUT)
            else:
                assert await wait.answer(TIMEOUT) is None
    await calls.stop()
