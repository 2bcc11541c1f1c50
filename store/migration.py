"""Running the Alembic migrations in ``migrations/`` programmatically (no alembic.ini).

Alembic is imported only when a database is behind `HEAD`: a start on a current database
(every restart) reads its revision with one query and never loads Alembic and its scripts,
which would take most of a second of the start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, func, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations

from .engine import create_engine, database_url

if TYPE_CHECKING:
    from alembic.config import Config

HEAD = "0003"
"""The newest revision in ``migrations/versions``."""


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config pointing at the ``migrations`` package, built in code.

    ``url`` becomes ``sqlalchemy.url`` (used only when no connection is handed over in
    ``config.attributes["connection"]``).
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).resolve().parent))
    if url is not None:
        # ConfigParser interpolates '%', so a URL with escapes must be doubled.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


MIGRATION_LOCK = 0x6761_7465_7761_796D
"""PostgreSQL advisory lock key held while migrating: processes starting together on one
database migrate one after the other (the later ones find it at head)."""


def revision_of(connection: Connection) -> str | None:
    """The Alembic revision the database is at (None: never migrated)."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _upgrade(connection: Connection, revision: str) -> None:
    if revision in ("head", HEAD) and revision_of(connection) == HEAD:
        return  # current already (every restart): no Alembic
    from alembic import command

    if connection.dialect.name == "postgresql":
        connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK)))
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


async def upgrade_engine(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the database behind ``engine`` to ``revision`` in one transaction."""
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade, revision)


async def migrate(url: str | os.PathLike[str], revision: str = "head") -> None:
    """Run ``alembic upgrade head`` (or to ``revision``) on the database at ``url``.

    A coroutine: ``await store.migrate("sqlite+aiosqlite:///gateway.db")``. A plain path means
    a SQLite file; a ``postgresql://`` URL a PostgreSQL database. Opening a store does this
    itself; call it directly only to prepare a database ahead of time.
    """
    engine = create_engine(database_url(url))
    try:
        await upgrade_engine(engine, revision)
    finally:
        await engine.dispose()
