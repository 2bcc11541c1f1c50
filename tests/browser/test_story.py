"""Time travel as a story in a real browser: an agent with a known history (a drop, a budget
suppression, an emergency stop) read as groups in the CLI timeline's words, jumps between
them, the state at a moment, the diff of two positions, and a zoomable time axis."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from gateway.edge.server import Running
from gateway.tools.timeline import timeline_command
from tests.browser.conftest import OpenPanel, resize, screenshot
from tests.browser.live import VIEWER, agent, http, live_gateway, panel_config, request, submit
from tests.gateway.support import until


async def stream(running: Running) -> list[dict[str, Any]]:
    async with http(running) as client:
        events: list[dict[str, Any]] = (await client.get("/api/agents/story/events")).json()[
            "events"]
        return events


async def first(running: Running, type_name: str) -> int:
    """The position of the agent's first event of that type, once it is in the log."""

    async def found() -> int | None:
        return next((e["position"] for e in await stream(running) if e["type"] == type_name),
                    None)

    return await until(found, f"a {type_name} of the agent story", within_s=20)


async def history(running: Running) -> dict[str, int]:
    """a runs; b and c wait; d drops b (cap 2); c runs after a; then d is suppressed (two
    runs an hour); an emergency stop. The positions of the drop, suppression and stop."""
    for key in "abcd":
        await submit(running, request("story", dedupeKey=f"story:{key}"))
    marks = {"drop": await first(running, "RequestDropped"),
             "suppression": await first(running, "RunsSuppressed")}
    await submit(running, request("story", "user_control", priority="high",
                                  payload={"action": "emergency_stop"}))
    marks["stop"] = await first(running, "ControlApplied")
    return marks


async def cli_group(db: Path, position: int) -> list[str]:
    """What ``gateway timeline`` prints of the group whose input is at ``position``: the
    input's words, then each decision's."""
    printed: list[str] = []
    await timeline_command(db, "story", None, None, printed.append)
    rows = printed[2:-1]
    start = next(i for i, line in enumerate(rows) if line[:8].strip() == str(position))
    words = [rows[start][35:]]
    for line in rows[start + 1:]:
        if "    -> " not in line[:40]:
            break
        words.append(line.split("    -> ", 1)[1])
    return words


async def ticks(page: Page) -> list[str]:
    labels: list[str] = await page.locator("#travel-axis text.tick").all_text_contents()
    return labels


async def test_time_travel_tells_the_agents_story_with_jumps_a_diff_and_a_zoomable_axis(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "panel.db"
    story = agent("story", (1_200, 1_500), cap=2, budgets={"max_runs_per_hour": 2})
    config = panel_config(db, [story, agent("other")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        marks = await history(running)
        page = await open_panel(running.url, VIEWER)
        await page.goto(f"{running.url}/#/agent/story")
        replay = page.locator("#replay")
        await expect(page.locator("#travel-label")).to_contain_text("Live")

        # Back to the drop: its group reads as the CLI's timeline does.
        await page.get_by_role("button", name="◀ Previous drop").click()
        await expect(replay).to_have_attribute("data-position", str(marks["drop"]))
        group = page.locator('#story li.group[data-current="true"]')
        current = group.locator('[aria-current="true"]')
        await expect(current).to_have_attribute("data-kind", "drop")
        input_at = int(await group.get_attribute("data-position") or 0)
        shown = await group.locator(".said .say").all_text_contents()
        assert shown == await cli_group(db, input_at)
        await page.locator("#story").scroll_into_view_if_needed()
        await screenshot(page, "story")
        # The first run held its provider slot then (it thinks for over a second).
        await expect(page.locator('#moment-gate li[data-run="story-r1"]')).to_contain_text(
            "holds a slot since")

        # The suppression: the moment shows the budget spent and the suppression.
        await page.get_by_role("button", name="Next suppression ▶").click()
        await expect(replay).to_have_attribute("data-position", str(marks["suppression"]))
        await expect(page.locator("#moment-hour")).to_have_text("2 / 2")
        await expect(page.locator("#moment-suppressed")).to_contain_text("yes, hourly budget")
        await expect(page.locator("#moment-why")).to_contain_text("runs suppressed (hourly)")
        await page.locator("#moment").scroll_into_view_if_needed()
        await screenshot(page, "story-moment")
        await page.get_by_role("button", name="Compare from here").click()

        # Next stop, and what changed between the two.
        await page.get_by_role("button", name="Next stop ▶").click()
        await expect(replay).to_have_attribute("data-position", str(marks["stop"]))
        await expect(page.locator('#story [aria-current="true"] .say')).to_have_text(
            "control emergency_stop: ACTIVE -> HALTED")
        await expect(page.locator("#moment-why")).to_have_text(
            "halted: no run starts until a resume")
        await expect(page).to_have_url(re.compile(rf"#/agent/story\?at={marks['stop']}$"))
        await page.get_by_role("button", name="Compare to here").click()
        trading = page.locator('#diff-table tr[data-what="trading"]')
        await expect(trading.locator("td")).to_have_text(["ACTIVE", "HALTED"])
        await expect(page.locator("#travel-diff")).to_have_attribute(
            "data-from", str(marks["suppression"]))
        await expect(page.get_by_role("button", name="Next stop ▶")).to_be_visible()
        await page.get_by_role("button", name="Next stop ▶").click()
        await expect(page.locator("#jump-result")).to_contain_text("No later stop")
        await page.locator("#travel-diff").scroll_into_view_if_needed()
        await screenshot(page, "story-diff")

        # The address holds the position: a reload travels back to it.
        await page.reload()
        await expect(page.locator("#replay")).to_have_attribute("data-position",
                                                                str(marks["stop"]))

        # The time axis: labelled ticks that change as it zooms (buttons and wheel).
        axis = page.locator("#travel-axis")
        await axis.scroll_into_view_if_needed()
        await expect(axis.locator("text.tick").first).to_be_visible()
        before = await ticks(page)
        span = int(await axis.get_attribute("data-span-ms") or 0)
        legend = page.locator("#travel-legend")
        await expect(legend.locator('[data-kind="stop"]')).to_have_text("stop")
        assert await axis.locator('rect[data-kind="stop"]').count() == 1
        assert await axis.locator('rect[data-kind="drop"]').count() >= 1
        # A click on the axis picks the event under it: the stop's group.
        await page.get_by_role("button", name="Back to live").click()
        mark = await axis.locator('rect[data-kind="stop"]').bounding_box()
        frame = await axis.bounding_box()
        assert mark is not None and frame is not None
        await axis.click(position={"x": mark["x"] - frame["x"] + 1, "y": 20})
        await expect(page.locator('#story li.group[data-current="true"]')).to_have_class(
            re.compile(r"\bkind-stop\b"))
        for _ in range(3):
            await page.get_by_role("button", name="Zoom in").click()
        await expect(axis).not_to_have_attribute("data-span-ms", str(span))
        zoomed = int(await axis.get_attribute("data-span-ms") or 0)
        assert zoomed < span / 4
        assert await ticks(page) != before
        await screenshot(page, "story-zoomed")
        await axis.evaluate("e => e.scrollIntoView({block: 'center'})")
        await axis.hover()  # (actionable: in view, nothing over it)
        await page.mouse.wheel(0, 400)  # out
        await expect(axis).not_to_have_attribute("data-span-ms", str(zoomed))
        assert int(await axis.get_attribute("data-span-ms") or 0) > zoomed
        await axis.focus()
        await page.keyboard.press("0")  # everything loaded again
        await expect(axis).to_have_attribute("data-span-ms", str(span))
        await page.keyboard.press("+")
        await expect(axis).not_to_have_attribute("data-span-ms", str(span))
        assert abs(int(await axis.get_attribute("data-span-ms") or 0) - span / 2) <= 1

        # The dark scheme, for the record.
        dark = await open_panel(running.url, VIEWER, scheme="dark")
        await dark.goto(f"{running.url}/#/agent/story?at={marks['drop']}")
        await expect(dark.locator("#replay")).to_have_attribute("data-position",
                                                                str(marks["drop"]))
        await dark.locator("#travel-axis").scroll_into_view_if_needed()
        await screenshot(dark, "story-dark")

        # On a phone the axis fits the screen and still has labelled ticks.
        await page.set_viewport_size({"width": 390, "height": 844})
        await expect(axis).to_have_attribute("width", re.compile(r"^[1-3]\d\d$"))
        assert len(await ticks(page)) >= 2
        section = page.locator("section.timeline")
        assert await section.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
        await page.locator("#story").scroll_into_view_if_needed()
        await screenshot(page, "story-phone")
        # A day's label reads as every date of the panel does: day, then month.
        day = await page.evaluate("import('./js/views/timeline.js').then((m) => "
                                  "m.tickLabel(new Date(2026, 10, 27, 12).getTime(), 864e5))")
        assert day == "27 Nov", day


AXIS_SPANS_MS = {"10 ms": 10, "35 ms": 35, "250 ms": 250, "1 s": 1_000, "15 s": 15_000,
                 "1 min": 60_000, "10 min": 600_000, "1 h": 3_600_000, "6 h": 21_600_000,
                 "2 days": 172_800_000, "9 days": 777_600_000}
PHASES = 23
"""Each span is drawn from this many starts a little apart, so ticks fall everywhere between
the edges: whether a label shows must not hang on where the log's times happen to fall."""

DRAW_AXES = """async ({spans, phases}) => {
  const {createTimeline} = await import('./js/views/timeline.js');
  const host = document.createElement('div');
  host.style.cssText = 'position: absolute; left: 0; top: 0; width: 100%';
  document.body.append(host);
  const timeline = createTimeline({}, 'fixed', {loadEarlier: async () => {}});
  host.append(timeline.el);
  const axis = timeline.el.querySelector('svg.axis');
  const drawn = [];
  for (const [name, span] of Object.entries(spans)) {
    for (let k = 0; k < phases; k++) {
      const first = new Date(2026, 10, 27, 17, 55, 18).getTime() + Math.round(span * k / phases);
      timeline.set([0, 0.4, 1].map((share, i) => ({position: i + 1, type: 'ControlApplied',
        recordedAt: first + Math.round(share * span), data: {}})), false);
      const box = axis.getBoundingClientRect();
      const labels = [...axis.querySelectorAll('text.tick')].map((t) => {
        const r = t.getBoundingClientRect();
        return {text: t.textContent, left: r.left - box.left, right: r.right - box.left};
      });
      drawn.push({name, k, width: box.width, labels});
    }
  }
  host.remove();
  return drawn;
}"""


def axis_faults(axis: dict[str, Any]) -> list[str]:
    """What is wrong with the labels of one drawn axis: fewer than two, the zone not on the
    first alone, one cut by an edge, or two that touch."""
    labels, width = axis["labels"], axis["width"]
    texts = [label["text"] for label in labels]
    faults = []
    if len(labels) < 2:
        faults.append("fewer than two labels")
    if not texts or not texts[0].endswith(" GMT+5:30") or any("GMT" in t for t in texts[1:]):
        faults.append("the zone is not on the first label alone")
    if any(label["left"] < 0 or label["right"] > width for label in labels):
        faults.append("a label cut by an edge")
    if any(a["right"] >= b["left"] for a, b in pairwise(labels)):
        faults.append("two labels touch")
    return [f"{axis['name']} (start {axis['k']}/{PHASES}, axis {width:.0f} px): {fault}: {texts}"
            for fault in faults]


async def test_the_travel_axis_shows_two_labels_the_first_zoned_at_every_span_and_width(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "axis.db"
    async with live_gateway(panel_config(db, [agent("other")], hooked=[]), db,
                            feed=False) as running:
        page = await open_panel(running.url, VIEWER, timezone_id="Asia/Kolkata")
        faults = []
        for window in (390, 768, 1280, 1920):
            await resize(page, window, 844)
            drawn: list[dict[str, Any]] = await page.evaluate(
                DRAW_AXES, {"spans": AXIS_SPANS_MS, "phases": PHASES})
            assert len(drawn) == len(AXIS_SPANS_MS) * PHASES
            faults += [f"{window} px window, {fault}" for axis in drawn
                       for fault in axis_faults(axis)]
        assert not faults, f"{len(faults)} faults:\n" + "\n".join(faults)
