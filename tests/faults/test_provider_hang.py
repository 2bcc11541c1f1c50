"""A provider that hangs, over loopback through the real SDK client: every call is cut off by
its timeout (or the run by the agent's run timeout), the gate backs off and gives every slot
back, the control lane and agents on other reasoners carry on meanwhile, nothing accepted is
lost, and runs succeed again once the provider answers."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from gateway.base.clock import SystemClock
from gateway.errors import GatewayError
from gateway.llm.fake_provider import FakeProvider, Fault, FaultKind, create_fake_provider, serving
from gateway.llm.providers import AnthropicClient
from gateway.llm.reasoner import LLMReasoner
from gateway.runtime.acks import Ack
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from lanes import AgentConfig, verify
from lanes.gate import decode_gate_event, verify_gate
from lanes.gate.events import GateLimits
from store import MemoryEventStore, RecordedEvent
from tests.gateway.support import ManualReasoner, control, log_of, next_event, request

LIMITS = GateLimits(backoff_base_ms=50, backoff_cap_ms=100, max_attempts=3,
                    breaker_threshold=100, max_wait_ms=30_000)
HUNG = Fault(FaultKind.HANG, seconds=120)


@pytest.fixture
async def provider() -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = create_fake_provider()
    async with serving(fake) as url:
        yield fake, url
        fake.release()  # no handler left waiting when the server stops


async def gateway(url: str, *, call_timeout_s: float, configs: dict[str, AgentConfig]
                  ) -> tuple[Engine, MemoryEventStore, ProviderGate, ManualReasoner,
                             AnthropicClient]:
    """``btc`` and ``eth`` think with the hanging provider, ``sol`` with a manual reasoner."""
    store = MemoryEventStore()
    gate = ProviderGate(store, "claude", LIMITS, clock=SystemClock())
    client = AnthropicClient("claude-test", api_key="k", base_url=url, timeout_s=call_timeout_s)
    llm = LLMReasoner(client, max_turns=1, max_tokens=256)
    manual = ManualReasoner()
    engine = Engine(store, configs,
                    reasoners=lambda agent: manual if agent == "sol" else llm,
                    gates={"claude": gate}, agent_gates={"btc": "claude", "eth": "claude"})
    await engine.start()
    return engine, store, gate, manual, client


async def gate_records(store: MemoryEventStore) -> list[RecordedEvent]:
    return await store.read_stream("provider:claude")


async def assert_settled(gate: ProviderGate) -> None:
    """The gate holds no slot and nobody waits (a run gives its slot back before it ends)."""
    await gate.flush()
    status = gate.status()
    assert (status.in_flight, status.waiting) == (0, 0)


async def test_hung_calls_time_out_within_the_attempt_cap_while_everything_else_carries_on(
    provider: tuple[FakeProvider, str],
) -> None:
    fake, url = provider
    fake.fail_next(HUNG, times=100)
    engine, store, gate, manual, client = await gateway(
        url, call_timeout_s=0.3, configs={a: AgentConfig() for a in ("btc", "eth", "sol")})
    accepted = [await engine.submit(request(agent)) for agent in ("btc", "eth")]

    # While both calls hang: the control lane answers at once and stops btc's run...
    granted = await next_event(store, "SlotGranted")
    await next_event(store, "SlotGranted", after=granted.position)
    started = time.perf_counter()
    stop = await engine.submit(control("btc", "emergency_stop"))
    stop_ms = (time.perf_counter() - started) * 1000
    assert isinstance(stop, Ack) and stop.decision == "accepted"
    assert stop_ms < 1000, f"the stop waited {stop_ms:.0f} ms behind a hung provider"
    print(f"\nemergency stop acknowledged in {stop_ms:.1f} ms while both calls hang")
    aborted = json.loads((await next_event(store, "RunAborted")).data)
    assert aborted["reason"] == "emergency_stop"
    # ... and an agent thinking elsewhere runs and finishes as usual.
    accepted.append(await engine.submit(request("sol")))
    run = await manual.started()
    manual.finish(run.run_id)
    completed = json.loads((await next_event(store, "RunCompleted")).data)
    assert completed["run_id"] == run.run_id

    # eth's run tries the cap (3 calls), each cut off by the call timeout, then fails.
    failed = json.loads((await next_event(store, "RunFailed")).data)
    assert "timeout" in failed["error"]
    await assert_settled(gate)
    outcomes = [json.loads(r.data)["outcome"] for r in await gate_records(store)
                if r.type == "SlotReleased"]
    assert outcomes.count("timeout") == 3, outcomes
    assert all(isinstance(a, Ack) and a.decision == "accepted" for a in accepted)

    # The provider answers again: the next run of eth succeeds through the same gate.
    fake.reset()
    await engine.submit(request("eth"))
    after = (await next_event(store, "RunFailed")).position
    await next_event(store, "RunCompleted", after=after)
    await assert_settled(gate)
    await engine.stop()
    await client.close()
    await _log_is_whole(store, accepted)


async def test_a_stream_that_stalls_is_ended_by_the_agent_run_timeout_and_frees_its_slot(
    provider: tuple[FakeProvider, str],
) -> None:
    fake, url = provider
    fake.fail_next(Fault(FaultKind.STALL_MID_STREAM, seconds=120))
    # The call itself would wait a minute: only the agent's run timeout bounds it.
    configs = {a: AgentConfig(run_timeout_ms=800) for a in ("btc", "eth", "sol")}
    engine, store, gate, _, client = await gateway(url, call_timeout_s=60, configs=configs)
    first = await engine.submit(request("btc"))
    aborted = json.loads((await next_event(store, "RunAborted")).data)
    assert aborted["reason"] == "timeout"
    await assert_settled(gate)
    assert any(r.type in ("SlotReleased", "SlotCancelled") for r in await gate_records(store))

    second = await engine.submit(request("btc"))  # the provider is healthy again
    await next_event(store, "RunCompleted")
    await assert_settled(gate)
    await engine.stop()
    await client.close()
    await _log_is_whole(store, [first, second])


async def _log_is_whole(store: MemoryEventStore, acks: Sequence[Ack | GatewayError]) -> None:
    """Every accepted request is in the log once; agents and gate re-decide to themselves."""
    received: list[str] = []
    for record in await store.read():
        if record.type == "RequestReceived":
            received.append(json.loads(record.data)["request"]["requestId"])
    for ack in acks:
        assert isinstance(ack, Ack)
        assert received.count(ack.request_id) == 1, ack.request_id
    assert verify(await log_of(store)) is None
    gate_log = [decode_gate_event(r.type, r.data) for r in await gate_records(store)]
    assert verify_gate("provider:claude", gate_log) is None
