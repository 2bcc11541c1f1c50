"""Bounded intake: the gateway never takes more feed work than its log commits in a latency
budget.

Feed work that cannot be committed soon only queues: it delays every commit behind it (an
emergency stop's included) and is acknowledged late anyway. So before a feed frame is turned
into work, `Intake.admit` compares what waits for the log (`LogReads.backlog`) with what
the log commits in ``budget_ms`` (`LogReads.commit_rate`); past it the frame is answered
``busy`` with ``retryAfterMs`` and nothing is taken. Each feed connection may hold at most
its share of the budget, so one flooding connection cannot crowd the others out. The control
lane is never refused here.
"""

from __future__ import annotations

from typing import Final

from store.port import LogReads

BUDGET_MS: Final = 50
"""Default latency budget: uncommitted work is kept to what the log commits in this long."""
FLOOR_EVENTS: Final = 200
"""The budget never falls below this many events (before the commit rate is known, say). A
frame is admitted whole while the backlog is under the budget, however big it is."""
MIN_RETRY_MS: Final = 5
MAX_RETRY_MS: Final = 1_000


class Intake:
    """Admission of feed frames against the log's commit rate, fairly per connection."""

    def __init__(self, store: LogReads, budget_ms: int = BUDGET_MS,
                 floor_events: int = FLOOR_EVENTS) -> None:
        if budget_ms < 1:
            raise ValueError(f"budget_ms must be >= 1: {budget_ms}")
        self.store = store
        self.budget_ms = budget_ms
        self.floor_events = floor_events
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

    def admit(self, holder: object) -> int | None:
        """None if a frame of ``holder`` (a connection) may be taken now; else the
        milliseconds after which to try again."""
        budget = self.budget()
        backlog = self.store.backlog
        holders = len(self._holders) + (holder not in self._holders)
        share = budget // holders
        held = self._holders.get(holder, 0)
        if backlog < budget and held < share:
            return None
        self.refused += 1
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
        if left > 0:
            self._holders[holder] = left
        else:
            self._holders.pop(holder, None)
