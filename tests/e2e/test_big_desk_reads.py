"""A big desk's reads (a subscribe's snapshot, the agent list) are rendered a step at a time
and a long WebSocket message goes out in fragments: what a client gets is unchanged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from enum import Enum
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from gateway.edge.protocol import Snapshot
from gateway.edge.server import FRAGMENT_CHARS
from gateway.edge.views import _camel, agent_summary
from lanes import AgentConfig, Mode, status
from store import MemoryEventStore
from tests.e2e.live import Live, running
from tests.gateway.support import ManualReasoner

AGENTS = {f"agent{n:03}": AgentConfig(mode=Mode.FOLLOWUP, cap=50) for n in range(250)}


@pytest.fixture
async def live() -> AsyncIterator[Live]:
    reasoner = ManualReasoner()
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner) as gateway:
        yield gateway


def _reference(value: Any) -> Any:  # the way before: asdict, then keys camelCased
    if isinstance(value, dict):
        return {to_camel(k): _reference(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_reference(v) for v in value]
    return value.value if isinstance(value, Enum) else value


async def test_a_status_is_camelcased_as_asdict_gave_it(live: Live) -> None:
    now = live.engine.clock.now_ms()
    for agent_id in AGENTS:
        view = status(live.engine.state(agent_id), now)
        assert _camel(view) == _reference(asdict(view))


async def test_a_long_snapshot_arrives_whole_as_the_model_encodes_it(live: Live) -> None:
    async with live.socket() as ws:
        await ws.send(json.dumps({"type": "subscribe", "id": "s", "providers": True}))
        raw = await ws.recv()
    assert isinstance(raw, str) and len(raw) > 2 * FRAGMENT_CHARS  # it went in fragments
    frame = json.loads(raw)
    assert frame["type"] == "snapshot" and frame["id"] == "s"
    assert [a["agentId"] for a in frame["agents"]] == list(AGENTS)
    now = live.engine.clock.now_ms()
    model = Snapshot(id="s", position=frame["position"], providers=frame["providers"],
                     agents=[agent_summary(live.engine.state(a), now) for a in AGENTS])
    assert json.loads(model.model_dump_json(exclude_none=True)).keys() == frame.keys()


async def test_the_agent_list_names_every_agent_in_order(live: Live) -> None:
    async with live.client() as http:
        answer = await http.get("/api/agents")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert [a["agentId"] for a in answer.json()] == list(AGENTS)

