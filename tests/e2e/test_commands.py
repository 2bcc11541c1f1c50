"""The ``gateway demo`` and ``gateway serve`` commands as real processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest

from lanes import request_outcomes, verify
from store import SqliteEventStore
from tests.e2e.live import START_TIMEOUT
from tests.gateway.support import log_of

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0


@asynccontextmanager
async def command(*args: str, until: str, group: bool = False
                  ) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[str]]]:
    """Run ``gateway ARGS`` until it prints a line starting with ``until`` (in a process
    group of its own with ``group``, as a shell runs a command)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, cwd=ROOT, start_new_session=group,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    lines: list[str] = []
    try:
        while not lines or not lines[-1].startswith(until):
            line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT)
            assert line, f"the command exited early: {lines}"
            lines.append(line.decode().strip())
        yield process, lines
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def stop(process: asyncio.subprocess.Process, sig: signal.Signals,
               group: bool = False) -> int:
    """Send a signal (to the process's whole group with ``group``) and wait for the exit
    code."""
    if group:
        os.killpg(process.pid, sig)
    else:
        process.send_signal(sig)
    _, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert b"Traceback" not in stderr, stderr.decode()
    assert b"not stored" not in stderr, stderr.decode()
    assert process.returncode is not None
    return process.returncode


async def test_the_demo_serves_the_panel_and_a_status_api_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    async with command("demo", "--port", "0", "--db", str(tmp_path / "demo.db"),
                       until="event log:") as (
        process, lines
    ):
        url = next(line.split()[-1] for line in lines if line.startswith("panel:"))
        token = next(line.split()[-1] for line in lines if line.startswith("control token"))
        async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
            page = await http.get(url)
            assert page.status_code == 200 and "Trading agent gateway" in page.text
            agents = await http.get(f"{url}api/agents",
                                    headers={"Authorization": f"Bearer {token}"})
            assert {a["agentId"] for a in agents.json()} == {
                "agent_btc_5m", "agent_eth_1m", "agent_news"}
            assert (await http.get(f"{url}api/agents")).status_code == 401
        assert await stop(process, signal.SIGINT) == 0


CONFIG = """
[server]
host = "127.0.0.1"

[[tokens]]
name = "ops"
token = "ops-secret"
role = "control"

[[agents]]
id = "desk"
mode = "followup"
[agents.reasoner]
latency_ms = [60000, 60000]
"""


async def test_serve_stops_on_sigterm_with_the_run_recorded_and_nothing_lost(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    db = tmp_path / "events.db"
    args = ("serve", "--config", str(config), "--db", str(db), "--port", "0")
    async with command(*args, until="gateway serving on") as (process, lines):
        url = lines[-1].split()[-1]
        async with httpx2.AsyncClient(base_url=url, timeout=TIMEOUT,
                                     headers={"Authorization": "Bearer ops-secret"}) as http:
            ids = []
            for n in range(3):
                body = {"requestId": f"r{n}", "createdAt": datetime.now(UTC).isoformat(),
                        "agentId": "desk", "kind": "hook_trigger", "dedupeKey": f"k{n}"}
                ack = (await http.post("/api/agents/desk/requests", json=body)).json()
                assert ack["decision"] == "accepted"
                ids.append(ack["requestId"])
        assert await stop(process, signal.SIGTERM) == 0
    store = SqliteEventStore(db)
    await store.open()
    log = await log_of(store)
    await store.close()
    assert verify(log) is None
    assert log[-1].event.__class__.__name__ == "RunAborted"
    assert [request_outcomes(log)[i] for i in ids] == ["pending", "pending", "pending"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_to_the_whole_process_group_stops_it_with_its_last_snapshot_stored(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C in a terminal, ``timeout`` or a service manager signal every process of the
    group, the SQLite writer process too: it must outlive the gateway's last commit."""
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    db = tmp_path / "events.db"
    args = ("serve", "--config", str(config), "--db", str(db), "--port", "0")
    async with command(*args, until="gateway serving on", group=True) as (process, lines):
        url = lines[-1].split()[-1]
        async with httpx2.AsyncClient(base_url=url, timeout=TIMEOUT,
                                     headers={"Authorization": "Bearer ops-secret"}) as http:
            body = {"requestId": "r0", "createdAt": datetime.now(UTC).isoformat(),
                    "agentId": "desk", "kind": "hook_trigger"}
            assert (await http.post("/api/agents/desk/requests", json=body)).json()[
                "decision"] == "accepted"
        assert await stop(process, sig, group=True) == 0
    store = SqliteEventStore(db)
    await store.open()
    log = await log_of(store)
    await store.close()
    assert log[-1].event.__class__.__name__ == "RunAborted"


async def exited(pid: int) -> None:
    """Wait (event-driven, through a pidfd) for a process that is not our child to exit."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    gone = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, gone.set)
    try:
        await asyncio.wait_for(gone.wait(), TIMEOUT)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


@pytest.mark.slow
async def test_a_second_gateway_on_the_same_log_refuses_to_start_until_the_first_dies(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    db = tmp_path / "events.db"
    args = ("serve", "--config", str(config), "--db", str(db), "--port", "0")
    async with command(*args, until="gateway serving on") as (first, _):
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", *args, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(second.communicate(), START_TIMEOUT)
        assert second.returncode == 2, (out, err)
        assert f"is in use by another gateway process (pid {first.pid})" in err.decode()
        assert b"serving" not in out and b"Traceback" not in err
        first.kill()  # kill -9: the kernel frees the lock; the lock file stays behind
        await first.wait()
    assert (tmp_path / "events.db.lock").exists()
    async with command(*args, until="gateway serving on") as (third, _):
        assert await stop(third, signal.SIGTERM) == 0


@pytest.mark.parametrize("where", ["postgresql://gateway:secret@127.0.0.1:1/desk",
                                   "missing-directory/events.db"])
async def test_a_log_that_cannot_be_opened_is_said_plainly(tmp_path: Path, where: str) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    db = where if where.startswith("postgresql") else str(tmp_path / where)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--db", db,
        "--port", "0", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), START_TIMEOUT)
    text = err.decode()
    assert process.returncode == 2, (out, text)
    assert "gateway: cannot open the event log at " in text and "Traceback" not in text
    assert "secret" not in text  # a password in the URL is never printed


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
async def test_uv_run_gateway_stops_with_its_uv_process(tmp_path: Path,
                                                        sig: signal.Signals) -> None:
    """uv forwards SIGTERM; a SIGKILL of uv (which it cannot forward) stops the server too,
    by the parent-death signal the server asks for: nothing goes on serving unseen."""
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    db = tmp_path / "events.db"
    uv = await asyncio.create_subprocess_exec(
        "uv", "run", "--no-sync", "gateway", "serve", "--config", str(config), "--db", str(db),
        "--port", "0", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert uv.stdout is not None
        line = await asyncio.wait_for(uv.stdout.readline(), START_TIMEOUT)
        assert line.startswith(b"gateway serving on"), line
        server = int((tmp_path / "events.db.lock").read_text())
        assert server != uv.pid  # uv's child holds the log
        uv.send_signal(sig)
        await asyncio.wait_for(uv.wait(), TIMEOUT)
        await exited(server)
    finally:
        if uv.returncode is None:
            uv.kill()
            await uv.wait()
    store = SqliteEventStore(db, exclusive=True)  # free again: the server is gone
    await store.open()
    await store.close()
