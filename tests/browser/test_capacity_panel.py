"""Capacity over time in a real browser, and chart marks that never overprint: stops and
resumes close together on the charts share a label or take another row instead of printing
on top of each other (every text a canvas draws is recorded by a script in the page and
checked for overlaps); the capacity view shows the desk's and each gate's series from the
log, zooms by brushing a chart and with the keyboard, and fits 1280 and 390 px.
Screenshots in ``tests/browser/artefacts``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from gateway.edge.server import Running
from tests.browser.conftest import OpenPanel, screenshot
from tests.browser.live import CONTROL, agent, http, live_gateway, panel_config, request, submit
from tests.gateway.support import until

TEXTS = """(() => {
  window.__texts = {};
  const proto = CanvasRenderingContext2D.prototype;
  const fill = proto.fillText;
  proto.fillText = function (text, x, y, ...rest) {
    const id = this.canvas.id || "?";
    (window.__texts[id] ??= []).push({text: String(text), x, y, align: this.textAlign,
      baseline: this.textBaseline, width: this.measureText(String(text)).width});
    return fill.call(this, text, x, y, ...rest);
  };
  const clear = proto.clearRect;
  proto.clearRect = function (x, y, ...rest) {
    if (x === 0 && y === 0) window.__texts[this.canvas.id || "?"] = [];  // a new drawing
    return clear.call(this, x, y, ...rest);
  };
})();"""
"""Records every text drawn on each canvas since it was last cleared."""
MARK = re.compile(r"^[■‖▶⚙⚡✓]")
"""The labels of marks start with their glyph."""


async def drawn_marks(page: Page, canvas: str) -> list[dict[str, Any]]:
    texts: list[dict[str, Any]] = await page.evaluate(f"window.__texts[{canvas!r}] || []")
    return [t for t in texts if MARK.match(t["text"])]


def overlaps(labels: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of labels whose boxes (11 px text, top baseline) meet."""
    boxes = []
    for t in labels:
        left = t["x"] - t["width"] if t["align"] == "right" else t["x"]
        top = t["y"] if t["baseline"] == "top" else t["y"] - 11
        boxes.append((left, left + t["width"], top, top + 11, t["text"]))
    return [(a[4], b[4]) for n, a in enumerate(boxes) for b in boxes[n + 1:]
            if a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]]


async def stop_and_resume(running: Running, agent_id: str, times: int) -> None:
    async with http(running) as client:
        for _ in range(times):
            for action in ("emergency_stop", "resume"):
                sent = await client.post(f"/api/agents/{agent_id}/control",
                                         json={"action": action})
                assert sent.status_code == 200, sent.text


async def test_stop_and_resume_marks_close_together_never_print_on_each_other(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "marks.db"
    config = panel_config(db, [agent("alpha"), agent("bravo")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        await stop_and_resume(running, "alpha", 2)
        await stop_and_resume(running, "bravo", 1)
        page = await open_panel(running.url, CONTROL, init_script=TEXTS)
        await page.get_by_role("link", name="Charts").click()
        await page.locator("#chart-range").select_option(label="last 15 minutes")
        await expect(page.locator("#chart-runs")).to_have_attribute(
            "aria-label", re.compile(r"; 6 stop or resume marks$"))
        await expect(page.locator("#chart-marks li")).to_have_count(6)
        labels = await drawn_marks(page, "chart-runs")
        assert labels, "the marks are labelled"
        assert overlaps(labels) == []
        await screenshot(page, "chart-marks-apart")


async def capacity_of(running: Running, **params: Any) -> dict[str, Any]:
    async with http(running) as client:
        response = await client.get("/api/capacity", params=params)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


async def test_the_capacity_view_shows_the_desk_and_the_gate_zooms_by_brushing_and_fits_a_phone(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "capacity.db"
    # (calls over a second, one at a time: a wait behind one spans the end of a second, so
    # the series, read at the end of each second, show it; calls of 150-300 ms could all
    # wait within one second and the waiting chart then read 0)
    agents = [agent(name, (1_100, 1_200)) for name in ("alpha", "bravo", "charlie")]
    config = panel_config(db, agents, hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        async with http(running, "panel-admin-secret") as admin:
            limited = await admin.post("/api/providers/sim-llm/limits", json={
                "maxConcurrent": 1, "requestsPerMinute": 600, "inputTokensPerMinute": 200_000})
            assert limited.status_code == 200, limited.text
        for name in ("alpha", "bravo", "charlie") * 2:
            await submit(running, request(name))
        await stop_and_resume(running, "alpha", 2)

        async def settled() -> bool:
            body = await capacity_of(running)
            return bool(sum(body["desk"]["runs"]) >= 6 and sum(body["gates"][0]["waits"]) >= 4)

        await until(settled, "six runs done, most having waited at the gate", 60)
        page = await open_panel(running.url, CONTROL, init_script=TEXTS)
        await page.set_viewport_size({"width": 1280, "height": 900})
        await page.get_by_role("link", name="Capacity").click()
        status = page.locator("#capacity-status")
        await expect(status).to_contain_text(re.compile(
            r"From the log: .* one point per 30 s · 3 agents on the desk"))
        await expect(page.locator("#capacity-latency")).to_have_attribute(
            "aria-label", re.compile(r"desk p95 \d+(\.\d)? (ms|s)"))
        await expect(page.locator("#capacity-rpm")).to_have_attribute(
            "aria-label", re.compile(r"most in the window sim-llm [1-9]\d*%"))
        await expect(page.locator("#capacity-waiting")).to_have_attribute(
            "aria-label", re.compile(r"sim-llm [1-9]"))
        kinds = page.locator("#capacity-marks li")
        await expect(kinds.filter(has_text="limits")).to_have_count(1)
        await expect(kinds.filter(has_text="emergency_stop by ops")).to_have_count(2)
        assert overlaps(await drawn_marks(page, "capacity-depth")) == []
        await screenshot(page, "capacity-1280", full_page=True)

        # Brushing the last minutes of a chart zooms every chart in on them.
        latency = page.locator("#capacity-latency")
        await latency.scroll_into_view_if_needed()
        box = await latency.bounding_box()
        assert box is not None
        y = box["y"] + box["height"] / 2
        await page.mouse.move(box["x"] + box["width"] * 0.92, y)
        await page.mouse.down()
        await page.mouse.move(box["x"] + box["width"] * 0.96, y, steps=4)
        await expect(page.locator("figure[data-series=latency] .brush")).to_be_visible()
        await page.mouse.move(box["x"] + box["width"] - 14, y, steps=4)
        await page.mouse.up()
        await expect(page.locator("#capacity-reset")).to_be_visible()
        await expect(status).to_contain_text(re.compile(r"one point per [1-5] s"))
        assert re.search(r"#/capacity\?from=\d+&to=\d+", page.url), page.url
        await expect(page.locator("#capacity-latency")).to_have_attribute(
            "aria-label", re.compile(r"desk p95 \d+"))
        await screenshot(page, "capacity-brushed")
        await latency.focus()
        await page.keyboard.press("-")
        await expect(status).to_contain_text(re.compile(r"one point per (5|10) s"))
        await page.keyboard.press("0")
        await expect(page.locator("#capacity-reset")).to_be_hidden()
        await expect(status).to_contain_text("one point per 30 s")

        # One agent chosen by name, and kept in the address.
        await page.locator("#capacity-agents").fill("bravo")
        await page.locator("#capacity-agents").press("Enter")
        await expect(status).to_contain_text("chosen: bravo")
        assert "agents=bravo" in page.url
        await page.reload()
        await expect(page.locator("#connection")).to_have_text("Connected · live")
        await expect(status).to_contain_text("chosen: bravo")

        await page.set_viewport_size({"width": 390, "height": 844})
        await expect(page.locator("#capacity-depth")).to_be_visible()
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        width = await page.evaluate("document.getElementById('capacity-depth').clientWidth")
        assert 300 <= width <= 390
        await screenshot(page, "capacity-390", full_page=True)
