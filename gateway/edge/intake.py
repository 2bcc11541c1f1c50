"""Bounded intake: the gateway never takes more feed work than its log commits in a latency
budget.

Feed work that cannot be committed soon only queues: it delays every commit behind it (an
emergency stop's included) and is acknowledged late anyway. So before a feed frame is turned
into work, `Intake.check` compares what waits for the log (`LogReads.backlog`) with what
the log commits in ``budget_ms`` (`LogReads.commit_rate`); past it the frame waits, unread
further, for the log to catch up (`Intake.room`, at most ``hold_ms``): the connection is not
read meanwhile, so TCP pushes back on the sender, and a flood costs the gateway nothing per
frame it cannot take yet (answering each ``busy`` cost it more than taking it). A frame that
still finds no room is answered ``busy`` with ``retryAfterMs`` and nothing is taken. Each
feed connection may hold at most its share of the budget, so one flooding connection cannot
crowd the others out. The control lane is never refused here.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from gateway.base.clock import Clock, SystemClock, timeout
from store.port import LogReads

BUDGET_MS: Final = 50
"""Default latency budget: uncommitted work is kept to what the log commits in this long."""
FLOOR_EVENTS: Final = 200
"""The budget never falls below this many events (before the commit rate is known, say). A
frame is admitted whole while the backlog is under the budget, however big it is."""
MIN_RETRY_MS: Final = 5
MAX_RETRY_MS: Final = 1_000
HOLD_MS: Final = 1_000
"""Default longest wait of a feed frame for room before it is answered ``busy``."""


class Intake:
    """Admission of feed frames against the log's commit rate, fairly per connection."""

    def __init__(self, store: LogReads, budget_ms: int = BUDGET_MS,
                 floor_events: int = FLOOR_EVENTS, hold_ms: int = HOLD_MS,
                 clock: Clock | None = None) -> None:
        if budget_ms < 1:
            raise ValueError(f"budget_ms must be >= 1: {budget_ms}")
        if hold_ms < 0:
            raise ValueError(f"hold_ms must be >= 0: {hold_ms}")
        self.store = store
        self.budget_ms = budget_ms
        self.floor_events = floor_events
        self.hold_ms = hold_ms
        self.clock: Clock = clock or SystemClock()
        """Whose time the hold counts."""
        self._changed = asyncio.Event()
        """Set when work of a connection settled: a held frame looks again."""
        self._holders: dict[object, int] = {}
        """Events each feed connection has waiting for their commit (those with some)."""
        self.refused = 0
        """Frames answered busy so far."""

    def budget(self) -> int:
        """The events the log commits in the budget, at its recent rate (at least the
        floor)."""
        rate = self.store.commit_rate
        if rate is None:
            return self.floor_events
        return max(self.floor_events, int(rate * self.budget_ms / 1000))

    async def room(self, holder: object) -> int | None:
        """`check`, except that a frame with no room waits for it, up to ``hold_ms``, while
        the log commits what is ahead of it: None once it may be taken, else (still no room)
        the milliseconds after which to try again (counted as refused)."""
        retry = self.check(holder)
        if retry is None:
            return None
        if not self.hold_ms:
            self.refused += 1
            return retry
        with contextlib.suppress(TimeoutError):
            async with timeout(self.clock, self.hold_ms):
                while True:
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):  # (others' commits: look again)
                        async with timeout(self.clock, retry):
                            await self._changed.wait()
                    retry = self.check(holder)
                    if retry is None:
                        return None
        self.refused += 1
        return retry

    def check(self, holder: object) -> int | None:
        """None if a frame of ``holder`` (a connection) may be taken now; else the
        milliseconds after which to try again (not counted as refused)."""
        budget = self.budget()
        backlog = self.store.backlog
        holders = len(self._holders) + (holder not in self._holders)
        share = budget // holders
        held = self._holders.get(holder, 0)
        if backlog < budget and held < share:
            return None
        rate = self.store.commit_rate or budget * 1000 / self.budget_ms
        wait_ms = (max(backlog - budget, held - share, 0) + budget / 2) * 1000 / rate
        return int(min(MAX_RETRY_MS, max(MIN_RETRY_MS, wait_ms)))

    def took(self, holder: object, events: int) -> None:
        """``holder`` has ``events`` more waiting for their commit."""
        if events:
            self._holders[holder] = self._holders.get(holder, 0) + events

    def settled(self, holder: object, events: int) -> None:
        """``events`` of ``holder`` were committed (or refused)."""
        left = self._holders.get(holder, 0) - events
        self._changed.set()
        if left > 0:
            self._holders[holder] = left
        else:
            self._holders.pop(holder, None)
