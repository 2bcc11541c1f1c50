"""A gateway started with ``--log-format json --log-level info`` through a storage fault (its
log's write lock held by another process) and an emergency stop: every line of its stderr
is one JSON object with time, level, logger and message; the start, the stop of the
process, the fault, its end and the emergency stop are each one line at INFO or above (the
stop with its agentId, requestId and principal); and nothing is said per request."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from bench.crash import CONTROL_TOKEN, Ledger, Report, kill, start
from gateway.client import ControlClient, GatewayClientError
from tests.faults.storage import (
    STORAGE_CODES,
    TIMEOUT,
    answered,
    control,
    request,
    resubmit,
    until,
    write_config,
    write_lock,
)

pytestmark = pytest.mark.slow  # a gateway process and a lock held for a busy timeout

BUSY_TIMEOUT_MS = 1000
LEVELS = ("debug", "info", "warning", "error", "critical")
AGENTS = ["btc", "eth", "sol"]


def at_least_info(line: dict[str, Any]) -> bool:
    return LEVELS.index(line["level"]) >= LEVELS.index("info")


def read_lines(log: Path) -> list[dict[str, Any]]:
    """Every line of the server's stderr, each parsed as one JSON object with the four
    fields (the test fails on the first line that is not)."""
    lines = []
    for number, text in enumerate(log.read_text().splitlines(), 1):
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            raise AssertionError(f"line {number} is not JSON: {text!r}") from None
        assert isinstance(line, dict), (number, text)
        assert {"time", "level", "logger", "message"} <= line.keys(), (number, text)
        assert line["time"].endswith("Z") and datetime.fromisoformat(line["time"]), text
        assert line["level"] in LEVELS and line["level"] != "debug", text
        assert isinstance(line["message"], str) and line["message"], text
        lines.append(line)
    return lines


async def test_json_logs_say_a_storage_fault_and_a_stop_once_each_and_no_request(
        tmp_path: Path) -> None:
    config, db = write_config(tmp_path, busy_timeout_ms=BUSY_TIMEOUT_MS)
    log = tmp_path / "gateway.log"
    ledger = Ledger(Report())
    process, url = await start(config, db, log,
                               options=("--log-format", "json", "--log-level", "info"))
    sent: list[dict[str, Any]] = []
    try:
        async with ControlClient(url, CONTROL_TOKEN, reconnect=False, retries=0) as client, \
                httpx2.AsyncClient(base_url=url, timeout=TIMEOUT, headers={
                    "Authorization": f"Bearer {CONTROL_TOKEN}"}) as http:
            before = [request(f"before-{n}", agent) for n, agent in enumerate(AGENTS * 4)]
            assert answered(ledger, before, await client.submit_many(before)) == []
            for path in ("/healthz", "/readyz", "/metrics", "/api/agents", "/api/agents/btc"):
                assert (await http.get(path)).status_code == 200, path
            # Not HTTP at all: uvicorn says so (a warning), through the same JSON lines.
            host, port = url.removeprefix("http://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"NOT HTTP\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), TIMEOUT)).startswith(b"HTTP/1.1 400")
            writer.close()
            async with write_lock(db):
                during = [request("during-btc", "btc"), request("during-sol", "sol")]
                errors = answered(ledger, during, await client.submit_many(during))
                assert [e.code in STORAGE_CODES for e in errors] == [True, True], errors
                # A stop while the log refuses writes: refused to the client, held by the
                # gateway and stored once the log takes writes again.
                with pytest.raises(GatewayClientError) as refused:
                    await client.submit(control("stop-eth", "emergency_stop", "eth"))
                assert refused.value.code in STORAGE_CODES
                assert (await http.get("/readyz")).status_code == 503
            await resubmit(client, ledger, during)

            async def halted() -> bool:
                agent = (await http.get("/api/agents/eth")).json()
                return bool(agent["trading"] == "HALTED")

            await until(halted, "the held stop to be stored")
            after = [request(f"after-{n}", agent) for n, agent in enumerate(AGENTS * 4)]
            await resubmit(client, ledger, after)  # (an agent may still be rebuilt: retry)
            sent = [*before, *during, *after]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
    finally:
        await kill(process)

    lines = read_lines(log)
    said = [line for line in lines if at_least_info(line)]
    print("\n".join(f"{line['level']} {line['logger']}: {line['message']}" for line in said))

    def one(words: str) -> dict[str, Any]:
        found = [line for line in said if words in line["message"]]
        assert len(found) == 1, (words, found)
        return found[0]

    assert one("started: serving 3 agents")["logger"] == "gateway.edge.server"
    assert one("stopped")["logger"] == "gateway.edge.server"
    fault = one("the event log cannot be written")
    assert fault["level"] == "error" and "locked by another process" in fault["message"]
    assert one("the event log is written again")["level"] == "warning"
    halt = one("emergency_stop")
    assert halt["level"] == "warning" and halt["logger"] == "gateway.controls"
    assert (halt["agentId"], halt["requestId"], halt["principal"]) == ("eth", "stop-eth", "ops")
    assert "stored, held while the event log refused writes" in halt["message"]
    [bad] = [line for line in said if line["logger"].startswith("uvicorn")]
    assert bad["level"] == "warning" and "Invalid HTTP request" in bad["message"]
    # Nothing per request: no line names a request of the reasoning lane or an HTTP call.
    for body in sent:
        assert not [line for line in said if body["requestId"] in json.dumps(line)], body
    assert not [line for line in said
                if line["logger"].startswith(("uvicorn.access", "httpx2", "httpcore2"))]
    assert not [line for line in said if "GET /" in line["message"]]
