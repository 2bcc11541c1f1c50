"""Reasoners run an agent's LLM. The runtime runs each as a task; abort cancels it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from pydantic import ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from gateway.base.clock import Clock
from gateway.errors import GatewayError
from gateway.llm.port import (
    Completion,
    LLMClient,
    Message,
    ProviderCallError,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from lanes.config import CallResults
from lanes.events import CallIntent, OrderIntent, Outcome, Summary, Usage
from lanes.gate import backoff_ceiling, full_jitter
from lanes.gate.events import THROTTLED, CallOutcome, GateLimits
from lanes.requests import RANK, AgentRequest, Kind, Priority, WireModel

SlotT = TypeVar("SlotT")


class CallGate(Protocol[SlotT]):
    """What a run's LLM calls need of their provider gate: slots, given back with how the
    provider answered (`gateway.runtime.gate.SlotGate` is it, for the gate's slots)."""

    @property
    def provider(self) -> str:
        """The provider's name."""
        ...

    @property
    def limits(self) -> GateLimits:
        """The limits in force."""
        ...

    def using(self, agent_id: str, run_id: str, priority: Priority = Priority.NORMAL,
              input_tokens: int = 0, output_tokens: int = 0, weight: int = 1
              ) -> contextlib.AbstractAsyncContextManager[SlotT]:
        """A slot that is always given back (``weight``: the agent's gate weight)."""
        ...

    def release(self, slot: SlotT, outcome: CallOutcome, *, input_tokens: int | None = None,
                output_tokens: int | None = None, retry_after_ms: int | None = None,
                remaining_requests: int | None = None, remaining_tokens: int | None = None,
                reset_at: int | None = None) -> None:
        """Give a slot back with how the provider answered."""
        ...


class ToolSession(Protocol):
    """A run's tools (`gateway.runtime.toolbox.RunTools`): what the model is offered, the
    step budget, and each step recorded with its tools run."""

    specs: Sequence[ToolSpec]
    max_steps: int

    async def step(self, step: int, completion: Completion, steered: Sequence[str] = (),
                   given: Mapping[str, tuple[bool, str]] | None = None) -> list[ToolResult]:
        """Record model call ``step`` (which first saw the ``steered`` requests), run the
        tool calls it may make and record their results: one result per call, in order
        (a refused call's is its error; ``given``: call id -> (ok, text) of the tools a
        worker ran itself)."""
        ...


class SpendLimitError(GatewayError):
    """The provider refused a call for spend: the run fails and the agent is paused."""

    code = "spend_limit"

    def __init__(self, provider: str, reason: str) -> None:
        super().__init__(f"{provider}: {reason}")
        self.provider = provider
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a run came to: its outcome, token usage, order intents and sub-agent calls,
    and what it answers the agents whose calls it served."""

    outcome: Outcome
    usage: Usage = field(default_factory=Usage)
    orders: tuple[OrderIntent, ...] = ()
    calls: tuple[CallIntent, ...] = ()
    answer: str = ""
    call_results: CallResults | None = None
    """How its calls' results come back (None: the agent's ``call_results``)."""


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
        gate: CallGate[Any] | None = None,
        gate_weight: int = 1,
        tools: ToolSession | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.run_id = run_id
        self.requests = requests
        self.summary = summary
        self.depth = depth
        self.clock = clock
        self.gate = gate
        """The provider gate every LLM call of this run goes through (None: ungated)."""
        self.gate_weight = gate_weight
        """The agent's weight at the gate (`lanes.config.AgentConfig.gate_weight`)."""
        self.tools = tools
        """The run's tools, if its agent has any: then a run is a loop of steps."""
        self._report_steerable = report_steerable
        self._steers: asyncio.Queue[AgentRequest] = asyncio.Queue()

    @property
    def priority(self) -> Priority:
        """The run's priority at the gate: the highest of its requests."""
        return max((r.priority for r in self.requests), key=RANK.__getitem__,
                   default=Priority.NORMAL)

    async def call(self, make: Callable[[], Awaitable[Completion]], *, input_tokens: int,
                   output_tokens: int) -> Completion:
        """Make one LLM call through the provider gate, retrying as the gate allows.

        Each attempt waits for a slot (with the token estimate), calls ``make()`` and gives
        the slot back with how the provider answered. A throttled or failing provider makes
        the gate back off (and maybe open its breaker) before the next attempt; the gate
        refuses once the attempts are spent (`gateway.runtime.gate.SlotRefusedError`). A spend
        limit raises `SpendLimitError` (never retried); a rejected request re-raises its
        `ProviderCallError`. An abort cancels the call and frees the slot.
        """
        gate = self.gate
        if gate is None:
            return await make()
        failures = 0
        while True:
            failed: ProviderCallError | None = None
            async with gate.using(self.agent_id, self.run_id, self.priority, input_tokens,
                                  output_tokens, self.gate_weight) as slot:
                try:
                    completion = await make()
                except ProviderCallError as error:
                    hints = error.hints
                    gate.release(slot, error.outcome, retry_after_ms=hints.retry_after_ms,
                                 remaining_requests=hints.remaining_requests,
                                 remaining_tokens=hints.remaining_tokens,
                                 reset_at=hints.reset_at)
                    if error.outcome is CallOutcome.SPEND_LIMIT:
                        raise SpendLimitError(gate.provider, str(error)) from None
                    if error.outcome is CallOutcome.REJECTED:
                        raise
                    failures += 1
                    if failures > gate.limits.max_attempts:
                        raise  # the gate ignored the release (its lease had expired)
                    failed = error
                else:
                    hints = completion.hints
                    gate.release(slot, CallOutcome.OK, input_tokens=completion.input_tokens,
                                 output_tokens=completion.output_tokens,
                                 remaining_requests=hints.remaining_requests,
                                 remaining_tokens=hints.remaining_tokens,
                                 reset_at=hints.reset_at)
                    return completion
            assert failed is not None  # (the block returns or raises otherwise)
            if failed.outcome not in THROTTLED:
                # A 5xx or a timeout schedules no provider-wide backoff (the breaker watches
                # those): this run waits before its own next attempt, with full jitter.
                ceiling = backoff_ceiling(gate.limits, failures)
                await self.clock.sleep(full_jitter(self.run_id, failures, ceiling))
            # Then the gate decides whether and when the next attempt goes.

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


@dataclass(frozen=True, slots=True)
class SimulatedCall:
    """Sub-agent calls a simulated run makes: ``count`` calls to ``agent_id``."""

    agent_id: str
    count: int = 1
    priority: Priority = Priority.NORMAL
    payload: dict[str, object] = field(default_factory=dict)
    timeout_ms: int | None = None


class SimulatedReasoner:
    """A stand-in LLM: random latency, trade or no trade, token usage, orders, steerable.

    Seeded, so a scenario is repeatable; the latency is drawn uniformly from
    ``latency_ms`` and spent on the run's clock in ``turns`` turns, taking steers between.
    A run at a depth below ``call_below_depth`` that is not about call results makes the
    ``calls``; a run that serves calls answers with a line about what it saw.
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
        calls: Sequence[SimulatedCall] = (),
        call_below_depth: int = 1,
        call_results: CallResults | None = None,
        tool_steps: Sequence[Sequence[tuple[str, Mapping[str, Any]]]] = (),
        price: Price | None = None,
    ) -> None:
        self.price = price
        self.tool_steps = tuple(tuple(step) for step in tool_steps)
        """For an agent with tools: the tool calls (name, arguments) of each step, then a
        final answer; a string argument ``$symbol`` is the run's symbol."""
        self.calls = tuple(calls)
        self.call_below_depth = call_below_depth
        self.call_results = call_results
        self.latency_ms = latency_ms
        self.trade_probability = trade_probability
        self.steerable = steerable
        self.turns = max(1, turns)
        self.symbol = symbol
        self._random = random.Random(seed)

    async def run(self, ctx: RunContext) -> RunResult:
        """Spend the latency in turns (each one LLM call through the gate, if the agent has
        one), take steers between them, then decide; for an agent with tools and
        ``tool_steps``, a loop of those steps (`run_tools`)."""
        if ctx.tools is not None and ctx.tools.specs and self.tool_steps:
            return await self.run_tools(ctx, ctx.tools)
        latency = self._random.uniform(*self.latency_ms)
        prompts = list(ctx.requests)

        def estimate() -> tuple[int, int]:
            """One turn's tokens (the simulation uses exactly what it estimates)."""
            return 400 + 120 * len(prompts), 80 + 40 * len(prompts) // self.turns

        async def think() -> Completion:
            await ctx.clock.sleep(latency / self.turns)
            input_tokens, output_tokens = estimate()
            return Completion(text="", input_tokens=input_tokens, output_tokens=output_tokens)

        for turn in range(self.turns):
            if self.steerable and turn == 0:
                ctx.set_steerable(True)
            input_tokens, output_tokens = estimate()
            await ctx.call(think, input_tokens=input_tokens, output_tokens=output_tokens)
            prompts += ctx.take_steers()
        if self.steerable:
            ctx.set_steerable(False)
        usage = priced(400 + 120 * len(prompts), 80 + 40 * len(prompts), self.price)
        calls = self._calls_for(ctx, prompts)
        answer = _simulated_answer(prompts)
        outcome, orders = Outcome.NO_TRADE, tuple[OrderIntent, ...]()
        if self._random.random() < self.trade_probability:
            symbol = str(ctx.requests[0].payload.get("symbol", self.symbol))
            side: Literal["buy", "sell"] = "buy" if self._random.random() < 0.5 else "sell"
            qty = round(self._random.uniform(0.01, 0.5), 3)
            outcome, orders = Outcome.TRADE, (OrderIntent(symbol=symbol, side=side, qty=qty),)
        return RunResult(outcome=outcome, usage=usage, orders=orders, calls=calls, answer=answer,
                         call_results=self.call_results if calls else None)

    async def run_tools(self, ctx: RunContext, tools: ToolSession) -> RunResult:
        """The scripted steps, each one simulated model call through the gate asking for
        its tools (recorded, run and answered as a real model's), then a final answer."""
        symbol = str(ctx.requests[0].payload.get("symbol", self.symbol))
        steps = self.tool_steps[:tools.max_steps - 1]
        pause = self._random.uniform(*self.latency_ms) / (len(steps) + 1)
        input_tokens = output_tokens = 0
        for number, step in enumerate([*steps, ()], start=1):
            calls = tuple(ToolCall(f"sim-{ctx.run_id}-{number}-{k}", name,
                                   {key: symbol if value == "$symbol" else value
                                    for key, value in arguments.items()})
                          for k, (name, arguments) in enumerate(step, start=1))
            text = "" if calls else json.dumps({"decision": "no_trade",
                                                "reason": "simulated: looked, placed by tools"})

            async def think(calls: tuple[ToolCall, ...] = calls, text: str = text,
                            number: int = number) -> Completion:
                await ctx.clock.sleep(pause)
                return Completion(text=text, input_tokens=400 + 150 * number,
                                  output_tokens=60 + 30 * len(calls),
                                  stop_reason="tool_use" if calls else "end_turn",
                                  tool_calls=calls)

            completion = await ctx.call(think, input_tokens=400 + 150 * number,
                                        output_tokens=60 + 30 * len(calls))
            input_tokens += completion.input_tokens
            output_tokens += completion.output_tokens
            await tools.step(number, completion, [r.request_id for r in ctx.take_steers()])
        return RunResult(outcome=Outcome.NO_TRADE,
                         usage=priced(input_tokens, output_tokens, self.price),
                         answer=_simulated_answer(list(ctx.requests)))

    def _calls_for(self, ctx: RunContext, prompts: Sequence[AgentRequest]
                   ) -> tuple[CallIntent, ...]:
        """The configured calls, in a run that is not about call results, below the depth."""
        if not self.calls or ctx.depth >= self.call_below_depth or all(
                r.kind is Kind.CALL_RESULT for r in prompts):
            return ()
        return tuple(
            CallIntent(agent_id=plan.agent_id, priority=plan.priority, timeout_ms=plan.timeout_ms,
                       payload={**plan.payload, "from": ctx.run_id, "n": n})
            for plan in self.calls for n in range(1, plan.count + 1))


def _simulated_answer(prompts: Sequence[AgentRequest]) -> str:
    """What a simulated run answers its callers (nothing when it serves no call)."""
    results = [result for r in prompts if r.kind is Kind.CALL_RESULT
               for result in r.payload.get("results", ())]
    if results:
        statuses: dict[str, int] = {}
        for result in results:
            status = str(result.get("status"))
            statuses[status] = statuses.get(status, 0) + 1
        seen = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
        return f"simulated: {len(results)} call results ({seen})"
    if any(r.kind is Kind.AGENT_CALL for r in prompts):
        return f"simulated: looked at {len(prompts)} requests"
    return ""


SYSTEM_PROMPT = """You are a trading agent behind a gateway. You receive requests (market \
hooks, user messages, audits, alerts, calls from other agents, results of your own calls) as \
JSON, one per line. Decide whether to trade. Answer with exactly one JSON object and nothing \
else:
{"decision": "trade" or "no_trade", "orders": [{"symbol": "BTCUSD", "side": "buy" or \
"sell", "qty": 0.1}], "reason": "one sentence"}
Orders are only placed when decision is "trade". Later messages may add requests that \
arrived while you were thinking: take them into account in your next answer.

You may ask other agents for help with sub-agent calls, in the same object:
"calls": [{"agentId": "agent_eth_1m", "priority": "high" or "normal" or "low", \
"payload": {"question": "..."}, "timeoutMs": 60000}], "callResults": "all" or "each"
Each call runs on its target agent; their results come back to you as a request of kind \
"call_result" whose payload holds "results": [{"callId", "target", "status" (returned, \
failed, refused, cancelled or timed_out), "outcome", "answer", "usage", "error", "code"}]. \
With "callResults": "all" (the default) you get one request when every call has ended; \
with "each", one request per result as it arrives. Calls are limited in number per answer \
and in depth (a call's target calling further); calls beyond the limits are refused, and \
said so in the results.
When a request of kind "agent_call" asks you something, put what you answer the caller in \
"answer": "text" (your "reason" is sent if you give none). If you make calls while \
answering one, the caller gets your answer after you have seen your calls' results."""


TOOLS_NOTE = """

You have tools: use them to look at the market, your positions and open orders, other \
agents, and to place or cancel orders (an order you place with place_order is placed at \
once; do not repeat it in your answer). When you are done, answer without calling a tool, \
with the JSON object above. Requests that arrive while you work come in the next message, \
after your tools' results."""
"""Added to the system prompt of an agent that has tools."""


class AnswerError(ValueError):
    """The model's answer is not a decision the gateway can act on."""


class StepBudgetSpent(RuntimeError):
    """A run with tools spent its model calls (``max_steps``) without a final answer."""


class _Answer(WireModel):
    """What the model is asked to answer (snake_case or camelCase keys)."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel,
                              validate_by_name=True, validate_by_alias=True)

    decision: Outcome
    orders: tuple[OrderIntent, ...] = ()
    calls: tuple[CallIntent, ...] = ()
    call_results: CallResults | None = None
    reason: str = ""
    answer: str = ""


def render_requests(requests: Sequence[AgentRequest], summary: Summary | None = None) -> str:
    """The requests of a run (or its steers) as the model reads them: one JSON per line."""
    lines = []
    if summary is not None:
        lines.append(json.dumps({"summary": f"{summary.count} earlier requests were folded "
                                 "away by the queue cap", "first_at": summary.first_at,
                                 "last_at": summary.last_at}))
    for request in requests:
        lines.append(request.model_dump_json(
            include={"request_id", "created_at", "kind", "priority", "source", "payload"}))
    return "\n".join(lines)


def parse_answer(text: str) -> _Answer:
    """The decision in a model's answer: the outermost JSON object in it, validated."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise AnswerError(f"the model's answer holds no JSON object: {text[:200]!r}")
    try:
        return _Answer.model_validate_json(text[start:end + 1])
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}" for e in error.errors()
        )
        raise AnswerError(f"the model's answer is not a decision: {problems}"[:500]) from None


def estimate_tokens(system: str, messages: Sequence[Message]) -> int:
    """A cheap input-token estimate for the gate (about 4 characters a token, rounded up),
    corrected by the real usage when the call is released."""
    chars = len(system) + sum(
        len(m.content) + 8 + sum(len(r.content) + 8 for r in m.tool_results)
        + sum(len(c.name) + len(json.dumps(dict(c.arguments))) + 8 for c in m.tool_calls)
        for m in messages)
    return chars // 4 + 16


class LLMReasoner:
    """A reasoner on a real model: every call goes through the agent's provider gate.

    A run is a conversation of at most ``max_turns`` calls. The run is steerable while a
    turn is in flight and another turn may follow; steers received during a turn are sent
    as the next user message, so the model sees them before it gives its final answer.
    The final answer is parsed as a decision (`parse_answer`); one that cannot be is a
    failed run, never a guessed trade.
    """

    def __init__(self, client: LLMClient, *, system_prompt: str = SYSTEM_PROMPT,
                 max_tokens: int = 1_024, max_turns: int = 3, price: Price | None = None
                 ) -> None:
        self.price = price
        """What tokens cost at its provider (None: not known): a run's usage says."""
        self.client = client
        self.system_prompt = system_prompt
        self.max_tokens = max_tokens
        self.max_turns = max(1, max_turns)

    async def run(self, ctx: RunContext) -> RunResult:
        """Converse until no steer is waiting (or the turns are spent), then decide; with
        tools, a loop of steps (`run_tools`)."""
        if ctx.tools is not None and ctx.tools.specs:
            return await self.run_tools(ctx, ctx.tools)
        messages = [Message("user", render_requests(ctx.requests, ctx.summary))]
        input_tokens = output_tokens = 0
        steerable = self.max_turns > 1
        if steerable:
            ctx.set_steerable(True)
        turn = 0
        while True:
            turn += 1
            completion = await self._call(ctx, messages)
            input_tokens += completion.input_tokens
            output_tokens += completion.output_tokens
            messages.append(Message("assistant", completion.text))
            if steerable:
                ctx.set_steerable(False)  # decided at once: no steer reaches us after this
                steerable = False
            steers = ctx.take_steers()
            if not steers or turn >= self.max_turns:
                break
            messages.append(Message("user", render_requests(steers)))
            if turn + 1 < self.max_turns:
                ctx.set_steerable(True)
                steerable = True
        return _decided(completion.text, priced(input_tokens, output_tokens, self.price))

    async def run_tools(self, ctx: RunContext, tools: ToolSession) -> RunResult:
        """A run as a loop of steps: a model call offering the tools, the tool calls it
        asks for and their results (each recorded by ``tools``), the next call, until an
        answer without tool calls (then decided as `parse_answer` says) or the step budget.
        Steers decided for the run while it works reach the model at the next step, after
        the tool results; one that came during a final answer gets a step of its own."""
        system = self.system_prompt + TOOLS_NOTE
        messages = [Message("user", render_requests(ctx.requests, ctx.summary))]
        input_tokens = output_tokens = 0
        steerable = tools.max_steps > 1
        if steerable:
            ctx.set_steerable(True)
        steered: list[str] = []
        for step in range(1, tools.max_steps + 1):
            if steerable and step == tools.max_steps:  # no step left to deliver one to
                ctx.set_steerable(False)
                steerable = False
            completion = await self._call(ctx, messages, system, tools.specs)
            input_tokens += completion.input_tokens
            output_tokens += completion.output_tokens
            results = await tools.step(step, completion, steered)
            if not completion.tool_calls and steerable:
                ctx.set_steerable(False)  # (then no steer is decided for us after these)
                steerable = False
            steers = ctx.take_steers()
            steered = [request.request_id for request in steers]
            if not completion.tool_calls and (not steers or step == tools.max_steps):
                return _decided(completion.text,
                                priced(input_tokens, output_tokens, self.price))
            messages.append(Message("assistant", completion.text,
                                    tool_calls=completion.tool_calls))
            messages.append(Message("user", render_requests(steers) if steers else "",
                                    tool_results=tuple(results)))
            if not steerable and step + 1 < tools.max_steps:
                ctx.set_steerable(True)
                steerable = True
        raise StepBudgetSpent(f"the step budget ({tools.max_steps} model calls) was spent "
                              "before a final answer")

    async def _call(self, ctx: RunContext, messages: list[Message], system: str | None = None,
                    tools: Sequence[ToolSpec] = ()) -> Completion:
        snapshot = tuple(messages)
        prompt = self.system_prompt if system is None else system

        def make() -> Awaitable[Completion]:
            return self.client.complete(system=prompt, messages=snapshot,
                                        max_tokens=self.max_tokens, tools=tools)

        return await ctx.call(make, input_tokens=estimate_tokens(prompt, snapshot),
                              output_tokens=self.max_tokens)


Price = Callable[[int, int], float]
"""What a number of input and output tokens cost at a provider."""


def priced(input_tokens: int, output_tokens: int, price: Price | None) -> Usage:
    """A run's usage, with its cost when the price is known."""
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                 cost=None if price is None else price(input_tokens, output_tokens))


def _decided(text: str, usage: Usage) -> RunResult:
    """The run's result from the model's final answer (`parse_answer`)."""
    answer = parse_answer(text)
    orders = answer.orders if answer.decision is Outcome.TRADE else ()
    return RunResult(outcome=answer.decision, usage=usage, orders=orders, calls=answer.calls,
                     answer=(answer.answer or answer.reason)[:20_000],
                     call_results=answer.call_results if answer.calls else None)
