"""Snapshots are a cache of the fold: a start from one equals a start from the whole log."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.base.clock import FakeClock
from gateway.runtime import snapshots
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Budgets, Mode, replay, verify
from lanes.config import DropPolicy
from lanes.replay import LogFold
from lanes.snapshot import SNAPSHOT_FORMAT, BadSnapshot, dump_fold, load_fold
from store import SqliteEventStore
from store.port import Snapshot
from tests.gateway.support import ManualReasoner, control, log_of, request
from tests.lanes.harness import Bench
from tests.lanes.test_properties import actions, configs, play

AGENTS = {
    "btc": AgentConfig(mode=Mode.FOLLOWUP, cap=3, drop_policy=DropPolicy.SUMMARIZE),
    "eth": AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000),
    "sol": AgentConfig(mode=Mode.STEER_BACKLOG, budgets=Budgets(max_runs_per_hour=1)),
}


# ------------------------------------------------------------------ the image, pure


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, script=st.lists(actions, max_size=50), cut=st.integers(0, 50))
def test_a_fold_loaded_from_its_image_is_the_fold_and_decides_the_same(
    config: AgentConfig, script: list[tuple[str, Any]], cut: int
) -> None:
    bench = Bench(config)
    seen: list[str] = []
    for action, arg in script[:cut]:
        play(bench, action, arg, seen)
    log_fold = LogFold()
    log_fold.add(bench.round_tripped())
    loaded, anchor = load_fold(dump_fold(log_fold, "ev-9"))
    assert (loaded, anchor) == (log_fold, "ev-9")
    assert list(loaded.states[bench.agent].seen) == list(bench.state.seen)  # order kept

    bench.state = loaded.states[bench.agent]  # go on from the loaded state
    for action, arg in script[cut:]:
        play(bench, action, arg, seen)
    assert replay(bench.round_tripped())[bench.agent] == bench.state
    assert verify(bench.round_tripped()) is None


def test_a_damaged_image_is_refused() -> None:
    data = dump_fold(LogFold(), "x")
    with pytest.raises(BadSnapshot, match="does not load"):
        load_fold(data[:-5])
    with pytest.raises(BadSnapshot, match="format 99"):
        load_fold(data.replace(f'"format":{SNAPSHOT_FORMAT}'.encode(), b'"format":99'))


# ------------------------------------------------------------------ the engine


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def record_scenario(db: Path, clock: FakeClock, *, graceful: bool) -> None:
    """Runs, drops into a summary, a collect window, a budget, a halt; one run left active."""
    reasoner = ManualReasoner()
    engine = Engine(SqliteEventStore(db, clock=clock.now_ms), AGENTS, clock=clock,
                    reasoners=lambda _: reasoner)
    await engine.start()
    for n in range(6):
        await engine.submit(request("btc", dedupeKey=f"b{n % 4}"))
    first = await reasoner.started()
    reasoner.finish(first.run_id, "trade")
    await engine.submit(request("eth"))
    await engine.submit(request("eth"))
    clock.advance(1_000)
    await engine.submit(request("sol"))
    await engine.submit(request("sol"))
    await engine.submit(control("sol", "emergency_stop"))
    await engine.submit(request("sol"))
    await engine.flush()
    await engine.stop(graceful=graceful)


async def start(db: Path, clock: FakeClock) -> Engine:
    engine = Engine(SqliteEventStore(db, clock=clock.now_ms), AGENTS, clock=clock,
                    reasoners=lambda _: ManualReasoner())
    await engine.start()
    await engine.flush()
    return engine


@pytest.fixture
async def two_starts(tmp_path: Path, clock: FakeClock) -> AsyncIterator[tuple[Engine, Engine]]:
    """The same log started twice: with its snapshot, and (a copy) without any."""
    db, copy = tmp_path / "events.db", tmp_path / "copy.db"
    await record_scenario(db, clock, graceful=True)
    shutil.copy(db, copy)
    bare = SqliteEventStore(copy)
    await bare.open()
    assert await bare.delete_snapshots() == 1
    await bare.close()
    with_snapshot, without = await start(db, clock), await start(copy, clock)
    yield with_snapshot, without
    await with_snapshot.stop(graceful=False)
    await without.stop(graceful=False)


async def test_a_graceful_stop_leaves_a_snapshot_of_the_whole_log(
    tmp_path: Path, clock: FakeClock
) -> None:
    db = tmp_path / "events.db"
    await record_scenario(db, clock, graceful=True)
    store = SqliteEventStore(db)
    await store.open()
    try:
        [info] = await store.snapshots()
        assert info.position == await store.last_position()
        assert info.fingerprint == snapshots.FINGERPRINT
        loaded = await snapshots.load_latest(store)
        assert loaded.snapshot == info and loaded.ignored == {}
        assert loaded.fold.states == replay(await log_of(store))
    finally:
        await store.close()


async def test_a_restart_with_a_snapshot_equals_one_without(
    two_starts: tuple[Engine, Engine],
) -> None:
    with_snapshot, without = two_starts
    assert with_snapshot.snapshots.loaded_at is not None and without.snapshots.loaded_at is None
    assert with_snapshot.agent_ids == without.agent_ids
    for agent_id in with_snapshot.agent_ids:
        assert with_snapshot.state(agent_id) == without.state(agent_id)
    after_a = await with_snapshot.store.read()
    after_b = await without.store.read()
    assert [(r.position, r.stream, r.type, r.data) for r in after_a] == [
        (r.position, r.stream, r.type, r.data) for r in after_b]
    assert verify(await log_of(with_snapshot.store)) is None


async def test_a_crash_restart_from_a_periodic_snapshot_equals_one_from_the_log(
    tmp_path: Path, clock: FakeClock
) -> None:
    db, copy = tmp_path / "events.db", tmp_path / "copy.db"
    reasoner = ManualReasoner()
    engine = Engine(SqliteEventStore(db, clock=clock.now_ms), AGENTS, clock=clock,
                    reasoners=lambda _: reasoner, snapshot_every=5)
    await engine.start()
    for n in range(8):
        await engine.submit(request("btc", dedupeKey=f"k{n}"))
        await engine.flush()
    if engine.snapshots._task is not None:
        await engine.snapshots._task  # the last periodic snapshot, stored
    if (await engine.store.snapshots())[0].position == await engine.store.last_position():
        # (When it was taken the engine was quiet at the last commit or not, as it
        # happened.) Fewer events than snapshot_every: a tail, and no snapshot of it.
        await engine.submit(request("btc", dedupeKey="k8"))
        await engine.flush()
    await engine.stop(graceful=False)  # as if killed: a run is active, no snapshot at stop
    store = SqliteEventStore(db)
    await store.open()
    [newest, _older] = await store.snapshots()
    last = await store.last_position()
    await store.close()
    assert newest.position < last  # the restart has a tail to fold

    shutil.copy(db, copy)
    bare = SqliteEventStore(copy)
    await bare.open()
    await bare.delete_snapshots()
    await bare.close()
    a, b = await start(db, clock), await start(copy, clock)
    try:
        assert a.snapshots.loaded_at == newest.position
        for agent_id in a.agent_ids:
            assert a.state(agent_id) == b.state(agent_id)
        assert a.state("btc").counters.aborts == 1  # the run cut off, recorded at the start
    finally:
        await a.stop(graceful=False)
        await b.stop(graceful=False)


async def test_a_snapshot_folded_by_a_worker_process_equals_the_fold_of_the_log(
    tmp_path: Path, clock: FakeClock
) -> None:
    db, copy = tmp_path / "events.db", tmp_path / "copy.db"
    reasoner = ManualReasoner()
    engine = Engine(SqliteEventStore(db, clock=clock.now_ms), AGENTS, clock=clock,
                    reasoners=lambda _: reasoner, snapshot_every=5, snapshot_worker=True)
    await engine.start()
    for n in range(8):
        await engine.submit(request("btc", dedupeKey=f"k{n}"))
        await engine.flush()
    await engine.stop(graceful=False)  # waits for the worker's snapshot; none of its own
    store = SqliteEventStore(db)
    await store.open()
    infos = await store.snapshots()
    last = await store.last_position()
    await store.close()
    assert infos and all(0 < info.position < last for info in infos)
    shutil.copy(db, copy)
    bare = SqliteEventStore(copy)
    await bare.open()
    await bare.delete_snapshots()
    await bare.close()
    a, b = await start(db, clock), await start(copy, clock)
    try:
        assert a.snapshots.loaded_at == infos[0].position
        for agent_id in a.agent_ids:
            assert a.state(agent_id) == b.state(agent_id)
    finally:
        await a.stop(graceful=False)
        await b.stop(graceful=False)


async def replace_snapshot(db: Path, change: str) -> int:
    """Spoil the stored snapshot one way; its position."""
    store = SqliteEventStore(db)
    await store.open()
    try:
        [info] = await store.snapshots()
        snapshot = await store.read_snapshot(info.position)
        assert snapshot is not None
        if change == "damaged":
            data = snapshot.data[:10] + bytes([snapshot.data[10] ^ 0xFF]) + snapshot.data[11:]
            spoiled = snapshot._replace(data=data)
        elif change == "damaged, checksum fixed":
            spoiled = snapshots.seal(info.position, b'{"format":1,"position":', 1)
        elif change == "outdated":
            spoiled = snapshot._replace(fingerprint="code of last year")
        elif change == "of another log":
            raw = dump_fold(LogFold(position=info.position), "some-other-event")
            spoiled = snapshots.seal(info.position, raw, 1)
        else:
            assert change == "ahead of the log"
            raw = dump_fold(LogFold(position=info.position + 100), "x")
            spoiled = snapshots.seal(info.position + 100, raw, 1)
            await store.delete_snapshots()
        await store.save_snapshot(spoiled)
        return info.position
    finally:
        await store.close()


@pytest.mark.parametrize(
    "change",
    ["damaged", "damaged, checksum fixed", "outdated", "of another log", "ahead of the log"],
)
async def test_a_bad_snapshot_is_ignored_and_rebuilt(
    tmp_path: Path, clock: FakeClock, change: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "events.db"
    await record_scenario(db, clock, graceful=True)
    await replace_snapshot(db, change)
    engine = await start(db, clock)
    try:
        assert engine.snapshots.loaded_at is None
        assert "ignored" in caplog.text
        log = await log_of(engine.store)
        for agent_id in engine.agent_ids:
            assert replay(log)[agent_id] == engine.state(agent_id)
        await engine.flush()
    finally:
        await engine.stop(graceful=False)
    store = SqliteEventStore(db)
    await store.open()
    try:
        newest = (await store.snapshots())[0]
        assert newest.fingerprint == snapshots.FINGERPRINT
        loaded = await snapshots.load_latest(store)
        assert loaded.snapshot == newest  # rebuilt, and good
    finally:
        await store.close()


async def test_snapshots_are_kept_to_the_newest_two(tmp_path: Path, clock: FakeClock) -> None:
    db = tmp_path / "events.db"
    engine = Engine(SqliteEventStore(db, clock=clock.now_ms), AGENTS, clock=clock,
                    reasoners=lambda _: ManualReasoner(), snapshot_every=2)
    await engine.start()
    for _ in range(6):
        await engine.submit(request("eth"))
        await engine.flush()
    await engine.stop()
    store = SqliteEventStore(db)
    await store.open()
    try:
        infos = await store.snapshots()
        assert len(infos) == 2 and infos[0].position == await store.last_position()
    finally:
        await store.close()


def test_snapshot_sizes_are_checked_before_they_are_stored() -> None:
    snapshot = snapshots.seal(5, b"{}", 1)
    assert isinstance(snapshot, Snapshot) and snapshot.position == 5
    assert len(snapshot.checksum) == 64 and snapshot.fingerprint == snapshots.FINGERPRINT


async def test_a_bad_snapshot_beside_a_good_one_is_deleted_even_with_nothing_to_fold(
    tmp_path: Path, clock: FakeClock
) -> None:
    db = tmp_path / "events.db"
    await record_scenario(db, clock, graceful=True)
    store = SqliteEventStore(db)
    await store.open()
    [good] = await store.snapshots()
    ahead = snapshots.seal(good.position + 50, dump_fold(LogFold(position=good.position + 50),
                                                         "x"), 1)
    await store.save_snapshot(ahead)
    await store.close()
    engine = await start(db, clock)
    try:
        assert engine.snapshots.loaded_at == good.position
    finally:
        await engine.stop(graceful=False)
    store = SqliteEventStore(db)
    await store.open()
    try:
        assert [info.position for info in await store.snapshots()] == [good.position]
    finally:
        await store.close()
