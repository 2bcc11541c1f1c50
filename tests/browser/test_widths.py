"""Every width: the overview keeps each agent's name and Stop in view at a desktop's 1280 px
and on a tablet scrolled sideways; a phone (390 px) gets one card per agent instead of a
wide table; the time-travel section stays inside its own box at every width."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.async_api import Locator, Page, expect

from gateway.config import GatewayConfig
from tests.browser.conftest import ZONED, OpenPanel, resize, screenshot
from tests.browser.live import CONTROL, agent, live_gateway, panel_config, request, submit

AGENTS = ["alpha", "momentum_scalper_btcusd_5m_with_a_long_name", "mean_reversion_eth",
          "news_sentiment_watcher", "zulu"]
FIRST, LAST = AGENTS[0], sorted(AGENTS)[-1]
Box = dict[str, float]


def desk(db: Path) -> GatewayConfig:
    """The long-named agent's runs take 30 s: what it is sent waits in its queue."""
    return panel_config(db, [agent(a, (30_000, 30_000) if a == AGENTS[1] else (200, 600))
                             for a in AGENTS], hooked=[])


async def box(locator: Locator) -> Box:
    found = await locator.bounding_box()
    assert found is not None, locator
    return {"x": found["x"], "y": found["y"], "width": found["width"], "height": found["height"]}


def inside(inner: Box, outer: Box, slack: float = 1.0) -> bool:
    return (inner["x"] >= outer["x"] - slack and inner["y"] >= outer["y"] - slack
            and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + slack
            and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + slack)


def overlap(a: Box, b: Box) -> bool:
    return (a["x"] < b["x"] + b["width"] - 1 and b["x"] < a["x"] + a["width"] - 1
            and a["y"] < b["y"] + b["height"] - 1 and b["y"] < a["y"] + a["height"] - 1)



async def name_and_stop_in_view(page: Page, agent_id: str) -> None:
    """The agent's name and Stop in the overview table, shown (not under another cell) and
    inside both the window and the table's scrolling box."""
    row = page.locator(f'#agents-table tr[data-agent="{agent_id}"]')
    scroller = await box(page.locator("#agents-scroller"))
    window: Box = {"x": 0, "y": 0, **(page.viewport_size or {})}  # type: ignore[dict-item]
    for target in (row.get_by_role("link", name=agent_id),
                   row.get_by_role("button", name=f"Emergency stop {agent_id}")):
        await expect(target).to_be_in_viewport()
        found = await box(target)
        assert inside(found, scroller) and inside(found, window), (agent_id, found, scroller)
        assert await on_top(target), (agent_id, await target.inner_text())


async def on_top(target: Locator) -> bool:
    """Whether what is drawn at the element's middle is itself (not a cell or a header over
    it)."""
    hit: bool = await target.evaluate("""e => { const r = e.getBoundingClientRect();
        const top = document.elementFromPoint(r.x + Math.min(8, r.width / 2),
                                              r.y + r.height / 2);
        return e === top || e.contains(top); }""")
    return hit


async def test_at_1280_px_and_scrolled_sideways_each_agent_keeps_its_name_and_stop_in_view(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        await resize(page, 1280, 800)
        await expect(page.locator("#agents-table tbody tr[data-agent]")).to_have_count(len(AGENTS))
        for agent_id in (FIRST, LAST):
            await name_and_stop_in_view(page, agent_id)
        await screenshot(page, "overview-1280")
        await resize(page, 900, 800)  # a tablet: the table scrolls sideways
        scroller = page.locator("#agents-scroller")
        wide: Any = await scroller.evaluate("s => [s.scrollWidth, s.clientWidth]")
        assert wide[0] > wide[1] + 100, wide
        for left in ("0", "s.scrollWidth / 2", "s.scrollWidth"):
            await scroller.evaluate(f"s => {{ s.scrollLeft = {left}; }}")
            for agent_id in (FIRST, LAST):
                await name_and_stop_in_view(page, agent_id)
        await screenshot(page, "overview-900-scrolled")


async def test_a_phone_gets_a_card_per_agent_with_its_name_state_reason_and_stop(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        await resize(page, 390, 844)
        cards = page.locator("#agent-cards li.agent-card")
        await expect(cards).to_have_count(len(AGENTS))
        await expect(page.locator("#agents-scroller")).to_be_hidden()
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        window: Box = {"x": 0, "y": 0, "width": 390, "height": 1e6}
        for agent_id in (FIRST, LAST):
            card = page.locator(f'#agent-cards li[data-agent="{agent_id}"]')
            await card.scroll_into_view_if_needed()
            name = card.get_by_role("link", name=agent_id)
            stop = card.get_by_role("button", name=f"Emergency stop {agent_id}")
            for target in (name, stop, card.locator(".state")):
                await expect(target).to_be_in_viewport()
                assert inside(await box(target), window)
            await expect(card.locator(".card-why")).to_have_text("Idle")
            # the header scrolled away: the kill switch for every agent is still in reach
            stop_all = page.get_by_role("button", name="Emergency stop all")
            await expect(stop_all).to_be_in_viewport()
            assert await on_top(stop_all)
        zulu = page.locator('#agent-cards li[data-agent="zulu"]')
        await zulu.get_by_role("button", name="Emergency stop zulu").click()
        await page.locator("#confirm").get_by_role("button", name="Emergency stop").click()
        await expect(zulu.locator(".state")).to_have_text("HALTED")
        await expect(zulu.locator(".card-why")).to_have_text(
            re.compile(rf"^HALTED by ops at {ZONED}$"))
        await expect(zulu.get_by_role("button", name="Resume zulu")).to_be_visible()
        await expect(zulu).to_have_class("agent-card halted")
        await page.evaluate("window.scrollTo(0, 0)")
        await screenshot(page, "overview-390", full_page=True)
        # The agent page on the phone: scrolled to its end, its name and stop stay pinned.
        await page.get_by_role("link", name=FIRST, exact=True).click()
        await expect(page.locator("#agent-title")).to_have_text(FIRST)
        await expect(page.locator("section.timeline")).to_be_visible()
        await page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        await expect(page.locator("#agent-title")).not_to_be_in_viewport()
        toolbar = page.get_by_role("toolbar", name=f"Controls for {FIRST}")
        await expect(toolbar.get_by_text(f"{FIRST}:")).to_be_in_viewport()
        stop = toolbar.get_by_role("button", name=f"Emergency stop {FIRST}")
        await expect(stop).to_be_in_viewport()
        assert await on_top(stop)  # not under the header
        assert await on_top(page.get_by_role("button", name="Emergency stop all"))
        await screenshot(page, "agent-390-scrolled")
        await page.get_by_role("link", name="Overview").click()
        await resize(page, 1280, 800)  # wide again: the table is back
        await expect(page.locator('#agents-table tr[data-agent="zulu"] .state')).to_have_text(
            "HALTED")
        await expect(page.locator("#agent-cards")).to_be_hidden()


async def test_the_time_travel_section_stays_in_its_box_at_every_width(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    long_id = AGENTS[1]
    async with live_gateway(desk(db), db, feed=False) as running:
        for _ in range(3):
            await submit(running, request(long_id, "user_control",
                                          payload={"message": "a long message " * 20}))
        page = await open_panel(running.url, CONTROL)
        await page.get_by_role("link", name=long_id).first.click()
        slider = page.get_by_label(f"Log position of {long_id}")
        await expect(slider).not_to_have_attribute("max", "0")  # the agent's log has loaded
        await slider.focus()
        await page.keyboard.press("End")
        await page.keyboard.press("ArrowLeft")  # the queue as it was: pending, a run, events
        replay = page.locator("#replay")
        await expect(replay).to_have_attribute("data-position", re.compile(r"^\d+$"))
        await expect(replay.locator("#replay-pending tr[data-request-id]")).not_to_have_count(0)
        for width, height in ((1280, 800), (900, 800), (390, 844)):
            await resize(page, width, height)
            await page.evaluate("window.scrollTo(0, 0)")  # the sticky controls where they sit
            section = page.locator("section.timeline")
            outer = await box(section)
            assert outer["x"] >= 0 and outer["x"] + outer["width"] <= width + 1, (width, outer)
            # Nothing of it is drawn outside its box (what is wider scrolls inside it) ...
            spill: Any = await section.evaluate("""s => { const r = s.getBoundingClientRect();
                const out = [...s.querySelectorAll('*')].filter(e => {
                  const b = e.getBoundingClientRect();
                  if (!b.width || !b.height) return false;
                  let p = e.parentElement, clipped = false;
                  while (p && p !== s && !clipped) {
                    clipped = getComputedStyle(p).overflowX !== 'visible';
                    p = p.parentElement; }
                  return !clipped && (b.right > r.right + 1 || b.left < r.left - 1); });
                return out.map(e => e.tagName + '#' + e.id + '.' + e.className); }""")
            assert spill == [], (width, spill)
            # ... and no neighbour is covered by it.
            for other in await page.locator("#agent-view > *:not(section.timeline)").all():
                if await other.is_visible():
                    assert not overlap(outer, await box(other)), (width, await other.evaluate(
                        "e => e.tagName + '.' + e.className"))
            await replay.scroll_into_view_if_needed()
            await screenshot(page, f"time-travel-{width}")
