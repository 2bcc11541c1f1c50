"""The SQLite event store: SQLAlchemy async Core over aiosqlite, one group-committing writer."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final
from urllib.parse import quote

from sqlalchemy import func, inspect, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from . import sqlite_writer
from .batch import LeaseRow
from .engine import (
    BUSY_TIMEOUT_MS,
    check_busy_timeout,
    check_synchronous,
    create_engine,
    database_url,
    is_sqlite,
)
from .migration import upgrade_engine
from .port import (
    LogUnavailable,
    RecordedEvent,
    Snapshot,
    SnapshotInfo,
    StoreClosedError,
    StoreError,
)
from .schema import events, snapshots
from .sqlite_process import WriterFailed, WriterProcess
from .writer import (
    DEFAULT_FOLLOWER_BUFFER,
    DEFAULT_MAX_BATCH,
    Clock,
    GroupCommitStore,
    WriteTransaction,
    check_limit,
)

_COLUMNS: Final = (
    events.c.position,
    events.c.stream,
    events.c.version,
    events.c.event_id,
    events.c.type,
    events.c.data,
    events.c.recorded_at,
)
_MAX_POSITION: Final = select(func.max(events.c.position))
_STREAM_VERSIONS: Final = select(events.c.stream, func.max(events.c.version)).group_by(
    events.c.stream
)
_SNAPSHOT_INFO: Final = select(
    snapshots.c.position,
    snapshots.c.fingerprint,
    snapshots.c.checksum,
    snapshots.c.created_at,
    func.length(snapshots.c.data),
).order_by(snapshots.c.position.desc())


def _reason(exc: BaseException, path: str | None = None) -> str:
    """What went wrong, in words (`store.sqlite_writer.reason`)."""
    return sqlite_writer.reason(exc, path)


class LogInUse(StoreError):
    """Another process holds the event log file exclusively (a gateway serving it)."""


class LogLock:
    """An exclusive lock on an event log file for one process: ``flock`` on ``<file>.lock``,
    which holds the owner's pid. The kernel releases it when the process dies, however it
    dies (``kill -9`` included), so a stale lock file never blocks a start."""

    def __init__(self, path: str) -> None:
        self.path = f"{path}.lock"
        self._fd: int | None = None

    def acquire(self, log_path: str) -> None:
        """Take the lock, or raise `LogInUse` naming the process that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise LogInUse(
                f"{log_path} is in use by another gateway process (pid {holder}): one "
                "process serves one log. Stop that one first, or give this one another "
                "--db") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (closing the file does)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class SqliteEventStore(GroupCommitStore):
    """An :class:`~store.port.EventStore` in a SQLite file (WAL mode).

    ``url_or_path`` is a file path or a ``sqlite[+aiosqlite]:///`` URL. ``synchronous`` is
    SQLite's ``PRAGMA synchronous`` (``FULL`` makes every commit durable on power loss;
    ``NORMAL`` may lose the last commits but never corrupts). ``busy_timeout_ms`` is how long
    a commit waits for a lock another process holds before it fails. ``clock`` gives ``recorded_at``
    in ms (default: wall clock). ``max_batch`` bounds the events of one transaction and
    ``follower_buffer`` the events buffered for one follower. An ``exclusive`` store holds
    the file for this process while it is open (`LogLock`): a second one, in any process,
    fails to open with `LogInUse` (a gateway serving the log opens it so; readers need not).

    ``open()`` runs the Alembic migrations, loads the last position and starts the writer,
    whose database work runs in a process of its own (`store.sqlite_writer`: one ``sqlite3``
    connection, spoken to from the caller's event loop through `store.sqlite_process`): the
    loop plans each batch and goes on while the process commits it. Reads use their own
    pooled connections (aiosqlite) and run alongside the writer.
    """

    def __init__(
        self,
        url_or_path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        clock: Clock | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
        exclusive: bool = False,
    ) -> None:
        super().__init__(clock=clock, max_batch=max_batch, follower_buffer=follower_buffer)
        url = database_url(url_or_path)
        if not is_sqlite(url):
            raise ValueError(f"not a SQLite URL: {url.render_as_string(hide_password=True)}")
        self._url = url
        database = url.database or ""
        self._log_lock = LogLock(database) if exclusive and database not in ("", ":memory:") \
            else None
        self._synchronous = check_synchronous(synchronous)
        self._busy_timeout_ms = check_busy_timeout(busy_timeout_ms)
        self._engine: AsyncEngine | None = None
        """Reads, migrations (aiosqlite, on the caller's loop)."""
        self._writer_process: WriterProcess | None = None
        """The writer's process (spoken to by the writer task alone)."""

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (while open)."""
        if self._engine is None:
            raise StoreClosedError("the store is not open")
        return self._engine

    async def _start(self) -> int:
        where = self._url.database or ""
        try:
            if self._log_lock is not None:
                self._log_lock.acquire(where)
        except OSError as exc:
            raise LogUnavailable(f"cannot open the event log at {where}: "
                                 f"{exc.strerror or exc}") from None
        try:
            return await self._connect()
        except SQLAlchemyError as exc:
            raise LogUnavailable(f"cannot open the event log at {where}: "
                                 f"{_reason(exc, where)}") from None
        finally:
            if self._log_lock is not None and self._engine is None:
                self._log_lock.release()

    async def _connect(self) -> int:
        engine = create_engine(self._url, synchronous=self._synchronous,
                               busy_timeout_ms=self._busy_timeout_ms)
        try:
            await upgrade_engine(engine)
            async with engine.connect() as conn:
                last = (await conn.execute(_MAX_POSITION)).scalar()
        except BaseException:
            await engine.dispose()
            raise
        self._engine = engine
        return int(last or 0)

    async def _start_writer(self) -> None:
        writer = WriterProcess(self._url.database or "", self._synchronous,
                               self._busy_timeout_ms)
        try:
            await writer.start()
        except WriterFailed as exc:
            raise LogUnavailable(f"cannot open the event log at {self._url.database}: "
                                 f"{exc.reason}") from None
        self._writer_process = writer

    async def _stop_writer(self) -> None:
        writer, self._writer_process = self._writer_process, None
        if writer is not None:
            await writer.stop()

    async def _stop(self) -> None:
        engine, self._engine = self._engine, None
        try:
            if engine is not None:
                await engine.dispose()
        finally:
            if self._log_lock is not None:
                self._log_lock.release()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[WriteTransaction]:
        writer = self._writer_process
        if writer is None:
            raise StoreClosedError("the store is not open")
        if writer.broken:  # it died: a new one (the caches are read again: the last failed)
            await writer.start()
        txn = _SqliteTransaction(writer, self._clock)
        try:
            yield txn
            await txn.commit()
        except Exception:
            if not writer.broken:
                with contextlib.suppress(Exception):
                    await writer.call("rollback")  # (a failed request rolled back already)
            raise

    async def writer_query(self, sql: str) -> Any:
        """The first column of the first row of ``sql`` (a PRAGMA) on the writer's own
        connection, between two commits (for tests and diagnostics)."""
        assert self._write_lock is not None
        async with self._write_lock:
            if self._writer_process is None:
                raise StoreClosedError("the store is not open")
            return await self._writer_process.call("query", sql)

    @property
    def url(self) -> str | None:
        """Where another process can open this log."""
        return self._url.render_as_string(hide_password=False)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, WriterFailed):
            return exc.reason  # put in words by the writer process (its limits, its disk)
        return _reason(exc, self._url.database)

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self.engine.connect() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise StoreError(
                f"could not read the event log: {_reason(exc, self._url.database)}") from exc

    async def read(self, after: int = 0, limit: int | None = None) -> list[RecordedEvent]:
        """Events with position > ``after`` in position order, at most ``limit``."""
        check_limit(limit)
        stmt = select(*_COLUMNS).where(events.c.position > after).order_by(events.c.position)
        if limit is not None:
            stmt = stmt.limit(limit)
        async with self._reading() as conn:
            result = await conn.execute(stmt)
            return [RecordedEvent(*row) for row in result]

    async def read_stream(
        self, stream: str, after_version: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """One stream's events with version > ``after_version`` in version order."""
        check_limit(limit)
        stmt = (
            select(*_COLUMNS)
            .where(events.c.stream == stream, events.c.version > after_version)
            .order_by(events.c.version)
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        async with self._reading() as conn:
            result = await conn.execute(stmt)
            return [RecordedEvent(*row) for row in result]

    async def last_position(self) -> int:
        """The position of the last committed event (0 when empty)."""
        async with self._reading() as conn:
            return int((await conn.execute(_MAX_POSITION)).scalar() or 0)

    async def stream_versions(self) -> dict[str, int]:
        """Every stream with its current version."""
        async with self._reading() as conn:
            result = await conn.execute(_STREAM_VERSIONS)
            return {stream: int(version) for stream, version in result}

    async def snapshots(self) -> list[SnapshotInfo]:
        """Every stored snapshot, newest (highest position) first."""
        async with self._reading() as conn:
            result = await conn.execute(_SNAPSHOT_INFO)
            return [SnapshotInfo(*row) for row in result]

    async def read_snapshot(self, position: int) -> Snapshot | None:
        """The snapshot at ``position``, if there is one."""
        stmt = select(
            snapshots.c.position, snapshots.c.fingerprint, snapshots.c.checksum,
            snapshots.c.created_at, snapshots.c.data,
        ).where(snapshots.c.position == position)
        async with self._reading() as conn:
            row = (await conn.execute(stmt)).first()
            return None if row is None else Snapshot(*row)


class _SqliteTransaction:
    """The writer's side of one SQLite transaction, each statement a request to the writer
    process. The rows of `insert` go with the commit: in the usual batch (every stream's
    version cached) one request does the whole transaction."""

    __slots__ = ("_clock", "_rows", "_writer")

    def __init__(self, writer: WriterProcess, clock: Clock) -> None:
        self._writer = writer
        self._clock = clock
        self._rows: list[tuple[Any, ...]] | None = None

    async def commit(self) -> None:
        """Insert the rows given to `insert`, if any, and commit (`KeyConflict` if one of
        them hits a unique key: nothing of the transaction is then written)."""
        rows, self._rows = self._rows, None
        if rows is None:
            await self._writer.call("commit")
        else:
            await self._writer.call("insert_commit", rows)

    async def last_position(self) -> int:
        return int(await self._writer.call("last_position"))

    async def load_versions(self, streams: Sequence[str]) -> dict[str, int]:
        return dict(await self._writer.call("load_versions", list(streams)))

    async def find_events(self, event_ids: Sequence[str]) -> dict[str, RecordedEvent]:
        rows = await self._writer.call("find_events", list(event_ids))
        return {row[3]: RecordedEvent(*row) for row in rows}

    async def insert(self, rows: Sequence[RecordedEvent]) -> None:
        # Plain tuples (marshal takes no named tuple), sent with the commit.
        if self._rows is None:
            self._rows = []
        self._rows += map(tuple, rows)

    async def put_snapshot(self, snapshot: Snapshot, keep: int) -> None:
        await self._writer.call("put_snapshot", tuple(snapshot), keep)

    async def delete_snapshots(self, positions: Sequence[int] | None) -> int:
        return int(await self._writer.call("delete_snapshots",
                                     None if positions is None else list(positions)))

    async def lease_rows(self, resources: Sequence[str] | None, lock: bool = False
                         ) -> tuple[int, dict[str, LeaseRow]]:
        rows = await self._writer.call("lease_rows", None if resources is None else list(resources))
        return self._clock(), {row[0]: LeaseRow(*row) for row in rows}

    async def swap_lease(self, old: LeaseRow | None, new: LeaseRow) -> bool:
        return bool(await self._writer.call("swap_lease", None if old is None else tuple(old),
                                      tuple(new)))

    async def delete_leases(self, resources: Sequence[str]) -> None:
        await self._writer.call("delete_leases", list(resources))


def _file_kind(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Whether ``path`` is a file, missing or something else, and its absolute form."""
    kind = "missing" if not os.path.exists(path) else "file" if os.path.isfile(path) else "other"
    return kind, os.path.abspath(path)


class NotAnEventLog(StoreError):
    """A file that is not a gateway event log (or cannot be read as one)."""


async def check_event_log(path: str | os.PathLike[str]) -> None:
    """Raise `NotAnEventLog` unless ``path`` is an existing SQLite file with an ``events``
    table (of any schema revision). Nothing is created or migrated: tools call this before
    opening a store on a path a person typed."""
    kind, absolute = await asyncio.to_thread(_file_kind, path)
    if kind != "file":
        raise NotAnEventLog(f"no event log at {os.fspath(path)}" if kind == "missing"
                            else f"{os.fspath(path)} is not a file")
    # Read-only and without the store's PRAGMAs: a foreign file is left exactly as it was.
    uri = "file:" + quote(absolute) + "?mode=ro"
    engine = create_async_engine(URL.create("sqlite+aiosqlite", database=uri,
                                            query={"uri": "true"}))
    try:
        async with engine.connect() as conn:
            found = await conn.run_sync(lambda sync: inspect(sync).has_table("events"))
    except SQLAlchemyError as exc:
        raise NotAnEventLog(f"{os.fspath(path)} is not an event log: {_reason(exc)}") from None
    finally:
        await engine.dispose()
    if not found:
        raise NotAnEventLog(f"{os.fspath(path)} is a SQLite file without an events table: "
                            "not a gateway event log")
