"""A desk with something in every view, for reviewing the panel at each width (issue 27):
traders with open orders, fills, a rejection and orders waiting for approval, a long-named
agent with pending requests, a scheduled agent, a halted one, a connector gone down (alerts
and feed health)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from gateway.edge.server import Running
from gateway.market.events import ConnectorStatus, Tick
from tests.browser.live import agent, http, panel_config, request, submit
from tests.gateway.support import until

LONG = "momentum_scalper_btcusd_5m_with_a_long_name"
WIDTHS = ((1920, 1080), (1280, 800), (1024, 768), (390, 844))


def trader(agent_id: str, **lane: Any) -> dict[str, Any]:
    """An agent whose every run places one market order (the symbol its request names)."""
    table = agent(agent_id, (30, 60), **lane)
    table["reasoner"]["trade_probability"] = 1.0
    return table


def review_config(db: Path) -> GatewayConfig:
    """The review desk's agents (the long-named one thinks for 30 s: its queue fills)."""
    return panel_config(db, [
        trader("alpha"), trader("bravo"), trader("approver", approval="always"),
        agent(LONG, (30_000, 30_000)),
        agent("scheduled", (30, 60), schedules=[
            {"id": "hourly_audit_of_positions", "every_ms": 3_600_000},
            {"id": "open", "cron": "30 9 * * 1-5", "timezone": "America/New_York"}]),
    ], hooked=[])


async def orders_of(running: Running, agent_id: str, n: int) -> None:
    async def counted() -> bool:
        return len(running.service.engine.state(agent_id).orders) == n
    await until(counted, f"{n} open orders of {agent_id}")


async def scene(running: Running) -> None:
    """Orders open, filled, rejected and waiting; a queue; a halt; a connector down."""
    async with http(running) as client:
        for agent_id, symbol in (("alpha", "ETHUSD"), ("alpha", "BTCUSD"), ("bravo", "BTCUSD")):
            await submit(running, request(agent_id, payload={"symbol": symbol}))
        await orders_of(running, "alpha", 2)
        await orders_of(running, "bravo", 1)
        running.service.on_market([Tick(symbol="BTCUSD", price=64_123.456_78,
                                        at=datetime.now(UTC))])
        await orders_of(running, "alpha", 1)
        paused = await client.post("/api/agents/alpha/control", json={"action": "pause"})
        assert paused.status_code == 200, paused.text
        await submit(running, request("alpha", payload={"symbol": "SOLUSD"}))
        for _ in range(2):
            await submit(running, request("approver", payload={"symbol": "BTCUSD"}))

        async def waiting() -> bool:
            return len(running.service.engine.state("approver").approvals) >= 2
        await until(waiting, "two approvals waiting")
        for n in range(6):
            await submit(running, request(LONG, payload={"n": n}))
        stopped = await client.post("/api/agents/bravo/control",
                                    json={"action": "emergency_stop"})
        assert stopped.status_code == 200, stopped.text
        running.service.on_market([ConnectorStatus(connector="binance-ws", status="down",
                                                   at=datetime.now(UTC),
                                                   detail="socket closed by peer")])
