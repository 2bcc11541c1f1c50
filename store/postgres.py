"""The PostgreSQL event store: the group-commit writer over asyncpg; several processes, each
with its own store, may append to one log at the same time.

**Positions.** Every write transaction first takes one advisory lock
(`store.pg_sql.POSITION_LOCK`, ``pg_advisory_xact_lock``) and holds it to its commit; only
then does it read the last position and the versions of its streams (the writer trusts no
cache: another process may have appended since) and insert its rows at the next positions.
Write transactions thus commit one after the other in position order, and PostgreSQL makes a
commit visible before it releases the lock: a reader that follows by position sees a
gap-free prefix of the log and can never skip a transaction that commits late (the pitfall
of positions drawn from a sequence). An expected version is checked under the lock, so a
conflicting append from another process fails with `ConcurrencyError`; a unique key hit all
the same (a writer that bypassed the lock) makes the writer plan the batch again from fresh
reads, never write anything twice.

**Followers.** A commit that wrote events sends ``NOTIFY gateway_events, '<last position>'``
inside its transaction (delivered only once it committed). Each store listens on a connection
of its own; events committed by other processes are read once by a relay task and handed to
the followers in position order, together with the store's own commits (which need no read).
Followers keep their own guarantees on top: a gap or an overflow makes a follower read the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any, Final, TypeVar

import asyncpg
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from . import pg_sql as sql
from .batch import LeaseRow
from .engine import BUSY_TIMEOUT_MS, check_busy_timeout, create_engine, database_url, is_postgres
from .migration import upgrade_engine
from .pg_connections import CONNECTION_ERRORS, reason, refused, rolled_back
from .port import (
    LogUnavailable,
    RecordedEvent,
    Snapshot,
    SnapshotInfo,
    StoreClosedError,
    StoreError,
)
from .writer import (
    DEFAULT_FOLLOWER_BUFFER,
    DEFAULT_MAX_BATCH,
    FOLLOW_PAGE,
    Clock,
    GroupCommitStore,
    KeyConflict,
    WriteTransaction,
    check_limit,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

IDLE_IN_TRANSACTION_MS: Final = 60_000
"""A write transaction idle this long (its process hung or vanished) is ended by the server,
which releases the position lock."""
READ_POOL: Final = 4
"""Most connections a store reads on at once."""
RECONNECT_S: Final = (0.1, 5.0)
"""First and longest wait between attempts to reconnect the listening connection."""


class PostgresEventStore(GroupCommitStore):
    """An :class:`~store.port.EventStore` in a PostgreSQL database, shared with any number of
    other processes (see the module docstring for how positions and followers work).

    ``url`` is a ``postgresql://`` URL (``postgresql+asyncpg://`` too). ``lock_timeout_ms``
    is how long a write waits for the position lock (or any lock) another process holds
    before it fails; ``idle_in_transaction_ms`` how long the server lets a write transaction
    idle before it ends it (a process stopped or paused mid-commit holds the position lock,
    and every other process's commits wait, until then). ``clock``, ``max_batch`` and
    ``follower_buffer`` are those of `GroupCommitStore`. ``open()`` runs the Alembic
    migrations and connects.
    """

    _shares_log = True

    def __init__(
        self,
        url: str,
        *,
        lock_timeout_ms: int = BUSY_TIMEOUT_MS,
        clock: Clock | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
        idle_in_transaction_ms: int = IDLE_IN_TRANSACTION_MS,
    ) -> None:
        super().__init__(clock=clock, max_batch=max_batch, follower_buffer=follower_buffer)
        if idle_in_transaction_ms < 100:
            raise ValueError(f"idle_in_transaction_ms must be >= 100: {idle_in_transaction_ms}")
        self._idle_ms = idle_in_transaction_ms
        parsed = database_url(url)
        if not is_postgres(parsed):
            raise ValueError(
                f"not a PostgreSQL URL: {parsed.render_as_string(hide_password=True)}")
        self._url: URL = parsed
        self._dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        self._lock_timeout_ms = check_busy_timeout(lock_timeout_ms)
        self._writer_conn: asyncpg.Connection[Any] | None = None
        self._writer_pid = 0
        self._pool: asyncpg.Pool[Any] | None = None
        self._own_conn: asyncpg.Connection[Any] | None = None
        """The connection of this member's own lease (`_lease_transaction`)."""
        self._own_lock = asyncio.Lock()
        self._listener: asyncpg.Connection[Any] | None = None
        self._listening: asyncio.Task[None] | None = None
        # The relay: what followers were handed, in order, and what is still to hand out.
        self._relayed = 0
        """Position of the last event handed to followers (in position order)."""
        self._known = 0
        """The last position known to be committed (by this store or a notification)."""
        self._held: list[list[RecordedEvent]] = []
        """This store's commits that wait for earlier ones of other processes to be read."""
        self._relay_wakeup = asyncio.Event()
        self._relay: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> int:
        try:
            return await self._connect()
        except (OSError, asyncpg.PostgresError, *CONNECTION_ERRORS, SQLAlchemyError) as exc:
            shown = self._url.set(drivername="postgresql").render_as_string(
                hide_password=True)
            orig = getattr(exc, "orig", None) or exc
            raise LogUnavailable(f"cannot open the event log at {shown}: "
                                 f"{reason(orig)}") from None

    async def _connect(self) -> int:
        engine = create_engine(self._url)
        try:
            await upgrade_engine(engine)
        finally:
            await engine.dispose()
        self._pool = await asyncpg.create_pool(self._dsn, min_size=1, max_size=READ_POOL)
        try:
            conn = await self._connect_writer()
            last = int(await conn.fetchval(sql.MAX_POSITION) or 0)
            await self._listen()
        except BaseException:
            await self._stop()
            raise
        self._relayed = self._known = last
        self._relay = asyncio.get_running_loop().create_task(
            self._run_relay(), name="PostgresEventStore relay")
        return last

    async def _stop(self) -> None:
        for task in (self._relay, self._listening):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._relay = self._listening = None
        conns = [self._writer_conn, self._listener, self._own_conn]
        self._writer_conn = self._listener = self._own_conn = None
        pool, self._pool = self._pool, None
        for conn in conns:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        if pool is not None:
            await pool.close()

    async def _connect_writer(self) -> asyncpg.Connection[Any]:
        conn = await asyncpg.connect(self._dsn, server_settings={
            "lock_timeout": str(self._lock_timeout_ms),
            # A writer whose process stopped mid-transaction without its connection closing
            # (a host gone from the network) must not hold the position lock for ever.
            "idle_in_transaction_session_timeout": str(self._idle_ms),
        })
        self._writer_conn = conn
        self._writer_pid = conn.get_server_pid()
        return conn

    # ----------------------------------------------------------------- writes

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[WriteTransaction]:
        if self._pool is None:
            raise StoreClosedError("the store is not open")
        conn = await self._begin()
        txn = _PostgresTransaction(conn)
        try:
            yield txn
            if txn.last is not None:
                await conn.execute(f"NOTIFY {sql.CHANNEL}, '{txn.last}'; COMMIT")
            else:
                await conn.execute("COMMIT")
        except BaseException as exc:
            if not await rolled_back(conn, exc):
                self._discard(conn)  # cut off or broken: the next write connects again
            raise

    async def _begin(self) -> asyncpg.Connection[Any]:
        """The writer's connection in a transaction holding the position lock. One found
        broken at this first statement (closed by the server, or left mid-operation by an
        operation cut off) is replaced, and the statement made again on the new one."""
        for attempt in (1, 2):
            conn = self._writer_conn
            if conn is None or conn.is_closed():
                conn = await self._connect_writer()
            try:
                await conn.execute(sql.LOCK)
                return conn
            except BaseException as exc:
                if not await rolled_back(conn, exc):
                    self._discard(conn)
                if attempt == 2 or not isinstance(exc, CONNECTION_ERRORS):
                    raise
                log.info("the writer's connection broke (%s); connecting again", reason(exc))
        raise AssertionError("unreachable")

    def _discard(self, conn: asyncpg.Connection[Any]) -> None:
        """Never use a writer's connection again."""
        conn.terminate()
        if self._writer_conn is conn:
            self._writer_conn = None

    async def _lease_transaction(
            self, work: Callable[[WriteTransaction], Coroutine[Any, Any, T]],
            own: bool = False) -> T:
        # Apart from the commits (no position lock): a process stopped in the middle of a
        # commit, holding the lock, must not keep the others from renewing their leases.
        # Changes of hands wait for a commit that checked the old hands' fence (it locked
        # the rows it read), so a stream never changes hands under a commit of its old owner.
        # A member's own lease has a connection of its own: reads that take every pooled
        # one (a takeover's) must not make its renewal late.
        pool = self._pool
        if pool is None:
            raise StoreClosedError("the store is not open")
        if not own:
            async with pool.acquire() as conn:
                return await self._in_lease_transaction(conn, work)
        async with self._own_lock:
            if self._own_conn is None or self._own_conn.is_closed():
                self._own_conn = await asyncpg.connect(self._dsn)
            return await self._in_lease_transaction(self._own_conn, work)

    async def _in_lease_transaction(
            self, conn: Any, work: Callable[[WriteTransaction], Coroutine[Any, Any, T]]) -> T:
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {self._lock_timeout_ms}")
                return await work(_PostgresTransaction(conn))
        except BaseException as exc:
            if not refused(exc):  # cut off mid-operation, or broken: never reused
                conn.terminate()
            raise

    @property
    def url(self) -> str | None:
        """Where another process can open this log."""
        return self._url.render_as_string(hide_password=False)

    def _describe(self, exc: BaseException) -> str:
        return reason(exc)

    # ----------------------------------------------------------------- reads

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy[Any]]:
        pool = self._pool
        if pool is None:
            raise StoreClosedError("the store is not open")
        try:
            async with pool.acquire() as conn:
                yield conn
        except (asyncpg.PostgresError, *CONNECTION_ERRORS) as exc:
            if self._pool is None:
                raise StoreClosedError("the store was closed during the read") from exc
            raise StoreError(f"could not read the event log: {reason(exc)}") from exc

    async def read(self, after: int = 0, limit: int | None = None) -> list[RecordedEvent]:
        """Events with position > ``after`` in position order, at most ``limit``."""
        check_limit(limit)
        async with self._reading() as conn:
            rows = await conn.fetch(sql.READ, after, limit)
        return [RecordedEvent(*row) for row in rows]

    async def read_stream(
        self, stream: str, after_version: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """One stream's events with version > ``after_version`` in version order."""
        check_limit(limit)
        async with self._reading() as conn:
            rows = await conn.fetch(sql.READ_STREAM, stream, after_version, limit)
        return [RecordedEvent(*row) for row in rows]

    async def last_position(self) -> int:
        """The position of the last committed event (0 when empty)."""
        async with self._reading() as conn:
            return int(await conn.fetchval(sql.MAX_POSITION) or 0)

    async def stream_versions(self) -> dict[str, int]:
        """Every stream with its current version."""
        async with self._reading() as conn:
            rows = await conn.fetch(sql.STREAM_VERSIONS)
        return {stream: int(version) for stream, version in rows}

    async def snapshots(self) -> list[SnapshotInfo]:
        """Every stored snapshot, newest (highest position) first."""
        async with self._reading() as conn:
            rows = await conn.fetch(sql.SNAPSHOT_INFO)
        return [SnapshotInfo(*row) for row in rows]

    async def read_snapshot(self, position: int) -> Snapshot | None:
        """The snapshot at ``position``, if there is one."""
        async with self._reading() as conn:
            row = await conn.fetchrow(sql.READ_SNAPSHOT, position)
        return None if row is None else Snapshot(*row)

    # ----------------------------------------------------------------- followers

    async def follow_batches(
        self, after: int = 0, limit: int = FOLLOW_PAGE
    ) -> AsyncGenerator[list[RecordedEvent], None]:
        """`follow` in lists: each one holds every event ready when it is taken (at least
        one, at most ``limit``), in position order, continuing the one before it. Events
        appended by other processes are included."""
        if not self._followers:
            # Nobody was handed anything meanwhile: start relaying from what is committed
            # (a new follower reads its backlog itself).
            self._relayed = max(self._relayed, self._position, self._known)
            self._held.clear()
        async with aclosing(super().follow_batches(after, limit)) as batches:
            async for batch in batches:
                yield batch

    def _publish(self, rows: list[RecordedEvent]) -> None:
        """Hand this store's commit to the followers, after whatever other processes
        committed before it (the relay reads that first)."""
        if rows[-1].position <= self._relayed:
            return
        if rows[0].position == self._relayed + 1:
            self._hand_out(rows)
            if self._held:
                self._flush_held()
            return
        self._held.append(rows)
        self._known = max(self._known, rows[-1].position)
        self._relay_wakeup.set()

    def _hand_out(self, rows: list[RecordedEvent]) -> None:
        super()._publish(rows)
        self._relayed = rows[-1].position

    def _flush_held(self) -> None:
        """Hand out the held commits that now continue what was handed out."""
        self._held.sort(key=lambda rows: rows[0].position)
        while self._held:
            rows = self._held[0]
            if rows[-1].position <= self._relayed:
                self._held.pop(0)
            elif rows[0].position == self._relayed + 1:
                self._hand_out(self._held.pop(0))
            else:
                return

    def _notified(self, _conn: object, pid: int, _channel: str, payload: object) -> None:
        """A commit's notification: another process's commits are for the relay to read."""
        if pid == self._writer_pid:
            return  # this store's own commit: the writer hands it out itself
        try:
            last = int(str(payload))
        except ValueError:
            return
        if last > self._known:
            self._known = last
            if self._followers:
                self._relay_wakeup.set()

    async def _run_relay(self) -> None:
        """Read what other processes committed, once for every follower, and hand it out
        in position order with this store's own commits."""
        while True:
            await self._relay_wakeup.wait()
            self._relay_wakeup.clear()
            try:
                await self._catch_up()
            except StoreClosedError:
                return
            except Exception as exc:  # the followers find out by reading themselves
                log.warning("reading commits of other processes failed: %s", reason(exc))
                self._held.clear()
                self._followers.fall_behind()

    async def _catch_up(self) -> None:
        while self._followers and self._relayed < self._known:
            self._flush_held()
            if self._relayed >= self._known:
                return
            upto = self._held[0][0].position - 1 if self._held else self._known
            rows = await self.read(self._relayed, min(upto - self._relayed, FOLLOW_PAGE))
            fresh = [record for record in rows if record.position > self._relayed]
            if not fresh:
                if not rows:
                    return  # nothing visible yet past what was handed out
                continue  # this store's own commits were handed out meanwhile
            self._hand_out(fresh)  # (a gap, never expected, is the followers' to find)
        if not self._followers:
            self._held.clear()

    async def _listen(self) -> None:
        """Connect the listening connection; after a reconnect, catch up on what may have
        been committed meanwhile."""
        conn = await asyncpg.connect(self._dsn)
        try:
            await conn.add_listener(sql.CHANNEL, self._notified)
            conn.add_termination_listener(self._listener_lost)
            last = int(await conn.fetchval(sql.MAX_POSITION) or 0)
        except BaseException:
            conn.terminate()
            raise
        self._listener = conn
        if last > self._known:
            self._known = last
            if self._followers:
                self._relay_wakeup.set()

    def _listener_lost(self, _conn: object) -> None:
        if self._pool is None or self._listening is not None:
            return
        log.warning("the connection listening for commits of other processes was lost; "
                    "reconnecting")
        self._listener = None
        self._listening = asyncio.get_running_loop().create_task(self._relisten())

    async def _relisten(self) -> None:
        delay = RECONNECT_S[0]
        try:
            while self._pool is not None:
                try:
                    await self._listen()
                    return
                except (asyncpg.PostgresError, *CONNECTION_ERRORS) as exc:
                    log.warning("reconnecting the listening connection failed: %s",
                                reason(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_S[1])
        finally:
            self._listening = None


class _PostgresTransaction:
    """The writer's side of one PostgreSQL transaction (the position lock already held).

    `load_versions` reads the last position in the same round trip; `last_position` answers
    from it until this transaction inserts (with the lock held, nobody else can change it).
    """

    __slots__ = ("_conn", "_position", "last")

    def __init__(self, conn: asyncpg.Connection[Any]) -> None:
        self._conn = conn
        self._position: int | None = None
        self.last: int | None = None
        """The last position inserted, if rows were: the commit notifies it."""

    async def last_position(self) -> int:
        if self._position is None:
            self._position = int(await self._conn.fetchval(sql.MAX_POSITION) or 0)
        return self._position

    async def load_versions(self, streams: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for stream, value in await self._conn.fetch(sql.HEAD, list(streams)):
            if stream is None:
                self._position = int(value or 0)
            elif value is not None:
                found[stream] = int(value)
        return found

    async def find_events(self, event_ids: Sequence[str]) -> dict[str, RecordedEvent]:
        rows = await self._conn.fetch(sql.FIND, list(event_ids))
        return {row[3]: RecordedEvent(*row) for row in rows}

    async def insert(self, rows: Sequence[RecordedEvent]) -> None:
        self._position = None
        try:
            await self._conn.executemany(sql.INSERT, rows)
        except asyncpg.UniqueViolationError as exc:
            raise KeyConflict(reason(exc)) from exc
        if rows:
            self.last = rows[-1].position

    async def put_snapshot(self, snapshot: Snapshot, keep: int) -> None:
        conn = self._conn
        await conn.execute(sql.DELETE_SNAPSHOT, snapshot.position)
        await conn.execute(sql.INSERT_SNAPSHOT, *snapshot)
        await conn.execute(sql.KEEP_SNAPSHOTS, keep)

    async def delete_snapshots(self, positions: Sequence[int] | None) -> int:
        if positions is None:
            return sql.deleted(await self._conn.execute(sql.DELETE_ALL_SNAPSHOTS))
        return sql.deleted(await self._conn.execute(sql.DELETE_SNAPSHOTS, list(positions)))

    async def lease_rows(self, resources: Sequence[str] | None, lock: bool = False
                         ) -> tuple[int, dict[str, LeaseRow]]:
        now, rows = 0, {}
        if lock and resources is not None:  # (in the commit, under the position lock)
            found = await self._conn.fetch(sql.LOCK_LEASES, list(resources))
        else:
            found = await self._conn.fetch(
                sql.LEASE_ROWS, None if resources is None else list(resources))
        for resource, owner, epoch, expires_at in found:
            if resource is None:
                now = int(expires_at)
            else:
                rows[resource] = LeaseRow(resource, owner, int(epoch), int(expires_at))
        return now, rows

    async def swap_lease(self, old: LeaseRow | None, new: LeaseRow) -> bool:
        if old is None:
            return await self._conn.execute(sql.INSERT_LEASE, *new) == "INSERT 0 1"
        status = await self._conn.execute(sql.SWAP_LEASE, *new, *old[1:])
        return bool(status == "UPDATE 1")

    async def delete_leases(self, resources: Sequence[str]) -> None:
        await self._conn.execute(sql.DELETE_LEASES, list(resources))
