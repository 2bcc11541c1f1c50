"""Each role calls each MCP tool, over Streamable HTTP and through the ``gateway mcp`` stdio
bridge (another process): what a role lists it may call; what it may not call, or names an
agent outside its scope, is refused ``forbidden`` and records nothing; a busy agent answers
busy with ``retryAfterSeconds`` both ways."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from gateway.base.roles import Role
from gateway.edge.auth import Principal
from store import SqliteEventStore
from tests.e2e.live import Live, running
from tests.e2e.test_mcp import AGENTS, ALL_TOOLS, READ_TOOLS, Script, body, error, mcp
from tests.gateway.support import next_event, until

WORKER = {"worker-secret": Principal("w1", Role.WORKER, frozenset({"btc"}))}
CALLS: list[tuple[str, dict[str, Any]]] = [  # every tool, in an order each can be run in
    ("list_agents", {}),
    ("agent_status", {"agentId": "btc"}),
    ("list_approvals", {"agentId": "btc"}),
    ("story", {"agentId": "btc"}),
    ("search_log", {"agentId": "btc", "text": "btc"}),
    ("send_message", {"agentId": "btc", "message": "hello"}),
    ("call_agent", {"agentId": "btc", "message": "how are you"}),
    ("emergency_stop", {"agentId": "btc", "reason": "drill"}),
    ("resume", {"agentId": "btc"}),
    ("approve", {"agentId": "btc", "approvalId": "ap-none"}),
    ("reject", {"agentId": "btc", "approvalId": "ap-none"}),
]
assert {name for name, _ in CALLS} == ALL_TOOLS
LISTED = {"control-secret": ALL_TOOLS, "admin-secret": ALL_TOOLS,
          "scoped-secret": ALL_TOOLS, "viewer-secret": READ_TOOLS,
          "feed-secret": set(), "worker-secret": set()}


@contextlib.asynccontextmanager
async def bridged(live: Live, token: str) -> AsyncIterator[ClientSession]:
    """An MCP session through ``gateway mcp`` (a process of its own) with ``token``."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "gateway", "mcp", "--url", f"{live.http}/mcp",
                                      "--token-env", "GW_MCP_TOKEN"],
        env={**os.environ, "GW_MCP_TOKEN": token})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await asyncio.wait_for(session.initialize(), 60)
        yield session


async def quiet(live: Live) -> None:
    """Until btc's earlier requests are run and every event decided so far is committed: an
    accepted call's run goes on after its answer, and appends as it goes."""
    async def idle() -> bool:
        state = live.engine.state("btc")
        return state.active is None and not state.pending
    await until(idle, "btc idle")
    await live.engine.flush()


async def refused_unrecorded(live: Live, session: ClientSession, tool: str,
                             arguments: dict[str, Any]) -> None:
    """The call is a ``forbidden`` tool error and the log did not grow."""
    await quiet(live)
    before = await live.engine.store.last_position()
    frame = error(await session.call_tool(tool, arguments))
    assert frame["code"] == "forbidden", (tool, frame)
    await live.engine.flush()  # (had it recorded anything, that is committed now)
    assert await live.engine.store.last_position() == before, tool


async def every_tool(live: Live, session: ClientSession, token: str) -> None:
    """Each tool as ``token``'s role and scope allow: listed ones answer, others refuse."""
    listed = {t.name for t in (await session.list_tools()).tools}
    assert listed == LISTED[token], token
    for tool, arguments in CALLS:
        if tool not in listed:
            await refused_unrecorded(live, session, tool, arguments)
            continue
        answer = body(await session.call_tool(tool, arguments))
        if tool == "call_agent":
            assert answer["status"] == "returned", answer
        elif tool in ("send_message", "emergency_stop", "resume"):
            assert answer["decision"] == "accepted", (tool, answer)
        elif tool in ("approve", "reject"):  # (no such approval: its ack says so)
            assert answer["decision"] == "rejected", (tool, answer)
        if token == "scoped-secret" and tool != "list_agents":  # eth: outside its scope
            await refused_unrecorded(live, session, tool, {**arguments, "agentId": "eth"})
    assert live.engine.state("btc").trading.value == "ACTIVE"
    if "resume" in listed and token != "scoped-secret":
        unknown = error(await session.call_tool("resume", {"agentId": "zzz"}))
        assert unknown["code"] == "unknown_agent", unknown


async def busy(live: Live, session: ClientSession, script: Script) -> None:
    """A call to a running agent answers busy with retryAfterSeconds."""
    body(await session.call_tool("send_message", {"agentId": "eth", "message": "think"}))
    await next_event(live.engine.store, "RunStarted")
    answer = body(await session.call_tool("call_agent", {"agentId": "eth", "message": "now?"}))
    assert answer["status"] == "busy" and answer["retryAfterSeconds"] >= 1, answer
    script.hold.set()


async def check_each_tool(tmp_path: Path, token: str, over_bridge: bool) -> None:
    script = Script()
    script.hold.clear()
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, script,
                       tokens=WORKER) as live:
        opened = bridged(live, token) if over_bridge else mcp(live, token)
        async with opened as session:
            await every_tool(live, session, token)
            if token in ("control-secret", "admin-secret"):
                await busy(live, session, script)
        script.hold.set()


@pytest.mark.parametrize("token", sorted(LISTED))
async def test_each_role_calls_each_tool_over_http(tmp_path: Path, token: str) -> None:
    await check_each_tool(tmp_path, token, over_bridge=False)


@pytest.mark.slow
@pytest.mark.parametrize("token", sorted(LISTED))
async def test_each_role_calls_each_tool_through_the_stdio_bridge(tmp_path: Path,
                                                                  token: str) -> None:
    await check_each_tool(tmp_path, token, over_bridge=True)


@pytest.mark.slow
async def test_the_bridge_with_a_refused_token_or_none_says_why_in_one_line(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Script()) as live:
        for token, code, words in (("wrong-secret", 1, "401"), ("", 2, "is not set")):
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "mcp", "--url", f"{live.http}/mcp",
                "--token-env", "GW_MCP_TOKEN", env={**os.environ, "GW_MCP_TOKEN": token},
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(process.communicate(b""), 60)
            said = err.decode().strip()
            assert process.returncode == code and out == b"", (code, said)
            assert said.startswith("gateway mcp: ") and words in said, said
            assert "Traceback" not in said and len(said.splitlines()) == 1, said
