"""Liveness on the wire: a subscription hears heartbeats while nothing else is sent, and a
control's ack says what it changed (or that it changed nothing)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest

from gateway.client import ControlClient
from lanes import AgentConfig, Mode
from store import MemoryEventStore
from tests.e2e.live import Live, receive, receive_until, running
from tests.e2e.test_service import control, trigger
from tests.gateway.support import ManualReasoner

AGENTS = {"btc": AgentConfig(mode=Mode.FOLLOWUP, cap=50),
          "eth": AgentConfig(mode=Mode.FOLLOWUP, cap=50)}
BEAT_S = 0.2


@pytest.fixture
def reasoner() -> ManualReasoner:
    return ManualReasoner()


@pytest.fixture
async def live(reasoner: ManualReasoner) -> AsyncIterator[Live]:
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner,
                       heartbeat_s=BEAT_S) as gateway:
        yield gateway


def is_beat(frame: dict[str, Any]) -> bool:
    return bool(frame["type"] == "heartbeat")


async def test_a_quiet_subscription_hears_heartbeats_with_the_committed_position(
    live: Live,
) -> None:
    async with live.socket(hello=False) as ws:
        hello = await receive(ws)
        assert hello["type"] == "hello" and hello["heartbeatMs"] == 200
        await ws.send(json.dumps({"type": "subscribe", "id": "s", "batch": True}))
        assert (await receive(ws))["type"] == "snapshot"
        first = await receive(ws)  # nothing happens on the desk: a heartbeat, soon
        assert set(first) == {"type", "committed", "at"}, first
        assert is_beat(first) and first["committed"] == await live.engine.store.last_position()
        datetime.fromisoformat(first["at"])
        async with live.client() as http:
            ack = (await http.post("/api/agents/btc/requests", json=trigger("btc"))).json()
        await receive_until(ws, lambda f: f["type"] == "events" and any(
            e["position"] == ack["position"] for e in f["events"]))
        later = (await receive_until(ws, is_beat))[-1]
        assert later["committed"] >= ack["position"] > first["committed"]


async def test_heartbeats_come_only_while_subscribed(live: Live) -> None:
    async with live.socket() as watcher, live.socket() as idle:
        await watcher.send(json.dumps({"type": "subscribe", "id": "s"}))
        assert (await receive(watcher))["type"] == "snapshot"
        for _ in range(3):  # three heartbeats' time on the clock of the subscribed one
            await receive_until(watcher, is_beat)
        await idle.send(json.dumps({"type": "ping", "id": "p"}))
        assert (await receive(idle))["type"] == "pong"  # no heartbeat queued before it
        await watcher.send(json.dumps({"type": "unsubscribe", "id": "u"}))
        await receive_until(watcher, lambda f: f.get("id") == "u")
        await idle.send(json.dumps({"type": "subscribe", "id": "s2"}))
        assert (await receive(idle))["type"] == "snapshot"
        for _ in range(3):
            await receive_until(idle, is_beat)
        await watcher.send(json.dumps({"type": "ping", "id": "p2"}))
        assert (await receive(watcher))["id"] == "p2"  # unsubscribed: no more heartbeats


async def test_a_gateway_without_heartbeats_says_so_in_its_hello(
    reasoner: ManualReasoner,
) -> None:
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner, heartbeat_s=0) as live, \
            live.socket(hello=False) as ws:
        hello = await receive(ws)
        assert hello["type"] == "hello" and hello["heartbeatMs"] is None


async def post_control(live: Live, agent: str, action: str) -> dict[str, Any]:
    async with live.client() as http:
        response = await http.post(f"/api/agents/{agent}/control",
                                   json={"action": action, "reason": "test"})
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


async def test_a_resume_of_an_active_agent_is_acked_as_changing_nothing(live: Live) -> None:
    ack = await post_control(live, "btc", "resume")
    assert ack["decision"] == "accepted"
    assert ack["effect"] == {"fromState": "ACTIVE", "toState": "ACTIVE", "changed": False,
                             "cancelsRequested": 0, "unheld": False, "callsCancelled": 0}
    await post_control(live, "btc", "pause")
    again = await post_control(live, "btc", "pause")
    assert again["effect"]["fromState"] == again["effect"]["toState"] == "REDUCING"
    assert again["effect"]["changed"] is False


async def test_a_stop_acks_the_run_it_aborted_and_a_resume_the_run_it_started(
    live: Live, reasoner: ManualReasoner,
) -> None:
    async with live.client() as http:
        await http.post("/api/agents/btc/requests", json=trigger("btc"))
    run = await reasoner.started()
    async with live.socket() as ws:  # the same effect on a WebSocket ack
        await ws.send(json.dumps({"type": "submit", "id": "stop",
                                  "request": control("btc", "emergency_stop")}))
        stop = await receive(ws)
    assert stop["effect"] == {"fromState": "ACTIVE", "toState": "HALTED", "changed": True,
                              "abortedRun": run.run_id, "cancelsRequested": 0,
                              "unheld": False, "callsCancelled": 0}
    async with live.client() as http:
        await http.post("/api/agents/btc/requests", json=trigger("btc"))
    resumed = await post_control(live, "btc", "resume")
    assert resumed["effect"]["toState"] == "ACTIVE" and resumed["effect"]["changed"]
    assert resumed["effect"]["startedRun"] == (await reasoner.started()).run_id
    async with live.client() as http:  # a repeat answers the first decision, no effect
        body = {**control("eth", "resume"), "requestId": "same"}
        first = (await http.post("/api/agents/eth/requests", json=body)).json()
        repeat = (await http.post("/api/agents/eth/requests", json=body)).json()
    assert first["effect"]["changed"] is False
    assert repeat["repeated"] is True and "effect" not in repeat


async def test_the_python_client_reads_on_through_heartbeats(live: Live) -> None:
    async with ControlClient(live.ws, "control-secret") as client, live.socket() as watcher, \
            client.subscribe(["btc"]) as events:
        assert events.snapshot is not None  # subscribed already
        await watcher.send(json.dumps({"type": "subscribe", "id": "s", "agents": ["btc"]}))
        for _ in range(3):  # the client's subscription was as quiet: it had them too
            await receive_until(watcher, is_beat)
        async with live.client() as http:
            ack = (await http.post("/api/agents/btc/requests", json=trigger("btc"))).json()
        async for event in events:
            if event.position == ack["position"]:
                break
