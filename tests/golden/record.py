"""Record the golden logs: scripted scenarios run by the real engine, exported as JSON Lines.

    uv run python -m tests.golden.record          # write tests/golden/*.jsonl and *.json
    uv run python -m tests.golden.record --check  # exit 1 if recording again differs

Each scenario runs the gateway's `Engine` over an in-memory store with a fake clock (the
store's clock too), seeded simulated reasoners and repeatable event ids, so recording again
with the same code gives byte-identical files. ``<name>.jsonl`` is the log (`gateway export`
format); ``<name>.expected.json`` is what the live engine held at the end, which replaying the
log must give back. Golden logs are kept forever: they prove that old logs still replay and
verify after a change. Re-record only on purpose, and keep the old file under a new name when
a change means old logs must still be read (an event shape change, say).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.base.clock import FakeClock
from gateway.llm.reasoner import SimulatedReasoner
from gateway.runtime.core import EventIds
from gateway.runtime.engine import Engine
from gateway.tools.transfer import event_line, header
from lanes import AgentConfig, AgentRequest, AgentState, Budgets, Mode, parse_request
from lanes.config import DropPolicy
from lanes.events import BrokerReport, OperatorAction
from store import MemoryEventStore, RecordedEvent

HERE = Path(__file__).resolve().parent
STEP_MS = 10
"""The fake clock moves in steps this long, so runs end within 10 ms of their latency."""


def expected_of(state: AgentState) -> dict[str, Any]:
    """What a golden test compares of an agent at the end of its log."""
    return {
        "trading": state.trading.value,
        "mode": state.config.mode.value,
        "version": state.version,
        "now": state.now,
        "pending": [p.request.request_id for p in state.pending],
        "active": None if state.active is None else state.active.run_id,
        "suppressed": None if state.suppressed is None else list(state.suppressed),
        "orders": sorted(state.orders),
        "counters": {name: getattr(state.counters, name)
                     for name in state.counters.__dataclass_fields__},
    }


class Scene:
    """A running gateway in fake time: requests in, the clock moved, everything settled."""

    def __init__(self, agents: dict[str, AgentConfig], reasoners: dict[str, SimulatedReasoner],
                 seed: int) -> None:
        self.clock = FakeClock()
        self.store = MemoryEventStore(clock=self.clock.now_ms)
        self.agents = agents
        self.reasoners = reasoners
        self.ids = EventIds(prefix="g")
        self.random = random.Random(seed)
        self.count = 0
        self.engine = self._engine()

    def _engine(self) -> Engine:
        return Engine(self.store, self.agents, clock=self.clock,
                      reasoners=self.reasoners.__getitem__, ids=self.ids, snapshot_every=None)

    def request(self, agent: str, kind: str = "hook_trigger", **fields: Any) -> AgentRequest:
        self.count += 1
        return parse_request({
            "requestId": f"rq{self.count}", "agentId": agent, "kind": kind,
            "createdAt": datetime.fromtimestamp(self.clock.now_ms() / 1000, UTC).isoformat(),
            **fields,
        })

    async def send(self, agent: str, kind: str = "hook_trigger", **fields: Any) -> None:
        await self.engine.submit(self.request(agent, kind, **fields))
        await self.settle()

    async def settle(self) -> None:
        """Let every task run until nothing more happens at this fake time."""
        while True:
            before = await self.store.last_position()
            for _ in range(10):
                await asyncio.sleep(0)  # a yield, not a wait: tasks woken by the clock run
            await self.engine.flush()
            if await self.store.last_position() == before:
                return

    async def wait(self, ms: int) -> None:
        """Move fake time forward in small steps, settling after each."""
        for _ in range(ms // STEP_MS):
            self.clock.advance(STEP_MS)
            await self.settle()

    async def restart(self, *, graceful: bool) -> None:
        """Stop the gateway (as if killed, unless graceful) and start it again."""
        await self.engine.stop(graceful=graceful)
        self.store = MemoryEventStore(clock=self.clock.now_ms,
                                      committed=await self.store.read())
        self.engine = self._engine()
        await self.engine.start()
        await self.settle()

    async def fill_open_orders(self, agent: str) -> None:
        """The broker fills every open order of an agent at 100.0."""
        for order in list(self.engine.state(agent).orders.values()):
            await self.engine.report(agent, BrokerReport(
                at=self.clock.now_ms(), order_id=order.order_id, status="filled",
                filled_qty=order.intent.qty, price=100.0))
        await self.settle()


# ----------------------------------------------------------------------------- scenarios


async def desk(scene: Scene) -> None:
    """Three agents in three modes: collect windows with a summarizing cap and an hourly
    budget, followup with a small cap dropping the oldest, steer-backlog with steers, an
    alert that halts, controls, an operator release, a config change, fills, a graceful
    restart with a run in flight and a crash restart with another."""
    await scene.engine.start()
    await scene.settle()
    for n in range(7):
        key = f"two_green:BTCUSD:1m:{n % 5}"  # n = 5, 6 are redeliveries
        await scene.send("btc", dedupeKey=key, payload={"symbol": "BTCUSD"})
        await scene.wait(100)
    await scene.send("news", "user_control", payload={"message": "watch the CPI print"})
    await scene.wait(300)
    await scene.send("news", "user_control", payload={"message": "CPI came in hot"})
    for n in range(6):
        await scene.send("eth", dedupeKey=f"cross:ETHUSD:{3000 + n}",
                         priority=["normal", "low", "high"][n % 3])
        await scene.wait(150)
    await scene.wait(1_500)
    await scene.fill_open_orders("btc")
    await scene.fill_open_orders("eth")
    await scene.send("btc", "user_control", payload={"action": "pause"})
    for n in range(6):
        await scene.send("btc", dedupeKey=f"two_green:BTCUSD:1m:{10 + n}")
        await scene.wait(50)
    await scene.send("news", "system_alert", priority="high", payload={"code": "risk_limit"})
    await scene.send("news", "user_control", payload={"message": "anything new?"})
    await scene.wait(500)
    await scene.send("news", "user_control", payload={"action": "resume"})
    await scene.engine.operate("eth", OperatorAction.RELEASE, "ops")
    await scene.engine.configure("eth", AgentConfig(mode=Mode.FOLLOWUP, cap=3,
                                                    budgets=Budgets(max_runs_per_hour=2)), "ops")
    for n in range(4):
        await scene.send("eth", dedupeKey=f"cross:ETHUSD:{3100 + n}")
        await scene.wait(40)
    await scene.wait(300)
    await scene.restart(graceful=True)  # a run in flight: aborted for shutdown, rerun
    await scene.wait(2_000)
    await scene.send("btc", "user_control", payload={"action": "resume"})
    await scene.send("news", "user_control", payload={"message": "close the book"})
    await scene.wait(200)
    await scene.restart(graceful=False)  # killed: the run is recorded aborted at the start
    await scene.wait(3_000)
    await scene.fill_open_orders("btc")
    await scene.wait(6_000)
    await scene.engine.flush()


async def flood(scene: Scene) -> None:
    """One agent in followup mode under a flood of triggers: 400 in two minutes, a fifth of
    them redeliveries, mixed priorities; cap 10 dropping the oldest, 5 runs an hour."""
    await scene.engine.start()
    await scene.settle()
    for n in range(400):
        key = scene.random.randrange(max(1, n)) if scene.random.random() < 0.2 else n
        priority = scene.random.choice(["high", "normal", "normal", "normal", "low"])
        await scene.send("flood", dedupeKey=f"tick:{key}", priority=priority,
                         payload={"symbol": "BTCUSD"})
        await scene.wait(300)
    await scene.wait(5_000)
    await scene.engine.flush()


@dataclass(frozen=True, slots=True)
class Scenario:
    """A golden log: how it is made."""

    name: str
    agents: dict[str, AgentConfig]
    reasoners: Callable[[], dict[str, SimulatedReasoner]]
    script: Callable[[Scene], Awaitable[None]]
    seed: int = 1


SCENARIOS = [
    Scenario(
        "desk",
        {
            "btc": AgentConfig(mode=Mode.COLLECT, debounce_ms=300, cap=4,
                               drop_policy=DropPolicy.SUMMARIZE,
                               budgets=Budgets(max_runs_per_hour=3, no_trade_cooldown_ms=2_000)),
            "eth": AgentConfig(mode=Mode.FOLLOWUP, cap=2,
                               budgets=Budgets(max_runs_per_hour=2)),
            "news": AgentConfig(mode=Mode.STEER_BACKLOG, halt_on_alerts=("risk_limit",)),
        },
        lambda: {
            "btc": SimulatedReasoner(latency_ms=(300, 700), seed=1, trade_probability=0.5),
            "eth": SimulatedReasoner(latency_ms=(400, 900), seed=2, trade_probability=0.5,
                                     symbol="ETHUSD"),
            "news": SimulatedReasoner(latency_ms=(600, 1_200), seed=3, turns=3),
        },
        desk,
    ),
    Scenario(
        "flood",
        {"flood": AgentConfig(mode=Mode.FOLLOWUP, cap=10, drop_policy=DropPolicy.OLD,
                              budgets=Budgets(max_runs_per_hour=5))},
        lambda: {"flood": SimulatedReasoner(latency_ms=(500, 1_500), seed=4)},
        flood,
    ),
]


async def record(scenario: Scenario) -> tuple[list[RecordedEvent], dict[str, Any]]:
    """Run a scenario; its log and what the engine held at the end."""
    scene = Scene(scenario.agents, scenario.reasoners(), scenario.seed)
    await scenario.script(scene)
    engine = scene.engine
    expected = {agent: expected_of(engine.state(agent)) for agent in engine.agent_ids}
    await engine.stop(graceful=False)  # nothing more in the log
    records = await scene.store.read()
    return records, {"scenario": scenario.name, "events": len(records), "agents": expected}


def files(name: str) -> tuple[Path, Path]:
    """The log and the expectations of a golden scenario."""
    return HERE / f"{name}.jsonl", HERE / f"{name}.expected.json"


def render(records: list[RecordedEvent], expected: dict[str, Any]) -> tuple[str, str]:
    """The two files' text."""
    last = records[-1].position if records else 0
    log = "".join(line + "\n" for line in [header(len(records), last),
                                             *map(event_line, records)])
    return log, json.dumps(expected, indent=1, sort_keys=True) + "\n"


def main() -> int:
    """Record every scenario (or check that recording again gives the same files)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args()
    differ = []
    for scenario in SCENARIOS:
        log, expected = render(*asyncio.run(record(scenario)))
        log_path, expected_path = files(scenario.name)
        if args.check:
            same = (log_path.read_text() == log and expected_path.read_text() == expected)
            print(f"{scenario.name}: {'same' if same else 'DIFFERENT'}")
            if not same:
                differ.append(scenario.name)
        else:
            log_path.write_text(log)
            expected_path.write_text(expected)
            print(f"{scenario.name}: {log.count(chr(10)) - 1} events, {len(log):,} bytes "
                  f"-> {log_path.name}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
