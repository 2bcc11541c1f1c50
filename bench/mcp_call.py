"""An MCP ``call_agent`` round trip: the SDK's own client over Streamable HTTP, the gateway's
``/mcp``, the engine (the call recorded, a run started, its answer recorded) and back, against
the built-in simulated reasoner at a fixed latency.

The gateway runs in this process (as in `bench.ws_ingest`: uvicorn on 127.0.0.1, SQLite with
``synchronous=FULL``); the client runs in a child process, so the server has a core of its
own. One MCP session makes ``calls`` calls one after another to one agent (idle each time);
the same session's ``agent_status`` (a read, no log write) is timed as well, for the cost of
the MCP path alone.

    uv run python -m bench.mcp_call [--calls N] [--latency_ms N]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bench.common import Figure, run
from bench.ws_ingest import CONTROL_TOKEN, TIMEOUT, gateway
from gateway.llm.reasoner import SimulatedReasoner
from lanes import AgentConfig, Mode

AGENT = "helper"


Timings = tuple[list[float], list[float], list[float]]


def client_calls(url: str, calls: int) -> Timings:
    """In a child process: ``calls`` ``call_agent`` round trips, as many ``agent_status``
    calls over one MCP session, and as many ``GET /api/agents/{id}`` on the same HTTP
    client (the HTTP API's read, for comparison), each timed (seconds)."""
    return asyncio.run(_calls(url, calls))


async def _calls(url: str, calls: int) -> Timings:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {CONTROL_TOKEN}"},
                           timeout=TIMEOUT) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        round_trips: list[float] = []
        reads: list[float] = []
        gets: list[float] = []
        for n in range(calls + 1):  # (the first warms up, not counted)
            start = time.perf_counter()
            result = await session.call_tool("call_agent", {
                "agentId": AGENT, "message": f"question {n}", "timeoutSeconds": TIMEOUT})
            took = time.perf_counter() - start
            answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
            if result.is_error or answer["status"] != "returned":
                raise AssertionError(f"call {n}: {answer}")
            start = time.perf_counter()
            status = await session.call_tool("agent_status", {"agentId": AGENT})
            read_took = time.perf_counter() - start
            if status.is_error:
                raise AssertionError(f"agent_status: {status.content}")
            start = time.perf_counter()
            got = await http.get(url.removesuffix("/mcp") + f"/api/agents/{AGENT}")
            get_took = time.perf_counter() - start
            if got.status_code != 200:
                raise AssertionError(f"GET: {got.status_code}")
            if n:
                round_trips.append(took)
                reads.append(read_took)
                gets.append(get_took)
        return round_trips, reads, gets


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


async def _measure(calls: int, latency_ms: int, pool: ProcessPoolExecutor) -> Timings:
    loop = asyncio.get_running_loop()
    config = AgentConfig(mode=Mode.FOLLOWUP)
    reasoner = SimulatedReasoner(latency_ms=(latency_ms, latency_ms), turns=1)
    with tempfile.TemporaryDirectory() as tmp:
        async with gateway(Path(tmp, "mcp.db"), {AGENT: config},
                           lambda _: reasoner) as (ws_url, _engine):
            url = ws_url.replace("ws://", "http://") + "/mcp"
            return await loop.run_in_executor(pool, partial(client_calls, url, calls))


def measure(calls: int = 200, latency_ms: int = 50) -> list[Figure]:
    """``call_agent`` round trip p50/p99 against a reasoner of ``latency_ms``, and what the
    gateway and MCP add to it."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        round_trips, reads, gets = asyncio.run(_measure(calls, latency_ms, pool))
    p50, p99 = _percentile(round_trips, 50), _percentile(round_trips, 99)
    return [
        Figure("simulated reasoner latency", latency_ms, "ms"),
        Figure(f"MCP call_agent round trip p50 ({calls} calls)", p50, "ms"),
        Figure("MCP call_agent round trip p99", p99, "ms"),
        Figure("... p50 above the reasoner's latency", p50 - latency_ms, "ms"),
        Figure("MCP agent_status (a read) p50", _percentile(reads, 50), "ms"),
        Figure("MCP agent_status p99", _percentile(reads, 99), "ms"),
        Figure("HTTP GET /api/agents/{id} p50 (the same read, same client)",
               _percentile(gets, 50), "ms"),
        Figure("MCP agent_status p50 / HTTP GET p50", _percentile(reads, 50)
               / _percentile(gets, 50), "x"),
    ]


if __name__ == "__main__":
    run(measure, calls=200, latency_ms=50)
