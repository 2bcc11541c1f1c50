"""The blotter in the panel: orders driven through the simulated reasoner and the paper broker
show up on the agent page and on the desk blotter, live, with rejections' reasons."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from playwright.async_api import Page, expect

from gateway.edge.server import Running
from gateway.market.events import ConnectorStatus, Tick
from tests.browser.conftest import OpenPanel, screenshot
from tests.browser.live import (
    CONTROL,
    VIEWER,
    agent,
    http,
    live_gateway,
    panel_config,
    request,
    submit,
)
from tests.gateway.support import until

FILL_PRICE = 64_123.5
MINUS = "\u2212"


def trader(agent_id: str) -> dict[str, object]:
    """An agent whose every run places one market order (the symbol its request names)."""
    table = agent(agent_id, (30, 60))
    table["reasoner"]["trade_probability"] = 1.0
    return table


async def open_orders(running: Running, agent_id: str, n: int) -> None:
    async def counted() -> bool:
        return len(running.service.engine.state(agent_id).orders) == n
    await until(counted, f"{n} open orders of {agent_id}")


async def trade(running: Running, agent_id: str, symbol: str) -> None:
    await submit(running, request(agent_id, payload={"symbol": symbol}))


async def scene(running: Running) -> None:
    """alpha: an ETHUSD order left open (no ETH price yet), a BTCUSD one the paper broker
    fills at the feed's next tick, then paused, a SOLUSD order the trading gate rejects;
    bravo: a BTCUSD order filled by the same tick."""
    await trade(running, "alpha", "ETHUSD")
    await open_orders(running, "alpha", 1)
    await trade(running, "alpha", "BTCUSD")
    await trade(running, "bravo", "BTCUSD")
    await open_orders(running, "alpha", 2)
    await open_orders(running, "bravo", 1)
    assert running.service.market_observer is not None
    running.service.on_market([Tick(symbol="BTCUSD", price=FILL_PRICE,  # as a feed frame does
                                    at=datetime.now(UTC))])
    await open_orders(running, "alpha", 1)
    await open_orders(running, "bravo", 0)
    async with http(running) as client:
        paused = await client.post("/api/agents/alpha/control", json={"action": "pause"})
        assert paused.status_code == 200, paused.text
    await trade(running, "alpha", "SOLUSD")


async def expect_alpha(page: Page, root: str) -> None:
    """What alpha's blotter must show, in the container ``root``."""
    blotter = page.locator(root)
    opened = blotter.locator('[data-part="open"] [data-order="alpha-r1-o1"]')
    await expect(opened).to_contain_text("ETHUSD")
    await expect(opened).to_contain_text("working")
    fill = blotter.locator('[data-part="fills"] [data-fill="alpha-r2-o1"]')
    await expect(fill).to_contain_text("64,123.50")
    await expect(fill).to_contain_text("BTCUSD")
    rejection = blotter.locator('[data-part="rejections"] tr').filter(has_text="SOLUSD")
    await expect(rejection).to_contain_text("trading gate")
    await expect(rejection).to_contain_text(
        "agent is REDUCING: only orders that reduce the SOLUSD position (0) are allowed")
    position = blotter.locator('[data-position="alpha/BTCUSD"]')
    await expect(position).to_contain_text("64,123.50")
    await expect(position).to_contain_text("long" if "buy" in (await fill.inner_text())
                                           else "short")


async def test_the_agent_page_shows_open_orders_fills_rejections_and_positions_live(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    config = panel_config(db, [trader("alpha"), trader("bravo")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, VIEWER)
        await page.goto(f"{running.url}/#/agent/alpha")
        await expect(page.locator("#agent-blotter-status")).to_contain_text("0 open orders")
        await scene(running)  # everything after the page loaded: it follows the log live
        await expect_alpha(page, "#agent-blotter")
        await expect(page.locator("#agent-blotter-status")).to_contain_text("1 open order ")
        await expect(page.locator("#agent-blotter [data-agent]")).to_have_count(0)
        await expect(page.locator("#agent-blotter")).not_to_contain_text("bravo")
        await expect(page.locator("[data-cancel-order]")).to_have_count(0)  # a viewer's
        await page.locator("#agent-blotter").scroll_into_view_if_needed()
        await screenshot(page, "blotter-agent")
        await page.reload()  # from the log, not from what the page saw
        await expect_alpha(page, "#agent-blotter")

        await page.get_by_role("link", name="Event log").click()  # away while it changes
        async with http(running) as client:
            asked = await client.post("/api/agents/alpha/control",
                                      json={"action": "cancel_order", "orderId": "alpha-r1-o1"})
            assert asked.json()["decision"] == "accepted", asked.text
        await open_orders(running, "alpha", 0)  # the paper broker cancelled it
        closed = page.locator('#events-view [data-type="OrderClosed"][data-stream="alpha"]'
                              ).filter(has_text="alpha-r1-o1")
        await expect(closed).to_have_count(1)  # the page has the events, seen from elsewhere
        await page.go_back()
        cancel = page.locator('#agent-blotter [data-part="cancels"] [data-cancel="alpha-r1-o1"]')
        await expect(cancel).to_contain_text("ops (cancel_order)")
        await expect(cancel).to_contain_text("cancelled at")


async def test_the_desk_blotter_shows_every_agent_and_filters_by_agent_and_symbol(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    config = panel_config(db, [trader("alpha"), trader("bravo")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, VIEWER)
        await page.get_by_role("link", name="Blotter").click()
        view = page.locator("#blotter-view")
        await expect(page.locator("#blotter-status")).to_contain_text("2 agents")
        await scene(running)
        await expect_alpha(page, "#desk-blotter")
        fills = page.locator('#desk-blotter [data-part="fills"] tbody tr')
        await expect(fills).to_have_count(2)
        await expect(page.locator('#desk-blotter [data-fill="bravo-r1-o1"]')).to_contain_text(
            "bravo")
        net = page.locator("#desk-net")  # the two agents' BTCUSD added up
        alpha_qty = await page.locator('[data-position="alpha/BTCUSD"]').get_attribute("data-net")
        bravo_qty = await page.locator('[data-position="bravo/BTCUSD"]').get_attribute("data-net")
        total = float(alpha_qty or "nan") + float(bravo_qty or "nan")
        shown = f"{abs(total):.8f}".rstrip("0").rstrip(".")  # as the page rounds it
        await expect(net).to_contain_text(f"BTCUSD {'+' if total > 0 else MINUS}{shown}")
        await screenshot(page, "blotter-desk", full_page=True)

        await view.get_by_label("Agent", exact=True).select_option("bravo")
        await expect(page).to_have_url(f"{running.url}/#/blotter?agent=bravo")
        await expect(fills).to_have_count(1)
        await expect(page.locator("#desk-blotter")).not_to_contain_text("alpha-r")

        await view.get_by_label("Agent", exact=True).select_option("")
        await view.get_by_label("Symbol", exact=True).fill("ethusd")
        await view.get_by_label("Symbol", exact=True).press("Enter")
        await expect(page.locator("#blotter-status")).to_contain_text("ETHUSD")
        await expect(page.locator('#desk-blotter [data-part="open"] tbody tr')).to_have_count(1)
        await expect(page.locator('#desk-blotter [data-part="fills"]')).to_contain_text(
            "No fill.")

        await page.set_viewport_size({"width": 390, "height": 844})
        await view.get_by_label("Symbol", exact=True).fill("")
        await view.get_by_label("Symbol", exact=True).press("Enter")
        await expect(fills).to_have_count(2)
        await screenshot(page, "blotter-desk-phone", full_page=True)


async def test_an_open_order_is_cancelled_from_its_row_and_the_cancel_says_who_asked(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    config = panel_config(db, [trader("alpha")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        await page.goto(f"{running.url}/#/agent/alpha")
        await trade(running, "alpha", "ETHUSD")  # no ETH price: it rests at the paper broker
        blotter = page.locator("#agent-blotter")
        row = blotter.locator('[data-part="open"] [data-order="alpha-r1-o1"]')
        await row.get_by_role("button", name="Cancel order alpha-r1-o1 of alpha").click()
        await expect(page.locator("#confirm-text")).to_contain_text("ETHUSD")
        # (not "Cancel" beside "Cancel order": which one keeps the order?)
        await expect(page.locator("#confirm-cancel")).to_have_text("Keep order")
        await expect(page.locator("#confirm-ok")).to_have_text("Cancel order")
        await page.locator("#confirm-ok").click()
        await expect(page.locator("#agent-blotter-result")).to_contain_text(
            "Cancel alpha-r1-o1: cancel sent to the broker")
        cancel = blotter.locator('[data-part="cancels"] [data-cancel="alpha-r1-o1"]')
        await expect(cancel).to_contain_text("ops (cancel_order)")
        await expect(cancel).to_contain_text("cancelled at")
        await expect(blotter.locator('[data-part="open"]')).to_contain_text("No open order.")
        await cancel.scroll_into_view_if_needed()
        await screenshot(page, "blotter-cancelled")


async def test_an_order_waiting_for_approval_is_approved_and_another_rejected_from_the_panel(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    table = trader("alpha")
    table["approval"] = "always"
    config = panel_config(db, [table], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, CONTROL)
        await page.goto(f"{running.url}/#/blotter")
        waiting = page.locator("#approvals-list [data-approval]")
        await expect(page.locator("#approvals-status")).to_contain_text("0 orders waiting")
        await trade(running, "alpha", "ETHUSD")
        await expect(waiting).to_have_count(1)  # live, from the log's events
        first = page.locator('[data-approval="alpha-r1-o1"]')
        await expect(first).to_contain_text("ETHUSD")
        await first.get_by_role("button", name="Approve").click()
        await expect(page.locator("#confirm-text")).to_contain_text("alpha wants to")
        await page.locator("#confirm-ok").click()
        await expect(page.locator("#approvals-result")).to_contain_text(
            "Approve alpha-r1-o1: approved")
        await open_orders(running, "alpha", 1)  # the approved order is open at the broker
        await expect(first).to_have_count(0)
        # The outcome reached alpha as a request: its run trades again, and that order waits.
        second = page.locator('[data-approval="alpha-r2-o1"]')
        await expect(second).to_have_count(1)
        await second.get_by_role("button", name="Reject").click()
        await page.locator("#confirm-ok").click()
        await expect(page.locator("#approvals-result")).to_contain_text(
            "Reject alpha-r2-o1: rejected")
        await expect(second).to_have_count(0)
        await screenshot(page, "approvals", full_page=True)
        assert len(running.service.engine.state("alpha").orders) == 1


async def test_the_desk_pnl_marks_positions_to_the_feed_and_follows_the_price(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    config = panel_config(db, [trader("alpha"), trader("bravo")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, VIEWER)
        await page.get_by_role("link", name="Blotter").click()
        await scene(running)
        row = page.locator('#desk-pnl [data-pnl="alpha/BTCUSD"]')
        await expect(row).to_contain_text("64,123.50")  # the fill's tick is the mark
        await expect(page.locator("#pnl-totals")).to_contain_text("Desk: P&L")
        net = float(await page.locator('[data-position="alpha/BTCUSD"]').get_attribute(
            "data-net") or "nan")
        running.service.on_market([Tick(symbol="BTCUSD", price=FILL_PRICE + 1_000,
                                        at=datetime.now(UTC))])
        await expect(row).to_contain_text("65,123.50")  # read again as prices move
        gain = f"{'+' if net > 0 else MINUS}{abs(net) * 1_000:,.2f}"
        await expect(row).to_contain_text(gain)
        for width in (1920, 1280, 390):
            await page.set_viewport_size({"width": width, "height": 900})
            await expect(row).to_be_visible()
            await screenshot(page, f"pnl-desk-{width}", full_page=True)
            if width >= 1280:  # every column of every table is shown, none scrolled away
                cut = await page.eval_on_selector_all(
                    "#blotter-view .blotter-scroll",
                    "els => els.filter(e => e.scrollWidth > e.clientWidth + 1)"
                    ".map(e => e.querySelector('table').getAttribute('aria-label'))")
                assert cut == [], f"tables cut at {width} px: {cut}"


async def test_the_feed_view_shows_connectors_symbols_and_pauses_the_hook_rules(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    config = panel_config(db, [trader("alpha")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        running.service.on_market([
            ConnectorStatus(connector="binance", status="down", detail="socket closed",
                            at=datetime.now(UTC)),
            Tick(symbol="BTCUSD", price=FILL_PRICE, at=datetime.now(UTC))])
        page = await open_panel(running.url, CONTROL)
        await page.get_by_role("link", name="Feed").click()
        await expect(page.locator('[data-connector="binance"]')).to_contain_text("down")
        await expect(page.locator('[data-symbol="BTCUSD"]')).to_contain_text("64,123.50")
        await expect(page.locator("#feed-warnings")).to_contain_text(
            "connector binance is down: socket closed")
        await page.locator("#feed-hooks").click()
        await page.locator("#confirm-ok").click()
        await expect(page.locator("#feed-status")).to_contain_text("hook rules paused by ops")
        assert running.service.feed.hooks.paused
        await screenshot(page, "feed", full_page=True)
        await page.locator("#feed-hooks").click()  # resuming needs no confirm
        await expect(page.locator("#feed-status")).to_contain_text("hook rules on")


NOTIFICATIONS = """
window.__notes = [];
window.Notification = class {
  static permission = "default";
  static requestPermission() {
    window.Notification.permission = "granted";
    return Promise.resolve("granted");
  }
  constructor(title, options) { window.__notes.push([title, options.body]); }
};
"""


async def test_alerts_are_listed_said_as_notifications_and_counted_in_the_header(
        tmp_path: Path, open_panel: OpenPanel) -> None:
    db = tmp_path / "panel.db"
    table = trader("alpha")
    table["approval"] = "always"
    config = panel_config(db, [table, trader("bravo")], hooked=[])
    async with live_gateway(config, db, feed=False) as running:
        page = await open_panel(running.url, CONTROL, init_script=NOTIFICATIONS)
        await page.get_by_role("link", name="Alerts", exact=True).click()
        await expect(page.locator("#alerts-status")).to_contain_text("0 alerts")
        await page.locator("#alerts-notify").check()  # asks the browser's permission
        await expect(page.locator("#alerts-notify")).to_be_checked()
        async with http(running) as client:
            stopped = await client.post("/api/agents/bravo/control",
                                        json={"action": "emergency_stop"})
            assert stopped.status_code == 200, stopped.text
        halt = page.locator('#alerts-list [data-kind="halt"]')
        await expect(halt).to_contain_text("bravo HALTED (emergency_stop)")
        await trade(running, "alpha", "ETHUSD")  # its order waits for approval
        await expect(page.locator('#alerts-list [data-kind="approval_waiting"]')).to_have_count(1)
        await expect(page.locator("#approvals-count")).to_have_text("1 to approve")
        await expect(page.locator("#alerts-count")).to_have_attribute("aria-label",
                                                                     "2 new alerts")
        # Both counts shown, the header stays one line at 1280 px (a wrap moved the page).
        await page.set_viewport_size({"width": 1280, "height": 800})
        tops = await page.evaluate("""[...document.querySelectorAll(
            'header.top > h1, header.top > nav, header.top > .session')]
            .map((e) => Math.round(e.getBoundingClientRect().top))""")
        assert max(tops) - min(tops) < 12, tops
        notes = await page.evaluate("window.__notes")
        assert ["Gateway: halt", "bravo HALTED (emergency_stop)"] in notes
        await screenshot(page, "alerts", full_page=True)
        await page.get_by_role("link", name="Overview").click()
        await page.get_by_role("link", name="Alerts", exact=True).click()
        await expect(page.locator("#alerts-count")).to_be_hidden()  # looked at: none new
