"""The group-commit writer shared by every adapter.

An adapter subclasses :class:`GroupCommitStore` and supplies storage: ``_start``/``_stop``,
a write transaction (:class:`WriteTransaction`) and the four reads. Everything about ordering,
batching, version checks, idempotency and followers lives here and beside it, once: the pure
planning of a batch in `store.batch`, the followers' fan-out in `store.followers`, the
shared state and hooks in `store.writer_core`, the writer task in `store.committer`,
imports and snapshots in `store.restore`, leases in `store.leasing`.

How a batch is written:

1. ``append``/``append_many`` validate and enqueue synchronously; the single writer task
   takes everything queued, up to ``max_batch`` events (an append is never split).
2. Streams missing from the version cache are loaded with one query.
3. Appends are planned in order against the cache (later appends to a stream see the versions
   earlier ones in the batch produce). An append whose expected version is wrong, or whose
   ids were already written earlier in the batch, is set aside and decided after one look-up of
   its ids: all recorded in the same stream means an idempotent retry (resolves to the
   originals), some means :class:`DuplicateEventError`, none means :class:`ConcurrencyError`.
4. The rest is inserted with one executemany and committed. If the insert hits a unique key
   (an id already stored), the transaction is rolled back and the batch is planned again with
   every id looked up first, so one bad append never fails the others.
5. Only after the commit returned are the caches advanced, the futures resolved and the events
   handed to followers. Any other failure fails the whole batch with :class:`WriteFailed` and
   leaves the caches as they were; the writer goes on with later appends.

Imports (`GroupCommitStore.restore`) and snapshot writes take the same write lock as a batch,
so they never interleave with one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Final, Self

from .batch import Pending, check_append, repeated_id
from .committer import BatchWriter
from .leasing import FORGET_MEMBER_MS, LeaseWriter
from .port import Append, RecordedEvent, StoreClosedError, StoreError
from .restore import RestoreWriter
from .writer_core import (
    DEFAULT_FOLLOWER_BUFFER,
    DEFAULT_MAX_BATCH,
    RATE_HORIZON_S,
    Clock,
    KeyConflict,
    WriterCore,
    WriteTransaction,
    _State,
    check_limit,
    wall_clock_ms,
)

__all__ = [
    "DEFAULT_FOLLOWER_BUFFER",
    "DEFAULT_MAX_BATCH",
    "FOLLOW_PAGE",
    "FORGET_MEMBER_MS",
    "RATE_HORIZON_S",
    "Clock",
    "GroupCommitStore",
    "KeyConflict",
    "WriteTransaction",
    "WriterCore",
    "check_limit",
    "wall_clock_ms",
]

FOLLOW_PAGE: Final = 2000
"""Events per read while a follower catches up."""


class GroupCommitStore(BatchWriter, RestoreWriter, LeaseWriter):
    """An :class:`~store.port.EventStore` with one writer task that group-commits.

    Subclasses provide storage; see the module docstring for how a batch is written.
    """

    # ----------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Prepare the store (migrations, caches) and start its writer."""
        if self._state is not _State.NEW:
            raise StoreError(f"the store cannot be opened: it is {self._state.value}")
        loop = asyncio.get_running_loop()
        self._position = await self._start()
        self._loop = loop
        try:
            await self._begin_writer()
        except BaseException:
            self._state = _State.CLOSED
            await self._stop()
            raise

    async def _begin_writer(self) -> None:
        """Open the write side, then start the writer."""
        self._wakeup = asyncio.Event()
        self._write_lock = asyncio.Lock()
        await self._start_writer()
        self._state = _State.OPEN
        self._writer = asyncio.get_running_loop().create_task(
            self._run_writer(), name=f"{type(self).__name__} writer")

    async def close(self) -> None:
        """Finish the commit in flight and every append already enqueued, then stop.

        Appends made after ``close()`` was called fail with :class:`StoreClosedError`.
        Followers end once they yielded everything committed. Calling it again is harmless.
        """
        if self._shutdown is None:
            if self._state is _State.NEW:
                self._state = _State.CLOSED
                return
            self._state = _State.CLOSING
            self._wake()
            self._shutdown = asyncio.ensure_future(self._finish())
        await asyncio.shield(self._shutdown)

    async def _finish(self) -> None:
        try:
            await self._end_writer()
        finally:
            self._state = _State.CLOSED
            self._followers.wake()
            await self._stop()

    async def _end_writer(self) -> None:
        """Let the writer drain, then close the write side."""
        try:
            if self._writer is not None:
                await self._writer
        finally:
            await self._stop_writer()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- appends

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        """Enqueue one atomic append; the future resolves after its commit.

        Raises ``ValueError`` at once for a malformed append (no events, empty or too long
        names, negative expected version). Cancelling the future before the writer took the
        append withdraws it; after that, it is written regardless.
        """
        loop = self._loop
        if self._state is not _State.OPEN or loop is None:
            return self._closed_futures(1)[0]
        events = check_append(append)
        future: asyncio.Future[list[RecordedEvent]] = loop.create_future()
        if len(events) > 1 and len({event.event_id for event in events}) != len(events):
            future.set_exception(repeated_id(append))
            return future
        self._queue.append(Pending(append, events, future))
        self._queued_events += len(events)
        self._urgent += append.urgent
        self._wake()
        return future

    def append_many(self, appends: Sequence[Append]) -> list[asyncio.Future[list[RecordedEvent]]]:
        """Enqueue several appends in order; each succeeds or fails on its own.

        If any append is malformed, ``ValueError`` is raised and none is enqueued.
        """
        return self._enqueue(appends)

    def _closed_futures(self, count: int) -> list[asyncio.Future[list[RecordedEvent]]]:
        loop = asyncio.get_running_loop()
        failed: list[asyncio.Future[list[RecordedEvent]]] = []
        for _ in range(count):
            future: asyncio.Future[list[RecordedEvent]] = loop.create_future()
            future.set_exception(StoreClosedError(f"the store is {self._state.value}"))
            failed.append(future)
        return failed

    def _enqueue(self, appends: Sequence[Append]) -> list[asyncio.Future[list[RecordedEvent]]]:
        loop = self._loop
        if self._state is not _State.OPEN or loop is None:
            return self._closed_futures(len(appends))
        checked = [check_append(append) for append in appends]
        futures: list[asyncio.Future[list[RecordedEvent]]] = []
        taken: list[Pending] = []
        queued = urgent = 0
        for append, events in zip(appends, checked, strict=True):
            future = loop.create_future()
            if len(events) > 1 and len({event.event_id for event in events}) != len(events):
                future.set_exception(repeated_id(append))
            else:
                taken.append(Pending(append, events, future))
                queued += len(events)
                urgent += append.urgent
            futures.append(future)
        self._queue.extend(taken)
        self._queued_events += queued
        self._urgent += urgent
        self._wake()
        return futures

    async def follow(self, after: int = 0) -> AsyncGenerator[RecordedEvent, None]:
        """Every committed event after ``after``, then each new one as it commits.

        No gaps and no duplicates. Live commits are buffered up to ``follower_buffer`` events;
        past that the follower drops its buffer and catches up by reading. The iterator ends
        once the store is closed and everything committed was yielded. Close it (``aclose()``
        or ``contextlib.aclosing``) when stopping early.
        """
        async with aclosing(self.follow_batches(after)) as batches:
            async for batch in batches:
                for record in batch:
                    yield record

    def follow_batches(
        self, after: int = 0, limit: int = FOLLOW_PAGE
    ) -> AsyncGenerator[list[RecordedEvent], None]:
        """`follow` in lists: each one holds every event ready when it is taken (at least
        one, at most ``limit``), in position order, continuing the one before it."""
        return self._followers.follow_batches(after, limit)
