"""Fixtures of the browser tests: Debian's Chromium driven by Playwright, and a way to open
the panel logged in. Every page's script errors fail the test that caused them."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Literal

import pytest
from playwright.async_api import Browser, Page, WebSocket, async_playwright, expect

CHROMIUM = Path("/usr/bin/chromium")
INSTALLED = CHROMIUM.exists()
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTEFACTS = Path(__file__).resolve().parent / "artefacts"
WAIT_MS = 10_000
ZONED = r"\d\d:\d\d:\d\d (?:UTC|GMT(?:[+-]\d{1,2}(?::\d\d)?)?|[A-Z]{2,5})"
"""A time to the second as the panel shows every time: 24-hour, with its zone."""

OpenPanel = Callable[..., Awaitable[Page]]
expect.set_options(timeout=WAIT_MS)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Chromium, headless; skipped only where it is not installed (CI installs it)."""
    if not INSTALLED:
        if os.environ.get("BROWSER_TESTS_REQUIRED"):
            pytest.fail(f"{CHROMIUM} is missing; install Debian's chromium package")
        pytest.skip(f"Debian's Chromium is not installed at {CHROMIUM} "
                    "(apt-get install chromium; .ci/run does)")
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
async def open_panel(browser: Browser) -> AsyncIterator[OpenPanel]:
    """Open the panel at ``url`` logged in with ``token``; script errors fail the test."""
    errors: list[str] = []

    async def open_(url: str, token: str, scheme: Literal["light", "dark"] = "light",
                    on_websocket: Callable[[WebSocket], None] | None = None,
                    init_script: str | None = None, timezone_id: str | None = None) -> Page:
        context = await browser.new_context(viewport={"width": 1440, "height": 900},
                                            color_scheme=scheme, timezone_id=timezone_id)
        context.set_default_timeout(WAIT_MS)
        if init_script is not None:  # (run in the page before its own scripts)
            await context.add_init_script(init_script)
        page = await context.new_page()
        page.on("pageerror", lambda error: errors.append(f"{url}: {error}"))
        if on_websocket is not None:
            page.on("websocket", on_websocket)
        await page.goto(url + "/")
        await page.get_by_label("Token").fill(token)
        await page.get_by_role("button", name="Connect").click()
        await expect(page.locator("#connection")).to_have_text("Connected · live")
        return page

    yield open_
    assert errors == [], errors


async def resize(page: Page, width: int, height: int) -> None:
    """Make the window ``width`` x ``height`` and wait until the page has taken it."""
    await page.set_viewport_size({"width": width, "height": height})
    await expect(page.locator("html")).to_have_js_property("clientWidth", width)


async def fits(page: Page, width: int) -> None:
    """Nothing makes the page wider than the window (``width``)."""
    wide = await page.evaluate("document.documentElement.scrollWidth")
    assert wide <= width, (width, wide)


async def screenshot(page: Page, name: str, full_page: bool = False) -> None:
    """Keep a picture of a view as a test artefact (``tests/browser/artefacts``)."""
    ARTEFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTEFACTS / f"{name}.png", full_page=full_page)
