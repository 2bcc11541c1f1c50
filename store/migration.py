"""Running the Alembic migrations in ``migrations/`` programmatically (no alembic.ini)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations

from .engine import create_engine, database_url

HEAD = "0003"
"""The newest revision in ``migrations/versions``."""


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config pointing at the ``migrations`` package, built in code.

    ``url`` becomes ``sqlalchemy.url`` (used only when no connection is handed over in
    ``config.attributes["connection"]``).
    """
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).resolve().parent))
    if url is not None:
        # ConfigParser interpolates '%', so a URL with escapes must be doubled.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


MIGRATION_LOCK = 0x6761_7465_7761_796D
"""PostgreSQL advisory lock key held while migrating: processes starting together on one
database migrate one after the other (the later ones find it at head)."""


def _upgrade(connection: Connection, revision: str) -> None:
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
