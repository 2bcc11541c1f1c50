"""Honest liveness in a real browser: a frozen gateway shows as stale within seconds (not
after the socket times out), every control says pending, then what it did — or that its
outcome is unknown — and toasts close, collapse and do not pile up."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from gateway.config import GatewayConfig
from tests.browser.conftest import OpenPanel, screenshot
from tests.browser.live import (
    CONTROL,
    TIMEOUT,
    agent,
    http,
    live_gateway,
    panel_config,
    relayed,
)

STALE = re.compile(r"^Stale · no heartbeat for \d+ s$")
STALE_WITHIN_MS = 7_000
"""Two and a half heartbeats (2 s each) and a little: the gateway's defaults."""


def desk(db: Path) -> GatewayConfig:
    """alpha and bravo idle unless asked; bravo's runs take 30 s."""
    return panel_config(db, [agent("alpha"), agent("bravo", (30_000, 30_000))], hooked=[])


async def agent_page(page: Page, agent_id: str) -> None:
    await page.get_by_role("link", name=agent_id, exact=True).first.click()
    await expect(page.locator("#agent-title")).to_have_text(agent_id)


async def test_a_frozen_gateway_shows_stale_within_seconds_and_live_again_when_it_thaws(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running, relayed(running) as relay:
        beats: list[dict[str, Any]] = []
        heard = asyncio.Event()

        def beat(payload: str | bytes) -> None:
            frame = json.loads(payload)
            if frame["type"] == "heartbeat":
                beats.append(frame)
                if len(beats) >= 3:
                    heard.set()

        page = await open_panel(relay.url, CONTROL,
                                on_websocket=lambda ws: ws.on("framereceived", beat))
        pill = page.locator("#connection")
        banner = page.locator("#banner")
        # A quiet desk (no feed): only heartbeats keep it live, past the stale threshold.
        await asyncio.wait_for(heard.wait(), TIMEOUT)
        await expect(pill).to_have_text("Connected · live")
        assert beats[-1]["committed"] == await running.service.engine.store.last_position()
        relay.freeze()
        await expect(pill).to_have_text(STALE, timeout=STALE_WITHIN_MS)  # not 25 s, nor 90
        await expect(page.locator("body")).to_have_attribute("data-connection", "stale")
        await expect(banner).to_be_visible()
        await expect(banner).to_contain_text("Figures shown may be out of date")
        summary = page.locator("#overview-view .summary")
        await expect(summary).to_have_css("opacity", "0.6")  # what is shown is marked
        await expect(pill).not_to_have_text("Stale · no heartbeat for 3 s")  # it counts on
        await screenshot(page, "stale-header")
        relay.thaw()
        await expect(pill).to_have_text("Connected · live")
        await expect(banner).to_be_hidden()
        await expect(summary).to_have_css("opacity", "1")


async def test_a_control_shows_pending_at_once_then_what_it_did(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running, relayed(running) as relay:
        async with http(running) as client:
            await client.post("/api/agents/bravo/requests", json={
                "requestId": "watch", "createdAt": "2026-01-01T00:00:00Z", "agentId": "bravo",
                "kind": "user_control", "payload": {"message": "watch BTC"}})
        page = await open_panel(relay.url, CONTROL)
        row = page.locator('tr[data-agent="bravo"]')
        await expect(row.locator('td[data-col="run"]')).to_contain_text("bravo-r1")
        relay.freeze()  # the answer is held: pending is all there is to say
        stop = row.get_by_role("button", name="Emergency stop bravo")
        await stop.click()
        await page.locator("#confirm").get_by_role("button", name="Emergency stop").click()
        toast = page.locator(".toast").last
        await expect(toast).to_have_text(re.compile("Emergency stop bravo: pending…"))
        await expect(stop).to_have_attribute("aria-busy", "true")
        relay.thaw()
        await expect(toast).to_contain_text("bravo ACTIVE → HALTED: run bravo-r1 aborted")
        await expect(toast).to_have_attribute("data-kind", "ok")
        await expect(stop).not_to_have_attribute("aria-busy", "true")
        await expect(row.locator(".state")).to_have_text("HALTED")


async def test_a_control_without_an_answer_says_its_outcome_is_unknown_then_the_late_answer(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running, relayed(running) as relay:
        page = await open_panel(relay.url, CONTROL)
        await agent_page(page, "alpha")
        await expect(page.locator("#pending-title")).to_contain_text("Pending")
        relay.freeze()
        await page.get_by_role("toolbar", name="Controls for alpha").get_by_role(
            "button", name="Pause alpha").click()
        result = page.locator("#control-result")
        await expect(result).to_have_text("Pause alpha: pending…")
        unknown = "Pause alpha: outcome unknown — check the agent's state (no answer in 5 s)"
        await expect(result).to_have_text(unknown)
        await expect(page.locator(".toast.bad")).to_have_text(re.compile(re.escape(unknown)))
        await screenshot(page, "control-outcome-unknown")
        relay.thaw()
        await expect(result).to_have_text("alpha ACTIVE → REDUCING (answered late)")
        await expect(page.locator(".toast").last).to_contain_text("(answered late)")


async def test_a_resume_of_an_active_agent_says_it_changed_nothing(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        await agent_page(page, "alpha")
        toolbar = page.get_by_role("toolbar", name="Controls for alpha")
        result = page.locator("#control-result")
        await toolbar.get_by_role("button", name="Resume alpha").click()
        await expect(result).to_have_text("alpha was already ACTIVE: nothing changed")
        await expect(page.locator(".toast").last).to_have_attribute("data-kind", "info")
        await toolbar.get_by_role("button", name="Pause alpha").click()
        await expect(result).to_have_text("alpha ACTIVE → REDUCING")
        await toolbar.get_by_role("button", name="Resume alpha").click()
        await expect(result).to_have_text("alpha REDUCING → ACTIVE")


async def test_toasts_close_by_hand_collapse_when_the_same_and_show_three_at_most(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        await agent_page(page, "alpha")
        await page.clock.install()  # the page's own timers, under the test's hand
        await page.reload()
        await expect(page.locator("#connection")).to_have_text("Connected · live")
        await expect(page.locator("#pending-title")).to_contain_text("Pending")
        # Paused: no toast expires by itself however slowly the machine clicks.
        await page.clock.pause_at(datetime.now(UTC) + timedelta(seconds=1))
        toolbar = page.get_by_role("toolbar", name="Controls for alpha")
        result = page.locator("#control-result")
        toasts = page.locator(".toast")
        said = ["alpha ACTIVE → REDUCING", "alpha was already REDUCING: nothing changed",
                "alpha REDUCING → ACTIVE", "alpha was already ACTIVE: nothing changed",
                "alpha was already ACTIVE: nothing changed"]
        for n, (action, words) in enumerate(zip(["Pause", "Pause", "Resume", "Resume", "Resume"],
                                                said, strict=True)):
            await toolbar.get_by_role("button", name=f"{action} alpha").click()
            await expect(result).to_have_text(words)
            if n == 3:  # four different notes: three shown, the oldest went
                await expect(toasts.locator(".toast-text")).to_have_text(said[1:4])
        # The same note again is one note with a count (its pending note took the place of
        # the oldest one).
        await expect(toasts.locator(".toast-text")).to_have_text(said[2:4])
        await expect(toasts.last.locator(".toast-count")).to_have_text("\u00d72")
        await screenshot(page, "toasts")
        close = toasts.last.get_by_role("button", name="Dismiss notification")
        await close.focus()
        await page.keyboard.press("Enter")  # by keyboard
        await expect(toasts.locator(".toast-text")).to_have_text(said[2:3])
        await toolbar.get_by_role("button", name="Resume alpha").click()
        await expect(toasts).to_have_count(2)
        await toasts.first.get_by_role("button", name="Dismiss notification").click()
        await expect(toasts.locator(".toast-text")).to_have_text(said[3:4])
        close = toasts.first.get_by_role("button", name="Dismiss notification")
        await expect(close).to_be_focused()  # the focus went to the next note, not nowhere
        await page.clock.run_for(20_000)
        await expect(toasts).to_have_count(1)  # not taken away while focused
        await page.locator("#agent-title").click()
        await page.clock.run_for(7_000)
        await expect(toasts).to_have_count(1)  # an "already ACTIVE" note stays 8 s
        await page.clock.run_for(2_000)
        await expect(toasts).to_have_count(0)


async def test_stop_all_says_how_many_agents_it_halted_and_which_were_halted_already(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(desk(db), db, feed=False) as running:
        async with http(running) as client:
            await client.post("/api/agents/bravo/requests", json={
                "requestId": "watch", "createdAt": "2026-01-01T00:00:00Z", "agentId": "bravo",
                "kind": "user_control", "payload": {"message": "watch BTC"}})
            await client.post("/api/agents/alpha/control", json={"action": "emergency_stop"})
        page = await open_panel(running.url, CONTROL)
        await expect(page.locator('tr[data-agent="bravo"] td[data-col="run"]')).to_contain_text(
            "bravo-r1")
        await page.get_by_role("button", name="Emergency stop all").click()
        await page.locator("#confirm").get_by_role("button", name="Stop all").click()
        await expect(page.locator(".toast").last).to_have_text(re.compile(
            r"^Emergency stop: 1 agent halted \(1 run aborted\), 1 already HALTED"))
