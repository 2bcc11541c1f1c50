"""The panel reviewed as a trader would, at 1920, 1280, 1024 and 390 px (issue 27), on a desk
with something in every view (`tests.browser.review_scene`), each fix with a test that failed
before: no view makes the page scroll sideways (a long agent id in a select or the charts'
agent picker, feed health's tables on a phone did); the blotter's headings sit as their
columns do ("Agent" was right-aligned, being read as "age"); the event log shows each event's
type whole, and on a phone its type and words (they were cut off at the list's edge); the
confirm dialogs fit a phone; a run's drill-down no longer heads "0 model calls" over "One model
call"; no capacity chart labels two steps of its axis alike (a gate
wait of 0 ms read "0 ms, 0 ms, 1 ms, 1 ms, 1 ms"). Screenshots: ``review-*``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

from playwright.async_api import Page, expect

from gateway.edge.server import Running
from tests.browser.conftest import OpenPanel, fits, resize, screenshot
from tests.browser.live import CONTROL, live_gateway
from tests.browser.review_scene import LONG, WIDTHS, review_config, scene
from tests.browser.test_capacity_panel import TEXTS

READY = {
    "#/overview": "#agents-table tbody tr[data-agent]",
    "#/agent/alpha": "#runs-table tbody tr",
    "#/agent/scheduled": '#schedules li[data-schedule]',
    f"#/agent/{LONG}": "#runs-table",
    "#/agent/alpha?order=alpha-r2-o1": "#drill-life > li",
    "#/agent/alpha?run=alpha-r2": "#drill-steps",
    "#/agent/alpha?at=5": "#travel-axis text.tick",
    "#/blotter": '#desk-blotter [data-part="fills"] tbody tr',
    "#/capacity": "#capacity-status:not(:text('Loading…'))",
    "#/charts": "#charts-status:not(:text('Loading…'))",
    "#/providers": "#providers-view h2",
    "#/events": "#event-list .row",
    "#/feed": '#feed-health [data-connector="binance-ws"]',
    "#/alerts": "#alerts-status:not(:text('Loading…'))",
}
"""Every view (and the agent page's drill-down, time travel and schedules), and what shows
once it has loaded."""


async def view(page: Page, url: str, hash_: str) -> None:
    await page.goto(f"{url}/{hash_}")
    await expect(page.locator(READY[hash_]).first).to_be_attached()


@contextlib.asynccontextmanager
async def reviewed(tmp_path: Path, open_panel: OpenPanel, width: int, height: int,
                   init_script: str | None = None) -> AsyncIterator[tuple[Running, Page]]:
    """The review desk, its scene played, and the panel open on it at ``width``."""
    db = tmp_path / "review.db"
    async with live_gateway(review_config(db), db, feed=False) as running:
        await scene(running)
        page = await open_panel(running.url, CONTROL, init_script=init_script)
        await resize(page, width, height)
        yield running, page


async def test_no_view_scrolls_the_page_sideways_at_any_width(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    async with reviewed(tmp_path, open_panel, *WIDTHS[0]) as (running, page):
        for width, height in WIDTHS:
            await resize(page, width, height)
            for hash_ in READY:
                await view(page, running.url, hash_)
                await fits(page, width)
            await screenshot(page, f"review-alerts-{width}", full_page=True)
        await view(page, running.url, "#/feed")  # (at 390: one card per connector)
        await expect(page.locator("#feed-status")).to_contain_text("1 connector · 1 symbol ·")
        await screenshot(page, "review-feed-390", full_page=True)
        await view(page, running.url, "#/agent/alpha?run=alpha-r2")  # (one model call, no step)
        await expect(page.locator("#drill")).to_contain_text(
            "Messages and tool steps (not recorded)One model call, no tool step recorded.")
        for hash_ in ("#/blotter", "#/charts", "#/events"):
            await view(page, running.url, hash_)
            await screenshot(page, f"review-{hash_[2:]}-390", full_page=True)


async def test_the_blotters_headings_sit_as_their_columns_do(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    async with reviewed(tmp_path, open_panel, 1280, 800) as (running, page):
        await view(page, running.url, "#/blotter")
        tables = page.locator("#desk-blotter table.blotter-table")
        await expect(tables).to_have_count(4)  # (open orders, positions, fills, rejections)
        misplaced = await tables.evaluate_all("""tables => tables.flatMap((table) => {
            const cells = [...table.tBodies[0].rows[0].cells];
            return [...table.tHead.rows[0].cells].flatMap((th, i) => {
              const a = getComputedStyle(th).textAlign, b = getComputedStyle(cells[i]).textAlign;
              const where = `${table.ariaLabel}: ${th.textContent}`;
              return (a === "right") === (b === "right") ? [] : [where];
            });
        })""")
        assert misplaced == [], misplaced
        await page.locator('#desk-blotter [data-part="positions"]').scroll_into_view_if_needed()
        await screenshot(page, "review-blotter-1280")


async def cut_types(page: Page) -> list[str]:
    """The event types the event log's rows show cut short."""
    cut: list[str] = await page.locator("#event-list .row .type").evaluate_all(
        "spans => spans.filter((s) => s.scrollWidth > s.clientWidth).map((s) => s.textContent)")
    return cut


async def test_on_a_phone_the_event_log_shows_each_events_type_and_words(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    async with reviewed(tmp_path, open_panel, 1280, 800) as (running, page):
        await view(page, running.url, "#/events")
        await expect(page.locator('#event-list .row[data-type="SteerabilityChanged"]').first
                     ).to_be_attached()
        assert await cut_types(page) == []  # (at 1280 px: every type whole)
        await resize(page, 390, 844)
        await view(page, running.url, "#/events")
        row = page.locator('#event-list .row[data-type="ControlApplied"]').first
        await expect(row).to_be_visible()
        box = await page.locator("#event-list").bounding_box()
        assert box is not None
        for part in (".type", ".what"):
            shown = await row.locator(part).bounding_box()
            assert shown is not None and shown["width"] > 40, part
            assert shown["x"] + shown["width"] <= box["x"] + box["width"], (part, shown, box)
        await expect(row.locator(".what")).to_have_text(re.compile("ACTIVE → HALTED"))
        assert await cut_types(page) == []
        await row.click()  # (a row of three lines is picked as one of one)
        await expect(page.locator("#event-detail")).to_contain_text("ControlApplied")
        await fits(page, 390)
        await screenshot(page, "review-events-390")


async def test_no_capacity_chart_labels_two_steps_of_its_axis_alike(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    # (no run waited at the gate: its waits are all 0 ms)
    async with reviewed(tmp_path, open_panel, 1280, 800, TEXTS) as (running, page):
        await view(page, running.url, "#/capacity")
        for key in ("depth", "latency", "waiting", "waits", "rpm", "tpm"):
            canvas = f"capacity-{key}"
            await expect(page.locator(f"#{canvas}")).to_have_attribute("aria-label",
                                                                        re.compile(":"))
            texts = await page.evaluate(f"window.__texts[{canvas!r}] || []")
            steps = [t["text"] for t in texts if t["align"] == "right"]  # (the y axis)
            assert len(steps) == 5 and len(set(steps)) == 5, (key, steps)
        await page.locator("#capacity-waits").scroll_into_view_if_needed()
        await screenshot(page, "review-capacity-waits")


async def test_on_a_phone_every_confirm_dialog_fits_the_screen(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    async with reviewed(tmp_path, open_panel, 390, 844) as (running, page):
        dialog = page.locator("#confirm")
        for hash_, opener in (
                ("#/overview", page.get_by_role("button", name="Emergency stop all")),
                ("#/blotter", page.locator('#desk-blotter [data-cancel-order="alpha-r1-o1"]')),
                ("#/agent/alpha", page.get_by_role("button", name="Emergency stop alpha"))):
            await view(page, running.url, hash_)
            await opener.first.click()
            await expect(dialog).to_be_visible()
            box = await dialog.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
            assert box["y"] >= 0 and box["y"] + box["height"] <= 844, box
            for button in await dialog.get_by_role("button").all():
                await expect(button).to_be_in_viewport()
            await screenshot(page, f"review-dialog-{hash_[2:].replace('/', '-')}-390")
            await page.keyboard.press("Escape")
            await expect(dialog).to_be_hidden()
