"""One desk kill over HTTP and WebSocket: every agent of the token's scope HALTED with its
open orders' cancels sent, one ``DeskKilled`` event with each agent's effect, and bad input
or a token that may not refused with nothing recorded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.runtime.desk import RECORD_TYPE, read_kill
from lanes import AgentConfig, Mode
from lanes.events import TradingState
from lanes.streams import DESK_STREAM
from store import SqliteEventStore
from tests.e2e.live import Live, receive, running
from tests.e2e.test_orders import Trader, orders_open, started, trigger

AGENTS = {name: AgentConfig(mode=Mode.FOLLOWUP) for name in ("btc", "eth", "sol")}


async def with_orders(live: Live) -> None:
    """btc: two open orders; eth: one; sol: none."""
    await started(live)
    await live.engine.submit(trigger("btc", {"symbol": "BTCUSD", "side": "buy", "qty": 1},
                                     {"symbol": "BTCUSD", "side": "sell", "qty": 2}))
    await live.engine.submit(trigger("eth", {"symbol": "ETHUSD", "side": "buy", "qty": 3}))
    await orders_open(live, "btc", 2)
    await orders_open(live, "eth", 1)


def states(live: Live) -> dict[str, TradingState]:
    return {a: live.engine.state(a).trading for a in AGENTS}


async def recorded(live: Live) -> list[Any]:
    await live.engine.flush()
    return [read_kill(r.data) for r in await live.engine.store.read_stream(DESK_STREAM)]


async def post_kill(live: Live, token: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    async with live.client(token) as client:
        response = await client.post("/api/desk/kill",
                                     content=b"" if body is None else json.dumps(body))
    answer: dict[str, Any] = response.json()
    return response.status_code, answer


async def test_a_desk_kill_halts_every_agent_cancels_their_orders_and_records_one_event(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader()) as live:
        await with_orders(live)
        status, answer = await post_kill(live, "control-secret", {"reason": "fat finger"})
        assert status == 200, answer
        assert answer["type"] == "desk_kill_ack"
        assert answer["halted"] == 3 and answer["cancelsRequested"] == 3
        kill = answer["kill"]
        assert kill["principal"] == "ops" and kill["reason"] == "fat finger"
        assert "scope" not in kill  # an unscoped token: every agent
        effects = {a["agentId"]: a["effect"] for a in kill["agents"]}
        assert list(effects) == ["btc", "eth", "sol"]
        assert {a: (e["fromState"], e["toState"], e["cancelsRequested"])
                for a, e in effects.items()} == {
            "btc": ("ACTIVE", "HALTED", 2), "eth": ("ACTIVE", "HALTED", 1),
            "sol": ("ACTIVE", "HALTED", 0)}
        assert states(live) == dict.fromkeys(AGENTS, TradingState.HALTED)
        [event] = await recorded(live)
        assert event.kill_id == kill["killId"]
        assert [a.agent_id for a in event.agents] == ["btc", "eth", "sol"]
        assert event.cancels_requested == 3 and event.halted == 3
        records = await live.engine.store.read_stream(DESK_STREAM)
        assert [r.type for r in records] == [RECORD_TYPE]
        assert records[0].position == kill["position"]
        # Each agent's stop is an ordinary control request with the kill's id.
        stops = [r for r in await live.engine.store.read_stream("btc")
                 if r.type == "RequestReceived" and kill["killId"] in r.data]
        assert len(stops) == 1

        again = await post_kill(live, "control-secret")  # a second kill: nothing changes
        assert again[0] == 200
        assert [a["effect"]["changed"] for a in again[1]["kill"]["agents"]] == [False] * 3
        assert len(await recorded(live)) == 2


async def test_a_scoped_token_halts_only_its_agents_and_names_unknown_ones(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader()) as live:
        await with_orders(live)
        async with live.client("scoped-secret") as client:
            listed = (await client.get("/api/desk/kill")).json()
        assert listed == {"agents": ["btc"], "scoped": True}
        status, answer = await post_kill(live, "scoped-secret", {})
        assert status == 200, answer
        assert [a["agentId"] for a in answer["kill"]["agents"]] == ["btc"]
        assert answer["kill"]["scope"] == ["btc"] and answer["cancelsRequested"] == 2
        assert states(live) == {"btc": TradingState.HALTED, "eth": TradingState.ACTIVE,
                                "sol": TradingState.ACTIVE}
        assert len(await recorded(live)) == 1


@pytest.mark.parametrize("token", ["viewer-secret", "feed-secret"])
async def test_a_token_that_may_not_act_gets_403_and_nothing_is_recorded(
        tmp_path: Path, token: str) -> None:
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader()) as live:
        await started(live)
        status, answer = await post_kill(live, token, {"reason": "x"})
        assert status == 403 and answer["code"] == "forbidden"
        async with live.client(token) as client:
            assert (await client.get("/api/desk/kill")).status_code == 403
        endpoint = "feed" if token == "feed-secret" else "control"
        async with live.socket(endpoint, token=token) as ws:
            await ws.send(json.dumps({"type": "desk_kill", "id": "k1"}))
            frame = await receive(ws)
        assert frame["type"] == "error" and frame["code"] == "forbidden"
        assert frame["id"] == "k1"
        assert states(live) == dict.fromkeys(AGENTS, TradingState.ACTIVE)
        assert await recorded(live) == []


@pytest.mark.parametrize(("body", "field"), [
    ({"flatten": "yes"}, "flatten"),
    ({"reason": 5}, "reason"),
    ({"reason": "x", "force": True}, "force"),
    ({"flatten": 1}, "flatten"),
    ({"reason": "x" * 501}, "reason"),
])
async def test_bad_input_is_a_typed_error_naming_the_field_and_changes_nothing(
        tmp_path: Path, body: dict[str, Any], field: str) -> None:
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader()) as live:
        await started(live)
        status, answer = await post_kill(live, "control-secret", body)
        assert status == 422 and answer["code"] == "invalid", answer
        assert answer["field"] == field
        async with live.socket() as ws:
            await ws.send(json.dumps({"type": "desk_kill", "id": "k2", **body}))
            frame = await receive(ws)
        assert frame["type"] == "error" and frame["field"] == field, frame
        assert states(live) == dict.fromkeys(AGENTS, TradingState.ACTIVE)
        assert await recorded(live) == []


async def test_a_desk_kill_over_websocket_answers_with_each_agents_effect(
        tmp_path: Path) -> None:
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader()) as live:
        await with_orders(live)
        async with live.socket() as ws:
            await ws.send(json.dumps({"type": "desk_kill", "id": "k3", "reason": "ws"}))
            frame = await receive(ws)
        assert frame["type"] == "desk_kill_ack" and frame["id"] == "k3", frame
        assert frame["halted"] == 3 and frame["cancelsRequested"] == 3
        assert {a["agentId"]: a["effect"]["toState"] for a in frame["kill"]["agents"]} == \
            dict.fromkeys(AGENTS, "HALTED")
        assert states(live) == dict.fromkeys(AGENTS, TradingState.HALTED)
        [event] = await recorded(live)
        assert event.reason == "ws" and event.kill_id == frame["kill"]["killId"]


async def killed_log(db: Path) -> None:
    async with running(SqliteEventStore(db), AGENTS, Trader()) as live:
        await with_orders(live)
        assert (await post_kill(live, "control-secret"))[0] == 200


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_log_with_a_desk_kill_verifies_clean(
        tmp_path: Path, jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "e.db"
    asyncio.run(killed_log(db))
    capsys.readouterr()
    code = main(["verify", str(db), "--jobs", jobs])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 desk kill read: no divergence" in out


def test_a_log_with_a_desk_kill_exports_imports_and_verifies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, dump, copy = tmp_path / "e.db", tmp_path / "e.jsonl", tmp_path / "copy.db"
    asyncio.run(killed_log(db))
    assert main(["export", str(db), "--out", str(dump)]) == 0
    assert main(["import", str(copy), str(dump)]) == 0
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 0
    assert "1 desk kill read: no divergence" in capsys.readouterr().out


async def test_the_cli_kills_the_desk_and_prints_each_agents_effect(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DESK_TOKEN", "scoped-secret")
    monkeypatch.setenv("VIEW_TOKEN", "viewer-secret")
    async with running(SqliteEventStore(tmp_path / "e.db"), AGENTS, Trader()) as live:
        await with_orders(live)
        capsys.readouterr()

        def gateway(*argv: str) -> int:
            return main(["kill", "--url", live.http, *argv])

        assert await asyncio.to_thread(gateway, "--token-env", "DESK_TOKEN", "--list") == 0
        assert capsys.readouterr().out == \
            "a desk kill would halt 1 agent (the token is scoped): btc\n"
        assert await asyncio.to_thread(gateway, "--token-env", "VIEW_TOKEN") == 1
        assert "refused (403 forbidden)" in capsys.readouterr().out
        assert await recorded(live) == []
        assert await asyncio.to_thread(gateway, "--token-env", "DESK_TOKEN",
                                       "--reason", "cli") == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == "  btc: ACTIVE -> HALTED, 2 cancels sent"
        [record] = await live.engine.store.read_stream(DESK_STREAM)
        assert lines[1].endswith("1 of 1 agents HALTED, 2 cancels sent (recorded at position "
                                 f"{record.position})")
        assert states(live)["btc"] is TradingState.HALTED
        assert states(live)["eth"] is TradingState.ACTIVE
        [event] = await recorded(live)
        assert event.reason == "cli" and event.scope == ["btc"]
