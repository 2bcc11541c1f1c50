"""Bulk work takes turns, so that whatever else is ready never waits behind much of it.

An event loop runs every ready callback in arrival order, and polls its sockets only between
rounds: under a flood, an emergency stop's frame is not even read until everything queued
before it has run. A `Pacer` keeps the feed's work (validating a frame, deciding its
requests, answering it) to one short burst per turn of the loop, with a poll of the sockets
before each: a unit of work starts a burst on a fresh turn, and the units that start within
`BURST_S` of it run on in the same turn (a feed of one request per frame: many small units,
each would otherwise cost a turn of the loop of its own). A control frame, a commit's ack or
a run's result waits for at most a burst and one unit. Work that does not take a turn (the
control lane) is never held back by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

BURST_S = 0.0005
"""How long after a burst of bulk work began on a fresh turn of the loop another unit may
still start in the same turn (measured, `bench.ws_ingest` at one request per frame: 1.12x and
1.16x the frames a second against a turn for every unit, alternated runs)."""


class Pacer:
    """One unit of bulk work at a time, in bursts of at most `BURST_S` each on a fresh turn of
    the event loop (``burst_s`` 0: every unit on a turn of its own)."""

    def __init__(self, burst_s: float = BURST_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.burst_s = burst_s
        self._clock = clock
        self._burst: float | None = None
        """When the burst under way began (None: none is)."""
        self._lock = asyncio.Lock()
        self.turns = 0
        """Units run so far."""
        self._urgent = 0
        self._clear = asyncio.Event()
        self._clear.set()

    def turn(self) -> _Turn:
        """``async with pacer.turn(): unit()`` — the unit runs alone, after the loop has polled
        its sockets and run what became ready meanwhile (unless it starts within ``burst_s``
        of the burst it joins), and not while urgent work is under way (`urgent`). Keep units
        to a millisecond or two, and never await inside one."""
        return _Turn(self)

    async def _begin(self) -> None:
        """The start of a `turn` (its lock held): on a fresh turn of the loop, unless it joins
        the burst under way."""
        burst = self._burst
        if burst is None or not self._clear.is_set() or self._clock() - burst >= self.burst_s:
            await asyncio.sleep(0)  # to the back of the loop's queue: what is ready first
            while not self._clear.is_set():
                await self._clear.wait()
            self._burst = self._clock()
            asyncio.get_running_loop().call_soon(self._end_burst)
        self.turns += 1

    def _end_burst(self) -> None:
        """The turn the burst began on is over: the next unit starts on a fresh one."""
        self._burst = None

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


class _Turn:
    """`Pacer.turn` as a plain async context manager (a generator-based one cost 3.2 us a
    unit against 1.0: a feed of one request per frame takes a turn per frame)."""

    __slots__ = ("_pacer",)

    def __init__(self, pacer: Pacer) -> None:
        self._pacer = pacer

    async def __aenter__(self) -> None:
        pacer = self._pacer
        await pacer._lock.acquire()
        try:
            await pacer._begin()
        except BaseException:  # (cancelled while it waited: the next unit may go)
            pacer._lock.release()
            raise

    async def __aexit__(self, *_exc: object) -> None:
        self._pacer._lock.release()
