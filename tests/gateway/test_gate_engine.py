"""Runs through the provider gate: slots, retries the gate allows, spend limits, aborts,
steers between turns of a real-shaped reasoner (a scripted LLM client, a fake clock)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from gateway.base.clock import FakeClock
from gateway.llm.port import Completion, Message, ProviderCallError, RateHints, ToolSpec
from gateway.llm.reasoner import SYSTEM_PROMPT, LLMReasoner, SimulatedReasoner
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from lanes import AgentConfig, Mode
from lanes.events import RunFailed, RunsHeld, TradingState
from lanes.gate.events import CallOutcome, GateLimits
from store import MemoryEventStore
from tests.gateway.support import TIMEOUT, control, log_of, next_event, request

Step = Completion | ProviderCallError | asyncio.Future[Completion]


def answer(decision: str = "no_trade", **extra: Any) -> Completion:
    """A successful call whose text is a decision."""
    text = json.dumps({"decision": decision, **extra})
    return Completion(text=text, input_tokens=500, output_tokens=40,
                      hints=RateHints(remaining_requests=40))


class ScriptedLLM:
    """An `LLMClient` that answers each call with the next step of its script."""

    provider = "anthropic"
    model = "scripted"

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.calls: list[list[Message]] = []
        self.called = asyncio.Event()

    async def complete(self, *, system: str, messages: Sequence[Message],
                       max_tokens: int, tools: Sequence[ToolSpec] = ()) -> Completion:
        self.calls.append(list(messages))
        self.called.set()
        step = self.steps.pop(0)
        if isinstance(step, ProviderCallError):
            raise step
        if isinstance(step, asyncio.Future):
            return await step
        return step

    async def close(self) -> None:
        """Nothing to close."""

    async def call_count(self, n: int) -> None:
        """Wait until ``n`` calls were made."""
        async def wait() -> None:
            while len(self.calls) < n:
                self.called.clear()
                await self.called.wait()
        await asyncio.wait_for(wait(), TIMEOUT)


async def engine_with(client: ScriptedLLM, *, limits: GateLimits | None = None,
                      config: AgentConfig | None = None, agents: Sequence[str] = ("btc",),
                      max_turns: int = 1) -> tuple[Engine, MemoryEventStore, FakeClock]:
    clock, store = FakeClock(), MemoryEventStore()
    gate = ProviderGate(store, "claude", limits or GateLimits(), clock)
    reasoner = LLMReasoner(client, max_turns=max_turns)
    engine = Engine(store, {a: config or AgentConfig() for a in agents}, clock=clock,
                    reasoners=lambda _: reasoner, gates={"claude": gate},
                    agent_gates={a: "claude" for a in agents})
    await engine.start()
    return engine, store, clock


async def types_in(store: MemoryEventStore, stream: str) -> list[str]:
    return [r.type for r in await store.read_stream(stream)]


async def test_a_run_calls_the_model_under_a_slot_and_releases_it_with_the_real_usage() -> None:
    client = ScriptedLLM(answer("no_trade"))
    engine, store, _ = await engine_with(client)
    await engine.submit(request("btc"))
    await next_event(store, "RunCompleted")
    await engine.flush()
    gate = engine.gates["claude"]
    await gate.flush()
    assert await types_in(store, "provider:claude") == [
        "GateLimitsChanged", "GateLimitsApplied", "PolicyOffered", "PolicyAdopted",
        "SlotRequested", "SlotQueued", "SlotGranted",
        "SlotReleased", "SlotFreed", "ProviderHintsNoted",
    ]
    status = gate.status()
    assert (status.in_flight, status.window_requests, status.window_input_tokens) == (0, 1, 500)
    assert status.remaining_requests == 40
    await engine.stop()


async def test_an_agents_gate_weight_goes_with_its_slot_requests_and_a_weight_of_1_is_not_stored(
) -> None:
    client = ScriptedLLM(answer("no_trade"), answer("no_trade"))
    engine, store, _ = await engine_with(client, agents=("heavy",),
                                         config=AgentConfig(gate_weight=3))
    await engine.submit(request("heavy"))
    await next_event(store, "RunCompleted")
    gate = engine.gates["claude"]
    await gate.flush()
    asked = [json.loads(r.data) for r in await store.read_stream("provider:claude")
             if r.type in ("SlotRequested", "SlotQueued")]
    assert [a["weight"] for a in asked] == [3, 3]
    assert gate.state.shares["heavy"].weight == 3
    await engine.stop()

    light, light_store, _ = await engine_with(ScriptedLLM(answer("no_trade")))
    await light.submit(request("btc"))
    await next_event(light_store, "RunCompleted")
    await light.gates["claude"].flush()
    stored = [json.loads(r.data) for r in await light_store.read_stream("provider:claude")
              if r.type in ("SlotRequested", "SlotQueued")]
    assert len(stored) == 2 and all("weight" not in data for data in stored)
    await light.stop()


async def test_one_concurrent_call_makes_the_second_agent_wait_its_turn() -> None:
    first: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    client = ScriptedLLM(first, answer())
    engine, store, _ = await engine_with(client, limits=GateLimits(max_concurrent=1),
                                         agents=("a", "b"))
    await engine.submit(request("a"))
    await client.call_count(1)
    await engine.submit(request("b"))
    await next_event(store, "SlotQueued", after=(await store.last_position()))
    status = engine.gates["claude"].status()
    assert [w.agent_id for w in status.waiting_agents] == ["b"] and status.in_flight == 1
    assert len(client.calls) == 1  # b has not called the provider
    first.set_result(answer())
    await client.call_count(2)
    await engine.stop()


async def test_a_429_backs_off_as_retry_after_says_then_the_run_finishes() -> None:
    limited = ProviderCallError(CallOutcome.RATE_LIMITED, "rate_limit_error", status=429,
                                hints=RateHints(retry_after_ms=20_000))
    client = ScriptedLLM(limited, answer("no_trade"))
    engine, store, clock = await engine_with(client, limits=GateLimits(backoff_base_ms=100))
    await engine.submit(request("btc"))
    backoff = await next_event(store, "BackoffScheduled")
    assert "retry-after 20000 ms" in json.loads(backoff.data)["reason"]
    await next_event(store, "SlotQueued", after=backoff.position)
    clock.advance(19_000)
    await engine.gates["claude"].flush()  # whatever the timer decided is committed
    await engine.flush()
    assert len(client.calls) == 1  # still backing off
    clock.advance(1_000)
    await next_event(store, "RunCompleted")
    assert len(client.calls) == 2
    await engine.stop()


async def test_attempts_are_bounded_then_the_run_fails_with_the_gates_reason() -> None:
    overloaded = ProviderCallError(CallOutcome.OVERLOADED, "overloaded_error", status=529)
    client = ScriptedLLM(overloaded, overloaded, answer())
    engine, store, clock = await engine_with(
        client, limits=GateLimits(max_attempts=2, backoff_base_ms=10, backoff_cap_ms=10))
    await engine.submit(request("btc"))
    await client.call_count(1)
    await next_event(store, "BackoffScheduled")
    clock.advance(10)
    failed = await next_event(store, "RunFailed")
    assert "retries_exhausted" in json.loads(failed.data)["error"]
    assert len(client.calls) == 2
    await engine.stop()


async def test_a_spend_limit_pauses_the_agent_with_an_alert_until_resume() -> None:
    spend = ProviderCallError(CallOutcome.SPEND_LIMIT, "billing_error: credit balance too low",
                              status=400)
    client = ScriptedLLM(spend, answer())
    engine, store, _ = await engine_with(client)
    await engine.submit(request("btc"))
    held = await next_event(store, "RunsHeld")
    await engine.submit(request("btc"))  # accepted, but no run starts while held
    await engine.flush()
    state = engine.state("btc")
    assert state.trading is TradingState.REDUCING and state.active is None
    assert engine.status("btc").held is not None
    assert "credit balance too low" in (engine.status("btc").held or "")
    entries = [e.event for e in await log_of(store) if e.stream == "btc"]
    assert any(isinstance(e, RunFailed) for e in entries)
    assert any(isinstance(e, RunsHeld) for e in entries)
    assert "SpendLimitReached" in await types_in(store, "provider:claude")
    await engine.submit(control("btc", "resume"))
    await next_event(store, "RunCompleted", after=held.position)
    assert len(client.calls) == 2
    await engine.stop()


async def test_an_emergency_stop_while_waiting_for_a_slot_gives_the_place_back() -> None:
    first: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    client = ScriptedLLM(first)
    engine, store, _ = await engine_with(client, limits=GateLimits(max_concurrent=1),
                                         agents=("a", "b"))
    await engine.submit(request("a"))
    await client.call_count(1)
    await engine.submit(request("b"))
    queued = await next_event(store, "SlotQueued", after=(await store.last_position()))
    await engine.submit(control("b", "emergency_stop"))
    freed = await next_event(store, "SlotFreed", after=queued.position)
    assert json.loads(freed.data)["by"] == "cancelled"
    assert engine.gates["claude"].status().waiting == 0
    first.set_result(answer())
    await engine.stop()


async def test_steers_reach_the_model_between_turns_and_its_last_answer_decides() -> None:
    first: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    order = {"symbol": "BTCUSD", "side": "buy", "qty": 0.1}
    client = ScriptedLLM(first, answer("trade", orders=[order], reason="CPI"))
    engine, store, _ = await engine_with(client, config=AgentConfig(mode=Mode.STEER),
                                         max_turns=3)
    await engine.submit(request("btc", payload={"symbol": "BTCUSD"}))
    await client.call_count(1)
    await next_event(store, "SteerabilityChanged")
    ack = await engine.submit(request("btc", "user_control", payload={"message": "CPI hot"}))
    assert ack.decision == "accepted"
    await next_event(store, "RunSteered")
    first.set_result(answer("no_trade"))
    await next_event(store, "OrderAccepted")
    assert len(client.calls) == 2
    second = client.calls[1]
    assert [m.role for m in second] == ["user", "assistant", "user"]
    assert "CPI hot" in second[2].content
    await engine.stop()


async def test_an_answer_that_is_not_a_decision_fails_the_run_never_guesses() -> None:
    client = ScriptedLLM(Completion(text="I think we should buy", input_tokens=1,
                                    output_tokens=1))
    engine, store, _ = await engine_with(client)
    await engine.submit(request("btc"))
    failed = await next_event(store, "RunFailed")
    assert "no JSON object" in json.loads(failed.data)["error"]
    await engine.stop()


async def test_the_simulated_reasoner_takes_a_slot_per_turn() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = ProviderGate(store, "sim", GateLimits(requests_per_minute=100), clock)
    reasoner = SimulatedReasoner(latency_ms=(100, 100), turns=2, seed=1)
    engine = Engine(store, {"btc": AgentConfig()}, clock=clock, reasoners=lambda _: reasoner,
                    gates={"sim": gate}, agent_gates={"btc": "sim"})
    await engine.start()
    await engine.submit(request("btc"))
    await next_event(store, "SlotGranted")
    clock.advance(50)
    await next_event(store, "SlotFreed")
    clock.advance(50)
    await next_event(store, "RunCompleted")
    await gate.flush()
    assert gate.status().counters.granted == 2
    await engine.stop()


async def test_a_models_calls_go_out_and_its_next_turn_reads_their_answers() -> None:
    ask = answer(calls=[{"agentId": "eth", "priority": "high", "payload": {"q": "ETH?"}}],
                 callResults="all", reason="ask eth first")
    client = ScriptedLLM(ask, answer(answer="ETH looks heavy"), answer(reason="done"))
    engine, store, _ = await engine_with(client, agents=("btc", "eth"))
    await engine.submit(request("btc"))
    await next_event(store, "CallResultsReady")
    await next_event(store, "RunCompleted", after=(await next_event(
        store, "CallResultsReady")).position)
    assert len(client.calls) == 3
    asked = client.calls[1][0].content  # eth's run reads the call and its payload
    assert '"kind":"agent_call"' in asked and '"q":"ETH?"' in asked
    results = json.loads(client.calls[2][0].content)  # btc's next run reads the answers
    assert results["kind"] == "call_result"
    [result] = results["payload"]["results"]
    assert result["answer"] == "ETH looks heavy" and result["status"] == "returned"
    await engine.stop()


def test_the_system_prompt_says_how_to_make_calls_and_how_results_come_back() -> None:
    for words in ('"calls"', '"agentId"', '"callResults"', '"call_result"', '"answer"',
                  "timed_out"):
        assert words in SYSTEM_PROMPT
