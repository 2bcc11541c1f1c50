"""The panel in a real browser (Debian's Chromium) against a live gateway fed by the
synthetic market: what a person sees, what the controls do, time travel, reconnection.
Screenshots of the main views are kept in ``tests/browser/artefacts``."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.async_api import Page, WebSocket, expect
from websockets.asyncio.client import connect

from gateway.config import GatewayConfig
from gateway.edge.server import Running
from tests.browser.conftest import OpenPanel, screenshot
from tests.browser.live import (
    CONTROL,
    TIMEOUT,
    VIEWER,
    agent,
    http,
    live_gateway,
    panel_config,
    relayed,
    request,
    submit,
)

MUTATING = re.compile(r"^\W*(emergency stop|stop|pause|resume|cancel|clear|release)",
                      re.IGNORECASE)
"""The names of controls that change something (not time travel's "Next stop ▶" jumps)."""


def trio(db: Path) -> GatewayConfig:
    """alpha runs on every feed crossing; bravo's runs take 30 s; charlie's a minute."""
    return panel_config(db, [agent("alpha"), agent("bravo", (30_000, 30_000)),
                             agent("charlie", (60_000, 60_000))], hooked=["alpha"])


async def rows_of(page: Page) -> list[str]:
    ids: list[str] = await page.locator("#agents-table tbody tr[data-agent]").evaluate_all(
        "rows => rows.map(r => r.dataset.agent)")
    return ids


async def test_the_overview_shows_every_agent_and_the_numbers_move(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(trio(db), db) as running:
        page = await open_panel(running.url, CONTROL)
        await expect(page.locator("#agents-table tbody tr[data-agent]")).to_have_count(3)
        assert await rows_of(page) == ["alpha", "bravo", "charlie"]
        for row in await page.locator("#agents-table tbody tr[data-agent]").all():
            await expect(row.locator(".state")).to_have_text("ACTIVE")
        summary = page.locator("#overview-view .summary")
        position = await summary.get_attribute("data-position")
        runs = page.locator('tr[data-agent="alpha"] td[data-col="hour"]')
        before = await runs.inner_text()
        await expect(summary).not_to_have_attribute("data-position", position or "")
        await expect(runs).not_to_have_text(before)  # the feed's crossings make alpha run
        await expect(page.locator('tr[data-agent="alpha"] td[data-col="hour"]')).to_have_text(
            re.compile(r"^[1-9]\d* / ∞$"))
        await screenshot(page, "overview")

        await page.get_by_role("link", name="Provider gate").click()
        gate = page.locator('[data-provider="sim-llm"]')
        await expect(gate).to_contain_text("breaker closed")
        await expect(gate.locator(".meter").first).to_contain_text("/ 6,000")
        await screenshot(page, "providers")
        await page.get_by_role("link", name="Charts").click()
        await expect(page.locator("#chart-runs")).to_have_attribute(
            "aria-label", re.compile(r"^Runs started: [1-9][\d,]* in the window"))
        await screenshot(page, "charts")


async def test_an_emergency_stop_from_the_panel_halts_the_agent_and_logs_the_aborted_run(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(trio(db), db) as running:
        await submit(running, request("bravo", "user_control", payload={"message": "watch BTC"}))
        page = await open_panel(running.url, CONTROL)
        row = page.locator('tr[data-agent="bravo"]')
        await expect(row.locator('td[data-col="run"]')).to_contain_text("bravo-r1")
        await row.get_by_role("button", name="Emergency stop bravo").click()
        dialog = page.locator("#confirm")
        await expect(dialog).to_be_visible()
        await expect(dialog).to_contain_text("Emergency stop: bravo?")
        await dialog.get_by_role("button", name="Emergency stop").click()
        await expect(row.locator(".state")).to_have_text("HALTED")
        await expect(row).to_have_class("halted")
        await expect(row.locator('td[data-col="run"]')).to_contain_text("idle")
        await expect(page.locator(".toast").last).to_contain_text(
            "bravo ACTIVE → HALTED: run bravo-r1 aborted")
        async with http(running) as client:
            status = (await client.get("/api/agents/bravo")).json()
        assert status["trading"] == "HALTED" and status["counters"]["aborts"] == 1

        await page.get_by_role("link", name="Event log").click()
        await page.locator("#log-agent").select_option("bravo")
        await page.locator("#log-type").select_option("RunAborted")
        aborted = page.locator('#event-list [data-type="RunAborted"]')
        await expect(aborted).to_have_count(1)
        await expect(aborted).to_contain_text("bravo-r1 aborted (emergency_stop)")
        await aborted.click()
        await expect(page.locator("#event-data")).to_contain_text('"reason": "emergency_stop"')
        cause = page.locator("#event-cause")
        await expect(cause).to_contain_text("RequestReceived")
        await expect(cause).to_contain_text("action=emergency_stop")
        await expect(page.locator("#event-decisions")).to_contain_text("ControlApplied")
        await screenshot(page, "event-log")

        await page.get_by_role("link", name="bravo").first.click()
        await expect(page.locator("#control-actions li").first).to_contain_text(
            "emergency_stop by ops → ACTIVE → HALTED · aborted bravo-r1")
        await screenshot(page, "agent-halted", full_page=True)


async def test_a_viewer_token_sees_no_controls(tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(trio(db), db) as running:
        ops = await open_panel(running.url, CONTROL)
        await expect(ops.locator("#agents-table tbody tr[data-agent]")).to_have_count(3)
        # stop all, a stop per row, the feed view's pause of the hook rules
        assert await ops.locator("[data-mutating]").count() == 5
        viewer = await open_panel(running.url, VIEWER)
        await expect(viewer.locator("#who")).to_have_text("watcher · viewer")
        await expect(viewer.locator("#agents-table tbody tr[data-agent]")).to_have_count(3)
        assert await viewer.locator("[data-mutating]").count() == 0
        assert await viewer.get_by_role("button", name=MUTATING).count() == 0
        await viewer.get_by_role("link", name="alpha").click()
        await expect(viewer.locator("#agent-title")).to_have_text("alpha")
        await expect(viewer.locator("#pending-title")).to_contain_text("Pending")
        assert await viewer.locator("[data-mutating]").count() == 0
        assert await viewer.get_by_role("button", name=MUTATING).count() == 0
        await screenshot(viewer, "agent-viewer")
        await ops.get_by_role("link", name="alpha").click()
        await expect(ops.locator("#pending-title")).to_contain_text("Pending")
        assert await ops.get_by_role("toolbar", name="Controls for alpha").get_by_role(
            "button").count() == 6


async def test_scrubbing_the_timeline_back_shows_the_earlier_pending_list_of_the_replay_api(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(trio(db), db) as running:
        ids = [(await submit(running, request("charlie")))["requestId"] for _ in range(5)]
        page = await open_panel(running.url, CONTROL)
        await page.get_by_role("link", name="charlie").click()
        await expect(page.locator("#pending-table")).to_have_attribute("data-count", "4")
        async with http(running) as client:
            stream = (await client.get("/api/agents/charlie/events")).json()["events"]
        # After the third request was queued two waited (the first is in the run).
        target = [e for e in stream if e["type"] == "RequestQueued"][2]["position"]
        steps = [e["position"] for e in stream].index(target)

        slider = page.get_by_label("Log position of charlie")
        await slider.focus()
        await page.keyboard.press("Home")
        for _ in range(steps):
            await page.keyboard.press("ArrowRight")
        replay = page.locator("#replay")
        await expect(replay).to_have_attribute("data-position", str(target))
        shown = await page.locator("#replay-pending tr[data-request-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.requestId)")
        async with http(running) as client:
            then = (await client.get("/api/replay", params={"agent": "charlie",
                                                            "position": target})).json()
        assert shown == [p["requestId"] for p in then["queue"]["pending"]] == ids[1:3]
        await expect(replay.locator('[aria-current="true"]')).to_contain_text("RequestQueued")
        await replay.evaluate("e => e.scrollIntoView({block: 'end'})")
        await screenshot(page, "time-travel")

        await page.get_by_role("button", name="Back to live").click()
        await expect(replay).not_to_have_attribute("data-position", str(target))
        await page.get_by_role("button", name="◀ Previous input").click()
        last_input = [e for e in stream if e["type"] == "RequestReceived"][-1]["position"]
        await expect(replay).to_have_attribute("data-position", str(last_input))
        await expect(page.locator("#replay-pending")).to_have_attribute("data-count", "3")


async def test_a_dropped_connection_shows_the_disconnected_state_and_recovers(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    sockets: list[Frames] = []

    def watch(ws: WebSocket) -> None:
        frames = Frames()
        sockets.append(frames)
        ws.on("framesent", lambda text: frames.sent.append(json.loads(text)))
        ws.on("framereceived", frames.receive)

    async with live_gateway(trio(db), db) as running, relayed(running) as relay:
        page = await open_panel(relay.url, CONTROL, on_websocket=watch)
        banner = page.locator("#banner")
        await expect(banner).to_be_hidden()
        # Something seen before the cut (else the cut may come before the first events frame
        # on a busy machine, and the panel would rightly resume from nothing).
        before = await submit(running, request("charlie", "user_control",
                                               payload={"message": "before the cut"}))
        await expect_position(page, before["position"])
        relay.cut()
        await expect(banner).to_be_visible()
        await expect(banner).to_contain_text("Disconnected from the gateway")
        await expect(page.locator("#connection")).not_to_have_text("Connected · live")
        await screenshot(page, "disconnected")
        missed = await submit(running, request("charlie", "user_control",
                                               payload={"message": "while you were away"}))
        relay.restore()
        await expect(page.locator("#connection")).to_have_text("Connected · live",
                                                               timeout=15_000)
        await expect(banner).to_be_hidden()
        await expect(page.locator(".toast").last).to_contain_text("Reconnected")
        # Resumed from the last position seen: what was committed meanwhile is in the log, once.
        await page.get_by_role("link", name="Event log").click()
        await page.locator("#log-search").fill(missed["requestId"])
        received = page.locator('#event-list [data-type="RequestReceived"]')
        await expect(received).to_have_count(1)
        await expect(received).to_contain_text("while you were away")
        # The new socket subscribed after the last position the panel had processed.
        seen = max(p for frames in sockets[:-1] for p in frames.positions)
        assert [(f["after"], f["batch"]) for f in sockets[-1].sent
                if f["type"] == "subscribe"] == [(seen, True)]
        # The token went in the handshake (a subprotocol), never in a frame.
        assert not [f for frames in sockets for f in frames.sent if f["type"] == "auth"]
        assert missed["position"] > seen


@dataclass
class Frames:
    """What the page sent on one WebSocket, and the positions it received: of the events,
    and of a subscription's snapshot (the panel has seen the log up to it)."""

    sent: list[dict[str, Any]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    def receive(self, payload: str | bytes) -> None:
        frame = json.loads(payload)
        assert frame["type"] != "event", "the panel subscribes with batch: events frames only"
        if frame["type"] == "events":
            self.positions += [event["position"] for event in frame["events"]]
        elif frame["type"] == "snapshot":
            self.positions.append(frame["position"])


async def test_two_hundred_agents_under_a_feed_flood_stay_smooth(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    ids = [f"agent_{n:03d}" for n in range(200)]
    # Collecting agents (a run per debounce window), ten of them on the synthetic feed.
    config = panel_config(db, [agent(a, (50, 300), mode="collect", debounce_ms=1_500)
                               for a in ids], hooked=ids[:10])
    async with live_gateway(config, db) as running:
        page = await open_panel(running.url, CONTROL)
        rows = page.locator("#agents-table tbody tr[data-agent]")
        await expect(page.locator("#overview-view .summary")).to_contain_text("200 agents")
        await page.evaluate(FRAME_PROBE)
        await flood(running, ids, frames=20)
        await expect_position(page, await running.service.engine.store.last_position())
        gaps: list[float] = await page.evaluate("window.__stopProbe()")
        assert await rows.count() < 60  # virtualised: 200 agents, a screenful of rows
        gaps.sort()
        # Frames kept coming during the flood (it may take as little as ~0.3 s: 20 frames).
        assert len(gaps) >= 10, gaps
        assert gaps[len(gaps) * 9 // 10] < 100, gaps[-20:]  # p90 frame gap
        await page.locator("#agents-scroller").evaluate("s => s.scrollTop = s.scrollHeight")
        await expect(page.locator('tr[data-agent="agent_199"]')).to_be_visible()
        assert await rows.count() < 60
        await screenshot(page, "overview-200")
        await page.get_by_role("link", name="Event log").click()
        await expect(page.locator("#event-list .row").first).to_be_visible()
        assert await page.locator("#event-list .row").count() < 80  # of thousands


FRAME_PROBE = """() => {
  const gaps = [];
  let last = performance.now();
  let running = true;
  const frame = (now) => {
    gaps.push(now - last);
    last = now;
    if (running) requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
  window.__stopProbe = () => { running = false; return gaps; };
}"""


async def flood(running: Running, agents: list[str], frames: int = 6) -> None:
    """A feed flood: frames of one trigger per agent over ``/ws/feed``, all in flight at
    once (a frame answered ``busy`` by the intake is sent again after its ``retryAfterMs``,
    as the protocol asks); returns when every one is acknowledged."""
    url = running.url.replace("http", "ws", 1) + "/ws/feed"
    async with connect(url, additional_headers={"Authorization": f"Bearer {CONTROL}"}) as feed:
        assert json.loads(await feed.recv())["type"] == "hello"
        sent = {f"flood-{n}": json.dumps({"type": "submit_many", "id": f"flood-{n}",
                                          "requests": [request(a) for a in agents]})
                for n in range(frames)}
        for text in sent.values():
            await feed.send(text)
        acked: set[str] = set()
        while len(acked) < frames:
            answer = json.loads(await asyncio.wait_for(feed.recv(), TIMEOUT))
            if answer["type"] == "busy":  # nothing was taken: the same frame, later
                await asyncio.sleep(answer["retryAfterMs"] / 1000)
                await feed.send(sent[answer["id"]])
                continue
            assert answer["type"] == "acks", answer
            acked.add(answer["id"])


async def expect_position(page: Page, position: int) -> None:
    """Wait until the panel has seen every event up to ``position`` (a generous wait: on a
    busy machine the gateway itself takes a while to send a flood's events)."""
    await page.wait_for_function(
        "p => Number(document.querySelector('#overview-view .summary').dataset.position) >= p",
        arg=position, timeout=3 * TIMEOUT * 1000)


async def test_keyboard_alone_opens_and_escapes_the_confirm_and_dark_mode_is_dark(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    async with live_gateway(trio(db), db) as running:
        page = await open_panel(running.url, CONTROL, scheme="dark")
        background = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(17, 19, 24)"
        stop = page.get_by_role("button", name="Emergency stop charlie")
        await page.locator("#agent-filter").focus()
        for _ in range(40):
            await page.keyboard.press("Tab")
            if await stop.evaluate("b => b === document.activeElement"):
                break
        else:
            raise AssertionError("Tab never reached charlie's stop button")
        await page.keyboard.press("Enter")
        dialog = page.locator("#confirm")
        await expect(dialog).to_be_visible()
        await expect(page.locator("#confirm-ok")).to_be_focused()
        await screenshot(page, "confirm-dark")
        await page.keyboard.press("Escape")
        await expect(dialog).to_be_hidden()
        await expect(stop).to_be_focused()
        async with http(running) as client:
            status = (await client.get("/api/agents/charlie")).json()
        assert status["trading"] == "ACTIVE" and status["counters"]["controls"] == 0
        await page.get_by_role("link", name="charlie").click()
        await expect(page.locator("#agent-title")).to_have_text("charlie")
        await screenshot(page, "agent-dark")



async def test_the_agent_page_lists_its_schedules_with_their_next_fire_times(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    schedules = [{"id": "open-bell", "cron": "30 9 * * 1-5", "timezone": "America/New_York",
                  "catch_up": "once"},
                 {"id": "hourly", "every_ms": 3_600_000, "paused": True}]
    config = panel_config(db, [agent("delta", schedules=schedules)], hooked=[])
    async with live_gateway(config, db) as running:
        async with http(running) as client:
            shown = (await client.get("/api/agents/delta/schedules")).json()["schedules"]
        page = await open_panel(running.url, CONTROL)
        await page.get_by_role("link", name="delta").click()
        listed = page.get_by_role("list", name="Schedules")
        bell = listed.locator('li[data-schedule="open-bell"]')
        await expect(bell).to_contain_text("30 9 * * 1-5 (America/New_York)")
        await expect(bell.locator(".next-fire")).to_have_text(re.compile(r"^next \S"))
        assert shown[0]["nextFireAt"] is not None
        await expect(listed.locator('li[data-schedule="hourly"]')).to_contain_text("paused")
        await screenshot(page, "schedules")
