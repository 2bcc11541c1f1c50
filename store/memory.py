"""An in-memory event store with the same semantics as the SQLite one (for tests and tools)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType

from .batch import LeaseRow
from .port import RecordedEvent, Snapshot, SnapshotInfo
from .writer import (
    DEFAULT_FOLLOWER_BUFFER,
    DEFAULT_MAX_BATCH,
    Clock,
    GroupCommitStore,
    KeyConflict,
    check_limit,
)


class MemoryEventStore(GroupCommitStore):
    """An :class:`~store.port.EventStore` held in memory.

    It shares the group-commit writer with the SQLite store: appends are batched the same way
    and a "commit" yields to the event loop before it takes effect, so futures, version checks,
    idempotency and followers behave exactly as with a database. Reads also work after close.
    ``committed`` is a log it starts with (what another memory store held: a restart).
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
        committed: Sequence[RecordedEvent] = (),
    ) -> None:
        super().__init__(clock=clock, max_batch=max_batch, follower_buffer=follower_buffer)
        self._log: list[RecordedEvent] = []
        self._by_id: dict[str, RecordedEvent] = {}
        self._streams: dict[str, list[RecordedEvent]] = {}
        self._snapshots: dict[int, Snapshot] = {}
        self._leases: dict[str, LeaseRow] = {}
        if [r.position for r in committed] != list(range(1, len(committed) + 1)):
            raise ValueError("a committed log has positions 1, 2, ... without a gap")
        self._commit_rows(list(committed))

    async def _start(self) -> int:
        return len(self._log)

    async def _stop(self) -> None:
        return None

    def _transaction(self) -> _MemoryTransaction:
        return _MemoryTransaction(self)

    def _commit_rows(self, rows: list[RecordedEvent]) -> None:
        self._log.extend(rows)
        by_id = self._by_id
        streams = self._streams
        for record in rows:
            by_id[record.event_id] = record
            stream = streams.get(record.stream)
            if stream is None:
                streams[record.stream] = [record]
            else:
                stream.append(record)

    async def read(self, after: int = 0, limit: int | None = None) -> list[RecordedEvent]:
        """Events with position > ``after`` in position order, at most ``limit``."""
        check_limit(limit)
        start = max(after, 0)  # positions are 1..N, so position p sits at index p - 1
        return self._log[start:] if limit is None else self._log[start : start + limit]

    async def read_stream(
        self, stream: str, after_version: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """One stream's events with version > ``after_version`` in version order."""
        check_limit(limit)
        records = self._streams.get(stream, [])
        start = max(after_version, 0)
        return records[start:] if limit is None else records[start : start + limit]

    async def last_position(self) -> int:
        """The position of the last committed event (0 when empty)."""
        return len(self._log)

    async def stream_versions(self) -> dict[str, int]:
        """Every stream with its current version."""
        return {stream: len(records) for stream, records in self._streams.items()}

    async def snapshots(self) -> list[SnapshotInfo]:
        """Every stored snapshot, newest (highest position) first."""
        return [
            SnapshotInfo(s.position, s.fingerprint, s.checksum, s.created_at, len(s.data))
            for _, s in sorted(self._snapshots.items(), reverse=True)
        ]

    async def read_snapshot(self, position: int) -> Snapshot | None:
        """The snapshot at ``position``, if there is one."""
        return self._snapshots.get(position)


class _MemoryTransaction:
    """Stages one batch; applies it when the block exits cleanly (after yielding once)."""

    def __init__(self, store: MemoryEventStore) -> None:
        self._store = store
        self._staged: list[RecordedEvent] = []
        self._snapshots: dict[int, Snapshot] | None = None
        """The snapshots as this transaction leaves them, if it changes them."""
        self._leases: dict[str, LeaseRow] | None = None
        """The leases as this transaction leaves them, if it changes them."""

    async def __aenter__(self) -> _MemoryTransaction:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None and (self._staged or self._snapshots is not None
                                 or self._leases is not None):
            await asyncio.sleep(0)  # the "I/O" of a commit: appends made meanwhile queue up
            self._store._commit_rows(self._staged)
            if self._snapshots is not None:
                self._store._snapshots = self._snapshots
            if self._leases is not None:
                self._store._leases = self._leases

    async def last_position(self) -> int:
        log = self._store._log
        return log[-1].position if log else 0

    async def load_versions(self, streams: Sequence[str]) -> dict[str, int]:
        known = self._store._streams
        return {stream: len(known[stream]) for stream in streams if stream in known}

    async def find_events(self, event_ids: Sequence[str]) -> dict[str, RecordedEvent]:
        by_id = self._store._by_id
        return {event_id: by_id[event_id] for event_id in event_ids if event_id in by_id}

    async def insert(self, events: Sequence[RecordedEvent]) -> None:
        store = self._store
        by_id = store._by_id
        streams = store._streams
        if store._log and events and events[0].position <= store._log[-1].position:
            raise KeyConflict("UNIQUE constraint failed: events.position")
        for record in events:
            if record.event_id in by_id:
                raise KeyConflict("UNIQUE constraint failed: events.event_id")
            if record.version <= len(streams.get(record.stream, ())):
                raise KeyConflict("UNIQUE constraint failed: events.stream, events.version")
        self._staged.extend(events)

    async def put_snapshot(self, snapshot: Snapshot, keep: int) -> None:
        current = dict(self._store._snapshots if self._snapshots is None else self._snapshots)
        current[snapshot.position] = snapshot
        self._snapshots = {p: current[p] for p in sorted(current, reverse=True)[:keep]}

    async def delete_snapshots(self, positions: Sequence[int] | None) -> int:
        current = self._store._snapshots if self._snapshots is None else self._snapshots
        doomed = set(current) if positions is None else set(positions) & set(current)
        self._snapshots = {p: s for p, s in current.items() if p not in doomed}
        return len(doomed)

    async def lease_rows(self, resources: Sequence[str] | None, lock: bool = False
                         ) -> tuple[int, dict[str, LeaseRow]]:
        current = self._store._leases if self._leases is None else self._leases
        rows = dict(current) if resources is None else \
            {r: current[r] for r in resources if r in current}
        return self._store._clock(), rows

    async def swap_lease(self, old: LeaseRow | None, new: LeaseRow) -> bool:
        if self._leases is None:
            self._leases = dict(self._store._leases)
        if self._leases.get(new.resource) != old:
            return False
        self._leases[new.resource] = new
        return True

    async def delete_leases(self, resources: Sequence[str]) -> None:
        if self._leases is None:
            self._leases = dict(self._store._leases)
        for resource in resources:
            self._leases.pop(resource, None)
