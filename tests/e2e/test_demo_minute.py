"""`gateway demo` shows the product within a minute (issue 26, item 10), read through the
HTTP API as the panel reads it: a run with tool steps, an open order, an order waiting for
approval, a sub-agent batch with its results, a schedule that fired and a suppressed agent;
and a restart on the same log keeps its tokens, so an open panel stays logged in.

The demo runs in real time (it has no faster clock): each item is checked again whenever an
event that could show it commits (a subscription from the log's start), within 60 s of the
demo saying where it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.client import ControlClient, HttpClient, Unauthorized
from tests.e2e.live import START_TIMEOUT

pytestmark = pytest.mark.slow

SHOWN_WITHIN_S = 60.0
AGENTS = ("agent_btc_5m", "agent_eth_1m", "agent_news")


@contextlib.asynccontextmanager
async def demo(cwd: Path) -> AsyncIterator[tuple[str, dict[str, str], float]]:
    """``gateway demo`` on ``cwd/demo.db`` and an ephemeral port: its URL, its tokens by role
    and when it said where it serves (monotonic); stopped (SIGTERM) after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "demo", "--db", str(cwd / "demo.db"), "--port", "0",
        cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        assert process.stdout is not None
        printed: list[str] = []
        url, tokens, since = "", {}, 0.0
        while not printed or not printed[-1].startswith("event log:"):
            line = (await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT)).decode()
            assert line, f"the demo ended: {printed}"
            printed.append(line.rstrip())
            if line.startswith("gateway serving on "):
                url, since = line.split()[-1], time.monotonic()
            elif " token (" in line:  # "viewer token (demo-viewer): <secret>"
                tokens[line.split()[0]] = line.split()[-1]
        yield url, tokens, since
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 60)


async def tool_steps(api: HttpClient) -> bool:
    for agent in AGENTS:
        for run in (await api.runs(agent, limit=100)).runs:
            if any(step.get("tools") for step in run.steps):
                return True
    return False


async def open_order(api: HttpClient) -> bool:
    return bool((await api.orders()).open_orders)


async def approval(api: HttpClient) -> bool:
    return bool(await api.approvals())


async def batch_with_results(api: HttpClient) -> bool:
    """A run that sent several calls at once, with their results coming back (not all of
    them need be back: agent_eth_1m may have used its 3 runs of the hour before the first
    audit asks it, and then answers when its budget allows)."""
    for run in (await api.calls("agent_news")).runs:
        if len(run.calls) > 1 and any(c["status"] == "returned" for c in run.calls):
            return True
    return False


async def schedule_fired(api: HttpClient) -> bool:
    return any(s.fired > 0 for s in await api.schedules("agent_news"))


async def suppressed(api: HttpClient) -> bool:
    for agent in AGENTS:
        if await api.story_find(agent, "suppression", after=0) is not None:
            return True
    return False


SHOWN: dict[str, tuple[Callable[[HttpClient], Awaitable[bool]], frozenset[str]]] = {
    "a run with tool steps": (tool_steps, frozenset({"ToolResultTaken"})),
    "an open order": (open_order, frozenset({"OrderAccepted"})),
    "a pending approval": (approval, frozenset({"ApprovalRequested"})),
    "a sub-agent batch with results": (batch_with_results, frozenset({"CallEnded"})),
    "a schedule that fired": (schedule_fired, frozenset({"RequestReceived"})),
    "a suppressed agent": (suppressed, frozenset({"RunsSuppressed"})),
}
"""What the demo shows within a minute: how the API tells it, and the events after which to
ask again."""


async def shown_within(url: str, token: str, since: float) -> dict[str, float]:
    """When each of `SHOWN` was first seen (seconds after ``since``); fails the test if one
    is not seen within `SHOWN_WITHIN_S`."""
    seen: dict[str, float] = {}
    async with HttpClient(url, token) as api, ControlClient(url, token) as client:

        async def ask(names: list[str]) -> None:
            for name in names:
                if name not in seen and await SHOWN[name][0](api):
                    seen[name] = time.monotonic() - since

        async def watch() -> None:
            await ask(list(SHOWN))
            async with client.subscribe(list(AGENTS), after=0) as events:
                async for event in events:
                    await ask([name for name, (_, types) in SHOWN.items()
                               if event.event_type in types])
                    if len(seen) == len(SHOWN):
                        return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch(), since + SHOWN_WITHIN_S - time.monotonic())
    missing = sorted(set(SHOWN) - set(seen))
    assert missing == [], f"not shown within {SHOWN_WITHIN_S:.0f} s: {missing}; seen {seen}"
    return seen


async def test_the_demo_shows_the_product_within_a_minute_and_keeps_its_tokens(
        tmp_path: Path) -> None:
    async with demo(tmp_path) as (url, tokens, since):
        assert set(tokens) == {"feed", "control", "viewer", "admin", "worker"}
        seen = await shown_within(url, tokens["viewer"], since)
    print("\nshown after: " + ", ".join(f"{name} {at:.1f} s" for name, at in
                                        sorted(seen.items(), key=lambda item: item[1])))
    assert (tmp_path / "demo.db.tokens.json").exists()  # kept beside its log
    async with demo(tmp_path) as (again, kept, _):
        assert kept == tokens
        async with HttpClient(again, tokens["control"]) as api:  # the old token still works
            assert [a.agent_id for a in await api.agents()] == list(AGENTS)
        async with HttpClient(again, "a-token-of-another-start") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.agents()
