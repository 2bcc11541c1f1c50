"""The debugger's commands on a PostgreSQL log, and logs moved between SQLite and PostgreSQL
both ways (the commands run in a worker thread: they run their own event loop)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.cli import main
from tests.golden.record import files


async def gateway(*argv: str) -> int:
    """``gateway ARGV...`` as the command line runs it."""
    return await asyncio.to_thread(main, list(argv))


async def test_a_log_moves_from_sqlite_to_postgresql_and_back_byte_for_byte(
    tmp_path: Path, postgres_url: str,
) -> None:
    golden = files("desk")[0]
    sqlite = tmp_path / "desk.db"
    assert await gateway("import", str(sqlite), str(golden)) == 0
    exported = tmp_path / "from-sqlite.jsonl"
    assert await gateway("export", str(sqlite), "--out", str(exported)) == 0
    assert await gateway("import", postgres_url, str(exported)) == 0
    again = tmp_path / "from-postgres.jsonl"
    assert await gateway("export", postgres_url, "--out", str(again)) == 0
    assert again.read_bytes() == golden.read_bytes()
    back = tmp_path / "back.db"
    assert await gateway("import", str(back), str(again)) == 0
    final = tmp_path / "final.jsonl"
    assert await gateway("export", str(back), "--out", str(final)) == 0
    assert final.read_bytes() == golden.read_bytes()


async def test_replay_verify_timeline_and_whatif_read_a_postgresql_log(
    tmp_path: Path, postgres_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert await gateway("import", postgres_url, str(files("desk")[0])) == 0
    capsys.readouterr()
    assert await gateway("verify", postgres_url) == 0
    assert "no divergence" in capsys.readouterr().out
    assert await gateway("replay", postgres_url, "--agent", "eth", "--at", "57") == 0
    assert "eth at position 57" in capsys.readouterr().out
    assert await gateway("timeline", postgres_url, "--agent", "eth") == 0
    assert "RequestReceived" in capsys.readouterr().out
    config = tmp_path / "other.toml"
    config.write_text('[[agents]]\nid = "eth"\ncap = 5\n')
    assert await gateway("whatif", postgres_url, "--config", str(config)) == 0
    assert "what-if:" in capsys.readouterr().out


async def test_a_password_in_the_url_is_never_printed(
    postgres_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with_password = postgres_url.replace("postgres@", "postgres:hunter2@")
    assert await gateway("replay", with_password, "--agent", "nobody") == 2
    printed = capsys.readouterr()
    assert "hunter2" not in printed.out + printed.err
    assert "no agent 'nobody'" in printed.err


async def test_import_refuses_a_log_that_gateways_serve(
    tmp_path: Path, postgres_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    from store import PostgresEventStore

    store = PostgresEventStore(postgres_url)
    await store.open()
    try:
        await store.join("http://127.0.0.1:1#serving", 60_000)
        assert await gateway("import", postgres_url, str(files("desk")[0])) == 2
    finally:
        await store.close()
    assert "served by gateway processes" in capsys.readouterr().err
