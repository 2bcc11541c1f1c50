"""What misled a trader (issue 27 item 8), each fixed with a test that failed before: a
no-trade cooldown told apart from a budget suppression; a wait at the gate that is never a
green ACTIVE badge and follows the gate at once; the agent page no wider than the window; an
event's detail brought into view on a phone; an unknown agent with no controls; a summary
line that counts what the rows say; 24-hour times that name their zone; a diff in words.
Screenshots: ``mislead-*``."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from gateway.edge.server import Running
from tests.browser.conftest import ZONED, OpenPanel, fits, resize, screenshot
from tests.browser.live import (
    ADMIN,
    CONTROL,
    agent,
    http,
    live_gateway,
    panel_config,
    request,
    state_is,
    submit,
)
from tests.browser.test_capacity_panel import TEXTS


async def one_at_a_time(running: Running) -> None:
    """The simulated provider lets one call through at a time."""
    async with http(running, ADMIN) as admin:
        limited = await admin.post("/api/providers/sim-llm/limits", json={"maxConcurrent": 1})
        assert limited.status_code == 200, limited.text


async def test_a_no_trade_cooldown_is_its_own_tag_and_count_not_a_budget_suppression(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "cool.db"
    cool = agent("cool", (10, 20), budgets={"no_trade_cooldown_ms": 120_000})
    cool["reasoner"]["trade_probability"] = 0.0
    async with live_gateway(panel_config(db, [cool], hooked=[]), db, feed=False) as running:
        await submit(running, request("cool"))
        await state_is(running, "cool", lambda s: s.counters.runs == 1 and s.active is None,
                       "a no-trade run done")
        await submit(running, request("cool"))  # waits for the cooldown
        await state_is(running, "cool", lambda s: s.suppressed is not None, "runs wait")
        page = await open_panel(running.url, CONTROL)
        await resize(page, 1280, 800)
        row = page.locator('#agents-table tr[data-agent="cool"]')
        await expect(row.locator('td[data-col="run"] .tag')).to_have_text("cooldown")
        await expect(row.locator('td[data-col="suppressions"]')).to_have_text("0")
        await expect(row.locator(".state")).to_have_text("COOLDOWN")
        await expect(row.locator('td[data-col="why"]')).to_contain_text("Cooldown until")
        await screenshot(page, "mislead-cooldown-1280")
        await page.goto(f"{running.url}/#/agent/cool")
        await expect(page.locator("#cooldowns")).to_have_text("1")
        await expect(page.locator("#budget-suppressions")).to_have_text("0")
        await resize(page, 390, 844)
        await page.goto(f"{running.url}/#/overview")
        card = page.locator('#agent-cards li[data-agent="cool"]')
        await expect(card.locator(".state")).to_have_text("COOLDOWN")
        await screenshot(page, "mislead-cooldown-390")


async def test_a_short_wait_at_the_gate_is_no_green_badge_and_its_row_follows_the_gate(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "gate.db"
    config = panel_config(db, [agent("alpha", (60_000, 60_000)), agent("golf", (60_000, 60_000)),
                               agent("hotel", (60_000, 60_000))], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        await one_at_a_time(running)
        page = await open_panel(running.url, CONTROL)
        await resize(page, 1280, 800)
        await submit(running, request("alpha"))
        await state_is(running, "alpha", lambda s: s.active is not None, "alpha runs")
        await submit(running, request("golf"))
        waiting_since = time.monotonic()
        golf = page.locator('#agents-table tr[data-agent="golf"]')
        why = golf.locator('td[data-col="why"]')
        await expect(why).to_contain_text("Waiting on provider sim-llm")
        await expect(golf.locator(".state")).to_have_text("WAITING")  # under 10 s: not green
        colour = "el => getComputedStyle(el).color"
        alpha_badge = page.locator('#agents-table tr[data-agent="alpha"] .state')
        await expect(alpha_badge).to_have_text("ACTIVE")
        assert await golf.locator(".state").evaluate(colour) != await alpha_badge.evaluate(colour)
        await expect(why).not_to_contain_text("behind another agent")
        await screenshot(page, "mislead-gate-wait-1280")

        # Right after the page's periodic full read, hotel's urgent call jumps ahead of golf's:
        # golf's row says so at once (not at the next full read, seconds later), with its
        # wait counted from when it began (no restart at zero).
        async with page.expect_request(lambda r: r.url.endswith("/api/agents")):
            pass
        await submit(running, request("hotel", priority="high"))
        await expect(why).to_contain_text("(behind another agent)", timeout=1_500)
        text = await why.inner_text()
        shown = re.search(r"· ([\d.]+) s$", text)
        assert shown is not None, text
        assert float(shown.group(1)) >= time.monotonic() - waiting_since - 1.5, text
        await resize(page, 390, 844)
        card = page.locator('#agent-cards li[data-agent="golf"]')
        await expect(card.locator(".state")).to_have_text("WAITING")
        await screenshot(page, "mislead-gate-wait-390")


async def test_the_agent_page_is_no_wider_than_the_window_with_pending_requests(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "wide.db"
    busy = "momentum_scalper_btcusd_5m_with_a_long_name"
    config = panel_config(db, [agent(busy, (60_000, 60_000))], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        for n in range(5):  # as the demo's hook rules send them
            body = request(busy, dedupeKey=f"btc_64k:BTCUSD:64000.0:down:2026-11-29T06:12:3{n}.41Z")
            body["requestId"] = f"hk_4bb7b6e4094bd2fa3d3b265{n}"
            await submit(running, body)
        page = await open_panel(running.url, CONTROL)
        for width, height in ((1280, 800), (390, 844)):
            await resize(page, width, height)
            await page.goto(f"{running.url}/#/agent/{busy}")
            await expect(page.locator("#pending-table tr[data-request-id]")).to_have_count(4)
            await fits(page, width)
            # (in the page, at once: the table is drawn again as the agent's status comes,
            # and a scroll by locator then met a detached element once)
            await page.evaluate("document.querySelector('#pending-table')"
                                ".scrollIntoView({block: 'nearest'})")
            await screenshot(page, f"mislead-pending-{width}")


async def test_on_a_phone_an_events_detail_is_brought_into_view(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "events.db"
    async with live_gateway(panel_config(db, [agent("alpha", (10, 20))], hooked=[]), db,
                            feed=False) as running:
        await submit(running, request("alpha"))
        page = await open_panel(running.url, CONTROL)
        await resize(page, 390, 844)
        await page.get_by_role("link", name="Event log").click()
        row = page.locator("#event-list .row").first
        await row.click()
        await expect(page.locator("#event-detail-title")).to_have_text(re.compile(r"^Event \d+: "))
        await expect(page.locator("#event-detail-title")).to_be_in_viewport()
        await screenshot(page, "mislead-event-detail-390")
        await resize(page, 1280, 800)
        await page.locator("#event-list .row").nth(1).click()
        await expect(page.locator("#event-detail-title")).to_be_in_viewport()
        await screenshot(page, "mislead-event-detail-1280")


async def test_an_unknown_agent_id_says_so_and_offers_no_control(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "unknown.db"
    async with live_gateway(panel_config(db, [agent("alpha")], hooked=[]), db,
                            feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        for width, height in ((1280, 800), (390, 844)):
            await resize(page, width, height)
            await page.evaluate("location.hash = '#/agent/no_such_desk'")
            await expect(page.locator("#no-such-agent")).to_contain_text(
                "No such agent: “no_such_desk”")
            await expect(page.locator("#agent-view [data-mutating]")).to_have_count(0)
            controls = page.get_by_role("toolbar", name="Controls for no_such_desk")
            await expect(controls).to_have_count(0)
            await screenshot(page, f"mislead-unknown-agent-{width}")
            await page.evaluate("location.hash = '#/overview'")
        # A page opened at that address (before the agents are known) says the same.
        await page.goto(f"{running.url}/#/agent/no_such_desk")
        await page.reload()
        await expect(page.locator("#no-such-agent")).to_be_visible()
        await expect(page.locator("#agent-view [data-mutating]")).to_have_count(0)
        await page.evaluate("location.hash = '#/agent/alpha'")  # a real one still has them
        await expect(page.get_by_role("toolbar", name="Controls for alpha")).to_be_visible()


async def test_the_summary_line_counts_the_states_the_rows_show(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "summary.db"
    config = panel_config(db, [
        agent("alpha", (60_000, 60_000)), agent("golf", (60_000, 60_000)),
        agent("mike", (10, 10), budgets={"max_runs_per_hour": 1}), agent("zulu")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        await one_at_a_time(running)
        for agent_id in ("mike", "mike", "alpha", "golf"):
            await submit(running, request(agent_id))
        async with http(running) as client:
            stopped = await client.post("/api/agents/zulu/control",
                                        json={"action": "emergency_stop"})
            assert stopped.status_code == 200, stopped.text
        page = await open_panel(running.url, CONTROL)
        await resize(page, 1280, 800)
        summary = page.locator("#overview-view .summary")
        await expect(page.locator('tr[data-agent="golf"] .state')).to_have_text("WAITING")
        await expect(page.locator('tr[data-agent="mike"] .state')).to_have_text("SUPPRESSED")
        await expect(summary).to_contain_text(
            "4 agents · 1 active · 1 waiting · 1 suppressed · 0 reducing · 1 halted")
        badges = await page.locator("#agents-table tbody .state").all_text_contents()
        assert sorted(badges) == ["ACTIVE", "HALTED", "SUPPRESSED", "WAITING"], badges
        await screenshot(page, "mislead-summary-1280")
        await resize(page, 390, 844)
        await expect(summary).to_contain_text("1 active · 1 waiting · 1 suppressed")
        await screenshot(page, "mislead-summary-390")


async def test_times_are_24_hour_and_name_their_zone_schedules_included(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "times.db"
    audited = agent("audited", (10, 20), schedules=[{"id": "audit", "every_ms": 3_600_000}])
    async with live_gateway(panel_config(db, [audited], hooked=[]), db, feed=False) as running:
        await submit(running, request("audited"))
        async with http(running) as client:
            stopped = await client.post("/api/agents/audited/control",
                                        json={"action": "emergency_stop"})
            assert stopped.status_code == 200, stopped.text
        # Half past midday in Kolkata is always in the afternoon somewhere: no AM or PM.
        page = await open_panel(running.url, CONTROL, timezone_id="Asia/Kolkata")
        await resize(page, 1280, 800)
        zoned = r"(\d{1,2} [A-Z][a-z]{2} )?\d\d:\d\d:\d\d GMT\+5:30"
        await expect(page.locator('tr[data-agent="audited"] .why-text')).to_have_text(
            re.compile(rf"^HALTED by ops at {zoned}$"))
        await page.goto(f"{running.url}/#/agent/audited")
        schedule = page.locator('#schedules li[data-schedule="audit"]')
        await expect(schedule.locator(".next-fire")).to_have_text(re.compile(rf"^next {zoned}$"))
        await expect(schedule).not_to_contain_text(re.compile(r"\b(AM|PM)\b"))
        await expect(page.locator("#runs-table thead")).to_contain_text("Started (GMT+5:30)")
        await expect(page.locator('#runs-table [data-col="started"]').first).to_contain_text(
            re.compile(zoned))
        await expect(page.locator("#control-actions li").first).to_contain_text(
            re.compile(r"\d\d:\d\d:\d\d\.\d{3} GMT\+5:30"))
        await schedule.scroll_into_view_if_needed()
        await screenshot(page, "mislead-times-1280")
        await resize(page, 390, 844)
        await schedule.scroll_into_view_if_needed()
        await expect(schedule.locator(".next-fire")).to_be_in_viewport()
        await screenshot(page, "mislead-times-390")
        assert re.fullmatch(ZONED, "14:05:00 GMT+5:30")


async def axis_labels(page: Page, canvas: str) -> list[str]:
    """The time axis's labels a canvas chart drew, left to right (those under the plot)."""
    await expect(page.locator(f"#{canvas}")).to_have_attribute("aria-label", re.compile(":"))
    texts: list[dict[str, Any]] = await page.evaluate(f"window.__texts[{canvas!r}] || []")
    bottom = max(t["y"] for t in texts)
    return [t["text"] for t in sorted((t for t in texts if t["y"] == bottom and
                                       t["baseline"] == "top"), key=lambda t: t["x"])]


async def test_every_chart_axis_names_its_zone(tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "axes.db"
    async with live_gateway(panel_config(db, [agent("axed", (10, 20))], hooked=[]), db,
                            feed=False) as running:
        for _ in range(3):
            await submit(running, request("axed"))
        page = await open_panel(running.url, CONTROL, timezone_id="Asia/Kolkata",
                                init_script=TEXTS)
        await resize(page, 1280, 800)
        hm = r"\d\d:\d\d(:\d\d)?"
        await page.get_by_role("link", name="Charts").click()
        await page.locator("#chart-range").select_option(label="last 15 minutes")
        labels = await axis_labels(page, "chart-runs")
        assert len(labels) >= 2 and re.fullmatch(rf"{hm} GMT\+5:30", labels[0]), labels
        assert all(re.fullmatch(hm, label) for label in labels[1:]), labels
        await expect(page.locator("#charts-status")).to_contain_text(
            re.compile(r"read at \d\d:\d\d:\d\d GMT\+5:30"))
        runs = page.locator("#chart-runs")
        await runs.hover()
        await expect(page.locator("#chart-tip strong")).to_have_text(
            re.compile(r"\d\d:\d\d:\d\d\u2013\d\d:\d\d:\d\d GMT\+5:30$"))
        await screenshot(page, "mislead-axis-zone-charts")

        await page.get_by_role("link", name="Capacity").click()
        labels = await axis_labels(page, "capacity-depth")
        assert len(labels) >= 2 and re.fullmatch(rf"{hm} GMT\+5:30", labels[0]), labels
        assert all(re.fullmatch(hm, label) for label in labels[1:]), labels
        await expect(page.locator("#capacity-status")).to_contain_text(
            re.compile(r"read at \d\d:\d\d:\d\d GMT\+5:30"))

        for width, height in ((1280, 800), (390, 844)):
            await resize(page, width, height)
            await page.goto(f"{running.url}/#/agent/axed")
            ticks = page.locator("#travel-axis text.tick")
            await expect(ticks.first).to_have_text(re.compile(r"GMT\+5:30$"))
            shown = await ticks.all_text_contents()
            assert len(shown) >= 2 and all("GMT" not in t for t in shown[1:]), shown
            await fits(page, width)
        await page.locator("#travel-axis").scroll_into_view_if_needed()
        await screenshot(page, "mislead-axis-zone-travel-390")


async def test_the_diff_of_two_positions_says_what_changed_in_words(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "diff.db"
    async with live_gateway(panel_config(db, [agent("alpha", (10, 20))], hooked=[]), db,
                            feed=False) as running:
        await submit(running, request("alpha"))
        await state_is(running, "alpha", lambda s: s.counters.completed == 1, "a run done")
        async with http(running) as client:
            stopped = await client.post("/api/agents/alpha/control",
                                        json={"action": "emergency_stop"})
            assert stopped.status_code == 200, stopped.text
        page = await open_panel(running.url, CONTROL)
        for width, height in ((1280, 800), (390, 844)):
            await resize(page, width, height)
            await page.goto(f"{running.url}/#/agent/alpha")
            await page.reload()
            slider = page.get_by_label("Log position of alpha")
            await expect(slider).not_to_have_attribute("max", "0")
            await slider.focus()
            await page.keyboard.press("Home")
            await page.get_by_role("button", name="Compare from here").click()
            await slider.focus()
            await page.keyboard.press("End")
            await page.get_by_role("button", name="Compare to here").click()
            table = page.locator("#diff-table")
            await expect(table.locator('tr[data-what="controls applied"] td')).to_have_text(
                ["0", "1"])
            await expect(table.locator('tr[data-what="runs completed"] td')).to_have_text(
                ["0", "1"])
            whats = await table.locator("tbody th").all_text_contents()
            assert whats and not [w for w in whats if w.startswith("counter ") or "_" in w], whats
            await page.locator("#travel-diff").scroll_into_view_if_needed()
            await screenshot(page, f"mislead-diff-{width}")
