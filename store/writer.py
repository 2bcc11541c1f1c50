"""The group-commit writer shared by every adapter.

An adapter subclasses :class:`GroupCommitStore` and supplies storage: ``_start``/``_stop``,
a write transaction (:class:`WriteTransaction`) and the four reads. Everything about ordering,
batching, version checks, idempotency and followers lives here and beside it, once: the pure
planning of a batch in `store.batch`, the followers' fan-out in `store.followers`.

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
import contextlib
import enum
import math
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any, ClassVar, Final, Protocol, Self, TypeVar

from .batch import (
    LeaseRow,
    Outcome,
    Pending,
    Plan,
    check_append,
    check_record,
    fence_failures,
    fences_of,
    lease_resources,
    plan_batch,
    repeated_id,
    settle_deferred,
    unseen_ids,
)
from .followers import Followers
from .port import (
    MEMBER_PREFIX,
    Append,
    DuplicateEventError,
    Fence,
    FencedError,
    LeaseLost,
    LeaseView,
    RecordedEvent,
    RestoreError,
    Snapshot,
    SnapshotInfo,
    StoreClosedError,
    StoreError,
    WriteFailed,
)
from .schema import FINGERPRINT_MAX, MEMBER_MAX, STREAM_MAX

T = TypeVar("T")

DEFAULT_MAX_BATCH: Final = 2000
"""Most events the writer puts in one transaction (a bigger single append still goes whole)."""

DEFAULT_FOLLOWER_BUFFER: Final = 10_000
"""Most events buffered for one follower before it is switched to catching up by reading."""

FORGET_MEMBER_MS: Final = 3_600_000
"""A member whose lease expired this long ago and that holds nothing is deleted (by the
next member to join)."""

RATE_HORIZON_S: Final = 1.0
"""The busy time over which `GroupCommitStore.commit_rate` is averaged."""

FOLLOW_PAGE: Final = 2000
"""Events per read while a follower catches up."""

Clock = Callable[[], int]
"""Milliseconds since the Unix epoch."""


def wall_clock_ms() -> int:
    """The wall clock in milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


class KeyConflict(Exception):
    """An insert hit a unique key (an event id or a stream version) that is already stored."""


class WriteTransaction(Protocol):
    """What the writer needs from an adapter inside one write transaction."""

    async def last_position(self) -> int:
        """The position of the last committed event (0 when empty)."""
        ...

    async def load_versions(self, streams: Sequence[str]) -> dict[str, int]:
        """Current versions of those of ``streams`` that exist (one query)."""
        ...

    async def find_events(self, event_ids: Sequence[str]) -> dict[str, RecordedEvent]:
        """The recorded events among ``event_ids``, by id."""
        ...

    async def insert(self, events: Sequence[RecordedEvent]) -> None:
        """Insert all rows at once; raise :class:`KeyConflict` on a unique-key violation
        (here, or at the commit: an adapter may send the rows with the commit)."""
        ...

    async def put_snapshot(self, snapshot: Snapshot, keep: int) -> None:
        """Store ``snapshot`` (replacing one at its position); keep the ``keep`` newest."""
        ...

    async def delete_snapshots(self, positions: Sequence[int] | None) -> int:
        """Delete the snapshots at ``positions`` (None: every one); how many there were."""
        ...

    async def lease_rows(self, resources: Sequence[str] | None, lock: bool = False
                         ) -> tuple[int, dict[str, LeaseRow]]:
        """The store's clock now (ms; the database's where several processes share it) and
        the lease rows of ``resources`` that exist (None: every row), by resource; with
        ``lock``, those rows cannot change hands until this transaction ends."""
        ...

    async def swap_lease(self, old: LeaseRow | None, new: LeaseRow) -> bool:
        """Put ``new`` in place of ``old`` if the row is still exactly ``old`` (None: if
        there is no row of that resource yet); whether it was."""
        ...

    async def delete_leases(self, resources: Sequence[str]) -> None:
        """Delete the lease rows of ``resources``."""
        ...


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


def _fail_left(inflight: Sequence[Pending], queued: Sequence[Pending]) -> None:
    """Fail the appends a stopping writer leaves: those in flight may be recorded or not,
    the queued ones were not written."""
    for pending in inflight:
        if not pending.future.done():
            pending.future.set_exception(StoreError(
                "the writer stopped mid-commit; the append may or may not be recorded"))
    for pending in queued:
        if not pending.future.done():
            pending.future.set_exception(
                StoreClosedError("the writer stopped before this append was written"))


def check_limit(limit: int | None) -> None:
    """Reject a negative read limit."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None: {limit}")


def _check_member(member: str, ttl_ms: int) -> None:
    if not member or len(member) > MEMBER_MAX - len(MEMBER_PREFIX):
        raise ValueError(f"a member id has 1 to {MEMBER_MAX - len(MEMBER_PREFIX)} "
                         f"characters: {member!r}")
    if ttl_ms < 0:
        raise ValueError(f"a lease lasts at least 0 ms (0: it expires at once): {ttl_ms}")


def _alive(now: int, rows: dict[str, LeaseRow]) -> dict[str, int]:
    """The live members in lease ``rows`` at ``now``, with when their lease expires."""
    return {row.resource[len(MEMBER_PREFIX):]: row.expires_at for row in rows.values()
            if row.resource.startswith(MEMBER_PREFIX) and row.expires_at > now}


def _view(now: int, rows: dict[str, LeaseRow]) -> LeaseView:
    alive = _alive(now, rows)
    holders = {row.resource: Fence(row.owner, row.epoch) for row in rows.values()
               if row.owner is not None and row.owner in alive
               and not row.resource.startswith(MEMBER_PREFIX)}
    return LeaseView(now, alive, holders)


class GroupCommitStore(ABC):
    """An :class:`~store.port.EventStore` with one writer task that group-commits.

    Subclasses provide storage; see the module docstring for how a batch is written.
    """

    _writer_thread: ClassVar[bool] = False
    """Whether the writer runs on a thread of its own, with its own event loop, rather than
    as a task of the loop that opened the store. An adapter whose commits take real time
    (a database file) then commits at its own pace however busy that loop is, and an urgent
    append waits for at most the commit in flight. Its write side is opened on that loop
    (`_start_writer`); futures are resolved, and followers fed, on the caller's loop."""

    _shares_log: ClassVar[bool] = False
    """Whether other processes may write the same log. Such a store (PostgreSQL) never trusts
    its caches: every write reads its streams' versions and the last position again inside
    its transaction, which the adapter serialises with the other writers by a lock."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1: {max_batch}")
        if follower_buffer < 1:
            raise ValueError(f"follower_buffer must be >= 1: {follower_buffer}")
        self._clock: Clock = clock if clock is not None else wall_clock_ms
        self._max_batch = max_batch
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop that opened the store: appends come from it, futures resolve on it."""
        self._writer_loop: asyncio.AbstractEventLoop | None = None
        """The loop the writer runs on (the same one, or its thread's)."""
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        """Guards the queue and its counters (appended to by the caller, taken by the
        writer, which may be on another thread)."""
        self._queue: deque[Pending] = deque()
        self._queued_events = 0
        self._urgent = 0
        """Urgent appends in the queue: the next batch is theirs (see `_take_urgent`)."""
        self._sleeping = False
        """The writer waits for `_wakeup` (set it, from the writer's loop, to go on)."""
        self._wakeup: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._shutdown: asyncio.Task[None] | None = None
        self._inflight: list[Pending] = []
        self._followers = Followers(follower_buffer, self.read,
                                    lambda: self._state is _State.CLOSED)
        # Writer-owned caches; advanced only after a commit returned.
        self._versions: dict[str, int] = {}
        self._position = 0
        self._write_lock: asyncio.Lock | None = None
        """Held by each batch commit, import and snapshot write: one write at a time (on the
        writer's loop)."""
        self._stale = False
        """A write failed: the caches are read again before the next one (see `_resync`)."""
        self._inflight_events = 0
        self._rate_events = 0.0
        self._rate_seconds = 0.0
        """Events committed and seconds the writer was busy, both decayed over about
        `RATE_HORIZON_S`: their ratio is the commit rate."""

    @property
    def max_batch(self) -> int:
        """The most events one commit takes."""
        return self._max_batch

    @property
    def url(self) -> str | None:
        """Where another process can open this log (None: nowhere, as in memory)."""
        return None

    @property
    def backlog(self) -> int:
        """Events appended and not committed yet (queued, and in the commit in flight)."""
        return self._queued_events + self._inflight_events

    @property
    def commit_rate(self) -> float | None:
        """Events committed per second while the writer was kept busy (from one commit to
        the next with appends waiting), over the last second or so of that (None before the
        first commit): what the log takes when it is kept busy."""
        if self._rate_seconds <= 0:
            return None
        return self._rate_events / self._rate_seconds

    def _measure(self, events: int, seconds: float) -> None:
        decay = math.exp(-seconds / RATE_HORIZON_S)
        self._rate_events = self._rate_events * decay + events
        self._rate_seconds = self._rate_seconds * decay + seconds

    # ----------------------------------------------------------------- adapter hooks

    @abstractmethod
    async def _start(self) -> int:
        """Prepare storage (migrations, connections); return the last committed position."""

    @abstractmethod
    async def _stop(self) -> None:
        """Release storage; called once, after the writer drained."""

    async def _start_writer(self) -> None:
        """Open what the writer writes with, on the writer's loop (after `_start`)."""
        return None

    async def _stop_writer(self) -> None:
        """Close what `_start_writer` opened, on the writer's loop, once the writer ended."""
        return None

    @abstractmethod
    def _transaction(self) -> AbstractAsyncContextManager[WriteTransaction]:
        """A write transaction: commits when the block exits cleanly, else rolls back."""

    def _describe(self, exc: BaseException) -> str:
        """A short, SQL-free account of why a batch failed, for :class:`StoreError`."""
        return str(exc) or type(exc).__name__

    @abstractmethod
    async def read(self, after: int = 0, limit: int | None = None) -> list[RecordedEvent]:
        """Events with position > ``after`` in position order, at most ``limit``."""

    @abstractmethod
    async def read_stream(
        self, stream: str, after_version: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """One stream's events with version > ``after_version`` in version order."""

    @abstractmethod
    async def last_position(self) -> int:
        """The position of the last committed event (0 when empty)."""

    @abstractmethod
    async def stream_versions(self) -> dict[str, int]:
        """Every stream with its current version."""

    @abstractmethod
    async def snapshots(self) -> list[SnapshotInfo]:
        """Every stored snapshot, newest (highest position) first."""

    @abstractmethod
    async def read_snapshot(self, position: int) -> Snapshot | None:
        """The snapshot at ``position``, if there is one."""

    # ----------------------------------------------------------------- lifecycle

    @property
    def is_open(self) -> bool:
        """Whether the store takes appends."""
        return self._state is _State.OPEN

    async def open(self) -> None:
        """Prepare the store (migrations, caches) and start its writer."""
        if self._state is not _State.NEW:
            raise StoreError(f"the store cannot be opened: it is {self._state.value}")
        loop = asyncio.get_running_loop()
        self._position = await self._start()
        self._loop = loop
        if not self._writer_thread:
            self._writer_loop = loop
            await self._begin_writer()
            return
        writer_loop = asyncio.new_event_loop()
        thread = threading.Thread(target=writer_loop.run_forever, daemon=True,
                                  name=f"{type(self).__name__} writer")
        thread.start()
        self._writer_loop, self._thread = writer_loop, thread
        try:
            await self._on_writer(self._begin_writer())
        except BaseException:
            self._state = _State.CLOSED
            await self._end_thread()
            await self._stop()
            raise

    async def _begin_writer(self) -> None:
        """On the writer's loop: open the write side, then start the writer."""
        self._wakeup = asyncio.Event()
        self._write_lock = asyncio.Lock()
        await self._start_writer()
        self._state = _State.OPEN
        self._writer = asyncio.get_running_loop().create_task(
            self._run_writer(), name=f"{type(self).__name__} writer")

    async def _on_writer(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the writer's loop and wait for it here."""
        if self._thread is None:
            return await coro
        assert self._writer_loop is not None
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(coro, self._writer_loop))

    def _deliver(self, fn: Callable[..., None], *args: Any) -> None:
        """From the writer: call ``fn`` on the caller's loop (where the futures are)."""
        if self._thread is None:
            fn(*args)
            return
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
            self._loop.call_soon_threadsafe(fn, *args)

    def _wake(self) -> None:
        """Let a sleeping writer go on (call with ``_lock`` held)."""
        if not self._sleeping:
            return
        self._sleeping = False
        wakeup = self._wakeup
        assert wakeup is not None and self._writer_loop is not None
        if self._thread is None:
            wakeup.set()
        else:
            self._writer_loop.call_soon_threadsafe(wakeup.set)

    async def _end_thread(self) -> None:
        """Stop the writer's thread and its loop (if it has one)."""
        thread, writer_loop = self._thread, self._writer_loop
        if thread is None or writer_loop is None:
            return
        writer_loop.call_soon_threadsafe(writer_loop.stop)
        await asyncio.to_thread(thread.join)
        writer_loop.close()

    async def close(self) -> None:
        """Finish the commit in flight and every append already enqueued, then stop.

        Appends made after ``close()`` was called fail with :class:`StoreClosedError`.
        Followers end once they yielded everything committed. Calling it again is harmless.
        """
        if self._shutdown is None:
            if self._state is _State.NEW:
                self._state = _State.CLOSED
                return
            with self._lock:
                self._state = _State.CLOSING
                self._wake()
            self._shutdown = asyncio.ensure_future(self._finish())
        await asyncio.shield(self._shutdown)

    async def _finish(self) -> None:
        try:
            await self._on_writer(self._end_writer())
        finally:
            await self._end_thread()
            self._state = _State.CLOSED
            self._followers.wake()
            await self._stop()

    async def _end_writer(self) -> None:
        """On the writer's loop: let the writer drain, then close the write side."""
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
        with self._lock:
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
        with self._lock:
            self._queue.extend(taken)
            self._queued_events += queued
            self._urgent += urgent
            self._wake()
        return futures

    # ----------------------------------------------------------------- imports, snapshots

    def _check_open(self) -> None:
        if self._state is not _State.OPEN:
            raise StoreClosedError(f"the store is {self._state.value}")

    @asynccontextmanager
    async def _writing(self, what: str) -> AsyncIterator[WriteTransaction]:
        """A write transaction whose database failures become `WriteFailed` (what the store
        itself raises, a refused import say, goes through as it is)."""
        try:
            async with self._transaction() as txn:
                yield txn
        except (StoreError, KeyConflict):  # the caller's to put in words (nothing written)
            raise
        except Exception as exc:
            self._stale = True
            raise WriteFailed(what, self._describe(exc)) from exc

    async def _resync(self, txn: WriteTransaction, streams: Iterable[str]) -> None:
        """After a failed write, read the last position again and forget the versions.

        A commit reported as failed may have reached the file all the same (an I/O error
        after the write, say); planning the next batch on the old caches would then collide
        with it on every attempt, for ever. A store that `_shares_log` reads the versions of
        the write's ``streams`` and the last position before every write.
        """
        if self._shares_log:
            wanted = list(dict.fromkeys(streams))
            loaded = await txn.load_versions(wanted) if wanted else {}
            self._position = await txn.last_position()
            self._versions = {stream: loaded.get(stream, 0) for stream in wanted}
            self._stale = False
        elif self._stale:
            self._position = await txn.last_position()
            self._versions.clear()
            self._stale = False

    async def restore(self, records: Sequence[RecordedEvent]) -> None:
        """Write events recorded elsewhere verbatim (an import), in one transaction.

        They must continue this log exactly: positions from the last one + 1 without a gap,
        each stream's versions from its current version + 1, ids not yet used; otherwise
        `RestoreError` (or `DuplicateEventError`) and nothing is written. Followers see them
        as if appended.
        """
        self._check_open()
        rows = list(records)
        if not rows:
            return
        for record in rows:
            check_record(record)
        await self._on_writer(self._restore(rows))
        if self._followers:
            self._publish(rows)

    async def _restore(self, rows: list[RecordedEvent]) -> None:
        assert self._write_lock is not None
        async with self._write_lock:
            self._check_open()
            try:
                await self._restore_in(rows)
            except KeyConflict as exc:  # (an adapter may insert only at the commit)
                raise DuplicateEventError(
                    f"an imported event id is already recorded: {exc}; nothing was written"
                ) from None

    async def _restore_in(self, rows: list[RecordedEvent]) -> None:
        """`_restore`'s transaction (the write lock held)."""
        async with self._writing("the import") as txn:
            streams = sorted({r.stream for r in rows})
            await self._resync(txn, streams)
            position = self._position
            missing = [s for s in streams if s not in self._versions]
            loaded = await txn.load_versions(missing) if missing else {}
            versions = {s: self._versions.get(s, loaded.get(s, 0)) for s in streams}
            for record in rows:
                if record.position != position + 1:
                    raise RestoreError(
                        f"event {record.event_id!r} is at position {record.position}, but "
                        f"the log continues at {position + 1}; import into an empty log "
                        "(or one that ends just before it)"
                    )
                if record.version != versions[record.stream] + 1:
                    raise RestoreError(
                        f"event {record.event_id!r} is version {record.version} of "
                        f"{record.stream!r}, which is at version {versions[record.stream]}"
                    )
                position += 1
                versions[record.stream] += 1
            await txn.insert(rows)
        self._position = position
        self._versions.update(versions)

    async def save_snapshot(self, snapshot: Snapshot, keep: int = 2) -> None:
        """Store a snapshot (replacing one at the same position), then delete all but the
        ``keep`` newest."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1: {keep}")
        if snapshot.position < 0:
            raise ValueError(f"a snapshot position must be >= 0: {snapshot.position}")
        for name in ("fingerprint", "checksum"):
            value = getattr(snapshot, name)
            if not value or len(value) > FINGERPRINT_MAX:
                raise ValueError(f"snapshot {name} must have 1 to {FINGERPRINT_MAX} characters")
        self._check_open()
        await self._on_writer(self._save_snapshot(snapshot, keep))

    async def _save_snapshot(self, snapshot: Snapshot, keep: int) -> None:
        assert self._write_lock is not None
        async with self._write_lock:
            self._check_open()
            async with self._writing("the snapshot") as txn:
                await txn.put_snapshot(snapshot, keep)

    async def delete_snapshots(self, positions: Sequence[int] | None = None) -> int:
        """Delete the snapshots at ``positions`` (default: every one); how many there were."""
        self._check_open()
        return await self._on_writer(self._delete_snapshots(
            None if positions is None else list(positions)))

    async def _delete_snapshots(self, positions: list[int] | None) -> int:
        assert self._write_lock is not None
        async with self._write_lock:
            self._check_open()
            async with self._writing("the deletion of snapshots") as txn:
                return await txn.delete_snapshots(positions)

    # ----------------------------------------------------------------- leases

    async def join(self, member: str, ttl_ms: int) -> LeaseView:
        """Make ``member`` live for ``ttl_ms``; the leases as they are then
        (`store.port.Leases`)."""
        _check_member(member, ttl_ms)

        async def join(txn: WriteTransaction) -> LeaseView:
            now, rows = await txn.lease_rows(None)
            # Members that died long ago and hold nothing any more: forgotten.
            owners = {row.owner for row in rows.values()
                      if not row.resource.startswith(MEMBER_PREFIX)}
            dead = [r for r, row in rows.items() if r.startswith(MEMBER_PREFIX)
                    and row.expires_at + FORGET_MEMBER_MS < now and row.owner not in owners]
            if dead:
                await txn.delete_leases(dead)
                for resource in dead:
                    del rows[resource]
            old = rows.get(MEMBER_PREFIX + member)
            row = LeaseRow(MEMBER_PREFIX + member, member, 0, now + ttl_ms)
            if not await txn.swap_lease(old, row):
                raise LeaseLost(f"member {member} changed while it joined; join again")
            rows[row.resource] = row
            return _view(now, rows)

        return await self._leasing("joining the cluster", join)

    async def renew(self, member: str, ttl_ms: int) -> LeaseView:
        """Keep ``member`` live for another ``ttl_ms`` (`LeaseLost` if its lease expired)."""
        _check_member(member, ttl_ms)

        async def renew(txn: WriteTransaction) -> LeaseView:
            now, rows = await txn.lease_rows(None)
            own = rows.get(MEMBER_PREFIX + member)
            row = None if own is None else own._replace(expires_at=now + ttl_ms)
            if own is None or own.expires_at <= now or row is None \
                    or not await txn.swap_lease(own, row):
                raise LeaseLost(f"the lease of member {member} expired: it may hold nothing "
                                "and write nothing; join again under a new id")
            rows[row.resource] = row
            return _view(now, rows)

        return await self._leasing("renewing a lease", renew)

    async def acquire(self, member: str, resources: Sequence[str]) -> dict[str, int]:
        """Take the free leases of ``resources`` at a new epoch each, keep ``member``'s own;
        every one of them ``member`` holds now, with its epoch (`store.port.Leases`). Each
        one changes hands only if nobody else changed it meanwhile (compare and set: two
        members taking one stream at once get it once)."""
        _check_member(member, 0)
        for resource in resources:
            if not resource or len(resource) > STREAM_MAX or resource.startswith(MEMBER_PREFIX):
                raise ValueError(f"not a stream to lease: {resource!r}")

        async def acquire(txn: WriteTransaction) -> dict[str, int]:
            now, rows = await txn.lease_rows(None)
            alive = _alive(now, rows)
            if member not in alive:
                raise LeaseLost(f"member {member} is not live (its lease expired): it may "
                                "acquire nothing; join again under a new id")
            held: dict[str, int] = {}
            # One order (code points: PostgreSQL's "C" collation, as the commits lock them):
            # no deadlock between two transactions locking the same rows.
            for resource in sorted(set(resources)):
                row = rows.get(resource)
                if row is not None and row.owner == member:
                    held[resource] = row.epoch
                elif row is None or row.owner is None or row.owner not in alive:
                    taken = LeaseRow(resource, member, 1 if row is None else row.epoch + 1, 0)
                    if await txn.swap_lease(row, taken):
                        held[resource] = taken.epoch
            return held

        return await self._leasing("acquiring leases", acquire)

    async def release(self, member: str, resources: Sequence[str]) -> None:
        """Give up the leases of ``resources`` that ``member`` holds."""
        async def release(txn: WriteTransaction) -> None:
            _, rows = await txn.lease_rows(sorted(set(resources)))
            for row in rows.values():
                if row.owner == member:
                    await txn.swap_lease(row, row._replace(owner=None))

        await self._leasing("releasing leases", release)

    async def leave(self, member: str) -> None:
        """Give up every lease of ``member``, its own included."""
        async def leave(txn: WriteTransaction) -> None:
            _, rows = await txn.lease_rows(None)
            for row in sorted(rows.values()):
                if row.owner == member and not row.resource.startswith(MEMBER_PREFIX):
                    await txn.swap_lease(row, row._replace(owner=None))
            await txn.delete_leases([MEMBER_PREFIX + member])

        await self._leasing("leaving the cluster", leave)

    async def leases(self) -> LeaseView:
        """The leases now."""
        async def read(txn: WriteTransaction) -> LeaseView:
            return _view(*await txn.lease_rows(None))

        return await self._leasing("reading the leases", read)

    async def _leasing(self, what: str,
                       work: Callable[[WriteTransaction], Coroutine[Any, Any, T]]) -> T:
        """``work`` in a transaction of its own (`_lease_transaction`); a database failure
        is `WriteFailed`."""
        self._check_open()
        try:
            return await self._lease_transaction(work)
        except StoreError:
            raise
        except Exception as exc:
            raise WriteFailed(what, self._describe(exc)) from exc

    async def _lease_transaction(
            self, work: Callable[[WriteTransaction], Coroutine[Any, Any, T]]) -> T:
        """Run ``work`` in a transaction for leases: here, a write transaction of the
        writer's, between two commits (one process writes this log). An adapter whose log
        several processes write (PostgreSQL) runs it apart from the commits, so that a
        process stuck in a commit never holds up the others' leases."""
        async def run() -> T:
            assert self._write_lock is not None
            async with self._write_lock:
                self._check_open()
                async with self._transaction() as txn:
                    return await work(txn)

        return await self._on_writer(run())

    # ----------------------------------------------------------------- the writer

    async def _run_writer(self) -> None:
        queue = self._queue
        wakeup = self._wakeup
        assert wakeup is not None and self._write_lock is not None
        busy_since: float | None = None
        try:
            while True:
                with self._lock:
                    if not queue:
                        busy_since = None
                        if self._state is not _State.OPEN:
                            return
                        self._sleeping = True
                        wakeup.clear()
                        batch = None
                    else:
                        batch = self._take_batch()
                        self._inflight = batch
                        self._inflight_events = sum(len(p.events) for p in batch)
                if batch is None:
                    await wakeup.wait()
                    continue
                if not batch:
                    continue
                # Kept busy since the last commit ended: the time between counts too (under
                # load that is where the next batch is made).
                started = busy_since if busy_since is not None else time.perf_counter()
                async with self._write_lock:
                    await self._commit(batch)
                ended = time.perf_counter()
                self._measure(self._inflight_events, ended - started)
                with self._lock:
                    busy_since = ended if queue else None
                    self._inflight = []
                    self._inflight_events = 0
        finally:
            with self._lock:
                inflight, queued = self._inflight, list(queue)
                queue.clear()
                self._inflight = []
                self._inflight_events = 0
                self._queued_events = 0
                self._urgent = 0
            self._deliver(_fail_left, inflight, queued)

    def _take_urgent(self) -> list[Pending]:
        """The urgent appends, with whatever of their own streams was queued before them;
        everything else stays queued in order."""
        queue = self._queue
        last: dict[str, int] = {}
        for index, pending in enumerate(queue):
            if pending.append.urgent:
                last[pending.append.stream] = index
        batch: list[Pending] = []
        rest: list[Pending] = []
        for index, pending in enumerate(queue):
            if index <= last.get(pending.append.stream, -1):
                batch.append(pending)
            else:
                rest.append(pending)
        queue.clear()
        queue.extend(rest)
        self._queued_events -= sum(len(p.events) for p in batch)
        self._urgent = 0
        return [p for p in batch if not p.future.cancelled()]

    def _take_batch(self) -> list[Pending]:
        if self._urgent:
            return self._take_urgent()
        queue = self._queue
        batch: list[Pending]
        if self._queued_events <= self._max_batch:
            batch = list(queue)
            queue.clear()
            self._queued_events = 0
        else:
            batch = []
            size = 0
            limit = self._max_batch
            while queue:
                count = len(queue[0].events)
                if batch and size + count > limit:
                    break
                batch.append(queue.popleft())
                size += count
            self._queued_events -= size
        return [p for p in batch if not p.future.cancelled()]

    async def _commit(self, batch: list[Pending]) -> None:
        try:
            try:
                plan = await self._attempt(batch, lookup_all=False)
            except KeyConflict:
                # Some id is already stored: plan again knowing every stored id.
                plan = await self._attempt(batch, lookup_all=True)
        except Exception as exc:
            self._stale = True
            failed = WriteFailed("the append", self._describe(exc))
            self._deliver(self._settle, batch, [failed] * len(batch), [])
            return
        # Committed: advance the caches, then tell callers and followers (on their loop).
        self._position = plan.position
        self._versions.update(plan.versions)
        self._deliver(self._settle, batch, plan.final(), plan.rows)

    def _settle(self, batch: list[Pending], outcomes: Sequence[Outcome],
                rows: list[RecordedEvent]) -> None:
        """On the caller's loop: resolve the futures of a batch, then feed the followers."""
        for pending, outcome in zip(batch, outcomes, strict=True):
            future = pending.future
            if future.done():
                continue
            if isinstance(outcome, StoreError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if rows and self._followers:
            self._publish(rows)

    async def _attempt(self, batch: list[Pending], *, lookup_all: bool) -> Plan:
        async with self._transaction() as txn:
            plan = await self._plan(txn, batch, lookup_all=lookup_all)
            if plan.rows:
                await txn.insert(plan.rows)
        return plan

    async def _plan(
        self, txn: WriteTransaction, batch: list[Pending], *, lookup_all: bool
    ) -> Plan:
        """Look up what `plan_batch` needs, plan, then decide the appends set aside."""
        await self._resync(txn, (p.append.stream for p in batch))
        cache = self._versions
        missing = list(
            dict.fromkeys(p.append.stream for p in batch if p.append.stream not in cache)
        )
        if missing:
            loaded = await txn.load_versions(missing)
            for stream in missing:
                cache[stream] = loaded.get(stream, 0)
        # Ids known to be taken: stored ones (slow path only) and those written so far.
        known: dict[str, RecordedEvent] = {}
        if lookup_all:
            known = await txn.find_events([e.event_id for p in batch for e in p.events])
        fenced: dict[int, FencedError] = {}
        fences = fences_of(batch)
        if fences:
            now, rows = await txn.lease_rows(lease_resources(fences), lock=True)
            fenced = fence_failures(fences, now, rows)
        plan = plan_batch(batch, cache, known, fenced, self._clock(), self._position)
        if plan.deferred:
            # Only now look up the ids of appends set aside (rare: conflicts, retries).
            ids = [] if lookup_all else unseen_ids(batch, plan)
            settle_deferred(batch, plan, await txn.find_events(ids) if ids else {})
        return plan

    # ----------------------------------------------------------------- followers

    def _publish(self, rows: list[RecordedEvent]) -> None:
        """Hand committed ``rows`` to the followers (an adapter may hold them back)."""
        self._followers.publish(rows)

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
