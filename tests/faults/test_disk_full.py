"""The event log cannot grow: the gateway process may not write files past a size
(``RLIMIT_FSIZE``, set on the running process with ``prlimit``; Python ignores ``SIGXFSZ``,
so a write past it fails with ``EFBIG``, which SQLite reports as a disk I/O error, much as
a full disk).

While it cannot, submits are refused at once with a typed, retryable error that says what is
wrong, reads keep answering, the process stays up, does not spin, and says so once in its log
(not a flood of tracebacks); when the limit is lifted the gateway recovers by itself, and the
log holds every acknowledged request exactly once and verifies clean. A stop while the log
cannot grow (its last appends, snapshot and checkpoint fail) still ends the process, and the
next start carries on from the log.

Where the test runs as root, a real full disk too: a 1 MiB tmpfs in a mount namespace of its
own (``ENOSPC``: SQLite's 'database or disk is full'), grown with a remount to end the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import resource
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from bench.crash import CONTROL_TOKEN, Ledger, Report, kill, start
from gateway.client import ControlClient, ErrorFrame
from gateway.errors import StorageFailed
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode, replay
from store import NewEvent, SqliteEventStore, WriteFailed
from store.port import Append
from store.writer import WriteTransaction
from tests.faults.storage import (
    STORAGE_CODES,
    TIMEOUT,
    answered,
    check_log,
    control,
    request,
    resubmit,
    server_log,
    write_config,
)
from tests.gateway.support import ManualReasoner, log_of
from tests.gateway.support import request as agent_request

pytestmark = pytest.mark.slow  # several seconds each (see pyproject.toml)

HEADROOM = 64 * 1024
"""Bytes each file of the log may still grow by once the limit is set."""
HELD_S = 1.5
"""How long the log stays full while reads are checked."""


def family(pid: int) -> list[int]:
    """Process ``pid`` and every descendant of it (the gateway's SQLite writer process)."""
    found, index = [pid], 0
    while index < len(found):
        for task in Path(f"/proc/{found[index]}/task").iterdir():
            with contextlib.suppress(OSError):
                found += map(int, (task / "children").read_text().split())
        index += 1
    return found


def set_file_limit(pid: int, limit: int) -> None:
    """Let process ``pid`` and its descendants write no file past ``limit`` bytes."""
    for member in family(pid):
        resource.prlimit(member, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def limit_files(pid: int, directory: Path) -> None:
    """Let process ``pid`` (and its descendants) write no file past the largest in
    ``directory`` + `HEADROOM`."""
    set_file_limit(pid, max(path.stat().st_size for path in directory.iterdir()) + HEADROOM)


def lift_limit(pid: int) -> None:
    set_file_limit(pid, resource.RLIM_INFINITY)


async def fill(client: ControlClient, ledger: Ledger, size: int = 60, prefix: str = "fill"
               ) -> tuple[list[dict[str, Any]], list[ErrorFrame]]:
    """Submit batches of ``size`` until one is refused: that batch and its errors."""
    for n in range(1000):
        batch = [request(f"{prefix}-{n}-{k}", ("btc", "eth", "sol")[k % 3])
                 for k in range(size)]
        errors = answered(ledger, batch, await client.submit_many(batch))
        if errors:
            return batch, errors
    raise AssertionError("the log never filled up")


def assert_says_what_is_wrong(errors: list[ErrorFrame]) -> None:
    assert errors and all(e.code in STORAGE_CODES for e in errors), errors
    for error in errors:
        assert "file size limit" in error.message and "retry" in error.message, error


async def test_a_full_log_refuses_writes_clearly_keeps_reading_and_recovers(
        tmp_path: Path) -> None:
    config, db = write_config(tmp_path)
    log = tmp_path / "gateway.log"
    ledger = Ledger(Report())
    process, url = await start(config, db, log)
    try:
        async with ControlClient(url, CONTROL_TOKEN, reconnect=False, retries=0) as client, \
                httpx2.AsyncClient(base_url=url, timeout=TIMEOUT,
                                  headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}) as http:
            limit_files(process.pid, tmp_path)
            batch, errors = await fill(client, ledger)
            assert_says_what_is_wrong(errors)
            full = time.monotonic()
            print(f"\nfull after {len(ledger.acks)} acked requests: {errors[0].message}")

            # Still full: submits and the control lane are refused at once, typed.
            began = time.monotonic()
            assert_says_what_is_wrong(answered(ledger, batch, await client.submit_many(batch)))
            stop = [control("stop-eth-1", "emergency_stop", "eth")]
            assert_says_what_is_wrong(answered(ledger, stop, await client.submit_many(stop)))
            print(f"refused in {(time.monotonic() - began) * 1000:.0f} ms")
            assert time.monotonic() - began < 1.0

            # Reads keep answering for as long as it is full; health says what is wrong.
            reads = 0
            while time.monotonic() - full < HELD_S:
                health = await http.get("/healthz")
                assert health.status_code == 503, health.text
                assert health.json()["status"] == "degraded"
                assert health.json()["storage"].endswith("a file reached the process's size limit")
                assert "bytes" not in health.json()["storage"]  # no figures to anyone who asks
                for path in ("/api/agents", "/api/agents/btc", "/api/agents/btc/events",
                             "/api/agents/eth/queue"):
                    assert (await http.get(path)).status_code == 200, path
                replay = await http.get("/api/replay", params={"agent": "btc"})
                assert replay.status_code == 200, replay.text
                await client.ping()
                reads += 1
            print(f"{reads} rounds of reads while full; health: {health.json()}")
            assert client.connected and process.returncode is None

            lift_limit(process.pid)
            lifted = time.monotonic()
            acks = await resubmit(client, ledger, batch)
            print(f"recovered {(time.monotonic() - lifted) * 1000:.0f} ms after the lift")
            again = await client.submit_many(batch)  # each taken once: the rest repeat it
            assert [(a.decision, a.repeated) for a in again  # type: ignore[union-attr]
                    ] == [(a.decision, True) for a in acks]
            for action in ("emergency_stop", "resume"):
                ack = await client.submit(control(f"{action}-eth-2", action, "eth"))
                assert ack.decision == "accepted" and not ack.repeated
            assert (await http.get("/healthz")).json()["status"] == "ok"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
    finally:
        await kill(process)
    report = await check_log(db, ledger)
    assert report.problems == []
    assert (report.lost, report.duplicated, report.verify_exit) == (0, 0, 0)
    text = server_log(log)
    print(text)
    # Said once, not once per refused append; and the agents did not spin meanwhile.
    assert text.count("the event log cannot be written") == 1
    back = re.search(r"written again, ([\d.]+) s after the first failed commit "
                     r"\((\d+) failed meanwhile\)", text)
    assert back is not None, text
    assert int(back.group(2)) < 60, "commits were retried in a tight loop while full"


async def test_a_stop_while_the_log_is_full_ends_and_the_next_start_carries_on_from_the_wal(
        tmp_path: Path) -> None:
    config, db = write_config(tmp_path)
    log = tmp_path / "gateway.log"
    ledger = Ledger(Report())
    process, url = await start(config, db, log)
    try:
        async with ControlClient(url, CONTROL_TOKEN, reconnect=False, retries=0) as client:
            limit_files(process.pid, tmp_path)
            batch, errors = await fill(client, ledger)
            assert_says_what_is_wrong(errors)
        # Nor may the database file grow: the checkpoint at the close (the WAL copied into
        # it) fails too, as do the stop's last appends (runs it aborts) and its snapshot.
        set_file_limit(process.pid, db.stat().st_size)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
    finally:
        await kill(process)
    text = server_log(log)
    # Once: the second limit is the same kind of fault, within the minute.
    assert text.count("the event log cannot be written") == 1
    assert re.search(r"snapshot at \d+ not stored: the snapshot was not recorded: "
                     r"events\.db-wal reached this process's file size limit", text), text
    wal = db.with_name(db.name + "-wal")
    assert wal.exists() and wal.stat().st_size > 0, "the checkpoint went through after all"

    process, url = await start(config, db, log)
    try:
        async with ControlClient(url, CONTROL_TOKEN, reconnect=False, retries=0) as client:
            await resubmit(client, ledger, batch)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
    finally:
        await kill(process)
    report = await check_log(db, ledger)
    assert report.problems == []
    assert (report.lost, report.duplicated, report.verify_exit) == (0, 0, 0)
    server_log(log)


class SizeLimited(SqliteEventStore):
    """A real SQLite log whose file cannot grow while it is `full`: SQLite's own limit
    (``PRAGMA max_page_count`` on the writer's connection) fails a write that needs one more
    page with 'database or disk is full', as a full disk does."""

    async def fill_up(self, full: bool = True) -> None:
        pages = await self.writer_query("PRAGMA page_count") if full else 0
        await self.writer_query(f"PRAGMA max_page_count={pages or 1_073_741_823}")


async def test_a_stop_while_full_survives_its_failed_snapshot_and_loses_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "events.db"
    agents = {"btc": AgentConfig(mode=Mode.FOLLOWUP)}
    reasoner = ManualReasoner()
    engine = Engine(SizeLimited(db), agents, reasoners=lambda _: reasoner)
    await engine.start()
    try:
        # Pending requests with incompressible payloads: a snapshot needs pages of its own.
        acked = [(await engine.submit(agent_request("btc", payload={
            "noise": os.urandom(256).hex()}))).request_id for _ in range(40)]
        await reasoner.started()
        await engine.flush()
        store = engine.store
        assert isinstance(store, SizeLimited)
        await store.fill_up()
        refusal: StorageFailed | None = None
        for _ in range(1000):  # until a commit needs a page more
            refused = agent_request("btc")
            try:
                acked.append((await engine.submit(refused)).request_id)
            except StorageFailed as error:
                refusal = error
                break
        assert refusal is not None, "the log never filled up"
        assert re.search("disk holding the event log is full.*retry", str(refusal))
        # (No flush: while the log stays full, the agent's rebuilds go on for ever, paced.)
        # The stop's own appends (the run it aborts) and its snapshot fail: it still stops.
        with caplog.at_level(logging.WARNING, logger="gateway.runtime.engine"):
            await asyncio.wait_for(engine.stop(), TIMEOUT)
    finally:
        await engine.stop()
    assert re.search(r"snapshot at \d+ not stored: the snapshot was not recorded: the disk "
                     r"holding the event log is full", caplog.text), caplog.text

    engine = Engine(SqliteEventStore(db), agents, reasoners=lambda _: reasoner)
    await engine.start()
    try:
        assert await engine.store.snapshots() == []
        ack = await engine.submit(refused)
        assert (ack.decision, ack.repeated) == ("accepted", False)
        await engine.flush()
        state = replay(await log_of(engine.store))["btc"]
        assert {*acked, refused.request_id} <= set(state.seen)
    finally:
        await engine.stop()


class FailingAfterCommit(SqliteEventStore):
    """Its next commit reaches the file but is reported failed, as an I/O error after the
    write can be (an ``fsync`` that fails on a full disk, say)."""

    fail_next = False

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[WriteTransaction]:
        async with super()._transaction() as txn:
            yield txn
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk I/O error")


async def test_a_commit_reported_failed_that_went_through_does_not_wedge_the_writer(
        tmp_path: Path) -> None:
    store = FailingAfterCommit(tmp_path / "events.db")
    await store.open()
    try:
        await store.append(Append("s", [NewEvent("e1", "T", "{}")], None))
        store.fail_next = True
        with pytest.raises(WriteFailed, match="disk I/O error"):
            await store.append(Append("s", [NewEvent("e2", "T", "{}")], None))
        # Recorded after all: the next appends go on after it, and its retry is idempotent.
        [e3] = await store.append(Append("s", [NewEvent("e3", "T", "{}")], None))
        assert (e3.position, e3.version) == (3, 3)
        [again] = await store.append(Append("s", [NewEvent("e2", "T", "{}")], 1))
        assert (again.event_id, again.position) == ("e2", 2)
        assert [(r.position, r.event_id) for r in await store.read()] == [
            (1, "e1"), (2, "e2"), (3, "e3")]
    finally:
        await store.close()



async def test_a_follower_gets_a_commit_reported_failed_in_its_place(tmp_path: Path) -> None:
    """The commit never reached the followers' buffers: they read it from the log, so the
    events reach them in order, each once."""
    store = FailingAfterCommit(tmp_path / "events.db")
    await store.open()
    try:
        async with contextlib.aclosing(store.follow_batches(limit=10)) as batches:
            await store.append(Append("s", [NewEvent("e1", "T", "{}")], None))
            assert [r.event_id for r in await asyncio.wait_for(anext(batches), TIMEOUT)] == [
                "e1"]
            store.fail_next = True
            with pytest.raises(WriteFailed):
                await store.append(Append("s", [NewEvent("e2", "T", "{}")], None))
            await store.append(Append("s", [NewEvent("e3", "T", "{}")], None))
            got = await asyncio.wait_for(anext(batches), TIMEOUT)
            assert [(r.position, r.event_id) for r in got] == [(2, "e2"), (3, "e3")]
    finally:
        await store.close()

HOLDER = """
set -e
mount -t tmpfs -o size={size} tmpfs {dir}
echo mounted
exec sleep 600
"""


@contextlib.asynccontextmanager
async def small_disk(directory: Path, size: str) -> AsyncIterator[int]:
    """A tmpfs of ``size`` on ``directory``, in a mount namespace of its own (root only); the
    pid of a process holding the namespace (``nsenter -t PID -m`` enters it; the files are at
    ``/proc/PID/root/...``). Skips the test where the namespace or the mount is refused."""
    missing = [tool for tool in ("unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)} here")
    await asyncio.to_thread(directory.mkdir)
    holder = await asyncio.create_subprocess_exec(
        "unshare", "-m", "--propagation", "private", "sh", "-c",
        HOLDER.format(size=size, dir=directory), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert holder.stdout is not None and holder.stderr is not None
    try:
        if await asyncio.wait_for(holder.stdout.readline(), TIMEOUT) != b"mounted\n":
            await holder.wait()
            refused = (await holder.stderr.read()).decode().strip()
            pytest.skip(f"no tmpfs in a mount namespace here: {refused}")
        yield holder.pid
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


async def test_a_full_tmpfs_refuses_writes_as_a_full_disk_and_recovers_when_it_grows(
        tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    async with small_disk(disk, "1m") as holder:
        config, db = write_config(tmp_path, db=disk / "events.db")
        seen = Path(f"/proc/{holder}/root") / db.relative_to("/")  # the file, seen from here
        log = tmp_path / "gateway.log"
        ledger = Ledger(Report())
        process, url = await start(config, db, log, ["nsenter", "-t", str(holder), "-m"])
        try:
            async with ControlClient(url, CONTROL_TOKEN, reconnect=False, retries=0
                                     ) as client, \
                    httpx2.AsyncClient(base_url=url, timeout=TIMEOUT, headers={
                        "Authorization": f"Bearer {CONTROL_TOKEN}"}) as http:
                batch, errors = await fill(client, ledger)
                print(f"\nfull after {len(ledger.acks)} acked requests: {errors[0].message}")
                assert errors and all(e.code in STORAGE_CODES for e in errors), errors
                for error in errors:
                    assert "disk holding the event log is full" in error.message, error
                health = await http.get("/healthz")
                assert health.status_code == 503, health.text
                assert health.json()["storage"].endswith("the disk is full")
                assert (await http.get("/api/agents/btc/events")).status_code == 200

                grow = await asyncio.create_subprocess_exec(
                    "nsenter", "-t", str(holder), "-m", "mount", "-o", "remount,size=64m",
                    str(disk))
                assert await asyncio.wait_for(grow.wait(), TIMEOUT) == 0
                grown = time.monotonic()
                await resubmit(client, ledger, batch)
                print(f"recovered {(time.monotonic() - grown) * 1000:.0f} ms after it grew")
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
        finally:
            await kill(process)
        # A copy to check (SQLite resolves /proc/PID/root to this namespace's root).
        copy = tmp_path / "copy"
        copy.mkdir()
        for path in seen.parent.iterdir():
            shutil.copy(path, copy / path.name)
        report = await check_log(copy / db.name, ledger)
    assert report.problems == []
    assert (report.lost, report.duplicated, report.verify_exit) == (0, 0, 0)
    text = server_log(log)
    print(text)
    assert text.count("the event log cannot be written") == 1
