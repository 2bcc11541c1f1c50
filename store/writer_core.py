"""The state and hooks every part of the group-commit writer shares (`WriterCore`): the
adapter hooks, the queue and caches, the commit-rate and backlog accounting, and the write
transaction (`WriteTransaction`) an adapter supplies. `store.writer.GroupCommitStore` puts
the parts together."""

from __future__ import annotations

import asyncio
import enum
import math
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import ClassVar, Final, Protocol, TypeVar

from .batch import LeaseRow, Pending
from .followers import Followers
from .port import (
    RecordedEvent,
    Snapshot,
    SnapshotInfo,
    StoreClosedError,
    StoreError,
    WriteFailed,
)

T = TypeVar("T")

DEFAULT_MAX_BATCH: Final = 2000
"""Most events the writer puts in one transaction (a bigger single append still goes whole)."""

DEFAULT_FOLLOWER_BUFFER: Final = 10_000
"""Most events buffered for one follower before it is switched to catching up by reading."""

RATE_HORIZON_S: Final = 1.0
"""The busy time over which `GroupCommitStore.commit_rate` is averaged."""

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


def check_limit(limit: int | None) -> None:
    """Reject a negative read limit."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None: {limit}")



class WriterCore(ABC):
    """What the parts of `store.writer.GroupCommitStore` share: its state and the adapter
    hooks. Everything runs on the event loop that opened the store."""

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
        self._queue: deque[Pending] = deque()
        self._queued_events = 0
        self._urgent = 0
        """Urgent appends in the queue: the next batch is theirs (see `_take_urgent`)."""
        self._sleeping = False
        """The writer waits for `_wakeup` (set it to go on)."""
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
        """Held by each batch commit, import and snapshot write: one write at a time."""
        self._stale = False
        """A write failed: the caches are read again before the next one (see `_resync`)."""
        self._inflight_events = 0
        self._rate_events = 0.0
        self._rate_seconds = 0.0
        """Events committed and seconds the writer was busy, both decayed over about
        `RATE_HORIZON_S`: their ratio is the commit rate."""
        self._committed_events = 0
        self._busy_seconds = 0.0

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

    @property
    def committed_events(self) -> int:
        """Events this process committed to the log since it opened it (a counter)."""
        return self._committed_events

    @property
    def busy_seconds(self) -> float:
        """Seconds the writer was kept busy since the log was opened (a counter: the
        committed events' increase over this one's is the commit rate)."""
        return self._busy_seconds

    def _measure(self, events: int, seconds: float) -> None:
        self._committed_events += events
        self._busy_seconds += seconds
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
        """Open what the writer writes with (after `_start`)."""
        return None

    async def _stop_writer(self) -> None:
        """Close what `_start_writer` opened, once the writer ended."""
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
    def _wake(self) -> None:
        """Let a sleeping writer go on."""
        if not self._sleeping:
            return
        self._sleeping = False
        wakeup = self._wakeup
        assert wakeup is not None
        wakeup.set()

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

    # ----------------------------------------------------------------- followers

    def _publish(self, rows: list[RecordedEvent]) -> None:
        """Hand committed ``rows`` to the followers (an adapter may hold them back)."""
        self._followers.publish(rows)
