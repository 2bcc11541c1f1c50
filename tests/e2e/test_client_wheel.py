"""The client's own distribution (clients/python): its wheel holds `gateway.client` alone,
needs only pydantic, websockets and httpx2, and, installed in a fresh virtual environment
without the gateway, talks to a live gateway over HTTP and WebSocket."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.e2e.live import START_TIMEOUT, TIMEOUT
from tests.e2e.test_http_client import OPS, VIEWER, gateway
from tests.e2e.test_wheel import ROOT, run

pytestmark = pytest.mark.slow

SCRIPT = '''
import asyncio, json, sys

import gateway
import gateway.client
from gateway.client import ControlClient, Forbidden, HttpClient


async def main(url: str, ops: str, viewer: str) -> None:
    out = {"client": gateway.client.__file__, "gateway": getattr(gateway, "__file__", None)}
    async with HttpClient(url, viewer) as api:
        out["agents"] = [a.agent_id for a in await api.agents()]
        try:
            await api.emergency_stop("btc")
        except Forbidden as error:
            out["refused"] = [type(error).__name__, error.code, error.status]
    async with HttpClient(url, ops) as api:
        ack = await api.emergency_stop("btc", reason="from the wheel")
        out["stop"] = [ack.decision, ack.effect.to_state]
    async with ControlClient(url, ops) as client:
        out["hello"] = client.hello.principal
        async with client.subscribe(["btc"], after=0) as events:
            async for event in events:
                if event.event_type == "ControlApplied":
                    out["event"] = event.data["to_state"]
                    break
        ack = await client.submit({"agentId": "btc", "kind": "user_control",
                                   "payload": {"action": "resume"}})
        out["resume"] = ack.effect.to_state
    out["foreign"] = sorted(name for name in sys.modules
                            if name.split(".")[0] in ("gateway", "lanes", "store")
                            and name != "gateway" and not name.startswith("gateway.client"))
    print(json.dumps(out))


asyncio.run(main(*sys.argv[1:]))
'''


def requirements(wheel: Path) -> set[str]:
    """The names of the distributions a wheel requires."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        headers = Parser().parsestr(archive.read(metadata).decode())
        names = [n for n in archive.namelist() if ".dist-info/" not in n]
    assert names and all(n.startswith("gateway/client/") for n in names), names
    return {r.split(";")[0].split("<")[0].split(">")[0].split("=")[0].strip()
            for r in headers.get_all("Requires-Dist") or []}


async def test_the_client_wheel_alone_talks_to_a_live_gateway(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv is not on PATH"
    run(uv, "build", "--wheel", "--out-dir", tmp_path / "dist", ROOT / "clients" / "python",
        cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("gateway_client-*.whl")
    assert requirements(wheel) == {"pydantic", "websockets", "httpx2"}
    venv = tmp_path / "venv"
    run(uv, "venv", "--quiet", "--python", sys.executable, venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(uv, "pip", "install", "--quiet", "--python", python, wheel, cwd=tmp_path)
    script = tmp_path / "use_the_client.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    async with gateway(tmp_path) as live:
        process = await asyncio.create_subprocess_exec(
            python, "-I", script, live.url, OPS, VIEWER, cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(),
                                            START_TIMEOUT + TIMEOUT)
    assert process.returncode == 0, err.decode()[-3000:]
    seen = json.loads(out)
    assert Path(seen["client"]).is_relative_to(venv) and seen["gateway"] is None  # no server
    assert seen["agents"] == ["btc", "news"]
    assert seen["refused"] == ["Forbidden", "forbidden", 403]
    assert seen["stop"] == ["accepted", "HALTED"] and seen["event"] == "HALTED"
    assert seen["hello"] == "ops" and seen["resume"] == "ACTIVE"
    assert seen["foreign"] == []
