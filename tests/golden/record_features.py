"""Record a golden log of the features of issue 24 with the gateway of this checkout.

    uv run python -m tests.golden.record_features tests/golden/NAME.jsonl.gz

The desk of `tests.golden.record_policy` (fake time, an in-memory store, the real `Engine`,
one contended provider gate) with other agents, the features added after policy version 2
was recorded (they are additive: a stream that does not use them decides as before):

- runs as tool loops through the simulated reasoner's ``tool_steps`` (``tools``): the market
  (``market_snapshot`` of what the feed sent), ``positions``, ``open_orders``,
  ``place_order``, ``cancel_order``, a tool that does not exist, one the agent is not given,
  arguments that fail the schema; and a model that never stops calling tools (``loop``, on
  `LLMReasoner`), whose run spends its step budget;
- orders that wait for approval: ``approval = "always"`` (``appr``: approved, rejected,
  expired, and rejected by an emergency stop with a tool loop in flight) and
  ``{above_notional = 5000}`` (``big``: a small order through at once, a large one waiting,
  then approved);
- a request's own ``ifBusy`` (``busy``): reject, interrupt at normal priority (it follows up)
  and at high (it preempts), steer;
- ``gate_weight``: ``w1`` (1) and ``w4`` (4) asking for the same tokens at the contended
  gate, beside the others (``big`` weighs 3).

Kept apart from `record_policy` so that script still runs unchanged on the commits that
recorded the earlier policy versions' logs.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.base.clock import Clock, FakeClock
from gateway.llm.port import Completion, Message, ToolCall, ToolSpec
from gateway.llm.reasoner import LLMReasoner, Reasoner, SimulatedReasoner
from gateway.market.book import MarketBook
from gateway.market.events import Tick
from gateway.runtime.core import EventIds
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from lanes import AgentConfig, Mode
from lanes.config import AboveNotional
from lanes.gate.events import GateLimits
from store import MemoryEventStore
from tests.golden.record_policy import STEP_MS, Desk, write

PROVIDER = "sim"
LIMITS = GateLimits(requests_per_minute=120, input_tokens_per_minute=40_000,
                    output_tokens_per_minute=8_000, max_concurrent=2, max_wait_ms=30_000,
                    backoff_base_ms=200, backoff_cap_ms=2_000)
SYMBOL = "BTCUSD"
READS = ("market_snapshot", "positions", "open_orders")

AGENTS: dict[str, AgentConfig] = {
    "tools": AgentConfig(mode=Mode.FOLLOWUP, tools=(*READS, "place_order", "cancel_order"),
                         max_steps=4),
    "loop": AgentConfig(mode=Mode.FOLLOWUP, tools=("open_orders",), max_steps=3),
    "appr": AgentConfig(mode=Mode.FOLLOWUP, tools=("market_snapshot", "place_order"),
                        approval="always", approval_timeout_ms=5_000),
    "big": AgentConfig(mode=Mode.FOLLOWUP, tools=("market_snapshot", "place_order"),
                       approval=AboveNotional(above_notional=5_000), gate_weight=3),
    "busy": AgentConfig(mode=Mode.STEER_BACKLOG),
    "w1": AgentConfig(mode=Mode.QUEUE),
    "w4": AgentConfig(mode=Mode.QUEUE, gate_weight=4),
}


def order(qty: float, side: str = "buy") -> tuple[str, dict[str, Any]]:
    """A ``place_order`` step of the run's symbol."""
    return "place_order", {"symbol": "$symbol", "side": side, "qty": qty}


LOOK = (("market_snapshot", {"symbol": "$symbol"}),)


class EndlessModel:
    """A model that asks for ``open_orders`` at every turn and never answers."""

    provider = "sim"
    model = "endless"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def complete(self, *, system: str, messages: Sequence[Message], max_tokens: int,
                       tools: Sequence[ToolSpec] = ()) -> Completion:
        await self.clock.sleep(200)
        turn = sum(1 for m in messages if m.role == "assistant") + 1
        return Completion(text="", input_tokens=500 + 100 * turn, output_tokens=40,
                          stop_reason="tool_use",
                          tool_calls=(ToolCall(f"endless-{len(messages)}-{turn}", "open_orders"),))

    async def close(self) -> None:
        """Nothing to close."""


class FeatureDesk(Desk):
    """The gateway in fake time, with the agents of issue 24's features."""

    def __init__(self) -> None:  # (Desk's helpers: requests, settle, wait, crash, fill)
        self.clock = FakeClock()
        self.store = MemoryEventStore(clock=self.clock.now_ms)
        self.ids = EventIds(prefix="f")
        self.market = MarketBook()
        self.sims: dict[str, SimulatedReasoner] = {
            "tools": SimulatedReasoner(latency_ms=(300, 600), trade_probability=0.0, seed=1,
                                       symbol=SYMBOL),
            "appr": SimulatedReasoner(latency_ms=(200, 400), trade_probability=0.0, seed=2,
                                      symbol=SYMBOL),
            "big": SimulatedReasoner(latency_ms=(200, 400), trade_probability=0.0, seed=3,
                                     symbol=SYMBOL),
            "busy": SimulatedReasoner(latency_ms=(2_000, 3_000), trade_probability=0.0,
                                      seed=4),
            "w1": SimulatedReasoner(latency_ms=(300, 500), trade_probability=0.0, seed=5),
            "w4": SimulatedReasoner(latency_ms=(300, 500), trade_probability=0.0, seed=6),
        }
        self.models: dict[str, Reasoner] = {**self.sims, "loop": LLMReasoner(
            EndlessModel(self.clock), max_tokens=200)}
        self.count = 0
        self.engine = self._engine()

    def _engine(self) -> Engine:
        gate = ProviderGate(self.store, PROVIDER, LIMITS, self.clock, ids=self.ids)
        return Engine(self.store, AGENTS, clock=self.clock, reasoners=self.models.__getitem__,
                      ids=self.ids, snapshot_every=None, gates={PROVIDER: gate},
                      agent_gates=dict.fromkeys(AGENTS, PROVIDER), market=self.market)

    def tick(self, price: float) -> None:
        """The feed sends a trade of the symbol at ``price``, now."""
        self.market.observe(Tick(symbol=SYMBOL, price=price, size=1.0,
                                 at=datetime.fromtimestamp(self.clock.now_ms() / 1000, UTC)))

    def steps(self, agent: str, *steps: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """What the agent's simulated model asks for in its next runs."""
        self.sims[agent].tool_steps = tuple(tuple(step) for step in steps)

    def waiting(self, agent: str) -> list[str]:
        """The agent's orders waiting for approval, oldest first."""
        return list(self.engine.state(agent).approvals)


async def script(desk: FeatureDesk) -> None:
    """About two minutes of a desk, in fake time."""
    await desk.engine.start()
    await desk.settle()
    desk.tick(100.0)
    # Tool loops: a look, orders (one with bad arguments, a tool that does not exist and
    # one the agent is not given), then the open orders; a second run cancels one.
    desk.steps("tools", (*LOOK, ("positions", {}), ("open_orders", {})),
               (order(0.2), order(-1.0), ("short_everything", {"size": 9}), ("candles", {})),
               (("open_orders", {}),))
    await desk.send("tools", payload={"symbol": SYMBOL})
    await desk.wait(1_500)
    placed = desk.open_orders("tools")
    desk.steps("tools", (("cancel_order", {"orderId": placed[0]}), ("positions", {})),
               (("cancel_order", {"orderId": "no-such-order"}),))
    await desk.send("tools", payload={"symbol": SYMBOL, "n": 2})
    await desk.send("loop")  # a model that never stops asking: its step budget is spent
    await desk.wait(2_000)
    await desk.fill("tools")
    desk.tick(101.5)
    desk.steps("tools", LOOK, (("positions", {}), order(0.05, "sell")))
    await desk.send("tools", payload={"symbol": SYMBOL, "n": 3})
    await desk.wait(1_500)
    # Approvals: every order of appr waits; big's wait above 5,000 of notional.
    desk.steps("appr", LOOK, (order(0.1),))
    desk.steps("big", LOOK, (order(0.5), order(80.0)))
    for n in range(3):
        await desk.send("appr", payload={"symbol": SYMBOL, "n": n})
        await desk.wait(800)
    await desk.send("big", payload={"symbol": SYMBOL})
    await desk.wait(1_000)
    desk.steps("appr", LOOK)  # (the runs on approval results only look)
    desk.steps("big", LOOK)
    first, second, _third = desk.waiting("appr")
    await desk.control("appr", "approve", approvalId=first, reason="within limits")
    await desk.control("appr", "reject", approvalId=second, reason="too early")
    await desk.control("appr", "approve", approvalId=second)  # refused: decided already
    for waiting in desk.waiting("big"):
        await desk.control("big", "approve", approvalId=waiting)
    await desk.wait(6_000)  # the third expires
    await desk.control("appr", "approve", approvalId=_third)  # refused: expired
    desk.steps("appr", LOOK, (order(0.3),), LOOK, LOOK)
    await desk.send("appr", payload={"symbol": SYMBOL, "n": "before stop"})
    for _ in range(500):
        if desk.waiting("appr"):
            break
        await desk.wait(STEP_MS)
    assert desk.waiting("appr"), "the order never came to wait"
    # An order waits, the loop goes on: the stop rejects it and aborts the run.
    await desk.control("appr", "emergency_stop")
    await desk.wait(500)
    desk.steps("appr", LOOK)
    await desk.control("appr", "resume")
    await desk.wait(1_500)
    # ifBusy: a long run, then requests that choose for themselves while it goes on.
    await desk.send("busy", payload={"n": 0})
    await desk.wait(100)
    await desk.send("busy", ifBusy="reject", payload={"n": "reject"})
    await desk.send("busy", ifBusy="steer", payload={"n": "steer"})
    await desk.send("busy", ifBusy="interrupt", payload={"n": "interrupt normal"})
    await desk.send("busy", ifBusy="queue", priority="low", payload={"n": "queue"})
    await desk.wait(300)
    await desk.send("busy", ifBusy="interrupt", priority="high",
                    payload={"n": "interrupt high"})
    await desk.wait(200)
    await desk.send("busy", ifBusy="followup", payload={"n": "followup"})
    await desk.wait(5_000)
    # Gate weights: two queues asking for the same tokens, one weighing four times more.
    for n in range(8):
        await desk.send("w1", payload={"n": n})
        await desk.send("w4", payload={"n": n})
    desk.steps("big", LOOK, (order(0.5),))
    await desk.send("big", payload={"symbol": SYMBOL, "n": "contended"})
    await desk.wait(30_000)
    await desk.fill("big")
    await desk.wait(60_000)  # the last runs, once the gate's minute has room again
    await desk.engine.flush()


async def record() -> str:
    """Run the desk; its log as a `gateway export` file."""
    desk = FeatureDesk()
    await script(desk)
    return await desk.export()


def main() -> int:
    """Record the desk into the file named (gzipped if it ends in .gz)."""
    return write(Path(sys.argv[1]), asyncio.run(record()))


if __name__ == "__main__":
    sys.exit(main())
