"""The event store contract: every adapter runs this suite.

An adapter's test module subclasses :class:`EventStoreContract` and overrides the
``make_store`` fixture with a factory of unopened stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import (
    Append,
    ConcurrencyError,
    DuplicateEventError,
    EventStore,
    Fence,
    FencedError,
    GroupCommitStore,
    LeaseLost,
    Leases,
    NewEvent,
    RecordedEvent,
    RestoreError,
    Snapshot,
    StoreClosedError,
    StoreError,
)
from store.writer import WriteTransaction

TIMEOUT = 10.0
"""Seconds any single wait in these tests may take before the test fails."""

T = TypeVar("T")


class StoreFactory(Protocol):
    """Builds an unopened store of the adapter under test."""

    def __call__(
        self,
        *,
        clock: Callable[[], int] | None = None,
        max_batch: int = ...,
        follower_buffer: int = ...,
    ) -> GroupCommitStore: ...


_ids = itertools.count(1)


def ev(event_id: str | None = None, type_: str = "Tested", data: str = "{}") -> NewEvent:
    """A new event with a fresh id unless one is given."""
    return NewEvent(event_id or f"ev-{next(_ids)}", type_, data)


def app(stream: str, *events: NewEvent, expected: int | None = None) -> Append:
    """An append of ``events`` (one fresh event if none) to ``stream``."""
    return Append(stream, list(events) or [ev()], expected)


LIVE_MS = 600_000
"""A member lease that does not expire during a test."""


async def wait(awaitable: Awaitable[T]) -> T:
    """Await with the test timeout."""
    return await asyncio.wait_for(awaitable, TIMEOUT)


async def fails(awaitable: Awaitable[Any], error: type[BaseException]) -> BaseException:
    """Await, expecting ``error``; return it."""
    with pytest.raises(error) as info:
        await wait(awaitable)
    return info.value


async def take(it: AsyncIterator[RecordedEvent], count: int) -> list[RecordedEvent]:
    """The next ``count`` events of a follower."""
    return [await wait(anext(it)) for _ in range(count)]


async def produce(store: GroupCommitStore, total: int) -> None:
    """``total`` appends over four streams, ten at a time, each ten waiting for their commit."""
    for i in range(0, total, 10):
        await asyncio.gather(*store.append_many([app(f"s{(i + j) % 4}") for j in range(10)]))


def assert_gap_free(records: Sequence[RecordedEvent], first: int = 1) -> None:
    """Positions are exactly ``first``, ``first + 1``, ..."""
    assert [r.position for r in records] == list(range(first, first + len(records)))


class _Gate:
    """Holds every write transaction open (before its commit) until released (on whichever
    loop, and thread, the store's writer runs)."""

    def __init__(self, store: GroupCommitStore) -> None:
        loop = asyncio.get_running_loop()
        self.entered = asyncio.Event()
        self.release = threading.Event()
        inner = store._transaction

        @contextlib.asynccontextmanager
        async def gated() -> AsyncIterator[WriteTransaction]:
            async with inner() as txn:
                yield txn
                loop.call_soon_threadsafe(self.entered.set)
                await asyncio.to_thread(self.release.wait, TIMEOUT)

        store._transaction = gated  # type: ignore[method-assign]


class _Model:
    """The reference semantics of appends, one at a time."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, str]] = []
        self.by_id: dict[str, tuple[int, str]] = {}
        self.versions: dict[str, int] = {}

    def apply(self, append: Append) -> list[int] | type[StoreError]:
        """Positions the append resolves to, or the error it fails with."""
        ids = [e.event_id for e in append.events]
        if len(set(ids)) != len(ids):
            return DuplicateEventError
        found = [self.by_id[i] for i in ids if i in self.by_id]
        if found:
            if len(found) == len(ids) and all(s == append.stream for _, s in found):
                return [p for p, _ in found]
            return DuplicateEventError
        version = self.versions.get(append.stream, 0)
        if append.expected_version is not None and append.expected_version != version:
            return ConcurrencyError
        positions = []
        for event_id in ids:
            version += 1
            self.log.append((append.stream, version, event_id))
            self.by_id[event_id] = (len(self.log), append.stream)
            positions.append(len(self.log))
        self.versions[append.stream] = version
        return positions


_streams = st.sampled_from(["a", "b", "c"])
_event_ids = st.lists(st.sampled_from([f"id{i}" for i in range(12)]), min_size=1, max_size=3)
_expected = st.one_of(st.none(), st.integers(min_value=0, max_value=6))
_appends = st.builds(
    lambda stream, ids, expected: Append(stream, [NewEvent(i, "T", "{}") for i in ids], expected),
    _streams,
    _event_ids,
    _expected,
)
_rounds = st.lists(st.lists(_appends, min_size=1, max_size=8), min_size=1, max_size=4)


class EventStoreContract:
    """Behaviour every :class:`~store.port.EventStore` adapter must show."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        """Overridden by each adapter: a factory of unopened stores."""
        raise NotImplementedError

    @pytest.fixture
    async def store(self, make_store: StoreFactory) -> AsyncGenerator[GroupCommitStore, None]:
        """An opened store, closed after the test."""
        store = make_store()
        await store.open()
        yield store
        await store.close()

    # ------------------------------------------------------------------ basics

    async def test_is_an_event_store(self, store: GroupCommitStore) -> None:
        port: EventStore = store
        assert await port.last_position() == 0
        assert await port.read() == []
        assert await port.stream_versions() == {}

    async def test_append_and_read_back(self, store: GroupCommitStore) -> None:
        a, b = ev(data='{"n": 1}'), ev(type_="Other", data='{"n": 2}')
        recorded = await wait(store.append(app("s1", a, b, expected=0)))
        assert [(r.position, r.stream, r.version) for r in recorded] == [(1, "s1", 1), (2, "s1", 2)]
        assert [(r.event_id, r.type, r.data) for r in recorded] == [
            (a.event_id, a.type, a.data),
            (b.event_id, b.type, b.data),
        ]
        assert await store.read() == recorded
        assert await store.read_stream("s1") == recorded
        assert await store.last_position() == 2
        assert await store.stream_versions() == {"s1": 2}

    async def test_recorded_at_comes_from_the_clock(self, make_store: StoreFactory) -> None:
        ticks = iter(range(1_000, 2_000, 10))
        store = make_store(clock=lambda: next(ticks))
        await store.open()
        try:
            first = await wait(store.append(app("s")))
            second = await wait(store.append(app("s")))
            assert first[0].recorded_at == 1_000
            assert second[0].recorded_at == 1_010
            assert [r.recorded_at for r in await store.read()] == [1_000, 1_010]
        finally:
            await store.close()

    async def test_default_clock_is_wall_clock_ms(self, store: GroupCommitStore) -> None:
        before = time.time_ns() // 1_000_000
        [record] = await wait(store.append(app("s")))
        after = time.time_ns() // 1_000_000
        assert before <= record.recorded_at <= after

    async def test_malformed_appends_raise_at_once(self, store: GroupCommitStore) -> None:
        with pytest.raises(ValueError, match="no events"):
            store.append(Append("s", [], 0))
        with pytest.raises(ValueError, match="stream"):
            store.append(Append("", [ev()], 0))
        with pytest.raises(ValueError, match="stream"):
            store.append(Append("x" * 201, [ev()], 0))
        with pytest.raises(ValueError, match="event id"):
            store.append(Append("s", [NewEvent("i" * 101, "T", "{}")], 0))
        with pytest.raises(ValueError, match="event type"):
            store.append(Append("s", [NewEvent("i", "", "{}")], 0))
        with pytest.raises(ValueError, match="expected_version"):
            store.append(Append("s", [ev()], -1))
        # append_many validates everything before enqueuing anything.
        with pytest.raises(ValueError, match="no events"):
            store.append_many([app("s"), Append("s", [], None)])
        with pytest.raises(ValueError, match="limit"):
            await store.read(0, -1)
        assert await store.last_position() == 0

    # ------------------------------------------------------------------ versions

    async def test_version_conflict_writes_nothing(self, store: GroupCommitStore) -> None:
        await wait(store.append(app("s", expected=0)))
        error = await fails(store.append(app("s", ev(), ev(), expected=0)), ConcurrencyError)
        assert isinstance(error, ConcurrencyError)
        assert (error.stream, error.expected, error.actual) == ("s", 0, 1)
        error = await fails(store.append(app("s", expected=5)), ConcurrencyError)
        assert isinstance(error, ConcurrencyError)
        assert error.actual == 1
        assert await store.last_position() == 1
        assert await store.stream_versions() == {"s": 1}
        # The stream is still appendable at its real version.
        [record] = await wait(store.append(app("s", expected=1)))
        assert (record.position, record.version) == (2, 2)

    async def test_new_stream_expects_zero(self, store: GroupCommitStore) -> None:
        await fails(store.append(app("fresh", expected=1)), ConcurrencyError)
        [record] = await wait(store.append(app("fresh", expected=0)))
        assert record.version == 1

    async def test_none_skips_the_version_check(self, store: GroupCommitStore) -> None:
        await wait(store.append(app("s", expected=0)))
        recorded = await wait(store.append(app("s", ev(), ev(), expected=None)))
        assert [r.version for r in recorded] == [2, 3]

    async def test_conflicts_in_one_batch_do_not_break_the_others(
        self, store: GroupCommitStore
    ) -> None:
        await wait(store.append(app("old", ev(), ev(), expected=0)))
        futures = store.append_many(
            [
                app("s1", expected=0),  # ok: s1 -> 1
                app("old", expected=0),  # conflict: old is at 2
                app("s2", ev(), ev(), expected=0),  # ok: s2 -> 2
                app("s1", expected=1),  # ok: sees the first append of the batch
                app("s1", expected=1),  # conflict: s1 is now at 2
                app("old", expected=2),  # ok
                app("s2", expected=None),  # ok: s2 -> 3
            ]
        )
        results = await wait(asyncio.gather(*futures, return_exceptions=True))
        assert isinstance(results[1], ConcurrencyError)
        assert results[1].actual == 2
        assert isinstance(results[4], ConcurrencyError)
        assert results[4].actual == 2
        ok = [r for r in results if isinstance(r, list)]
        assert [[(e.stream, e.version) for e in r] for r in ok] == [
            [("s1", 1)],
            [("s2", 1), ("s2", 2)],
            [("s1", 2)],
            [("old", 3)],
            [("s2", 3)],
        ]
        log = await store.read()
        assert_gap_free(log)
        assert [e.position for r in ok for e in r] == [3, 4, 5, 6, 7, 8]
        assert await store.stream_versions() == {"old": 3, "s1": 2, "s2": 3}

    # ------------------------------------------------------------------ idempotency

    async def test_idempotent_reappend_returns_originals(self, store: GroupCommitStore) -> None:
        a, b = ev(), ev()
        original = await wait(store.append(app("s", a, b, expected=0)))
        await wait(store.append(app("s", expected=2)))
        # A retry with the original expected version, with none, and with the ids reordered.
        assert await wait(store.append(app("s", a, b, expected=0))) == original
        assert await wait(store.append(app("s", a, b, expected=None))) == original
        assert await wait(store.append(app("s", b, a, expected=7))) == original[::-1]
        assert await wait(store.append(app("s", b, expected=0))) == original[1:]
        assert await store.last_position() == 3

    async def test_idempotent_reappend_in_the_same_batch(self, store: GroupCommitStore) -> None:
        a, b = ev(), ev()
        first, second, third = store.append_many(
            [app("s", a, b, expected=0), app("s", a, b, expected=0), app("s", expected=2)]
        )
        original = await wait(first)
        assert await wait(second) == original
        assert [r.version for r in await wait(third)] == [3]
        assert_gap_free(await store.read())
        assert await store.last_position() == 3

    async def test_idempotent_reappend_mixed_with_new_appends(
        self, store: GroupCommitStore
    ) -> None:
        a = ev()
        original = await wait(store.append(app("s", a, expected=0)))
        # The stored id is only found on the insert; the other appends must still land.
        futures = store.append_many([app("t"), app("s", a, expected=None), app("t")])
        first, retry, last = await wait(asyncio.gather(*futures))
        assert retry == original
        assert [r.position for r in first + last] == [2, 3]
        assert_gap_free(await store.read())

    async def test_partial_duplicate_is_rejected(self, store: GroupCommitStore) -> None:
        a, b, c = ev(), ev(), ev()
        await wait(store.append(app("s", a, b, expected=0)))
        for attempt in (
            app("s", a, c, expected=2),
            app("s", c, b, expected=None),
            app("s", c, a, b, expected=0),
        ):
            await fails(store.append(attempt), DuplicateEventError)
        assert await store.last_position() == 2
        assert c.event_id not in {r.event_id for r in await store.read()}
        # The same within one batch: the duplicate fails, the others land.
        d = ev()
        futures = store.append_many([app("s", d, expected=2), app("s", d, c, expected=3), app("u")])
        results = await wait(asyncio.gather(*futures, return_exceptions=True))
        assert isinstance(results[1], DuplicateEventError)
        assert isinstance(results[0], list)
        assert isinstance(results[2], list)
        assert_gap_free(await store.read())
        assert await store.last_position() == 4

    async def test_ids_recorded_in_another_stream_are_rejected(
        self, store: GroupCommitStore
    ) -> None:
        a = ev()
        await wait(store.append(app("s", a)))
        error = await fails(store.append(app("other", a, expected=0)), DuplicateEventError)
        assert "'s'" in str(error)
        futures = store.append_many([app("x", (b := ev())), app("y", b)])
        results = await wait(asyncio.gather(*futures, return_exceptions=True))
        assert isinstance(results[0], list)
        assert isinstance(results[1], DuplicateEventError)
        assert await store.stream_versions() == {"s": 1, "x": 1}

    async def test_repeated_id_in_one_append_is_rejected(self, store: GroupCommitStore) -> None:
        a = ev()
        await fails(store.append(app("s", a, a)), DuplicateEventError)
        assert await store.last_position() == 0

    # ------------------------------------------------------------------ atomicity & order

    async def test_multi_event_append_is_atomic(self, store: GroupCommitStore) -> None:
        await wait(store.append(app("s", expected=0)))
        other = store.append(app("t"))
        three = store.append(app("s", ev(), ev(), ev(), expected=1))
        await wait(other)
        recorded = await wait(three)
        assert [r.position for r in recorded] == [3, 4, 5]
        assert [r.version for r in recorded] == [2, 3, 4]
        await fails(store.append(app("s", ev(), ev(), ev(), expected=1)), ConcurrencyError)
        assert await store.last_position() == 5
        assert [r.version for r in await store.read_stream("s")] == [1, 2, 3, 4]

    async def test_appends_are_ordered_as_called(self, store: GroupCommitStore) -> None:
        appends = [app(f"s{i % 3}") for i in range(30)]
        futures = [store.append(a) for a in appends[:10]] + store.append_many(appends[10:])
        results = await wait(asyncio.gather(*futures))
        assert [r[0].position for r in results] == list(range(1, 31))
        assert [r[0].event_id for r in results] == [a.events[0].event_id for a in appends]

    async def test_max_batch_splits_batches(self, make_store: StoreFactory) -> None:
        store = make_store(max_batch=3)
        await store.open()
        try:
            big = app("big", *[ev() for _ in range(5)])  # bigger than a batch: goes whole
            futures = store.append_many([app("a"), app("a"), app("a"), app("a"), big, app("b")])
            results = await wait(asyncio.gather(*futures))
            assert [len(r) for r in results] == [1, 1, 1, 1, 5, 1]
            assert_gap_free(await store.read())
        finally:
            await store.close()

    async def test_concurrent_appenders_are_gap_free(self, store: GroupCommitStore) -> None:
        tasks, per_task, streams = 50, 40, 17

        async def appender(task: int) -> list[RecordedEvent]:
            mine: list[RecordedEvent] = []
            for i in range(per_task):
                stream = f"shared-{(task + i) % streams}"
                events = [ev() for _ in range(1 + (task + i) % 3)]
                mine += await store.append(app(stream, *events))
                # Also one private stream with optimistic versions.
                mine += await store.append(app(f"own-{task}", expected=i))
            return mine

        results = await wait(asyncio.gather(*(appender(t) for t in range(tasks))))
        total = sum(len(r) for r in results)
        log = await store.read()
        assert len(log) == total
        assert_gap_free(log)
        assert sorted(e.position for r in results for e in r) == list(range(1, total + 1))
        versions: dict[str, list[int]] = {}
        for record in log:
            versions.setdefault(record.stream, []).append(record.version)
        for stream, seen in versions.items():
            assert seen == list(range(1, len(seen) + 1)), stream
        assert await store.stream_versions() == {s: len(v) for s, v in versions.items()}
        assert await store.last_position() == total

    async def test_contending_writers_with_retries(self, store: GroupCommitStore) -> None:
        async def increment(times: int) -> int:
            conflicts = 0
            done = 0
            while done < times:
                version = len(await store.read_stream("counter"))
                try:
                    await store.append(app("counter", expected=version))
                    done += 1
                except ConcurrencyError:
                    conflicts += 1
            return conflicts

        await wait(asyncio.gather(*(increment(10) for _ in range(8))))
        assert [r.version for r in await store.read_stream("counter")] == list(range(1, 81))

    async def test_future_resolves_only_after_commit(self, store: GroupCommitStore) -> None:
        gate = _Gate(store)
        future = store.append(app("s"))
        await wait(gate.entered.wait())
        # The rows are inserted but not committed: invisible, and the future is pending.
        assert not future.done()
        assert await store.read() == []
        queued = store.append(app("s"))
        gate.release.set()
        [record] = await wait(future)
        assert (await store.read())[:1] == [record]
        assert (await wait(queued))[0].position == 2

    async def test_cancelled_future_is_withdrawn(self, store: GroupCommitStore) -> None:
        future = store.append(app("s"))
        future.cancel()  # before the writer ran
        kept = await wait(store.append(app("s")))
        assert kept[0].position == 1
        assert await store.last_position() == 1

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(rounds=_rounds)
    async def test_matches_the_reference_model(
        self, make_store: StoreFactory, rounds: list[list[Append]]
    ) -> None:
        store = make_store()
        await store.open()
        model = _Model()
        try:
            for batch in rounds:
                futures = store.append_many(batch)
                results = await wait(asyncio.gather(*futures, return_exceptions=True))
                for append, result in zip(batch, results, strict=True):
                    expected = model.apply(append)
                    if isinstance(expected, list):
                        assert isinstance(result, list), (append, result)
                        assert [r.position for r in result] == expected
                    else:
                        assert type(result) is expected, (append, result)
            log = await store.read()
            assert [(r.stream, r.version, r.event_id) for r in log] == model.log
            assert await store.stream_versions() == model.versions
        finally:
            await store.close()

    # ------------------------------------------------------------------ reads

    async def test_read_by_position_with_limit(self, store: GroupCommitStore) -> None:
        recorded = await wait(store.append(app("s", *[ev() for _ in range(10)])))
        assert await store.read(3, 4) == recorded[3:7]
        assert await store.read(8) == recorded[8:]
        assert await store.read(0, 0) == []
        assert await store.read(10) == []
        assert await store.read(100, 5) == []
        assert await store.read(-5, 2) == recorded[:2]

    async def test_read_stream(self, store: GroupCommitStore) -> None:
        futures = store.append_many([app("a" if i % 2 else "b") for i in range(10)])
        await wait(asyncio.gather(*futures))
        a = await store.read_stream("a")
        assert [r.version for r in a] == [1, 2, 3, 4, 5]
        assert all(r.stream == "a" for r in a)
        assert await store.read_stream("a", 2) == a[2:]
        assert await store.read_stream("a", 1, 2) == a[1:3]
        assert await store.read_stream("a", 5) == []
        assert await store.read_stream("missing") == []

    # ------------------------------------------------------------------ follow

    async def test_follow_yields_backlog_then_live(self, store: GroupCommitStore) -> None:
        await wait(asyncio.gather(*store.append_many([app("s") for _ in range(5)])))
        async with contextlib.aclosing(store.follow()) as follower:
            backlog = await take(follower, 5)
            live = store.append_many([app("t") for _ in range(5)])
            more = await take(follower, 5)
            await wait(asyncio.gather(*live))
        assert_gap_free(backlog + more)
        assert [r.stream for r in more] == ["t"] * 5

    async def test_follow_after_a_position(self, store: GroupCommitStore) -> None:
        await wait(store.append(app("s", *[ev() for _ in range(6)])))
        async with contextlib.aclosing(store.follow(4)) as follower:
            got = await take(follower, 2)
            store.append(app("s"))
            got += await take(follower, 1)
        assert_gap_free(got, first=5)

    async def test_follow_while_appending(self, store: GroupCommitStore) -> None:
        total = 300
        producer = asyncio.create_task(produce(store, total))
        followers = [store.follow(), store.follow(), store.follow(100)]
        try:
            counts = [total, total, total - 100]
            got = await wait(
                asyncio.gather(*(take(f, n) for f, n in zip(followers, counts, strict=True)))
            )
        finally:
            for f in followers:
                await f.aclose()
        await wait(producer)
        assert_gap_free(got[0])
        assert_gap_free(got[1])
        assert_gap_free(got[2], first=101)

    async def test_lagging_follower_catches_up(self, make_store: StoreFactory) -> None:
        store = make_store(follower_buffer=4)
        await store.open()
        try:
            await wait(store.append(app("s")))
            async with contextlib.aclosing(store.follow()) as follower:
                got = await take(follower, 1)
                # Not consuming while 100 events commit in many batches: the buffer overflows.
                for _ in range(20):
                    await wait(asyncio.gather(*store.append_many([app("s") for _ in range(5)])))
                # A batch bigger than the whole buffer.
                await wait(store.append(app("s", *[ev() for _ in range(9)])))
                got += await take(follower, 109)
                # Live again after catching up, still through a tiny buffer.
                live = store.append_many([app("t") for _ in range(3)])
                got += await take(follower, 3)
                await wait(asyncio.gather(*live))
            assert_gap_free(got)
            assert len(got) == 113
        finally:
            await store.close()

    async def test_slow_follower_with_concurrent_producer(self, make_store: StoreFactory) -> None:
        store = make_store(follower_buffer=7)
        await store.open()
        total = 400
        try:

            async def produce() -> None:
                for _ in range(total // 8):
                    await store.append(app("s", *[ev() for _ in range(8)]))

            async with contextlib.aclosing(store.follow()) as follower:
                producer = asyncio.create_task(produce())
                got: list[RecordedEvent] = []
                while len(got) < total:
                    got.append(await wait(anext(follower)))
                    if len(got) % 50 == 0:
                        await asyncio.sleep(0)  # let the producer run ahead
                await wait(producer)
            assert_gap_free(got)
        finally:
            await store.close()

    async def test_follow_batches_hands_out_what_is_ready_at_once(
        self, make_store: StoreFactory
    ) -> None:
        store = make_store(follower_buffer=8)
        await store.open()
        try:
            await wait(store.append(app("s", *[ev() for _ in range(24)])))
            async with contextlib.aclosing(store.follow_batches(limit=10)) as batches:
                backlog = [await wait(anext(batches)) for _ in range(3)]
                assert [len(b) for b in backlog] == [10, 10, 4]  # read a page at a time
                await wait(store.append(app("t", *[ev() for _ in range(7)])))
                live = await wait(anext(batches))
                assert [r.stream for r in live] == ["t"] * 7  # one commit: one list
                # Past the buffer while nobody takes: caught up from the log, in pages.
                for _ in range(4):
                    await wait(store.append(app("u", *[ev() for _ in range(5)])))
                caught = [await wait(anext(batches)) for _ in range(2)]
                assert [len(b) for b in caught] == [10, 10]
                with pytest.raises(ValueError, match="limit"):
                    await anext(store.follow_batches(limit=0))
            assert_gap_free([r for b in [*backlog, live, *caught] for r in b])
        finally:
            await store.close()

    async def test_follow_batches_while_appending(self, store: GroupCommitStore) -> None:
        total = 300
        producer = asyncio.create_task(produce(store, total))
        got: list[RecordedEvent] = []
        async with contextlib.aclosing(store.follow_batches(limit=16)) as batches:
            while len(got) < total:
                batch = await wait(anext(batches))
                assert 1 <= len(batch) <= 16
                got += batch
        await wait(producer)
        assert_gap_free(got)

    async def test_follow_ends_when_the_store_closes(self, make_store: StoreFactory) -> None:
        store = make_store()
        await store.open()
        follower = store.follow()
        try:
            await wait(store.append(app("s")))
            got = await take(follower, 1)
            pending = store.append(app("s"))
            await store.close()
            got += [r async for r in follower]
            assert pending.done()
            assert_gap_free(got)
            assert len(got) == 2
        finally:
            await follower.aclose()
            await store.close()

    # ------------------------------------------------------------------ lifecycle

    async def test_close_drains_enqueued_appends(self, make_store: StoreFactory) -> None:
        store = make_store(max_batch=7)
        await store.open()
        futures = store.append_many([app(f"s{i % 5}") for i in range(100)])
        await wait(store.close())
        assert all(f.done() for f in futures)
        positions = [f.result()[0].position for f in futures]
        assert positions == list(range(1, 101))
        await fails(store.append(app("s")), StoreClosedError)
        [late] = store.append_many([app("s")])
        await fails(late, StoreClosedError)
        await wait(store.close())  # again: harmless

    async def test_append_before_open_fails(self, make_store: StoreFactory) -> None:
        store = make_store()
        await fails(store.append(app("s")), StoreClosedError)
        await store.close()

    async def test_open_twice_fails(self, store: GroupCommitStore) -> None:
        with pytest.raises(StoreError):
            await store.open()

    async def test_an_urgent_append_overtakes_other_streams_but_never_its_own(
        self, store: GroupCommitStore
    ) -> None:
        # Queued together, in one call (a writer on its own thread may take a batch between
        # two calls of `append`): a flood on two streams, then urgent, then one more of b.
        *flood, urgent, after = store.append_many(
            [app(stream) for _ in range(50) for stream in ("a", "b")]
            + [Append("a", [ev()], None, urgent=True), app("b")])
        stop = await wait(urgent)
        await wait(asyncio.gather(*flood, after))
        a_before = [r for f in flood[0::2] for r in f.result()]
        b_before = [r for f in flood[1::2] for r in f.result()]
        # Everything of stream a queued before the urgent append commits with it, in order...
        assert [r.version for r in a_before] == list(range(1, 51))
        assert stop[0].version == 51
        assert max(r.position for r in a_before) < stop[0].position
        # ...and ahead of stream b, which was queued earlier but waits for the next batch.
        assert stop[0].position < min(r.position for r in b_before)
        assert after.result()[0].position > max(r.position for r in b_before)
        assert_gap_free(await store.read())

    # ------------------------------------------------------------------ leases

    async def test_a_member_takes_free_leases_and_keeps_them_from_others(
        self, store: GroupCommitStore
    ) -> None:
        port: Leases = store
        view = await port.join("m1", LIVE_MS)
        assert "m1" in view.members and view.members["m1"] > view.now
        await port.join("m2", LIVE_MS)
        assert await port.acquire("m1", ["a", "b"]) == {"a": 1, "b": 1}
        assert await port.acquire("m2", ["b", "c"]) == {"c": 1}  # b is m1's
        assert await port.acquire("m1", ["a"]) == {"a": 1}  # kept: the same epoch
        assert (await port.leases()).holders == {
            "a": Fence("m1", 1), "b": Fence("m1", 1), "c": Fence("m2", 1)}

    async def test_a_released_lease_changes_hands_at_a_new_epoch(
        self, store: GroupCommitStore
    ) -> None:
        await store.join("m1", LIVE_MS)
        await store.join("m2", LIVE_MS)
        await store.acquire("m1", ["a"])
        await store.release("m1", ["a"])
        assert "a" not in (await store.leases()).holders
        assert await store.acquire("m2", ["a"]) == {"a": 2}

    async def test_an_expired_member_loses_everything_it_held(
        self, store: GroupCommitStore
    ) -> None:
        await store.join("m1", LIVE_MS)
        await store.join("m2", LIVE_MS)
        await store.acquire("m1", ["a", "b"])
        await store.renew("m1", 0)  # expires now, as if it had stopped renewing
        view = await store.leases()
        assert "m1" not in view.members and view.holders == {}
        assert await store.acquire("m2", ["a"]) == {"a": 2}
        await fails(store.renew("m1", LIVE_MS), LeaseLost)
        await fails(store.acquire("m1", ["b"]), LeaseLost)

    async def test_leaving_frees_every_lease(self, store: GroupCommitStore) -> None:
        await store.join("m1", LIVE_MS)
        await store.acquire("m1", ["a", "b"])
        await store.leave("m1")
        view = await store.leases()
        assert (view.members, view.holders) == ({}, {})
        await store.join("m2", LIVE_MS)
        assert await store.acquire("m2", ["a", "b"]) == {"a": 2, "b": 2}

    async def test_a_fenced_append_lands_only_while_its_lease_holds(
        self, store: GroupCommitStore
    ) -> None:
        await store.join("m1", LIVE_MS)
        await store.join("m2", LIVE_MS)
        await store.acquire("m1", ["a"])
        first = await wait(store.append(Append("a", [ev()], 0, fence=Fence("m1", 1))))
        await store.release("m1", ["a"])
        await store.acquire("m2", ["a"])
        # m1 lost it: in one batch with an unfenced append and m2's, only its append fails.
        late = store.append(Append("a", [ev()], 1, fence=Fence("m1", 1)))
        other = store.append(app("b"))
        taken = store.append(Append("a", [ev()], 1, fence=Fence("m2", 2)))
        error = await fails(late, FencedError)
        assert isinstance(error, FencedError) and error.holder == Fence("m2", 2)
        assert "m2" in str(error)
        await wait(asyncio.gather(other, taken))
        assert [r.event_id for r in await store.read_stream("a")] == [
            first[0].event_id, taken.result()[0].event_id]

    async def test_a_fenced_append_of_an_expired_member_fails_even_if_nobody_took_over(
        self, store: GroupCommitStore
    ) -> None:
        await store.join("m1", LIVE_MS)
        await store.acquire("m1", ["a"])
        await store.renew("m1", 0)
        await fails(store.append(Append("a", [ev()], 0, fence=Fence("m1", 1))), FencedError)
        await fails(store.append(Append("z", [ev()], 0, fence=Fence("m1", 1))), FencedError)
        assert await store.read() == []

    async def test_lease_arguments_are_checked(self, store: GroupCommitStore) -> None:
        with pytest.raises(ValueError, match="member id"):
            await store.join("", LIVE_MS)
        with pytest.raises(ValueError, match="at least 0 ms"):
            await store.join("m1", -1)
        await store.join("m1", LIVE_MS)
        with pytest.raises(ValueError, match="not a stream"):
            await store.acquire("m1", ["member:m2"])

    # ------------------------------------------------------------------ imports

    async def test_restore_writes_recorded_events_verbatim(self, store: GroupCommitStore) -> None:
        records = [
            RecordedEvent(1, "a", 1, "x1", "T", '{"n":1}', 1_000),
            RecordedEvent(2, "b", 1, "x2", "U", '{"n":2}', 1_005),
            RecordedEvent(3, "a", 2, "x3", "T", "{}", 1_007),
        ]
        await wait(store.restore(records))
        assert await store.read() == records
        assert await store.stream_versions() == {"a": 2, "b": 1}
        [after] = await wait(store.append(app("a", expected=2)))
        assert (after.position, after.version) == (4, 3)

    async def test_restore_continues_a_log_exactly(self, store: GroupCommitStore) -> None:
        await wait(store.append(app("a")))
        await wait(store.restore([RecordedEvent(2, "a", 2, "x2", "T", "{}", 5)]))
        assert [r.event_id for r in await store.read()][1:] == ["x2"]

    @pytest.mark.parametrize(
        ("position", "version", "why"),
        [(3, 2, "position 3"), (2, 3, "version 3"), (1, 1, "position 1")],
    )
    async def test_restore_refuses_what_does_not_continue_the_log(
        self, store: GroupCommitStore, position: int, version: int, why: str
    ) -> None:
        await wait(store.append(app("a")))
        bad = [RecordedEvent(position, "a", version, "x", "T", "{}", 5)]
        error = await fails(store.restore(bad), RestoreError)
        assert why in str(error)
        assert len(await store.read()) == 1

    async def test_restore_of_a_used_id_writes_nothing(self, store: GroupCommitStore) -> None:
        [first] = await wait(store.append(app("a")))
        batch = [
            RecordedEvent(2, "b", 1, "fresh", "T", "{}", 5),
            RecordedEvent(3, "b", 2, first.event_id, "T", "{}", 5),
        ]
        await fails(store.restore(batch), DuplicateEventError)
        assert await store.read() == [first]
        [after] = await wait(store.append(app("b", expected=0)))
        assert after.position == 2

    async def test_followers_see_restored_events(self, store: GroupCommitStore) -> None:
        follower = store.follow()
        try:
            records = [RecordedEvent(n, "a", n, f"x{n}", "T", "{}", 5) for n in (1, 2)]
            await wait(store.restore(records))
            assert await take(follower, 2) == records
        finally:
            await follower.aclose()

    async def test_restore_on_a_closed_store_fails(self, make_store: StoreFactory) -> None:
        store = make_store()
        await store.open()
        await store.close()
        await fails(store.restore([RecordedEvent(1, "a", 1, "x", "T", "{}", 5)]),
                    StoreClosedError)

    # ------------------------------------------------------------------ snapshots

    async def test_snapshots_are_kept_newest_first(self, store: GroupCommitStore) -> None:
        for position in (10, 30, 20):
            await wait(store.save_snapshot(
                Snapshot(position, "code", f"sum{position}", position * 2, b"x" * position),
                keep=2,
            ))
        infos = await store.snapshots()
        assert [(i.position, i.checksum, i.created_at, i.size) for i in infos] == [
            (30, "sum30", 60, 30), (20, "sum20", 40, 20),
        ]
        assert await store.read_snapshot(10) is None
        snapshot = await store.read_snapshot(30)
        assert snapshot == Snapshot(30, "code", "sum30", 60, b"x" * 30)

    async def test_a_snapshot_at_the_same_position_replaces_it(
        self, store: GroupCommitStore
    ) -> None:
        await wait(store.save_snapshot(Snapshot(5, "old", "a", 1, b"1")))
        await wait(store.save_snapshot(Snapshot(5, "new", "b", 2, b"22")))
        assert await store.read_snapshot(5) == Snapshot(5, "new", "b", 2, b"22")
        assert len(await store.snapshots()) == 1
        await wait(store.save_snapshot(Snapshot(9, "new", "c", 3, b"")))
        assert await store.delete_snapshots([5, 7]) == 1
        assert [i.position for i in await store.snapshots()] == [9]
        assert await store.delete_snapshots() == 1
        assert await store.snapshots() == []

    async def test_malformed_snapshots_raise(self, store: GroupCommitStore) -> None:
        with pytest.raises(ValueError, match="keep"):
            await store.save_snapshot(Snapshot(1, "f", "c", 1, b""), keep=0)
        with pytest.raises(ValueError, match="fingerprint"):
            await store.save_snapshot(Snapshot(1, "", "c", 1, b""))
        with pytest.raises(ValueError, match="position"):
            await store.save_snapshot(Snapshot(-1, "f", "c", 1, b""))
