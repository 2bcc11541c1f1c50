"""Tools of an MCP server for an agent's model: a small MCP server started by the test (the
official SDK, over stdio); its allowed tools are offered beside the built-ins, each call and
result recorded; a tool that hangs, one that raises and a server that cannot start are tool
errors the model reads, within the timeout, while the control lane answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gateway.base.clock import SystemClock
from gateway.llm.mcp_tools import START_S, McpServerSpec, McpTools
from gateway.llm.port import Completion, ToolCall
from gateway.llm.reasoner import LLMReasoner
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode, verify
from store import MemoryEventStore
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
                                                     tools=builtin)},
                    clock=SystemClock(), reasoners=lambda _: reasoner, mcp=mcp)
    await engine.start()
    mcp.start()
    return engine, store, mcp


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
    await next_event(store, "RunCompleted")
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
