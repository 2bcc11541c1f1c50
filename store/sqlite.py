"""The SQLite event store: SQLAlchemy async Core over aiosqlite, one group-committing writer."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import resource
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from operator import attrgetter
from typing import Any, Final
from urllib.parse import quote

from sqlalchemy import delete, func, insert, inspect, literal, select, union_all
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from .engine import (
    BUSY_TIMEOUT_MS,
    check_busy_timeout,
    check_synchronous,
    create_engine,
    create_sqlite_writer_engine,
    database_url,
    is_sqlite,
)
from .migration import upgrade_engine
from .port import RecordedEvent, Snapshot, SnapshotInfo, StoreClosedError, StoreError
from .schema import events, snapshots
from .writer import (
    DEFAULT_FOLLOWER_BUFFER,
    DEFAULT_MAX_BATCH,
    Clock,
    GroupCommitStore,
    KeyConflict,
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
_RowParams = Callable[[RecordedEvent], Any]
_CompiledInsert = tuple[str, _RowParams]


def _compile_insert(dialect: Dialect) -> _CompiledInsert:
    """``insert(events)`` compiled for ``dialect``, with a function giving one row's params.

    Positional dialects (SQLite) get tuples in the compiled column order, others dicts. The
    field names of :class:`RecordedEvent` are the column names.
    """
    compiled = insert(events).compile(dialect=dialect)
    if compiled.positional and compiled.positiontup is not None:
        return str(compiled), attrgetter(*compiled.positiontup)
    names = [column.name for column in events.columns]
    getter = attrgetter(*names)
    return str(compiled), lambda record: dict(zip(names, getter(record), strict=True))


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
_IN_CHUNK: Final = 10_000
"""Most bound values in one ``IN (...)``; a default-sized batch always fits in one query."""
_VERSION_CHUNK: Final = 200
"""Streams per version query (SQLite allows 500 terms in a compound SELECT)."""


_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_READONLY: Final = 8
_SQLITE_IOERR: Final = 10
_SQLITE_FULL: Final = 13
_NEARLY_FULL: Final = 1 << 20
"""Free bytes under which a disk (or a file under its size limit) counts as full."""


def _reason(exc: BaseException, path: str | None = None) -> str:
    """What went wrong, in words a person can act on, with the driver's own message (no SQL,
    no parameters). ``path`` (the database file) lets a failed write say whether its disk
    is full or a file reached the process's size limit."""
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = str(orig) or type(orig).__name__
    code = getattr(orig, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return f"the event log is locked by another process (SQLite: {text})"
    if primary == _SQLITE_READONLY:
        return f"the event log is read-only (SQLite: {text})"
    if primary in (_SQLITE_FULL, _SQLITE_IOERR):
        found = None if path is None else _space_problem(path)
        if found is not None:
            return f"{found} (SQLite: {text})"
        if primary == _SQLITE_FULL:
            return f"the disk holding the event log is full (SQLite: {text})"
        return f"the disk holding the event log failed or is full (SQLite: {text})"
    return text


def _space_problem(path: str) -> str | None:
    """Why files next to ``path`` cannot grow, if that is the trouble: a file of the log
    at the process's file size limit (``ulimit -f``), or a full disk."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            files = [name for name in (path, f"{path}-wal", f"{path}-journal")
                     if os.path.exists(name)]
            largest = max(files, key=os.path.getsize, default=None)
            if largest is not None and os.path.getsize(largest) + _NEARLY_FULL > soft:
                return (f"{os.path.basename(largest)} reached this process's file size "
                        f"limit of {soft} bytes (ulimit -f): raise it")
        stat = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return None
    free = stat.f_bavail * stat.f_frsize
    if free < _NEARLY_FULL:
        return (f"the disk holding the event log is full ({os.path.dirname(path)}): "
                "free some space")
    return None


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

    ``open()`` runs the Alembic migrations, loads the last position and starts the writer
    on a thread of its own, with a connection of its own (``sqlite3``): a commit never waits
    for the caller's event loop, however busy. Reads use their own pooled connections
    (aiosqlite) and run alongside the writer.
    """

    _writer_thread = True

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
        self._writer_engine: Engine | None = None
        self._writer_conn: Connection | None = None
        """The writer's own connection (``sqlite3``, on the writer's thread)."""
        self._compiled_insert: _CompiledInsert | None = None

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (while open)."""
        if self._engine is None:
            raise StoreClosedError("the store is not open")
        return self._engine

    async def _start(self) -> int:
        if self._log_lock is not None:
            self._log_lock.acquire(self._url.database or "")
        try:
            return await self._connect()
        except BaseException:
            if self._log_lock is not None:
                self._log_lock.release()
            raise

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
        # On the writer's thread: its connection is used there alone.
        engine = create_sqlite_writer_engine(self._url, synchronous=self._synchronous,
                                             busy_timeout_ms=self._busy_timeout_ms)
        try:
            self._writer_conn = engine.connect()
        except BaseException:
            engine.dispose()
            raise
        self._writer_engine = engine
        self._compiled_insert = _compile_insert(self._writer_conn.dialect)

    async def _stop_writer(self) -> None:
        conn, self._writer_conn = self._writer_conn, None
        engine, self._writer_engine = self._writer_engine, None
        try:
            if conn is not None:
                conn.close()
        finally:
            if engine is not None:
                engine.dispose()

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
        conn = self._writer_conn
        if conn is None or self._compiled_insert is None:
            raise StoreClosedError("the store is not open")
        txn = _SqliteTransaction(conn, self._compiled_insert)
        try:
            yield txn
            txn.commit()
        except Exception:
            with contextlib.suppress(Exception):
                conn.rollback()  # also after a failed COMMIT (no-op without one)
            # SQLAlchemy does not roll back after a failed COMMIT, and SQLite may keep that
            # transaction open: end it here, or the next batch would run (and commit) in it.
            with contextlib.suppress(Exception):
                conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
            raise

    @property
    def url(self) -> str | None:
        """Where another process can open this log."""
        return self._url.render_as_string(hide_password=False)

    def _describe(self, exc: BaseException) -> str:
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
    """The writer's side of one SQLite transaction, on the writer's thread: every statement
    runs there and then, through SQLAlchemy's synchronous Core over the standard library's
    ``sqlite3`` (the thread is the writer's own: a blocking call holds up nobody else). The
    methods are coroutines only because the writer awaits any adapter's."""

    __slots__ = ("_conn", "_insert")

    def __init__(self, conn: Connection, insert: _CompiledInsert) -> None:
        self._conn = conn
        self._insert = insert

    def commit(self) -> None:
        """Commit what was done (nothing to do if nothing was)."""
        if self._conn.in_transaction():
            self._conn.commit()

    async def last_position(self) -> int:
        return int(self._conn.execute(_MAX_POSITION).scalar() or 0)

    async def load_versions(self, streams: Sequence[str]) -> dict[str, int]:
        # One max() per stream, each a single index lookup; a GROUP BY over ``IN (...)``
        # would read every index entry of those streams (all of a large log at a restart).
        found: dict[str, int] = {}
        for start in range(0, len(streams), _VERSION_CHUNK):
            chunk = streams[start : start + _VERSION_CHUNK]
            result = self._conn.execute(union_all(*(
                select(literal(stream), func.max(events.c.version)).where(
                    events.c.stream == stream)
                for stream in chunk
            )))
            found.update((stream, int(version)) for stream, version in result
                         if version is not None)
        return found

    async def find_events(self, event_ids: Sequence[str]) -> dict[str, RecordedEvent]:
        found: dict[str, RecordedEvent] = {}
        for start in range(0, len(event_ids), _IN_CHUNK):
            chunk = event_ids[start : start + _IN_CHUNK]
            result = self._conn.execute(select(*_COLUMNS).where(events.c.event_id.in_(chunk)))
            for row in result:
                record = RecordedEvent(*row)
                found[record.event_id] = record
        return found

    async def insert(self, rows: Sequence[RecordedEvent]) -> None:
        # One executemany of the INSERT compiled from ``insert(events)`` for this dialect,
        # with plain parameter tuples: SQLAlchemy passes them to the driver untouched.
        insert_sql, row_params = self._insert
        try:
            self._conn.exec_driver_sql(insert_sql, list(map(row_params, rows)))
        except IntegrityError as exc:
            raise KeyConflict(_reason(exc)) from exc

    async def put_snapshot(self, snapshot: Snapshot, keep: int) -> None:
        conn = self._conn
        conn.execute(delete(snapshots).where(snapshots.c.position == snapshot.position))
        conn.execute(insert(snapshots).values(snapshot._asdict()))
        newest = select(snapshots.c.position).order_by(snapshots.c.position.desc()).limit(keep)
        kept = [row[0] for row in conn.execute(newest)]
        conn.execute(delete(snapshots).where(snapshots.c.position.not_in(kept)))

    async def delete_snapshots(self, positions: Sequence[int] | None) -> int:
        stmt = delete(snapshots)
        if positions is not None:
            stmt = stmt.where(snapshots.c.position.in_(positions))
        return int(self._conn.execute(stmt).rowcount)


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
