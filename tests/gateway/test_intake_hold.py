"""The feed's intake: a frame beyond the latency budget waits for room (its connection
unread meanwhile) instead of being answered ``busy`` at once, and is refused only when no
room comes within ``hold_ms``; shares stay per connection."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from gateway.base.clock import FakeClock
from gateway.edge.intake import Intake


@dataclass
class Log:
    """What the intake reads of the log: what waits for its commit, and the commit rate."""

    backlog: int = 0
    commit_rate: float | None = 10_000.0  # events/s: a 50 ms budget is 500 events


async def test_a_frame_within_the_budget_is_taken_at_once() -> None:
    intake = Intake(Log(backlog=10))  # type: ignore[arg-type]
    assert await intake.room("feed-1") is None
    assert intake.refused == 0


async def test_a_frame_beyond_the_budget_waits_for_the_commit_that_makes_room() -> None:
    log = Log(backlog=900)
    intake = Intake(log, hold_ms=60_000)  # type: ignore[arg-type]
    intake.took("feed-1", 900)
    waiting = asyncio.ensure_future(intake.room("feed-1"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not waiting.done()  # held, not answered busy
    log.backlog = 100
    intake.settled("feed-1", 800)  # its commit: the held frame looks again
    assert await asyncio.wait_for(waiting, 5) is None
    assert intake.refused == 0


async def test_a_frame_with_no_room_within_the_hold_is_refused_with_a_retry() -> None:
    intake = Intake(Log(backlog=5_000), hold_ms=20)  # type: ignore[arg-type]
    retry = await asyncio.wait_for(intake.room("feed-1"), 5)
    assert retry is not None and 5 <= retry <= 1_000
    assert intake.refused == 1


async def test_no_hold_answers_at_once_as_before() -> None:
    intake = Intake(Log(backlog=5_000), hold_ms=0)  # type: ignore[arg-type]
    assert intake.check("feed-1") is not None
    assert await intake.room("feed-1") is not None
    assert intake.refused == 1


async def test_a_connection_over_its_share_waits_while_another_is_taken() -> None:
    log = Log(backlog=300)
    intake = Intake(log, hold_ms=60_000)  # type: ignore[arg-type]
    intake.took("flood", 300)
    intake.took("quiet", 2)
    flood = asyncio.ensure_future(intake.room("flood"))  # over its half of 500
    assert await intake.room("quiet") is None
    await asyncio.sleep(0)
    assert not flood.done()
    log.backlog = 2
    intake.settled("flood", 300)
    assert await asyncio.wait_for(flood, 5) is None


def test_a_negative_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="hold_ms"):
        Intake(Log(), hold_ms=-1)  # type: ignore[arg-type]


async def test_the_hold_counts_the_clocks_time() -> None:
    clock = FakeClock()
    intake = Intake(Log(backlog=5_000), hold_ms=60_000, clock=clock)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(intake.room("feed-1"))
    for _ in range(5):
        await asyncio.sleep(0)
    clock.advance(59_999)  # (its retries come and go: still no room)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done() and intake.refused == 0
    clock.advance(1)  # (the clock's minute ends it; a real one would outlast the wait below)
    retry = await asyncio.wait_for(waiting, 5)
    assert retry is not None and intake.refused == 1
