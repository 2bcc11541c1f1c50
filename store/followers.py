"""Followers: every committed event handed out in order, live from a bounded buffer, or read
back from the log when a follower fell behind (see `Followers.follow_batches`)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable

from .port import RecordedEvent

Read = Callable[[int, int], Awaitable[list[RecordedEvent]]]
"""Read up to ``limit`` events after a position, in position order."""


class Follower:
    """A follower's bounded buffer; ``lagging`` means it must catch up by reading."""

    __slots__ = ("bound", "buffer", "lagging", "wakeup")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.buffer: deque[RecordedEvent] = deque()
        self.lagging = True  # a new follower starts by reading the backlog
        self.wakeup = asyncio.Event()


class Followers:
    """The followers of one store: fed what commits (`publish`), woken when it closes."""

    def __init__(self, buffer: int, read: Read, closed: Callable[[], bool]) -> None:
        self.buffer = buffer
        """How many live events a follower holds before it falls back to reading."""
        self._read = read
        self._closed = closed
        """Whether the store closed: followers end once they yielded all it committed."""
        self._followers: set[Follower] = set()

    def __bool__(self) -> bool:
        return bool(self._followers)

    def publish(self, rows: list[RecordedEvent]) -> None:
        """Hand committed ``rows`` (in position order) to every follower."""
        count = len(rows)
        for follower in self._followers:
            if follower.lagging:
                continue
            if len(follower.buffer) + count > follower.bound:
                follower.lagging = True
                follower.buffer.clear()
            else:
                follower.buffer.extend(rows)
            follower.wakeup.set()

    def fall_behind(self) -> None:
        """Make every follower catch up by reading (what was handed out may have gaps)."""
        for follower in self._followers:
            follower.lagging = True
            follower.wakeup.set()

    def wake(self) -> None:
        """Wake every follower (the store closed: they end)."""
        for follower in self._followers:
            follower.wakeup.set()

    async def follow_batches(
        self, after: int, limit: int
    ) -> AsyncGenerator[list[RecordedEvent], None]:
        """Every committed event after ``after``, in lists of at most ``limit`` (see
        `store.writer.GroupCommitStore.follow_batches`)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        follower = Follower(self.buffer)
        # Subscribe before reading the backlog: what commits meanwhile is buffered or read.
        self._followers.add(follower)
        last = after
        try:
            while True:
                if follower.lagging:
                    follower.lagging = False
                    follower.buffer.clear()
                    while True:
                        page = await self._read(last, limit)
                        fresh = [record for record in page if record.position > last]
                        if fresh:
                            last = fresh[-1].position
                            yield fresh
                        if len(page) < limit:
                            break
                    continue
                buffer = follower.buffer
                if buffer:
                    batch: list[RecordedEvent] = []
                    while buffer and len(batch) < limit:
                        record = buffer[0]
                        if record.position != last + 1:
                            if record.position <= last:
                                buffer.popleft()
                                continue
                            # A gap: a batch reported failed reached the log all the same
                            # and was never handed out; read it from the log.
                            follower.lagging = True
                            break
                        buffer.popleft()
                        batch.append(record)
                        last = record.position
                    if batch:
                        yield batch
                    continue
                if self._closed():
                    return
                follower.wakeup.clear()
                await follower.wakeup.wait()
        finally:
            self._followers.discard(follower)
