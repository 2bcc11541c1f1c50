"""Runs that are tool loops, end to end: the real anthropic and openai SDK clients against
the fake provider (native tool calling, streamed), the provider gate, the engine and its log.
Every model call and tool result is an event; orders placed by a tool reach the broker; a
stop in the middle of a loop ends it with nothing placed after; the log verifies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.base.clock import SystemClock
from gateway.config import parse_config
from gateway.edge.server import serving as serving_gateway
from gateway.llm.fake_provider import (
    FakeProvider,
    FakeProviderConfig,
    Fault,
    FaultKind,
    create_fake_provider,
    scripted,
    serving,
)
from gateway.llm.port import LLMClient
from gateway.llm.providers import AnthropicClient, OpenAIClient
from gateway.llm.reasoner import LLMReasoner
from gateway.market.book import MarketBook
from gateway.market.events import Tick
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from gateway.wiring import build_service
from lanes import AgentConfig, verify
from lanes.gate.events import GateLimits
from lanes.requests import AgentRequest
from store import MemoryEventStore
from tests.gateway.support import log_of, next_event, request

TOOLS = ("market_snapshot", "positions", "open_orders", "place_order", "agent_status")
FINAL = '{"decision": "trade", "reason": "bought the dip"}'
STEPS: list[list[tuple[str, dict[str, Any]]]] = [
    [("market_snapshot", {"symbol": "BTCUSD"}), ("positions", {})],
    [("place_order", {"symbol": "BTCUSD", "side": "buy", "qty": 0.5}),
     ("agent_status", {"agentId": "nobody"}), ("transfer_funds", {"to": "me"})],
]


@pytest.fixture
async def provider() -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = create_fake_provider(FakeProviderConfig(reply=scripted(STEPS, lambda _: FINAL),
                                                   chunk_chars=7))
    async with serving(fake) as url:
        yield fake, url


class Orders:
    """A broker that keeps what it is sent."""

    def __init__(self) -> None:
        self.placed: list[str] = []

    async def place(self, agent_id: str, order_id: str, intent: object) -> None:
        self.placed.append(order_id)

    async def cancel(self, agent_id: str, order_id: str) -> None:
        return None


def client_of(kind: str, url: str) -> LLMClient:
    if kind == "anthropic":
        return AnthropicClient("claude-test", api_key="test-key-123", base_url=url, timeout_s=5)
    return OpenAIClient("gpt-test", api_key="test-key-123", base_url=f"{url}/v1", timeout_s=5)


async def engine_for(client: LLMClient, broker: Orders, market: MarketBook,
                     **config: Any) -> tuple[Engine, MemoryEventStore]:
    store = MemoryEventStore()
    gate = ProviderGate(store, "llm", GateLimits(), clock=SystemClock())
    reasoner = LLMReasoner(client, max_tokens=256)
    engine = Engine(store, {"desk": AgentConfig(tools=TOOLS, **config)},
                    reasoners=lambda _: reasoner, gates={"llm": gate},
                    agent_gates={"desk": "llm"}, broker=broker, market=market)
    await engine.start()
    return engine, store


def data_of(records: list[Any], kind: str) -> list[Mapping[str, Any]]:
    return [json.loads(r.data) for r in records if r.type == kind]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_tool_loop_is_recorded_step_by_step_and_its_order_reaches_the_broker(
        provider: tuple[FakeProvider, str], kind: str) -> None:
    fake, url = provider
    market = MarketBook()
    market.observe(Tick(symbol="BTCUSD", price=64_000.0, at=datetime.now(UTC)))
    broker, client = Orders(), client_of(kind, url)
    engine, store = await engine_for(client, broker, market)
    await engine.submit(request("desk"))
    await next_event(store, "RunCompleted")
    await engine.flush()
    await engine.stop()
    await client.close()

    records = await store.read_stream("desk")
    types = [r.type for r in records]
    run = types.index("RunStarted")
    assert types[run:].count("ModelCalled") == 3 and types.count("StepDecided") == 3
    assert types.count("ToolReturned") == 4  # two reads, the order, the unknown agent
    calls = data_of(records, "ModelCalled")
    assert [[c["name"] for c in m["tool_calls"]] for m in calls] == [
        ["market_snapshot", "positions"],
        ["place_order", "agent_status", "transfer_funds"], []]
    assert [m["step"] for m in calls] == [1, 2, 3]
    decided = data_of(records, "StepDecided")
    assert "'transfer_funds' does not exist" in decided[1]["refused"][0]["error"]
    results = {r["name"]: r for r in data_of(records, "ToolReturned")}
    snapshot = json.loads(results["market_snapshot"]["content"])
    assert snapshot["price"] == 64_000.0 and snapshot["stale"] is False
    assert results["place_order"]["ok"] is True
    assert results["agent_status"]["ok"] is False
    assert "nobody" in results["agent_status"]["content"]
    accepted = data_of(records, "OrderAccepted")
    assert [o["order_id"] for o in accepted] == broker.placed
    assert accepted[0]["order_id"].endswith("-s2-1")
    # the model saw each step's results: the fake refused nothing for pairing
    assert [c.status for c in fake.calls] == [200, 200, 200]
    assert verify(await log_of(store)) is None
    assert not any("test-key-123" in r.data for r in await store.read())


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_stop_in_the_middle_of_a_loop_ends_it_and_nothing_is_placed_after(
        provider: tuple[FakeProvider, str], kind: str) -> None:
    fake, url = provider
    fake.reset(FakeProviderConfig(reply=scripted(STEPS, lambda _: FINAL)))
    fake.fail_next(Fault(FaultKind.HANG, seconds=0))  # step 1 answers at once
    fake.fail_next(Fault(FaultKind.HANG, seconds=30))  # step 2's call hangs until released
    broker, client = Orders(), client_of(kind, url)
    engine, store = await engine_for(client, broker, MarketBook())
    await engine.submit(request("desk"))
    first = await next_event(store, "ToolReturned")
    await next_event(store, "ToolReturned", after=first.position)  # step 1 done
    stop = AgentRequest.model_validate({
        "requestId": "stop-1", "createdAt": datetime.now(UTC), "agentId": "desk",
        "kind": "user_control", "payload": {"action": "emergency_stop"}})
    await engine.submit(stop)
    await next_event(store, "RunAborted")
    fake.release()
    await asyncio.wait_for(engine.flush(), 5)
    await engine.stop()
    await client.close()

    types = [r.type for r in await store.read_stream("desk")]
    assert "OrderAccepted" not in types and broker.placed == []
    assert types.count("ModelCalled") == 1  # the hung call was cut off, never recorded
    assert types.index("RunAborted") > types.index("ToolReturned")
    assert verify(await log_of(store)) is None


APPROVING = """
[server]
host = "127.0.0.1"
port = 0

[[tokens]]
name = "ops"
token = "control-token-secret-1234"
role = "control"

[[tokens]]
name = "watcher"
token = "viewer-token-secret-9012"
role = "viewer"

[[providers]]
name = "claude"
kind = "anthropic"
model = "claude-test"
base_url = "{url}"
api_key = "test-key-123"

[[agents]]
id = "desk"
mode = "followup"
tools = ["market_snapshot", "place_order"]
approval = {{ above_notional = 10000 }}
[agents.reasoner]
kind = "llm"
provider = "claude"
"""


async def test_an_order_above_the_notional_waits_for_a_human_over_http(
        provider: tuple[FakeProvider, str], tmp_path: Path) -> None:
    fake, url = provider
    fake.reset(FakeProviderConfig(reply=scripted(
        [[("place_order", {"symbol": "BTCUSD", "side": "buy", "qty": 1,
                           "orderType": "limit", "limitPrice": 60_000})]],
        lambda _: FINAL)))
    service = build_service(parse_config(APPROVING.format(url=url)), tmp_path / "events.db")
    ops = {"Authorization": "Bearer control-token-secret-1234"}
    viewer = {"Authorization": "Bearer viewer-token-secret-9012"}
    store = service.engine.store
    async with serving_gateway(service) as running, httpx2.AsyncClient(
            base_url=running.url, timeout=10) as http:
        submitted = await http.post("/api/agents/desk/requests", headers=ops, json={
            "requestId": "hook-1", "createdAt": datetime.now(UTC).isoformat(),
            "agentId": "desk", "kind": "user_control", "payload": {"message": "buy one"}})
        assert submitted.status_code == 200, submitted.text
        await next_event(store, "ApprovalRequested")
        waiting = (await http.get("/api/approvals", headers=viewer)).json()["approvals"]
        assert [(w["agentId"], w["notional"]) for w in waiting] == [("desk", 60_000)]
        approval_id = waiting[0]["approvalId"]
        refused = await http.post("/api/agents/desk/control", headers=viewer, json={
            "action": "approve", "approvalId": approval_id})
        assert refused.status_code == 403
        approved = await http.post("/api/agents/desk/control", headers=ops, json={
            "action": "approve", "approvalId": approval_id, "reason": "fine"})
        assert approved.status_code == 200, approved.text
        accepted = await next_event(store, "OrderAccepted")
        assert json.loads(accepted.data)["order_id"] == approval_id
        again = await http.post("/api/agents/desk/control", headers=ops, json={
            "action": "approve", "approvalId": approval_id})
        assert again.json()["decision"] == "rejected"
        assert "no order waits" in again.json()["reason"]
        # the outcome reaches the agent as a request: a run of its own
        outcome = await next_event(store, "RunStarted", after=accepted.position)
        assert f"{approval_id}-approval" in json.loads(outcome.data)["request_ids"]
        # (that run follows the fake's script again: a new order, waiting in turn)
        await next_event(store, "ApprovalRequested", after=outcome.position)
        listed = (await http.get("/api/approvals", headers=viewer)).json()["approvals"]
        assert [w["approvalId"] for w in listed] == [f"{outcome_run(outcome)}-s1-1"]
        metrics = (await http.get("/metrics", headers=viewer)).text
        assert 'gateway_approvals_pending{agent="desk"} 1' in metrics


def outcome_run(record: Any) -> str:
    return str(json.loads(record.data)["run_id"])
