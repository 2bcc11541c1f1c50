"""The real wiring from a config: market frames fire hooks, runs trade, the paper broker
fills, every step lands in the log, and no secret ever does."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from websockets.asyncio.client import connect

from gateway.config import parse_config
from gateway.server import build_service, serving
from lanes import verify
from store import SqliteEventStore
from tests.e2e.live import TIMEOUT, receive
from tests.gateway.support import log_of, next_event

CONFIG = """
[[tokens]]
name = "feeder"
token = "feed-token-secret-1234"
role = "feed"

[[tokens]]
name = "boss"
token = "admin-token-secret-5678"
role = "admin"

[[agents]]
id = "desk"
mode = "followup"
[agents.reasoner]
latency_ms = [5, 10]
trade_probability = 1.0
steerable = false

[[hooks]]
kind = "price_cross"
name = "btc_100"
symbol = "BTCUSD"
level = 100.0
direction = "up"
agents = ["desk"]
"""


def tick(price: float, seconds: int) -> dict[str, object]:
    at = datetime(2026, 2, 17, 3, 10, tzinfo=UTC) + timedelta(seconds=seconds)
    return {"type": "tick", "symbol": "BTCUSD", "price": price, "at": at.isoformat()}


async def test_a_price_cross_runs_the_agent_and_its_order_is_filled_by_the_paper_broker(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    service = build_service(parse_config(CONFIG), db)
    async with serving(service) as running:
        ws_url = running.url.replace("http", "ws") + "/ws/feed"
        headers = {"Authorization": "Bearer feed-token-secret-1234"}
        async with connect(ws_url, additional_headers=headers, open_timeout=TIMEOUT) as ws:
            assert (await receive(ws))["type"] == "hello"
            frame = {"type": "market", "id": "m1", "events": [tick(99.0, 0), tick(101.0, 1)]}
            await ws.send(json.dumps(frame))
            answer = await receive(ws)
            assert answer["type"] == "market_ack" and answer["events"] == 2
            [triggered] = answer["triggered"]
            assert triggered["decision"] == "accepted"
            await ws.send(json.dumps(frame))  # the same frame again: deduped, nothing new
            again = await receive(ws)
            assert [t["decision"] for t in again["triggered"]] == ["accepted"]
            assert again["triggered"][0]["repeated"]
        filled = await next_event(service.engine.store, "OrderFilled")
        assert json.loads(filled.data)["price"] == 101.0
        await next_event(service.engine.store, "OrderClosed")
    store = SqliteEventStore(db)
    await store.open()
    log = await log_of(store)
    await store.close()
    assert verify(log) is None
    kinds = [type(e.event).__name__ for e in log]
    for expected in ("RequestReceived", "RunStarted", "RunCompleted", "OrderAccepted",
                     "BrokerReport", "OrderFilled", "OrderClosed"):
        assert expected in kinds
    received = next(e.event for e in log if type(e.event).__name__ == "RequestReceived")
    assert received.principal == "feeder"  # type: ignore[union-attr]
    raw = db.read_bytes() + (tmp_path / "events.db-wal").read_bytes() \
        if (tmp_path / "events.db-wal").exists() else db.read_bytes()
    assert b"token-secret" not in raw
