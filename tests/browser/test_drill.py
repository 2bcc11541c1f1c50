"""Drill-down in a real browser, at 1280 and 390 px (issue 27 item 5): an order id opens its
life (placed, the broker's report, the fill, how it closed) with the run that placed it and
that run's tool steps; a run opens its prompt, steps and steers; the agent page's message
box sends a message or a steer; what-if from a time-travel position shows the comparison.
Prices are shown to the symbol's tick. Screenshots: ``drill-order-*``, ``drill-run-*``,
``message-*``, ``whatif-*``."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from playwright.async_api import expect

from gateway.config import GatewayConfig
from gateway.config.market import MarketConfig, SymbolConfig
from gateway.market.events import Tick
from tests.browser.conftest import OpenPanel, fits, resize, screenshot
from tests.browser.live import (
    CONTROL,
    agent,
    http,
    live_gateway,
    panel_config,
    request,
    state_is,
    submit,
)

WIDTHS = ((1280, 800), (390, 844))


def with_ticks(config: GatewayConfig) -> GatewayConfig:
    """BTCUSD moves in half dollars."""
    return config.model_copy(update={"market": MarketConfig(
        symbols=(SymbolConfig(symbol="BTCUSD", tick=0.5),))})





async def test_an_order_opens_its_life_the_run_that_placed_it_and_that_runs_tool_steps(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "drill.db"
    desk = agent("desk", (60, 90), tools=["market_snapshot", "place_order"])
    desk["reasoner"]["tool_steps"] = [
        [{"tool": "market_snapshot", "arguments": {"symbol": "$symbol"}}],
        [{"tool": "place_order", "arguments": {"symbol": "$symbol", "side": "buy", "qty": 0.25}}]]
    config = with_ticks(panel_config(db, [desk], hooked=[]))
    async with live_gateway(config, db, feed=False) as running:
        await submit(running, request("desk", payload={"symbol": "BTCUSD"}))
        await state_is(running, "desk", lambda s: s.orders, "an open order")
        [order] = running.service.engine.state("desk").orders  # (placed by a tool step)
        running.service.on_market([Tick(symbol="BTCUSD", price=64_123.456,
                                        at=datetime.now(UTC))])
        await state_is(running, "desk", lambda s: not s.orders and s.active is None,
                       "the order filled and the run over")
        page = await open_panel(running.url, CONTROL)
        await resize(page, *WIDTHS[0])
        await page.get_by_role("link", name="Blotter").click()
        fill = page.locator(f'[data-part="fills"] [data-fill="{order}"]')
        await expect(fill).to_contain_text("64,123.5")  # to the tick (0.5), not 64,123.456
        await expect(fill).not_to_contain_text("64,123.46")

        await fill.locator(f'a[data-order-link="{order}"]').click()
        await expect(page).to_have_url(re.compile(rf"#/agent/desk\?order={order}$"))
        drill = page.locator("#drill")
        await expect(drill.locator("#drill-title")).to_have_text(f"Order {order}")
        life = drill.locator("#drill-life > li")
        await expect(life).to_have_count(4)
        assert await life.evaluate_all("items => items.map(i => i.dataset.stage)") == [
            "placed", "broker: filled", "filled", "closed: filled"]
        await expect(drill.locator("#drill-order-status")).to_have_text("filled")
        await expect(life.first).to_contain_text(f"OrderAccepted {order} buy 0.25 BTCUSD")
        # The server's own words say the fill's price to the tick too, here and in the story.
        await expect(life.nth(2)).to_contain_text(f"OrderFilled {order}: 0.25 at 64,123.5")
        await expect(drill.locator("#drill-life")).not_to_contain_text("64123.456")
        async with http(running) as client:
            story = (await client.get("/api/agents/desk/story")).json()
        told = " ".join(s["text"] for g in story["groups"] for s in g["decisions"])
        assert f"OrderFilled {order}: 0.25 at 64,123.5" in told, told
        # The run that placed it, its prompt and its tool steps.
        run = drill.locator("#drill-run")
        await expect(run).to_have_attribute("data-run", "desk-r1")
        await expect(run.locator("#drill-prompt li[data-request]")).to_have_count(1)
        await expect(run.locator("#drill-prompt")).to_contain_text("hook_trigger")
        first = run.locator('#drill-steps [data-step="1"] [data-tool="market_snapshot"]')
        await expect(first).to_have_class(re.compile("failed"))  # (no price had come yet)
        await expect(first.locator(".tool-result")).to_contain_text("no price seen for BTCUSD")
        placed = run.locator('#drill-steps [data-step="2"] [data-tool="place_order"]')
        await expect(placed).to_have_class(re.compile("returned"))
        await expect(placed.locator(".tool-result")).to_contain_text(order)
        await expect(run.locator(f'#drill-orders a[data-order-link="{order}"]')).to_be_visible()
        await screenshot(page, "drill-order-1280", full_page=True)

        await run.locator('a[data-run-link="desk-r1"]').first.click()
        await expect(page).to_have_url(re.compile(r"#/agent/desk\?run=desk-r1$"))
        await expect(drill.locator("#drill-title")).to_have_text("Run desk-r1")
        await expect(drill.locator("#drill-order")).to_have_count(0)
        await expect(drill.locator('#drill-steps > li')).to_have_count(3)
        await fits(page, 1280)
        await screenshot(page, "drill-run-1280")

        await resize(page, *WIDTHS[1])
        await page.goto(f"{running.url}/#/agent/desk?order={order}")
        await expect(drill.locator("#drill-life > li")).to_have_count(4)
        await expect(drill.locator("#drill-title")).to_be_in_viewport()
        await fits(page, 390)
        await screenshot(page, "drill-order-390")

        # A tick of a quarter shows two decimals, as the server words it (not "5,012.3").
        said = await page.evaluate("""import("/js/format.js").then((f) => {
            f.setTicks({tick: 0.01, ticks: {ES: 0.25, EURUSD: 0.00001}});
            return [f.price(5012.25, "ES"), f.price(5012.4, "ES"), f.price(1.0842371, "EURUSD")];
        })""")
        assert said == ["5,012.25", "5,012.50", "1.08424"], said


async def test_the_message_box_steers_a_message_into_the_run_and_the_run_lists_it(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "message.db"
    config = panel_config(db, [agent("talker", (20_000, 20_000))], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        await submit(running, request("talker"))
        await state_is(running, "talker", lambda s: s.active is not None and s.active.steerable,
                       "a run that takes steers")
        page = await open_panel(running.url, CONTROL)
        await resize(page, *WIDTHS[0])
        await page.goto(f"{running.url}/#/agent/talker")
        box = page.get_by_role("form", name="Message to talker")
        await box.get_by_label("Message to talker").fill("Cut the BTC position")
        await box.get_by_label("While it is busy:").select_option("steer")
        await box.get_by_role("button", name="Send").click()
        result = page.locator("#message-result")
        await expect(result).to_have_text(re.compile(
            r"^Message to talker: steered into talker-r1 \(log position \d+\)$"))
        await expect(box.get_by_label("Message to talker")).to_have_value("")
        await box.get_by_label("Message to talker").fill("Then look at ETH")
        await box.get_by_label("While it is busy:").select_option("")
        await box.get_by_role("button", name="Send").click()
        await expect(result).to_have_text(re.compile(
            r"^Message to talker: queued \(followup\) \(log position \d+\)$"))
        await screenshot(page, "message-1280")

        await page.goto(f"{running.url}/#/agent/talker?run=talker-r1")
        steers = page.locator("#drill-steers li[data-request]")
        await expect(steers).to_have_count(1)
        await expect(steers).to_contain_text("Cut the BTC position")
        await expect(steers).to_contain_text("by ops")
        await expect(page.locator("#drill-run")).to_contain_text("running…")
        await fits(page, 1280)
        await screenshot(page, "drill-run-steered-1280")

        await resize(page, *WIDTHS[1])
        await page.goto(f"{running.url}/#/agent/talker")
        await page.locator("#message-box").scroll_into_view_if_needed()
        await expect(page.get_by_role("button", name="Send")).to_be_in_viewport()
        await fits(page, 390)
        await screenshot(page, "message-390")


async def test_what_if_from_a_time_travel_position_compares_the_recorded_runs_with_another_config(
    tmp_path: Path, open_panel: OpenPanel
) -> None:
    db = tmp_path / "whatif.db"
    config = panel_config(db, [agent("capped", (10, 20), budgets={"max_runs_per_hour": 1})],
                          hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        for _ in range(4):
            await submit(running, request("capped"))
        await state_is(running, "capped", lambda s: s.suppressed is not None and s.active is None,
                       "one run, then runs suppressed by the hourly budget")
        page = await open_panel(running.url, CONTROL)
        for width, height in WIDTHS:
            await resize(page, width, height)
            await page.goto(f"{running.url}/#/agent/capped")
            await page.reload()  # (a fresh page each time: the form starts from the config)
            slider = page.get_by_label("Log position of capped")
            await expect(slider).not_to_have_attribute("max", "0")
            await slider.focus()
            await page.keyboard.press("Home")  # the start of its log
            await expect(page.locator("#replay")).to_have_attribute("data-position",
                                                                    re.compile(r"^\d+$"))
            form = page.get_by_role("form", name="What-if from here")
            hourly = form.get_by_label("Max runs per hour")
            await expect(hourly).to_have_value("1")
            await hourly.fill("")  # no limit
            await form.get_by_role("button", name="Run what-if from here").click()
            table = page.locator("#whatif-table")
            runs = table.locator('tr[data-measure="runs"] td')
            # (the first what-if starts the worker process: seconds on a busy machine)
            await expect(runs).to_have_text(["1", "4", "+3"], timeout=60_000)
            await expect(table.locator('tr[data-measure="suppressions"] td')).to_have_text(
                ["1", "0", "-1"])
            await expect(page.locator("#whatif-changes")).to_contain_text(
                "budgets.maxRunsPerHour 1 → none")
            await page.locator("#whatif").scroll_into_view_if_needed()
            await fits(page, width)
            await screenshot(page, f"whatif-{width}")
