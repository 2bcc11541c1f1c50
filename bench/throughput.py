"""Durable requests per second through the engine (submit -> decision after commit), as a
ratio to raw ``sqlite3.executemany`` in batches of 1000 writing the very same rows into the
same schema, measured in the same run.

    uv run python -m bench.throughput [--requests N] [--agents N]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
from pathlib import Path

from bench.common import Figure, machine, requests, table, timed
from gateway.engine import Engine
from gateway.reasoner import RunContext, RunResult
from lanes import AgentConfig, Mode
from store import SqliteEventStore, migrate


class Hang:
    """A reasoner whose runs never end: every later request queues behind them."""

    async def run(self, ctx: RunContext) -> RunResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def engine_run(db: Path, count: int, agents: int, concurrency: int) -> tuple[float, int]:
    """Seconds to submit ``count`` requests with ``concurrency`` in flight; rows written."""
    names = [f"agent{n}" for n in range(agents)]
    config = AgentConfig(mode=Mode.FOLLOWUP, cap=count)
    engine = Engine(SqliteEventStore(db), dict.fromkeys(names, config),
                    reasoners=lambda _: Hang())
    await engine.start()
    batch = requests(names, count)
    before = await engine.store.last_position()
    with timed() as elapsed:
        for start in range(0, count, concurrency):
            acks = await asyncio.gather(*(engine.submit(r) for r in
                                          batch[start:start + concurrency]))
            assert all(a.decision == "accepted" for a in acks)
    rows = await engine.store.last_position() - before
    await engine.stop()
    return elapsed[0], rows


def raw_run(source: Path, target: Path) -> tuple[float, int]:
    """Seconds for raw sqlite3 to write the engine's rows again, executemany x 1000."""
    asyncio.run(migrate(target))
    rows = sqlite3.connect(source).execute(
        "SELECT position, stream, version, event_id, type, data, recorded_at FROM events "
        "ORDER BY position").fetchall()
    db = sqlite3.connect(target, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    sql = ("INSERT INTO events (position, stream, version, event_id, type, data, recorded_at) "
           "VALUES (?, ?, ?, ?, ?, ?, ?)")
    with timed() as elapsed:
        for start in range(0, len(rows), 1000):
            db.execute("BEGIN")
            db.executemany(sql, rows[start:start + 1000])
            db.execute("COMMIT")
    db.close()
    return elapsed[0], len(rows)


def measure(count: int = 100_000, agents: int = 100, concurrency: int = 4_000) -> list[Figure]:
    """Engine vs raw SQLite, same rows, same run."""
    with tempfile.TemporaryDirectory() as tmp:
        engine_db, raw_db = Path(tmp, "engine.db"), Path(tmp, "raw.db")
        engine_s, rows = asyncio.run(engine_run(engine_db, count, agents, concurrency))
        raw_s, raw_rows = raw_run(engine_db, raw_db)
    per_request = rows / count
    engine_rps = count / engine_s
    raw_rps = raw_rows / raw_s / per_request
    return [
        Figure("engine: durable requests/s (submit -> ack after commit)", engine_rps, "req/s"),
        Figure("engine: events written per request", per_request, "rows"),
        Figure("raw sqlite3 executemany x1000, same rows", raw_rps, "req/s"),
        Figure("engine / raw sqlite3", engine_rps / raw_rps, "x", ">= 0.5"),
    ]


def main() -> None:
    """Print the figures as Markdown."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4_000)
    args = parser.parse_args()
    print(f"machine: {machine()}\n")
    print(table(measure(args.requests, args.agents, args.concurrency)))


if __name__ == "__main__":
    main()
