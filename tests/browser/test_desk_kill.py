"""The panel's "Emergency stop all" is one desk kill on the server: its confirm names the
agents the server will halt, one POST goes out (no stop per agent), and each agent's result
is shown."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.async_api import Request, expect

from gateway.config import GatewayConfig
from tests.browser.conftest import OpenPanel, screenshot
from tests.browser.live import CONTROL, agent, http, live_gateway, panel_config


def desk(db: Path) -> GatewayConfig:
    """alpha, bravo and charlie idle unless asked; bravo's runs take 30 s."""
    return panel_config(db, [agent("alpha"), agent("bravo", (30_000, 30_000)),
                             agent("charlie")], hooked=[])


async def test_stop_all_is_one_desk_kill_naming_the_agents_and_showing_each_result(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running:
        async with http(running) as client:
            await client.post("/api/agents/bravo/requests", json={
                "requestId": "watch", "createdAt": "2026-01-01T00:00:00Z", "agentId": "bravo",
                "kind": "user_control", "payload": {"message": "watch BTC"}})
            await client.post("/api/agents/alpha/control", json={"action": "emergency_stop"})
        page = await open_panel(running.url, CONTROL)
        await page.set_viewport_size({"width": 1280, "height": 800})
        posts: list[str] = []

        def sent(request: Request) -> None:
            if request.method == "POST":
                posts.append(request.url.split("/", 3)[3])

        page.on("request", sent)
        await expect(page.locator('tr[data-agent="bravo"] td[data-col="run"]')).to_contain_text(
            "bravo-r1")
        await page.get_by_role("button", name="Emergency stop all").click()
        confirm = page.locator("#confirm")
        await expect(confirm.locator("#confirm-title")).to_have_text(
            "Emergency stop all 3 agents?")
        await expect(confirm.locator("#confirm-list li")).to_have_text(
            ["alpha", "bravo", "charlie"])
        await screenshot(page, "desk-kill-confirm-1280")
        await confirm.get_by_role("button", name="Stop all").click()

        results = page.locator("#kill-results")
        await expect(results).to_be_visible()
        await expect(results.locator("li")).to_have_text([
            "alpha was already HALTED: nothing changed",
            re.compile(r"^bravo ACTIVE → HALTED: run bravo-r1 aborted"),
            "charlie ACTIVE → HALTED",
        ])
        await expect(results.locator("#kill-results-summary")).to_have_text(re.compile(
            r"^Emergency stop: 2 agents halted \(1 run aborted\), 1 already HALTED; "
            r"0 order cancels sent\. Recorded as desk_kill_[0-9a-f]{16}\.$"))
        await expect(page.locator(".toast").last).to_have_text(re.compile(
            r"^Emergency stop: 2 agents halted \(1 run aborted\), 1 already HALTED"))
        await screenshot(page, "desk-kill-results-1280")
        box = await results.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 1280
        await results.get_by_role("button", name="Close").click()
        await expect(results).to_be_hidden()
        assert posts == ["api/desk/kill"]  # one call, not one per agent

        async with http(running) as client:
            found = (await client.get("/api/events", params={"type": "DeskKilled"})).json()
        [event] = found["events"]
        assert event["stream"] == "gateway:desk"
        assert [a["agentId"] for a in event["data"]["agents"]] == ["alpha", "bravo", "charlie"]


async def test_stop_all_offers_to_flatten_positions_unticked_and_sends_it_when_ticked(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        await page.set_viewport_size({"width": 1280, "height": 800})
        bodies: list[str | None] = []
        page.on("request", lambda r: bodies.append(r.post_data)
                if r.method == "POST" and r.url.endswith("/api/desk/kill") else None)
        stop_all = page.get_by_role("button", name="Emergency stop all")
        confirm = page.locator("#confirm")
        flatten = confirm.get_by_role("checkbox", name=re.compile("also flatten positions"))

        await stop_all.click()  # first without: the box is there, unticked
        await expect(flatten).to_be_visible()
        await expect(flatten).not_to_be_checked()
        await expect(confirm.locator("#confirm-list li")).to_have_text(
            ["alpha", "bravo", "charlie"])
        await confirm.get_by_role("button", name="Cancel").click()
        await expect(confirm).to_be_hidden()
        assert bodies == []

        await stop_all.click()
        await flatten.check()
        await screenshot(page, "desk-kill-flatten-confirm-1280")
        await confirm.get_by_role("button", name="Stop all").click()
        results = page.locator("#kill-results")
        await expect(results).to_be_visible()
        await expect(results.locator("li")).to_have_text([
            re.compile(rf"^{name} ACTIVE → HALTED.*; flatten: nothing to flatten")
            for name in ("alpha", "bravo", "charlie")])
        await expect(results.locator("#kill-results-summary")).to_have_text(re.compile(
            r"; 0 order cancels, 0 flatten orders sent\. Recorded as desk_kill_"))
        assert len(bodies) == 1 and '"flatten":true' in (bodies[0] or "").replace(" ", "")
        await results.get_by_role("button", name="Close").click()

        await stop_all.click()  # the box is unticked again for the next kill
        await expect(flatten).not_to_be_checked()
        await confirm.get_by_role("button", name="Cancel").click()

        async with http(running) as client:
            found = (await client.get("/api/events", params={"type": "DeskKilled"})).json()
        [event] = found["events"]
        assert event["data"]["flatten"] is True
        assert {a["flattenNote"] for a in event["data"]["agents"]} == {
            "nothing to flatten: no open position, no open order and no order waiting for "
            "approval"}
