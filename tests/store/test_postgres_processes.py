"""Several processes on one PostgreSQL log: writers appending at the same time, followers in
other processes (`tests.store.pg_worker` is each process)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from store import PostgresEventStore

from .contract import assert_gap_free, take
from .pg_worker import events_per_writer

pytestmark = pytest.mark.slow  # several seconds each (see pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
PROCESS_TIMEOUT_S = 60.0
"""Seconds a process may take to start, or to finish its work."""


class Worker:
    """One `tests.store.pg_worker` process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ready(self) -> None:
        """Wait until it says ``ready``."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), PROCESS_TIMEOUT_S)
        if line != b"ready\n":
            _, err = await asyncio.wait_for(self.process.communicate(), PROCESS_TIMEOUT_S)
            raise AssertionError(f"worker did not start: {line!r} {err.decode()}")

    def go(self) -> None:
        """Let it start working."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")

    async def result(self) -> dict[str, Any]:
        """Its JSON report, once it exited 0."""
        out, err = await asyncio.wait_for(self.process.communicate(), PROCESS_TIMEOUT_S)
        assert self.process.returncode == 0, err.decode()
        report: dict[str, Any] = json.loads(out.splitlines()[-1])
        return report


@contextlib.asynccontextmanager
async def workers() -> AsyncIterator[list[Worker]]:
    """Started workers go in the list; any still running afterwards is killed."""
    started: list[Worker] = []
    try:
        yield started
    finally:
        for worker in started:
            if worker.process.returncode is None:
                worker.process.kill()
                await worker.process.wait()


async def spawn(started: list[Worker], *args: object) -> Worker:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.store.pg_worker", *map(str, args), cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    worker = Worker(process)
    started.append(worker)
    return worker


async def test_writers_in_four_processes_and_followers_in_another(postgres_url: str) -> None:
    writers, appends, tasks, increments = 4, 160, 8, 8
    total = writers * events_per_writer(appends, tasks, increments)
    async with workers() as started:
        follower = await spawn(started, "follower", postgres_url, total)
        appenders = [await spawn(started, "writer", postgres_url, f"w{n}", appends, tasks,
                                 increments) for n in range(writers)]
        await asyncio.gather(*(worker.ready() for worker in started))
        for worker in started:
            worker.go()
        reports = await asyncio.gather(*(worker.result() for worker in appenders))
        followed = (await follower.result())["followers"]

    acked = [tuple(row) for report in reports for row in report["acked"]]
    assert len(acked) == total
    async with PostgresEventStore(postgres_url) as store:
        log = await store.read()
    # Every acknowledged append is in the log exactly once, where it was acknowledged.
    assert_gap_free(log)
    assert sorted(acked) == [(r.position, r.stream, r.version, r.event_id) for r in log]
    versions: dict[str, list[int]] = {}
    for record in log:
        versions.setdefault(record.stream, []).append(record.version)
    assert all(seen == list(range(1, len(seen) + 1)) for seen in versions.values())
    assert len(versions["counter"]) == writers * increments
    # The writers did write at the same time: their commits interleave in the log.
    tags = [r.event_id.split("-", 1)[0] for r in log]
    switches = sum(a != b for a, b in itertools.pairwise(tags))
    assert switches >= 2 * writers, switches
    # Each follower in the other process saw the whole log in position order: no gap, no
    # skipped late commit, no duplicate.
    expected = [[r.position, r.event_id] for r in log]
    for got in followed:
        assert Counter(event_id for _, event_id in got).most_common(1)[0][1] == 1
        assert got == expected


async def test_a_follower_sees_what_another_process_appends(postgres_url: str) -> None:
    async with (PostgresEventStore(postgres_url) as store,
                contextlib.aclosing(store.follow()) as follower, workers() as started):
        waiting = asyncio.ensure_future(take(follower, 1))  # live, on an empty log
        writer = await spawn(started, "writer", postgres_url, "other", 30, 3, 0)
        await writer.ready()
        writer.go()
        first = await waiting  # woken only by the other process's notification
        got = first + await take(follower, events_per_writer(30, 3, 0) - 1)
        report = await writer.result()
    assert [[r.position, r.stream, r.version, r.event_id] for r in got] == sorted(
        report["acked"])
