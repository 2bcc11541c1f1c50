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
from collections.abc import AsyncIterator, Iterator


class Pacer:
    """One unit of bulk work at a time, each on a fresh turn of the event loop."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.turns = 0
        """Units run so far."""
        self._urgent = 0
        self._clear = asyncio.Event()
        self._clear.set()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """``async with pacer.turn(): unit()`` — the unit runs alone, after the loop has polled
        its sockets and run what became ready meanwhile, and not while urgent work is under
        way (`urgent`). Keep units to a millisecond or two, and never await inside one."""
        async with self._lock:
            await asyncio.sleep(0)  # to the back of the loop's queue: what is ready goes first
            while not self._clear.is_set():
                await self._clear.wait()
            self.turns += 1
            yield

    def hold(self) -> None:
        """No unit of bulk work starts until as many `release` calls: urgent work (an
        emergency stop from its decision to its ack) is under way. Every turn of the loop
        meanwhile is short, so the few turns the urgent work takes (its commit answered, its
        ack sent) come one after the other instead of each behind a unit of the flood."""
        self._urgent += 1
        self._clear.clear()

    def release(self) -> None:
        """The end of one `hold`."""
        self._urgent -= 1
        if not self._urgent:
            self._clear.set()

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """`hold` for the block."""
        self.hold()
        try:
            yield
        finally:
            self.release()
