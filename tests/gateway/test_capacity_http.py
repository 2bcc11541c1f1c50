"""``GET /api/capacity`` on the real engine with a provider gate and a fake clock: queue depth,
gate waits and use, run latency by percentile for the desk and each agent, the same after a
restart, within the token's scope; bad parameters are typed errors naming the parameter."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest

from gateway.edge.app import create_app
from gateway.edge.auth import TokenBook
from gateway.edge.service import Service
from gateway.llm.reasoner import LLMReasoner
from gateway.reads import capacity
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from lanes import AgentConfig
from lanes.gate.events import GateLimits
from store import MemoryEventStore
from store.port import StoreError
from tests.e2e.live import TOKENS
from tests.gateway.support import TIMEOUT, control, request
from tests.gateway.test_gate_engine import ScriptedLLM, answer
from tests.gateway.test_history import START, desk, later, two_runs_one_waiting

WINDOW = {"from": START, "to": START + 10_000, "step": 5_000}


def client(engine: Engine, token: str = "viewer-secret") -> httpx2.AsyncClient:
    app = create_app(Service(engine=engine, tokens=TokenBook(TOKENS.items())))
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gw",
                             headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)


async def capacity_of(http: httpx2.AsyncClient, **params: Any) -> dict[str, Any]:
    response = await http.get("/api/capacity", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_capacity_gives_gate_waits_and_use_and_run_latency_per_step() -> None:
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)  # eth waits 3 s behind btc's call
        async with d.http() as http:
            body = await capacity_of(http, **WINDOW)
            one = await capacity_of(http, agent="eth", **WINDOW)
    assert (body["from"], body["to"], body["step"], body["since"]) == (
        START, START + 10_000, 5_000, None)
    desk_ = body["desk"]
    assert desk_["agents"] == 2 and desk_["runs"] == [0, 2]
    assert desk_["p50"] == [None, 4_500] and desk_["p95"] == [None, 5_000]
    assert desk_["depth"] == [0, 0]  # each request started its run at once
    assert body["busiest"] is True
    assert {a["agentId"]: a["p95"] for a in body["agents"]} == {"btc": [None, 5_000],
                                                               "eth": [None, 4_500]}
    [gate] = body["gates"]
    assert gate["provider"] == "claude"
    assert gate["waiting"] == [1, 0]  # eth's request, seconds 2 to 4
    assert gate["waits"] == [1, 1] and gate["waitP95"] == [0, 3_000]
    assert gate["requests"] == [1, 2]  # granted in the last 60 s, as the gate counts
    assert gate["inputTokens"][1] > 0 and gate["limits"]["requestsPerMinute"] is None
    assert gate["requestUse"] == [None, None]  # no requests-per-minute limit to use
    assert one["busiest"] is False and [a["agentId"] for a in one["agents"]] == ["eth"]


async def test_use_is_the_share_of_the_limits_and_a_limit_change_is_marked() -> None:
    async with desk(answer(), agents=("btc",)) as d:
        async with d.http("admin-secret") as admin:
            changed = await admin.post("/api/providers/claude/limits", json={
                "maxConcurrent": 1, "requestsPerMinute": 4, "inputTokensPerMinute": 10_000})
            assert changed.status_code == 200, changed.text
        d.clock.advance(1_000)
        await d.engine.submit(request("btc"))
        await d.client.call_count(1)
        await d.settle()
        async with d.http() as http:
            body = await capacity_of(http, **WINDOW)
    [gate] = body["gates"]
    assert gate["requests"] == [1, 1] and gate["requestUse"] == [0.25, 0.25]
    assert gate["tokenUse"][0] == round(gate["inputTokens"][0] / 10_000, 4)
    assert [m["kind"] for m in body["marks"] if m.get("provider") == "claude"] == ["limits"]


async def test_the_series_are_the_same_after_a_restart() -> None:
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)
        async with d.http() as http:
            before = await capacity_of(http, **WINDOW)
        clock = d.clock
    store = MemoryEventStore(clock=clock.now_ms, committed=await d.store.read())
    gate = ProviderGate(store, "claude", GateLimits(max_concurrent=1), clock)
    reasoner = LLMReasoner(ScriptedLLM())
    engine = Engine(store, {a: AgentConfig() for a in ("btc", "eth")}, clock=clock,
                    reasoners=lambda _: reasoner, gates={"claude": gate},
                    agent_gates={"btc": "claude", "eth": "claude"})
    await engine.start()
    try:
        async with client(engine) as http:
            after = await capacity_of(http, **WINDOW)
    finally:
        await engine.stop()
    assert after.pop("position") >= before.pop("position")
    assert after == before


async def test_a_scoped_token_sees_its_agents_alone() -> None:
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)
        async with d.http("scoped-secret") as http:
            body = await capacity_of(http, **WINDOW)
            other = await http.get("/api/capacity", params={"agent": "eth", **WINDOW})
    assert body["desk"]["agents"] == 1 and body["desk"]["p95"] == [None, 5_000]
    assert [a["agentId"] for a in body["agents"]] == ["btc"]
    assert other.status_code == 403


async def test_new_events_are_folded_in_when_asked_again() -> None:
    async with desk(agents=("btc",)) as d, d.http() as http:
        await d.engine.submit(control("btc", "emergency_stop"))  # nothing runs, all wait
        await d.settle()
        before = await capacity_of(http, **WINDOW)
        for _ in range(3):
            await d.engine.submit(request("btc"))
        await d.settle()
        again = await capacity_of(http, **WINDOW)
    assert before["desk"]["depth"] == [0, 0] and [m["kind"] for m in before["marks"]] == ["stop"]
    assert again["desk"]["depth"] == [3, 3] and again["position"] > before["position"]
    assert [a["depth"] for a in again["agents"]] == [[3, 3]]


@pytest.mark.parametrize(("params", "field"), [
    ({"from": START + 1, "to": START + 10_000}, "from"),
    ({"from": START, "to": START}, "from"),
    ({"from": START, "to": START + 100_000_000}, "from"),
    ({"from": START, "to": START + 10_000, "step": 500}, "step"),
    ({"from": START, "to": START + 10_000, "step": 1_500}, "step"),
    ({"from": START, "to": START + 3_600_000, "step": 1_000}, "step"),
    ({"to": "soon"}, "to"),
    ({"from": "-1000"}, "from"),
    ({"agent": ",".join(f"a{n}" for n in range(21))}, "agent"),
    ({"agent": ","}, "agent"),
    ({"busiest": 21}, "busiest"),
    ({"window": "1h"}, "window"),
])
async def test_bad_parameters_are_typed_errors_naming_the_parameter(
        params: dict[str, Any], field: str) -> None:
    async with desk(agents=("btc",)) as d, d.http() as http:
        response = await http.get("/api/capacity", params=params)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "invalid" and body.get("field") == field, body


async def test_an_unknown_agent_or_provider_is_named() -> None:
    async with desk(agents=("btc",)) as d, d.http() as http:
        agent = await http.get("/api/capacity", params={"agent": "nope"})
        provider = await http.get("/api/capacity", params={"provider": "nope"})
    assert agent.status_code == 404 and agent.json()["code"] == "unknown_agent"
    assert provider.status_code == 404 and provider.json()["code"] == "unknown_provider"
    assert "'nope'" in provider.json()["message"]


async def test_a_long_first_read_is_answered_with_what_was_read_and_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = later(), later()
    async with desk(first, second) as d:
        await two_runs_one_waiting(d, first, second)
        async with d.http() as http:
            direct = await capacity_of(http, **WINDOW)
        monkeypatch.setattr(capacity, "FIRST_WAIT_S", 0.0)
        monkeypatch.setattr(capacity, "READ_PAGE", 2)
        monkeypatch.setattr(capacity, "FOLD_STEP", 1)
        async with client(d.engine) as http:  # (a fresh book: it has read nothing yet)
            partial = await capacity_of(http, **WINDOW)
            whole = partial
            for _ in range(1_000):  # each ask waits for nothing: the read goes on meanwhile
                if whole["behind"] == 0:
                    break
                await asyncio.sleep(0)
                whole = await capacity_of(http, **WINDOW)
    assert direct["behind"] == 0
    assert partial["behind"] > 0 and partial["position"] < whole["position"]
    assert whole == direct


async def test_a_log_that_cannot_be_read_is_a_typed_error_and_the_next_ask_reads_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with desk(agents=("btc",)) as d, d.http() as http:
        read = d.store.read

        async def failing(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("disk I/O error")

        monkeypatch.setattr(d.store, "read", failing)
        refused = await http.get("/api/capacity", params=WINDOW)
        monkeypatch.setattr(d.store, "read", read)
        body = await capacity_of(http, **WINDOW)
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "storage_failed"
    assert body["behind"] == 0 and body["position"] > 0
