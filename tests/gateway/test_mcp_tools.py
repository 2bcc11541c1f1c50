"""Tools of an MCP server for an agent's model: a small MCP server started by the test (the
official SDK, over stdio, and over streamable HTTP with a header from the environment); its
allowed tools are offered beside the built-ins, each call and result recorded, a tool it has
but the allow-list leaves out refused; a tool that hangs, one that raises and a server that
cannot start or refuses the connection are tool errors the model reads, within the timeout,
while the control lane answers and another agent's run goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from gateway.base.clock import SystemClock
from gateway.config.mcp import McpServerConfig
from gateway.llm.mcp_tools import START_S, McpServerSpec, McpTools
from gateway.llm.port import Completion, ToolCall
from gateway.llm.reasoner import LLMReasoner, RunContext, RunResult
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode, verify
from lanes.events import Outcome
from store import MemoryEventStore
from tests.gateway.mcp_news_server import http_app
from tests.gateway.support import control, log_of, next_event, request, until
from tests.gateway.test_gate_engine import ScriptedLLM, answer

SERVER = str(Path(__file__).with_name("mcp_news_server.py"))
TOOLS = ("news__headlines", "news__hang", "news__boom")


def calling(*calls: ToolCall) -> Completion:
    return Completion(text="", input_tokens=300, output_tokens=20, stop_reason="tool_use",
                      tool_calls=calls)


async def engine_with(client: ScriptedLLM, command: tuple[str, ...], timeout_ms: int = 2_000,
                      builtin: tuple[str, ...] = ()
                      ) -> tuple[Engine, MemoryEventStore, McpTools]:
    store = MemoryEventStore()
    mcp = McpTools({"btc": [McpServerSpec(name="news", tools=("headlines", "hang", "boom"),
                                          command=command, timeout_ms=timeout_ms)]})
    reasoner = LLMReasoner(client)
    engine = Engine(store, {"btc": AgentConfig(mode=Mode.FOLLOWUP, mcp_tools=TOOLS,
                                                     tools=builtin),
                            "eth": AgentConfig(mode=Mode.FOLLOWUP)},
                    clock=SystemClock(), mcp=mcp,
                    reasoners=lambda agent: reasoner if agent == "btc" else Quick())
    await engine.start()
    mcp.start()
    return engine, store, mcp


class Quick:
    """An agent beside: answers at once."""

    async def run(self, ctx: RunContext) -> RunResult:
        return RunResult(outcome=Outcome.NO_TRADE, answer="quick")


async def test_an_agent_calls_an_mcp_servers_tools_and_every_failure_is_a_tool_error() -> None:
    client = ScriptedLLM(
        calling(ToolCall("t1", "news__headlines", {"symbol": "BTCUSD"}),
                ToolCall("t2", "news__boom", {}), ToolCall("t3", "news__hang", {})),
        answer("no_trade"))
    engine, store, mcp = await engine_with(client, (sys.executable, SERVER), timeout_ms=1_500)

    async def listed() -> bool:
        return len(mcp.specs("btc", TOOLS)) == 3
    await until(listed, "the MCP server's tools", within_s=START_S)
    await engine.submit(request("btc"))
    await next_event(store, "ModelCalled")
    stop = await engine.submit(control("btc", "pause"))  # the control lane never waits
    assert stop.decision == "accepted"
    await engine.submit(request("eth"))  # nor another agent: its run ends meanwhile
    first = await next_event(store, "RunCompleted")
    assert first.stream == "eth" and engine.state("btc").active is not None
    await next_event(store, "RunCompleted", first.position)
    offered = {spec.name for spec in mcp.specs("btc", TOOLS)}
    assert offered == set(TOOLS)
    headline, boom, hang = client.calls[1][2].tool_results
    assert not headline.is_error and "spot ETF inflows" in headline.content
    assert boom.is_error and "the news feed is down" in boom.content
    assert hang.is_error and "did not answer hang within 1500 ms" in hang.content
    returned = [json.loads(r.data) for r in await store.read_stream("btc")
                if r.type == "ToolReturned"]
    assert [(r["name"], r["ok"]) for r in returned] == [
        ("news__headlines", True), ("news__boom", False), ("news__hang", False)]
    await engine.flush()
    assert verify(await log_of(store)) is None
    await engine.stop()
    await mcp.stop()


async def test_a_server_that_cannot_start_gives_a_tool_error_not_a_failed_run() -> None:
    client = ScriptedLLM(calling(ToolCall("t1", "news__headlines", {"symbol": "BTCUSD"})),
                         answer("no_trade"))
    engine, store, mcp = await engine_with(client, ("/nonexistent/mcp-server",),
                                           timeout_ms=500, builtin=("positions",))
    await engine.submit(request("btc"))
    await next_event(store, "RunCompleted")
    (result,) = client.calls[1][2].tool_results
    assert result.is_error and "MCP server news" in result.content
    assert [spec.name for spec in mcp.specs("btc", TOOLS)] == []  # (never offered)
    await engine.stop()
    await mcp.stop()


@contextlib.asynccontextmanager
async def served(app: ASGIApp) -> AsyncIterator[str]:
    """``app`` under uvicorn on 127.0.0.1, an ephemeral port (lifespan on); its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def test_a_server_over_http_gets_its_headers_from_the_env_and_only_allowed_tools_go(
        ) -> None:
    client = ScriptedLLM(
        calling(ToolCall("t1", "news__headlines", {"symbol": "ETHUSD"}),
                ToolCall("t2", "news__hang", {})),  # listed by the server, not allowed
        answer("no_trade"))
    async with served(http_app("abc")) as url:
        config = McpServerConfig.model_validate(
            {"name": "news", "url": f"{url}/mcp", "headersEnv": {"Authorization": "NEWS"},
             "tools": ["headlines", "boom", "outage"], "timeoutMs": 2_000},
            context={"env": {"NEWS": "Bearer abc"}})
        wrong = McpServerConfig.model_validate(
            {"name": "wrong", "url": f"{url}/mcp", "headersEnv": {"Authorization": "NEWS"},
             "tools": ["headlines"], "timeoutMs": 2_000},
            context={"env": {"NEWS": "Bearer nope"}})
        store = MemoryEventStore()
        mcp = McpTools({"btc": [config.spec(), wrong.spec()]})
        reasoner = LLMReasoner(client)
        allowed = (*config.qualified(), *wrong.qualified())
        engine = Engine(store, {"btc": AgentConfig(mode=Mode.FOLLOWUP, mcp_tools=allowed)},
                        clock=SystemClock(), reasoners=lambda _: reasoner, mcp=mcp)
        await engine.start()
        mcp.start()
        try:
            async def listed() -> bool:
                return len(mcp.specs("btc", allowed)) == 3
            await until(listed, "the HTTP server's allowed tools", within_s=START_S)
            # (hang is the server's, but not allowed; the wrong token's server lists none)
            assert {s.name for s in mcp.specs("btc", allowed)} == {
                "news__headlines", "news__boom", "news__outage"}
            # (a server that refused the connection: its error at once, not a timeout)
            refused = await asyncio.wait_for(
                mcp.call("btc", "wrong__headlines", {"symbol": "ETHUSD"}), 1.0)
            assert refused[0] is False and "MCP server wrong" in refused[1], refused
            assert "error response (HTTP 401: no)" in refused[1], refused  # (its words)
            assert "TaskGroup" not in refused[1], refused
            # (an error answer to a call: what the proxy said, not only the SDK's words)
            down = await asyncio.wait_for(mcp.call("btc", "news__outage", {}), 2.0)
            assert down == (False, "MCP server news: MCPError: Server returned an error "
                                   "response (HTTP 502: bad gateway: upstream exchange down)")
            await engine.submit(request("btc"))
            await next_event(store, "RunCompleted")
            headline, hang = client.calls[1][2].tool_results
            assert not headline.is_error and "ETHUSD: spot ETF inflows" in headline.content
            assert hang.is_error and "'news__hang' does not exist" in hang.content, hang
            events = await store.read_stream("btc")
            decided = next(json.loads(r.data) for r in events if r.type == "StepDecided")
            assert decided["allowed"] == ["t1"] and \
                [r["callId"] for r in decided["refused"]] == ["t2"], decided
            returned = [json.loads(r.data) for r in events if r.type == "ToolReturned"]
            assert [(r["name"], r["ok"]) for r in returned] == [("news__headlines", True)]
            await engine.flush()
            assert verify(await log_of(store)) is None
        finally:
            await engine.stop()
            await mcp.stop()
