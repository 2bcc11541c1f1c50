"""The real gateway process, SIGKILLed in the middle of a tool loop (issue 24): the restart
aborts the cut-off run (``restart``), no order is placed twice, no step of the cut-off run
is recorded after the restart, and ``gateway verify`` is clean."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.crash import CONTROL_TOKEN, ROOT, TIMEOUT, kill, read_log, start
from gateway.client import ControlClient, EventFrame, Subscription
from lanes import replay, verify
from lanes.events import (
    AbortReason,
    ModelCalled,
    OrderAccepted,
    RequestReceived,
    RunAborted,
    RunFinished,
    StepDecided,
    ToolResultTaken,
    ToolReturned,
)

AGENT = "looper"
CONFIG = """
[server]
host = "127.0.0.1"
port = 0

[store]
path = "{db}"
synchronous = "FULL"

[[tokens]]
name = "ops"
token = "{control}"
role = "control"

[[providers]]
name = "sim-llm"
kind = "simulated"

[[agents]]
id = "looper"
mode = "followup"
tools = ["positions", "open_orders", "place_order"]
[agents.reasoner]
provider = "sim-llm"
trade_probability = 0.0
seed = 1
symbol = "BTCUSD"
# Six model calls of 2 s each: the order is placed at the second, four follow it.
latency_ms = [12000, 12000]
tool_steps = [
  [{{tool = "positions"}}],
  [{{tool = "place_order", arguments = {{symbol = "BTCUSD", side = "buy", qty = 0.1}}}}],
  [{{tool = "open_orders"}}],
  [{{tool = "open_orders"}}],
  [{{tool = "positions"}}],
]
"""
STEPS = (ModelCalled, StepDecided, ToolReturned, ToolResultTaken, OrderAccepted)
"""What a run's steps record."""


async def until(events: Subscription, found: Callable[[EventFrame], bool]) -> EventFrame:
    """The first event of the subscription that ``found`` is true of (within `TIMEOUT`)."""
    async with asyncio.timeout(TIMEOUT):
        async for event in events:
            if found(event):
                return event
    raise AssertionError("the subscription ended")


def placed_an_order(event: EventFrame) -> bool:
    return event.event_type == "OrderAccepted"


@pytest.mark.slow
async def test_a_kill9_in_a_tool_loop_aborts_the_run_at_restart_and_places_nothing_twice(
    tmp_path: Path,
) -> None:
    db, log, config = tmp_path / "events.db", tmp_path / "gateway.log", tmp_path / "gw.toml"
    config.write_text(CONFIG.format(db=db, control=CONTROL_TOKEN))
    process, url = await start(config, db, log)
    try:
        async with ControlClient(url, CONTROL_TOKEN, reconnect=False) as client:
            events = client.subscribe([AGENT])
            await events.start()
            ack = await client.submit({
                "requestId": "look-and-buy", "createdAt": "2026-11-28T00:00:00+00:00",
                "agentId": AGENT, "kind": "hook_trigger", "dedupeKey": "look-and-buy",
                "payload": {"symbol": "BTCUSD"}})
            assert ack.decision == "accepted"
            placed = await until(events, placed_an_order)  # step 2 of 6: mid-loop
            cut_off = str(placed.data["run_id"])
            await kill(process)
    finally:
        await kill(process)
    before = await read_log(db)
    killed_at = before[-1].position
    active = replay(before)[AGENT].active
    assert active is not None and active.run_id == cut_off, "the kill came after the run"
    assert not any(isinstance(e.event, RunFinished) for e in before)

    process, url = await start(config, db, log)
    try:
        async with ControlClient(url, CONTROL_TOKEN, reconnect=False) as client:
            events = client.subscribe([AGENT], after=killed_at)
            await events.start()
            aborted = await until(events, lambda e: e.event_type == "RunAborted")
            assert aborted.data["run_id"] == cut_off
            rerun = await until(events, placed_an_order)  # the request runs again
            assert rerun.data["run_id"] != cut_off
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
    finally:
        await kill(process)

    entries = await read_log(db)
    after = [e for e in entries if e.position > killed_at]
    assert [(e.event.reason, e.event.requeued) for e in after
            if isinstance(e.event, RunAborted) and e.event.run_id == cut_off] == [
        (AbortReason.RESTART, True)]
    assert not [e for e in after if isinstance(e.event, STEPS) and e.event.run_id == cut_off]
    orders = Counter(e.event.order_id for e in entries if isinstance(e.event, OrderAccepted))
    assert orders == {f"{cut_off}-s2-1": 1, f"{rerun.data['run_id']}-s2-1": 1}
    assert sum(isinstance(e.event, RequestReceived) for e in entries) == 1
    assert verify(entries) is None
    verified = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "verify", str(db), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    assert await asyncio.wait_for(verified.wait(), TIMEOUT * 4) == 0
