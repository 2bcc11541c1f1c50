"""Durable appends per second through the event store on PostgreSQL against SQLite in the same
run, then with 1, 2 and 4 writer processes sharing one PostgreSQL log.

Both databases are durable: SQLite with WAL and ``synchronous=FULL``, a throwaway PostgreSQL
server (`store.pg_server`, from Debian's binaries) with ``fsync`` on, both on the same disk.
Each append is one event (a ~100-byte JSON object) to one of 100 streams, without an
expected version; a caller waits for its append's commit before the next. Each writer process
opens a store of its own (its own streams, as an agent owned by one process would have) and
all start together; their rate is every event appended over the wall time from the start to
the last commit.

    uv run python -m bench.pg_throughput [--appends N] [--sequential N] [--callers N]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import tempfile
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

from bench.common import Figure, run
from store import (
    Append,
    GroupCommitStore,
    NewEvent,
    PostgresEventStore,
    SqliteEventStore,
    pg_server,
)

STREAMS = 100
DATA = '{"symbol": "BTCUSD", "side": "buy", "qty": 0.25, "price": 97123.5, "reason": "bench"}'
PROCESSES = (1, 2, 4)
TIMEOUT_S = 300.0


async def append_all(store: GroupCommitStore, tag: str, count: int, callers: int) -> None:
    """``count`` one-event appends from ``callers`` tasks, each waiting for its commit."""

    async def caller(number: int) -> None:
        for i in range(number, count, callers):
            event = NewEvent(f"{tag}-{i}", "Bench", DATA)
            await store.append(Append(f"{tag}-agent{i % STREAMS}", [event], None))

    await asyncio.wait_for(asyncio.gather(*(caller(n) for n in range(callers))), TIMEOUT_S)


async def rate(store: GroupCommitStore, tag: str, count: int, callers: int) -> float:
    """Appends per second of `append_all` on an opened store."""
    start = time.perf_counter()
    await append_all(store, tag, count, callers)
    return count / (time.perf_counter() - start)


async def in_process(server: pg_server.PostgresServer, folder: Path, count: int, sequential: int,
                     callers: int) -> dict[str, float]:
    """One caller at a time and ``callers`` at once, on PostgreSQL and on SQLite."""
    rates: dict[str, float] = {}
    for backend in ("postgresql", "sqlite"):
        store: GroupCommitStore
        if backend == "postgresql":
            url = await pg_server.create_database(server.url, "bench_in_process")
            store = PostgresEventStore(url)
        else:
            store = SqliteEventStore(folder / "bench.db")
        async with store:
            rates[f"{backend} one"] = await rate(store, "one", sequential, 1)
            rates[f"{backend} many"] = await rate(store, "many", count, callers)
    return rates


def _writer(url: str, tag: str, count: int, callers: int, start: Barrier,
            results: multiprocessing.Queue[tuple[float, float]]) -> None:
    """A writer process: open, wait for the others, append; report its start and end."""

    async def main() -> tuple[float, float]:
        async with PostgresEventStore(url) as store:
            start.wait(TIMEOUT_S)  # everyone's store is open: go
            began = time.time()
            await append_all(store, tag, count, callers)
            return began, time.time()

    results.put(asyncio.run(main()))


def processes_rate(url: str, processes: int, count: int, callers: int) -> float:
    """Appends per second of ``processes`` writer processes on one log, ``count`` each."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(processes)
    results: multiprocessing.Queue[tuple[float, float]] = context.Queue()
    workers = [context.Process(target=_writer, args=(url, f"p{n}", count, callers, start,
                                                      results)) for n in range(processes)]
    for worker in workers:
        worker.start()
    try:
        spans = [results.get(timeout=TIMEOUT_S) for _ in workers]
    finally:
        for worker in workers:
            worker.join(TIMEOUT_S)
    if any(worker.exitcode != 0 for worker in workers):
        raise RuntimeError("a writer process failed")
    return processes * count / (max(end for _, end in spans) - min(s for s, _ in spans))


def measure(appends: int = 10_000, sequential: int = 1_000, callers: int = 500,
            server: pg_server.PostgresServer | None = None,
            processes: tuple[int, ...] = PROCESSES) -> list[Figure]:
    """The figures; on a throwaway durable server unless ``server`` is given."""
    with tempfile.TemporaryDirectory() as folder:
        if server is not None:
            return _measure(server, Path(folder), appends, sequential, callers, processes)
        with pg_server.throwaway(durable=True) as made:
            return _measure(made, Path(folder), appends, sequential, callers, processes)


def _measure(server: pg_server.PostgresServer, folder: Path, appends: int, sequential: int,
             callers: int, counts: tuple[int, ...]) -> list[Figure]:
    rates = asyncio.run(in_process(server, folder, appends, sequential, callers))
    figures = [
        Figure("one caller waiting for each commit, PostgreSQL", rates["postgresql one"],
               "appends/s"),
        Figure("... SQLite", rates["sqlite one"], "appends/s"),
        Figure("... PostgreSQL / SQLite", rates["postgresql one"] / rates["sqlite one"], "x"),
        Figure(f"{callers} callers at once (group commit), PostgreSQL",
               rates["postgresql many"], "appends/s"),
        Figure("... SQLite", rates["sqlite many"], "appends/s"),
        Figure("... PostgreSQL / SQLite", rates["postgresql many"] / rates["sqlite many"], "x"),
    ]
    single = 0.0
    for processes in counts:
        url = asyncio.run(pg_server.create_database(server.url, f"bench_processes_{processes}"))
        value = processes_rate(url, processes, appends, callers)
        single = single or value
        figures.append(Figure(
            f"{processes} writer process{'es' if processes > 1 else ''} on one PostgreSQL log, "
            f"{callers} callers each", value, "appends/s"))
        if processes > 1:
            figures.append(Figure(f"... {processes} processes / 1", value / single, "x"))
    return figures


if __name__ == "__main__":
    run(measure, appends=10_000, sequential=1_000, callers=500)
