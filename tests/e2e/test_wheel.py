"""The built wheel, installed in a fresh virtual environment outside the checkout: it says its
version, migrates a log, and `gateway demo` serves the panel and the OpenAPI document."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from tests.e2e.live import START_TIMEOUT, TIMEOUT

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run(*command: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


async def test_the_wheel_installed_elsewhere_serves_the_panel_and_migrates(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv is not on PATH"
    run(uv, "build", "--wheel", "--out-dir", tmp_path / "dist", ROOT, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    venv = tmp_path / "venv"
    run(uv, "venv", "--quiet", "--python", sys.executable, venv, cwd=tmp_path)
    run(uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python", wheel,
        cwd=tmp_path)
    gateway = venv / "bin" / "gateway"
    assert run(gateway, "--version", cwd=tmp_path).startswith("gateway 0.")
    assert "migrated" in run(gateway, "migrate", "--db", tmp_path / "m.db", cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    demo = await asyncio.create_subprocess_exec(
        gateway, "demo", "--db", tmp_path / "demo.db", "--port", "0", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        assert demo.stdout is not None
        url = ""
        while not url:  # (it prints where it serves once it does)
            line = (await asyncio.wait_for(demo.stdout.readline(), START_TIMEOUT)).decode()
            assert line, "the demo ended without saying where it serves"
            if line.startswith("gateway serving on "):
                url = line.split()[-1]
        async with httpx2.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
            panel = await http.get("/")
            assert panel.status_code == 200 and "<html" in panel.text.lower()
            assert (await http.get("/js/main.js")).status_code == 200
            assert (await http.get("/openapi.json")).json()["openapi"].startswith("3.")
    finally:
        if demo.returncode is None:
            demo.terminate()
        await asyncio.wait_for(demo.wait(), 60)
