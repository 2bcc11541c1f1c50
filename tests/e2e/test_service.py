"""End to end: a real uvicorn on a loopback port, real websockets and HTTP clients."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from lanes import AgentConfig, Mode, replay, request_outcomes, verify
from lanes.events import AbortReason, RunAborted, TradingState
from store import MemoryEventStore, SqliteEventStore
from tests.e2e.live import Live, browser_protocols, receive, receive_until, running
from tests.gateway.support import ManualReasoner, log_of

AGENTS = {
    "btc": AgentConfig(mode=Mode.FOLLOWUP, cap=500),
    "eth": AgentConfig(mode=Mode.COLLECT, debounce_ms=50, cap=500),
    "news": AgentConfig(mode=Mode.STEER_BACKLOG, cap=500),
}
_n = iter(range(1_000_000))


def trigger(agent: str, key: str | None = None, kind: str = "hook_trigger",
            **fields: Any) -> dict[str, Any]:
    """A hook trigger on the wire."""
    n = next(_n)
    return {"requestId": f"w{n}", "createdAt": datetime.now(UTC).isoformat(), "agentId": agent,
            "kind": kind, "dedupeKey": key or f"k{n}", **fields}


def control(agent: str, action: str) -> dict[str, Any]:
    """A control request on the wire."""
    n = next(_n)
    return {"requestId": f"c{n}", "createdAt": datetime.now(UTC).isoformat(), "agentId": agent,
            "kind": "user_control", "priority": "high", "payload": {"action": action}}


@pytest.fixture
def reasoner() -> ManualReasoner:
    return ManualReasoner()


@pytest.fixture
async def live(reasoner: ManualReasoner) -> AsyncIterator[Live]:
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner) as gateway:
        yield gateway


async def test_feed_flood_with_an_emergency_stop_halts_the_agent_at_once(
    live: Live, reasoner: ManualReasoner
) -> None:
    async with live.socket("feed", "feed-secret") as feed, live.socket() as ops:
        await feed.send(json.dumps({"type": "submit", "id": "first",
                                    "request": trigger("btc")}))
        assert (await receive(feed))["decision"] == "accepted"
        run = await reasoner.started()
        assert run.agent_id == "btc"

        async def flood() -> int:
            acked = 0
            for frame in range(10):
                requests = [trigger(agent) for agent in ("btc", "eth", "news") * 10]
                await feed.send(json.dumps({"type": "submit_many", "id": f"f{frame}",
                                            "requests": requests}))
                answer = await receive(feed)
                assert answer["type"] == "acks", answer
                acked += sum(r.get("decision") == "accepted" for r in answer["results"])
            return acked

        flooding = asyncio.create_task(flood())
        await ops.send(json.dumps({"type": "submit", "id": "stop",
                                   "request": control("btc", "emergency_stop")}))
        stop = await receive(ops)
        assert stop["type"] == "ack" and stop["decision"] == "accepted"
        assert run.run_id in reasoner.cancelled  # aborted before the ack was sent
        assert live.engine.state("btc").trading is TradingState.HALTED
        assert await flooding == 300
        assert live.engine.state("btc").active is None  # nothing runs while HALTED

        await ops.send(json.dumps({"type": "submit", "request": control("btc", "resume")}))
        assert (await receive(ops))["decision"] == "accepted"
        assert (await reasoner.started()).agent_id in {"btc", "eth", "news"}
    await live.engine.flush()
    log = await log_of(live.engine.store)
    assert verify(log) is None
    assert any(isinstance(e.event, RunAborted) and e.event.reason is AbortReason.EMERGENCY_STOP
               for e in log)


async def test_a_subscriber_resumes_after_a_reconnect_without_gaps_or_duplicates(
    live: Live,
) -> None:
    seen: list[int] = []
    async with live.socket() as ws:
        await ws.send(json.dumps({"type": "subscribe", "id": "s", "agents": ["btc"],
                                  "after": 0}))
        snapshot = await receive(ws)
        assert snapshot["type"] == "snapshot"
        assert [a["agentId"] for a in snapshot["agents"]] == ["btc"]
        async with live.client() as http:
            for _ in range(3):
                response = await http.post("/api/agents/btc/requests", json=trigger("btc"))
                assert response.status_code == 200, response.text
        so_far = [r.position for r in await live.engine.store.read() if r.stream == "btc"]
        frames = await receive_until(ws, lambda f: f.get("position") == so_far[-1])
        seen += [f["position"] for f in frames if f["type"] == "event"]
        assert seen == so_far
    async with live.client() as http:  # while disconnected
        for _ in range(3):
            assert (await http.post("/api/agents/btc/requests",
                                    json=trigger("btc"))).status_code == 200
        await http.post("/api/agents/eth/requests", json=trigger("eth"))
    expected = [r.position for r in await live.engine.store.read() if r.stream == "btc"]
    async with live.socket() as ws:
        await ws.send(json.dumps({"type": "subscribe", "agents": ["btc"],
                                  "after": seen[-1]}))
        await receive(ws)  # snapshot
        frames = await receive_until(ws, lambda f: f.get("position") == expected[-1])
        seen += [f["position"] for f in frames if f["type"] == "event"]
    assert seen == expected
    assert len(seen) == len(set(seen))


async def test_a_batched_subscriber_gets_the_same_events_in_fewer_frames(live: Live) -> None:
    async with live.socket() as single, live.socket() as batched, \
            live.socket("feed", "feed-secret") as feed:
        for ws, batch in ((single, False), (batched, True)):
            await ws.send(json.dumps({"type": "subscribe", "agents": ["btc", "eth"],
                                      "after": 0, "batch": batch}))
            assert (await receive(ws))["type"] == "snapshot"
        await feed.send(json.dumps({"type": "submit_many", "id": "f", "requests": [
            trigger(("btc", "eth", "news")[n % 3]) for n in range(600)]}))
        assert (await receive(feed))["type"] == "acks"
        expected = [r for r in await live.engine.store.read() if r.stream in {"btc", "eth"}]

        async def events(ws: Any, kind: str) -> tuple[int, list[dict[str, Any]]]:
            got: list[dict[str, Any]] = []
            frames = 0
            while len(got) < len(expected):
                frame = await receive(ws)
                assert frame["type"] == kind, frame
                frames += 1
                got += frame["events"] if kind == "events" else [frame]
            return frames, got

        singles, one_by_one = await events(single, "event")
        frames, in_batches = await events(batched, "events")
    assert in_batches == one_by_one
    assert [(e["position"], e["stream"], e["version"], e["eventType"], e["data"],
             e["recordedAt"]) for e in in_batches] == [
        (r.position, r.stream, r.version, r.type, json.loads(r.data), r.recorded_at)
        for r in expected]
    assert singles == len(expected) > 400 and frames < 20


async def test_every_error_frame_kind_and_the_connection_survives(live: Live) -> None:
    async with live.socket() as ws:
        async def ask(raw: str) -> dict[str, Any]:
            await ws.send(raw)
            return await receive(ws)

        assert (await ask("{not json"))["code"] == "malformed_json"
        assert (await ask(json.dumps({"type": "teleport", "id": "t"}))) == {
            "type": "error", "id": "t", "code": "unknown_type", "field": "type",
            "message": "unknown frame type 'teleport'; expected one of auth, submit, "
                       "submit_many, market, subscribe, unsubscribe, ping, desk_kill"}
        bad = trigger("btc", priority="urgent")
        answer = await ask(json.dumps({"type": "submit", "id": "b", "request": bad}))
        assert answer["code"] == "invalid" and answer["field"] == "request.priority"
        extra = await ask(json.dumps({"type": "submit", "request": {**trigger("btc"), "x": 1}}))
        assert extra["field"] == "request.x" and "unknown field" in extra["message"]
        big = await ask(json.dumps({"type": "ping", "pad": "x" * (2 << 20)}))
        assert big["code"] == "too_large"
        unknown = await ask(json.dumps({"type": "submit", "request": trigger("nobody")}))
        assert unknown["code"] == "unknown_agent" and unknown["requestId"]
        pong = await ask(json.dumps({"type": "ping", "id": "still-here"}))
        assert pong["type"] == "pong" and pong["id"] == "still-here"

        for _ in range(20):  # abuse: a stream of garbage is cut off with a policy code
            await ws.send("garbage")
        errors = 0
        with pytest.raises(ConnectionClosed) as closed:
            errors += await _count_until_closed(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_browser_authenticates_by_subprotocol_at_the_handshake(live: Live) -> None:
    async with live.socket(token=None, subprotocols=browser_protocols("viewer-secret")) as ws:
        assert ws.subprotocol == "gateway.v1"  # answered by name, never with the token
        assert (await receive(ws))["principal"] == "watcher"  # no auth frame needed
        await ws.send(json.dumps({"type": "auth", "token": "viewer-secret"}))
        assert (await receive(ws))["message"] == "already authenticated"
    token_only = browser_protocols("control-secret")[1:]
    async with live.socket(token=None, subprotocols=token_only) as ws:
        assert ws.subprotocol is None
        assert (await receive(ws))["principal"] == "ops"
    for offered, message in (
        (browser_protocols("wrong"), "unknown token"),
        ([Subprotocol("gateway.v1"), Subprotocol("bearer.__8")], "base64url"),
    ):
        async with live.socket(token=None, subprotocols=offered) as ws:
            error = await receive(ws)
            assert error["code"] == "unauthorized" and message in error["message"], error
            with pytest.raises(ConnectionClosed) as closed:
                await receive(ws)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def _count_until_closed(ws: Any) -> int:
    count = 0
    while True:
        await receive(ws)
        count += 1


async def test_bad_tokens_are_refused_and_closed_with_a_policy_code(live: Live) -> None:
    async with live.socket(token=None) as ws:
        await ws.send(json.dumps({"type": "auth", "token": "wrong"}))
        error = await receive(ws)
        assert error["code"] == "unauthorized"
        with pytest.raises(ConnectionClosed) as closed:
            await receive(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    async with live.socket(token=None) as ws:  # a token in the first frame, not the URL
        await ws.send(json.dumps({"type": "auth", "token": "viewer-secret"}))
        assert (await receive(ws))["principal"] == "watcher"
    with pytest.raises(InvalidStatus):
        async with live.socket(origin="https://evil.example"):
            pass


AUTH_MATRIX = [
    # token, method, path, body kind, expected status
    (None, "GET", "/api/agents", None, 401),
    (None, "GET", "/api/agents/nobody", None, 401),  # no probing for agent names
    ("wrong", "GET", "/api/agents", None, 401),
    ("feed-secret", "GET", "/api/agents", None, 403),
    ("viewer-secret", "GET", "/api/agents", None, 200),
    ("feed-secret", "POST", "/api/agents/btc/requests", "trigger", 200),
    ("feed-secret", "POST", "/api/agents/btc/requests", "message", 403),
    ("feed-secret", "POST", "/api/agents/btc/control", "stop", 403),
    ("viewer-secret", "POST", "/api/agents/btc/control", "stop", 403),
    ("viewer-secret", "POST", "/api/agents/btc/requests", "trigger", 403),
    ("viewer-secret", "POST", "/api/agents/btc/queue/clear", None, 403),
    ("control-secret", "POST", "/api/agents/btc/config", "config", 403),
    ("admin-secret", "POST", "/api/agents/btc/config", "config", 200),
    ("scoped-secret", "GET", "/api/agents/btc", None, 200),
    ("scoped-secret", "GET", "/api/agents/eth", None, 403),
    ("scoped-secret", "GET", "/api/agents/nobody", None, 403),
    ("scoped-secret", "POST", "/api/agents/eth/release", None, 403),
    ("scoped-secret", "POST", "/api/agents/btc/release", None, 200),
    ("control-secret", "GET", "/api/agents/nobody", None, 404),
]


async def test_the_auth_matrix(live: Live) -> None:
    bodies: dict[str, Any] = {
        "trigger": lambda: trigger("btc"),
        "message": lambda: trigger("btc", kind="user_control", payload={"message": "hi"},
                                   dedupeKey=None),
        "stop": lambda: {"action": "emergency_stop"},
        "config": lambda: {"mode": "queue"},
    }
    failures = []
    for token, method, path, body, expected in AUTH_MATRIX:
        async with live.client(token) as http:
            payload = bodies[body]() if body else None
            if payload is not None and payload.get("dedupeKey") is None:
                payload.pop("dedupeKey", None)
            response = await http.request(method, path, json=payload)
        if response.status_code != expected:
            failures.append((token, method, path, response.status_code, response.text))
        if response.status_code >= 400:
            assert response.json()["code"] in {"unauthorized", "forbidden", "unknown_agent"}
    assert failures == []
    async with live.socket("feed", "viewer-secret", hello=False) as ws:  # viewers cannot feed
        assert (await receive(ws))["code"] == "forbidden"
        with pytest.raises(ConnectionClosed):
            await receive(ws)
    async with live.socket("feed", "feed-secret") as ws:
        await ws.send(json.dumps({"type": "submit", "request": control("btc", "pause")}))
        assert (await receive(ws))["code"] == "forbidden"


async def test_feed_submits_of_one_request_are_each_answered_by_their_frame_id(
        live: Live) -> None:
    """A feed's single submits are decided as they are read and answered from their commit
    (no task each): every frame gets its own answer, an accepted, deduped or refused one."""
    async with live.socket("feed", "feed-secret") as ws:
        requests = [trigger("btc", f"k{n % 5}") for n in range(20)] + [trigger("nobody")]
        frames = [{"type": "submit", "id": f"f{n}", "request": r}
                  for n, r in enumerate(requests[:20])]
        frames.append({"type": "submit", "id": "nobody", "request": requests[-1]})
        for frame in frames:
            await ws.send(json.dumps(frame))
        answers: dict[str, dict[str, Any]] = {}
        while len(answers) < len(frames):
            answer = await receive(ws)
            answers[answer["id"]] = answer
    decisions = [answers[f"f{n}"]["decision"] for n in range(20)]
    assert decisions[:5] == ["accepted"] * 5 and set(decisions[5:]) == {"deduped"}
    assert answers["nobody"]["type"] == "error" and answers["nobody"]["code"] == "unknown_agent"
    assert answers["nobody"]["requestId"] == requests[-1]["requestId"]
    assert [answers[f"f{n}"]["requestId"] for n in range(20)] == \
        [r["requestId"] for r in requests[:20]]


async def test_the_http_queue_api(live: Live, reasoner: ManualReasoner) -> None:
    async with live.client() as http:
        ack = (await http.post("/api/agents/btc/requests", json=trigger("btc"))).json()
        assert ack["decision"] == "accepted"
        run = await reasoner.started()
        await http.post("/api/agents/btc/requests", json=trigger("btc", "same"))
        dup = (await http.post("/api/agents/btc/requests", json=trigger("btc", "same"))).json()
        assert dup["decision"] == "deduped"
        queue = (await http.get("/api/agents/btc/queue")).json()
        assert queue["busy"] and queue["run"]["runId"] == run.run_id
        assert [p["dedupeKey"] for p in queue["pending"]] == ["same"]
        agent = (await http.get("/api/agents/btc")).json()
        assert agent["config"]["mode"] == "followup" and agent["trading"] == "ACTIVE"
        stale = await http.post("/api/agents/btc/runs/btc-r99/abort")
        assert stale.status_code == 409 and stale.json()["code"] == "conflict"
        assert (await http.post(f"/api/agents/btc/runs/{run.run_id}/abort")).status_code == 200
        await reasoner.started()
        assert (await http.post("/api/agents/btc/release")).json()["applied"]
        cleared = (await http.post("/api/agents/btc/queue/clear")).json()
        assert cleared["applied"]
        events = (await http.get("/api/events", params={"agent": "btc", "type": "RunAborted"}
                                 )).json()
        assert [e["data"]["reason"] for e in events["events"]] == ["operator", "release"]
        page = (await http.get("/api/events", params={"limit": 2})).json()
        assert len(page["events"]) == 2 and page["next"] == page["events"][-1]["position"]
        bad = await http.get("/api/events", params={"after": "x"})
        assert bad.status_code == 422
        assert (await http.get("/healthz")).json()["status"] == "ok"
        metrics = (await http.get("/metrics")).text
        assert 'gateway_aborts_total{agent="btc"} 2' in metrics
        assert "gateway_commit_latency_seconds_bucket" in metrics
        assert "gateway_control_commit_latency_seconds_bucket" in metrics
        spec = (await http.get("/openapi.json")).json()
        assert "/api/agents/{agent_id}/control" in spec["paths"]
        malformed = await http.post("/api/agents/btc/requests", content=b"{nope")
        assert malformed.status_code == 400 and malformed.json()["code"] == "malformed_json"
        mismatch = await http.post("/api/agents/btc/requests", json=trigger("eth"))
        assert mismatch.status_code == 422 and mismatch.json()["field"] == "agentId"


async def test_a_saturated_writer_answers_busy_instead_of_buffering(live: Live) -> None:
    live.service.busy_backlog = -1
    async with live.socket() as ws:
        await ws.send(json.dumps({"type": "submit", "id": "b", "request": trigger("btc")}))
        busy = await receive(ws)
        assert busy["type"] == "busy" and busy["id"] == "b" and busy["retryAfterMs"] > 0
    async with live.client() as http:
        response = await http.post("/api/agents/btc/requests", json=trigger("btc"))
        assert response.status_code == 503 and "Retry-After" in response.headers
    assert live.engine.state("btc").counters.received == 0


async def test_graceful_shutdown_with_runs_in_flight_then_restart_loses_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "gateway.db"
    first = ManualReasoner()
    acked: list[str] = []
    async with running(SqliteEventStore(db), AGENTS, lambda _: first) as live:
        async with live.client() as http:
            for agent in ("btc", "news", "btc"):
                ack = (await http.post(f"/api/agents/{agent}/requests",
                                       json=trigger(agent))).json()
                assert ack["decision"] == "accepted"
                acked.append(ack["requestId"])
        await first.started()
        await first.started()
    store = SqliteEventStore(db)
    await store.open()
    log = await log_of(store)
    await store.close()
    shutdowns = [e.event for e in log if isinstance(e.event, RunAborted)]
    assert {a.reason for a in shutdowns} == {AbortReason.SHUTDOWN}
    assert len(shutdowns) == 2

    second = ManualReasoner()
    async with running(SqliteEventStore(db), AGENTS, lambda _: second) as live:
        reruns = {(await second.started()).agent_id, (await second.started()).agent_id}
        assert reruns == {"btc", "news"}
        await live.engine.flush()
        log = await log_of(live.engine.store)
        outcomes = request_outcomes(log)
        assert all(outcomes[r] in {"running", "pending"} for r in acked)
        states = replay(log)
        assert all(states[a] == live.engine.state(a) for a in AGENTS)
        assert verify(log) is None


async def test_scoped_tokens_see_and_drive_only_their_agents(live: Live) -> None:
    async with live.client("scoped-secret") as http:
        metrics = (await http.get("/metrics")).text
        assert 'agent="btc"' in metrics and 'agent="eth"' not in metrics
        listed = (await http.get("/api/agents")).json()
        assert [a["agentId"] for a in listed] == ["btc"]
    async with live.socket("feed", "scoped-secret") as ws:
        tick = {"type": "tick", "symbol": "BTCUSD", "price": 1.0,
                "at": datetime.now(UTC).isoformat()}
        await ws.send(json.dumps({"type": "market", "events": [tick]}))
        assert (await receive(ws))["code"] == "forbidden"
    async with live.socket("feed", "feed-secret") as ws:
        future = {"type": "tick", "symbol": "BTCUSD", "price": 1.0, "at": "2099-01-01T00:00:00Z"}
        await ws.send(json.dumps({"type": "market", "events": [future]}))
        answer = await receive(ws)
        assert answer["code"] == "invalid" and answer["field"] == "events.0"


async def test_a_second_subscribe_replaces_the_first(live: Live) -> None:
    async with live.socket() as ws:
        for n in range(2):  # back to back: one follower must remain, not two
            await ws.send(json.dumps({"type": "subscribe", "id": f"s{n}", "agents": ["btc"]}))
        await receive_until(ws, lambda f: f.get("id") == "s1")  # the second's snapshot
        async with live.client() as http:
            await http.post("/api/agents/btc/requests", json=trigger("btc"))
        last = await live.engine.store.last_position()
        frames = await receive_until(ws, lambda f: f.get("position") == last)
        await ws.send(json.dumps({"type": "ping", "id": "p"}))
        frames += await receive_until(ws, lambda f: f.get("id") == "p")
        positions = [f["position"] for f in frames if f["type"] == "event"]
        assert positions == sorted(set(positions)), positions
        assert last in positions


async def test_the_replay_api_shows_the_queue_as_it_was_at_a_position(
    live: Live, reasoner: ManualReasoner
) -> None:
    async with live.client() as http:
        await http.post("/api/agents/btc/requests", json=trigger("btc", "first"))
        run = await reasoner.started()
        second = (await http.post("/api/agents/btc/requests", json=trigger("btc", "second"))
                  ).json()
        await http.post("/api/agents/btc/requests", json=trigger("btc", "third"))
        reasoner.finish(run.run_id)
        await reasoner.started()
        now = (await http.get("/api/replay", params={"agent": "btc"})).json()
        assert [p["dedupeKey"] for p in now["queue"]["pending"]] == ["third"]
        then = (await http.get("/api/replay", params={"agent": "btc",
                                                      "position": second["position"]})).json()
        assert then["position"] == second["position"] == then["eventPosition"]
        assert [p["dedupeKey"] for p in then["queue"]["pending"]] == ["second"]
        assert then["queue"]["run"]["runId"] == run.run_id
        assert then["status"]["pending"] == 1
        assert second["position"] in [e["position"] for e in then["around"]]
        at_zero = (await http.get("/api/replay", params={"agent": "btc", "position": 0})).json()
        assert at_zero["queue"]["pending"] == [] and at_zero["version"] == 0
        missing = await http.get("/api/replay")
        assert missing.status_code == 422 and missing.json()["field"] == "agent"
        bad = await http.get("/api/replay", params={"agent": "btc", "position": "x; DROP"})
        assert bad.status_code == 422 and bad.json()["field"] == "position"
        assert (await http.get("/api/replay", params={"agent": "ghost"})).status_code == 404
    async with live.client("scoped-secret") as http:
        hidden = await http.get("/api/replay", params={"agent": "eth"})
        assert hidden.status_code == 403


async def test_metrics_count_the_agents_that_are_stuck_by_what_holds_them(live: Live) -> None:
    async with live.client() as http:
        before = (await http.get("/metrics")).text
        assert 'gateway_agents{state="halted"} 0' in before
        for agent, action in (("btc", "emergency_stop"), ("eth", "pause")):
            answer = await http.post(f"/api/agents/{agent}/control", json={"action": action})
            assert answer.status_code == 200, answer.text
        metrics = (await http.get("/metrics")).text
    for line in ('gateway_agents{state="halted"} 1', 'gateway_agents{state="reducing"} 1',
                 'gateway_agents{state="suppressed"} 0', 'gateway_agents{state="held"} 0',
                 'gateway_halted{agent="btc"} 1', 'gateway_suppressed{agent="btc"} 0',
                 'gateway_held{agent="news"} 0'):
        assert line in metrics, line


async def test_the_panel_has_a_favicon(live: Live) -> None:
    async with live.client(None) as http:
        icon = await http.get("/favicon.ico")
    assert icon.status_code == 200 and icon.content[:4] == b"\x00\x00\x01\x00"  # an ICO
    assert icon.headers["content-type"] in ("image/x-icon", "image/vnd.microsoft.icon")
