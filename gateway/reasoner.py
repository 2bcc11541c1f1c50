"""Reasoners run an agent's LLM. The runtime runs each as a task; abort cancels it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gateway.clock import Clock
from lanes.events import CallIntent, OrderIntent, Outcome, Summary, Usage
from lanes.requests import AgentRequest


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a run came to: its outcome, token usage, order intents and sub-agent calls."""

    outcome: Outcome
    usage: Usage = field(default_factory=Usage)
    orders: tuple[OrderIntent, ...] = ()
    calls: tuple[CallIntent, ...] = ()


class RunContext:
    """What a reasoner gets: the run's requests, the agent's context, and a steer inbox."""

    def __init__(
        self,
        *,
        agent_id: str,
        run_id: str,
        requests: list[AgentRequest],
        summary: Summary | None,
        depth: int,
        clock: Clock,
        report_steerable: Callable[[bool], None],
    ) -> None:
        self.agent_id = agent_id
        self.run_id = run_id
        self.requests = requests
        self.summary = summary
        self.depth = depth
        self.clock = clock
        self._report_steerable = report_steerable
        self._steers: asyncio.Queue[AgentRequest] = asyncio.Queue()

    def set_steerable(self, steerable: bool) -> None:
        """Tell the gateway whether this run can take a steer now (it is recorded)."""
        self._report_steerable(steerable)

    def deliver_steer(self, request: AgentRequest) -> None:
        """The gateway hands over a request that was steered into this run."""
        self._steers.put_nowait(request)

    def take_steers(self) -> list[AgentRequest]:
        """Every steer delivered since the last call, oldest first (between turns)."""
        steers = []
        while not self._steers.empty():
            steers.append(self._steers.get_nowait())
        return steers

    async def next_steer(self) -> AgentRequest:
        """Wait for the next steer."""
        return await self._steers.get()


class Reasoner(Protocol):
    """Runs one reasoning run. Cancellation is an abort; an exception is a failed run."""

    async def run(self, ctx: RunContext) -> RunResult:
        """Reason over ``ctx.requests`` (and steers as they come) and return the result."""


class SimulatedReasoner:
    """A stand-in LLM: random latency, trade or no trade, token usage, orders, steerable.

    Seeded, so a scenario is repeatable; the latency is drawn uniformly from
    ``latency_ms`` and spent on the run's clock in ``turns`` turns, taking steers between.
    """

    def __init__(
        self,
        *,
        latency_ms: tuple[int, int] = (200, 1_500),
        trade_probability: float = 0.3,
        steerable: bool = True,
        turns: int = 2,
        seed: int | None = 7,
        symbol: str = "BTCUSD",
    ) -> None:
        self.latency_ms = latency_ms
        self.trade_probability = trade_probability
        self.steerable = steerable
        self.turns = max(1, turns)
        self.symbol = symbol
        self._random = random.Random(seed)

    async def run(self, ctx: RunContext) -> RunResult:
        """Spend the latency in turns, take steers between them, then decide."""
        latency = self._random.uniform(*self.latency_ms)
        prompts = list(ctx.requests)
        for turn in range(self.turns):
            if self.steerable and turn == 0:
                ctx.set_steerable(True)
            await ctx.clock.sleep(latency / self.turns)
            prompts += ctx.take_steers()
        if self.steerable:
            ctx.set_steerable(False)
        usage = Usage(input_tokens=400 + 120 * len(prompts), output_tokens=80 + 40 * len(prompts))
        if self._random.random() >= self.trade_probability:
            return RunResult(outcome=Outcome.NO_TRADE, usage=usage)
        symbol = str(ctx.requests[0].payload.get("symbol", self.symbol))
        side: Literal["buy", "sell"] = "buy" if self._random.random() < 0.5 else "sell"
        order = OrderIntent(symbol=symbol, side=side, qty=round(self._random.uniform(0.01, 0.5), 3))
        return RunResult(outcome=Outcome.TRADE, usage=usage, orders=(order,))
