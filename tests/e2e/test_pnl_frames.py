"""P&L over WebSocket: a subscription with ``pnl`` gets the P&L of its agents after the
snapshot and again whenever a fill or a price changes it, never when nothing did; a scoped
token's frames hold its agents only; a subscription without ``pnl`` gets none."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from websockets.asyncio.client import ClientConnection, connect

from gateway.config import parse_config
from gateway.edge.server import Running, serving
from gateway.market.events import Tick
from gateway.wiring import build_service
from tests.e2e.live import TIMEOUT, receive, receive_until
from tests.gateway.support import until

CONFIG = """
[server]
heartbeat_s = 0.5

[[tokens]]
name = "ops"
token = "control-token-secret-1234"
role = "control"

[[tokens]]
name = "alpha-desk"
token = "scoped-token-secret-3456"
role = "viewer"
agents = ["alpha"]

[[agents]]
id = "alpha"
mode = "followup"
[agents.reasoner]
latency_ms = [5, 10]
trade_probability = 1.0

[[agents]]
id = "bravo"
mode = "followup"
[agents.reasoner]
latency_ms = [5, 10]
trade_probability = 1.0
"""
OPS = {"Authorization": "Bearer control-token-secret-1234"}
SCOPED = {"Authorization": "Bearer scoped-token-secret-3456"}


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Running]:
    service = build_service(parse_config(CONFIG), tmp_path / "events.db")
    async with serving(service) as running:
        yield running


@contextlib.asynccontextmanager
async def subscribed(running: Running, headers: dict[str, str], **options: Any
                     ) -> AsyncIterator[ClientConnection]:
    async with connect(running.url.replace("http", "ws") + "/ws/control",
                       additional_headers=headers, open_timeout=TIMEOUT) as ws:
        assert (await receive(ws))["type"] == "hello"
        await ws.send(json.dumps({"type": "subscribe", "id": "s", "batch": True, **options}))
        assert (await receive(ws))["type"] == "snapshot"
        yield ws


def is_pnl(frame: dict[str, Any]) -> bool:
    return bool(frame["type"] == "pnl")


async def filled(running: Running, agent: str, price: float) -> None:
    """One order of ``agent``, filled by a tick at ``price`` (or at once, at the last
    price, if the feed has sent one)."""
    engine = running.service.engine
    before = engine.state(agent).counters.orders_accepted
    async with httpx2.AsyncClient(base_url=running.url, headers=OPS, timeout=TIMEOUT) as http:
        answer = await http.post(f"/api/agents/{agent}/requests", json={
            "requestId": f"{agent}-{price}", "createdAt": datetime.now(UTC).isoformat(),
            "agentId": agent, "kind": "hook_trigger", "dedupeKey": f"{agent}-{price}",
            "payload": {"symbol": "BTCUSD"}})
        assert answer.status_code == 200, answer.text

    async def placed() -> bool:
        return engine.state(agent).counters.orders_accepted > before
    await until(placed, "an order placed")
    tick(running, price)

    async def done() -> bool:
        return not engine.state(agent).orders
    await until(done, "the order filled")


def tick(running: Running, price: float) -> None:
    running.service.on_market([Tick(symbol="BTCUSD", price=price, at=datetime.now(UTC))])


async def test_pnl_frames_come_after_the_snapshot_and_when_a_fill_or_a_price_moves_it(
        gateway: Running) -> None:
    async with subscribed(gateway, OPS, pnl=True) as ws:
        first = (await receive_until(ws, is_pnl))[-1]["pnl"]
        assert [a["agentId"] for a in first["agents"]] == ["alpha", "bravo"]
        assert first["desk"]["total"] == 0 and all(not a["positions"] for a in first["agents"])
        await filled(gateway, "alpha", 100.0)
        frame = (await receive_until(ws, lambda f: is_pnl(f) and f["pnl"]["agents"][0][
            "positions"]))[-1]["pnl"]
        [position] = frame["agents"][0]["positions"]
        assert position["symbol"] == "BTCUSD" and position["mark"] == 100.0
        assert position["avgPrice"] == 100.0 and position["unrealized"] == 0.0
        tick(gateway, 110.0)  # the mark moves: unrealized P&L with it
        moved = (await receive_until(ws, lambda f: is_pnl(f) and f["pnl"]["agents"][0][
            "positions"][0]["mark"] == 110.0))[-1]["pnl"]
        held = moved["agents"][0]["positions"][0]["netQty"]
        assert moved["desk"]["unrealized"] == pytest.approx(10.0 * held)
        # Nothing changes: heartbeats, no P&L frame.
        quiet = await receive_until(ws, lambda f: f["type"] == "heartbeat")
        quiet += await receive_until(ws, lambda f: f["type"] == "heartbeat")
        assert not [f for f in quiet if is_pnl(f)], quiet


async def test_a_scoped_token_hears_its_agents_pnl_only_and_no_pnl_unasked(
        gateway: Running) -> None:
    async with subscribed(gateway, SCOPED, pnl=True) as scoped, subscribed(gateway, OPS) as plain:
        first = (await receive_until(scoped, is_pnl))[-1]["pnl"]
        assert [a["agentId"] for a in first["agents"]] == ["alpha"]
        await filled(gateway, "bravo", 100.0)  # not alpha's: nothing of it shown
        await filled(gateway, "alpha", 101.0)
        frame = (await receive_until(scoped, lambda f: is_pnl(f) and f["pnl"]["agents"][0][
            "positions"]))[-1]["pnl"]
        assert [a["agentId"] for a in frame["agents"]] == ["alpha"]
        assert frame["desk"]["exposure"] == pytest.approx(
            frame["agents"][0]["totals"]["exposure"])
        heard = await receive_until(plain, lambda f: f["type"] == "heartbeat")
        assert not [f for f in heard if is_pnl(f)]
