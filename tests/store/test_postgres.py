"""The contract suite against the PostgreSQL store, and what only a shared log does: several
stores (each as another process would be) appending to one database and following it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import asyncpg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect

from store import (
    Append,
    ConcurrencyError,
    GroupCommitStore,
    NewEvent,
    PostgresEventStore,
    RecordedEvent,
    WriteFailed,
    migrate,
    open_store,
    pg_server,
    pg_sql,
)
from store import postgres as postgres_module
from store.engine import create_engine, database_url
from store.migration import HEAD, alembic_config
from store.schema import metadata
from store.writer import DEFAULT_FOLLOWER_BUFFER, DEFAULT_MAX_BATCH

from ..conftest import TEMPLATE
from ..gateway.support import until
from .contract import (
    EventStoreContract,
    StoreFactory,
    _Gate,
    app,
    assert_gap_free,
    ev,
    fails,
    take,
    wait,
)


@pytest.fixture
def database_factory(postgres_server: pg_server.PostgresServer) -> Iterator[Callable[[], str]]:
    """Makes fresh migrated databases synchronously (the contract's factory is not async):
    the CREATE DATABASE runs on a thread of its own. Dropped after the test."""
    made: list[str] = []
    counter = iter(range(1_000_000))
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def make() -> str:
        name = f"contract_{id(made)}_{next(counter)}"
        made.append(name)
        return pool.submit(asyncio.run, pg_server.create_database(
            postgres_server.url, name, TEMPLATE)).result()

    yield make
    for name in made:
        pool.submit(asyncio.run, pg_server.drop_database(postgres_server.url, name)).result()
    pool.shutdown()


class TestPostgresEventStore(EventStoreContract):
    @pytest.fixture
    def make_store(self, database_factory: Callable[[], str]) -> StoreFactory:
        def make(
            *,
            clock: Callable[[], int] | None = None,
            max_batch: int = DEFAULT_MAX_BATCH,
            follower_buffer: int = DEFAULT_FOLLOWER_BUFFER,
        ) -> GroupCommitStore:
            return PostgresEventStore(
                database_factory(),
                clock=clock,
                max_batch=max_batch,
                follower_buffer=follower_buffer,
            )

        return make


@contextlib.asynccontextmanager
async def opened(url: str, **options: Any) -> AsyncIterator[PostgresEventStore]:
    """A store on ``url``, open for the block."""
    store = PostgresEventStore(url, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def _sql(url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def _reconnected(store: PostgresEventStore) -> bool:
    return store._listener is not None and store._listening is None


async def _waits_for_the_lock(url: str, pid: int) -> bool:
    rows = await _sql(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                      "AND NOT granted AND pid = $1", pid)
    return bool(rows[0][0])


# ---------------------------------------------------------------------- opening, migrations


async def test_open_store_takes_a_postgresql_url(postgres_url: str) -> None:
    for url in (postgres_url, postgres_url.replace("postgresql://", "postgresql+asyncpg://")):
        store = await open_store(url)
        try:
            assert isinstance(store, PostgresEventStore)
            await wait(store.append(app("s")))
        finally:
            await store.close()
    assert [tuple(r) for r in await _sql(postgres_url, "SELECT count(*) FROM events")] == [(2,)]


def test_only_postgresql_urls() -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        PostgresEventStore("sqlite:///events.db")


async def test_migrations_make_the_schema_of_the_metadata(
    postgres_server: pg_server.PostgresServer,
) -> None:
    url = await pg_server.create_database(postgres_server.url, "bare_for_migrations")
    try:
        await migrate(url)
        await migrate(url)  # already at head: nothing to do
        assert [tuple(r) for r in await _sql(url, "SELECT version_num FROM alembic_version")] \
            == [(HEAD,)]
        engine = create_engine(database_url(url))

        def differences(conn: Connection) -> list[Any]:
            return list(compare_metadata(MigrationContext.configure(conn), metadata))

        def columns(conn: Connection) -> dict[str, str]:
            return {c["name"]: str(c["type"]) for c in inspect(conn).get_columns("events")}

        try:
            async with engine.connect() as conn:
                assert await conn.run_sync(differences) == []
                assert (await conn.run_sync(columns))["position"] == "BIGINT"
        finally:
            await engine.dispose()
    finally:
        await pg_server.drop_database(postgres_server.url, "bare_for_migrations")


async def test_alembic_env_builds_its_own_engine_for_postgresql(
    postgres_server: pg_server.PostgresServer,
) -> None:
    """What the alembic CLI does: no connection handed over, only ``sqlalchemy.url``."""
    url = await pg_server.create_database(postgres_server.url, "bare_for_alembic")
    try:
        await asyncio.to_thread(command.upgrade, alembic_config(url), "head")
        assert [tuple(r) for r in await _sql(url, "SELECT version_num FROM alembic_version")] \
            == [(HEAD,)]
        await asyncio.to_thread(command.downgrade, alembic_config(url), "base")
        assert await _sql(url, "SELECT 1 FROM pg_tables WHERE tablename = 'events'") == []
    finally:
        await pg_server.drop_database(postgres_server.url, "bare_for_alembic")


def test_alembic_offline_sql_for_postgresql(capsys: pytest.CaptureFixture[str]) -> None:
    command.upgrade(alembic_config("postgresql://nobody@127.0.0.1:1/none"), "head", sql=True)
    out = capsys.readouterr().out
    assert "CREATE TABLE events" in out
    assert "position BIGINT NOT NULL" in out


async def test_processes_starting_together_migrate_one_after_the_other(
    postgres_server: pg_server.PostgresServer,
) -> None:
    url = await pg_server.create_database(postgres_server.url, "bare_for_racing")
    try:
        stores = [PostgresEventStore(url) for _ in range(4)]
        await wait(asyncio.gather(*(store.open() for store in stores)))
        try:
            results = await wait(asyncio.gather(*(s.append(app("s")) for s in stores)))
            assert sorted(r[0].position for r in results) == [1, 2, 3, 4]
        finally:
            await asyncio.gather(*(store.close() for store in stores))
    finally:
        await pg_server.drop_database(postgres_server.url, "bare_for_racing")


# ---------------------------------------------------------------------- several writers


async def test_two_stores_on_one_log_interleave_without_gaps(postgres_url: str) -> None:
    async with opened(postgres_url) as one, opened(postgres_url) as two:
        futures = []
        for i in range(60):
            futures += one.append_many([app(f"a{i % 3}"), app("shared")])
            futures += two.append_many([app(f"b{i % 3}"), app("shared", ev(), ev())])
            if i % 7 == 0:
                await asyncio.sleep(0)  # let both writers commit batches in between
        results = await wait(asyncio.gather(*futures))
        acked = sorted((r for result in results for r in result), key=lambda r: r.position)
        assert_gap_free(acked)
        assert await one.read() == acked
        assert [r.version for r in await two.read_stream("shared")] == list(range(1, 181))


async def test_a_stale_cache_never_decides_a_version(postgres_url: str) -> None:
    """Each write reads the versions again: what another process appended counts."""
    async with opened(postgres_url) as one, opened(postgres_url) as two:
        await wait(one.append(app("s", expected=0)))  # one's cache: s at 1
        await wait(two.append(app("s", ev(), ev(), expected=1)))  # s at 3 behind one's back
        error = await fails(one.append(app("s", expected=1)), ConcurrencyError)
        assert isinstance(error, ConcurrencyError)
        assert error.actual == 3
        [record] = await wait(one.append(app("s", expected=None)))
        assert (record.position, record.version) == (4, 4)
        [record] = await wait(two.append(app("s", expected=4)))
        assert (record.position, record.version) == (5, 5)


async def test_a_key_conflict_from_outside_the_lock_is_a_concurrency_error(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row another writer slipped in between the version read and the insert (one that
    did not take the lock): the batch is planned again from fresh reads."""
    async with opened(postgres_url) as store:
        await wait(store.append(app("s", expected=0)))
        real_insert = postgres_module._PostgresTransaction.insert

        async def insert_after_a_foreign_row(
            self: postgres_module._PostgresTransaction, rows: Sequence[RecordedEvent]
        ) -> None:
            # (on the writer's thread and loop: a connection of its own there)
            foreign = await asyncpg.connect(postgres_url)
            try:
                if not await foreign.fetchval(
                        "SELECT count(*) FROM events WHERE event_id = 'x'"):
                    await foreign.execute(
                        "INSERT INTO events VALUES (2, 's', 2, 'x', 'Foreign', '{}', 0)")
            finally:
                await foreign.close()
            await real_insert(self, rows)

        monkeypatch.setattr(postgres_module._PostgresTransaction, "insert",
                            insert_after_a_foreign_row)
        conflict, landed = store.append_many([app("s", expected=1), app("t")])
        error = await fails(conflict, ConcurrencyError)
        assert isinstance(error, ConcurrencyError)
        assert error.actual == 2
        assert [(r.position, r.version) for r in await wait(landed)] == [(3, 1)]
        assert [r.event_id for r in await store.read_stream("s")][1:] == ["x"]
        assert_gap_free(await store.read())


async def test_a_late_commit_is_never_skipped(postgres_url: str) -> None:
    """While one store's transaction holds inserted rows uncommitted, another store's append
    waits for it: positions become visible in order, and a follower sees both in order."""
    async with (opened(postgres_url) as slow, opened(postgres_url) as fast,
                opened(postgres_url) as watcher):
        gate = _Gate(slow)  # (its writer runs on a thread and loop of its own)
        async with contextlib.aclosing(watcher.follow()) as follower:
            first = slow.append(app("slow"))
            await wait(gate.entered.wait())
            second = fast.append(app("fast"))
            await until(lambda: _waits_for_the_lock(postgres_url, fast._writer_pid),
                        "the second store to wait for the position lock")
            assert not second.done()
            assert await watcher.read() == []
            gate.release.set()
            [a] = await wait(first)
            [b] = await wait(second)
            assert (a.position, b.position) == (1, 2)
            assert await take(follower, 2) == [a, b]


async def test_a_lock_held_too_long_fails_the_batch_and_the_store_goes_on(
    postgres_url: str,
) -> None:
    async with opened(postgres_url, lock_timeout_ms=200) as store:
        holder = await asyncpg.connect(postgres_url)
        try:
            await holder.execute("BEGIN")
            await holder.execute(f"SELECT pg_advisory_xact_lock({pg_sql.POSITION_LOCK})")
            error = await fails(store.append(app("s")), WriteFailed)
            assert "locked by another process" in str(error)
            assert "SELECT" not in str(error)
            await holder.execute("ROLLBACK")
        finally:
            await holder.close()
        [record] = await wait(store.append(app("s", expected=0)))
        assert record.position == 1


async def test_a_lost_writer_connection_is_made_again(postgres_url: str) -> None:
    async with opened(postgres_url) as store:
        await wait(store.append(app("s")))
        old_pid = store._writer_pid
        await _sql(postgres_url, "SELECT pg_terminate_backend($1)", old_pid)
        # This append fails if the driver had not yet seen the connection go, else it is
        # written on a new one; never half-written.
        [outcome] = await wait(asyncio.gather(store.append(app("s", expected=1)),
                                              return_exceptions=True))
        assert isinstance(outcome, list) or "connection" in str(outcome)
        await wait(store.append(app("t", expected=0)))
        assert store._writer_pid != old_pid
        assert [r.stream for r in await store.read()][-1] == "t"
        assert_gap_free(await store.read())


async def test_a_writer_connection_left_mid_operation_is_replaced(postgres_url: str) -> None:
    # An operation cut off on the writer's connection leaves its driver busy ("another
    # operation is in progress"): the next write connects again rather than fail on it.
    async with opened(postgres_url) as store:
        await wait(store.append(app("s")))
        old = store._writer_conn
        assert old is not None
        stuck = asyncio.ensure_future(old.execute("SELECT pg_sleep(30)"))
        await until(lambda: _sql_busy(postgres_url, store._writer_pid),
                    "the writer's connection to be busy")
        [record] = await wait(store.append(app("s", expected=1)))
        assert record.version == 2 and store._writer_conn is not old and old.is_closed()
        await asyncio.gather(stuck, return_exceptions=True)


async def test_a_renewal_cut_off_mid_operation_leaves_the_leases_usable(
    postgres_url: str,
) -> None:
    async with opened(postgres_url) as store:
        await store.join("m1", 60_000)
        holder = await asyncpg.connect(postgres_url)
        try:
            await holder.execute("BEGIN; LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
            for _ in range(3):  # (more than one: a pooled connection must not come back broken)
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.1):
                        await store.renew("m1", 60_000)
            await holder.execute("ROLLBACK")
        finally:
            await holder.close()
        for _ in range(2 * postgres_module.READ_POOL):
            await wait(store.renew("m1", 60_000))
        await wait(store.append(app("s")))


async def test_a_renewal_never_waits_for_reads_that_hold_every_pooled_connection(
    postgres_url: str,
) -> None:
    """Issue 23, 1b: during a takeover a member's reads (streams adopted and read again,
    leases looked up for forwards) took every pooled connection, and its renewals queued
    behind them past half the lease: live members lost their leases."""
    async with opened(postgres_url) as store:
        await store.join("m1", 60_000)
        assert store._pool is not None
        held = [await store._pool.acquire() for _ in range(postgres_module.READ_POOL)]
        try:
            async with asyncio.timeout(2.0):
                view = await store.renew("m1", 60_000)
            assert "m1" in view.members
        finally:
            for conn in held:
                await store._pool.release(conn)
        await wait(store.leases())  # (the pool's reads go on as before)


async def _sql_busy(url: str, pid: int) -> bool:
    rows = await _sql(url, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND "
                      "state = 'active' AND query LIKE '%pg_sleep%'", pid)
    return bool(rows[0][0])


# ---------------------------------------------------------------------- followers


async def test_a_follower_sees_what_another_store_appends(postgres_url: str) -> None:
    async with opened(postgres_url) as mine, opened(postgres_url) as theirs:
        async with contextlib.aclosing(mine.follow()) as follower:
            [a] = await wait(theirs.append(app("theirs")))
            assert await take(follower, 1) == [a]  # woken by the notification alone
            [b] = await wait(mine.append(app("mine")))
            c, d = await wait(asyncio.gather(theirs.append(app("theirs")),
                                             mine.append(app("mine"))))
            got = await take(follower, 3)
        assert got == sorted([b, *c, *d], key=lambda r: r.position)
        assert_gap_free([a, *got])


async def test_followers_of_two_stores_see_one_log_while_both_append(
    postgres_url: str,
) -> None:
    total = 200
    async with opened(postgres_url) as one, opened(postgres_url) as two:
        followers = [one.follow(), two.follow(), one.follow(50)]

        async def produce(store: PostgresEventStore, tag: str) -> None:
            for i in range(0, total // 2, 5):
                await asyncio.gather(*store.append_many(
                    [app(f"{tag}{(i + j) % 3}") for j in range(5)]))

        try:
            got = await wait(asyncio.gather(
                take(followers[0], total), take(followers[1], total),
                take(followers[2], total - 50), produce(one, "a"), produce(two, "b")))
        finally:
            for follower in followers:
                await follower.aclose()
        log = await one.read()
        assert got[0] == log
        assert got[1] == log
        assert got[2] == log[50:]


async def test_a_lost_listening_connection_is_made_again(postgres_url: str) -> None:
    async with (opened(postgres_url) as mine, opened(postgres_url) as theirs,
                contextlib.aclosing(mine.follow()) as follower):
        assert mine._listener is not None
        await _sql(postgres_url, "SELECT pg_terminate_backend($1)",
                   mine._listener.get_server_pid())
        # Appends go on while it reconnects; every one reaches the follower.
        appended = await wait(theirs.append(app("theirs")))
        await until(lambda: _reconnected(mine), "the listening connection to be made again")
        appended += await wait(theirs.append(app("theirs")))
        assert await take(follower, 2) == appended


def _events(count: int) -> list[NewEvent]:
    return [ev() for _ in range(count)]


async def test_restore_continues_a_log_another_store_wrote(postgres_url: str) -> None:
    async with opened(postgres_url) as one, opened(postgres_url) as two:
        await wait(two.append(Append("a", _events(2), 0)))
        await wait(one.restore([RecordedEvent(3, "a", 3, "r3", "T", "{}", 5)]))
        assert [r.event_id for r in await two.read()][2:] == ["r3"]
