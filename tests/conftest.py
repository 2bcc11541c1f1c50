"""Fixtures shared across test packages: a throwaway PostgreSQL server for the session and a
fresh database per test.

Tests that need PostgreSQL are skipped where its binaries are missing, unless
``POSTGRES_TESTS_REQUIRED`` is set (CI sets it): then they fail.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from gateway.runtime.process import loop_factory
from store import migrate, pg_server

if os.environ.get("GATEWAY_TEST_LOOP") == "uvloop":
    def pytest_asyncio_loop_factories(
            config: pytest.Config, item: pytest.Item
    ) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
        """With ``GATEWAY_TEST_LOOP=uvloop`` the async tests run on uvloop, as `gateway serve`
        does on Linux (``GATEWAY_TEST_LOOP=uvloop uv run pytest tests/faults``); else on
        asyncio's loop."""
        factory = loop_factory("uvloop")
        assert factory is not None
        return {"uvloop": factory}


TEMPLATE = "gateway_template"
"""A database migrated to head once per session; each test's databases are copies of it."""

NewDatabase = Callable[[], Awaitable[str]]
_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_binaries() -> None:
    """Skips the test where PostgreSQL is not installed (fails it if it is required)."""
    if pg_server.find_binaries() is None:
        message = ("PostgreSQL is not installed (/usr/lib/postgresql/*/bin): "
                   "apt-get install postgresql; .ci/run does")
        if os.environ.get("POSTGRES_TESTS_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_server(postgres_binaries: None) -> Iterator[pg_server.PostgresServer]:
    """A PostgreSQL server in a temporary directory (fsync off), for the whole session."""
    with pg_server.throwaway() as server:

        async def prepare() -> None:
            await pg_server.create_database(server.url, TEMPLATE)
            await migrate(server.database_url(TEMPLATE))

        asyncio.run(prepare())
        yield server


@pytest.fixture
async def new_database(postgres_server: pg_server.PostgresServer) -> AsyncIterator[NewDatabase]:
    """Makes empty, migrated databases (their URLs); they are dropped after the test."""
    made: list[str] = []

    async def make() -> str:
        name = f"test_{os.getpid()}_{next(_numbers)}"
        made.append(name)
        return await pg_server.create_database(postgres_server.url, name, TEMPLATE)

    yield make
    for name in made:
        await pg_server.drop_database(postgres_server.url, name)


@pytest.fixture
async def postgres_url(new_database: NewDatabase) -> str:
    """The URL of an empty, migrated database of its own."""
    return await new_database()
