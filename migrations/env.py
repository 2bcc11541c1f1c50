"""Alembic environment for the event store.

Used two ways: ``store.migrate()`` hands over an open connection in
``config.attributes["connection"]``; otherwise (the alembic CLI) an async engine is built from
the ``sqlalchemy.url`` option.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection

from store.engine import create_engine, database_url
from store.schema import metadata

config = context.config
target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url in the Alembic config to run migrations")
    return url


async def _run_with_own_engine() -> None:
    engine = create_engine(database_url(_url()))
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    """Emit the migration SQL for ``sqlalchemy.url`` without a database."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on one of a fresh engine."""
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        _run(connection)
    else:
        asyncio.run(_run_with_own_engine())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
