"""The blotter over HTTP: orders, fills, cancels, rejections and positions read from the log,
per agent and for the desk, within each token's scope."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import httpx2

from gateway.edge.openapi import openapi_document
from gateway.llm.reasoner import RunContext, RunResult
from gateway.market.events import Tick
from lanes import AgentConfig, Mode
from lanes.events import BrokerReport, OrderIntent, Outcome
from lanes.requests import AgentRequest
from store import SqliteEventStore
from tests.e2e.live import Live, running
from tests.gateway.support import until

_n = count(1)
AGENTS = {"btc": AgentConfig(mode=Mode.FOLLOWUP), "eth": AgentConfig(mode=Mode.FOLLOWUP)}


class Trader:
    """Each run places the orders its request's payload lists."""

    def __call__(self, _agent_id: str) -> Trader:
        return self

    async def run(self, ctx: RunContext) -> RunResult:
        orders = tuple(OrderIntent.model_validate(o) for r in ctx.requests
                       for o in r.payload.get("orders", []))
        return RunResult(outcome=Outcome.TRADE if orders else Outcome.NO_TRADE, orders=orders)


def trigger(agent: str, *orders: dict[str, Any]) -> AgentRequest:
    n = next(_n)
    return AgentRequest.model_validate({
        "requestId": f"t{n}", "createdAt": datetime.now(UTC).isoformat(), "agentId": agent,
        "kind": "hook_trigger", "dedupeKey": f"k{n}", "payload": {"orders": list(orders)}})


def control(agent: str, action: str, **payload: Any) -> AgentRequest:
    return AgentRequest.model_validate({
        "requestId": f"c{next(_n)}", "createdAt": datetime.now(UTC).isoformat(),
        "agentId": agent, "kind": "user_control", "payload": {"action": action, **payload}})


async def blotter(live: Live, path: str, token: str = "viewer-secret",
                  **params: str) -> dict[str, Any]:
    async with live.client(token) as client:
        response = await client.get(path, params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def started(live: Live) -> None:
    async def up() -> bool:
        return live.engine.running
    await until(up, "the engine to start")


async def orders_open(live: Live, agent: str, n: int) -> None:
    async def opened() -> bool:
        return len(live.engine.state(agent).orders) == n
    await until(opened, f"{n} open orders of {agent}")


async def trade_some(live: Live) -> None:
    """btc: buys 2 and 1 BTCUSD (the first filled in two parts, the second cancelled by
    ``ops``), a sell the broker rejects; eth: a buy left open."""
    engine = live.engine
    await started(live)
    await engine.submit(trigger("btc", {"symbol": "BTCUSD", "side": "buy", "qty": 2},
                                {"symbol": "BTCUSD", "side": "buy", "qty": 1,
                                 "orderType": "limit", "limitPrice": 60000},
                                {"symbol": "BTCUSD", "side": "sell", "qty": 5}))
    await orders_open(live, "btc", 3)
    await engine.submit(trigger("eth", {"symbol": "ETHUSD", "side": "buy", "qty": 3}))
    await orders_open(live, "eth", 1)
    now = engine.clock.now_ms()
    await engine.report("btc", BrokerReport(at=now, order_id="btc-r1-o1",
                                            status="partially_filled", filled_qty=0.5,
                                            price=64_000.0))
    await engine.report("btc", BrokerReport(at=now + 1, order_id="btc-r1-o1", status="filled",
                                            filled_qty=1.5, price=64_400.0))
    await engine.report("btc", BrokerReport(at=now + 2, order_id="btc-r1-o3",
                                            status="rejected", reason="insufficient margin"))
    await engine.submit(control("btc", "cancel_order", orderId="btc-r1-o2"), principal="ops")
    await engine.report("btc", BrokerReport(at=engine.clock.now_ms(), order_id="btc-r1-o2",
                                            status="cancelled"))
    await engine.flush()


async def test_an_agents_blotter_shows_fills_cancels_rejections_and_its_position(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Trader()) as live:
        await trade_some(live)
        body = await blotter(live, "/api/agents/btc/orders")
    assert body["agents"] == ["btc"] and body["openOrders"] == []
    assert [(f["orderId"], f["qty"], f["price"]) for f in body["fills"]] == [
        ("btc-r1-o1", 1.5, 64_400.0), ("btc-r1-o1", 0.5, 64_000.0)]  # newest first
    (cancel,) = body["cancels"]
    assert cancel["orderId"] == "btc-r1-o2" and cancel["by"] == "ops"
    assert (cancel["action"], cancel["status"]) == ("cancel_order", "cancelled")
    assert cancel["closedAt"] >= cancel["requestedAt"]
    (rejection,) = body["rejections"]
    assert rejection == {"agentId": "btc", "source": "broker", "runId": "btc-r1",
                         "orderId": "btc-r1-o3", "symbol": "BTCUSD", "side": "sell",
                         "qty": 5.0, "reason": "insufficient margin", "at": rejection["at"]}
    (position,) = body["positions"]
    assert (position["symbol"], position["netQty"], position["avgPrice"]) == (
        "BTCUSD", 2.0, 64_300.0)
    assert body["truncated"] is False and body["limit"] == 100


async def test_open_orders_have_their_terms_and_age_and_a_gate_rejection_its_reason(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Trader()) as live:
        await started(live)
        await live.engine.submit(trigger("eth", {"symbol": "ETHUSD", "side": "buy", "qty": 3,
                                                 "orderType": "limit", "limitPrice": 3000}))
        await orders_open(live, "eth", 1)
        await live.engine.submit(control("eth", "pause"))
        await live.engine.submit(trigger("eth", {"symbol": "SOLUSD", "side": "buy", "qty": 1}))

        async def rejected() -> dict[str, Any] | None:
            body = await blotter(live, "/api/agents/eth/orders")
            return body if body["rejections"] else None
        body = await until(rejected, "the gate's rejection")
    (order,) = body["openOrders"]
    assert (order["orderId"], order["symbol"], order["side"], order["qty"]) == (
        "eth-r1-o1", "ETHUSD", "buy", 3.0)
    assert (order["orderType"], order["limitPrice"], order["filledQty"]) == ("limit", 3000.0, 0.0)
    assert order["ageMs"] == body["at"] - order["placedAt"] >= 0
    (rejection,) = body["rejections"]
    assert rejection["source"] == "gate" and rejection["orderId"] is None
    assert "REDUCING" in rejection["reason"] and "SOLUSD" in rejection["reason"]


async def test_the_desk_blotter_holds_every_agent_and_filters_by_agent_and_symbol(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Trader()) as live:
        await trade_some(live)
        first = await asyncio.gather(*(blotter(live, "/api/orders") for _ in range(4)))
        desk = await blotter(live, "/api/orders")
        only_eth = await blotter(live, "/api/orders", agent="eth")
        btc_symbol = await blotter(live, "/api/orders", symbol="BTCUSD")
        limited = await blotter(live, "/api/orders", limit="1")
    assert desk["agents"] == ["btc", "eth"]
    for answer in first:  # read at once, and folded once (nothing counted twice)
        assert {k: v for k, v in answer.items() if k not in ("at", "openOrders")} == \
            {k: v for k, v in desk.items() if k not in ("at", "openOrders")}
    assert [o["orderId"] for o in desk["openOrders"]] == ["eth-r1-o1"]
    assert {(p["agentId"], p["symbol"]) for p in desk["positions"]} == {("btc", "BTCUSD")}
    assert only_eth["agents"] == ["eth"] and only_eth["fills"] == []
    assert btc_symbol["openOrders"] == [] and len(btc_symbol["fills"]) == 2
    assert len(limited["fills"]) == 1 and limited["truncated"] is True


async def test_a_scoped_token_sees_only_its_agents_orders(tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Trader()) as live:
        await trade_some(live)
        desk = await blotter(live, "/api/orders", token="scoped-secret")
        async with live.client("scoped-secret") as client:
            other = await client.get("/api/agents/eth/orders")
            named = await client.get("/api/orders", params={"agent": "eth"})
        async with live.client("feed-secret") as client:
            feed = await client.get("/api/orders")
    assert desk["agents"] == ["btc"]
    assert {o["agentId"] for o in desk["openOrders"] + desk["fills"]} <= {"btc"}
    assert desk["openOrders"] == []  # eth's open order is not shown
    for refused in (other, named, feed):
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"


async def test_bad_parameters_get_typed_errors_and_change_nothing(tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Trader()) as live:
        await started(live)
        await live.engine.flush()  # (the start's own events)
        before = await live.engine.store.last_position()
        async with live.client("viewer-secret") as client:
            answers = {
                params: await client.get(path, params=dict(params))
                for path, params in (
                    ("/api/orders", (("limit", "abc"),)),
                    ("/api/orders", (("limit", "0"),)),
                    ("/api/orders", (("limit", "1001"),)),
                    ("/api/orders", (("limit", "-3"),)),
                    ("/api/orders", (("side", "buy"),)),
                    ("/api/orders", (("symbol", "X" * 33),)),
                    ("/api/agents/btc/orders", (("agent", "eth"),)),
                )
            }
            repeated = await client.get("/api/orders?limit=1&limit=2")
            unknown = await client.get("/api/orders", params={"agent": "ghost"})
            missing = await client.get("/api/agents/ghost/orders")
        async with httpx2.AsyncClient(base_url=live.http) as anonymous:
            nobody = await anonymous.get("/api/orders")
        await live.engine.flush()
        after = await live.engine.store.last_position()
    for params, answer in answers.items():
        assert answer.status_code == 422, params
        body = answer.json()
        assert body["code"] == "invalid" and body["field"] == params[0][0], body
    assert repeated.status_code == 422 and "more than once" in repeated.json()["message"]
    assert unknown.status_code == 404 and unknown.json()["code"] == "unknown_agent"
    assert missing.status_code == 404 and missing.json()["code"] == "unknown_agent"
    assert nobody.status_code == 401
    assert after == before


async def test_the_blotter_is_the_same_after_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    async with running(SqliteEventStore(db), AGENTS, Trader()) as live:
        await trade_some(live)
        before = await blotter(live, "/api/orders")
    async with running(SqliteEventStore(db), AGENTS, Trader()) as live:
        await started(live)
        after = await blotter(live, "/api/orders")
        await live.engine.submit(trigger("btc", {"symbol": "BTCUSD", "side": "sell",
                                                 "qty": 1}))
        await orders_open(live, "btc", 1)
        await live.engine.flush()  # (the blotter reads what is committed)
        later = await blotter(live, "/api/orders")  # what was appended since is read too
    skip = {"at", "openOrders"}
    assert {k: v for k, v in after.items() if k not in skip} == \
        {k: v for k, v in before.items() if k not in skip}
    assert [o["orderId"] for o in after["openOrders"]] == ["eth-r1-o1"]
    assert [o["orderId"] for o in later["openOrders"]] == ["eth-r1-o1", "btc-r2-o1"]


def test_the_blotter_answer_is_described_in_the_openapi_document() -> None:
    document = openapi_document()
    schemas = document["components"]["schemas"]
    ok = document["paths"]["/api/orders"]["get"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BlotterView"}
    assert "openOrders" in schemas["BlotterView"]["required"]
    assert schemas["RejectionView"]["properties"]["reason"]["type"] == "string"
    assert "avgPrice" in schemas["PositionView"]["required"]


async def test_pnl_marks_each_position_to_the_feeds_price_and_sums_the_desk(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Trader()) as live:
        await trade_some(live)
        engine = live.engine
        market = engine.runs.toolbox.market
        market.observe(Tick(symbol="BTCUSD", price=64_800.0,
                            at=datetime.fromtimestamp(engine.clock.now_ms() / 1000, UTC)))
        await engine.submit(trigger("btc", {"symbol": "BTCUSD", "side": "sell", "qty": 0.5}))
        await orders_open(live, "btc", 1)
        await engine.report("btc", BrokerReport(at=engine.clock.now_ms(), order_id="btc-r2-o1",
                                                status="filled", filled_qty=0.5,
                                                price=64_500.0))
        await engine.flush()
        market.observe(Tick(symbol="BTCUSD", price=65_000.0,
                            at=datetime.fromtimestamp(engine.clock.now_ms() / 1000, UTC)))
        desk = await blotter(live, "/api/pnl")
        scoped = await blotter(live, "/api/pnl", token="scoped-secret")
        orders = await blotter(live, "/api/agents/btc/orders")
    btc, eth = desk["agents"]
    (position,) = btc["positions"]
    assert (position["symbol"], position["netQty"], position["avgPrice"]) == (
        "BTCUSD", 1.5, 64_300.0)
    assert position["mark"] == 65_000.0 and not position["stale"] and position["complete"]
    assert position["realized"] == 0.5 * (64_500 - 64_300)
    assert position["unrealized"] == 1.5 * (65_000 - 64_300)
    assert position["marketValue"] == position["exposure"] == 1.5 * 65_000
    assert (eth["agentId"], eth["positions"]) == ("eth", [])
    assert desk["desk"]["total"] == position["realized"] + position["unrealized"]
    assert desk["desk"]["exposure"] == 1.5 * 65_000
    assert [a["agentId"] for a in scoped["agents"]] == ["btc"]
    assert orders["positions"][0]["realizedPnl"] == 100.0
    sold = next(f for f in orders["fills"] if f["orderId"] == "btc-r2-o1")
    # sold at 64,500 when the run decided at 64,800: 300 worse per unit
    assert (sold["decisionPrice"], sold["slippage"]) == (64_800.0, 300.0)
    bought = next(f for f in orders["fills"] if f["orderId"] == "btc-r1-o1")
    assert bought["decisionPrice"] is None  # (no price was known when it was decided)


async def test_a_mark_older_than_the_allowed_age_is_stale(tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, Trader()) as live:
        await trade_some(live)
        market = live.engine.runs.toolbox.market
        old = live.engine.clock.now_ms() - market.stale_ms - 1_000
        market.observe(Tick(symbol="BTCUSD", price=65_000.0,
                            at=datetime.fromtimestamp(old / 1000, UTC)))
        desk = await blotter(live, "/api/pnl")
    (position,) = desk["agents"][0]["positions"]
    assert position["stale"] and position["markAgeMs"] > market.stale_ms
    assert desk["desk"]["stale"] is True
