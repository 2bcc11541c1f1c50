"""The same durable enqueue through the gateway engine and through peers, in the same run.

Every peer stores the JSON of the very same requests (`bench.common.requests`), one row or
event per request, in SQLite with ``journal_mode=WAL`` and ``synchronous=FULL`` (the
gateway's setting; each peer's connection is set to it, and read back, where the library
exposes the connection), each run in a fresh temporary directory:

- the gateway engine on `SqliteEventStore`: two events per request (received, queued) after
  ``decide``, group-committed; its runs never end, so every request queues;
- persist-queue's ``SQLiteAckQueue.put``: a transaction per put. It has no batch API
  (``auto_commit=False`` is refused by the ack queue; on the plain queue it only defers the
  deletes of ``get``, every put still commits);
- the eventsourcing library's ``SQLiteApplicationRecorder.insert_events``: one transaction
  per call, with 1 or 100 stored events (a stream per agent, versions counting up);
- raw ``sqlite3``: one ``INSERT`` and ``COMMIT`` per request, or ``executemany`` of 100
  (and of 1000, the limit) per transaction, into ``(id, agent, data)`` with no index but
  the rowid (persist-queue's shape).

The peers are handed the requests' JSON ready made; the engine takes the parsed requests
(as its WebSocket handler does) and encodes its two events itself.

Two shapes. *One at a time*: each enqueue is durable before the next is made (one caller;
the engine also with 4,000 concurrent callers, since group commit is its design, and the
peers cannot use that: their commits are serialised behind one lock or connection).
*Batched*: 100 requests per call and transaction (the engine: frames of 100 through
``submit_many``, from one client and from 40). Each figure is the best of a few rounds
(see `measure`). Ratios are gateway / peer.

    uv run python -m bench.peers [--requests N] [--agents N] [--concurrency N] [--rounds N]
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import cast

import persistqueue
from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

from bench.common import Figure, requests, run, timed
from bench.throughput import engine_run

BATCH = 100
LIMIT = 1000
TOPIC = "bench:RequestReceived"


def bodies(agents: int, count: int) -> list[tuple[str, str]]:
    """``(agent, request JSON)`` of ``count`` requests, as the engine's clients send them."""
    names = [f"agent{n}" for n in range(agents)]
    return [(r.agent_id, r.model_dump_json()) for r in requests(names, count)]


def engine_rps(count: int, agents: int, concurrency: int, batched: bool = False) -> float:
    """Durable requests/s through the engine (`bench.throughput.engine_run`)."""
    with tempfile.TemporaryDirectory() as tmp:
        seconds, _ = asyncio.run(engine_run(Path(tmp, "engine.db"), count, agents,
                                            concurrency, batched))
    return count / seconds


def persist_queue_rps(items: list[tuple[str, str]]) -> float:
    """Durable requests/s through ``SQLiteAckQueue.put``, one transaction per put."""
    with tempfile.TemporaryDirectory() as tmp:
        queue = persistqueue.SQLiteAckQueue(tmp, multithreading=False)
        # No option for it: set FULL on the connection its puts go through.
        putter = cast(sqlite3.Connection, queue._putter)
        putter.execute("PRAGMA synchronous=FULL")
        check_full(putter.execute("PRAGMA synchronous").fetchone()[0])
        with timed() as elapsed:
            for _, body in items:
                queue.put(body)
        assert queue.qsize() == len(items)
        queue.close()
    return len(items) / elapsed[0]


def eventsourcing_rps(items: list[tuple[str, str]], batch: int) -> float:
    """Durable requests/s through ``SQLiteApplicationRecorder.insert_events``, ``batch``
    stored events per call (one transaction each)."""
    versions: dict[str, int] = {}
    stored = []
    for agent, body in items:
        versions[agent] = versions.get(agent, 0) + 1
        stored.append(StoredEvent(originator_id=uuid.uuid5(uuid.NAMESPACE_URL, agent),
                                  originator_version=versions[agent], topic=TOPIC,
                                  state=body.encode()))
    with tempfile.TemporaryDirectory() as tmp:
        datastore = SQLiteDatastore(str(Path(tmp, "eventsourcing.db")))
        recorder = SQLiteApplicationRecorder(datastore)
        recorder.create_table()
        # The pool hands the one writer connection out again and again; set it to FULL.
        with datastore.get_connection(commit=True) as connection:
            cursor = connection.cursor()
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA synchronous")
            check_full(cursor.fetchone()[0])
        with timed() as elapsed:
            for start in range(0, len(stored), batch):
                recorder.insert_events(stored[start:start + batch])
        with datastore.get_connection(commit=True) as connection:
            cursor = connection.cursor()
            cursor.execute("PRAGMA synchronous")
            check_full(cursor.fetchone()[0])
        assert recorder.max_notification_id() == len(items)
        datastore.close()
    return len(items) / elapsed[0]


def sqlite_rps(items: list[tuple[str, str]], batch: int) -> float:
    """Durable requests/s through raw ``sqlite3``: ``batch`` rows per transaction, one
    ``execute`` each when ``batch`` is 1, else ``executemany``."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp, "raw.db"), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE requests (id INTEGER PRIMARY KEY, agent TEXT, data TEXT)")
        sql = "INSERT INTO requests (agent, data) VALUES (?, ?)"
        with timed() as elapsed:
            if batch == 1:
                for item in items:
                    db.execute("BEGIN")
                    db.execute(sql, item)
                    db.execute("COMMIT")
            else:
                for start in range(0, len(items), batch):
                    db.execute("BEGIN")
                    db.executemany(sql, items[start:start + batch])
                    db.execute("COMMIT")
        assert db.execute("SELECT count(*) FROM requests").fetchone()[0] == len(items)
        db.close()
    return len(items) / elapsed[0]


def check_full(synchronous: int) -> None:
    """``PRAGMA synchronous`` reads 2 (``FULL``)."""
    if synchronous != 2:
        raise RuntimeError(f"the peer's connection is at synchronous={synchronous}, not FULL")


def measure(count: int = 100_000, agents: int = 100, concurrency: int = 4_000,
            rounds: int = 3) -> list[Figure]:
    """Requests/s of each way of enqueueing durably (the best of ``rounds`` rounds, each
    round running every way once, in turn, so that load from elsewhere on a shared machine
    falls on all of them alike), and gateway / peer.

    One at a time with one caller is bounded by an fsync per request, so it runs on
    ``count // 10`` requests; every other figure on ``count``.
    """
    single = max(1, count // 10)
    one_items, items = bodies(agents, single), bodies(agents, count)
    ways: dict[str, Callable[[], float]] = {
        "engine_1": lambda: engine_rps(single, agents, 1),
        "engine_n": lambda: engine_rps(count, agents, concurrency),
        "pq_1": lambda: persist_queue_rps(one_items),
        "es_1": lambda: eventsourcing_rps(one_items, 1),
        "raw_1": lambda: sqlite_rps(one_items, 1),
        "engine_b1": lambda: engine_rps(count, agents, BATCH, batched=True),
        "engine_bn": lambda: engine_rps(count, agents, concurrency, batched=True),
        "es_b": lambda: eventsourcing_rps(items, BATCH),
        "raw_b": lambda: sqlite_rps(items, BATCH),
        "raw_limit": lambda: sqlite_rps(items, LIMIT),
    }
    best = dict.fromkeys(ways, 0.0)
    for _ in range(rounds):
        for name, way in ways.items():
            best[name] = max(best[name], way())
    engine_1, engine_n, pq_1, es_1, raw_1 = (
        best[n] for n in ("engine_1", "engine_n", "pq_1", "es_1", "raw_1"))
    engine_b1, engine_bn, es_b, raw_b, raw_limit = (
        best[n] for n in ("engine_b1", "engine_bn", "es_b", "raw_b", "raw_limit"))
    clients = f"{concurrency:,} clients"
    frames = f"{max(1, concurrency // BATCH):,} clients"

    def ratios(shape: str, gateway: list[tuple[str, float]],
               peers: list[tuple[str, float]], unlike: frozenset[str] = frozenset()
               ) -> list[Figure]:
        """Like for like is the gateway with 1 client against a peer not in ``unlike``;
        other pairs are named as not (many callers against one, batches against puts)."""
        return [Figure(f"{shape}: gateway ({g}) / {p}" + (
                    "" if g == "1 client" and p not in unlike else " (not like for like)"),
                       g_rps / p_rps, "x")
                for g, g_rps in gateway for p, p_rps in peers]

    def one(what: str) -> str:
        return f"one at a time, {what}"

    def batched(what: str) -> str:
        return f"batched x{BATCH}, {what}"

    return [
        Figure(one("gateway engine, 1 client (2 events per request, group commit)"),
               engine_1, "req/s"),
        Figure(one(f"gateway engine, {clients} each waiting for its ack"), engine_n, "req/s"),
        Figure(one("persist-queue SQLiteAckQueue.put (a commit per put)"), pq_1, "req/s"),
        Figure(one("eventsourcing SQLiteApplicationRecorder.insert_events x1"), es_1, "req/s"),
        Figure(one("raw sqlite3 INSERT + COMMIT"), raw_1, "req/s"),
        *ratios("one at a time", [("1 client", engine_1), (clients, engine_n)],
                [("persist-queue", pq_1), ("eventsourcing", es_1), ("raw sqlite3", raw_1)]),
        Figure(batched("gateway engine, 1 client, frames of 100 (submit_many)"), engine_b1,
               "req/s"),
        Figure(batched(f"gateway engine, {frames}, frames of 100"), engine_bn, "req/s"),
        Figure(batched("persist-queue: no batch API (one put per commit, as above)"), pq_1,
               "req/s"),
        Figure(batched("eventsourcing insert_events x100 per transaction"), es_b, "req/s"),
        Figure(batched("raw sqlite3 executemany x100 per transaction"), raw_b, "req/s"),
        Figure(f"raw sqlite3 executemany x{LIMIT} per transaction (the limit)", raw_limit,
               "req/s"),
        *ratios("batched", [("1 client", engine_b1), (frames, engine_bn)],
                [("persist-queue puts", pq_1), ("eventsourcing x100", es_b),
                 ("raw sqlite3 x100", raw_b), (f"raw sqlite3 x{LIMIT}", raw_limit)],
                unlike=frozenset({"persist-queue puts"})),
    ]


if __name__ == "__main__":
    run(measure, requests=100_000, agents=100, concurrency=4_000, rounds=3)
