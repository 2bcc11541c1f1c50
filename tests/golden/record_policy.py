"""Record a golden log of every policy feature with the gateway of this checkout.

    uv run python tests/golden/record_policy.py tests/golden/NAME.jsonl.gz

One scripted desk runs in the real `Engine` over an in-memory store, in fake time (the
store's clock too), through one contended provider gate, with seeded reasoners: modes
followup, interrupt, collect, steer, steer-backlog and queue; dedupe by ``dedupeKey`` and by
``messageId``; caps dropping old, new and summarizing; budgets per hour and per day and a
no-trade cooldown; a provider gate with a request, token and concurrency limit shared by
agents asking for very different token sizes, and a rate-limited call; sub-agent calls
(nested, over the fan-out and the depth limits); an interval schedule; emergency stop,
pause, resume, cancel of an order and of all orders; operator release and clear; a config
change; broker fills; a crash restart with a run in flight. The log is written in the
`gateway export` format, gzipped with no timestamp.

The script runs unchanged on the gateway as it was before 2026-11-27's regrouping of
``gateway/`` (the imports below try today's modules first), so a golden log of an earlier
policy version is recorded by checking that commit out in a worktree and running this file
there (tests/golden/README.md says which commit made which file).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import random
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

try:  # today's layout
    from gateway.base.clock import FakeClock
    from gateway.llm.port import Completion, ProviderCallError
    from gateway.llm.reasoner import RunContext, RunResult
    from gateway.runtime.core import EventIds
    from gateway.runtime.engine import Engine
    from gateway.runtime.gate import ProviderGate
    from gateway.tools.transfer import event_line, header
    from lanes.gate.events import CallOutcome, GateLimits
except ImportError:  # the layout before 2026-11-27
    from gateway.clock import FakeClock  # type: ignore
    from gateway.core import EventIds  # type: ignore
    from gateway.engine import Engine  # type: ignore
    from gateway.gate import ProviderGate  # type: ignore
    from gateway.reasoner import RunContext, RunResult  # type: ignore
    from gateway.transfer import event_line, header  # type: ignore
    from lanes.gate_events import CallOutcome, GateLimits  # type: ignore

    from gateway.llm import Completion, ProviderCallError  # type: ignore
from lanes import AgentConfig, AgentRequest, Budgets, Mode, parse_request
from lanes.config import DedupeStrategy, DropPolicy
from lanes.events import (
    BrokerReport,
    CallIntent,
    OperatorAction,
    OrderIntent,
    Outcome,
    Usage,
)
from lanes.requests import Kind
from lanes.schedules import Schedule
from store import MemoryEventStore

STEP_MS = 10
"""The fake clock moves in steps this long."""
PROVIDER = "sim"
LIMITS = GateLimits(requests_per_minute=90, input_tokens_per_minute=150_000,
                    output_tokens_per_minute=20_000, max_concurrent=2, max_wait_ms=30_000,
                    backoff_base_ms=200, backoff_cap_ms=2_000)

AGENTS: dict[str, AgentConfig] = {
    "fu": AgentConfig(mode=Mode.FOLLOWUP, cap=3, drop_policy=DropPolicy.OLD, max_call_depth=2),
    "intr": AgentConfig(mode=Mode.INTERRUPT, cap=3, drop_policy=DropPolicy.NEW),
    "coll": AgentConfig(mode=Mode.COLLECT, debounce_ms=300, cap=3,
                        drop_policy=DropPolicy.SUMMARIZE),
    "steer": AgentConfig(mode=Mode.STEER, halt_on_alerts=("risk_limit",)),
    "sb": AgentConfig(mode=Mode.STEER_BACKLOG,
                      budgets=Budgets(max_runs_per_hour=4, no_trade_cooldown_ms=3_000)),
    "q": AgentConfig(mode=Mode.QUEUE, cap=4, budgets=Budgets(max_runs_per_day=10),
                     dedupe={Kind.HOOK_TRIGGER: DedupeStrategy.MESSAGE_ID}),
    "boss": AgentConfig(mode=Mode.FOLLOWUP, max_calls_per_run=3, max_call_depth=2),
}
TOKENS = {"fu": 400, "intr": 900, "coll": 6_000, "steer": 700, "sb": 300, "q": 2_500,
          "boss": 5_000}
"""Each agent's input tokens per model call: the gate shares its room by tokens."""
SCHEDULES = {"q": [Schedule(id="audit", every_ms=60_000, payload={"check": "book"})]}


class DeskReasoner:
    """A seeded stand-in model: a latency spent in turns (one gated call each, of the
    agent's token size), steers taken between turns, a trade now and then, and the sub-agent
    calls its requests ask for (``payload.calls``); ``payload.throttle`` makes the first
    call of the run rate limited."""

    def __init__(self, agent: str, seed: int, *, turns: int = 2,
                 latency_ms: tuple[int, int] = (300, 900), trade: float = 0.4) -> None:
        self.tokens = TOKENS[agent]
        self.turns = turns
        self.latency_ms = latency_ms
        self.trade = trade
        self._random = random.Random(seed)

    async def run(self, ctx: RunContext) -> RunResult:
        latency = self._random.uniform(*self.latency_ms)
        prompts = list(ctx.requests)
        throttle = any(r.payload.get("throttle") for r in prompts)

        async def think() -> Completion:
            nonlocal throttle
            await ctx.clock.sleep(latency / self.turns)
            if throttle:
                throttle = False
                raise ProviderCallError(CallOutcome.RATE_LIMITED, "slow down", status=429)
            return Completion(text="", input_tokens=self.tokens, output_tokens=self.tokens // 8)

        for turn in range(self.turns):
            if turn == 0:
                ctx.set_steerable(True)
            await ctx.call(think, input_tokens=self.tokens, output_tokens=self.tokens // 8)
            prompts += ctx.take_steers()
        ctx.set_steerable(False)
        usage = Usage(input_tokens=self.tokens * self.turns,
                      output_tokens=self.tokens // 8 * self.turns)
        calls = tuple(CallIntent.model_validate(call) for r in prompts
                      for call in r.payload.get("calls", ()))
        if calls or self._random.random() >= self.trade:
            return RunResult(outcome=Outcome.NO_TRADE, usage=usage, calls=calls)
        side: Literal["buy", "sell"] = "buy" if self._random.random() < 0.5 else "sell"
        order = OrderIntent(symbol="BTCUSD", side=side,
                            qty=round(self._random.uniform(0.01, 0.5), 3))
        return RunResult(outcome=Outcome.TRADE, usage=usage, orders=(order,))


class Desk:
    """The gateway in fake time: requests in, the clock moved, everything settled."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = MemoryEventStore(clock=self.clock.now_ms)
        self.ids = EventIds(prefix="g")
        self.reasoners = {agent: DeskReasoner(agent, seed)
                          for seed, agent in enumerate(AGENTS, start=1)}
        self.reasoners["steer"].turns = 3
        self.reasoners["coll"].latency_ms = (600, 1_400)
        self.count = 0
        self.engine = self._engine()

    def _engine(self) -> Engine:
        gate = ProviderGate(self.store, PROVIDER, LIMITS, self.clock, ids=self.ids)
        return Engine(self.store, AGENTS, clock=self.clock, reasoners=self.reasoners.__getitem__,
                      ids=self.ids, snapshot_every=None, gates={PROVIDER: gate},
                      agent_gates=dict.fromkeys(AGENTS, PROVIDER), schedules=SCHEDULES)

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

    async def control(self, agent: str, action: str, **payload: Any) -> None:
        await self.send(agent, "user_control", priority="high",
                        payload={"action": action, **payload})

    async def settle(self) -> None:
        """Let every task run until nothing more happens at this fake time."""
        while True:
            before = await self.store.last_position()
            for _ in range(10):
                await asyncio.sleep(0)  # a yield, not a wait: tasks woken by the clock run
            await self.engine.flush()
            for gate in self.engine.gates.values():
                await gate.flush()
            if await self.store.last_position() == before:
                return

    async def wait(self, ms: int) -> None:
        for _ in range(ms // STEP_MS):
            self.clock.advance(STEP_MS)
            await self.settle()

    async def crash(self) -> None:
        """Kill the gateway (nothing graceful) and start it again on the same log."""
        await self.engine.stop(graceful=False)
        self.store = MemoryEventStore(clock=self.clock.now_ms, committed=await self.store.read())
        self.engine = self._engine()
        await self.engine.start()
        await self.settle()

    async def export(self) -> str:
        """Stop the gateway (nothing graceful); its log as a `gateway export` file."""
        await self.engine.stop(graceful=False)
        records = await self.store.read()
        last = records[-1].position if records else 0
        return "".join(line + "\n" for line in [header(len(records), last),
                                                 *map(event_line, records)])

    def open_orders(self, agent: str) -> list[str]:
        return sorted(self.engine.state(agent).orders)

    async def fill(self, agent: str) -> None:
        for order in list(self.engine.state(agent).orders.values()):
            await self.engine.report(agent, BrokerReport(
                at=self.clock.now_ms(), order_id=order.order_id, status="filled",
                filled_qty=order.intent.qty, price=100.0))
        await self.settle()


async def script(desk: Desk) -> None:
    """About four minutes of a desk, in fake time."""
    await desk.engine.start()
    await desk.settle()
    # A burst on every lane at once: the gate is contended by small and large callers.
    for n in range(6):
        await desk.send("fu", dedupeKey=f"fu:{n % 4}", priority=["normal", "low"][n % 2])
        await desk.send("coll", dedupeKey=f"coll:{n}", payload={"n": n})
        await desk.send("q", messageId=f"m{n % 5}", dedupeKey=f"q:{n}")
        await desk.send("sb", payload={"n": n})
        await desk.wait(60)
    await desk.send("boss", payload={"calls": [
        {"agentId": "q", "payload": {"ask": "levels"}},
        {"agentId": "fu", "priority": "high", "payload": {"calls": [
            {"agentId": "sb", "payload": {"calls": [{"agentId": "coll"}]}}]}},
        {"agentId": "intr"},
        {"agentId": "steer"},  # the fourth: over the fan-out limit
    ]})
    for n in range(5):
        await desk.send("intr", priority=["normal", "high", "low"][n % 3], payload={"n": n})
        await desk.send("steer", payload={"n": n})
        await desk.wait(120)
    await desk.send("boss", payload={"throttle": True})
    await desk.wait(3_000)
    # Controls: a pause and a reduce-only lane, a stop with a run in flight, cancels.
    await desk.fill("fu")
    await desk.control("fu", "pause")
    await desk.send("fu", dedupeKey="fu:paused")
    await desk.send("steer", payload={"n": "before stop"})
    await desk.wait(100)
    await desk.send("steer", "system_alert", priority="high", payload={"code": "risk_limit"})
    await desk.send("steer", payload={"n": "while halted"})
    await desk.wait(500)
    for agent in AGENTS:
        orders = desk.open_orders(agent)
        if orders:
            await desk.control(agent, "cancel_order", orderId=orders[0])
            await desk.control(agent, "cancel_all")
    await desk.control("steer", "resume")
    await desk.control("fu", "resume")
    await desk.control("intr", "emergency_stop")
    await desk.control("intr", "pause")  # refused: only resume leaves HALTED
    await desk.control("intr", "resume")
    await desk.wait(2_000)
    # Operator and config.
    for n in range(4):
        await desk.send("q", messageId=f"late{n}", dedupeKey=f"q:late:{n}")
    await desk.engine.operate("q", OperatorAction.RELEASE, "ops")
    await desk.engine.operate("coll", OperatorAction.CLEAR_QUEUE, "ops")
    await desk.engine.configure("fu", AgentConfig(mode=Mode.COLLECT, debounce_ms=200, cap=2,
                                                  drop_policy=DropPolicy.NEW, max_call_depth=2),
                               "ops")
    for n in range(4):
        await desk.send("fu", dedupeKey=f"fu:new:{n}")
        await desk.send("sb", payload={"n": f"late{n}"})
        await desk.wait(80)
    await desk.wait(5_000)
    # A second round of calls and a crash with runs in flight.
    await desk.send("boss", payload={"calls": [
        {"agentId": "coll", "payload": {"calls": [{"agentId": "fu", "payload": {
            "calls": [{"agentId": "q"}]}}]}},  # the third level: over fu's depth limit
        {"agentId": "sb", "priority": "low"},
    ]})
    await desk.wait(100)
    await desk.crash()
    await desk.wait(8_000)
    for agent in AGENTS:
        await desk.fill(agent)
    # Quiet minutes: the schedule fires, budgets reopen, the last runs end.
    for n in range(12):
        await desk.send(["sb", "q", "fu"][n % 3], dedupeKey=f"tail:{n}", messageId=f"t{n}")
        await desk.wait(15_000)
    await desk.wait(10_000)
    await desk.engine.flush()


async def record() -> str:
    """Run the desk; its log as a `gateway export` file."""
    desk = Desk()
    await script(desk)
    return await desk.export()


def write(out: Path, text: str) -> int:
    """Write an export into ``out`` (gzipped if its name ends in .gz); say what was written."""
    data = text.encode()
    if out.suffix == ".gz":  # (no name, no time in the header: the same log, the same bytes)
        packed = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as file:
            file.write(data)
        data = packed.getvalue()
    out.write_bytes(data)
    print(f"{out}: {text.count(chr(10)) - 1} events, {len(data):,} bytes")
    return 0


def main() -> int:
    """Record the desk into the file named (gzipped if it ends in .gz)."""
    return write(Path(sys.argv[1]), asyncio.run(record()))


if __name__ == "__main__":
    sys.exit(main())
