"""The typed HTTP client (`gateway.client.HttpClient`) against a live gateway: every call
answers its model, read from what the gateway did, and every refusal raises the error of its
code with the gateway's message."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.client import (
    Conflict,
    FeedClient,
    Forbidden,
    GatewayClientError,
    HttpClient,
    InvalidInput,
    NotFound,
    Unauthorized,
)
from gateway.config import validate_config
from gateway.edge.server import Running, serving
from gateway.wiring import build_service
from tests.gateway.support import until

ADMIN, OPS, VIEWER, FEED = "admin-secret-0001", "ops-secret-0002", "viewer-secret-03", "feed-s-04"
CONFIG: dict[str, Any] = {
    "tokens": [{"name": "root", "token": ADMIN, "role": "admin"},
               {"name": "ops", "token": OPS, "role": "control"},
               {"name": "watcher", "token": VIEWER, "role": "viewer"},
               {"name": "feeder", "token": FEED, "role": "feed"}],
    "providers": [{"name": "sim", "kind": "simulated",
                   "limits": {"requests_per_minute": 6_000, "max_concurrent": 4}}],
    "agents": [
        {"id": "btc", "mode": "followup", "tools": ["market_snapshot", "place_order"],
         "approval": {"above_notional": 5_000},
         # each run: a look at the market, then an order resting far below it and one
         # that waits for a human (0.1 BTC at 64,000 is over 5,000)
         "reasoner": {"kind": "simulated", "provider": "sim", "latency_ms": [1, 5],
                      "trade_probability": 0.0, "tool_steps": [
                          [{"tool": "market_snapshot", "arguments": {"symbol": "$symbol"}}],
                          [{"tool": "place_order", "arguments": {
                              "symbol": "$symbol", "side": "buy", "qty": 0.1,
                              "orderType": "limit", "limitPrice": 1_000}},
                           {"tool": "place_order", "arguments": {
                               "symbol": "$symbol", "side": "buy", "qty": 0.1}}]]}},
        {"id": "news", "mode": "followup",
         "tools": ["schedule_tasks", "execute_scheduled_tasks"],
         "schedules": [{"id": "audit", "every_ms": 3_600_000,
                        "payload": {"scope": "everything"}}],
         # each run: a question to btc, sent, and its answer awaited
         "reasoner": {"kind": "simulated", "provider": "sim", "latency_ms": [1, 5],
                      "trade_probability": 0.0, "tool_steps": [
                          [{"tool": "schedule_tasks", "arguments": {"tasks": [
                              {"agentId": "btc", "payload": {"question": "outlook?"}}]}}],
                          [{"tool": "execute_scheduled_tasks"}]]}},
    ],
}


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path) -> AsyncIterator[Running]:
    """The gateway of `CONFIG` on a loopback port, with a BTCUSD price."""
    service = build_service(validate_config(CONFIG, "<test>"), tmp_path / "events.db")
    async with serving(service) as running:
        async with FeedClient(running.url, FEED) as feed:
            await feed.market([{"type": "tick", "symbol": "BTCUSD", "price": 64_000.0,
                                "at": datetime.now(UTC).isoformat()}])
        yield running


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Running]:
    async with gateway(tmp_path) as running:
        yield running


def message(agent: str, text: str) -> dict[str, object]:
    """A message to an agent (a run), as wire JSON without ids (the client adds them)."""
    return {"agentId": agent, "kind": "user_control", "payload": {"message": text}}


async def traded(api: HttpClient) -> None:
    """A run of btc with its tool steps: an order resting, one waiting for approval."""
    ack = await api.submit(message("btc", "look and buy"))
    assert ack.decision == "accepted" and ack.position > 0

    async def waiting() -> bool:  # (its order waits from its tool step, before the run ends)
        runs = (await api.runs("btc")).runs
        return bool(await api.approvals()) and bool(runs) and runs[-1].outcome != "running"
    await until(waiting, "btc's run to end with its order waiting for approval")


async def test_agents_queues_providers_and_probes_read_as_their_models(live: Running) -> None:
    async with HttpClient(live.url, VIEWER) as api:
        agents = await api.agents()
        assert [a.agent_id for a in agents] == ["btc", "news"]
        assert all(a.trading == "ACTIVE" and a.attention == "none" for a in agents)
        btc = await api.agent("btc")
        assert btc.config["mode"] == "followup" and btc.schedules == []
        assert (await api.queue("btc")).pending == []
        (provider,) = await api.providers()
        assert (provider.name, provider.breaker) == ("sim", "closed")
        assert (await api.provider("sim")).limits["requestsPerMinute"] == 6000
        assert "RequestReceived" in (await api.event_types()).agent.inputs
        assert (await api.readiness()).status == "ready"
        assert await api.live()
        assert (await api.openapi())["openapi"].startswith("3.")
        assert "gateway_" in await api.metrics()
        assert (await api.desk_budget()).configured is False
        feed = await api.feed()
        assert [s["symbol"] for s in feed.symbols] == ["BTCUSD"] and not feed.hooks.paused
        assert (await api.alerts()).alerts == []


async def test_a_run_with_tool_steps_its_orders_and_its_approval(live: Running) -> None:
    async with HttpClient(live.url, OPS) as api:
        await traded(api)
        first = (await api.runs("btc")).runs[-1]  # (newest first)
        assert first.run_id == "btc-r1" and first.outcome == "no_trade"
        assert [len(step["tools"]) for step in first.steps][:2] == [1, 2]
        assert 1000.0 in [o.limit_price for o in (await api.orders()).open_orders]
        approval = (await api.approvals(agent="btc"))[0]
        assert approval.order["side"] == "buy" and approval.notional == pytest.approx(6_400)
        ack = await api.approve("btc", approval.approval_id, reason="fine")
        assert ack.decision == "accepted"
        assert approval.approval_id not in [a.approval_id for a in await api.approvals()]

        async def filled() -> bool:
            return bool((await api.orders(agent="btc")).fills)
        await until(filled, "the approved order to fill")
        pnl = await api.pnl()
        assert [p.symbol for a in pnl.agents for p in a.positions] == ["BTCUSD"]
        again = await api.reject("btc", approval.approval_id)
        assert again.decision == "rejected" and again.reason


async def test_the_log_reads_of_a_run(live: Running) -> None:
    async with HttpClient(live.url, VIEWER) as viewer, HttpClient(live.url, OPS) as api:
        await traded(api)
        page = await viewer.events(agent="btc", limit=1000)
        types = [e.type for e in page.events]
        assert "RunStarted" in types and page.next is not None
        found = await viewer.search_events("place_order", agent="btc")
        assert found.events and found.scanned > 0
        started = next(e for e in page.events if e.type == "RunStarted")
        cause = await viewer.event(started.position)
        assert cause.input is not None and cause.input.type == "RequestReceived"
        mine = await viewer.agent_events("btc", limit=5)
        assert len(mine.events) == 5 and mine.more
        story = await viewer.story("btc")
        assert story.agent_id == "btc" and story.groups and not story.more
        around = await viewer.story("btc", at=started.position, around=1)
        assert around.at == started.position
        assert await viewer.story_find("btc", "stop", after=0) is None
        moment = await viewer.moment("btc", started.position)
        assert moment.position == started.position
        diff = await viewer.diff("btc", 0, page.events[-1].position)
        assert diff.agent_id == "btc" and diff.to["position"] == page.events[-1].position
        replay = await viewer.replay("btc", position=started.position, around=2)
        assert replay.status.agent_id == "btc" and replay.around
        charts = await viewer.charts(["btc"])
        assert [a.agent_id for a in charts.agents] == ["btc"] and charts.from_ < charts.to


async def test_sub_agent_calls_read_as_a_tree_with_their_results(live: Running) -> None:
    async with HttpClient(live.url, OPS) as api:
        await api.submit(message("news", "ask btc"))

        async def answered() -> bool:
            trees = await api.calls("news")
            return trees.counts.get("returned") == 1
        await until(answered, "news's call to btc to return")
        (run,) = (await api.calls("news")).runs
        (call,) = run.calls
        assert (call["target"], call["status"]) == ("btc", "returned")


async def test_controls_answer_acks_with_their_effect(live: Running) -> None:
    async with HttpClient(live.url, OPS) as api:
        await traded(api)
        stop = await api.emergency_stop("btc", reason="test")
        assert stop.effect is not None and (stop.effect.from_state, stop.effect.to_state) == (
            "ACTIVE", "HALTED")
        assert stop.effect.cancels_requested == 1
        assert (await api.agent("btc")).blocked[0].kind == "halted"
        resumed = await api.resume("btc")
        assert resumed.effect is not None and resumed.effect.to_state == "ACTIVE"
        paused = await api.pause("btc")
        assert paused.effect is not None and paused.effect.to_state == "REDUCING"
        assert (await api.cancel_all("btc")).decision == "accepted"
        cancel = await api.cancel_order("btc", "no-such-order")
        assert cancel.decision in ("accepted", "rejected")
        assert (await api.clear_queue("btc")).applied
        assert (await api.release("btc")).applied
        with pytest.raises(Conflict) as late:
            await api.abort_run("btc", "btc-r1")
        assert late.value.status == 409 and late.value.message


async def test_schedules_are_put_paused_resumed_run_and_removed(live: Running) -> None:
    async with HttpClient(live.url, ADMIN) as api:
        (audit,) = await api.schedules("news")
        assert (audit.id, audit.every_ms, audit.from_file) == ("audit", 3_600_000, True)
        put = await api.put_schedule("news", "open", {"cron": "30 9 * * 1-5",
                                                      "timezone": "America/New_York"})
        assert put.changed and put.schedule.cron == "30 9 * * 1-5"
        assert (await api.pause_schedule("news", "open")).schedule.paused
        assert not (await api.resume_schedule("news", "open")).schedule.paused
        fired = await api.run_schedule("news", "audit")
        assert fired.decision == "accepted"
        assert await api.delete_schedule("news", "open") == "open"
        assert [s.id for s in await api.schedules("news")] == ["audit"]


async def test_config_limits_hooks_and_a_desk_kill(live: Running) -> None:
    async with HttpClient(live.url, ADMIN) as api:
        config = (await api.agent("btc")).config
        changed = await api.configure("btc", {**config, "cap": 7})
        assert changed.changed and changed.config["cap"] == 7
        limits = await api.set_provider_limits("sim", {"maxConcurrent": 2})
        assert limits.changed and limits.limits["maxConcurrent"] == 2
        paused = await api.set_hooks(True, reason="test")
        assert paused.changed and paused.hooks.paused and paused.hooks.by == "root"
        assert (await api.set_hooks(False)).hooks.paused is False
        scope = await api.desk_kill_scope()
        assert scope.agents == ["btc", "news"] and not scope.scoped
        killed = await api.desk_kill(reason="drill")
        assert killed.halted == 2 and killed.kill.reason == "drill"
        assert [a.agent_id for a in killed.kill.agents] == ["btc", "news"]
        alerts = await api.alerts(kind="halt")
        assert alerts.alerts and all(a.kind == "halt" for a in alerts.alerts)


async def test_refusals_raise_the_error_of_their_code_with_the_gateways_message(
        live: Running) -> None:
    async with HttpClient(live.url, VIEWER) as viewer:
        with pytest.raises(NotFound) as unknown:
            await viewer.agent("nobody")
        assert (unknown.value.code, unknown.value.status) == ("unknown_agent", 404)
        assert "nobody" in unknown.value.message
        with pytest.raises(Forbidden) as refused:
            await viewer.emergency_stop("btc")
        assert refused.value.code == "forbidden" and "viewer" in refused.value.message
        with pytest.raises(InvalidInput) as invalid:
            await viewer.runs("btc", limit=0)
        assert invalid.value.field == "limit"
    async with HttpClient(live.url, OPS) as api:
        with pytest.raises(InvalidInput) as bad:
            await api.submit({"agentId": "btc", "kind": "nonsense"})
        assert bad.value.field == "kind"
        assert (await api.agent("btc")).pending == 0  # nothing was taken
        with pytest.raises(Forbidden):
            await api.configure("btc", {})
    async with HttpClient(live.url, "not-a-token") as stranger:
        with pytest.raises(Unauthorized) as who:
            await stranger.agents()
        assert who.value.status == 401
    async with HttpClient(f"{live.url}/nowhere", VIEWER) as lost:
        with pytest.raises(GatewayClientError) as elsewhere:
            await lost.agents()
        assert elsewhere.value.code == "http_error" and elsewhere.value.status == 404
