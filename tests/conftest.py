"""Shared across test packages: the fast layer, a lighter hypothesis profile for it, and a
throwaway PostgreSQL server for the session with a fresh database per test.

The fast layer (marker ``fast``, given here by folder) is the pure and in-process tests:
``uv run pytest -m fast --hypothesis-profile=fast`` is the quick local loop. A test is left out
of it if it is slow, needs PostgreSQL, starts a process or serves on a socket, or takes over
a second alone. CI runs every test with hypothesis' own profile, whatever the marker.

Tests that need PostgreSQL are skipped where its binaries are missing, unless
``POSTGRES_TESTS_REQUIRED`` is set (CI sets it): then they fail.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Imported before any test: croniter's import (by the schedules) runs ``file -b`` on the
# interpreter (`platform.architecture`), which a fast test may not do; a test file run alone
# whose test first imported the schedules (the command line's ``debug`` does) failed so.
import gateway.runtime.schedules  # noqa: F401
from gateway.base.process import loop_factory
from store import migrate, pg_server, sqlite_writer

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

SLOW_COMMITS_MS = float(os.environ.get("GATEWAY_TEST_SLOW_COMMITS_MS") or 0)
"""With ``GATEWAY_TEST_SLOW_COMMITS_MS=50`` every SQLite commit waits 50 ms first: a test that
reads the log (HTTP reads, the blotter, positions) right after it sees the engine's state,
which runs ahead of the write-behind commits, then fails every time instead of once in many
runs (``GATEWAY_TEST_SLOW_COMMITS_MS=50 uv run pytest tests/e2e``). The whole suite passes
so."""

if SLOW_COMMITS_MS > 0:
    from store.sqlite import _SqliteTransaction

    _commit = _SqliteTransaction.commit

    async def _slow_commit(self: _SqliteTransaction) -> None:
        await asyncio.sleep(SLOW_COMMITS_MS / 1000)
        await _commit(self)

    _SqliteTransaction.commit = _slow_commit  # type: ignore[method-assign]


TEMPLATE = "gateway_template"
"""A database migrated to head once per session; each test's databases are copies of it."""

NewDatabase = Callable[[], Awaitable[str]]
_numbers = itertools.count(1)

TESTS = Path(__file__).resolve().parent
FAST = ("lanes", "store", "gateway", "replay", "service", "test_architecture.py")
"""Where the fast layer's tests live (folders and files under tests/)."""
NOT_FAST = (
    # not in-process
    "service/test_providers.py",  # the official SDKs against a fake provider served by uvicorn
    "service/test_tool_calling.py",  # the same, for tool calls
    "replay/test_snapshots.py::test_a_snapshot_folded_by_a_worker_process",  # a worker process
    "gateway/test_mcp_tools.py",  # an MCP server in a process (stdio), one served by uvicorn
    # in-process, but over a second each on a quiet machine
    "lanes/test_gate_fairness.py::test_a_saturated_gate_uses_nearly_all_its_binding_limit",
    "gateway/test_replays.py::test_an_agent_at_every_position_is_its_plain_replay",
    "gateway/test_stories.py::test_groups_and_jumps_are_the_ones_a_scan_of_the_whole_stream",
    "store/test_sqlite.py::test_the_writer_writes_big_and_many_appends_back_to_back",
    # run a program (the gateway's command line, a fresh interpreter)
    "service/test_logs.py::test_gateway_says_its_version_and_refuses_a_bad_log_format",
    "store/test_migration_check.py::test_opening_a_current_log_does_not_load_alembic",
    "store/test_migration_check.py::test_a_log_behind_the_newest_revision_is_migrated_at_open",
)
"""Tests in those folders that are not in the layer (a prefix of the test's id under tests/)."""
POSTGRES = {"postgres_binaries", "postgres_server", "new_database", "postgres_url"}

FAST_EXAMPLES = 20
settings.register_profile("fast", max_examples=FAST_EXAMPLES, deadline=None)
"""Fewer examples for the quick local loop: ``--hypothesis-profile=fast`` (or the environment
variable ``HYPOTHESIS_PROFILE=fast``) also caps the tests that name their own ``max_examples``.
Without either, hypothesis' own profile applies (``default``, or ``ci`` where CI is set)."""
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def is_fast(item: pytest.Item) -> bool:
    """Whether a test belongs to the fast layer: pure or in-process, quick, no PostgreSQL."""
    if not item.path.is_relative_to(TESTS):
        return False
    where = item.path.relative_to(TESTS).as_posix()
    test_id = f"{where}::{item.nodeid.partition('::')[2]}"
    return (where.split("/")[0] in FAST
            and not test_id.startswith(NOT_FAST)
            and item.get_closest_marker("slow") is None
            and not POSTGRES & set(getattr(item, "fixturenames", ())))


def lighten(item: pytest.Item) -> None:
    """Caps a hypothesis test's own ``max_examples`` at the fast profile's."""
    function = getattr(item, "obj", None)
    test = getattr(function, "__func__", function)
    # hypothesis reads a test's settings from this attribute when the test runs
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if test is not None and isinstance(own, settings) and own.max_examples > FAST_EXAMPLES:
        test._hypothesis_internal_use_settings = settings(own, max_examples=FAST_EXAMPLES)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m fast`` the folders and files outside the layer are not even imported."""
    if config.getoption("markexpr") != "fast" or collection_path.parent != TESTS:
        return None
    outside = collection_path.is_dir() or collection_path.name.startswith("test_")
    return True if outside and collection_path.name not in FAST else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the fast layer; under the fast profile, lightens every hypothesis test."""
    fast_profile = settings.get_current_profile_name() == "fast"
    for item in items:
        if is_fast(item):
            item.add_marker(pytest.mark.fast)
        if fast_profile:
            lighten(item)


@pytest.fixture(autouse=True)
def _no_program_when_fast(request: pytest.FixtureRequest,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of the fast layer that runs a program (the gateway's command line, a fresh
    interpreter; `subprocess`, also under asyncio) or serves on a TCP socket fails: move it
    out with `NOT_FAST`. The SQLite store's own writer process is part of the store, and may
    run (it speaks over a socket pair, which serves nothing)."""
    if request.node.get_closest_marker("fast") is None:
        return
    popen = subprocess.Popen.__init__

    def checked(self: subprocess.Popen[Any], args: Any, *more: Any, **named: Any) -> None:
        if sqlite_writer.__file__ not in [str(arg) for arg in args]:
            raise AssertionError(f"{request.node.nodeid} is in the fast layer and runs a "
                                 f"program ({args!r}): add it to NOT_FAST in tests/conftest.py")
        popen(self, args, *more, **named)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked)


_fast_test: list[str] = []
"""The fast test being set up or run, if one is (its fixtures of wider scope included)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    """Notes a fast test from the start of its setup, before any of its fixtures."""
    _fast_test[:] = [item.nodeid] if item.get_closest_marker("fast") is not None else []
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    """A fixture's teardown may close what it served."""
    _fast_test.clear()
    return (yield)


_listen = socket.socket.listen


def _listen_unless_fast(self: socket.socket, *backlog: int) -> None:
    """`socket.listen`, except in a fast test (or a fixture of one) on a TCP socket."""
    if _fast_test and self.family in (socket.AF_INET, socket.AF_INET6):
        raise AssertionError(f"{_fast_test[0]} is in the fast layer and serves on a socket: "
                             "add it to NOT_FAST in tests/conftest.py")
    _listen(self, *backlog)


socket.socket.listen = _listen_unless_fast  # type: ignore[method-assign, assignment]


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
