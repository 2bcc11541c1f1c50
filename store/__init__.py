"""The event store: an append-only, gap-free event log behind the :class:`EventStore` port.

Adapters: :class:`MemoryEventStore` (tests, tools), :class:`SqliteEventStore` (production, one
process) and :class:`PostgresEventStore` (one log shared by several processes).
"""

from __future__ import annotations

import os

from .engine import BUSY_TIMEOUT_MS, database_url, is_postgres
from .memory import MemoryEventStore
from .migration import migrate
from .port import (
    MEMBER_PREFIX,
    Append,
    ConcurrencyError,
    DuplicateEventError,
    EventStore,
    Fence,
    FencedError,
    LeaseLost,
    Leases,
    LeaseView,
    LogReads,
    LogUnavailable,
    NewEvent,
    RecordedEvent,
    RestoreError,
    Snapshot,
    SnapshotInfo,
    StoreClosedError,
    StoreError,
    WriteFailed,
)
from .postgres import PostgresEventStore
from .sqlite import LogInUse, NotAnEventLog, SqliteEventStore, check_event_log
from .writer import DEFAULT_FOLLOWER_BUFFER, DEFAULT_MAX_BATCH, Clock, GroupCommitStore

MEMORY_URL = "memory:"
"""The URL :func:`open_store` takes for an in-memory store."""


async def open_store(
    url: str | os.PathLike[str],
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    clock: Clock | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
) -> GroupCommitStore:
    """Build and open a store: ``"memory:"`` for memory, a ``postgresql://`` URL for
    PostgreSQL, else a SQLite path or URL.

    ``synchronous`` applies to SQLite only; ``busy_timeout_ms`` is SQLite's busy timeout and
    PostgreSQL's lock timeout. The caller closes the store (``await store.close()``, or use
    it as ``async with await open_store(...)``).
    """
    store: GroupCommitStore
    if os.fspath(url) == MEMORY_URL:
        store = MemoryEventStore(clock=clock, max_batch=max_batch, follower_buffer=follower_buffer)
    elif is_postgres(database_url(url)):
        store = PostgresEventStore(
            os.fspath(url),
            lock_timeout_ms=busy_timeout_ms,
            clock=clock,
            max_batch=max_batch,
            follower_buffer=follower_buffer,
        )
    else:
        store = SqliteEventStore(
            url,
            synchronous=synchronous,
            busy_timeout_ms=busy_timeout_ms,
            clock=clock,
            max_batch=max_batch,
            follower_buffer=follower_buffer,
        )
    await store.open()
    return store


__all__ = [
    "DEFAULT_MAX_BATCH",
    "MEMBER_PREFIX",
    "MEMORY_URL",
    "Append",
    "ConcurrencyError",
    "DuplicateEventError",
    "EventStore",
    "Fence",
    "FencedError",
    "GroupCommitStore",
    "LeaseLost",
    "LeaseView",
    "Leases",
    "LogInUse",
    "LogReads",
    "LogUnavailable",
    "MemoryEventStore",
    "NewEvent",
    "NotAnEventLog",
    "PostgresEventStore",
    "RecordedEvent",
    "RestoreError",
    "Snapshot",
    "SnapshotInfo",
    "SqliteEventStore",
    "StoreClosedError",
    "StoreError",
    "WriteFailed",
    "check_event_log",
    "migrate",
    "open_store",
]
