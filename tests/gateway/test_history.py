"""Histories from the log over HTTP: an agent's runs with gate wait and model time, per-agent
chart series with stop and resume marks, and search back over the whole log, on the real
engine with a provider gate and a fake clock (the store records the fake time too)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from gateway.base.clock import FakeClock
from gateway.edge.app import create_app
from gateway.edge.auth import TokenBook
from gateway.edge.service import Service
from gateway.llm.port import Completion
from gateway.llm.reasoner import LLMReasoner
from gateway.reads import history
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from lanes import AgentConfig
from lanes.gate.events import GateLimits
from store import MemoryEventStore
from tests.e2e.live import TOKENS
from tests.gateway.support import TIMEOUT, next_event, request
from tests.gateway.test_gate_engine import ScriptedLLM, answer

START = 1_771_297_800_000


@dataclass
class Desk:
    engine: Engine
    store: MemoryEventStore
    clock: FakeClock
    client: ScriptedLLM

    def http(self, token: str = "viewer-secret") -> httpx2.AsyncClient:
        app = create_app(Service(engine=self.engine, tokens=TokenBook(TOKENS.items())))
        return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gw",
                                 headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)

    async def settle(self) -> None:
        await self.engine.flush()
        await self.engine.gates["claude"].flush()


@contextlib.asynccontextmanager
async def desk(*steps: Any, agents: tuple[str, ...] = ("btc", "eth")) -> AsyncIterator[Desk]:
    """Agents behind one provider gate that lets one call through at a time."""
    clock = FakeClock(START)
    store = MemoryEventStore(clock=clock.now_ms)
    client = ScriptedLLM(*steps)
    gate = ProviderGate(store, "claude", GateLimits(max_concurrent=1), clock)
    reasoner = LLMReasoner(client)
    engine = Engine(store, {a: AgentConfig() for a in agents}, clock=clock,
                    reasoners=lambda _: reasoner, gates={"claude": gate},
                    agent_gates={a: "claude" for a in agents})
    await engine.start()
    try:
        yield Desk(engine, store, clock, client)
    finally:
        await engine.stop()


def later() -> asyncio.Future[Completion]:
    return asyncio.get_running_loop().create_future()


async def two_runs_one_waiting(d: Desk, first: asyncio.Future[Completion],
                               second: asyncio.Future[Completion]) -> None:
    """btc holds the only slot for 5 s; eth asks 2 s in, waits 3 s, then the model takes
    1.5 s to answer it."""
    await d.engine.submit(request("btc"))
    await d.client.call_count(1)
    d.clock.advance(2_000)
    await d.engine.submit(request("eth"))
    await next_event(d.store, "SlotQueued", after=await d.store.last_position())
    d.clock.advance(3_000)
    first.set_result(answer("trade", orders=[{"symbol": "BTCUSD", "side": "buy", "qty": 0.5}],
                            reason="breakout above 64k"))
    await d.client.call_count(2)
    d.clock.advance(1_500)
    second.set_result(answer("no_trade", reason="nothing to do"))
    await next_event(d.store, "RunCompleted", after=await d.store.last_position())
    await d.settle()


async def test_a_run_shows_its_gate_wait_model_time_tokens_orders_and_answer() -> None:
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)
        async with d.http() as http:
            btc = (await http.get("/api/agents/btc/runs")).json()
            eth = (await http.get("/api/agents/eth/runs")).json()
    [run] = btc["runs"]
    assert run["outcome"] == "trade" and run["startedAt"] == START
    assert run["durationMs"] == 5_000 and run["endedAt"] == START + 5_000
    assert run["gate"] == {"waitMs": 0, "modelMs": 5_000, "calls": 1, "refused": 0,
                           "complete": True}
    assert run["usage"] == {"inputTokens": 500, "outputTokens": 40}
    assert run["orders"] == [{"symbol": "BTCUSD", "side": "buy", "qty": 0.5,
                              "orderType": "market", "limitPrice": None,
                              "orderId": f"{run['runId']}-o1", "status": "accepted"}]
    assert run["answer"] == "breakout above 64k"
    assert btc["before"] is None
    [waited] = eth["runs"]
    assert waited["gate"]["waitMs"] == 3_000 and waited["gate"]["modelMs"] == 1_500
    assert waited["durationMs"] == 4_500 and waited["outcome"] == "no_trade"
    assert waited["answer"] == "nothing to do" and waited["orders"] == []


async def test_runs_come_newest_first_a_page_at_a_time_and_a_live_one_is_running() -> None:
    steps = [answer("no_trade", reason=f"look {n}") for n in range(3)]
    hanging = later()
    async with desk(*steps, hanging, agents=("btc",)) as d:
        for n in range(4):
            await d.engine.submit(request("btc"))
            await d.client.call_count(n + 1)
            await d.settle()
        async with d.http() as http:
            first = (await http.get("/api/agents/btc/runs", params={"limit": 2})).json()
            second = (await http.get("/api/agents/btc/runs",
                                     params={"limit": 2, "before": first["before"]})).json()
        hanging.set_result(answer())
    assert [r["outcome"] for r in first["runs"]] == ["running", "no_trade"]
    assert first["runs"][0]["endedAt"] is None and first["runs"][1]["answer"] == "look 2"
    assert [r["answer"] for r in second["runs"]] == ["look 1", "look 0"]
    assert second["before"] is None
    ids = [r["runId"] for r in first["runs"] + second["runs"]]
    assert len(set(ids)) == 4


async def test_runs_page_on_from_where_a_bounded_read_stopped_and_miss_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "PAGE", 3)
    monkeypatch.setattr(history, "MAX_RUN_SCAN", 4)
    async with desk(*[answer(reason=f"look {n}") for n in range(5)], agents=("btc",)) as d:
        for _ in range(5):
            mark = await d.store.last_position()
            await d.engine.submit(request("btc"))
            await next_event(d.store, "RunCompleted", after=mark)
            d.clock.advance(1_000)
        await d.settle()
        async with d.http() as http:
            runs: list[dict[str, Any]] = []
            before = None
            for _ in range(50):
                page = (await http.get("/api/agents/btc/runs", params={
                    "limit": 2, **({"before": before} if before else {})})).json()
                runs += page["runs"]
                before = page["before"]
                if before is None:
                    break
    assert [r["answer"] for r in runs] == [f"look {n}" for n in range(4, -1, -1)]
    assert [r["startedAt"] for r in runs] == [START + n * 1_000 for n in range(4, -1, -1)]
    assert all(r["outcome"] == "no_trade" and r["gate"]["calls"] == 1 for r in runs)


async def test_a_gate_log_too_long_to_read_says_the_times_are_partial(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "PAGE", 1)
    monkeypatch.setattr(history, "MAX_GATE_SCAN", 1)
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)
        async with d.http() as http:
            [run] = (await http.get("/api/agents/eth/runs")).json()["runs"]
    assert run["gate"]["complete"] is False


async def test_a_series_too_long_to_read_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "PAGE", 2)
    monkeypatch.setattr(history, "MAX_SERIES_SCAN", 8)  # the run starts, its end is beyond
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)
        async with d.http() as http:
            body = (await http.get("/api/charts", params={
                "agent": "btc", "from": START, "to": START + 60_000, "step": 10_000})).json()
    [btc] = body["agents"]
    assert btc["truncated"] is True and btc["series"]["runs"] == [1, 0, 0, 0, 0, 0]
    assert btc["series"]["tokens"] == [0] * 6  # the run's end lay beyond what was read


@pytest.mark.parametrize("params", [{"limit": "0"}, {"limit": "101"}, {"before": "x"},
                                    {"limit": "-1"}])
async def test_a_bad_page_of_runs_is_a_typed_error(params: dict[str, str]) -> None:
    async with desk(agents=("btc",)) as d, d.http() as http:
        response = await http.get("/api/agents/btc/runs", params=params)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid"


async def test_runs_of_an_agent_outside_the_scope_are_refused() -> None:
    async with desk(agents=("btc", "eth")) as d, d.http("scoped-secret") as http:
        refused = await http.get("/api/agents/eth/runs")
        unknown = await http.get("/api/agents/nope/runs")
        allowed = await http.get("/api/agents/btc/runs")
    assert refused.status_code == 403 and unknown.status_code == 403
    assert allowed.status_code == 200 and allowed.json()["runs"] == []


async def test_charts_count_runs_and_tokens_per_step_and_mark_a_stop_and_resume_with_who(
) -> None:
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)
        d.clock.advance(10_000)
        async with d.http("control-secret") as ops:
            for action in ("emergency_stop", "emergency_stop", "resume"):  # (the second:
                # a stop of a HALTED agent changes nothing, and is no mark)
                sent = await ops.post("/api/agents/btc/control", json={"action": action})
                assert sent.status_code == 200, sent.text
                d.clock.advance(1_000)
        await d.settle()
        async with d.http() as http:
            body = (await http.get("/api/charts", params={
                "from": START, "to": START + 60_000, "step": 10_000})).json()
            only = (await http.get("/api/charts", params={
                "agent": "eth", "from": START, "to": START + 60_000, "step": 10_000})).json()
    by_agent = {a["agentId"]: a["series"] for a in body["agents"]}
    assert by_agent["btc"]["runs"] == [1, 0, 0, 0, 0, 0]
    assert by_agent["btc"]["tokens"] == [540, 0, 0, 0, 0, 0]
    assert by_agent["eth"]["runs"] == [1, 0, 0, 0, 0, 0] and by_agent["eth"]["requests"][0] == 1
    assert [(m["kind"], m["agentId"], m["by"], m["from"], m["to"]) for m in body["marks"]] == [
        ("stop", "btc", "ops", "ACTIVE", "HALTED"), ("resume", "btc", "ops", "HALTED", "ACTIVE")]
    assert body["marks"][0]["at"] == START + 16_500
    assert [a["agentId"] for a in only["agents"]] == ["eth"] and only["marks"] == []


@pytest.mark.parametrize("params", [
    {"from": "10", "to": "5"}, {"from": "0", "to": "100000", "step": "10"},
    {"from": "0", "to": "100000000", "step": "1000"}, {"to": "soon"},
    {"agent": ",".join(f"a{n}" for n in range(21))}])
async def test_bad_chart_windows_are_typed_errors(params: dict[str, str]) -> None:
    async with desk(agents=("btc",)) as d, d.http() as http:
        response = await http.get("/api/charts", params=params)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid"


async def test_charts_keep_to_the_scope() -> None:
    async with desk() as d, d.http("scoped-secret") as http:
        everyone = (await http.get("/api/charts")).json()
        other = await http.get("/api/charts", params={"agent": "eth"})
    assert [a["agentId"] for a in everyone["agents"]] == ["btc"]
    assert other.status_code == 403


async def test_search_finds_an_old_event_anywhere_in_the_log_newest_first() -> None:
    async with desk(*[answer() for _ in range(40)]) as d:
        needle = request("btc", payload={"note": "Needle-in-the-log"})
        await d.engine.submit(needle)
        for _ in range(30):
            await d.engine.submit(request("eth"))
            await d.settle()
        async with d.http() as http:
            found = (await http.get("/api/events", params={"q": "needle-IN"})).json()
            by_id = (await http.get("/api/events", params={"q": needle.request_id})).json()
            typed = (await http.get("/api/events", params={
                "q": "", "type": "RequestReceived", "agent": "eth", "limit": 5})).json()
    assert [e["type"] for e in found["events"]] == ["RequestReceived"]
    assert found["events"][0]["data"]["request"]["payload"]["note"] == "Needle-in-the-log"
    assert found["before"] is None  # looked all the way back
    assert {e["type"] for e in by_id["events"]} >= {"RequestReceived", "RequestQueued",
                                                    "RunStarted"}
    positions = [e["position"] for e in by_id["events"]]
    assert positions == sorted(positions, reverse=True)
    assert len(typed["events"]) == 5 and typed["before"] == typed["events"][-1]["position"]
    assert {(e["stream"], e["type"]) for e in typed["events"]} == {("eth", "RequestReceived")}


async def test_search_goes_on_from_where_a_bounded_look_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "MAX_SEARCH_SCAN", 10)
    async with desk(*[answer() for _ in range(10)], agents=("btc",)) as d:
        old = request("btc", payload={"note": "first"})
        await d.engine.submit(old)
        for _ in range(5):
            await d.engine.submit(request("btc"))
            await d.settle()
        async with d.http() as http:
            cursor, looked, found = None, 0, []
            for _ in range(20):
                page = (await http.get("/api/events", params={
                    "q": "first", **({"before": cursor} if cursor else {})})).json()
                assert page["scanned"] <= 10
                looked += page["scanned"]
                found += page["events"]
                cursor = page["before"]
                if cursor is None:
                    break
            last = await d.store.last_position()
    assert [e["data"]["request"]["requestId"] for e in found] == [old.request_id]
    assert looked == last


async def test_search_keeps_to_the_scope_and_refuses_bad_input() -> None:
    async with desk(answer(), answer()) as d:
        await d.engine.submit(request("eth", payload={"note": "secret plan"}))
        await d.settle()
        async with d.http("scoped-secret") as http:
            hidden = (await http.get("/api/events", params={"q": "secret plan"})).json()
            other = await http.get("/api/events", params={"q": "x", "agent": "eth"})
        async with d.http() as http:
            seen = (await http.get("/api/events", params={"q": "secret plan"})).json()
            long = await http.get("/api/events", params={"q": "x" * 201})
            both = await http.get("/api/events", params={"q": "x", "after": "3"})
            bad = await http.get("/api/events", params={"before": "-2"})
    assert hidden["events"] == [] and other.status_code == 403
    assert [e["stream"] for e in seen["events"]] == ["eth"]
    for response in (long, both, bad):
        assert response.status_code == 422 and response.json()["code"] == "invalid"
