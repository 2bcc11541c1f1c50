"""The panel's call tree: a request that fans out to other agents, shown as a tree."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import expect

from tests.browser.conftest import OpenPanel, screenshot
from tests.browser.live import VIEWER, agent, live_gateway, panel_config, request, submit


async def test_an_agents_call_tree_is_shown_with_each_calls_status_and_its_own_calls(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    desk = agent("desk", (50, 100))
    desk["reasoner"]["calls"] = [{"agent": "alpha", "payload": {"q": "view?"}},
                                 {"agent": "bravo"}]
    alpha = agent("alpha", (50, 100))
    alpha["reasoner"].update(calls=[{"agent": "bravo", "count": 2}], call_below_depth=2)
    db = tmp_path / "panel.db"
    config = panel_config(db, [desk, alpha, agent("bravo", (50, 100))], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, VIEWER)
        await page.goto(f"{running.url}/#/agent/desk")
        await submit(running, request("desk", "user_control", payload={"message": "ask"}))
        tree = page.locator("#call-tree")
        await expect(tree.locator('[data-status="returned"]')).to_have_count(4)
        run = tree.locator('[data-run="desk-r1"]')
        await expect(run).to_contain_text("made 2 calls")
        alpha_call = run.locator('[data-call="desk-r1-c1"]')
        await expect(alpha_call).to_contain_text("alpha")
        await expect(alpha_call.locator("[data-call]")).to_have_count(2)  # alpha's own calls
        await expect(page.locator("#call-counts")).to_have_text("4 calls in 1 run: 4 returned")
        await screenshot(page, "calls", full_page=True)
