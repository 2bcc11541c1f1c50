"""The real wiring from a config: market frames fire hooks, runs trade, the paper broker
fills, every step lands in the log, and no secret ever does."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
from websockets.asyncio.client import connect

from gateway.config import parse_config
from gateway.edge.server import serving
from gateway.wiring import build_service
from lanes import verify
from store import SqliteEventStore
from tests.e2e.live import TIMEOUT, receive, receive_until
from tests.gateway.support import log_of, next_event, request

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


GATED = CONFIG.replace('''[[agents]]
id = "desk"''', '''[[tokens]]
name = "watcher"
token = "viewer-token-secret-9012"
role = "viewer"

[[tokens]]
name = "desk-only"
token = "scoped-token-secret-3456"
role = "control"
agents = ["desk"]

[[tokens]]
name = "desk-admin"
token = "scoped-admin-secret-7890"
role = "admin"
agents = ["desk"]

[[providers]]
name = "sim"
kind = "simulated"
[providers.limits]
requests_per_minute = 30
max_concurrent = 1

[[agents]]
id = "desk"''').replace("steerable = false", 'steerable = false\nprovider = "sim"')


async def test_the_provider_gate_is_visible_over_http_metrics_and_the_status_stream(
    tmp_path: Path,
) -> None:
    service = build_service(parse_config(GATED), tmp_path / "events.db")
    admin = {"Authorization": "Bearer admin-token-secret-5678"}
    viewer = {"Authorization": "Bearer viewer-token-secret-9012"}
    scoped = {"Authorization": "Bearer scoped-token-secret-3456"}
    async with serving(service) as running, httpx2.AsyncClient(
        base_url=running.url, timeout=TIMEOUT
    ) as http:
        ws_url = running.url.replace("http", "ws") + "/ws/control"
        async with connect(ws_url, additional_headers=admin, open_timeout=TIMEOUT) as ws:
            assert (await receive(ws))["type"] == "hello"
            await ws.send(json.dumps({"type": "subscribe", "id": "s", "providers": True}))
            snapshot = await receive(ws)
            assert snapshot["type"] == "snapshot"
            [gate] = snapshot["providers"]
            assert gate["name"] == "sim" and gate["limits"]["requestsPerMinute"] == 30
            trigger = {"requestId": "g1", "createdAt": datetime.now(UTC).isoformat(),
                       "agentId": "desk", "kind": "hook_trigger"}
            posted = await http.post("/api/agents/desk/requests", json=trigger, headers=admin)
            assert posted.status_code == 200, posted.text
            granted = await receive_until(ws, lambda f: f.get("eventType") == "SlotGranted")
            assert granted[-1]["stream"] == "provider:sim"
        await next_event(service.engine.store, "RunCompleted")

        listed = (await http.get("/api/providers", headers=viewer)).json()["providers"]
        assert listed[0]["counters"]["granted"] >= 1
        assert listed[0]["windowRequests"] >= 1
        assert {"breaker", "nextRetry", "waitingAgents", "inFlight"} <= set(listed[0])
        assert (await http.get("/api/providers/ghost", headers=viewer)).status_code == 404
        metrics = (await http.get("/metrics", headers=viewer)).text
        assert 'gateway_provider_granted_total{provider="sim"}' in metrics
        assert 'gateway_provider_requests_per_minute_limit{provider="sim"} 30' in metrics
        # the breaker's state as a label, one of them 1; the process and the build
        states = re.findall(r'gateway_provider_breaker_state\{provider="sim",state="(\w+)"\} '
                            r"(\d)", metrics)
        assert sorted(states) == [("closed", "1"), ("half_open", "0"), ("open", "0")]
        assert re.search(r'gateway_build_info\{version="[^"]+",python="3\.', metrics)
        for family in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                       "process_open_fds", "process_start_time_seconds"):
            assert re.search(rf"^{family} [0-9.]+$", metrics, re.M), family

        body = {"requestsPerMinute": 120, "maxConcurrent": 2}
        refused = await http.post("/api/providers/sim/limits", json=body, headers=viewer)
        assert refused.status_code == 403
        bad = await http.post("/api/providers/sim/limits", json={"requestsPerMinute": 0},
                              headers=admin)
        assert bad.status_code == 422 and bad.json()["field"] == "requestsPerMinute"
        scoped_admin = {"Authorization": "Bearer scoped-admin-secret-7890"}
        refused = await http.post("/api/providers/sim/limits", json=body, headers=scoped_admin)
        assert refused.status_code == 403  # the gate is shared by agents outside its scope
        short = await http.post("/api/providers/sim/limits", json={"leaseMs": 1_000},
                                headers=admin)
        assert short.status_code == 422 and short.json()["field"] == "leaseMs"
        changed = await http.post("/api/providers/sim/limits", json=body, headers=admin)
        assert changed.status_code == 200 and changed.json()["changed"] is True
        now = (await http.get("/api/providers/sim", headers=viewer)).json()
        assert now["limits"]["requestsPerMinute"] == 120
        assert now["limits"]["leaseMs"] == 180_000  # keys not given keep their value
        long_run = await http.post("/api/agents/desk/config", headers=admin,
                                   json={"mode": "followup", "runTimeoutMs": 600_000})
        assert long_run.status_code == 422 and long_run.json()["field"] == "runTimeoutMs"
        async with connect(ws_url, additional_headers=scoped, open_timeout=TIMEOUT) as ws:
            assert (await receive(ws))["type"] == "hello"
            await ws.send(json.dumps({"type": "subscribe", "id": "s", "providers": True}))
            error = await receive(ws)
            assert (error["type"], error["code"]) == ("error", "forbidden")
    store = SqliteEventStore(tmp_path / "events.db")
    await store.open()
    kinds = [r.type for r in await store.read_stream("provider:sim")]
    await store.close()
    assert kinds.count("GateLimitsApplied") == 2  # the configured limits, then the new ones


SPENDING = """
[[providers]]
name = "sim"
kind = "simulated"
[providers.prices]
input_per_million = 3.0
output_per_million = 15.0

[[agents]]
id = "desk"
mode = "followup"
[agents.budgets]
max_spend_per_hour = 0.004
alert_at = [0.5]
[agents.reasoner]
latency_ms = [1, 2]
trade_probability = 0.0
provider = "sim"
"""


async def test_runs_cost_what_their_provider_charges_and_a_spend_budget_holds_them_back(
    tmp_path: Path,
) -> None:
    service = build_service(parse_config(SPENDING), tmp_path / "events.db")
    engine = service.engine
    await engine.start()
    try:
        for n in range(3):
            await engine.submit(request("desk", dedupeKey=f"spend-{n}"))
        alert = await next_event(engine.store, "BudgetAlert")
        suppressed = await next_event(engine.store, "RunsSuppressed")
        completed = [json.loads(r.data) for r in await engine.store.read_stream("desk")
                     if r.type == "RunCompleted"]
    finally:
        await engine.stop()
    # a simulated run of one request: 520 input and 120 output tokens, at 3 and 15 a million
    assert completed[0]["usage"]["cost"] == 520 * 3 / 1e6 + 120 * 15 / 1e6
    assert json.loads(alert.data)["budget"] == "max_spend_per_hour"
    held = json.loads(suppressed.data)
    assert held["reason"] == "spend" and "max_spend_per_hour" in held["detail"]
    assert len(completed) == 2  # 0.00336 a run: after two the third waits for the hour
