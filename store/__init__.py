"""The event store: an append-only, gap-free event log behind the :class:`EventStore` port.

Adapters: :class:`MemoryEventStore` (tests, tools) and :class:`SqliteEventStore` (production).
"""

from __future__ import annotations

import os

from .engine import BUSY_TIMEOUT_MS
from .memory import MemoryEventStore
from .migration import migrate
from .port import (
    Append,
    ConcurrencyError,
    DuplicateEventError,
    EventStore,
    NewEvent,
    RecordedEvent,
    RestoreError,
    Snapshot,
    SnapshotInfo,
    StoreClosedError,
    StoreError,
    WriteFailed,
)
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
    """Build and open a store: ``"memory:"`` for memory, else a SQLite path or URL.

    ``synchronous`` and ``busy_timeout_ms`` apply to SQLite only. The caller closes the store
    (``await store.close()``, or use it as ``async with await open_store(...)``).
    """
    store: GroupCommitStore
    if os.fspath(url) == MEMORY_URL:
        store = MemoryEventStore(clock=clock, max_batch=max_batch, follower_buffer=follower_buffer)
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
    "MEMORY_URL",
    "Append",
    "ConcurrencyError",
    "DuplicateEventError",
    "EventStore",
    "GroupCommitStore",
    "LogInUse",
    "MemoryEventStore",
    "NewEvent",
    "NotAnEventLog",
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
