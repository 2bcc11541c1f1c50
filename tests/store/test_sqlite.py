"""The contract suite against the SQLite store, and what only SQLite does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from store import (
    Append,
    ConcurrencyError,
    GroupCommitStore,
    NewEvent,
    NotAnEventLog,
    RecordedEvent,
    SqliteEventStore,
    StoreClosedError,
    StoreError,
    WriteFailed,
    check_event_log,
    migrate,
    open_store,
)
from store.migration import HEAD, alembic_config
from store.schema import metadata
from store.sqlite import _SqliteTransaction
from store.writer import DEFAULT_FOLLOWER_BUFFER, DEFAULT_MAX_BATCH

from .contract import (
    EventStoreContract,
    StoreFactory,
    app,
    assert_gap_free,
    ev,
    fails,
    take,
    wait,
)


class TestSqliteEventStore(EventStoreContract):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        counter = iter(range(1_000_000))

        def make(
            *,
            clock: Callable[[], int] | None = None,
            max_batch: int = DEFAULT_MAX_BATCH,
            follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
        ) -> GroupCommitStore:
            return SqliteEventStore(
                tmp_path / f"events-{next(counter)}.db",
                clock=clock,
                max_batch=max_batch,
                follower_buffer=follower_buffer,
            )

        return make


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A path for a database file that does not exist yet."""
    return tmp_path / "gateway.db"


@pytest.fixture
async def sqlite_store(db_path: Path) -> AsyncGenerator[SqliteEventStore, None]:
    """An opened SQLite store on ``db_path``."""
    store = SqliteEventStore(db_path)
    await store.open()
    yield store
    await store.close()


def _query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


def _execute(path: Path, sql: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(sql)
        db.commit()


# ---------------------------------------------------------------------- migrations


async def test_open_migrates_an_empty_file(db_path: Path) -> None:
    store = SqliteEventStore(db_path)
    await store.open()
    await store.close()
    assert _query(db_path, "SELECT version_num FROM alembic_version") == [(HEAD,)]
    columns = [row[1] for row in _query(db_path, "PRAGMA table_info(events)")]
    assert columns == ["position", "stream", "version", "event_id", "type", "data", "recorded_at"]
    # position is the rowid alias: no index backs the primary key.
    origins = {row[1]: row[3] for row in _query(db_path, "PRAGMA index_list(events)")}
    assert "pk" not in origins.values()
    assert origins["ix_events_type"] == "c"
    assert sorted(origins.values()) == ["c", "u", "u"]
    plan = _query(db_path, "EXPLAIN QUERY PLAN SELECT * FROM events WHERE position > 5")
    assert "INTEGER PRIMARY KEY" in plan[0][-1]


@pytest.mark.parametrize("form", ["path", "sqlite", "aiosqlite"])
async def test_migrate_takes_a_path_or_url(db_path: Path, form: str) -> None:
    target = {
        "path": str(db_path),
        "sqlite": f"sqlite:///{db_path}",
        "aiosqlite": f"sqlite+aiosqlite:///{db_path}",
    }[form]
    await migrate(target)
    await migrate(target)  # already at head: nothing to do
    assert _query(db_path, "SELECT version_num FROM alembic_version") == [(HEAD,)]
    assert _query(db_path, "PRAGMA journal_mode") == [("wal",)]
    store = SqliteEventStore(target)
    await store.open()
    try:
        assert (await wait(store.append(app("s"))))[0].position == 1
    finally:
        await store.close()


async def test_migrated_schema_matches_the_metadata(db_path: Path) -> None:
    await migrate(db_path)
    engine = sqlalchemy.create_engine(f"sqlite:///{db_path}")
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn)
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_alembic_env_builds_its_own_engine(db_path: Path) -> None:
    """What the alembic CLI does: no connection handed over, only ``sqlalchemy.url``."""
    command.upgrade(alembic_config(f"sqlite:///{db_path}"), "head")
    assert _query(db_path, "SELECT version_num FROM alembic_version") == [(HEAD,)]
    command.downgrade(alembic_config(f"sqlite:///{db_path}"), "base")
    assert _query(db_path, "SELECT name FROM sqlite_master WHERE name = 'events'") == []


def test_alembic_offline_sql(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command.upgrade(alembic_config(f"sqlite:///{db_path}"), "head", sql=True)
    assert "CREATE TABLE events" in capsys.readouterr().out
    assert not db_path.exists()


async def test_upgrading_a_log_of_revision_0001_keeps_its_events(db_path: Path) -> None:
    await migrate(db_path, "0001")
    _execute(db_path, "INSERT INTO events VALUES (1, 'a', 1, 'e1', 'T', '{}', 7)")
    assert _query(db_path, "SELECT name FROM sqlite_master WHERE name = 'snapshots'") == []
    store = SqliteEventStore(db_path)
    await store.open()
    try:
        assert [r.event_id for r in await store.read()] == ["e1"]
        assert await store.snapshots() == []
    finally:
        await store.close()
    assert _query(db_path, "SELECT version_num FROM alembic_version") == [(HEAD,)]


# ---------------------------------------------------------------------- what a path holds


async def test_check_event_log_accepts_a_log_of_any_revision(db_path: Path) -> None:
    await migrate(db_path, "0001")
    await check_event_log(db_path)
    assert _query(db_path, "SELECT version_num FROM alembic_version") == [("0001",)]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda path: None, "no event log at"),
        (lambda path: path.mkdir(), "is not a file"),
        (lambda path: path.write_text("hello, not a database " * 100), "is not an event log"),
        (lambda path: _execute(path, "CREATE TABLE t (x)"), "without an events table"),
    ],
    ids=["missing", "directory", "text file", "other database"],
)
async def test_check_event_log_refuses_what_is_not_a_log(
    db_path: Path, make: Callable[[Path], None], message: str
) -> None:
    make(db_path)
    before = {p.name: p.read_bytes() for p in db_path.parent.iterdir() if p.is_file()}
    with pytest.raises(NotAnEventLog, match=message):
        await check_event_log(db_path)
    after = {p.name: p.read_bytes() for p in db_path.parent.iterdir() if p.is_file()}
    assert after == before  # nothing created or changed


# ---------------------------------------------------------------------- reopening


async def test_reopen_continues_positions_and_versions(db_path: Path) -> None:
    store = SqliteEventStore(db_path)
    await store.open()
    first = await wait(store.append(app("s", ev(), ev(), expected=0)))
    await wait(store.append(app("t", expected=0)))
    await store.close()

    store = SqliteEventStore(db_path)
    await store.open()
    try:
        assert await store.last_position() == 3
        assert await store.stream_versions() == {"s": 2, "t": 1}
        await fails(store.append(app("s", expected=0)), ConcurrencyError)
        [record] = await wait(store.append(app("s", expected=2)))
        assert (record.position, record.version) == (4, 3)
        # Idempotency holds across restarts.
        assert (
            await wait(
                store.append(
                    app("s", *[NewEvent(r.event_id, r.type, r.data) for r in first], expected=0)
                )
            )
            == first
        )
        assert_gap_free(await store.read())
    finally:
        await store.close()


async def test_open_store_sqlite(db_path: Path) -> None:
    store = await open_store(db_path, synchronous="normal")
    try:
        assert isinstance(store, SqliteEventStore)
        await wait(store.append(app("s")))
    finally:
        await store.close()
    assert _query(db_path, "SELECT count(*) FROM events") == [(1,)]


# ---------------------------------------------------------------------- pragmas


async def _pragmas(conn: AsyncConnection) -> dict[str, Any]:
    names = ["journal_mode", "synchronous", "busy_timeout", "foreign_keys"]
    return {name: (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar() for name in names}


async def test_pragmas_default_to_wal_and_full(sqlite_store: SqliteEventStore) -> None:
    expected = {"journal_mode": "wal", "synchronous": 2, "busy_timeout": 5000, "foreign_keys": 1}
    async with sqlite_store.engine.connect() as conn:
        assert await _pragmas(conn) == expected

    found = {name: await sqlite_store.writer_query(f"PRAGMA {name}") for name in expected}
    assert found == expected  # the writer process's connection has them too


async def test_synchronous_is_configurable(db_path: Path) -> None:
    store = SqliteEventStore(db_path, synchronous="NORMAL")
    await store.open()
    try:
        async with store.engine.connect() as conn:
            assert (await _pragmas(conn))["synchronous"] == 1
    finally:
        await store.close()
    with pytest.raises(ValueError, match="synchronous"):
        SqliteEventStore(db_path, synchronous="sometimes")


def test_only_sqlite_urls(db_path: Path) -> None:
    with pytest.raises(ValueError, match="SQLite"):
        SqliteEventStore("postgresql+asyncpg://localhost/db")


# ---------------------------------------------------------------------- failures


async def test_failing_transaction_fails_the_batch_and_the_store_goes_on(
    db_path: Path, sqlite_store: SqliteEventStore
) -> None:
    store = sqlite_store
    await wait(store.append(app("s", expected=0)))
    _execute(
        db_path,
        "CREATE TRIGGER events_read_only BEFORE INSERT ON events "
        "BEGIN SELECT RAISE(ABORT, 'events are read-only'); END",
    )
    futures = store.append_many([app("s", expected=1), app("t", ev(), ev()), app("u")])
    for future in futures:
        error = await fails(future, StoreError)
        assert type(error) is WriteFailed
        assert "events are read-only" in str(error)
        assert "INSERT" not in str(error)
    assert await store.last_position() == 1
    _execute(db_path, "DROP TRIGGER events_read_only")
    # Caches were left as they were: the same versions work, positions have no gap.
    results = await wait(
        asyncio.gather(*store.append_many([app("s", expected=1), app("t", expected=0)]))
    )
    assert [(r[0].position, r[0].version) for r in results] == [(2, 2), (3, 1)]
    assert_gap_free(await store.read())


async def test_error_after_insert_rolls_back(
    sqlite_store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    await wait(store.append(app("s", expected=0)))
    real_insert = _SqliteTransaction.insert

    async def insert_then_fail(self: _SqliteTransaction, rows: Sequence[RecordedEvent]) -> None:
        await real_insert(self, rows)  # the rows are in the transaction; the commit never comes
        raise OperationalError(
            "INSERT INTO events ...", None, sqlite3.OperationalError("database or disk is full")
        )

    monkeypatch.setattr(_SqliteTransaction, "insert", insert_then_fail)
    error = await fails(store.append(app("s", expected=1)), StoreError)
    assert "database or disk is full" in str(error)
    assert "INSERT" not in str(error)
    monkeypatch.undo()
    assert await store.last_position() == 1
    [record] = await wait(store.append(app("s", expected=1)))
    assert (record.position, record.version) == (2, 2)


async def test_failing_commit_fails_the_batch(
    sqlite_store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    await wait(store.append(app("s", expected=0)))

    def failing_commit(self: _SqliteTransaction) -> None:
        raise sqlite3.OperationalError("disk I/O error")  # the rows went in; the COMMIT fails

    monkeypatch.setattr(_SqliteTransaction, "commit", failing_commit)
    futures = store.append_many([app("s", expected=1), app("t")])
    for future in futures:
        error = await fails(future, StoreError)
        assert "disk I/O error" in str(error)
    monkeypatch.undo()
    assert await store.last_position() == 1
    results = await wait(asyncio.gather(*store.append_many([app("t"), app("s", expected=1)])))
    assert [(r[0].position, r[0].version) for r in results] == [(2, 1), (3, 2)]


async def test_follower_behind_at_close_raises(db_path: Path) -> None:
    """After close a follower can still drain its buffer, but it cannot read any more."""
    store = SqliteEventStore(db_path, follower_buffer=2)
    await store.open()
    async with contextlib.aclosing(store.follow()) as follower:
        await wait(store.append(app("s")))
        await take(follower, 1)
        await wait(store.append(app("s", ev(), ev(), ev())))  # overflows: must read
        await store.close()
        with pytest.raises(StoreClosedError):
            await wait(anext(follower))


async def test_reads_after_close_fail(db_path: Path) -> None:
    store = SqliteEventStore(db_path)
    await store.open()
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.read()


async def test_a_second_process_writing_is_detected(
    db_path: Path, sqlite_store: SqliteEventStore
) -> None:
    """Someone else wrote behind the writer's back: the batch fails and nothing is corrupted."""
    store = sqlite_store
    await wait(store.append(app("s", expected=0)))
    _execute(
        db_path,
        "INSERT INTO events VALUES (2, 'x', 1, 'foreign', 'T', '{}', 0)",
    )
    error = await fails(store.append(app("t")), StoreError)
    assert "UNIQUE" in str(error)
    assert _query(db_path, "SELECT count(*) FROM events") == [(2,)]


# ---------------------------------------------------------------------- volume


async def test_the_writer_writes_big_and_many_appends_back_to_back(tmp_path: Path) -> None:
    """80,000 rows in 40 appends of 1000 events and 40,000 appends of one: all read back, in
    order, once. (How fast is a benchmark's question: ``uv run python -m bench.throughput``.)"""
    batches, size = 40, 1000
    data = '{"symbol": "AAPL", "side": "buy", "qty": 10, "price": 123.45}'
    store = SqliteEventStore(tmp_path / "store.db")
    await store.open()
    try:
        for b in range(batches):
            events = [NewEvent(f"a{b}-{i}", "T", data) for i in range(size)]
            await wait(store.append(Append(f"big{b}", events, 0)))
        for b in range(batches):
            appends = [
                Append(f"s{i % 50}", [NewEvent(f"b{b}-{i}", "T", data)], None) for i in range(size)
            ]
            await wait(asyncio.gather(*store.append_many(appends)))
        log = await store.read()
    finally:
        await store.close()
    assert len(log) == 2 * batches * size
    assert_gap_free(log)
    assert {r.event_id for r in log} == {f"{tag}{b}-{i}" for tag in "ab"
                                         for b in range(batches) for i in range(size)}


# ------------------------------------------------------------- the writer process


def _writer_pid(store: SqliteEventStore) -> int:
    writer = store._writer_process
    assert writer is not None and writer.pid is not None
    return writer.pid


async def test_a_writer_process_killed_between_commits_is_replaced_before_the_next(
    sqlite_store: SqliteEventStore,
) -> None:
    """The process that writes the log dies while the store is idle: the next append is
    written by a new one, and nothing is failed for it."""
    store = sqlite_store
    await wait(store.append(app("s", expected=0)))
    first = _writer_pid(store)
    os.kill(first, signal.SIGKILL)
    await asyncio.wait_for(asyncio.to_thread(_reaped_or_gone, first), 10)
    # (its end reaches the store once the loop reads the socket's end of file)
    for _ in range(1_000):
        writer = store._writer_process
        if writer is None or writer.broken:
            break
        await asyncio.sleep(0)
    await wait(store.append(app("s", expected=1)))
    assert _writer_pid(store) != first
    assert [r.version for r in await store.read_stream("s")] == [1, 2]


async def test_a_writer_process_killed_mid_commit_fails_that_commit_alone(
    sqlite_store: SqliteEventStore,
) -> None:
    """Stopped (SIGSTOP) with a commit sent to it, then killed: that commit fails with
    `WriteFailed`, the event loop answered all along, and the next append is written by a
    new process (and the failed one is not in the log)."""
    store = sqlite_store
    await wait(store.append(app("s", expected=0)))
    pid = _writer_pid(store)
    os.kill(pid, signal.SIGSTOP)
    try:
        stuck = store.append(app("t", expected=0))
        for _ in range(1_000):  # until the writer task has sent it
            if store._inflight:
                break
            await asyncio.sleep(0)
        assert store._inflight
        # The loop goes on meanwhile (it waits for no thread): reads answer.
        assert [r.stream for r in await store.read()] == ["s"]
        assert not stuck.done()
    finally:
        os.kill(pid, signal.SIGKILL)
    error = await fails(stuck, StoreError)
    assert type(error) is WriteFailed
    assert "writer process ended" in str(error)
    await wait(store.append(app("u", expected=0)))
    assert [r.stream for r in await store.read()] == ["s", "u"]


def _reaped_or_gone(pid: int) -> None:
    """Wait until process ``pid`` has ended (a child of this process: reap it)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
