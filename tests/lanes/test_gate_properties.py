"""Invariants of the provider gate over random arrivals, releases, cancels, answers, limit
changes and timers of many agents, in virtual time."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanes.gate import Breaker, GateState, decide_gate, fold_gate, verify_gate, window_usage
from lanes.gate_events import (
    GATE_INPUT_TYPES,
    WINDOW_MS,
    BreakerClosed,
    BreakerHalfOpened,
    BreakerOpened,
    CallOutcome,
    FreedBy,
    GateDecision,
    GateInput,
    GateLimits,
    GateLimitsApplied,
    GateLimitsChanged,
    SlotFreed,
    SlotGranted,
    SlotQueued,
    SlotRefused,
    SlotReleased,
    SlotRequested,
)
from lanes.requests import Priority
from tests.lanes.test_gate import GateBench

limit_sets = st.builds(
    GateLimits,
    requests_per_minute=st.none() | st.integers(min_value=1, max_value=6),
    input_tokens_per_minute=st.none() | st.sampled_from([2_000, 5_000, 20_000]),
    output_tokens_per_minute=st.none() | st.sampled_from([500, 2_000]),
    max_concurrent=st.none() | st.integers(min_value=1, max_value=3),
    max_wait_ms=st.sampled_from([0, 5_000, 60_000, 120_000]),
    lease_ms=st.sampled_from([10_000, 180_000]),
    priority_aging_ms=st.sampled_from([1_000, 30_000]),
    backoff_base_ms=st.sampled_from([100, 1_000]),
    backoff_cap_ms=st.sampled_from([1_000, 60_000]),
    max_attempts=st.integers(min_value=1, max_value=4),
    breaker_threshold=st.integers(min_value=1, max_value=4),
    breaker_cooldown_ms=st.sampled_from([1_000, 30_000]),
)

hints = st.none() | st.tuples(
    st.none() | st.integers(min_value=0, max_value=3),
    st.none() | st.sampled_from([0, 1_000, 50_000]),
    st.none() | st.sampled_from([-1_000, 1_000, 20_000]),
)

request = st.fixed_dictionaries(
    {
        "agent": st.integers(min_value=0, max_value=5),
        "priority": st.sampled_from(list(Priority)),
        "input_tokens": st.sampled_from([0, 100, 1_500, 6_000]),
        "output_tokens": st.sampled_from([0, 300, 1_000]),
        "retry": st.booleans(),
        "again": st.sampled_from([False] * 9 + [True]),
    }
)
release = st.fixed_dictionaries(
    {
        "pick": st.integers(min_value=0, max_value=50),
        "outcome": st.sampled_from([CallOutcome.OK] * 3 + list(CallOutcome)),
        "usage": st.sampled_from([None, 0.0, 0.5, 1.0, 1.5]),
        "retry_after_ms": st.none() | st.sampled_from([0, 500, 5_000, 90_000]),
        "hints": hints,
        "any": st.booleans(),
    }
)
actions = st.one_of(
    st.tuples(st.just("request"), request),
    st.tuples(st.just("request"), request),
    st.tuples(st.just("request"), request),
    st.tuples(st.just("release"), release),
    st.tuples(st.just("release"), release),
    st.tuples(st.just("cancel"), st.integers(min_value=0, max_value=50)),
    st.tuples(st.just("advance"), st.sampled_from([1, 500, 5_000, 30_000, 60_000, 200_000])),
    st.tuples(st.just("limits"), limit_sets),
    st.tuples(st.just("unknown"), st.none()),
)


class CheckedBench(GateBench):
    """A bench that decides every input twice (on a copy first): the same decisions."""

    def feed(self, event: GateInput) -> list[GateDecision]:
        again = decide_gate(copy.deepcopy(self.state), event)
        decisions = super().feed(event)
        assert decisions == again, "decide is not deterministic"
        return decisions


def play(bench: GateBench, action: str, arg: Any, runs: dict[int, str]) -> None:
    """Apply one random action the way the runtime would."""
    state = bench.state
    if action == "request":
        agent = arg["agent"]
        if arg["again"] and state.waiting:  # a redelivered request decides nothing new
            slot_id = next(iter(state.waiting))
        else:
            slot_id = f"s{state.counters.queued + state.counters.refused + len(bench.log)}"
        run_id = runs.get(agent) if arg["retry"] else None
        run_id = run_id or f"run-{slot_id}"
        runs[agent] = run_id
        bench.feed(
            SlotRequested(
                at=bench.now,
                slot_id=slot_id,
                agent_id=f"agent_{agent}",
                run_id=run_id,
                priority=arg["priority"],
                input_tokens=arg["input_tokens"],
                output_tokens=arg["output_tokens"],
            )
        )
    elif action == "release":
        held = sorted(state.leases) + (sorted(state.waiting) if arg["any"] else [])
        if not held:
            return
        slot_id = held[arg["pick"] % len(held)]
        lease = state.leases.get(slot_id)
        usage = arg["usage"]
        remaining_requests = remaining_tokens = reset_at = None
        if arg["hints"] is not None:
            remaining_requests, remaining_tokens, offset = arg["hints"]
            reset_at = None if offset is None else bench.now + offset
        bench.feed(
            SlotReleased(
                at=bench.now,
                slot_id=slot_id,
                outcome=arg["outcome"],
                input_tokens=None
                if usage is None
                else int((lease.input_tokens if lease else 0) * usage),
                output_tokens=None
                if usage is None
                else int((lease.output_tokens if lease else 0) * usage),
                retry_after_ms=arg["retry_after_ms"],
                remaining_requests=remaining_requests,
                remaining_tokens=remaining_tokens,
                reset_at=reset_at,
            )
        )
    elif action == "cancel":
        held = sorted(state.leases) + sorted(state.waiting) + ["never-held"]
        slot_id = held[arg % len(held)]
        was_held = slot_id in state.leases or slot_id in state.waiting
        decisions = bench.cancel(slot_id)
        assert slot_id not in state.leases and slot_id not in state.waiting
        freed = [d for d in decisions if isinstance(d, SlotFreed) and d.slot_id == slot_id]
        assert len(freed) == (1 if was_held else 0)
    elif action == "advance":
        bench.advance(arg)
    elif action == "limits":
        bench.feed(GateLimitsChanged(at=bench.now, limits=arg))
    elif action == "unknown":
        bench.release("never-granted")


def check_invariants(bench: GateBench) -> None:
    """Everything that must hold of the log and the state, whatever happened."""
    provider = bench.state.provider
    log = bench.round_tripped()
    assert fold_gate(GateState(provider=provider), log) == bench.state
    assert verify_gate(provider, log) is None

    # An independent model of the log: windows, concurrency, waits, the breaker.
    now = 0
    limits = GateLimits()
    queued: dict[str, SlotQueued] = {}
    queued_at: dict[str, int] = {}
    charges: dict[str, list[int]] = {}  # slot -> [granted at, input, output], as known
    held: set[str] = set()
    breaker, probe = Breaker.CLOSED, None
    for event in log:
        if isinstance(event, GATE_INPUT_TYPES):
            now = max(now, event.at)
        elif isinstance(event, GateLimitsApplied):
            limits = event.limits
        elif isinstance(event, SlotQueued):
            queued[event.slot_id], queued_at[event.slot_id] = event, now
        elif isinstance(event, SlotGranted):
            request = queued.pop(event.slot_id)
            assert now <= request.wait_deadline, "granted after its wait bound"
            assert event.lease_deadline == now + limits.lease_ms
            assert breaker is not Breaker.OPEN, "granted while the breaker is open"
            if breaker is Breaker.HALF_OPEN:
                assert event.probe and probe is None, "a second probe"
                probe = event.slot_id
            charges[event.slot_id] = [now, request.input_tokens, request.output_tokens]
            recent = [c for c in charges.values() if c[0] > now - WINDOW_MS]
            for limit, used in (
                (limits.requests_per_minute, len(recent)),
                (limits.input_tokens_per_minute, sum(c[1] for c in recent)),
                (limits.output_tokens_per_minute, sum(c[2] for c in recent)),
            ):
                assert limit is None or used <= limit, "a per-minute limit was exceeded"
            held.add(event.slot_id)
            cap = limits.max_concurrent
            assert cap is None or len(held) <= cap, "more calls in flight than max_concurrent"
        elif isinstance(event, SlotFreed):
            queued.pop(event.slot_id, None)
            held.discard(event.slot_id)
            if probe == event.slot_id:
                probe = None
            charge = charges.get(event.slot_id)
            if charge is not None and event.input_tokens is not None:
                charge[1] = event.input_tokens
            if charge is not None and event.output_tokens is not None:
                charge[2] = event.output_tokens
            if event.by is FreedBy.LEASE_EXPIRED:
                assert event.slot_id not in queued
        elif isinstance(event, SlotRefused):
            assert event.reason and event.slot_id not in held
            queued.pop(event.slot_id, None)
        elif isinstance(event, BreakerOpened):
            breaker, probe = Breaker.OPEN, None
            assert event.until > now
        elif isinstance(event, BreakerHalfOpened):
            breaker = Breaker.HALF_OPEN
        elif isinstance(event, BreakerClosed):
            breaker = Breaker.CLOSED

    # Every request ended granted, refused or freed, or still waits within its bound.
    state = bench.state
    assert set(queued) == set(state.waiting)
    assert all(bench.now < q.wait_deadline for q in queued.values())
    assert held == set(state.leases)
    # The window totals agree with the grants as the log tells them.
    recent = [c for c in charges.values() if c[0] > bench.now - WINDOW_MS]
    assert window_usage(state, bench.now) == (
        len(recent),
        sum(c[1] for c in recent),
        sum(c[2] for c in recent),
    )
    assert (state.used_requests, state.used_input, state.used_output) == (
        len(state.window),
        sum(c.input_tokens for c in state.window),
        sum(c.output_tokens for c in state.window),
    )
    # No lease outlives its deadline.
    assert all(lease.deadline > bench.now for lease in state.leases.values())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limits=limit_sets, script=st.lists(actions, min_size=5, max_size=80))
def test_random_traffic_keeps_every_invariant(
    limits: GateLimits, script: list[tuple[str, Any]]
) -> None:
    bench = CheckedBench(limits)
    runs: dict[int, str] = {}
    for action, arg in script:
        play(bench, action, arg, runs)
    check_invariants(bench)


@settings(max_examples=50, deadline=None)
@given(limits=limit_sets, script=st.lists(actions, max_size=40))
def test_the_log_replays_to_the_same_state_at_every_step(
    limits: GateLimits, script: list[tuple[str, Any]]
) -> None:
    bench = GateBench(limits)
    runs: dict[int, str] = {}
    for action, arg in script:
        play(bench, action, arg, runs)
        assert fold_gate(GateState(provider=bench.state.provider), bench.log) == bench.state


def test_plain_traffic_reaches_the_decisions_the_invariants_are_about() -> None:
    """The invariants above are not vacuous: plain traffic reaches grants, waits,
    refusals, lease expiries, backoffs and the breaker."""
    bench = GateBench(
        GateLimits(
            requests_per_minute=2,
            max_concurrent=1,
            lease_ms=10_000,
            max_wait_ms=30_000,
            breaker_threshold=1,
            breaker_cooldown_ms=5_000,
        )
    )
    bench.request("s1")
    bench.request("s2")
    bench.request("s3", input_tokens=10)
    bench.advance(10_000)  # s1's lease expires: s2 granted
    bench.release("s2", "overloaded")  # breaker opens, s3 waits
    bench.advance(60_000)  # half-open probe, then refusal of whatever waited too long
    kinds = {type(e).__name__ for e in bench.log}
    assert {
        "SlotQueued",
        "SlotGranted",
        "SlotFreed",
        "SlotRefused",
        "BackoffScheduled",
        "BreakerOpened",
        "BreakerHalfOpened",
    } <= kinds
    assert any(isinstance(e, SlotFreed) and e.by is FreedBy.LEASE_EXPIRED for e in bench.log)
