"""Each way a user once made the gateway store what it could not read back, or answer
``internal``, or trust what it should not, tried again through the public protocol: every
one is now a typed refusal that stores nothing and touches no run and no other agent."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from lanes import AgentConfig, Mode
from lanes.events import RequestReceived
from store import SqliteEventStore
from tests.e2e.live import TIMEOUT, Live, receive, running
from tests.faults.test_held_controls import Refusing
from tests.gateway.support import ManualReasoner
from tests.security.server import trigger

AGENTS = {"btc": AgentConfig(mode=Mode.FOLLOWUP), "eth": AgentConfig(mode=Mode.FOLLOWUP)}


def nested(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[tuple[Live, ManualReasoner]]:
    reasoner = ManualReasoner()
    async with running(SqliteEventStore(tmp_path / "log.db"), AGENTS,
                       lambda _: reasoner) as gateway:
        async with gateway.client() as http:  # served: the engine has started
            assert (await http.get("/healthz")).status_code == 200
        yield gateway, reasoner


async def answer(ws: ClientConnection, raw: str | bytes) -> dict[str, Any]:
    """The answer to one frame (events and heartbeats of subscriptions skipped)."""
    await ws.send(raw)
    while True:
        frame = await receive(ws)
        if frame["type"] not in ("event", "events", "heartbeat"):
            return frame


async def received(live: Live) -> list[str]:
    """The request ids in the log, in order."""
    await live.engine.flush()
    return [e.event.request.request_id for e in live.engine.reader.entries(
        await live.engine.store.read()) if isinstance(e.event, RequestReceived)]


def submit(request_json: str, frame_id: str = "f") -> str:
    return f'{{"type":"submit","id":"{frame_id}","request":{request_json}}}'


def request_json(**overrides: str) -> str:
    """A valid request's JSON text with some members replaced by raw JSON text."""
    fields = {k: json.dumps(v) for k, v in trigger("btc").items()}
    fields.update(overrides)
    return "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"


# 1 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("payload", "code", "field"), [
    (nested(190), "invalid", "request.payload"),  # a 1.3 kB frame the decoder could not read
    (nested(300), "malformed_json", None),  # past the 200 levels any frame may nest
    ('{"note":"\\ud800"}', "malformed_json", None),  # a lone UTF-16 surrogate
])
async def test_a_poisoned_payload_is_refused_and_no_run_or_neighbour_is_touched(
        live: tuple[Live, ManualReasoner], payload: str, code: str, field: str | None) -> None:
    gateway, reasoner = live
    async with gateway.socket() as ws:
        first = await answer(ws, json.dumps({"type": "submit", "request": trigger("btc")}))
        assert first["decision"] == "accepted"
        run = await reasoner.started()
        before = await received(gateway)
        refused = await answer(ws, submit(request_json(payload=payload)))
        assert (refused["type"], refused["code"], refused.get("field")) == ("error", code, field)
        if code == "invalid":
            assert "nested deeper than 32 levels" in refused["message"]
        neighbour = await answer(ws, json.dumps({"type": "submit", "request": trigger("eth")}))
        assert neighbour["decision"] == "accepted"
    assert await received(gateway) == [*before, neighbour["requestId"]]
    assert run.run_id not in reasoner.cancelled
    assert gateway.engine.state("btc").active is not None  # the run goes on


# 2 -----------------------------------------------------------------------------------


async def test_a_user_control_without_payload_is_refused_on_websocket_and_http(
        live: tuple[Live, ManualReasoner]) -> None:
    gateway, _ = live
    request = trigger("btc", "user_control")
    async with gateway.socket() as ws:
        refused = await answer(ws, json.dumps({"type": "submit", "request": request}))
    assert (refused["code"], refused["field"]) == ("invalid", "request.payload")
    assert "needs an 'action'" in refused["message"]
    async with gateway.client() as http:
        response = await http.post("/api/agents/btc/requests", json=request)
    assert response.status_code == 422
    assert (response.json()["code"], response.json()["field"]) == ("invalid", "payload")
    assert request["requestId"] not in await received(gateway)


# 3 -----------------------------------------------------------------------------------


async def test_a_subscribe_listing_more_ids_than_agents_is_refused(
        live: tuple[Live, ManualReasoner]) -> None:
    gateway, _ = live
    async with gateway.socket() as ws:
        flood = json.dumps({"type": "subscribe", "id": "s", "agents": ["btc"] * 140_000})
        assert len(flood) > 950_000  # under the 1 MiB frame limit
        refused = await answer(ws, flood)
        assert (refused["code"], refused["field"]) == ("invalid", "agents")
        refused = await answer(ws, json.dumps({"type": "subscribe", "agents": ["btc", "eth",
                                                                               "x"]}))
        assert (refused["code"], refused["field"]) == ("invalid", "agents")
        snapshot = await answer(ws, json.dumps({"type": "subscribe",
                                                "agents": ["btc"] * 5_000}))
        assert [a["agentId"] for a in snapshot["agents"]] == ["btc"]  # each id once


# 5 -----------------------------------------------------------------------------------


async def test_a_lone_surrogate_in_a_frame_id_is_an_error_frame_not_a_dropped_connection(
        live: tuple[Live, ManualReasoner]) -> None:
    gateway, _ = live
    async with gateway.socket() as ws:
        refused = await answer(ws, '{"type":"ping","id":"\\ud800"}')
        assert (refused["type"], refused["code"]) == ("error", "malformed_json")
        assert "id" not in refused
        assert (await answer(ws, '{"type":"ping","id":"p"}'))["type"] == "pong"


# 6 -----------------------------------------------------------------------------------


async def test_integers_past_64_bits_are_refused_not_a_500(
        live: tuple[Live, ManualReasoner]) -> None:
    gateway, _ = live
    huge = str(2**64)
    async with gateway.client("viewer-secret") as http:
        for path, status in ((f"/api/events?after={huge}", 422),
                             (f"/api/events/{huge}", 404),
                             (f"/api/agents/btc/events?beforeVersion={huge}", 422),
                             (f"/api/replay?agent=btc&position={huge}", 422)):
            response = await http.get(path)
            assert response.status_code == status, (path, response.text)
    async with gateway.socket("control", "viewer-secret") as ws:
        refused = await answer(ws, json.dumps({"type": "subscribe", "after": 2**63}))
        assert (refused["code"], refused["field"]) == ("invalid", "after")
        assert (await answer(ws, '{"type":"ping"}'))["type"] == "pong"


# 7 -----------------------------------------------------------------------------------


async def test_a_held_http_control_is_answered_with_the_request_id_it_was_given() -> None:
    store = Refusing(refusing=True)
    async with running(store, AGENTS, lambda _: ManualReasoner()) as gateway:  # type: ignore[arg-type]
        async with gateway.client() as http:
            held = await http.post("/api/agents/btc/control",
                                   json={"action": "emergency_stop"})
            assert held.status_code == 503
            request_id = held.json()["requestId"]
            assert request_id.startswith("ctl_") and "holds it" in held.json()["message"]
            store.refusing = False
            await gateway.engine.flush()
            retry = await http.post("/api/agents/btc/control",
                                    json={"action": "emergency_stop", "requestId": request_id})
        assert retry.status_code == 200, retry.text
        assert (retry.json()["requestId"], retry.json()["repeated"]) == (request_id, True)
        assert gateway.engine.state("btc").trading.value == "HALTED"


# 8 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "code", "field"), [
    (submit(request_json(kind='"user_control"', payload='{"message":"hi","action":null}')),
     "invalid", "request.payload"),
    (submit(request_json(payload='{"x":NaN}')), "malformed_json", None),
    (submit(request_json(payload='{"x":Infinity}')), "malformed_json", None),
    (submit(request_json(payload='{"x":1e400}')), "invalid", "request.payload"),
    (submit(request_json(createdAt="1e-400")), "invalid", "request.createdAt"),
    (submit(request_json(createdAt='"1969-12-31T23:59:59Z"')), "invalid", "request.createdAt"),
    (submit(request_json(payload='{"n":' + str(2**64) + "}")), "invalid", "request.payload"),
    (submit(request_json(payload='{"note":"caf\xe9"}')).encode("latin-1"), "malformed_json",
     None),  # a binary frame that is not UTF-8
])
async def test_values_json_cannot_carry_back_are_refused_typed(
        live: tuple[Live, ManualReasoner], raw: str | bytes, code: str,
        field: str | None) -> None:
    gateway, _ = live
    before = await received(gateway)
    async with gateway.socket() as ws:
        refused = await answer(ws, raw)
    assert (refused["type"], refused["code"], refused.get("field")) == ("error", code, field)
    assert await received(gateway) == before


async def test_a_config_past_the_ranges_time_can_hold_is_refused(
        live: tuple[Live, ManualReasoner]) -> None:
    gateway, _ = live
    async with gateway.client("admin-secret") as http:
        response = await http.post("/api/agents/btc/config", content=b'{"debounceMs":1e29}',
                                   headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert (response.json()["code"], response.json()["field"]) == ("invalid", "debounceMs")


# 10 ----------------------------------------------------------------------------------


async def test_a_dns_rebinding_page_is_refused_although_origin_and_host_agree(
        live: tuple[Live, ManualReasoner]) -> None:
    gateway, _ = live
    port = gateway.http.rsplit(":", 1)[1]
    rebound = f"rebind.example:{port}"
    with socket.create_connection(("127.0.0.1", int(port)), timeout=TIMEOUT) as sock, \
            pytest.raises(InvalidStatus) as refused:
        # The page's own name resolves to this gateway: both headers say rebind.example.
        async with connect(f"ws://{rebound}/ws/control", sock=sock, open_timeout=TIMEOUT,
                           origin=Origin(f"http://{rebound}"),
                           additional_headers={"Authorization": "Bearer admin-secret"}):
            pass
    assert refused.value.response.status_code == 403
    async with gateway.client("admin-secret") as http:
        response = await http.post("/api/agents/btc/control", json={"action": "pause"},
                                   headers={"Origin": f"http://{rebound}", "Host": rebound})
        assert (response.status_code, response.json()["code"]) == (403, "forbidden")
        own = await http.post("/api/agents/btc/control", json={"action": "pause"},
                              headers={"Origin": gateway.http})
        assert own.status_code == 200, own.text


# Bounded work per frame --------------------------------------------------------------


async def test_a_big_batch_is_validated_in_steps_and_names_the_bad_item(
        live: tuple[Live, ManualReasoner]) -> None:
    gateway, _ = live
    before = await received(gateway)
    requests = [trigger("btc") for _ in range(150)]
    requests[120]["kind"] = "nonsense"
    ticks = [{"type": "tick", "symbol": "BTCUSD", "price": 100.0 + n,
              "at": "2026-02-17T03:10:00Z"} for n in range(150)]
    ticks[130]["price"] = -1
    async with gateway.socket("feed", "feed-secret") as ws:
        refused = await answer(ws, json.dumps({"type": "submit_many", "requests": requests}))
        assert (refused["code"], refused["field"]) == ("invalid", "requests.120.kind")
        refused = await answer(ws, json.dumps({"type": "market", "events": ticks}))
        assert refused["code"] == "invalid" and refused["field"].startswith("events.130.")
        requests[120]["kind"] = "hook_trigger"
        acks = await answer(ws, json.dumps({"type": "submit_many", "requests": requests}))
        assert [a["decision"] for a in acks["results"]] == ["accepted"] * 150
    assert await received(gateway) == [*before, *(r["requestId"] for r in requests)]
