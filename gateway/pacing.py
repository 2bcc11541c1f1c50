"""Bulk work takes turns, so that whatever else is ready never waits behind much of it.

An event loop runs every ready callback in arrival order, and polls its sockets only between
rounds: under a flood, an emergency stop's frame is not even read until everything queued
before it has run. A `Pacer` keeps the feed's work (validating a frame, deciding its
requests, answering it) to one small unit per turn of the loop, with a poll of the sockets
before each: a control frame, a commit's ack or a run's result waits for at most one unit.
Work that does not take a turn (the control lane) is never held back by it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Pacer:
    """One unit of bulk work at a time, each on a fresh turn of the event loop."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.turns = 0
        """Units run so far."""

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """``async with pacer.turn(): unit()`` — the unit runs alone, after the loop has polled
        its sockets and run what became ready meanwhile. Keep units to a millisecond or two,
        and never await inside one."""
        async with self._lock:
            await asyncio.sleep(0)  # to the back of the loop's queue: what is ready goes first
            self.turns += 1
            yield
