"""A start on a log at the newest revision reads the revision and never loads Alembic (most of
a second of every restart); one behind it is migrated."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from store import SqliteEventStore, migrate
from store.migration import HEAD

OPEN_AND_SAY = """
import asyncio, sys
from store import SqliteEventStore

async def main() -> None:
    store = SqliteEventStore(sys.argv[1])
    await store.open()
    await store.close()

asyncio.run(main())
print("alembic" in sys.modules)
"""


def _opened(db: Path) -> str:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", OPEN_AND_SAY, str(db)], cwd=root,
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


async def test_opening_a_current_log_does_not_load_alembic(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    await migrate(db)
    assert _opened(db) == "False"


async def test_a_log_behind_the_newest_revision_is_migrated_at_open(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    await migrate(db, "0002")
    assert _opened(db) == "True"
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() \
            == [(HEAD,)]
    store = SqliteEventStore(db)
    await store.open()
    await store.close()
