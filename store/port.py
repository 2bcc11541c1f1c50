"""The event store port: what the rest of the gateway may ask of an event log.

Rows are opaque to the store: a type name and a JSON text. The store never interprets them.
Every adapter (memory, SQLite, later PostgreSQL) passes the contract suite in
``tests/store/contract.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class NewEvent(NamedTuple):
    """An event to append: a unique id, a type name and its JSON-encoded data.

    Named tuples, not dataclasses: millions are built on the hot path, and a tuple is built
    several times faster than a frozen dataclass while being just as immutable.
    """

    event_id: str
    type: str
    data: str


class RecordedEvent(NamedTuple):
    """An event as committed: global position (gap-free), stream and version within it.

    The field order is the column order of the ``events`` table.
    """

    position: int
    stream: str
    version: int
    event_id: str
    type: str
    data: str
    recorded_at: int
    """Milliseconds since the Unix epoch, from the store's clock at commit."""


class Snapshot(NamedTuple):
    """A cached fold of the log up to ``position``, opaque to the store.

    ``fingerprint`` names the code that made it (a snapshot made by other code is ignored)
    and ``checksum`` lets the reader detect a damaged one; the store checks neither.
    """

    position: int
    fingerprint: str
    checksum: str
    created_at: int
    """Milliseconds since the Unix epoch."""
    data: bytes


class SnapshotInfo(NamedTuple):
    """A snapshot without its data: what `EventStore.snapshots` lists."""

    position: int
    fingerprint: str
    checksum: str
    created_at: int
    size: int
    """Bytes of data."""


class Fence(NamedTuple):
    """A stream's lease as its holder knows it: the member (a gateway process) and the
    lease's epoch, which grows every time the lease changes hands (a fencing token)."""

    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Append:
    """One atomic append to a stream: all events land together, or none do.

    ``expected_version`` is the stream's version before this append (0 for a new stream);
    ``None`` skips the optimistic concurrency check. An ``urgent`` append (an emergency stop,
    say) is committed ahead of everything queued for *other* streams; appends of its own
    stream queued before it still commit first, so a stream's order never changes. A
    ``fence`` makes the append land only while that member holds the stream's lease at that
    epoch, and its member lease has not expired (`FencedError` otherwise): a process that
    lost a lease can never write to its stream again (see `Leases`).
    """

    stream: str
    events: Sequence[NewEvent]
    expected_version: int | None
    urgent: bool = False
    fence: Fence | None = None


MEMBER_PREFIX = "member:"
"""The lease of a member itself (``member:<its id>``): while it has not expired, the member
is alive and holds the leases of the streams it acquired."""


class LeaseView(NamedTuple):
    """The leases at one moment of the store's clock (the database's: one clock for every
    host): live members with when their lease expires, and each held resource's holder."""

    now: int
    """Milliseconds since the Unix epoch."""
    members: dict[str, int]
    holders: dict[str, Fence]
    """Resources held by a live member (a lease whose member expired is free)."""


class StoreError(Exception):
    """The store could not do what was asked; nothing of the failed append was written."""


class WriteFailed(StoreError):
    """The database refused a write (a batch of appends, an import, a snapshot): locked by
    another process, disk full, I/O error. ``reason`` says why in words, without SQL; the
    same write may succeed once the fault ends."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} was not recorded: {reason}")
        self.reason = reason


class ConcurrencyError(StoreError):
    """The stream was not at the expected version: someone else appended first."""

    def __init__(self, stream: str, expected: int | None, actual: int) -> None:
        super().__init__(
            f"stream {stream!r} is at version {actual}, append expected {expected}; "
            "re-read the stream and decide again"
        )
        self.stream = stream
        self.expected = expected
        self.actual = actual


class DuplicateEventError(StoreError):
    """Some, but not all, of an append's event ids already exist (or exist elsewhere)."""


class FencedError(StoreError):
    """An append's fence does not hold: the stream's lease is another member's now, or at
    another epoch, or its member's lease expired. Nothing of the append was written, and
    nothing of that stream may be written by this member again under that fence."""

    def __init__(self, stream: str, fence: Fence, holder: Fence | None) -> None:
        now = "free" if holder is None else f"held by {holder.owner} at epoch {holder.epoch}"
        super().__init__(
            f"stream {stream!r}: the lease of {fence.owner} at epoch {fence.epoch} no longer "
            f"holds ({now}); nothing was written")
        self.stream = stream
        self.fence = fence
        self.holder = holder


class LeaseLost(StoreError):
    """A member's own lease expired (it did not renew it in time): every lease it held may
    be taken; it must stop writing and join again under a new id."""


class LogUnavailable(StoreError):
    """The event log cannot be opened (its server cannot be reached, its directory does
    not exist, ...): where it is and why, in words."""


class StoreClosedError(StoreError):
    """The store is closed (or closing) and takes no more appends."""


class RestoreError(StoreError):
    """Recorded events handed to `EventStore.restore` do not continue the log exactly."""


class Leases(Protocol):
    """Leases kept in the log's database, for several processes sharing one log: each
    *member* (a process) holds a lease of its own that it renews, and through it the leases
    of the streams it acquired; a stream's lease has an epoch that grows whenever it changes
    hands, and appends fenced with it (`Append.fence`) land only while it holds.

    Times are the store's clock (the database's, so one clock for every host). Every call is
    a write transaction, ordered with the appends of every process.
    """

    async def join(self, member: str, ttl_ms: int) -> LeaseView:
        """Make ``member`` live for ``ttl_ms``; the leases as they are then."""

    async def renew(self, member: str, ttl_ms: int) -> LeaseView:
        """Keep ``member`` live for another ``ttl_ms`` (0: it expires at once); `LeaseLost`
        if its lease expired (or was never taken): then nothing is renewed."""

    async def acquire(self, member: str, resources: Sequence[str]) -> dict[str, int]:
        """Take the leases of ``resources`` that are free (never held, released, or held by
        a member whose lease expired), each at a new epoch; keep those ``member`` holds
        already. Returns every one of ``resources`` ``member`` holds now, with its epoch
        (`LeaseLost` if ``member`` is not live)."""

    async def release(self, member: str, resources: Sequence[str]) -> None:
        """Give up the leases of ``resources`` that ``member`` holds."""

    async def leave(self, member: str) -> None:
        """Give up every lease of ``member``, its own included."""

    async def leases(self) -> LeaseView:
        """The leases now."""


class LogReads(Protocol):
    """What may be read of the log (and of how busy its writer is): the narrow port the
    edge and the read models use. Every `EventStore` is one."""

    @property
    def backlog(self) -> int:
        """Events appended and not committed yet."""

    @property
    def commit_rate(self) -> float | None:
        """Events committed per second of the writer's busy time, recently (None before the
        first commit): with `backlog`, how long new work would wait for its commit."""

    @property
    def committed_events(self) -> int:
        """Events this process committed since it opened the log (a counter)."""

    @property
    def busy_seconds(self) -> float:
        """Seconds the writer was kept busy since the log was opened (a counter)."""

    @property
    def url(self) -> str | None:
        """Where another process can open this log to read it (None: nowhere)."""

    async def read(
        self, after: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """Events with position > ``after`` in position order, at most ``limit``."""

    async def read_stream(
        self, stream: str, after_version: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """One stream's events with version > ``after_version`` in version order."""

    async def last_position(self) -> int:
        """The position of the last committed event (0 when empty)."""

    def follow(self, after: int = 0) -> AsyncGenerator[RecordedEvent, None]:
        """Every committed event after ``after``, then each new one as it commits.

        No gaps and no duplicates, however the backlog and live commits interleave; a slow
        follower never makes the store buffer without bound (it catches up by reading). It
        ends once the store is closed and everything committed was yielded; close it (for
        example with ``contextlib.aclosing``) when done.
        """

    def follow_batches(
        self, after: int = 0, limit: int = 2000
    ) -> AsyncGenerator[list[RecordedEvent], None]:
        """`follow` in lists: each one holds every event ready when it is taken (at least
        one, at most ``limit``), in position order, continuing the one before it. Cheaper
        for a follower that sends what it gets on (one frame per list, not per event)."""


class EventStore(LogReads, Protocol):
    """An append-only log of events with a gap-free global position.

    Appends are group-committed: ``append`` enqueues synchronously (so appends are ordered
    exactly as called) and returns a future that resolves to the recorded events only after
    the commit that holds them. Re-appending events whose ids are all already recorded in
    the same stream is idempotent: the future resolves to the original records.
    """

    @property
    def url(self) -> str | None:
        """Where another process can open this log (None: nowhere, it lives in memory)."""

    async def open(self) -> None:
        """Prepare the store (migrations, caches) and start its writer."""

    async def close(self) -> None:
        """Finish the commit in flight and every append already enqueued, then stop."""

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        """Enqueue one atomic append; the future resolves after its commit.

        A malformed append (no events, bad names, negative version) raises ``ValueError``
        at once; on a closed store the future fails with `StoreClosedError`.
        """

    def append_many(
        self, appends: Sequence[Append]
    ) -> list[asyncio.Future[list[RecordedEvent]]]:
        """Enqueue several appends in order; each succeeds or fails on its own."""

    async def stream_versions(self) -> dict[str, int]:
        """Every stream with its current version."""

    async def restore(self, records: Sequence[RecordedEvent]) -> None:
        """Write events recorded elsewhere verbatim (an import), in one transaction.

        They must continue this log exactly: positions from the last one + 1 without a gap,
        each stream's versions from its current version + 1, ids not yet used; otherwise
        `RestoreError` (or `DuplicateEventError`) and nothing is written. Followers see them
        as if appended.
        """

    async def save_snapshot(self, snapshot: Snapshot, keep: int = 2) -> None:
        """Store a snapshot (replacing one at the same position), then delete all but the
        ``keep`` newest."""

    async def snapshots(self) -> list[SnapshotInfo]:
        """Every stored snapshot, newest (highest position) first."""

    async def read_snapshot(self, position: int) -> Snapshot | None:
        """The snapshot at ``position``, if there is one."""

    async def delete_snapshots(self, positions: Sequence[int] | None = None) -> int:
        """Delete the snapshots at ``positions`` (default: every one); how many there were."""

