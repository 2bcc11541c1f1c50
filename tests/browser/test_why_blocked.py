"""Why an agent is blocked, and the kill switch's way back, in a real browser: each overview
row says in words why its agent does not run (those needing attention coloured and first),
the agent page says it at the top, a banner counts the halted agents on every view, and
resumes (from a row, or all after a confirm) say what they changed.
Screenshots: ``why-overview``, ``why-agent``, ``halted-banner``, ``halted-rows``."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.async_api import Page, expect

from gateway.config import validate_config
from gateway.edge.server import Running
from gateway.llm.fake_provider import Fault, FaultKind, create_fake_provider, serving
from tests.browser.conftest import ZONED, OpenPanel, screenshot
from tests.browser.live import (
    ADMIN,
    CONTROL,
    VIEWER,
    agent,
    http,
    live_gateway,
    panel_config,
    request,
    submit,
)

TIME = ZONED
WHY = 'td[data-col="why"] .why-text'
"""The words of a row's reason (a halted row has its Resume button before them)."""


async def rows_of(page: Page) -> list[str]:
    ids: list[str] = await page.locator("#agents-table tbody tr[data-agent]").evaluate_all(
        "rows => rows.map(r => r.dataset.agent)")
    return ids


async def control(running: Running, agent_id: str, action: str) -> None:
    async with http(running) as client:
        answer = await client.post(f"/api/agents/{agent_id}/control", json={"action": action})
        assert answer.json()["decision"] == "accepted", answer.text


async def test_each_row_says_why_its_agent_is_blocked_and_those_needing_attention_come_first(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "why.db"
    config = panel_config(db, [
        agent("alpha", (60_000, 60_000)),  # busy with one long run: healthy
        agent("bravo", (10, 10)),  # idle: healthy
        agent("golf", (60_000, 60_000)),  # waits for alpha's slot at the gate
        agent("mike", (10, 10), budgets={"max_runs_per_hour": 1}),  # suppressed by budget
        agent("zulu"),  # halted
    ], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        async with http(running, ADMIN) as admin:
            limited = await admin.post("/api/providers/sim-llm/limits", json={"maxConcurrent": 1})
            assert limited.status_code == 200, limited.text
        await control(running, "zulu", "emergency_stop")
        for agent_id in ("mike", "mike", "alpha", "golf"):
            await submit(running, request(agent_id))
        page = await open_panel(running.url, CONTROL)
        rows = page.locator("#agents-table tbody tr[data-agent]")
        zulu, mike = page.locator('tr[data-agent="zulu"]'), page.locator('tr[data-agent="mike"]')
        alpha = page.locator('tr[data-agent="alpha"]')
        await expect(zulu.locator(WHY)).to_have_text(
            re.compile(rf"^HALTED by ops at {TIME}$"))
        await expect(mike.locator(WHY)).to_have_text(
            re.compile(rf"^Suppressed by budget \(runs/hour\) until {TIME}$"))
        await expect(alpha.locator(WHY)).to_have_text(re.compile(r"^Running \d"))
        await expect(page.locator(f'tr[data-agent="bravo"] {WHY}')).to_have_text("Idle")
        await expect(page.locator(f'tr[data-agent="golf"] {WHY}')).to_have_text(
            re.compile(r"^Waiting on provider sim-llm: max concurrent calls · \d+\.\d s$"))

        # A suppressed agent does not wear the healthy green ACTIVE badge.
        await expect(mike.locator(".state")).to_have_text("SUPPRESSED")
        await expect(mike.locator(".state")).to_have_attribute("title", "trading state ACTIVE")
        await expect(alpha.locator(".state")).to_have_text("ACTIVE")
        colours = "el => getComputedStyle(el).backgroundColor"
        assert await mike.locator(".state").evaluate(colours) != \
            await alpha.locator(".state").evaluate(colours)
        await expect(mike).to_have_class("attention-warning")
        await expect(zulu).to_have_class("halted")
        assert await mike.evaluate(colours) != await alpha.evaluate(colours)

        # Attention first by default (halted, then warnings), then by name; other sorts remain.
        await expect(rows).to_have_count(5)
        assert await rows_of(page) == ["zulu", "mike", "alpha", "bravo", "golf"]
        await expect(page.locator('th[data-col="why"]')).to_have_attribute("aria-sort", "ascending")
        await page.get_by_role("button", name="Agent", exact=True).click()
        assert await rows_of(page) == ["alpha", "bravo", "golf", "mike", "zulu"]
        await page.get_by_role("button", name="Why / doing").click()
        assert await rows_of(page) == ["zulu", "mike", "alpha", "bravo", "golf"]
        await expect(alpha.locator(WHY)).to_have_text(re.compile(r"^Running \d"))
        await screenshot(page, "why-overview")

        # The agent page says the same at the top.
        await mike.get_by_role("link", name="mike").click()
        why = page.locator("#agent-why")
        await expect(why).to_have_attribute("data-attention", "warning")
        await expect(why.locator('[data-kind="suppressed"]')).to_have_text(
            re.compile(rf"^Suppressed by budget \(runs/hour\) until {TIME} · 1 waiting$"))
        await expect(page.locator(".agent-head .state")).to_have_text("SUPPRESSED")
        await screenshot(page, "why-agent")
        await page.goto(f"{running.url}/#/agent/zulu")
        await expect(why).to_have_attribute("data-attention", "critical")
        await expect(why.locator('[data-kind="halted"]')).to_have_text(
            re.compile(rf"^HALTED by ops at {TIME}$"))
        await expect(page.locator(".agent-head .state")).to_have_text("HALTED")


async def test_the_halted_banner_counts_and_resumes_say_what_they_changed(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "halted.db"
    config = panel_config(db, [agent("alpha", (10, 10)), agent("bravo", (60_000, 60_000)),
                               agent("charlie", (10, 10))], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        banner = page.locator("#halted-banner")
        await expect(page.locator("#agents-table tbody tr[data-agent]")).to_have_count(3)
        await expect(banner).to_be_hidden()

        await control(running, "alpha", "emergency_stop")
        await control(running, "bravo", "emergency_stop")
        for _ in range(3):  # queued while halted
            await submit(running, request("bravo"))
        await expect(banner).to_be_visible()
        await expect(banner).to_contain_text("■ 2 agents halted:")
        await expect(banner).to_contain_text(re.compile(rf"alpha by ops at {TIME}, bravo by ops"))
        await page.get_by_role("link", name="Provider gate").click()  # on every view
        await expect(banner).to_contain_text("2 agents halted")
        await screenshot(page, "halted-banner")
        await banner.get_by_role("link", name="Show halted").click()
        await expect(page.locator("#state-filter")).to_have_value("HALTED")
        assert await rows_of(page) == ["alpha", "bravo"]
        await expect(page.locator('tr[data-agent="alpha"] td[data-col="why"]').get_by_role(
            "button", name="Resume alpha")).to_be_in_viewport()  # next to the reason
        await screenshot(page, "halted-rows")

        # Resume from the row: the ack says the consequence.
        row = page.locator('tr[data-agent="bravo"]')
        await row.get_by_role("button", name="Resume bravo").click()
        await expect(page.locator(".toast .toast-text").last).to_have_text(
            "bravo resumed: HALTED → ACTIVE, run bravo-r1 started, 2 queued requests will run")
        await expect(banner).to_contain_text("■ 1 agent halted: alpha by ops")
        await expect(row).to_have_count(0)  # filtered out: no longer HALTED
        await page.locator("#state-filter").select_option("")
        await expect(page.locator('tr[data-agent="bravo"] .state')).to_have_text("ACTIVE")
        await expect(page.locator('tr[data-agent="bravo"]').get_by_role(
            "button", name="Resume bravo")).to_have_count(0)

        # Resume all, after a confirm; one of them was resumed elsewhere meanwhile.
        await control(running, "charlie", "emergency_stop")
        await expect(banner).to_contain_text("2 agents halted")
        await banner.get_by_role("button", name="Resume all").click()
        dialog = page.locator("#confirm")
        await expect(dialog).to_be_visible()
        await expect(dialog).to_contain_text("Resume all 2 halted agents?")
        await expect(dialog).to_contain_text("alpha, charlie go back to ACTIVE")
        await control(running, "charlie", "resume")
        await dialog.get_by_role("button", name="Resume all").click()
        toast = page.locator(".toast .toast-text").last
        await expect(toast).to_contain_text("Resumed 2 agents — alpha resumed: HALTED → ACTIVE, "
                                            "nothing queued")
        await expect(toast).to_contain_text("charlie was not halted (already ACTIVE): "
                                            "nothing changed")
        await expect(banner).to_be_hidden()
        await expect(banner.get_by_role("button", name="Resume all")).to_have_count(0)

        # A viewer sees the banner, and no control in it.
        await control(running, "alpha", "emergency_stop")
        viewer = await open_panel(running.url, VIEWER)
        await expect(viewer.locator("#halted-banner")).to_contain_text("1 agent halted")
        assert await viewer.locator("[data-mutating]").count() == 0


async def test_a_held_agent_says_the_providers_refusal_and_a_resume_from_its_row_lifts_it(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    fake = create_fake_provider()
    async with serving(fake) as url:
        db = tmp_path / "held.db"
        config = validate_config({
            "server": {"host": "127.0.0.1", "port": 0},
            "store": {"path": str(db), "synchronous": "NORMAL"},
            "tokens": [{"name": "ops", "token": CONTROL, "role": "control"}],
            "providers": [{"name": "claude", "kind": "anthropic", "model": "claude-test",
                           "api_key": "test-key", "base_url": url},
                          {"name": "sim-llm", "kind": "simulated"}],
            "agents": [agent("alpha", (10, 10)),
                       {"id": "hotel", "mode": "followup",
                        "reasoner": {"kind": "llm", "provider": "claude", "max_turns": 1,
                                     "max_tokens": 64}}],
        }, "<held test>")
        fake.fail_next(Fault(FaultKind.SPEND_LIMIT))
        async with live_gateway(config, db, feed=False) as running:
            await submit(running, request("hotel"))
            page = await open_panel(running.url, CONTROL)
            hotel = page.locator('tr[data-agent="hotel"]')
            await expect(hotel.locator(WHY)).to_have_text(
                "Held until resume: claude refused for spend")
            await expect(hotel.locator('td[data-col="why"]')).to_have_attribute(
                "title", re.compile(r"credit balance"))
            await expect(hotel.locator(".state")).to_have_text("HELD")
            await expect(hotel.locator(".state")).to_have_attribute(
                "title", "trading state REDUCING")
            await expect(hotel).to_have_class("reducing")
            assert await rows_of(page) == ["hotel", "alpha"]
            await screenshot(page, "held-overview")
            await page.goto(f"{running.url}/#/agent/hotel")
            await expect(page.locator('#agent-why [data-kind="held"]')).to_have_text(
                re.compile(r"^Runs held until resume: claude: .*credit balance"))
            await page.goto(f"{running.url}/#/overview")

            await hotel.get_by_role("button", name="Resume hotel").click()
            await expect(page.locator(".toast .toast-text").last).to_have_text(
                "hotel resumed: REDUCING → ACTIVE, runs no longer held, nothing queued")
            await expect(hotel.locator(".state")).to_have_text("ACTIVE")
            await expect(hotel.get_by_role("button", name="Resume hotel")).to_have_count(0)
            await expect(hotel.locator(WHY)).to_have_text(re.compile(r"^Idle$"))
