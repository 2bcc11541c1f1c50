"""Why an agent is blocked, over HTTP: ``blocked`` and ``attention`` in GET /api/agents and
GET /api/agents/{id}, from a live gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2

from gateway.edge.server import Running
from tests.browser.live import (
    ADMIN,
    SCOPED,
    agent,
    http,
    live_gateway,
    panel_config,
    request,
    submit,
)
from tests.gateway.support import until


async def hold_the_only_slot(running: Running, client: httpx2.AsyncClient) -> None:
    """Let the provider allow one call at a time, and have delta's run hold it."""
    async with http(running, ADMIN) as admin:
        limited = await admin.post("/api/providers/sim-llm/limits", json={"maxConcurrent": 1})
        assert limited.status_code == 200, limited.text
    await submit(running, request("delta"))

    async def delta_running() -> bool:
        body = (await client.get("/api/agents/delta")).json()
        return [r["kind"] for r in body["blocked"]] == ["running"]

    await until(delta_running, "delta's run holding the only slot")


async def test_a_stopped_agent_says_who_stopped_it_and_a_budget_says_until_when(
    tmp_path: Path,
) -> None:
    db = tmp_path / "blocked.db"
    config = panel_config(db, [agent("alpha", (10, 10)),
                               agent("bravo", (10, 10), budgets={"max_runs_per_hour": 1}),
                               agent("charlie")], hooked=[])
    async with live_gateway(config, db, feed=False) as running, http(running) as client:
        stopped = await client.post("/api/agents/alpha/control", json={"action": "emergency_stop"})
        assert stopped.json()["decision"] == "accepted"
        await submit(running, request("bravo"))
        await submit(running, request("bravo"))

        async def suppressed() -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get("/api/agents/bravo")).json()
            return body if body["blocked"] and body["blocked"][0]["kind"] == "suppressed" \
                else None

        bravo = await until(suppressed, "bravo suppressed by its hourly budget")
        assert bravo["attention"] == "warning"
        assert bravo["blocked"][0]["budget"] == "runsPerHour"
        assert bravo["blocked"][0]["until"].endswith("Z")

        alpha = (await client.get("/api/agents/alpha")).json()
        assert alpha["attention"] == "critical"
        [halted] = alpha["blocked"]
        assert (halted["kind"], halted["by"], halted["action"]) == (
            "halted", "ops", "emergency_stop")
        listed = {a["agentId"]: a for a in (await client.get("/api/agents")).json()}
        assert listed["alpha"]["blocked"] == alpha["blocked"]
        assert listed["charlie"]["blocked"] == [] and listed["charlie"]["attention"] == "none"


async def test_an_agent_waiting_at_the_gate_says_on_which_limit(tmp_path: Path) -> None:
    db = tmp_path / "gate.db"
    config = panel_config(db, [agent("delta", (60_000, 60_000)),
                               agent("echo", (60_000, 60_000))], hooked=[])
    async with live_gateway(config, db, feed=False) as running, http(running) as client:
        await hold_the_only_slot(running, client)
        await submit(running, request("echo"))

        async def waiting() -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get("/api/agents/echo")).json()
            return body if body["blocked"] and body["blocked"][0]["kind"] == "gate" else None

        echo = await until(waiting, "echo waiting at the gate")
        gate = echo["blocked"][0]
        assert (gate["provider"], gate["limit"], gate["first"], gate["waiting"]) == (
            "sim-llm", "concurrency", True, 1)
        assert gate["nextSlotAt"] is None  # a slot comes back when delta's call ends
        assert [r["kind"] for r in echo["blocked"]] == ["gate", "running"]
        assert echo["attention"] == "info"  # a short wait


async def test_a_scoped_token_is_not_told_which_agent_its_agent_waits_behind(
    tmp_path: Path,
) -> None:
    db = tmp_path / "behind.db"
    config = panel_config(db, [agent("delta", (60_000, 60_000)),
                               agent("bravo", (60_000, 60_000)),
                               agent("alpha", (60_000, 60_000))], hooked=[])
    async with live_gateway(config, db, feed=False) as running, http(running) as client:
        await hold_the_only_slot(running, client)
        await submit(running, request("bravo"))

        async def gate_wait(agent_id: str) -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get(f"/api/agents/{agent_id}")).json()
            return body["blocked"][0] if body["blocked"] and \
                body["blocked"][0]["kind"] == "gate" else None

        await until(lambda: gate_wait("bravo"), "bravo waiting at the gate")
        await submit(running, request("alpha"))
        behind = await until(lambda: gate_wait("alpha"), "alpha waiting behind bravo")
        assert behind["first"] is False
        async with http(running, SCOPED) as scoped:
            [mine] = (await scoped.get("/api/agents")).json()
            seen = [(await scoped.get("/api/agents/alpha")).json(), mine]
        for body in seen:
            assert body["agentId"] == "alpha"
            assert "bravo" not in str(body["blocked"]), body["blocked"]
