"""The provider gate, live: grants after commit, waits on the clock, restarts from its log."""

from __future__ import annotations

import asyncio

import pytest

from gateway.base.clock import FakeClock
from gateway.errors import StorageFailed
from gateway.runtime.gate import ProviderGate, SlotRefusedError
from gateway.runtime.phases import Phase
from lanes.gate import GateState, decode_gate_event, fold_gate
from lanes.gate.events import CallOutcome, GateLimits
from store import MemoryEventStore
from tests.gateway.support import TIMEOUT, next_event


async def started(store: MemoryEventStore, clock: FakeClock, **limits: int) -> ProviderGate:
    gate = ProviderGate(store, "anthropic", GateLimits(**limits), clock)
    await store.open()
    await gate.start()
    return gate


async def log_state(store: MemoryEventStore) -> GateState:
    records = await store.read_stream("provider:anthropic")
    return fold_gate(GateState(provider="provider:anthropic"),
                     [decode_gate_event(r.type, r.data) for r in records])


async def test_a_slot_is_granted_after_its_commit_and_the_log_is_the_state() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, requests_per_minute=10)
    async with gate.using("btc", "btc-r1", input_tokens=900, output_tokens=200) as slot:
        assert [r.type for r in await store.read_stream("provider:anthropic")][-1] == (
            "SlotGranted")
        gate.release(slot, CallOutcome.OK, input_tokens=850, output_tokens=120)
    await gate.flush()
    assert await log_state(store) == gate.state
    assert gate.status().window_input_tokens == 850
    await gate.stop()


async def test_over_the_limit_a_run_waits_for_the_window_and_is_served_in_turn() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, requests_per_minute=2)
    first = await gate.acquire("a", "a-r1")
    second = await gate.acquire("b", "b-r1")
    third = asyncio.create_task(gate.acquire("c", "c-r1"))
    await next_event(store, "SlotQueued")
    assert not third.done()
    assert [w.agent_id for w in gate.status().waiting_agents] == ["c"]
    gate.release(first, CallOutcome.OK)
    gate.release(second, CallOutcome.OK)
    clock.advance(60_000)
    slot = await asyncio.wait_for(third, TIMEOUT)
    assert slot.slot_id.startswith("c-r1/")
    await gate.stop()


async def test_the_wait_for_each_granted_slot_is_a_histogram() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, requests_per_minute=1)
    first = await gate.acquire("a", "a-r1")  # at once
    second = asyncio.create_task(gate.acquire("b", "b-r1"))
    aborted = asyncio.create_task(gate.acquire("c", "c-r1"))
    await next_event(store, "SlotQueued")
    aborted.cancel()  # a wait that ends without a slot is not one
    with pytest.raises(asyncio.CancelledError):
        await aborted
    gate.release(first, CallOutcome.OK)
    clock.advance(60_000)  # the window turns: the second's wait was a minute
    gate.release(await asyncio.wait_for(second, TIMEOUT), CallOutcome.OK)
    lines = gate.waits.lines("w", 'provider="anthropic"')
    assert 'w_bucket{provider="anthropic",le="0.005"} 1' in lines
    assert 'w_bucket{provider="anthropic",le="30.0"} 1' in lines
    assert 'w_bucket{provider="anthropic",le="60.0"} 2' in lines
    assert lines[-2:] == ['w_sum{provider="anthropic"} 60.000000',
                          'w_count{provider="anthropic"} 2']
    await gate.stop()


async def test_an_aborted_run_gives_its_place_back() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, max_concurrent=1)
    held = await gate.acquire("a", "a-r1")
    waiting = asyncio.create_task(gate.acquire("b", "b-r1"))
    await next_event(store, "SlotQueued")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await next_event(store, "SlotFreed")
    assert gate.status().waiting == 0
    gate.release(held, CallOutcome.OK)
    await gate.stop()


async def test_a_crash_while_holding_a_slot_frees_it() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, max_concurrent=1)
    with pytest.raises(RuntimeError, match="boom"):
        async with gate.using("a", "a-r1"):
            raise RuntimeError("boom")
    await gate.flush()
    assert gate.status().in_flight == 0
    slot = await asyncio.wait_for(gate.acquire("b", "b-r1"), TIMEOUT)
    gate.release(slot, CallOutcome.OK)
    await gate.stop()


async def test_a_restart_honours_a_backoff_in_progress() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, requests_per_minute=100)
    slot = await gate.acquire("a", "a-r1")
    gate.release(slot, CallOutcome.RATE_LIMITED, retry_after_ms=20_000)
    await gate.stop()

    again = ProviderGate(store, "anthropic", GateLimits(requests_per_minute=100), clock)
    await again.start()
    assert again.status().next_retry is not None
    position = await store.last_position()
    waiting = asyncio.create_task(again.acquire("b", "b-r1"))
    await next_event(store, "SlotQueued", after=position)
    assert not waiting.done()
    clock.advance(20_000)
    await asyncio.wait_for(waiting, TIMEOUT)
    await again.stop()


async def test_a_request_that_waits_too_long_is_refused_with_the_reason() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, max_concurrent=1, max_wait_ms=5_000)
    held = await gate.acquire("a", "a-r1")
    waiting = asyncio.create_task(gate.acquire("b", "b-r1"))
    await next_event(store, "SlotQueued")
    clock.advance(5_001)
    with pytest.raises(SlotRefusedError, match="waited_too_long"):
        await asyncio.wait_for(waiting, TIMEOUT)
    gate.release(held, CallOutcome.OK)
    await gate.stop()


async def test_a_run_refused_after_a_fair_share_hold_is_not_told_which_agent_it_was() -> None:
    """The gate's log names the agent the hold kept room for; the refused run's error,
    which lands in its own agent's log, does not."""
    clock, store = FakeClock(), MemoryEventStore()
    gate = await started(store, clock, requests_per_minute=3, max_wait_ms=5_000)
    await gate.acquire("small-desk", "small-r1", input_tokens=100)
    await gate.acquire("big", "big-r1", input_tokens=10_000)
    waiting = asyncio.create_task(gate.acquire("big", "big-r2", input_tokens=10_000))
    await next_event(store, "SlotQueued")
    clock.advance(5_001)
    with pytest.raises(SlotRefusedError) as refused:
        await asyncio.wait_for(waiting, TIMEOUT)
    assert "small-desk" in refused.value.refused.reason  # (the gate's own log)
    assert "held for its fair share" in str(refused.value)
    assert "small-desk" not in str(refused.value)
    await gate.stop()


async def test_a_restart_frees_the_slots_a_crashed_process_held_or_waited_for() -> None:
    clock, store = FakeClock(), MemoryEventStore()
    crashed = await started(store, clock, max_concurrent=1)
    await crashed.acquire("a", "a-r1")  # never released: the process dies with it
    waiting = asyncio.create_task(crashed.acquire("b", "b-r1"))
    await next_event(store, "SlotQueued")
    await crashed.flush()
    waiting.cancel()  # (the task dies with the process; nothing is recorded for it)
    crashed._core.move(Phase.GONE)  # (the process is dead: it records nothing more)
    restarted = ProviderGate(store, "anthropic", GateLimits(max_concurrent=1), clock)
    await restarted.start()
    status = restarted.status()
    assert (status.in_flight, status.waiting) == (0, 0)
    records = await store.read_stream("provider:anthropic")
    freed = [r for r in records if r.type == "SlotFreed"]
    assert len(freed) == 2 and all('"cancelled"' in r.data for r in freed)
    slot = await asyncio.wait_for(restarted.acquire("c", "c-r1"), TIMEOUT)  # capacity is back
    restarted.release(slot, CallOutcome.OK)
    await restarted.stop()


async def test_a_failed_append_is_refused_and_the_gate_rebuilds_itself_from_its_log() -> None:
    from tests.gateway.test_engine import FailingOnce

    clock, inner = FakeClock(), MemoryEventStore()
    store = FailingOnce(inner)
    await inner.open()
    gate = ProviderGate(store, "anthropic", GateLimits(max_concurrent=1), clock)  # type: ignore[arg-type]
    await gate.start()
    held = await gate.acquire("a", "a-r1")
    store.fail_next = True
    with pytest.raises(StorageFailed, match="could not record the slot: database or disk is "
                       "full") as refused:
        await gate.acquire("b", "b-r1")
    assert refused.value.code == "storage_failed"  # typed: the caller may retry
    await gate.flush()
    # What was not recorded never happened; what was recorded still holds; it works on.
    assert gate.state == await log_state(inner)
    assert gate.status().in_flight == 1
    waiting = asyncio.create_task(gate.acquire("c", "c-r1"))
    await next_event(inner, "SlotQueued", after=await inner.last_position() - 1)
    gate.release(held, CallOutcome.OK)
    slot = await asyncio.wait_for(waiting, TIMEOUT)
    gate.release(slot, CallOutcome.OK, remaining_requests=-1)  # nonsense header: clamped
    await gate.flush()
    assert gate.state == await log_state(inner)
    assert gate.status().in_flight == 0
    await gate.stop()
