"""Feed health over HTTP: each connector's status and each symbol's last data with its age
(stale past the limit), warnings in words; an operator pauses the hook rules (nothing they
would send is sent, prices still move) and resumes them; bad or unauthorised asks change
nothing."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.base.clock import FakeClock
from gateway.market.events import ConnectorStatus, MarketEvent, Tick
from gateway.market.hooks import HookEngine, PriceCrossRule
from lanes import AgentConfig, Mode
from store import SqliteEventStore
from tests.e2e.live import Live, running
from tests.e2e.test_orders import Trader

AGENTS = {"btc": AgentConfig(mode=Mode.FOLLOWUP)}


def rules() -> HookEngine:
    return HookEngine([PriceCrossRule(name="btc_65k", symbol="BTCUSD", level=65_000,
                                      agents=("btc",))])


def tick(clock: FakeClock, price: float) -> Tick:
    return Tick(symbol="BTCUSD", price=price, at=datetime.fromtimestamp(clock.now_ms() / 1000,
                                                                        UTC))


async def get(live: Live, path: str, token: str = "viewer-secret") -> dict[str, Any]:
    async with live.client(token) as client:
        response = await client.get(path)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def hooks(live: Live, body: Any, token: str = "control-secret") -> Any:
    async with live.client(token) as client:
        return await client.post("/api/feed/hooks", json=body)


def feed(live: Live, *events: MarketEvent) -> list[str]:
    return [r.request_id for r in live.service.on_market(events)]


async def test_feed_health_shows_connectors_symbols_and_stale_data(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader(), clock,
                       hooks=rules()) as live:
        feed(live, ConnectorStatus(connector="binance", status="degraded", detail="lagging",
                                   at=datetime.fromtimestamp(clock.now_ms() / 1000, UTC)),
             tick(clock, 64_000))
        fresh = await get(live, "/api/feed")
        clock.advance(fresh["staleMs"] + 1_000)
        stale = await get(live, "/api/feed")
    (connector,) = fresh["connectors"]
    assert (connector["connector"], connector["status"]) == ("binance", "degraded")
    (symbol,) = fresh["symbols"]
    assert (symbol["symbol"], symbol["price"], symbol["ticks"], symbol["stale"]) == (
        "BTCUSD", 64_000.0, 1, False)
    assert fresh["warnings"] == ["connector binance is degraded: lagging"]
    assert stale["symbols"][0]["stale"] and stale["symbols"][0]["ageMs"] > stale["staleMs"]
    assert any(w.startswith("no data for BTCUSD for 31 s") for w in stale["warnings"])


async def test_paused_hook_rules_send_nothing_and_resume_on_the_next_crossing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "gateway.controls")
    clock = FakeClock()
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader(), clock,
                       hooks=rules()) as live:
        assert feed(live, tick(clock, 64_000)) == []
        paused = await hooks(live, {"paused": True, "reason": "feed glitch"})
        assert paused.json()["changed"] and paused.json()["hooks"]["by"] == "ops"
        assert (await hooks(live, {"paused": True})).json()["changed"] is False
        assert feed(live, tick(clock, 65_500)) == []  # a crossing, not sent
        view = await get(live, "/api/feed")
        assert view["hooks"]["suppressed"] == 1 and view["symbols"][0]["price"] == 65_500
        assert "hook rules paused by ops: feed glitch" in view["warnings"]
        await hooks(live, {"paused": False})
        assert feed(live, tick(clock, 65_600)) == []  # no crossing since: nothing fires late
        assert len(feed(live, tick(clock, 64_900))) == 1  # the next crossing fires
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.controls"]
    assert said == ["hook rules paused by ops: feed glitch", "hook rules resumed by ops"]


async def test_only_desk_wide_control_tokens_pause_hooks_and_bad_bodies_are_refused(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader(),
                       hooks=rules()) as live:
        answers = [await hooks(live, {"paused": True}, token)
                   for token in ("viewer-secret", "feed-secret", "scoped-secret")]
        bad = [await hooks(live, body) for body in ({}, {"paused": "yes"},
                                                    {"paused": True, "extra": 1})]
        view = await get(live, "/api/feed")
    assert [a.status_code for a in answers] == [403, 403, 403]
    assert [b.status_code for b in bad] == [422, 422, 422]
    assert {b.json()["field"] for b in bad} == {"paused", "extra"}
    assert view["hooks"]["paused"] is False
