"""The local PostgreSQL server for development: ``gateway postgres start|stop``."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from gateway.cli import main
from store import PostgresEventStore, pg_server

from .contract import app


async def _append_and_count(url: str) -> int:
    async with PostgresEventStore(url) as store:
        await store.append(app("s"))
        return await store.last_position()


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A directory the server's user can reach (pytest's tmp_path is private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="gateway-pg-test-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.usefixtures("postgres_binaries")
def test_start_prints_a_url_that_serves_a_store_until_stop(
    server_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = server_dir
    try:
        assert main(["postgres", "start", "--dir", str(directory)]) == 0
        url = capsys.readouterr().out.strip()
        assert url.startswith("postgresql://") and url.endswith("/gateway")
        assert main(["migrate", "--db", url]) == 0
        assert asyncio.run(_append_and_count(url)) == 1
        # Started again while it runs: the same server, the same URL.
        assert main(["postgres", "start", "--dir", str(directory)]) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1] == url
    finally:
        assert main(["postgres", "stop", "--dir", str(directory)]) == 0
    with pytest.raises(OSError, match=r"[Cc]onnect"):
        asyncio.run(asyncpg.connect(url, timeout=5))
    # Its data stays: started again, the log is there.
    try:
        assert main(["postgres", "start", "--dir", str(directory)]) == 0
        url = capsys.readouterr().out.strip()
        assert asyncio.run(_append_and_count(url)) == 2
    finally:
        pg_server.stop(directory, immediate=True)


def test_a_missing_installation_is_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pg_server, "INSTALL_GLOB", str(tmp_path / "nothing" / "*" / "bin"))
    assert main(["postgres", "start", "--dir", str(tmp_path / "pg")]) == 1
    assert "apt-get install postgresql" in capsys.readouterr().err
