"""A request the edge parsed from JSON text (a WebSocket frame, an HTTP body, a request
another process of a cluster passed on) is known to read back from the log by construction
(the property test ``test_every_request_parsed_from_a_frame_is_known_to_read_back_and_does``
of ``tests/lanes/test_repeatable.py``): the log's doorway does not look at it again. One
built in Python (by a caller, by a hook rule) is looked at, as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

import lanes.repeatable as repeatable
from gateway.cluster.peers import SECRET_HEADER
from gateway.market.hooks import HookEngine, PriceCrossRule
from lanes import AgentRequest, parse_request
from store import MemoryEventStore
from tests.e2e.live import Live, receive, receive_until, running
from tests.e2e.test_service import AGENTS, control, trigger
from tests.gateway.support import ManualReasoner

SECRET = "cluster-secret-1234"


@pytest.fixture
async def live() -> AsyncIterator[Live]:
    reasoner = ManualReasoner()
    rules = HookEngine([PriceCrossRule(name="btc_65k", symbol="BTCUSD", level=65_000,
                                       agents=("btc",))])
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner,
                       cluster_secret=SECRET, hooks=rules) as gateway:
        yield gateway


@pytest.fixture
def looked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the requests the doorway looked at (`lanes.repeatable.request_reads_back`)."""
    seen: list[str] = []
    real = repeatable.request_reads_back

    def spy(request: AgentRequest) -> bool:
        seen.append(request.request_id)
        return real(request)

    monkeypatch.setattr(repeatable, "request_reads_back", spy)
    return seen


async def test_what_the_edge_parsed_is_not_looked_at_again(live: Live, looked: list[str]
                                                            ) -> None:
    async with live.socket("feed", "feed-secret") as feed, live.socket() as ops:
        one = trigger("btc")
        await feed.send(json.dumps({"type": "submit", "id": "one", "request": one}))
        assert (await receive(feed))["decision"] == "accepted"
        many = [trigger(agent) for agent in ("btc", "eth", "news")]
        await feed.send(json.dumps({"type": "submit_many", "id": "many", "requests": many}))
        answer = await receive(feed)
        assert [r["decision"] for r in answer["results"]] == ["accepted"] * 3
        on_ops = trigger("eth")
        await ops.send(json.dumps({"type": "submit", "id": "ops", "request": on_ops}))
        assert (await receive_until(ops, lambda f: f.get("id") == "ops"))[-1]["type"] == "ack"
        stop = control("news", "emergency_stop")
        await ops.send(json.dumps({"type": "submit", "id": "stop", "request": stop}))
        acked = (await receive_until(ops, lambda f: f.get("id") == "stop"))[-1]
        assert acked["decision"] == "accepted"
    body = trigger("btc")
    forwarded = trigger("eth")  # (as another process of a cluster passes a request on)
    async with live.client() as http:
        posted = await http.post("/api/agents/btc/requests", json=body)
        assert posted.status_code == 200, posted.text
        assert posted.json()["decision"] == "accepted"
        passed_on = await http.post("/internal/submit", headers={SECRET_HEADER: SECRET},
                                    json={"principal": "feed", "requests": [forwarded]})
        assert passed_on.status_code == 200, passed_on.text
        assert passed_on.json()["results"][0]["decision"] == "accepted"

    assert looked == []


async def test_a_request_built_in_python_is_still_looked_at(live: Live, looked: list[str]
                                                            ) -> None:
    request = parse_request(trigger("btc"))

    ack = await live.engine.submit(request)

    assert ack.decision == "accepted"
    assert looked == [request.request_id]


async def test_what_a_hook_rule_made_of_a_market_frame_is_still_looked_at(
        live: Live, looked: list[str]) -> None:
    now = datetime.now(UTC).isoformat()
    ticks = [{"type": "tick", "symbol": "BTCUSD", "price": price, "at": now}
             for price in (64_000.0, 66_000.0)]
    async with live.socket("feed", "feed-secret") as feed:
        await feed.send(json.dumps({"type": "market", "id": "m1", "events": ticks}))
        answer = await receive(feed)

    assert answer["type"] == "market_ack", answer
    [triggered] = answer["triggered"]
    assert triggered["decision"] == "accepted"
    assert looked == [triggered["requestId"]]  # (built in Python by the rule: not parsed)
