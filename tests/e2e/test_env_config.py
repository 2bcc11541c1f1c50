"""`gateway serve` configured from the environment: the config file's path, the log, the
host and port, the PostgreSQL URL from a variable; the command line wins; a bad value names
its variable; with no config file at all, a minimal gateway starts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from gateway.config import ConfigError, parse_config
from tests.e2e.live import START_TIMEOUT, TIMEOUT

CONFIG = """
[[tokens]]
name = "ops"
token = "control-token-secret-1234"
role = "control"
"""


async def serve(cwd: Path, env: dict[str, str], *args: str, tokens: bool = False
                ) -> tuple[str, list[str]]:
    """Start `gateway serve`, wait until it says where (and, with ``tokens``, until it has
    said its fresh tokens), read /livez, stop it: its URL and what it printed."""
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, **env}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", *args, cwd=cwd, env=full,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    printed: list[str] = []
    try:
        assert process.stdout is not None
        url = ""
        while not url:
            line = (await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT)).decode()
            assert line, f"it ended: {printed}"
            printed.append(line.rstrip())
            if line.startswith("gateway serving on "):
                url = line.split()[-1]
        async with httpx2.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
            assert (await http.get("/livez")).status_code == 200
        while tokens and not printed[-1].startswith("event log:"):
            line = (await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT)).decode()
            assert line, f"it ended: {printed}"
            printed.append(line.rstrip())
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 60)
    return url, printed


async def test_the_config_file_log_and_port_come_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    db = tmp_path / "from-env.db"
    url, _ = await serve(tmp_path, {"GATEWAY_CONFIG": str(config), "GATEWAY_DB": str(db),
                                    "GATEWAY_PORT": "0", "GATEWAY_HOST": "127.0.0.1",
                                    "GATEWAY_LOG_FORMAT": "json"})
    assert url.startswith("http://127.0.0.1:") and db.exists()


async def test_with_no_config_file_a_minimal_gateway_starts_and_keeps_its_tokens(
        tmp_path: Path) -> None:
    _, first = await serve(tmp_path, {"GATEWAY_PORT": "0", "GATEWAY_PROT": "8000"},
                           tokens=True)
    admin = [line for line in first if line.startswith("admin token (gateway-admin): ")]
    assert len(admin) == 1 and (tmp_path / "gateway.db").exists()
    assert any("GATEWAY_PROT is not a setting of the gateway" in line for line in first)
    _, again = await serve(tmp_path, {"GATEWAY_PORT": "0"}, tokens=True)
    assert admin[0] in again  # kept beside the log: open panels stay logged in
    assert (tmp_path / "gateway.db.tokens.json").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("GATEWAY_PORT", "eighty", "GATEWAY_PORT: 'eighty' is not a port"),
    ("GATEWAY_EVENT_LOOP", "trio", "GATEWAY_EVENT_LOOP: 'trio' is not one of"),
    ("GATEWAY_LOG_LEVEL", "loud", "GATEWAY_LOG_LEVEL: log setting 'loud'"),
    ("GATEWAY_CONFIG", "/nowhere/gateway.toml", "cannot read"),
])
def test_a_bad_value_stops_the_start_naming_its_variable(
        tmp_path: Path, variable: str, value: str, said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    done = subprocess.run([sys.executable, "-m", "gateway", "serve"], cwd=tmp_path,
                          env={**env, variable: value}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr


async def test_the_command_line_wins_over_the_environment(tmp_path: Path) -> None:
    url, _ = await serve(tmp_path, {"GATEWAY_PORT": "1"}, "--port", "0")  # (1: not ours)
    assert not url.endswith(":1")


def test_the_postgresql_url_comes_from_the_variable_store_url_env_names() -> None:
    config = parse_config('[store]\nurl_env = "LOG_URL"\n',
                          env={"LOG_URL": "postgresql://gw:secret@db:5432/log"})
    assert config.store.where == "postgresql://gw:secret@db:5432/log"
    assert "secret@db" not in config.model_dump_json()
    with pytest.raises(ConfigError, match=r"store\.url_env: environment variable LOG_URL is not"):
        parse_config('[store]\nurl_env = "LOG_URL"\n', env={})
    with pytest.raises(ConfigError, match="not a postgresql:// URL"):
        parse_config('[store]\nurl_env = "LOG_URL"\n', env={"LOG_URL": "mysql://x"})
