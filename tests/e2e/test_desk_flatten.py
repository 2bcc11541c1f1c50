"""A desk kill that flattens: every agent HALTED, then one closing market order per symbol
each holds, filled by the paper broker until every position is flat; the record lists the
orders, the log verifies, and a flatten alone over HTTP does the same for one agent."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.base.clock import SystemClock
from gateway.cli import main
from gateway.market.broker import PaperBroker
from gateway.market.events import Tick
from gateway.runtime.desk import read_kill
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode
from lanes.events import BrokerReport, TradingState
from lanes.flatten import FLAT, NOTHING
from lanes.streams import DESK_STREAM
from store import SqliteEventStore
from tests.e2e.live import Live, receive, running
from tests.e2e.test_orders import Trader, started, trigger
from tests.gateway.support import until

AGENTS = {name: AgentConfig(mode=Mode.FOLLOWUP) for name in ("btc", "eth", "sol", "idle")}
PRICES = {"BTCUSD": 100.0, "ETHUSD": 20.0, "SOLUSD": 5.0}


class Desk:
    """A paper broker that reports to the engine it is given once that runs."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.broker = PaperBroker(self._report, SystemClock())
        at = datetime.now(UTC)
        for symbol, price in PRICES.items():  # (market orders fill at once at these)
            self.broker.observe(Tick(symbol=symbol, price=price, at=at))

    async def _report(self, agent_id: str, report: BrokerReport) -> None:
        assert self.engine is not None
        await self.engine.report(agent_id, report)


def positions(live: Live) -> dict[str, dict[str, float]]:
    return {a: {s: q for s, q in live.engine.state(a).positions.items() if abs(q) > FLAT}
            for a in AGENTS}


async def settled(live: Live, what: str, check: Any) -> None:
    """Until the engine's state holds ``check``, and what it decided so far is committed
    (the HTTP reads read the log, which trails the state until then)."""
    async def done() -> bool:
        return bool(check())
    await until(done, what)
    await live.engine.flush()


async def with_positions(live: Live) -> None:
    """btc long 2 BTCUSD (and a limit buy resting); eth long 3 and short 1.5 SOLUSD; sol
    short 4 SOLUSD; idle nothing."""
    await started(live)
    await live.engine.submit(trigger("btc", {"symbol": "BTCUSD", "side": "buy", "qty": 2},
                                     {"symbol": "BTCUSD", "side": "buy", "qty": 1,
                                      "orderType": "limit", "limitPrice": 50}))
    await live.engine.submit(trigger("eth", {"symbol": "ETHUSD", "side": "buy", "qty": 3},
                                     {"symbol": "SOLUSD", "side": "sell", "qty": 1.5}))
    await live.engine.submit(trigger("sol", {"symbol": "SOLUSD", "side": "sell", "qty": 4}))
    held = {"btc": {"BTCUSD": 2.0}, "eth": {"ETHUSD": 3.0, "SOLUSD": -1.5},
            "sol": {"SOLUSD": -4.0}, "idle": {}}
    await settled(live, "the positions", lambda: positions(live) == held)
    await settled(live, "btc's resting order", lambda: len(live.engine.state("btc").orders) == 1)


async def post(live: Live, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with live.client("control-secret") as client:
        response = await client.post(path, content=json.dumps(body))
    answer: dict[str, Any] = response.json()
    return response.status_code, answer


async def flattened_log(db: Path) -> dict[str, Any]:
    desk = Desk()
    async with running(SqliteEventStore(db), AGENTS, Trader(),
                       engine_options={"broker": desk.broker}) as live:
        desk.engine = live.engine
        await with_positions(live)
        status, answer = await post(live, "/api/desk/kill", {"reason": "flat", "flatten": True})
        assert status == 200, answer
        assert {a: live.engine.state(a).trading for a in AGENTS} == \
            dict.fromkeys(AGENTS, TradingState.HALTED)
        await settled(live, "every position closed by fills",
                      lambda: positions(live) == {a: {} for a in AGENTS})
        await settled(live, "no order open",
                      lambda: not any(live.engine.state(a).orders for a in AGENTS))
        await live.engine.flush()
        [record] = await live.engine.store.read_stream(DESK_STREAM)
        assert read_kill(record.data).flatten_orders == 4
        return answer


def test_a_desk_kill_with_flatten_halts_every_agent_and_closes_every_position(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "e.db"
    answer = asyncio.run(flattened_log(db))
    assert answer["halted"] == 4 and answer["cancelsRequested"] == 1
    assert answer["flattenOrders"] == 4
    kill = answer["kill"]
    assert kill["flatten"] is True
    sent = {a["agentId"]: [(o["symbol"], o["side"], o["qty"]) for o in a["flattenOrders"]]
            for a in kill["agents"]}
    assert sent == {"btc": [("BTCUSD", "sell", 2.0)],
                    "eth": [("ETHUSD", "sell", 3.0), ("SOLUSD", "buy", 1.5)],
                    "sol": [("SOLUSD", "buy", 4.0)], "idle": []}
    assert {a["agentId"]: a.get("flattenNote") for a in kill["agents"]}["idle"] == NOTHING
    assert all(a["effect"]["toState"] == "HALTED" for a in kill["agents"])
    capsys.readouterr()
    assert main(["verify", str(db)]) == 0, capsys.readouterr().out


async def test_a_flatten_alone_closes_one_agents_positions_and_marks_the_orders(
        tmp_path: Path) -> None:
    desk = Desk()
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader(),
                       engine_options={"broker": desk.broker}) as live:
        desk.engine = live.engine
        await with_positions(live)
        status, answer = await post(live, "/api/agents/eth/control", {"action": "flatten"})
        assert status == 200, answer
        assert answer["decision"] == "accepted"
        assert answer["effect"]["fromState"] == answer["effect"]["toState"] == "ACTIVE"
        orders = answer["effect"]["flattenOrders"]
        assert [(o["symbol"], o["side"], o["qty"]) for o in orders] == [
            ("ETHUSD", "sell", 3.0), ("SOLUSD", "buy", 1.5)]
        await settled(live, "eth flat", lambda: positions(live)["eth"] == {})
        assert positions(live)["btc"] == {"BTCUSD": 2.0}  # the others are left as they were
        async with live.client("viewer-secret") as client:
            life = (await client.get(f"/api/agents/eth/orders/{orders[0]['orderId']}")).json()
            book = (await client.get("/api/agents/eth/orders")).json()
        assert life["flattenBy"] == answer["requestId"] and life["runId"] == ""
        assert life["status"] == "filled"
        assert [s["stage"] for s in life["steps"]][:1] == ["placed"]
        assert book["positions"] and all(abs(p["netQty"]) <= FLAT for p in book["positions"])

        # Nothing to flatten: refused, and it says so; nothing changes.
        status, again = await post(live, "/api/agents/idle/control", {"action": "flatten"})
        assert again["decision"] == "rejected" and again["reason"] == NOTHING, (status, again)
        assert live.engine.state("idle").trading is TradingState.ACTIVE


async def test_a_viewer_may_not_flatten_and_a_bad_body_names_its_field(tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader()) as live:
        await started(live)
        async with live.client("viewer-secret") as client:
            response = await client.post("/api/agents/btc/control",
                                         json={"action": "flatten"})
        assert response.status_code == 403
        async with live.socket() as ws:
            await ws.send(json.dumps({"type": "desk_kill", "id": "k", "flatten": "yes"}))
            frame = await receive(ws)
        assert frame["type"] == "error" and frame["field"] == "flatten"
        await live.engine.flush()
        assert await live.engine.store.read_stream(DESK_STREAM) == []
        assert {a: live.engine.state(a).trading for a in AGENTS} == \
            dict.fromkeys(AGENTS, TradingState.ACTIVE)
        assert not any(r.type == "RequestReceived" and "flatten" in r.data
                       for r in await live.engine.store.read_stream("btc"))
