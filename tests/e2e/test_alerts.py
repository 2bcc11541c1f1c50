"""Alerts: raised from the log as it is committed (a halt, a refused order, an order waiting
for approval) and from the feed (a connector down, a symbol gone quiet), kept for the panel
(GET /api/alerts, from the log: it survives a restart), and POSTed to a webhook signed with
HMAC-SHA256; a receiver that fails, hangs and recovers gets every alert once it recovers,
one that never does counts dead letters, and neither holds the control lane."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.base.clock import FakeClock
from gateway.config.alerts import AlertsConfig
from gateway.edge import alerting
from gateway.edge.alerting import Alerter
from gateway.market.events import ConnectorStatus
from gateway.market.health import FeedHealth
from lanes import AgentConfig, Mode
from store import SqliteEventStore
from tests.e2e.live import running
from tests.e2e.test_orders import Trader, control, trigger
from tests.gateway.support import TIMEOUT, next_event, until

SECRET = "whsec-test"


@dataclass
class Receiver:
    """A webhook target: answers each POST with the next of ``script`` (a status, or
    ``hang``), then 200; keeps what it got."""

    script: list[int | str]
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in lines[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            step = self.script.pop(0) if self.script else 200
            if step == "hang":
                await reader.read()  # (until the gateway gives up and hangs up)
                return
            if step == 200:
                self.got.append((headers, body))
            writer.write(f"HTTP/1.1 {step} X\r\ncontent-length: 0\r\nconnection: close"
                         "\r\n\r\n".encode())
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def receiving(script: list[int | str]) -> AsyncIterator[Receiver]:
    receiver = Receiver(script)
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    receiver.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    async with server:
        yield receiver


def webhook(url: str, **options: Any) -> AlertsConfig:
    """Alerts of every kind, to one webhook ``ops`` at ``url``."""
    return AlertsConfig.model_validate(
        {"webhooks": [{"name": "ops", "url": url, "secret_env": "HOOK", **options}]},
        context={"env": {"HOOK": SECRET}})


AGENTS = {"btc": AgentConfig(mode=Mode.FOLLOWUP), "eth": AgentConfig(mode=Mode.FOLLOWUP)}


async def test_alerts_reach_a_webhook_signed_after_it_fails_and_hangs_and_the_panels_list(
        tmp_path: Path) -> None:
    clock = FakeClock()
    async with receiving([500, "hang", 503]) as receiver:
        feed = FeedHealth()
        store = SqliteEventStore(tmp_path / "e.db")
        alerter = Alerter(store, feed, clock, webhook(receiver.url, timeout_ms=300,
                                                      max_attempts=5))
        async with running(store, AGENTS, Trader(), clock, feed=feed,
                           alerter=alerter) as live:
            await until(lambda: _started(live), "the engine")
            await alerter.start()
            stop = await live.engine.submit(control("btc", "emergency_stop"))
            assert stop.effect is not None and stop.effect.to_state.value == "HALTED"
            await live.engine.submit(control("eth", "pause"))  # REDUCING: a buy is refused
            await live.engine.submit(trigger("eth", {"symbol": "ETHUSD", "side": "buy",
                                                     "qty": 1}))
            await next_event(store, "OrderRejected")
            feed.observe(ConnectorStatus(connector="binance", status="down", at=datetime.now(
                UTC)), clock.now_ms())
            assert [a.kind for a in alerter.check_feed()] == ["connector"]
            assert alerter.check_feed() == []  # once, until it is up again

            async def three() -> bool:
                clock.advance(alerting.BACKOFF_MS)  # (a retry waits on the alerter's clock)
                return len(receiver.got) >= 3
            await until(three, "three alerts delivered", within_s=TIMEOUT)
            async with live.client("viewer-secret") as client:
                listed = (await client.get("/api/alerts")).json()["alerts"]
                halts = (await client.get("/api/alerts", params={"kind": "halt"})).json()
                bad = await client.get("/api/alerts", params={"kind": "nope"})
            async with live.client("scoped-secret") as client:
                scoped = (await client.get("/api/alerts")).json()["alerts"]
            await alerter.stop()
    sent = [json.loads(body) for _, body in receiver.got]
    assert [a["kind"] for a in sent] == ["halt", "order_rejected", "connector"]
    assert sent[0]["text"] == "btc HALTED (emergency_stop)" and sent[0]["agentId"] == "btc"
    for headers, body in receiver.got:
        expected = hmac.new(SECRET.encode(), headers["x-gateway-timestamp"].encode() + b"."
                            + body, hashlib.sha256).hexdigest()
        assert headers["x-gateway-signature"] == f"sha256={expected}"
    assert alerter.webhooks[0].outcomes["retried"] == 3  # 500, a hang, 503: then through
    assert alerter.webhooks[0].outcomes["dead"] == 0
    # (newest first; the feed's alert is on the test's fake clock, the log's on the store's)
    assert [a["kind"] for a in listed if a["kind"] != "connector"] == ["order_rejected",
                                                                        "halt"]
    assert len(listed) == 3
    assert [a["kind"] for a in halts["alerts"]] == ["halt"]
    assert bad.status_code == 422 and bad.json()["field"] == "kind"
    assert {a["agentId"] for a in scoped} == {"btc"}  # no feed alert for a scoped token
    assert sent[1]["agentId"] == "eth" and "REDUCING" in sent[1]["text"]


async def _started(live: Any) -> bool:
    return bool(live.engine.running)


async def test_a_webhook_that_never_answers_counts_dead_letters_and_holds_nothing(
        tmp_path: Path) -> None:
    clock = FakeClock()
    async with receiving([500] * 100) as receiver:
        feed = FeedHealth()
        store = SqliteEventStore(tmp_path / "e.db")
        alerter = Alerter(store, feed, clock, webhook(receiver.url, max_attempts=2, queue=1))
        async with running(store, AGENTS, Trader(), feed=feed, alerter=alerter) as live:
            await until(lambda: _started(live), "the engine")
            await alerter.start()
            for agent in ("btc", "eth"):
                ack = await live.engine.submit(control(agent, "emergency_stop"))
                assert ack.decision == "accepted"  # (never behind the webhook)

            async def dead() -> bool:
                clock.advance(alerting.BACKOFF_MS)  # (a retry waits on the alerter's clock)
                return alerter.webhooks[0].outcomes["dead"] == 2
            await until(dead, "two dead letters", within_s=TIMEOUT)
            async with live.client("viewer-secret") as client:
                metrics = (await client.get("/metrics")).text
            await alerter.stop()
    assert 'gateway_webhook_dead_letters_total{webhook="ops"} 2' in metrics
    assert 'gateway_alerts_total{kind="halt"} 2' in metrics
