"""`sleep_or`: a wait of the clock's time that an event cuts short (the schedules' pass, the
cluster's renewals and the market feed wait so), on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gateway.base.clock import FakeClock, sleep_or
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
