"""The panel's load time at a big desk: a gateway of ``agents`` agents with some log, opened
in Chromium (Playwright, Debian's ``/usr/bin/chromium``), timed on the page's own clock.

The gateway runs in this process (uvicorn on 127.0.0.1, SQLite) with ``agents`` agents
behind one simulated provider gate; each agent has had ``runs`` runs (1 to 5 ms each), so the
log holds about 12 events per run. Then, ``reps`` times, a fresh browser context (nothing
cached) opens the panel with a viewer token already in its session, and the page's
``performance.now()`` (from the navigation's start) is noted:

- overview: when the overview's summary counts every agent and its table shows rows (the
  first paint with all of them; the rest of the table is virtualised);
- capacity, first: from the capacity view's route to its charts drawn from a whole answer
  of ``GET /api/capacity`` (the first ask after the gateway's start folds the log, and a
  long log's is answered in parts: only in the first repetition);
- capacity, again: the same on a later visit.

    uv run python -m bench.panel_load [--agents 1000] [--runs 4] [--reps 5]
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Figure, requests, run
from gateway.config import validate_config
from gateway.edge.server import Running, serving
from gateway.runtime.intake import take_all
from gateway.wiring import build_service

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "bench-viewer-token-0123456789"
TIMEOUT_MS = 120_000
GOAL_MS = 2_000

OVERVIEW_DONE = """(count) => {
  const summary = document.querySelector("#overview-view .summary");
  const rows = document.querySelectorAll("#agents-table tbody tr[data-agent]").length;
  if (summary && summary.textContent.startsWith(`${count} agents`) && rows > 0) {
    window.__overviewAt ??= performance.now();
    return true;
  }
  return false;
}"""
CAPACITY_DONE = """(after) => {
  const section = document.getElementById("capacity-view");
  const status = document.getElementById("capacity-status");
  if (section && !section.hidden && section.dataset.position && status
      && status.textContent.startsWith("From the log")
      && !status.textContent.includes("reading the log")
      && Number(section.dataset.position) >= after) {
    window.__capacityAt = performance.now();
    return true;
  }
  return false;
}"""


async def desk(agents: int, runs: int, db: Path) -> Any:
    """The gateway's service: ``agents`` agents behind one simulated gate."""
    names = [f"agent{n:04d}" for n in range(agents)]
    config = validate_config({
        "server": {"host": "127.0.0.1", "port": 0}, "store": {"path": str(db)},
        "tokens": [{"name": "bench", "token": TOKEN, "role": "viewer"}],
        "providers": [{"name": "sim-llm", "kind": "simulated",
                       "limits": {"requests_per_minute": 100_000, "max_concurrent": 50}}],
        "agents": [{"id": name, "mode": "followup",
                    "reasoner": {"latency_ms": [1, 5], "trade_probability": 0.0,
                                 "provider": "sim-llm"}} for name in names]}, "<bench>")
    return build_service(config, db), names


async def fill(running: Running, names: list[str], runs: int) -> int:
    """One request per agent, ``runs`` times, each round waiting for every run to end; the
    log's length."""
    engine = running.service.engine
    for _ in range(runs):
        for start in range(0, len(names), 100):
            await take_all(engine, requests(names[start:start + 100], 100))
        for _ in range(12_000):
            if not any(engine.state(a).active or engine.state(a).pending for a in names):
                break
            await asyncio.sleep(0.05)
    await engine.flush()
    return await running.service.log.last_position()


async def timed_loads(url: str, agents: int, reps: int) -> dict[str, list[float]]:
    """Each repetition's times (ms): the overview with every agent, then the capacity view
    (the first repetition's is the gateway's first ask), then the capacity view again."""
    from playwright.async_api import async_playwright

    times: dict[str, list[float]] = {"overview": [], "capacity first": [], "capacity": []}
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            for rep in range(reps):
                context = await browser.new_context(viewport={"width": 1280, "height": 900})
                await context.add_init_script(
                    f"sessionStorage.setItem('gateway-panel-token', {TOKEN!r});")
                page = await context.new_page()
                await page.goto(url + "/#/overview")
                await page.wait_for_function(OVERVIEW_DONE, arg=agents, polling="raf",
                                             timeout=TIMEOUT_MS)
                times["overview"].append(await page.evaluate("window.__overviewAt"))
                for visit in ("capacity first" if rep == 0 else "capacity", "capacity"):
                    await page.evaluate("location.hash = '#/overview'")
                    began = await page.evaluate(
                        "(() => { location.hash = '#/capacity'; return performance.now(); })()")
                    await page.wait_for_function(CAPACITY_DONE, arg=0, polling="raf",
                                                 timeout=TIMEOUT_MS)
                    times[visit].append(await page.evaluate("window.__capacityAt") - began)
                await context.close()
        finally:
            await browser.close()
    return times


async def load_times(agents: int, runs: int, reps: int) -> list[Figure]:
    """See the module."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp, "events.db")
        service, names = await desk(agents, runs, db)
        async with serving(service) as running:
            events = await fill(running, names, runs)
            times = await timed_loads(running.url, agents, reps)
    overview, again = times["overview"], times["capacity"]
    return [
        Figure(f"log: {agents:,} agents, {runs} runs each", events, "events"),
        Figure(f"open the panel -> overview with all {agents:,} agents, p50 ({reps} fresh "
               "browser contexts)", statistics.median(overview), "ms", f"<= {GOAL_MS:,} ms"),
        Figure("... max", max(overview), "ms"),
        Figure("capacity view, the gateway's first ask (folds the log)",
               times["capacity first"][0], "ms"),
        Figure(f"capacity view again, p50 ({len(again)} visits)", statistics.median(again),
               "ms"),
    ]


def measure(agents: int = 1_000, runs: int = 4, reps: int = 5) -> list[Figure]:
    """The panel's load times (no figures where Chromium is not installed)."""
    if not CHROMIUM.exists():
        print(f"{CHROMIUM} is missing: no figures")
        return []
    return asyncio.run(load_times(agents, runs, reps))


if __name__ == "__main__":
    run(measure, agents=1_000, runs=4, reps=5)
