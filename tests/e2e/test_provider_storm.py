"""The gate against a real-shaped provider over loopback: a 429 with retry-after, then a 529
storm. Attempts stay bounded, nothing storms back, the breaker opens and recovers, and the
runs finish afterwards; the real anthropic and openai SDK clients make every call."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import pytest

from gateway.base.clock import SystemClock
from gateway.llm.fake_provider import FakeProvider, Fault, FaultKind, create_fake_provider, serving
from gateway.llm.port import LLMClient
from gateway.llm.providers import AnthropicClient, OpenAIClient
from gateway.llm.reasoner import LLMReasoner
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from lanes import AgentConfig, verify
from lanes.gate import decode_gate_event, verify_gate
from lanes.gate.events import GateLimits
from store import MemoryEventStore
from tests.gateway.support import log_of, next_event, request

AGENTS = ("btc", "eth", "sol")
STORM = GateLimits(backoff_base_ms=50, backoff_cap_ms=200, max_attempts=8,
                   breaker_threshold=3, breaker_cooldown_ms=300, max_wait_ms=30_000)


@pytest.fixture
async def provider() -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = create_fake_provider()
    async with serving(fake) as url:
        yield fake, url


@pytest.fixture
async def closing() -> AsyncIterator[list[Engine | LLMClient]]:
    """What a test started, stopped after it however it ended (an SDK client left open is
    closed by its finalizer, in a later test's loop, and fails that test)."""
    started: list[Engine | LLMClient] = []
    yield started
    for thing in reversed(started):
        await (thing.stop() if isinstance(thing, Engine) else thing.close())


async def gateway(client: LLMClient, limits: GateLimits, closing: list[Engine | LLMClient],
                  agents: Sequence[str] = AGENTS) -> tuple[Engine, MemoryEventStore]:
    store = MemoryEventStore()
    gate = ProviderGate(store, "claude", limits, clock=SystemClock())
    reasoner = LLMReasoner(client, max_turns=1, max_tokens=256)
    engine = Engine(store, {a: AgentConfig() for a in agents}, reasoners=lambda _: reasoner,
                    gates={"claude": gate}, agent_gates={a: "claude" for a in agents})
    closing.append(client)
    await engine.start()
    closing.append(engine)
    return engine, store


async def gate_types(store: MemoryEventStore) -> list[str]:
    return [r.type for r in await store.read_stream("provider:claude")]


async def wait_for_completions(store: MemoryEventStore, n: int) -> None:
    after = 0
    for _ in range(n):  # each waits with its own timeout
        after = (await next_event(store, "RunCompleted", after=after)).position


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_429_then_a_529_storm_is_ridden_out_and_every_run_finishes(
    provider: tuple[FakeProvider, str], kind: str, closing: list[Engine | LLMClient]
) -> None:
    fake, url = provider
    fake.fail_next(Fault(FaultKind.RATE_LIMITED, retry_after_s=1))
    fake.fail_next(Fault(FaultKind.OVERLOADED), times=6)
    client: LLMClient = (
        AnthropicClient("claude-test", api_key="test-key-123", base_url=url, timeout_s=5)
        if kind == "anthropic"
        else OpenAIClient("gpt-test", api_key="test-key-123", base_url=f"{url}/v1", timeout_s=5)
    )
    engine, store = await gateway(client, STORM, closing)
    for agent in AGENTS:
        await engine.submit(request(agent))
    await wait_for_completions(store, len(AGENTS))
    await engine.stop()
    await client.close()

    # Bounded: every scripted failure was tried once and each run then succeeded once.
    assert len(fake.calls) == 7 + len(AGENTS)
    assert fake.pending_faults == 0
    # No retry storm: after the 429 came back, the gate granted nothing until its
    # retry-after had passed (each grant is timed by the input that caused it).
    limited_at, now, grants_after = None, 0, []
    for record in await store.read_stream("provider:claude"):
        data = json.loads(record.data)
        now = data.get("at", now)
        if record.type == "SlotReleased" and data["outcome"] == "rate_limited":
            limited_at = now
        elif record.type == "SlotGranted" and limited_at is not None:
            grants_after.append(now)
    assert limited_at is not None and grants_after
    assert min(grants_after) >= limited_at + 1_000
    types = await gate_types(store)
    assert "BreakerOpened" in types and "BreakerHalfOpened" in types
    assert types.index("BreakerClosed") > types.index("BreakerOpened")
    backoffs = [json.loads(r.data)["reason"] for r in await store.read_stream("provider:claude")
                if r.type == "BackoffScheduled"]
    assert any("retry-after 1000 ms" in reason for reason in backoffs)
    # The log re-decides to itself, agents and gate alike; no key was recorded.
    records = await store.read()
    assert verify(await log_of(store)) is None
    gate_log = [decode_gate_event(r.type, r.data) for r in records
                if r.stream == "provider:claude"]
    assert verify_gate("provider:claude", gate_log) is None
    assert not any("test-key-123" in r.data for r in records)


async def test_a_storm_longer_than_the_attempt_cap_fails_the_run_and_stops_calling(
    provider: tuple[FakeProvider, str], closing: list[Engine | LLMClient],
) -> None:
    fake, url = provider
    fake.fail_next(Fault(FaultKind.OVERLOADED), times=50)
    client = AnthropicClient("claude-test", api_key="test-key-123", base_url=url, timeout_s=5)
    limits = STORM.model_copy(update={"max_attempts": 4, "breaker_threshold": 100})
    engine, store = await gateway(client, limits, closing, agents=("btc",))
    await engine.submit(request("btc"))
    # (up to four calls of up to 5 s each, if a starved machine makes them time out: once
    # in a whole-suite run on a loaded machine, 10 s were not enough)
    failed = await next_event(store, "RunFailed", within_s=4 * 5 + 10)
    assert "retries_exhausted" in json.loads(failed.data)["error"]
    await engine.stop()
    await client.close()
    assert len(fake.calls) == 4  # the cap, and not one call more
    assert fake.pending_faults == 46


async def test_a_spend_limit_answer_is_never_retried_and_pauses_the_agent(
    provider: tuple[FakeProvider, str], closing: list[Engine | LLMClient],
) -> None:
    fake, url = provider
    fake.fail_next(Fault(FaultKind.SPEND_LIMIT))
    client = AnthropicClient("claude-test", api_key="test-key-123", base_url=url, timeout_s=5)
    engine, store = await gateway(client, STORM, closing, agents=("btc",))
    await engine.submit(request("btc"))
    held = await next_event(store, "RunsHeld")
    assert "credit balance" in json.loads(held.data)["reason"]
    await engine.flush()
    assert engine.status("btc").trading.value == "REDUCING"
    await engine.stop()
    await client.close()
    assert len(fake.calls) == 1
