"""``gateway demo``: a short scripted scenario through the engine, printed as it commits."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.base.tasks import spawn
from gateway.llm.reasoner import SimulatedReasoner
from gateway.runtime.engine import Engine
from gateway.tools.describe import describe
from gateway.tools.report import print_status
from lanes import AgentConfig, Budgets, Mode, parse_request, verify
from lanes.codec import decode
from lanes.replay import Entry
from lanes.schedules import Schedule
from lanes.streams import is_agent_stream
from store import SqliteEventStore

AGENTS = {
    "agent_btc_5m": AgentConfig(mode=Mode.COLLECT, debounce_ms=600, cap=20),
    "agent_eth_1m": AgentConfig(mode=Mode.FOLLOWUP, budgets=Budgets(max_runs_per_hour=3)),
    "agent_news": AgentConfig(mode=Mode.STEER_BACKLOG, halt_on_alerts=("risk_limit",)),
}


async def run_demo(db: Path, pace: float = 1.0, out: Callable[[str], None] = print) -> int:
    """Run the scenario on ``db`` (a fresh SQLite file); 0 if the log verifies."""
    await asyncio.to_thread(_remove, db)
    reasoners = {
        agent: SimulatedReasoner(latency_ms=(int(400 * pace), int(900 * pace)), seed=n,
                                 trade_probability=0.5)
        for n, agent in enumerate(AGENTS)
    }
    store = SqliteEventStore(db, exclusive=True)
    engine = Engine(store, AGENTS, reasoners=reasoners.__getitem__)
    await engine.start()
    out(f"event log: {db} (SQLite, WAL, synchronous=FULL)\n")
    out(f"{'pos':>5}  {'agent':<13} {'event':<20} detail")
    follower = spawn(_print_log(store, out), "demo log")
    ids = itertools.count(1)

    async def send(agent: str, kind: str = "hook_trigger", **fields: Any) -> None:
        request = parse_request({
            "requestId": f"ar_{next(ids)}", "createdAt": datetime.now(UTC).isoformat(),
            "agentId": agent, "kind": kind, **fields,
        })
        await engine.submit(request)

    async def pause(seconds: float) -> None:
        await engine.clock.sleep(seconds * pace * 1000)

    for n in range(3):  # three triggers inside one debounce window: one run
        await send("agent_btc_5m", dedupeKey=f"two_green:BTCUSD:5m:{n}",
                   payload={"symbol": "BTCUSD"})
    await send("agent_btc_5m", dedupeKey="two_green:BTCUSD:5m:0")  # a redelivery
    await send("agent_eth_1m", dedupeKey="cross:ETHUSD:3000", payload={"symbol": "ETHUSD"})
    await send("agent_news", "user_control", payload={"message": "watch the CPI print"})
    # A scheduled audit at New York's open on weekdays, and one run of it now, by hand.
    await engine.schedules.set("agent_news", "open-bell", Schedule(
        id="open-bell", cron="30 9 * * 1-5", timezone="America/New_York",
        payload={"scope": "positions"}), "demo")
    await engine.schedules.run("agent_news", "open-bell", "demo")
    await pause(0.2)
    await send("agent_news", "user_control", payload={"message": "CPI came in hot"})
    await send("agent_eth_1m", dedupeKey="cross:ETHUSD:3050", payload={"symbol": "ETHUSD"})
    await pause(0.2)
    await send("agent_eth_1m", "user_control", priority="high",
               payload={"action": "emergency_stop"})
    await send("agent_eth_1m", dedupeKey="cross:ETHUSD:3100", payload={"symbol": "ETHUSD"})
    await pause(0.8)
    await send("agent_eth_1m", "user_control", payload={"action": "resume"})
    await send("agent_btc_5m", "user_control", payload={"action": "pause"})
    await send("agent_news", "system_alert", priority="high", payload={"code": "risk_limit"})
    await pause(2.0)
    await engine.flush()
    follower.cancel()
    out("")
    print_status(engine, out)
    records = await store.read()
    divergence = verify(Entry(r.position, r.stream, decode(r.type, r.data)) for r in records
                        if is_agent_stream(r.stream))
    await engine.stop()
    out(f"\n{len(records)} events; verify: {'clean' if divergence is None else 'DIVERGED'}")
    out(f"replay it: uv run gateway replay {db}   verify it: uv run gateway verify {db}")
    return 0 if divergence is None else 1


def _remove(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


async def _print_log(store: SqliteEventStore, out: Callable[[str], None]) -> None:
    async for record in store.follow(0):
        event = decode(record.type, record.data)
        out(f"{record.position:>5}  {record.stream:<13} {record.type:<20} {describe(event)}")
