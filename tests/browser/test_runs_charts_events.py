"""The panel's histories from the log in a real browser: an agent's run history, charts that
are the same after a reload (with a mark for a stop), and a search of the whole event log
that finds an event the page never loaded. Screenshots in ``tests/browser/artefacts``."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from playwright.async_api import expect

from gateway.edge.server import Running
from gateway.runtime.intake import take_all
from lanes import parse_request
from lanes.events import BrokerReport
from tests.browser.conftest import ZONED, OpenPanel, screenshot
from tests.browser.live import CONTROL, agent, http, live_gateway, panel_config, request, submit
from tests.gateway.support import until

TIME = rf"(\d{{1,2}} [A-Z][a-z]{{2}} )?{ZONED}"
"""A time as the panel shows it: local, with the date when not today."""


async def runs_of(running: Running, agent_id: str) -> list[dict[str, Any]]:
    async with http(running) as client:
        response = await client.get(f"/api/agents/{agent_id}/runs")
        response.raise_for_status()
        runs: list[dict[str, Any]] = response.json()["runs"]
        return runs


async def test_the_run_history_shows_gate_wait_model_time_tokens_calls_and_the_answer(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "runs.db"
    desk = agent("desk")
    desk["reasoner"]["calls"] = [{"agent": "helper", "count": 1}]
    config = panel_config(db, [desk, agent("helper")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        await submit(running, request("desk"))
        page = await open_panel(running.url, CONTROL)
        await page.evaluate("location.hash = '#/agent/desk'")
        answered = page.locator("#runs-table tbody tr").filter(has_text="call results")
        await expect(answered).to_have_count(1)
        await expect(answered.locator('td[data-col="answer"]')).to_have_text(
            "simulated: 1 call results (1 returned)")
        await expect(answered.locator('td[data-col="wait"]')).to_have_text(
            re.compile(r"^\d+(\.\d)? (ms|s)$"))
        await expect(answered.locator('td[data-col="model"]')).to_have_text(
            re.compile(r"^[1-9]\d*(\.\d)? (ms|s)$"))
        await expect(answered.locator('td[data-col="tokens"]')).to_have_text(
            re.compile(r"^[1-9][\d,]* \+ [1-9][\d,]*$"))
        await expect(answered.locator('td[data-col="started"]')).to_have_text(
            re.compile(rf"^{TIME} · (just now|\d+ s ago)$"))
        await expect(page.locator("#runs-table tbody tr")).to_have_count(2)
        caller = page.locator("#runs-table tbody tr").last  # the first run made the call
        await expect(caller.locator('td[data-col="outcome"]')).to_have_text(
            re.compile(r"^(trade|no trade)$"))
        run_id = await caller.get_attribute("data-run")
        await caller.get_by_role("button", name="1 call").click()
        tree = page.locator(f'#call-tree [data-run="{run_id}"] summary').first
        await expect(tree).to_be_focused()
        await page.locator("#runs-title").scroll_into_view_if_needed()
        await screenshot(page, "run-history")


async def test_a_tool_loops_steps_show_in_the_run_history_with_how_each_tool_ended(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "steps.db"
    looper = agent("looper", (30, 60), tools=["positions", "open_orders"])
    looper["reasoner"]["tool_steps"] = [
        [{"tool": "positions"}, {"tool": "candles", "arguments": {"symbol": "BTCUSD"}}],
        [{"tool": "open_orders"}]]
    config = panel_config(db, [looper], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        await submit(running, request("looper"))
        page = await open_panel(running.url, CONTROL)
        await page.evaluate("location.hash = '#/agent/looper'")
        run = page.locator("#runs-table tbody tr").first
        await expect(run.locator('[data-col="outcome"]')).to_have_text("no trade")
        steps = run.locator("details.run-steps")
        await expect(steps).to_have_attribute("data-steps", "3")
        await steps.locator("summary").click()
        first = steps.locator('[data-step="1"]')
        await expect(first.locator('[data-tool="positions"]')).to_have_class(
            re.compile("returned"))
        refused = first.locator('[data-tool="candles"]')
        await expect(refused).to_have_class(re.compile("refused"))
        await expect(refused).to_have_attribute("title", re.compile("not one of this agent"))
        await expect(steps.locator('[data-step="3"]')).to_contain_text("answered")
        await screenshot(page, "run-steps")


async def test_charts_come_from_the_log_with_a_stop_marked_and_are_the_same_after_a_reload(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "charts.db"
    config = panel_config(db, [agent("alpha"), agent("bravo")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        for agent_id in ("alpha", "alpha", "bravo"):
            await submit(running, request(agent_id))

        async def settled() -> bool:
            runs = await runs_of(running, "alpha") + await runs_of(running, "bravo")
            return len(runs) == 3 and all(r["outcome"] != "running" for r in runs)

        await until(settled, "three runs done")
        async with http(running) as client:
            stopped = await client.post("/api/agents/alpha/control",
                                        json={"action": "emergency_stop"})
            assert stopped.status_code == 200, stopped.text
        page = await open_panel(running.url, CONTROL)
        await page.get_by_role("link", name="Charts").click()
        await page.locator("#chart-range").select_option(label="last 15 minutes")
        runs = page.locator("#chart-runs")
        await expect(runs).to_have_attribute("aria-label", re.compile(
            r"^Runs started: 3 in the window \(alpha 2, bravo 1\); 1 stop or resume mark$"))
        stop = page.locator('#chart-marks li[data-kind="stop"]')
        await expect(stop).to_contain_text("alpha: emergency_stop by ops (ACTIVE → HALTED)")
        await expect(stop).to_contain_text(re.compile(rf"{TIME} · (just now|\d+ s ago)"))
        box = await runs.bounding_box()
        assert box is not None
        await page.mouse.move(box["x"] + box["width"] - 20, box["y"] + box["height"] / 2)
        tip = page.locator("#chart-tip")
        await expect(tip).to_be_visible()
        await expect(tip).to_contain_text(re.compile(r"alpha: \d+"))
        await screenshot(page, "charts-from-the-log")
        await page.mouse.move(0, 0)
        await expect(tip).to_be_hidden()
        await runs.focus()
        await page.keyboard.press("End")  # the newest step, then back to the stop's
        await expect(tip).to_be_visible()
        await expect(tip).to_contain_text(re.compile(r"alpha: \d+"))
        for _ in range(3):
            if "emergency_stop" in await tip.inner_text():
                break
            await page.keyboard.press("ArrowLeft")
        await expect(tip).to_contain_text("■ stop")
        await expect(tip).to_contain_text("alpha: emergency_stop by ops")
        labels = {key: await page.locator(f"#chart-{key}").get_attribute("aria-label")
                  for key in ("runs", "tokens", "requests")}
        marks = await page.locator("#chart-marks li").all_inner_texts()

        await page.reload()
        await expect(page.locator("#connection")).to_have_text("Connected · live")
        await expect(page.locator("#chart-range")).to_have_value("900000")  # kept in the URL
        for key, label in labels.items():
            await expect(page.locator(f"#chart-{key}")).to_have_attribute("aria-label", label or "")
        await expect(page.locator("#chart-marks li")).to_have_text(
            [re.compile(re.escape(m.split(" · ")[-1])) for m in marks])
        await screenshot(page, "charts-after-reload")
        await page.set_viewport_size({"width": 390, "height": 844})
        await expect(page.locator("#chart-runs")).to_have_attribute("aria-label",
                                                                   labels["runs"] or "")
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        await screenshot(page, "charts-phone")


async def test_the_event_search_finds_an_old_event_the_page_never_loaded(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "search.db"
    trader = agent("alpha")
    trader["reasoner"]["trade_probability"] = 1.0  # its run places an order
    config = panel_config(db, [trader, agent("bravo", (60_000, 60_000))], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        await submit(running, request("alpha", payload={"note": "needle-7f3a"}))

        async def alpha_done() -> bool:
            return any(r["outcome"] != "running" for r in await runs_of(running, "alpha"))

        await until(alpha_done, "alpha's run done")  # then all of alpha's events are old
        engine = running.service.engine
        now = datetime.now(UTC).isoformat()
        flood = [parse_request({"requestId": f"hay_{n}", "createdAt": now, "agentId": "bravo",
                                "kind": "hook_trigger", "dedupeKey": f"hay:{n}"})
                 for n in range(1_100)]
        for start in range(0, len(flood), 100):
            await take_all(engine, flood[start:start + 100])
        async with http(running) as client:
            found = (await client.get("/api/events", params={"q": "needle-7f3a"})).json()
            last = (await client.get("/healthz")).json()["position"]
        [needle] = found["events"]
        assert last - needle["position"] > 2_000  # further back than the page's first read

        page = await open_panel(running.url, CONTROL)
        await page.get_by_role("link", name="Event log").click()
        await page.locator("#log-agent").select_option("alpha")
        count = page.locator("#log-count")
        await expect(count).to_contain_text(re.compile(r"^0 of [\d,]+ events in memory match"))
        await page.locator("#log-search").fill("needle-7f3a")
        row = page.locator(f'#event-list .row[data-position="{needle["position"]}"]')
        await expect(row).to_be_visible()
        await expect(count).to_contain_text("1 event in the whole log match “needle-7f3a”")
        await expect(count).to_contain_text("searched back to the start of the log")
        await expect(row.locator(".when")).to_have_text(
            re.compile(rf"^{TIME} · (just now|\d+ s ago)$"))
        await row.click()
        await expect(page.locator("#event-data")).to_contain_text("needle-7f3a")
        await screenshot(page, "event-search")

        [order] = (await runs_of(running, "alpha"))[0]["orders"]
        order_id, qty = order["orderId"], order["qty"]
        await engine.report("alpha", BrokerReport(at=int(time.time() * 1000), order_id=order_id,
                                                  status="filled", filled_qty=qty,
                                                  price=63_990.0))
        await page.locator("#log-agent").select_option("")
        await page.locator("#log-search").fill(order_id)
        shown = f"{qty:g}"
        for kind, text in [
                ("OrderAccepted", rf"^(BUY|SELL) {shown} BTCUSD @ market accepted \({order_id}\)$"),
                ("BrokerReport", rf"^fill {shown} @ 63,990.00 \({order_id}\)$"),
                ("OrderFilled", rf"^fill {shown} @ 63,990.00 \({order_id}\)$"),
                ("OrderClosed", rf"^{order_id} filled$")]:
            await expect(page.locator(f'#event-list .row[data-type="{kind}"] .what')).to_have_text(
                re.compile(text))
        await screenshot(page, "event-search-orders")

        summaries = await page.evaluate("""async () => {
            const f = await import('/js/format.js');
            const intent = {symbol: 'BTC-USD', side: 'buy', qty: 0.5, orderType: 'limit',
                            limitPrice: 64000};
            return [f.describe('OrderAccepted', {order_id: 'o-12', run_id: 'r', intent}),
                    f.describe('BrokerReport', {order_id: 'o-12', status: 'partially_filled',
                                                filled_qty: 0.2, price: 63990}),
                    f.describe('OrderRejected', {run_id: 'r', intent,
                                                 reason: 'insufficient margin'})];
        }""")
        assert summaries == ["BUY 0.5 BTC-USD @ 64,000.00 accepted (o-12)",
                             "partial fill 0.2 @ 63,990.00 (o-12)",
                             "BUY 0.5 BTC-USD @ 64,000.00 rejected: insufficient margin"]
