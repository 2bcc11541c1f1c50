"""The SQLite writer process: the one connection that writes an event log, in a process of
its own.

A commit is mostly C work (binding rows, SQLite's B-trees, ``fsync``), but under the
standard library's ``sqlite3`` it gives up the GIL around every step and must win it back
after each one. In the gateway's process the event loop holds the GIL nearly all the time
under a flood, so every commit waited for it again and again (measured: a 190-row insert
took 55 ms at p90 on a writer thread, a few ms alone). Here the database work runs in a child
process on a core of its own; the store's writer (`store.sqlite.SqliteEventStore`, on the
event loop that opened it) plans each batch and sends it in one message, and the loop goes on
until the answer arrives (`store.sqlite_process`).

The protocol is private to the two sides: length-prefixed `marshal` messages on a Unix
socket pair, one request at a time, each answered ``("ok", value)`` or ``("error", kind,
reason)`` (kind ``conflict`` for a unique key hit, ``sqlite`` for any other database error,
with the reason in words from `reason`). This file imports nothing but the standard library,
so that the child starts in milliseconds (``python -I store/sqlite_writer.py FD``); it ends
at end of file on its socket (the gateway closed it or died), not on a signal sent to the
whole process group.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import resource
import signal
import socket
import sqlite3
import struct
import sys
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, Final

HEADER: Final = struct.Struct("!I")
"""Each message's length, ahead of it."""
COLUMNS: Final = ("position", "stream", "version", "event_id", "type", "data", "recorded_at")
"""The columns of ``events`` in the order of `store.port.RecordedEvent`'s fields."""
ROWS_PER_INSERT: Final = 500
"""Rows per multi-row INSERT (7 parameters a row: well under SQLite's 32,766)."""
IN_CHUNK: Final = 10_000
"""Most bound values in one ``IN (...)``."""

SQLITE_BUSY: Final = 5
SQLITE_LOCKED: Final = 6
SQLITE_READONLY: Final = 8
SQLITE_IOERR: Final = 10
SQLITE_FULL: Final = 13
NEARLY_FULL: Final = 1 << 20
"""Free bytes under which a disk (or a file under its size limit) counts as full."""


def reason(exc: BaseException, path: str | None = None) -> str:
    """What went wrong, in words a person can act on, with the driver's own message (no SQL,
    no parameters). ``path`` (the database file) lets a failed write say whether its disk
    is full or a file reached this process's size limit."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig) or type(orig).__name__
    code = getattr(orig, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    if primary in (SQLITE_BUSY, SQLITE_LOCKED):
        return f"the event log is locked by another process (SQLite: {text})"
    if primary == SQLITE_READONLY:
        return f"the event log is read-only (SQLite: {text})"
    if primary in (SQLITE_FULL, SQLITE_IOERR):
        found = None if path is None else space_problem(path)
        if found is not None:
            return f"{found} (SQLite: {text})"
        if primary == SQLITE_FULL:
            return f"the disk holding the event log is full (SQLite: {text})"
        return f"the disk holding the event log failed or is full (SQLite: {text})"
    return text


def space_problem(path: str) -> str | None:
    """Why files next to ``path`` cannot grow, if that is the trouble: a file of the log
    at this process's file size limit (``ulimit -f``), or a full disk."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            files = [name for name in (path, f"{path}-wal", f"{path}-journal")
                     if os.path.exists(name)]
            largest = max(files, key=os.path.getsize, default=None)
            if largest is not None and os.path.getsize(largest) + NEARLY_FULL > soft:
                return (f"{os.path.basename(largest)} reached this process's file size "
                        f"limit of {soft} bytes (ulimit -f): raise it")
        stat = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return None
    free = stat.f_bavail * stat.f_frsize
    if free < NEARLY_FULL:
        return (f"the disk holding the event log is full ({os.path.dirname(path)}): "
                "free some space")
    return None


def send(sock: socket.socket, message: Any) -> None:
    """Send one message."""
    body = marshal.dumps(message)
    sock.sendall(HEADER.pack(len(body)) + body)


def receive(sock: socket.socket) -> Any:
    """Receive one message; `EOFError` if the other side closed the socket."""
    header = _exactly(sock, HEADER.size)
    return marshal.loads(_exactly(sock, HEADER.unpack(header)[0]))


def _exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:])
        if count == 0:
            raise EOFError("the other side of the writer's socket closed it")
        got += count
    return bytes(buffer)


def _insert_sql(rows: int) -> str:
    values = ", ".join(["(" + ", ".join("?" * len(COLUMNS)) + ")"] * rows)
    return f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES {values}"


class Writer:
    """The child's side: one connection, one transaction at a time, begun at the first
    request after the last commit or rollback (``BEGIN IMMEDIATE``: the write lock is taken
    there, or the busy timeout runs out there)."""

    def __init__(self, path: str, synchronous: str, busy_timeout_ms: int) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                    cached_statements=256)
        for pragma in (f"busy_timeout={int(busy_timeout_ms)}", "journal_mode=WAL",
                       f"synchronous={synchronous}", "foreign_keys=ON"):
            self.conn.execute(f"PRAGMA {pragma}")
        self.ops: dict[str, Callable[..., Any]] = {
            "last_position": self.last_position, "load_versions": self.load_versions,
            "find_events": self.find_events, "insert": self.insert,
            "insert_commit": self.insert_commit, "commit": self.commit,
            "rollback": self.rollback, "put_snapshot": self.put_snapshot,
            "delete_snapshots": self.delete_snapshots, "query": self.query,
            "lease_rows": self.lease_rows, "swap_lease": self.swap_lease,
            "delete_leases": self.delete_leases,
        }

    def handle(self, op: str, args: Sequence[Any]) -> Any:
        """Answer one request (raising what the database raised)."""
        if op not in ("commit", "rollback", "query") and not self.conn.in_transaction:
            self.conn.execute("BEGIN IMMEDIATE")
        return self.ops[op](*args)

    def last_position(self) -> int:
        return int(self.conn.execute("SELECT max(position) FROM events").fetchone()[0] or 0)

    def load_versions(self, streams: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for stream in streams:  # one index lookup each
            version = self.conn.execute(
                "SELECT max(version) FROM events WHERE stream = ?", (stream,)).fetchone()[0]
            if version is not None:
                found[stream] = int(version)
        return found

    def find_events(self, event_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        found: list[tuple[Any, ...]] = []
        for start in range(0, len(event_ids), IN_CHUNK):
            chunk = list(event_ids[start:start + IN_CHUNK])
            found += self.conn.execute(
                f"SELECT {', '.join(COLUMNS)} FROM events WHERE event_id IN "
                f"({', '.join('?' * len(chunk))})", chunk).fetchall()
        return found

    def insert(self, rows: Sequence[Sequence[Any]]) -> None:
        for start in range(0, len(rows), ROWS_PER_INSERT):
            chunk = rows[start:start + ROWS_PER_INSERT]
            self.conn.execute(_insert_sql(len(chunk)), tuple(chain.from_iterable(chunk)))

    def insert_commit(self, rows: Sequence[Sequence[Any]]) -> None:
        self.insert(rows)
        self.commit()

    def commit(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def put_snapshot(self, snapshot: Sequence[Any], keep: int) -> None:
        conn = self.conn
        conn.execute("DELETE FROM snapshots WHERE position = ?", (snapshot[0],))
        conn.execute("INSERT INTO snapshots (position, fingerprint, checksum, created_at, "
                     "data) VALUES (?, ?, ?, ?, ?)", tuple(snapshot))
        conn.execute("DELETE FROM snapshots WHERE position NOT IN (SELECT position FROM "
                     "snapshots ORDER BY position DESC LIMIT ?)", (keep,))

    def delete_snapshots(self, positions: Sequence[int] | None) -> int:
        if positions is None:
            return int(self.conn.execute("DELETE FROM snapshots").rowcount)
        deleted = 0
        for start in range(0, len(positions), IN_CHUNK):
            chunk = list(positions[start:start + IN_CHUNK])
            deleted += self.conn.execute(
                f"DELETE FROM snapshots WHERE position IN ({', '.join('?' * len(chunk))})",
                chunk).rowcount
        return deleted

    def lease_rows(self, resources: Sequence[str] | None) -> list[tuple[Any, ...]]:
        sql = "SELECT resource, owner, epoch, expires_at FROM leases"
        if resources is None:
            return self.conn.execute(sql).fetchall()
        found: list[tuple[Any, ...]] = []
        for start in range(0, len(resources), IN_CHUNK):
            chunk = list(resources[start:start + IN_CHUNK])
            found += self.conn.execute(
                f"{sql} WHERE resource IN ({', '.join('?' * len(chunk))})", chunk).fetchall()
        return found

    def swap_lease(self, old: Sequence[Any] | None, new: Sequence[Any]) -> bool:
        if old is None:
            return self.conn.execute(
                "INSERT OR IGNORE INTO leases (resource, owner, epoch, expires_at) "
                "VALUES (?, ?, ?, ?)", tuple(new)).rowcount == 1
        return self.conn.execute(
            "UPDATE leases SET owner = ?, epoch = ?, expires_at = ? WHERE resource = ? AND "
            "owner IS ? AND epoch = ? AND expires_at = ?",
            (*new[1:], old[0], *old[1:])).rowcount == 1

    def delete_leases(self, resources: Sequence[str]) -> None:
        self.conn.executemany("DELETE FROM leases WHERE resource = ?",
                              [(resource,) for resource in resources])

    def query(self, sql: str) -> Any:
        """The first column of the first row of ``sql`` (a PRAGMA, say), outside any
        transaction (for tests and diagnostics)."""
        row = self.conn.execute(sql).fetchone()
        return None if row is None else row[0]


def serve(sock: socket.socket) -> None:
    """Answer requests until the socket closes; the first one opens the database."""
    try:
        path, synchronous, busy_timeout_ms = receive(sock)
    except EOFError:
        return
    try:
        writer = Writer(path, synchronous, busy_timeout_ms)
    except sqlite3.Error as exc:
        send(sock, ("error", "sqlite", reason(exc, path)))
        return
    send(sock, ("ok", None))
    while True:
        try:
            op, args = receive(sock)
        except EOFError:
            break
        try:
            answer: Any = ("ok", writer.handle(op, args))
        except sqlite3.IntegrityError as exc:
            answer = ("error", "conflict", reason(exc))
        except sqlite3.Error as exc:
            answer = ("error", "sqlite", reason(exc, path))
        except Exception as exc:  # a bug of this file: said, never hidden
            answer = ("error", "bug", f"{type(exc).__name__}: {exc}")
        if answer[0] == "error":
            # A failure ends the transaction (a failed COMMIT may leave it open).
            with contextlib.suppress(sqlite3.Error):
                writer.rollback()
        send(sock, answer)
    try:
        writer.rollback()  # the gateway is gone: what it did not commit is not committed
    finally:
        writer.conn.close()


if __name__ == "__main__":
    # Ctrl-C in a terminal, ``timeout`` and service managers signal the gateway's whole
    # process group: the writer lets the gateway stop first (its last commits and snapshot
    # go through here) and ends when the gateway closes the socket, or dies.
    for stop_signal in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, signal.SIG_IGN)
    serve(socket.socket(fileno=int(sys.argv[1])))
