"""A big desk's reads (a subscribe's snapshot, the agent list) are rendered a step at a time
and a long WebSocket message goes out in fragments: what a client gets is unchanged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from enum import Enum
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from gateway.edge import server
from gateway.edge.protocol import Snapshot
from gateway.edge.server import FRAGMENT_CHARS, WebSocketProtocol, _fragments
from gateway.edge.views import _camel, agent_summary, json_pieces, model_json
from lanes import AgentConfig, Mode, status
from store import MemoryEventStore
from tests.e2e.live import Live, running
from tests.gateway.support import ManualReasoner

AGENTS = {f"agent{n:03}": AgentConfig(mode=Mode.FOLLOWUP, cap=50) for n in range(250)}


@pytest.fixture(params=["websockets-sansio", WebSocketProtocol], ids=["uvicorn", "gateway"])
async def live(request: pytest.FixtureRequest) -> AsyncIterator[Live]:
    """A desk served by uvicorn's WebSocket protocol (a snapshot's pieces joined) and by the
    gateway's (sent as fragments as they are encoded)."""
    reasoner = ManualReasoner()
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner,
                       ws=request.param) as gateway:
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


async def test_a_long_snapshot_arrives_whole_as_the_model_encodes_it(
        live: Live, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    sent: list[list[str]] = []

    def fragments(pieces: list[str], size: int = FRAGMENT_CHARS) -> Iterator[str]:
        sent.append(list(pieces))
        return _fragments(sent[-1], size)

    monkeypatch.setattr(server, "_fragments", fragments)
    async with live.socket() as ws:
        await ws.send(json.dumps({"type": "subscribe", "id": "s", "providers": True}))
        raw = await ws.recv()
    assert isinstance(raw, str) and len(raw) > 2 * FRAGMENT_CHARS  # it went in fragments
    if request.node.callspec.params["live"] is WebSocketProtocol:  # pieces, never joined
        assert len(sent) == 1 and len(sent[0]) > 5 and "".join(sent[0]) == raw
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



@pytest.mark.parametrize("sizes", [[], [0], [5], [3, 0, 9, 1], [4] * 7, [17], [2, 30, 2]])
def test_fragments_hold_the_pieces_text_in_bounded_parts(sizes: list[int]) -> None:
    pieces = ["".join(chr(0x41 + (n + k) % 26) for k in range(size))
              for n, size in enumerate(sizes)]
    parts = list(_fragments(pieces, size=4))
    assert "".join(parts) == "".join(pieces)
    assert all(len(p) == 4 for p in parts[:-1])
    assert all(0 < len(p) <= 4 for p in parts[-1:])


@pytest.mark.parametrize("count", [0, 1, 49, 50, 51, 120])
async def test_json_pieces_join_to_the_list_encoded_at_once(count: int) -> None:
    items = [{"n": n, "name": f"agent{n}", "ü": [n, None]} for n in range(count)]
    pieces = [p async for p in json_pieces(items, lambda i: i, model_json, step=50,
                                           budget_s=None)]
    assert "".join(pieces) == model_json(items)
    assert len(pieces) == -(-count // 50) + 1  # a piece a step, and the end


@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 20])
async def test_json_pieces_end_a_step_once_its_time_budget_is_spent(count: int) -> None:
    # Each reading of the clock moves it on 0.4 ms: a step of a 1 ms budget renders 3
    # items (read at 0.4, 0.8, 1.2 ms), however many its count would allow.
    ticks = iter(range(10_000))
    items = [{"n": n} for n in range(count)]
    pieces = [p async for p in json_pieces(items, lambda i: i, model_json, step=20,
                                           budget_s=0.001, clock=lambda: next(ticks) * 0.0004)]
    assert "".join(pieces) == model_json(items)
    assert len(pieces) == -(-count // 3) + 1
