"""Building SQLAlchemy async engines for the store, with the SQLite PRAGMAs it relies on."""

from __future__ import annotations

import os
from typing import Final

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

SYNCHRONOUS_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
"""Values accepted for SQLite's ``PRAGMA synchronous``."""

BUSY_TIMEOUT_MS: Final = 5000
"""How long a SQLite connection waits for a lock before failing with 'database is locked',
by default."""


def database_url(url_or_path: str | os.PathLike[str]) -> URL:
    """Turn a URL or a plain file path into an async SQLAlchemy URL.

    A plain path (anything without ``://``) becomes ``sqlite+aiosqlite:///<absolute path>``;
    a ``sqlite://`` URL gets the aiosqlite driver, a ``postgresql://`` (or ``postgres://``)
    one asyncpg; any other URL is used as given.
    """
    text = os.fspath(url_or_path)
    if "://" not in text:
        return URL.create("sqlite+aiosqlite", database=os.path.abspath(text))
    if text.startswith("postgres://"):
        text = "postgresql://" + text.removeprefix("postgres://")
    url = make_url(text)
    if url.drivername == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
    elif url.drivername == "postgresql":
        url = url.set(drivername="postgresql+asyncpg")
    return url


def is_sqlite(url: URL) -> bool:
    """Whether ``url`` names a SQLite database."""
    return url.get_backend_name() == "sqlite"


def is_postgres(url: URL) -> bool:
    """Whether ``url`` names a PostgreSQL database."""
    return url.get_backend_name() == "postgresql"


def check_synchronous(synchronous: str) -> str:
    """Validate a ``PRAGMA synchronous`` value and return it upper-cased."""
    mode = synchronous.upper()
    if mode not in SYNCHRONOUS_MODES:
        raise ValueError(
            f"synchronous must be one of {sorted(SYNCHRONOUS_MODES)}, not {synchronous!r}"
        )
    return mode


def check_busy_timeout(busy_timeout_ms: int) -> int:
    """Validate a ``PRAGMA busy_timeout`` value (ms, 0 to 600,000) and return it."""
    if not 0 <= busy_timeout_ms <= 600_000:
        raise ValueError(f"busy_timeout_ms must be 0 to 600000 ms, not {busy_timeout_ms!r}")
    return busy_timeout_ms


def create_engine(url: URL, *, synchronous: str = "FULL",
                  busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> AsyncEngine:
    """An async engine for ``url``; on SQLite every new connection gets the store's PRAGMAs.

    The PRAGMAs: ``busy_timeout=<busy_timeout_ms>`` (how long a write waits for a lock held
    by another process), ``journal_mode=WAL``, ``synchronous=<synchronous>`` and
    ``foreign_keys=ON``.
    """
    engine = create_async_engine(url)
    if is_sqlite(url):
        _with_pragmas(engine.sync_engine, synchronous, busy_timeout_ms)
    return engine


def _with_pragmas(engine: Engine, synchronous: str, busy_timeout_ms: int) -> None:
    mode = check_synchronous(synchronous)
    busy = check_busy_timeout(busy_timeout_ms)

    def set_pragmas(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={busy}")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={mode}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    event.listen(engine, "connect", set_pragmas)
