"""The ``gateway demo`` and ``gateway serve`` commands as real processes."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx

from lanes import request_outcomes, verify
from store import SqliteEventStore
from tests.gateway.support import log_of

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0


@asynccontextmanager
async def command(*args: str, until: str
                  ) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[str]]]:
    """Run ``gateway ARGS`` until it prints a line starting with ``until``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    lines: list[str] = []
    try:
        while not lines or not lines[-1].startswith(until):
            line = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
            assert line, f"the command exited early: {lines}"
            lines.append(line.decode().strip())
        yield process, lines
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def stop(process: asyncio.subprocess.Process, sig: signal.Signals) -> int:
    """Send a signal and wait for the exit code."""
    process.send_signal(sig)
    _, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert b"Traceback" not in stderr, stderr.decode()
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
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
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
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT,
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
