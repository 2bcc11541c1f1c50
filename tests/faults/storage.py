"""A real gateway process on a scratch SQLite log, for the storage fault tests: its config,
requests, and the checks of the log against what the clients were acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from bench.crash import (
    CONFIG,
    CONTROL_TOKEN,
    FEED_TOKEN,
    ROOT,
    Ledger,
    Report,
    check,
    read_log,
)
from gateway.client import AckFrame, ControlClient, ErrorFrame
from tests.gateway.support import until as wait_until

T = TypeVar("T")
TIMEOUT = 20.0
STORAGE_CODES = frozenset({"storage_failed", "unavailable"})
"""What a client may be answered while the log cannot be written."""


def write_config(workdir: Path, busy_timeout_ms: int = 5000, db: Path | None = None
                 ) -> tuple[Path, Path]:
    """The crash bench's config (three agents, simulated reasoners, a feed and a control
    token) with ``busy_timeout_ms``; the config and log paths."""
    db = db or workdir / "events.db"
    config = workdir / "gateway.toml"
    text = CONFIG.format(db=db, feed=FEED_TOKEN, control=CONTROL_TOKEN).replace(
        'synchronous = "FULL"', f'synchronous = "FULL"\nbusy_timeout_ms = {busy_timeout_ms}')
    config.write_text(text)
    return config, db


def request(request_id: str, agent: str = "btc", **fields: Any) -> dict[str, Any]:
    """A hook trigger (or, with ``payload={"action": ...}``, a control) as the wire has it."""
    body: dict[str, Any] = {"requestId": request_id, "createdAt": datetime.now(UTC).isoformat(),
                            "agentId": agent, "kind": "hook_trigger", "dedupeKey": request_id}
    body.update(fields)
    return body


def control(request_id: str, action: str, agent: str = "btc") -> dict[str, Any]:
    """A control-lane request."""
    return request(request_id, agent, kind="user_control", priority="high", dedupeKey=None,
                   payload={"action": action})


async def until(probe: Callable[[], Awaitable[T | None]], what: str) -> T:
    """`tests.gateway.support.until` with this module's `TIMEOUT`."""
    return await wait_until(probe, what, TIMEOUT)


def answered(ledger: Ledger, bodies: list[dict[str, Any]],
             answers: list[AckFrame | ErrorFrame]) -> list[ErrorFrame]:
    """Note the acks in the ledger; the errors."""
    errors: list[ErrorFrame] = []
    for body, answer in zip(bodies, answers, strict=True):
        if isinstance(answer, AckFrame):
            ledger.take(answer, body["agentId"])
        else:
            errors.append(answer)
    return errors


async def resubmit(client: ControlClient, ledger: Ledger, bodies: list[dict[str, Any]]
                   ) -> list[AckFrame]:
    """Send ``bodies`` again (as a client told to retry does) until every one is acked; a
    storage error meanwhile is fine, any other error fails."""

    async def acked() -> list[AckFrame] | None:
        answers = await client.submit_many(bodies)
        wrong = [a for a in answers if isinstance(a, ErrorFrame) and a.code not in STORAGE_CODES]
        assert wrong == [], wrong
        answered(ledger, bodies, answers)
        acks = [a for a in answers if isinstance(a, AckFrame)]
        return acks if len(acks) == len(bodies) else None

    return await until(acked, "the refused requests to be accepted")


def server_log(log: Path) -> str:
    """The gateway's stderr; it must hold no traceback."""
    text = log.read_text()
    assert "Traceback" not in text, text
    return text


async def check_log(db: Path, ledger: Ledger) -> Report:
    """Every acknowledged request is in the log with its decision at its position, none is
    decided twice as new, `lanes.verify` is clean; then ``gateway verify DB`` must exit 0."""
    report = ledger.report
    entries = await read_log(db)
    check(entries, ledger, set(), report)
    # Runs cut off by a failed commit are recorded as aborted (reason restart) when their
    # agent is rebuilt: not the kill the crash check looks for.
    report.problems = [p for p in report.problems if not p.startswith("restart aborts")]
    verify = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "verify", str(db), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(verify.communicate(), TIMEOUT * 3)
    report.verify_exit = verify.returncode
    if verify.returncode != 0:
        report.problems.append(f"gateway verify exited {verify.returncode}: {out.decode()}")
    return report


LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()  # held until the test says so (or goes away: end of file)
db.execute("ROLLBACK")
db.close()
"""


@contextlib.asynccontextmanager
async def write_lock(db: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """Another process holding the write lock of ``db`` for as long as the block runs."""
    locker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOCKER, str(db),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert locker.stdin is not None and locker.stdout is not None
    try:
        line = await asyncio.wait_for(locker.stdout.readline(), TIMEOUT)
        assert line == b"locked\n", line
        yield locker
    finally:
        if locker.returncode is None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                locker.stdin.write(b"release\n")
                await locker.stdin.drain()
            await asyncio.wait_for(locker.wait(), TIMEOUT)
