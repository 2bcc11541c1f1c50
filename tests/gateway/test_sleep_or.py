"""`sleep_or`: a wait of the clock's time that an event cuts short (the schedules' pass, the
cluster's renewals and the market feed wait so), and `timeout`, a block the clock's time
ends (the feed's intake holds a frame, a run waits for its worker so), on a fake clock."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.base.clock import FakeClock, SystemClock, sleep_or, timeout
from tests.gateway.support import TIMEOUT


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_it_waits_the_clocks_time_and_says_the_event_was_not_set() -> None:
    clock, event = FakeClock(), asyncio.Event()
    waiting = asyncio.ensure_future(sleep_or(clock, 1_000, event))
    await _turns()
    clock.advance(999)
    await _turns()
    assert not waiting.done()  # (real time passes, the clock's does not)
    clock.advance(1)
    assert await asyncio.wait_for(waiting, TIMEOUT) is False


async def test_the_event_cuts_the_wait_short() -> None:
    clock, event = FakeClock(), asyncio.Event()
    waiting = asyncio.ensure_future(sleep_or(clock, 60_000, event))
    await _turns()
    event.set()
    assert await asyncio.wait_for(waiting, TIMEOUT) is True
    assert await sleep_or(clock, 60_000, event) is True  # (set already: no wait at all)


async def test_a_cancelled_wait_is_cancelled_and_leaves_no_task_behind() -> None:
    clock, event = FakeClock(), asyncio.Event()
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(sleep_or(clock, 60_000, event))
    await _turns()
    assert len(asyncio.all_tasks() - before) == 3  # (itself, its sleep, its wait)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert asyncio.all_tasks() - before == set()


async def test_a_timeout_of_the_clock_ends_the_block_when_the_clocks_time_says() -> None:
    clock, event = FakeClock(), asyncio.Event()

    async def waits() -> str:
        try:
            async with timeout(clock, 1_000):
                await event.wait()
        except TimeoutError:
            return "timed out"
        return "done"

    waiting = asyncio.ensure_future(waits())
    await _turns()
    clock.advance(999)
    await _turns()
    assert not waiting.done()  # (real time passes, the clock's does not)
    clock.advance(1)
    assert await asyncio.wait_for(waiting, TIMEOUT) == "timed out"
    again = asyncio.ensure_future(waits())  # a block that ends first is not cut afterwards
    await _turns()
    event.set()
    assert await asyncio.wait_for(again, TIMEOUT) == "done"
    clock.advance(5_000)
    await _turns()


async def test_nested_timeouts_of_the_clock_each_end_their_own_block() -> None:
    clock = FakeClock()
    inner_ended = 0

    async def waits() -> str:
        nonlocal inner_ended
        try:
            async with timeout(clock, 100):
                while True:
                    with contextlib.suppress(TimeoutError):
                        async with timeout(clock, 30):
                            await asyncio.Event().wait()
                    inner_ended += 1
        except TimeoutError:
            return "outer"

    waiting = asyncio.ensure_future(waits())
    for _ in range(3):
        await _turns()
        clock.advance(30)
    await _turns()
    assert inner_ended == 3 and not waiting.done()
    clock.advance(10)  # the outer's 100 ms, with an inner one under way
    assert await asyncio.wait_for(waiting, TIMEOUT) == "outer"
    assert inner_ended == 3


def test_the_clocks_tell_elapsed_time_apart_from_the_wall() -> None:
    fake = FakeClock()
    start = fake.monotonic_ms()
    fake.advance(250)
    assert fake.monotonic_ms() - start == 250
    system = SystemClock()
    readings = [system.monotonic_ms() for _ in range(1_000)]
    assert readings == sorted(readings)
