"""Another OS process holds the event log's write lock for longer than the busy timeout.

While it holds it, submits are answered with a typed, retryable error that says what is
wrong (not a hang, a dropped socket or ``internal``), reads keep answering, and nothing
acknowledged before is lost; once it lets go, the gateway recovers by itself: the refused
requests are accepted when sent again (once), the control lane works, and the log holds
every acknowledged request exactly once and verifies clean.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import time
from pathlib import Path

import httpx2
import pytest

from bench.crash import CONTROL_TOKEN, Ledger, Report, kill, read_log, start
from gateway.client import ControlClient, ErrorFrame, GatewayClientError
from gateway.config import ConfigError, parse_config
from gateway.errors import AgentUnavailable, StorageFailed
from gateway.runtime.acks import Ack
from gateway.runtime.engine import Engine
from lanes import AgentConfig, AgentRequest, Mode, replay, verify
from lanes.events import AbortReason, RunAborted
from store import NewEvent, Snapshot, SqliteEventStore, WriteFailed
from store.port import Append
from tests.faults.storage import (
    STORAGE_CODES,
    TIMEOUT,
    answered,
    check_log,
    control,
    request,
    resubmit,
    server_log,
    until,
    write_config,
    write_lock,
)
from tests.gateway.support import ManualReasoner
from tests.gateway.support import request as agent_request

pytestmark = pytest.mark.slow  # several seconds each (see pyproject.toml)

BUSY_TIMEOUT_MS = 1000
async def test_a_write_lock_held_elsewhere_refuses_writes_clearly_and_recovers(
        tmp_path: Path) -> None:
    config, db = write_config(tmp_path, busy_timeout_ms=BUSY_TIMEOUT_MS)
    log = tmp_path / "gateway.log"
    ledger = Ledger(Report())
    process, url = await start(config, db, log)
    try:
        async with ControlClient(url, CONTROL_TOKEN, reconnect=False, retries=0) as client, \
                httpx2.AsyncClient(base_url=url, timeout=TIMEOUT,
                                  headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}) as http:
            before = [request(f"before-{n}", agent) for n, agent in
                      enumerate(["btc", "eth", "sol"] * 3)]
            assert answered(ledger, before, await client.submit_many(before)) == []
            committed = await client.ping()

            async with write_lock(db):
                # A submit waits out the busy timeout, then is refused, typed and retryable.
                during = [request("during-btc", "btc"), request("during-sol", "sol")]
                began = time.monotonic()
                submitting = asyncio.ensure_future(client.submit_many(during))
                # An emergency stop sent once those appends wait for the lock.

                async def waiting() -> bool | None:
                    metrics = (await http.get("/metrics")).text
                    found = re.search(r"^gateway_commit_backlog (\d+)", metrics, re.M)
                    assert found is not None, metrics
                    return True if int(found.group(1)) >= len(during) else None

                await until(waiting, "the submitted appends to wait for their commit")
                stop_sent = time.monotonic()
                with pytest.raises(GatewayClientError) as stop:
                    await client.submit(control("stop-eth-1", "emergency_stop", "eth"))
                stop_answered = time.monotonic() - stop_sent
                errors = answered(ledger, during, await submitting)
                refused_after = time.monotonic() - began
                print(f"\nrefused after {refused_after * 1000:.0f} ms; emergency stop refused "
                      f"after {stop_answered * 1000:.0f} ms: {stop.value}")
                errors.append(ErrorFrame(code=stop.value.code, message=str(stop.value)))
                assert len(errors) == len(during) + 1
                for error in errors:
                    assert error.code in STORAGE_CODES, error
                    assert "locked by another process" in error.message, error
                    assert "retry" in error.message, error
                # Behind at most the batch in flight: each waits out one busy timeout.
                assert refused_after < 3 * BUSY_TIMEOUT_MS / 1000 + 1
                assert stop_answered < 2 * BUSY_TIMEOUT_MS / 1000 + 1

                # Reads keep answering, from memory and from the committed log.
                health = await http.get("/healthz")
                assert health.status_code == 503 and health.json()["status"] == "degraded"
                assert "locked by another process" in health.json()["storage"]
                # A locked log is no reason to restart the process: live, not ready.
                assert (await http.get("/livez")).status_code == 200
                ready = await http.get("/readyz")
                assert ready.status_code == 503, ready.text
                assert "locked by another process" in ready.json()["reason"]
                assert (await http.get("/api/agents")).status_code == 200
                agent = await http.get("/api/agents/btc")
                assert agent.status_code == 200, agent.text
                events = await http.get("/api/agents/btc/events")
                assert events.status_code == 200
                ids = {e["data"].get("request", {}).get("requestId")
                       for e in events.json()["events"]}
                assert {"before-0", "before-3", "before-6"} <= ids
                replay = await http.get("/api/replay", params={"agent": "btc"})
                assert replay.status_code == 200, replay.text
                assert await client.ping() >= committed
                assert client.connected

            released = time.monotonic()
            # Recovery by itself: the refused requests, sent again as they were, go in.
            acks = await resubmit(client, ledger, during)
            print(f"recovered {(time.monotonic() - released) * 1000:.0f} ms after the release")
            again = await client.submit_many(during)  # each taken once: the rest repeat it
            assert [(a.decision, a.repeated) for a in again  # type: ignore[union-attr]
                    ] == [(a.decision, True) for a in acks]
            # The refused emergency stop was held and stored by the gateway itself.
            held = await client.submit(control("stop-eth-1", "emergency_stop", "eth"))
            assert held.decision == "accepted" and held.repeated
            # The control lane works again.
            for action in ("emergency_stop", "resume"):
                ack = await client.submit(control(f"{action}-eth-2", action, "eth"))
                assert ack.decision == "accepted" and not ack.repeated
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
    finally:
        await kill(process)
    report = await check_log(db, ledger)
    assert report.problems == []
    assert (report.lost, report.duplicated, report.verify_exit) == (0, 0, 0)
    assert report.acked == len(before) + len(during)
    text = server_log(log)
    print(text)
    assert text.count("the event log cannot be written") == 1, text
    assert "the event log is written again" in text


def test_the_busy_timeout_is_a_store_setting(tmp_path: Path) -> None:
    assert parse_config("[store]\nbusy_timeout_ms = 250\n").store.busy_timeout_ms == 250
    assert parse_config("").store.busy_timeout_ms == 5000
    with pytest.raises(ConfigError, match=r"store\.busy_timeout_ms"):
        parse_config("[store]\nbusy_timeout_ms = -1\n")
    with pytest.raises(ValueError, match="busy_timeout_ms"):
        SqliteEventStore(tmp_path / "events.db", busy_timeout_ms=-1)


async def test_a_locked_log_refuses_each_kind_of_write_with_the_reason_then_goes_on(
        tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    store = SqliteEventStore(db, busy_timeout_ms=100)
    await store.open()
    try:
        async with store.engine.connect() as conn:
            busy = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
        assert busy == 100
        await store.append(Append("s", [NewEvent("e1", "T", "{}")], 0))
        other = sqlite3.connect(db, isolation_level=None)  # another connection, its own lock
        other.execute("BEGIN IMMEDIATE")
        try:
            began = time.monotonic()
            with pytest.raises(WriteFailed) as append:
                await store.append(Append("s", [NewEvent("e2", "T", "{}")], 1))
            waited = time.monotonic() - began
            snapshot = Snapshot(1, "f" * 64, "c" * 64, 0, b"x")
            with pytest.raises(WriteFailed) as snapshotting:
                await store.save_snapshot(snapshot)
            assert [r.event_id for r in await store.read()] == ["e1"]  # reads go on
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert 0.1 <= waited < 2.0
        for error, what in ((append.value, "the append"), (snapshotting.value, "the snapshot")):
            assert str(error).startswith(f"{what} was not recorded: the event log is locked "
                                         "by another process"), error
            assert "INSERT" not in str(error)
        # The lock is gone: the same append goes in, right after the first.
        [record] = await store.append(Append("s", [NewEvent("e2", "T", "{}")], 1))
        assert (record.position, record.version) == (2, 2)
        await store.save_snapshot(snapshot)
    finally:
        await store.close()


async def test_a_gateway_started_on_a_locked_log_serves_and_catches_up_when_it_is_free(
        tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    agents = {"btc": AgentConfig(mode=Mode.FOLLOWUP)}
    reasoner = ManualReasoner()
    engine = Engine(SqliteEventStore(db), agents, reasoners=lambda _: reasoner)
    await engine.start()
    acked = await engine.submit(agent_request("btc"))
    cut_off = await reasoner.started()
    await engine.stop(graceful=False)  # as if killed: the run is cut off

    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    engine = Engine(SqliteEventStore(db, busy_timeout_ms=100), agents,
                    reasoners=lambda _: reasoner)
    try:
        try:
            # Its first appends (the cut-off run aborted, and started again) cannot be
            # written; it starts all the same, and says why.
            await asyncio.wait_for(engine.start(), TIMEOUT)
            assert engine.faults.current is not None
            assert "locked by another process" in engine.faults.current.reason
            assert engine.state("btc").active is not None  # reads are served
        finally:
            other.execute("ROLLBACK")
            other.close()
        # Free again: the agent catches up by itself and takes requests.
        again = await until(lambda: _accepted(engine, agent_request("btc")),
                            "the agent to take requests again")
        assert again.decision == "accepted"
        rerun = await reasoner.started()
        assert rerun.run_id != cut_off.run_id
        assert engine.faults.current is None
    finally:
        await engine.stop()
    log = await read_log(db)
    aborted = [e.event for e in log if isinstance(e.event, RunAborted)]
    assert [(a.run_id, a.reason) for a in aborted][:1] == [(cut_off.run_id, AbortReason.RESTART)]
    assert acked.request_id in replay(log)["btc"].seen
    assert verify(log) is None


async def _accepted(engine: Engine, request: AgentRequest) -> Ack | None:
    try:
        return await engine.submit(request)
    except (AgentUnavailable, StorageFailed):
        return None
