"""A stream's life as one phase moved along a table: every move the table does not allow
raises and changes nothing; a provider gate and a stream's core live by it."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from gateway.base.clock import FakeClock
from gateway.runtime.gate import GateMoved, ProviderGate
from gateway.runtime.phases import DECIDING, TRANSITIONS, IllegalPhase, Phase, moved
from lanes.gate import GateState
from lanes.gate.events import CallOutcome, GateLimits
from store import Fence, MemoryEventStore
from tests.gateway.test_core import Flaky, Heard, core_of, phase, received, turns


@pytest.mark.parametrize(("now", "to"), list(itertools.product(Phase, Phase)))
def test_a_move_is_made_exactly_when_the_table_allows_it(now: Phase, to: Phase) -> None:
    if to in TRANSITIONS[now]:
        assert moved("s", now, to) is to
    else:
        with pytest.raises(IllegalPhase, match=f"s: {now.value} -> {to.value}"):
            moved("s", now, to)


def test_gone_is_the_end_and_new_only_the_beginning() -> None:
    assert TRANSITIONS[Phase.GONE] == frozenset()
    assert all(Phase.NEW not in after for after in TRANSITIONS.values())
    assert set(TRANSITIONS) == set(Phase)
    assert {Phase.LIVE, Phase.REBUILDING} == DECIDING


async def test_a_gate_is_new_then_idle_beside_its_owner_live_once_adopted_then_gone() -> None:
    store, clock = MemoryEventStore(), FakeClock()
    await store.open()
    gate = ProviderGate(store, "anthropic", GateLimits(max_concurrent=1), clock)
    assert phase(gate) is Phase.NEW and not gate.loaded
    await gate.start(load=False)
    assert phase(gate) is Phase.IDLE and not gate.loaded
    with pytest.raises(GateMoved):
        await gate.acquire("a", "a-r1")
    await store.join("me", 60_000)
    epoch = (await store.acquire("me", [gate.stream]))[gate.stream]
    gate.adopt(GateState(provider=gate.stream), Fence("me", epoch), lambda _agent: False)
    assert phase(gate) is Phase.LIVE and gate.loaded
    slot = await asyncio.wait_for(gate.acquire("a", "a-r1"), 5)
    gate.drop()  # (its lease is another process's)
    assert phase(gate) is Phase.IDLE and not gate.loaded
    gate.release(slot, CallOutcome.OK)  # decided elsewhere now: nothing recorded here
    await gate.flush()
    await gate.stop()
    assert phase(gate) is Phase.GONE
    gate.adopt(GateState(provider=gate.stream), Fence("me", 2), lambda _agent: False)
    assert phase(gate) is Phase.GONE  # (a late adoption: stopped is stopped)
    with pytest.raises(GateMoved):
        await gate.acquire("a", "a-r2")


async def test_a_gate_adopted_before_its_start_is_a_bug_said_at_once() -> None:
    store = MemoryEventStore()
    await store.open()
    gate = ProviderGate(store, "anthropic", GateLimits(max_concurrent=1), FakeClock())
    with pytest.raises(IllegalPhase, match="adopted while new"):
        gate.adopt(GateState(provider=gate.stream), Fence("me", 1), lambda _agent: False)
    assert phase(gate) is Phase.NEW
    await gate.stop()
    assert phase(gate) is Phase.GONE


async def test_a_failed_append_rebuilds_a_live_stream_but_not_one_that_left() -> None:
    store, clock, heard = Flaky(), FakeClock(), Heard()
    await store.open()
    left = Heard()
    live, gone = core_of(store, clock, heard), core_of(store, clock, left)
    store.refusing = True
    live.feed(received(clock))
    gone.feed(received(clock))
    gone.move(Phase.GONE)  # (it left before its append failed)
    await turns()
    assert phase(live) is Phase.LIVE and "rebuilt from 0" in heard.said
    assert phase(gone) is Phase.GONE and gone.failures == 1 and left.said == ["failed"]
