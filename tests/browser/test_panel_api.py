"""The HTTP routes the panel added: an event with its cause, one agent's stream paged back,
and which event types are inputs. No browser needed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.edge.server import Running
from tests.browser.live import (
    SCOPED,
    TIMEOUT,
    agent,
    http,
    live_gateway,
    panel_config,
    request,
    submit,
)


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Running]:
    db = tmp_path / "api.db"
    agents = [agent("alpha", (20, 40)), agent("bravo", (60_000, 60_000))]
    async with live_gateway(panel_config(db, agents, hooked=[]), db, feed=False) as running:
        yield running


async def wait_for_type(running: Running, stream: str, kind: str) -> int:
    """The position of the first event of that type in the stream, once it is committed."""
    async def find() -> int:
        async with contextlib.aclosing(running.service.engine.store.follow(0)) as events:
            async for record in events:
                if record.stream == stream and record.type == kind:
                    return record.position
        raise AssertionError(f"the log ended without a {kind} in {stream}")

    return await asyncio.wait_for(find(), TIMEOUT)


async def test_an_event_comes_with_the_input_that_caused_it_and_that_inputs_decisions(
    gateway: Running,
) -> None:
    await submit(gateway, request("bravo"))
    started = await wait_for_type(gateway, "bravo", "RunStarted")
    async with http(gateway) as client:
        answer = (await client.get(f"/api/events/{started}")).json()
    assert answer["event"]["type"] == "RunStarted"
    assert answer["input"]["type"] == "RequestReceived"
    assert answer["input"]["position"] < started
    assert [d["type"] for d in answer["decisions"]] == ["RequestQueued", "RunStarted"]
    assert answer["truncated"] is False
    async with http(gateway) as client:
        itself = (await client.get(f"/api/events/{answer['input']['position']}")).json()
    assert itself["input"] == itself["event"] == answer["input"]
    assert itself["decisions"] == answer["decisions"]


async def test_a_provider_gate_event_is_traced_to_its_gate_input(gateway: Running) -> None:
    await submit(gateway, request("bravo"))
    granted = await wait_for_type(gateway, "provider:sim-llm", "SlotGranted")
    async with http(gateway) as client:
        answer = (await client.get(f"/api/events/{granted}")).json()
    assert answer["input"]["type"] == "SlotRequested"
    assert answer["input"]["stream"] == "provider:sim-llm"
    assert "SlotGranted" in [d["type"] for d in answer["decisions"]]


async def test_an_event_outside_the_log_or_the_scope_is_not_found(gateway: Running) -> None:
    ack = await submit(gateway, request("bravo"))
    async with http(gateway) as client:
        missing = await client.get("/api/events/999999")
        assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    async with http(gateway, SCOPED) as scoped:
        hidden = await scoped.get(f"/api/events/{ack['position']}")
        assert hidden.status_code == 404
        assert (await scoped.get("/api/agents/bravo/events")).status_code == 403


async def test_an_agents_stream_is_read_newest_last_and_paged_back_by_version(
    gateway: Running,
) -> None:
    for _ in range(6):
        await submit(gateway, request("bravo"))
    async with http(gateway) as client:
        whole = (await client.get("/api/agents/bravo/events", params={"limit": 2000})).json()
        versions = [e["version"] for e in whole["events"]]
        assert versions == list(range(1, len(versions) + 1)) and not whole["more"]
        assert {e["stream"] for e in whole["events"]} == {"bravo"}
        tail = (await client.get("/api/agents/bravo/events", params={"limit": 5})).json()
        assert tail["events"] == whole["events"][-5:] and tail["more"]
        before = (await client.get("/api/agents/bravo/events", params={
            "limit": 5, "beforeVersion": tail["events"][0]["version"]})).json()
        assert before["events"] == whole["events"][-10:-5]
        bad = await client.get("/api/agents/bravo/events", params={"limit": "x"})
        assert bad.status_code == 422 and bad.json()["field"] == "limit"


async def test_event_types_say_which_are_inputs(gateway: Running) -> None:
    async with http(gateway) as client:
        types = (await client.get("/api/event-types")).json()
    assert "RequestReceived" in types["agent"]["inputs"]
    assert "RunAborted" in types["agent"]["decisions"]
    assert "SlotRequested" in types["provider"]["inputs"]
    assert "SlotGranted" in types["provider"]["decisions"]
    assert not set(types["agent"]["inputs"]) & set(types["agent"]["decisions"])
