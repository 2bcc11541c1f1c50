"""Clocks: the system clock in production, a fake one that tests advance by hand."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from gateway.base.tasks import start


class Timer(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None:
        """Do not run the callback (no-op if it already ran)."""


class Clock(Protocol):
    """Where the runtime reads time and schedules timers; `lanes` never reads it."""

    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""

    def monotonic_ms(self) -> int:
        """Milliseconds from some fixed point, never going back (for elapsed time: the wall
        clock may be stepped)."""

    def call_at(self, when_ms: int, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once the clock reaches ``when_ms``."""

    async def sleep(self, ms: float) -> None:
        """Wait ``ms`` milliseconds of this clock's time."""


async def sleep_or(clock: Clock, ms: float, event: asyncio.Event) -> bool:
    """Wait ``ms`` of ``clock``'s time or until ``event`` is set, whichever comes first:
    whether ``event`` is set. A cancellation while it waits goes on up, the waits ended."""
    if event.is_set():
        return True
    sleeping = start(clock.sleep(ms), "sleep")
    waking = start(event.wait(), "wake")
    try:
        await asyncio.wait([sleeping, waking], return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeping.cancel()
        waking.cancel()
        await asyncio.gather(sleeping, waking, return_exceptions=True)
    return event.is_set()


@contextlib.asynccontextmanager
async def timeout(clock: Clock, ms: float) -> AsyncIterator[None]:
    """`asyncio.timeout` in ``clock``'s time: the block is cancelled and `TimeoutError`
    raised once ``ms`` of it passed (a test's `FakeClock` decides when)."""
    async with asyncio.timeout(None) as limit:
        loop = asyncio.get_running_loop()
        timer = clock.call_at(clock.now_ms() + math.ceil(ms),
                              lambda: limit.reschedule(loop.time()))
        try:
            yield
        finally:
            timer.cancel()


class SystemClock:
    """Wall-clock time with timers on the running event loop."""

    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        """The system's monotonic clock, in milliseconds."""
        return time.monotonic_ns() // 1_000_000

    def call_at(self, when_ms: int, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the loop when wall time reaches ``when_ms``."""
        delay = max(0.0, (when_ms - self.now_ms()) / 1000)
        return asyncio.get_running_loop().call_later(delay, callback)

    async def sleep(self, ms: float) -> None:
        """Sleep on the event loop."""
        await asyncio.sleep(ms / 1000)


class _FakeTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that moves only when `advance` is called; timers fire in time order."""

    def __init__(self, start_ms: int = 1_771_297_800_000) -> None:
        self._now = start_ms
        self._timers: list[tuple[int, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        """The fake time."""
        return self._now

    def monotonic_ms(self) -> int:
        """The fake time (it never goes back)."""
        return self._now

    def call_at(self, when_ms: int, callback: Callable[[], None]) -> Timer:
        """Schedule ``callback`` for fake time ``when_ms``."""
        timer = _FakeTimer(callback)
        heapq.heappush(self._timers, (when_ms, next(self._seq), timer))
        return timer

    async def sleep(self, ms: float) -> None:
        """Wait until the fake time has been advanced by ``ms``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self.call_at(self._now + int(ms), wake)
        await future

    def advance(self, ms: int) -> None:
        """Move time forward, running each due timer at its own time, in order."""
        target = self._now + ms
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            if not timer.cancelled:
                timer.callback()
        self._now = target
