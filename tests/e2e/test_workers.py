"""Workers (bring your own agent) end to end, over a real server: a run done by an SDK
`Worker` with a tool step recorded as a built-in model's; a worker killed with kill -9 mid-run
(aborted ``worker_lost``, rerun on the next worker, nothing decided twice); a worker that
ignores a cancel and bad frames (refused, nothing changed); no worker connected (the run
fails at once, and the agent says why); the worker role's bounds."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.base.tasks import spawn
from gateway.client import Worker, WorkerRun
from gateway.config import parse_config
from gateway.edge.server import Running, serving
from gateway.wiring import build_service
from lanes import verify
from lanes.events import ModelCalled, RunStarted, ToolReturned, WorkerLost
from tests.e2e.live import START_TIMEOUT
from tests.gateway.support import log_of, next_event, until

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 10.0
OPS = "control-token-secret-1234"
W1, W2, OTHER = "worker-token-secret-0001", "worker-token-secret-0002", "worker-token-other-0003"
CONFIG = """
[server]
host = "127.0.0.1"
port = 0

[[tokens]]
name = "ops"
token = "{ops}"
role = "control"

[[tokens]]
name = "w1"
token = "{w1}"
role = "worker"
agents = ["desk"]

[[tokens]]
name = "w2"
token = "{w2}"
role = "worker"
agents = ["desk"]

[[tokens]]
name = "other"
token = "{other}"
role = "worker"
agents = ["plain"]

[[providers]]
name = "sim"
kind = "simulated"
{limits}

[[agents]]
id = "desk"
mode = "{mode}"
tools = ["positions", "place_order"]
worker_tools = ["search_news"]
[agents.reasoner]
kind = "worker"
provider = "sim"
heartbeat_ms = {heartbeat_ms}
missed_heartbeats = {missed}

[[agents]]
id = "plain"
mode = "followup"
[agents.reasoner]
kind = "simulated"
latency_ms = [1, 2]
{plain}"""


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, heartbeat_ms: int = 200, missed: int = 50,
                  mode: str = "followup", limits: str = "", plain_provider: str = ""
                  ) -> AsyncIterator[tuple[Running, httpx2.AsyncClient]]:
    """A gateway serving the config (a worker silent ``heartbeat_ms`` x ``missed`` is lost:
    10 s by default, so that only the test of heartbeats loses a silent one; ``limits``:
    the provider's, ``plain_provider``: a provider whose slots "plain"'s turns take)."""
    plain = f'provider = "{plain_provider}"\n' if plain_provider else ""
    service = build_service(parse_config(CONFIG.format(
        ops=OPS, w1=W1, w2=W2, other=OTHER, heartbeat_ms=heartbeat_ms, missed=missed,
        mode=mode, limits=limits, plain=plain)),
        tmp_path / "events.db")
    async with serving(service) as running, httpx2.AsyncClient(
            base_url=running.url, timeout=TIMEOUT,
            headers={"Authorization": f"Bearer {OPS}"}) as http:
        yield running, http


async def submit(http: httpx2.AsyncClient, request_id: str, agent: str = "desk") -> None:
    answer = await http.post(f"/api/agents/{agent}/requests", json={
        "requestId": request_id, "createdAt": datetime.now(UTC).isoformat(),
        "agentId": agent, "kind": "user_control", "payload": {"message": "look"}})
    assert answer.status_code == 200, answer.text


def ws_url(running: Running) -> str:
    return running.url.replace("http://", "ws://")


@contextlib.asynccontextmanager
async def raw_worker(running: Running, token: str = W1) -> AsyncIterator[ClientConnection]:
    """A worker speaking the frames itself (hello and ready already read)."""
    async with connect(f"{ws_url(running)}/ws/worker", open_timeout=TIMEOUT,
                       additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        assert (await receive(ws))["type"] == "hello"
        ready = await receive(ws)
        assert ready["type"] == "ready" and ready["agents"] == ["desk"], ready
        yield ws


async def receive(ws: ClientConnection, kind: str | None = None) -> dict[str, Any]:
    """The next frame (of type ``kind``, heartbeats and the like skipped), within a time."""
    while True:
        frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
        if kind is None or frame["type"] == kind or frame["type"] == "error":
            return frame


async def send(ws: ClientConnection, frame: dict[str, Any]) -> None:
    await ws.send(json.dumps(frame))


def types_of(entries: list[Any]) -> list[str]:
    return [type(entry.event).__name__ for entry in entries]


async def test_a_run_done_by_a_worker_records_its_tool_step_and_verifies(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, http):
        worker = Worker(ws_url(running), W1)
        seen: list[Any] = []

        @worker.agent("desk")
        async def desk(run: WorkerRun) -> dict[str, Any]:
            assert [t.name for t in run.tools] == ["positions", "place_order"]
            await run.slot(input_tokens=500, output_tokens=100)
            answer = await run.step(
                tool_calls=[{"id": "c1", "name": "positions",
                             "arguments": {}},
                            {"id": "c2", "name": "transfer_funds", "arguments": {}},
                            {"id": "c3", "name": "search_news", "arguments": {"q": "BTC"}}],
                own_results=[{"callId": "c3", "content": "ETF inflows", "isError": False}],
                input_tokens=480, output_tokens=90, stop_reason="tool_use")
            seen.extend(answer.results)
            await run.slot(input_tokens=600, output_tokens=100)
            await run.step(text="nothing to do", input_tokens=590, output_tokens=20,
                           stop_reason="end_turn")
            return {"outcome": "no_trade", "answer": "looked",
                    "usage": {"inputTokens": 1070, "outputTokens": 110}}

        task = spawn(worker.run(), "worker")
        try:
            await asyncio.wait_for(worker.ready.wait(), TIMEOUT)
            await submit(http, "look-1")
            completed = await next_event(running.service.engine.store, "RunCompleted")
        finally:
            worker.stop()
            await task
        assert json.loads(completed.data)["usage"] == {"inputTokens": 1070, "outputTokens": 110}
        assert [r.call_id for r in seen] == ["c1", "c2", "c3"]
        assert not seen[0].is_error and seen[1].is_error  # a tool it does not have: refused
        assert (seen[2].is_error, seen[2].content) == (False, "ETF inflows")  # its own tool
        entries = await log_of(running.service.engine.store)
        types = types_of(entries)
        assert types.count("ModelCalled") == 2 and types.count("ToolReturned") == 2
        own = [e.event for e in entries if isinstance(e.event, ToolReturned)][1]
        assert (own.name, own.ok, own.content) == ("search_news", True, "ETF inflows")
        assert verify(entries) is None


async def test_a_worker_killed_mid_run_has_its_run_rerun_on_the_next_worker(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, http):
        store = running.service.engine.store
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.worker_proc", ws_url(running), W1, "desk",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        second = Worker(ws_url(running), W2)
        finals: list[str] = []

        @second.agent("desk")
        async def desk(run: WorkerRun) -> dict[str, Any]:
            finals.append(run.run_id)
            await run.slot(input_tokens=100, output_tokens=10)
            await run.step(text="done", input_tokens=100, output_tokens=10)
            return {"outcome": "no_trade", "answer": "rerun"}

        task = None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT)
            assert line.strip() == b"ready"
            await submit(http, "look-1")
            line = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
            assert line.startswith(b"stepped desk-r1")
            task = spawn(second.run(), "second worker")
            await asyncio.wait_for(second.ready.wait(), TIMEOUT)
            os.kill(process.pid, signal.SIGKILL)
            aborted = await next_event(store, "RunAborted")
            completed = await next_event(store, "RunCompleted", aborted.position)
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            second.stop()
            if task is not None:
                await task
        assert json.loads(aborted.data) == {"run_id": "desk-r1", "reason": "worker_lost",
                                            "requeued": True, "by": None}
        assert json.loads(completed.data)["run_id"] == "desk-r2" and finals == ["desk-r2"]
        entries = await log_of(store)
        types = types_of(entries)
        lost = [e.event for e in entries if isinstance(e.event, WorkerLost)]
        assert len(lost) == 1 and lost[0].worker == "w1" and lost[0].rerun
        assert types.count("RunStarted") == 2 and types.count("RunCompleted") == 1
        started = [e.event for e in entries if isinstance(e.event, RunStarted)]
        assert [s.request_ids for s in started] == [("look-1",), ("look-1",)]
        # the first run's step is recorded once; nothing of it after the loss
        assert types.count("ToolReturned") == 1
        assert verify(entries) is None


async def test_a_worker_that_ignores_a_cancel_changes_nothing_and_bad_frames_are_refused(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, http), raw_worker(running) as ws:
        store = running.service.engine.store
        await send(ws, {"type": "heartbeat"})
        await submit(http, "look-1")
        run = await receive(ws, "run")
        assert run["runId"] == "desk-r1" and run["agentId"] == "desk"
        assert run["requests"][0]["requestId"] == "look-1" and run["maxSteps"] >= 1
        # out of turn: a step before its slot
        await send(ws, {"type": "step", "runId": "desk-r1", "step": 1, "id": "s0"})
        assert (await receive(ws))["code"] == "out_of_order"
        await send(ws, {"type": "slot", "runId": "desk-r1", "inputTokens": 10})
        assert (await receive(ws, "slot_granted"))["runId"] == "desk-r1"
        stopped = await http.post("/api/agents/desk/control",
                                  json={"action": "emergency_stop"})
        assert stopped.status_code == 200, stopped.text
        cancel = await receive(ws, "cancel")
        assert cancel == {"type": "cancel", "runId": "desk-r1", "reason": "aborted"}
        await next_event(store, "SlotCancelled")  # (the run's slot given back: the stop's)
        before = await store.last_position()
        state = running.service.engine.state("desk")
        # the worker ignores the cancel: its step and result come anyway, twice
        for frame in ({"type": "step", "runId": "desk-r1", "step": 1},
                      {"type": "result", "runId": "desk-r1", "outcome": "trade",
                       "orders": [{"symbol": "BTCUSD", "side": "buy", "qty": 1}]},
                      {"type": "result", "runId": "desk-r1", "outcome": "no_trade"}):
            await send(ws, {**frame, "id": "late"})
            error = await receive(ws)
            assert (error["type"], error["code"], error["id"]) == ("error", "run_ended", "late")
        # a run it was never given, and malformed frames
        await send(ws, {"type": "result", "runId": "desk-r9", "outcome": "no_trade"})
        assert (await receive(ws))["code"] == "unknown_run"
        await ws.send("{not json")
        assert (await receive(ws))["code"] == "malformed_json"
        await send(ws, {"type": "submit", "request": {}})
        assert (await receive(ws))["code"] == "unknown_type"
        await send(ws, {"type": "slot", "runId": "desk-r1", "inputTokens": -1, "extra": 1})
        bad = await receive(ws)
        assert bad["code"] == "invalid" and bad["field"] in ("inputTokens", "extra")
        # each late result is recorded as discarded (the run's result, ignored by the
        # core), never applied; nothing else changed
        ignored = await next_event(store, "RunResultIgnored", before)
        await next_event(store, "RunResultIgnored", ignored.position)
        after = [r.type for r in await store.read(before)]
        assert after == ["RunFinished", "RunResultIgnored"] * 2
        assert running.service.engine.state("desk") is state
        assert state.trading.value == "HALTED" and not state.orders and state.active is None
        types = types_of(await log_of(store))
        assert "OrderAccepted" not in types and types.count("RunAborted") == 1


async def test_a_request_steered_into_a_workers_run_comes_with_the_next_tool_results(
        tmp_path: Path) -> None:
    async with gateway(tmp_path, mode="steer") as (running, http), raw_worker(running) as ws:
        store = running.service.engine.store
        await submit(http, "look-1")
        await receive(ws, "run")
        await next_event(store, "SteerabilityChanged")  # the run takes steers now
        await send(ws, {"type": "slot", "runId": "desk-r1"})
        await receive(ws, "slot_granted")
        await submit(http, "look-2")
        await next_event(store, "RunSteered")
        await send(ws, {"type": "step", "runId": "desk-r1", "step": 1, "toolCalls": [
            {"id": "c1", "name": "positions", "arguments": {}}]})
        results = await receive(ws, "tool_results")
        assert [r["callId"] for r in results["results"]] == ["c1"]
        assert [r["requestId"] for r in results["steers"]] == ["look-2"]
        await send(ws, {"type": "slot", "runId": "desk-r1"})
        await receive(ws, "slot_granted")
        await send(ws, {"type": "step", "runId": "desk-r1", "step": 2, "text": "seen both"})
        assert (await receive(ws, "tool_results"))["steers"] == []
        await send(ws, {"type": "result", "runId": "desk-r1", "outcome": "no_trade"})
        await next_event(store, "RunCompleted")
        entries = await log_of(store)
        steps = [e.event for e in entries if isinstance(e.event, ModelCalled)]
        assert [s.steered for s in steps] == [(), ("look-2",)]
        assert verify(entries) is None


async def test_with_no_worker_connected_the_run_fails_at_once_and_the_agent_says_why(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, http):
        blocked = (await http.get("/api/agents/desk")).json()["blocked"]
        assert [b["kind"] for b in blocked] == ["no_worker"]
        await submit(http, "look-1")
        failed = await next_event(running.service.engine.store, "RunFailed")
        assert "no worker is connected for agent desk" in json.loads(failed.data)["error"]
        async with raw_worker(running):
            async def connected() -> bool:
                body = (await http.get("/api/agents/desk")).json()
                return all(b["kind"] != "no_worker" for b in body["blocked"])
            await until(connected, "the no_worker reason to go")


async def test_requests_left_by_a_lost_worker_wait_for_the_next_one(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, http):
        store = running.service.engine.store
        async with raw_worker(running) as ws:
            await submit(http, "look-1")
            assert (await receive(ws, "run"))["runId"] == "desk-r1"
        lost = await next_event(store, "WorkerLost")
        assert json.loads(lost.data)["rerun"] is False
        assert running.service.engine.state("desk").pending[0].request.request_id == "look-1"
        async with raw_worker(running) as ws:
            run = await receive(ws, "run")  # the WorkerReady of its connection
            assert run["runId"] == "desk-r2"
            assert [r["requestId"] for r in run["requests"]] == ["look-1"]
            await send(ws, {"type": "result", "runId": "desk-r2", "outcome": "no_trade"})
            await next_event(store, "RunCompleted")
        assert verify(await log_of(store)) is None


async def test_a_worker_that_misses_its_heartbeats_is_lost_and_dropped(tmp_path: Path) -> None:
    async with gateway(tmp_path, heartbeat_ms=100, missed=3) as (running, http), \
            raw_worker(running) as ws:
        await submit(http, "look-1")
        assert (await receive(ws, "run"))["runId"] == "desk-r1"
        lost = await next_event(running.service.engine.store, "WorkerLost")  # silent now
        assert json.loads(lost.data)["worker"] == "w1"
        with pytest.raises(ConnectionClosed):
            await receive(ws)  # the gateway closed it
        assert running.service.workers.connected("desk") == 0


@pytest.mark.parametrize(("endpoint", "token", "code"), [
    ("control", W1, "forbidden"), ("feed", W1, "forbidden"), ("worker", OPS, "forbidden")])
async def test_a_worker_token_only_does_runs_and_only_a_worker_token_does(
        tmp_path: Path, endpoint: str, token: str, code: str) -> None:
    async with gateway(tmp_path) as (running, http):
        async with connect(f"{ws_url(running)}/ws/{endpoint}", open_timeout=TIMEOUT,
                           additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            assert (await receive(ws))["code"] == code
        answer = await http.get("/api/agents", headers={"Authorization": f"Bearer {W1}"})
        assert answer.status_code == 403


async def test_a_worker_serves_only_the_worker_agents_of_its_scope(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, _), connect(
            f"{ws_url(running)}/ws/worker", open_timeout=TIMEOUT,
            additional_headers={"Authorization": f"Bearer {OTHER}"}) as ws:
        assert (await receive(ws))["type"] == "hello"
        assert (await receive(ws))["agents"] == []  # "plain" is not a worker agent
        assert running.service.workers.connected("desk") == 0


async def test_the_example_worker_runs_a_model_through_the_openai_sdk_with_a_tool(
        tmp_path: Path) -> None:
    from openai import AsyncOpenAI

    from gateway.llm.fake_provider import (
        FakeProviderConfig,
        create_fake_provider,
        scripted,
    )
    from gateway.llm.fake_provider import serving as serving_provider

    spec = importlib.util.spec_from_file_location("worker_openai",
                                                  ROOT / "examples" / "worker_openai.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    fake = create_fake_provider(FakeProviderConfig(reply=scripted(
        [[("positions", {})]],
        lambda _: '{"decision": "no_trade", "reason": "flat book"}')))
    async with serving_provider(fake) as url, gateway(tmp_path) as (running, http):
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="test-key-123")
        worker = example.worker(ws_url(running), W1, "desk", client, "gpt-test")
        task = spawn(worker.run(), "example worker")
        try:
            await asyncio.wait_for(worker.ready.wait(), TIMEOUT)
            await submit(http, "look-1")
            finished = await next_event(running.service.engine.store, "RunFinished")
            await next_event(running.service.engine.store, "RunCompleted")
        finally:
            worker.stop()
            await task
            await client.close()
        assert json.loads(finished.data)["answer"] == "flat book"
        entries = await log_of(running.service.engine.store)
        types = types_of(entries)
        assert types.count("ModelCalled") == 2 and types.count("ToolReturned") == 1
        assert verify(entries) is None
