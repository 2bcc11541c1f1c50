"""The provider gate: the cases a person would try first (virtual time, no sleeping)."""

from __future__ import annotations

import copy
import heapq
from typing import Any

import pytest

from lanes.gate import (
    Breaker,
    GateState,
    decide_gate,
    decode_gate_event,
    encode_gate_event,
    evolve_gate,
    fold_gate,
    full_jitter,
    gate_status,
    next_gate_due,
    verify_gate,
)
from lanes.gate.events import (
    WINDOW_MS,
    BackoffScheduled,
    BreakerOpened,
    CallOutcome,
    FreedBy,
    GateDecision,
    GateEvent,
    GateInput,
    GateLimits,
    GateLimitsChanged,
    GateTimer,
    Refusal,
    SlotCancelled,
    SlotFreed,
    SlotGranted,
    SlotRefused,
    SlotReleased,
    SlotRequested,
    SpendLimitReached,
)
from lanes.handlers import IllegalTransition
from lanes.policy import POLICY, PolicyOffered
from lanes.requests import Priority
from lanes.streams import gate_stream

T0 = 1_771_297_800_000  # 2026-02-17T03:10:00Z


class GateBench:
    """One provider gate, a clock that only moves when told, and the log of its stream."""

    def __init__(self, limits: GateLimits | None = None, provider: str = "anthropic") -> None:
        self.state = GateState(provider=provider)
        self.log: list[GateEvent] = []
        self.now = T0
        self.feed(GateLimitsChanged(at=self.now, limits=limits or GateLimits()))
        self.feed(PolicyOffered(at=self.now, version=POLICY))  # (as the runtime does)

    def feed(self, event: GateInput) -> list[GateDecision]:
        """Decide one input; record it and its decisions if there are any."""
        decisions = decide_gate(self.state, event)
        if decisions:
            self.log += [event, *decisions]
        return decisions

    def request(
        self,
        slot_id: str,
        agent_id: str = "agent_a",
        run_id: str | None = None,
        priority: str = "normal",
        input_tokens: int = 1_000,
        output_tokens: int = 200,
    ) -> list[GateDecision]:
        """A run asks for a slot now."""
        return self.feed(
            SlotRequested(
                at=self.now,
                slot_id=slot_id,
                agent_id=agent_id,
                run_id=run_id or f"run-{slot_id}",
                priority=Priority(priority),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
        )

    def release(self, slot_id: str, outcome: str = "ok", **fields: Any) -> list[GateDecision]:
        """The call under ``slot_id`` ended now."""
        return self.feed(
            SlotReleased(at=self.now, slot_id=slot_id, outcome=CallOutcome(outcome), **fields)
        )

    def cancel(self, slot_id: str) -> list[GateDecision]:
        """The run holding or awaiting ``slot_id`` was aborted or crashed."""
        return self.feed(SlotCancelled(at=self.now, slot_id=slot_id))

    def limits(self, **fields: Any) -> list[GateDecision]:
        """New limits from now on."""
        return self.feed(GateLimitsChanged(at=self.now, limits=GateLimits(**fields)))

    def advance(self, ms: int) -> list[GateDecision]:
        """Move the clock, firing each timer when it falls due, as the runtime does.

        Afterwards a timer at the new time decides nothing (checked on a copy), so the tests
        notice if `next_gate_due` ever misses a time when something was due.
        """
        target = self.now + ms
        decisions: list[GateDecision] = []
        while (due := next_gate_due(self.state, self.now)) is not None and due <= target:
            self.now = max(self.now, due)
            decisions += self.feed(GateTimer(at=self.now))
        self.now = target
        assert decide_gate(copy.deepcopy(self.state), GateTimer(at=target)) == [], (
            "something was due that next_gate_due did not announce"
        )
        return decisions

    def round_tripped(self) -> list[GateEvent]:
        """The log as it comes back from storage (encoded to JSON and decoded)."""
        return [decode_gate_event(*encode_gate_event(event)) for event in self.log]


def names(decisions: list[GateDecision]) -> list[str]:
    """The type names of some decisions, for readable assertions."""
    return [type(d).__name__ for d in decisions]


def granted(decisions: list[GateDecision]) -> list[str]:
    """The slot ids granted, in order."""
    return [d.slot_id for d in decisions if isinstance(d, SlotGranted)]


def refusals(decisions: list[GateDecision]) -> list[SlotRefused]:
    return [d for d in decisions if isinstance(d, SlotRefused)]


# ------------------------------------------------------------------------------ limits


def test_a_request_within_limits_is_granted_at_once_with_a_lease() -> None:
    bench = GateBench(GateLimits(requests_per_minute=10, lease_ms=180_000))

    decisions = bench.request("s1")

    assert names(decisions) == ["SlotQueued", "SlotGranted"]
    assert decisions[1] == SlotGranted(slot_id="s1", lease_deadline=T0 + 180_000)
    assert bench.state.leases["s1"].agent_id == "agent_a"


def test_requests_over_the_rpm_limit_wait_until_the_window_frees() -> None:
    bench = GateBench(GateLimits(requests_per_minute=2))
    bench.request("s1")
    bench.advance(10_000)
    bench.request("s2")
    bench.release("s1")

    assert names(bench.request("s3")) == ["SlotQueued"]
    assert bench.advance(WINDOW_MS - 10_001) == []
    assert granted(bench.advance(1)) == ["s3"]  # s1's grant left the window
    assert bench.now == T0 + WINDOW_MS


def test_token_limits_count_the_estimate_until_the_release_corrects_it() -> None:
    bench = GateBench(GateLimits(input_tokens_per_minute=10_000))
    bench.request("s1", input_tokens=8_000)
    assert names(bench.request("s2", input_tokens=4_000)) == ["SlotQueued"]

    # s1 used far less than its estimate: the window has room for s2 at once.
    decisions = bench.release("s1", input_tokens=3_000, output_tokens=100)

    assert granted(decisions) == ["s2"]
    assert gate_status(bench.state, bench.now).window_input_tokens == 7_000
    assert gate_status(bench.state, bench.now + WINDOW_MS).window_input_tokens == 0


def test_a_release_that_does_not_know_its_usage_keeps_the_estimate() -> None:
    bench = GateBench(GateLimits(input_tokens_per_minute=10_000))
    bench.request("s1", input_tokens=8_000)
    bench.release("s1", "timeout")

    assert names(bench.request("s2", input_tokens=4_000)) == ["SlotQueued"]
    assert gate_status(bench.state, bench.now).window_input_tokens == 8_000


def test_max_concurrent_holds_requests_until_a_slot_is_released() -> None:
    bench = GateBench(GateLimits(max_concurrent=1))
    bench.request("s1")
    assert names(bench.request("s2")) == ["SlotQueued"]
    assert bench.advance(30_000) == []

    decisions = bench.release("s1")

    assert names(decisions) == ["SlotFreed", "SlotGranted"]
    assert granted(decisions) == ["s2"]


def test_a_request_no_window_can_ever_hold_is_refused_on_arrival() -> None:
    bench = GateBench(GateLimits(input_tokens_per_minute=5_000))

    decisions = bench.request("s1", input_tokens=6_000)

    assert names(decisions) == ["SlotRefused"]
    assert refusals(decisions)[0].code is Refusal.TOO_LARGE
    assert "input_tokens_per_minute is 5000" in refusals(decisions)[0].reason
    assert bench.state.waiting == {}


# ---------------------------------------------------------------------------- fairness


def test_big_prompts_and_small_prompts_share_tokens_not_requests() -> None:
    """Two agents saturate an input-token limit, one with prompts nine times bigger: each
    gets about half the tokens, so the small one makes about nine times the calls."""
    bench = GateBench(GateLimits(input_tokens_per_minute=100_000, max_wait_ms=600_000))
    size = {"big": 9_000, "small": 1_000}
    tokens = {"big": 0, "small": 0}
    calls = {"big": 0, "small": 0}
    seq = 0

    def ask(agent: str) -> list[GateDecision]:
        nonlocal seq
        seq += 1
        return bench.request(
            f"{agent}-{seq}", agent_id=agent, input_tokens=size[agent], output_tokens=0
        )

    grants: list[str] = []
    for agent, depth in (("big", 12), ("small", 100)):  # each always wants a full window
        for _ in range(depth):
            grants += granted(ask(agent))
    for _ in range(20 * 12):  # 20 minutes; every call returns within five seconds
        while grants:
            slot_id = grants.pop(0)
            agent = slot_id.split("-")[0]
            tokens[agent] += size[agent]
            calls[agent] += 1
            grants += granted(bench.release(slot_id, input_tokens=size[agent]))
            grants += granted(ask(agent))
        grants += granted(bench.advance(5_000))

    assert tokens["big"] > 0 and tokens["small"] > 0
    share = tokens["small"] / (tokens["big"] + tokens["small"])
    assert 0.45 <= share <= 0.55, (tokens, calls)
    assert 8 * calls["big"] <= calls["small"] <= 10 * calls["big"], calls


def test_agents_are_served_in_turn_not_in_arrival_order() -> None:
    bench = GateBench(GateLimits(max_concurrent=1))
    bench.request("hold", agent_id="other")
    for n in range(3):
        bench.request(f"a{n}", agent_id="agent_a")
    bench.request("b0", agent_id="agent_b")

    order = []
    for slot_id in ["hold", "a0", "b0", "a1"]:
        bench.advance(2_000)  # each call takes a while: no grace is left of the one before
        order += granted(bench.release(slot_id))

    assert order == ["a0", "b0", "a1", "a2"]


def test_priority_classes_are_served_high_first() -> None:
    bench = GateBench(GateLimits(max_concurrent=1))
    bench.request("hold")
    bench.request("low", agent_id="agent_l", priority="low")
    bench.request("normal", agent_id="agent_n", priority="normal")
    bench.request("high", agent_id="agent_h", priority="high")

    order = []
    for slot_id in ["hold", "high", "normal"]:
        order += granted(bench.release(slot_id))

    assert order == ["high", "normal", "low"]


def test_a_low_request_rises_with_waiting_and_is_not_starved_by_high_ones() -> None:
    limits = GateLimits(max_concurrent=1, priority_aging_ms=10_000, max_wait_ms=600_000)
    bench = GateBench(limits)
    bench.request("hold", agent_id="agent_h", priority="high")
    bench.request("low", agent_id="agent_l", priority="low")
    held, n = "hold", 0
    served_low_at = None
    while served_low_at is None:  # a steady stream of high requests from another agent
        n += 1
        bench.request(f"h{n}", agent_id="agent_h", priority="high")
        bench.advance(5_000)
        got = granted(bench.release(held))
        held = got[0]
        if held == "low":
            served_low_at = bench.now
    # Low goes once it has waited two aging periods longer than the oldest waiting high.
    aging = limits.priority_aging_ms
    assert 2 * aging <= served_low_at - T0 <= 2 * aging + 10_000


# -------------------------------------------------------------------- cancels and leases


def test_cancel_frees_a_waiting_slot_and_a_granted_one() -> None:
    bench = GateBench(GateLimits(max_concurrent=1))
    bench.request("s1")
    bench.request("s2")
    bench.request("s3")

    assert bench.cancel("s2") == [
        SlotFreed(slot_id="s2", by=FreedBy.CANCELLED, detail="cancelled while waiting")
    ]
    decisions = bench.cancel("s1")

    assert names(decisions) == ["SlotFreed", "SlotGranted"]
    assert granted(decisions) == ["s3"]
    assert set(bench.state.leases) == {"s3"} and bench.state.waiting == {}
    assert bench.cancel("s1") == []  # cancelling again is a no-op


def test_an_expired_lease_frees_a_leaked_slot_and_a_late_release_is_ignored() -> None:
    bench = GateBench(GateLimits(max_concurrent=1, lease_ms=130_000, max_wait_ms=200_000))
    bench.request("leaked")
    bench.request("next")
    assert bench.advance(129_999) == []

    decisions = bench.advance(1)

    assert names(decisions) == ["SlotFreed", "SlotGranted"]
    freed = decisions[0]
    assert isinstance(freed, SlotFreed) and freed.by is FreedBy.LEASE_EXPIRED
    assert granted(decisions) == ["next"]
    assert names(bench.release("leaked")) == ["SlotReleaseIgnored"]
    assert set(bench.state.leases) == {"next"}


# ----------------------------------------------------------------- reacting to answers


def test_a_429_with_retry_after_holds_every_grant_until_then() -> None:
    bench = GateBench(GateLimits(backoff_base_ms=100, backoff_cap_ms=1_000))
    bench.request("s1")

    decisions = bench.release("s1", "rate_limited", retry_after_ms=20_000)

    backoff = [d for d in decisions if isinstance(d, BackoffScheduled)]
    assert backoff == [BackoffScheduled(until=T0 + 20_000, attempt=1, reason=backoff[0].reason)]
    assert "retry-after 20000 ms" in backoff[0].reason
    assert names(bench.request("retry", run_id="run-s1")) == ["SlotQueued"]
    assert gate_status(bench.state, bench.now).next_retry == T0 + 20_000
    assert bench.advance(19_999) == []
    assert granted(bench.advance(1)) == ["retry"]


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap() -> None:
    limits = GateLimits(backoff_base_ms=1_000, backoff_cap_ms=8_000, max_attempts=10)
    bench = GateBench(limits)
    delays = []
    for n in range(1, 7):
        bench.request(f"s{n}", run_id="run-1")
        bench.advance(60_000)  # past any backoff
        start = bench.now
        decisions = bench.release(f"s{n}", "rate_limited")
        backoff = next(d for d in decisions if isinstance(d, BackoffScheduled))
        ceiling = min(8_000, 1_000 * 2 ** (n - 1))
        assert backoff.attempt == n
        assert 0 <= backoff.until - start <= ceiling
        assert backoff.until - start == full_jitter(f"s{n}", n, ceiling)
        delays.append(backoff.until - start)
    assert len(set(delays)) > 1
    bench.request("ok", run_id="run-2")
    bench.advance(60_000)
    bench.release("ok")
    assert bench.state.attempt == 0


def test_full_jitter_is_deterministic_and_spread_over_its_range() -> None:
    samples = [full_jitter(f"slot-{n}", 3, 4_000) for n in range(2_000)]
    assert samples == [full_jitter(f"slot-{n}", 3, 4_000) for n in range(2_000)]
    assert min(samples) >= 0 and max(samples) <= 4_000
    assert 1_800 <= sum(samples) / len(samples) <= 2_200
    assert min(samples) < 200 and max(samples) > 3_800


def test_a_run_gets_no_slot_after_max_attempts_failures_in_a_row() -> None:
    bench = GateBench(GateLimits(max_attempts=3, backoff_base_ms=10, backoff_cap_ms=10))
    for n in range(3):
        bench.request(f"s{n}", run_id="run-x")
        bench.advance(100)
        bench.release(f"s{n}", "server_error")
    decisions = bench.request("s3", run_id="run-x")

    assert names(decisions) == ["SlotRefused"]
    refusal = refusals(decisions)[0]
    assert refusal.code is Refusal.RETRIES_EXHAUSTED and "failed 3 calls in a row" in refusal.reason
    assert granted(bench.request("other", run_id="run-y")) == ["other"]


def test_a_529_storm_opens_the_breaker_then_a_single_probe_closes_it() -> None:
    limits = GateLimits(
        breaker_threshold=3, breaker_cooldown_ms=30_000, backoff_base_ms=10, backoff_cap_ms=10
    )
    bench = GateBench(limits)
    for n in range(3):
        bench.request(f"s{n}", agent_id=f"agent_{n}")
    bench.release("s0", "overloaded")
    bench.release("s1", "overloaded")
    decisions = bench.release("s2", "overloaded")
    assert (
        BreakerOpened(until=T0 + 30_000, reason="3 unhealthy answers in a row (last: overloaded)")
        in decisions
    )
    assert bench.state.breaker is Breaker.OPEN

    bench.request("w1", agent_id="agent_1")
    bench.request("w2", agent_id="agent_2")
    assert bench.advance(29_999) == []
    decisions = bench.advance(1)
    assert names(decisions) == ["BreakerHalfOpened", "SlotGranted"]
    assert decisions[1] == SlotGranted(slot_id="w1", lease_deadline=bench.now + 180_000, probe=True)
    assert bench.advance(10_000) == []  # one probe only

    decisions = bench.release("w1")
    assert names(decisions) == ["SlotFreed", "BreakerClosed", "SlotGranted"]
    assert gate_status(bench.state, bench.now).breaker is Breaker.CLOSED


def test_a_failed_probe_reopens_the_breaker() -> None:
    limits = GateLimits(
        breaker_threshold=1, breaker_cooldown_ms=10_000, backoff_base_ms=10, backoff_cap_ms=10
    )
    bench = GateBench(limits)
    bench.request("s0")
    bench.release("s0", "server_error")
    bench.request("probe")
    bench.advance(10_000)
    assert bench.state.probe == "probe"

    decisions = bench.release("probe", "timeout")

    assert names(decisions) == ["SlotFreed", "BreakerOpened"]
    assert bench.state.breaker is Breaker.OPEN and bench.state.breaker_until == bench.now + 10_000


def test_a_probe_that_is_cancelled_lets_the_next_request_probe() -> None:
    bench = GateBench(GateLimits(breaker_threshold=1, breaker_cooldown_ms=1_000))
    bench.request("s0")
    bench.release("s0", "overloaded")
    bench.request("p1")
    bench.request("p2")
    bench.advance(1_000)
    assert bench.state.probe == "p1" and "p2" in bench.state.waiting

    assert granted(bench.cancel("p1")) == ["p2"]
    assert bench.state.probe == "p2" and bench.state.breaker is Breaker.HALF_OPEN


def test_requests_are_refused_at_once_while_the_breaker_is_open_past_their_wait() -> None:
    limits = GateLimits(breaker_threshold=1, breaker_cooldown_ms=60_000, max_wait_ms=20_000)
    bench = GateBench(limits)
    bench.request("s0")
    decisions = bench.release("s0", "overloaded")
    assert "BreakerOpened" in names(decisions)

    decisions = bench.request("late")

    assert names(decisions) == ["SlotRefused"]
    assert refusals(decisions)[0].code is Refusal.BREAKER_OPEN
    assert "circuit breaker is open until" in refusals(decisions)[0].reason


def test_waiting_requests_are_refused_when_the_breaker_opens_past_their_wait() -> None:
    limits = GateLimits(
        breaker_threshold=1, breaker_cooldown_ms=60_000, max_wait_ms=20_000, max_concurrent=1
    )
    bench = GateBench(limits)
    bench.request("s0")
    bench.request("waiting")

    decisions = bench.release("s0", "overloaded")

    assert [(r.slot_id, r.code) for r in refusals(decisions)] == [("waiting", Refusal.BREAKER_OPEN)]
    assert bench.state.waiting == {}


def test_a_spend_limit_pauses_the_agent_and_is_never_retried() -> None:
    bench = GateBench()
    bench.request("s1", agent_id="agent_a", run_id="run-1")

    decisions = bench.release("s1", "spend_limit")

    assert SpendLimitReached(agent_id="agent_a", run_id="run-1") in decisions
    assert not any(isinstance(d, BackoffScheduled | BreakerOpened) for d in decisions)
    retry = bench.request("s2", agent_id="agent_a", run_id="run-1")
    assert refusals(retry)[0].code is Refusal.SPEND_LIMIT
    assert granted(bench.request("s3", agent_id="agent_b", run_id="run-2")) == ["s3"]


def test_rate_limit_headers_slow_grants_before_a_429() -> None:
    bench = GateBench(GateLimits(requests_per_minute=1_000))
    bench.request("s1")
    decisions = bench.release(
        "s1", remaining_requests=1, remaining_tokens=50_000, reset_at=T0 + 15_000
    )
    assert "ProviderHintsNoted" in names(decisions)

    assert granted(bench.request("s2")) == ["s2"]  # the one request the provider has left
    assert names(bench.request("s3")) == ["SlotQueued"]
    assert gate_status(bench.state, bench.now).remaining_requests == 0
    assert bench.advance(14_999) == []
    assert granted(bench.advance(1)) == ["s3"]


def test_remaining_tokens_hold_a_request_that_would_use_more() -> None:
    bench = GateBench()
    bench.request("s1")
    bench.release("s1", remaining_tokens=2_000, reset_at=T0 + 5_000)

    assert names(bench.request("big", input_tokens=5_000)) == ["SlotQueued"]
    assert granted(bench.advance(5_000)) == ["big"]


def test_a_request_refused_at_its_wait_bound_lets_the_one_behind_it_go_at_once() -> None:
    """The head of the line is refused at the end of the millisecond of its bound: a
    request it held back, and that fits, is granted in that same decision."""
    bench = GateBench(GateLimits(max_wait_ms=5_000))
    bench.request("s1", input_tokens=0, output_tokens=0)
    bench.release("s1", remaining_tokens=0, reset_at=T0 + WINDOW_MS)
    assert names(bench.request("big", priority="high")) == ["SlotQueued"]  # no tokens left
    bench.limits(max_wait_ms=60_000)
    assert names(bench.request("free", input_tokens=0, output_tokens=0)) == ["SlotQueued"]

    decisions = bench.advance(5_000)

    assert names(decisions) == ["SlotRefused", "SlotGranted"]
    assert granted(decisions) == ["free"]


# ------------------------------------------------------------------------------ limits


def test_changed_limits_apply_to_requests_not_yet_granted() -> None:
    bench = GateBench(GateLimits(lease_ms=100_000))
    bench.request("old")

    assert names(bench.limits(lease_ms=50_000, requests_per_minute=1)) == ["GateLimitsApplied"]
    assert names(bench.request("new")) == ["SlotQueued"]  # over the new RPM
    assert bench.state.leases["old"].deadline == T0 + 100_000
    decisions = bench.advance(WINDOW_MS)
    assert decisions == [SlotGranted(slot_id="new", lease_deadline=T0 + WINDOW_MS + 50_000)]
    assert bench.limits(lease_ms=50_000, requests_per_minute=1) == []  # unchanged: nothing


def test_lowered_token_limits_refuse_waiting_requests_that_can_never_fit() -> None:
    bench = GateBench(GateLimits(max_concurrent=1))
    bench.request("s1")
    bench.request("huge", input_tokens=50_000)

    decisions = bench.limits(max_concurrent=1, input_tokens_per_minute=10_000)

    assert [(r.slot_id, r.code) for r in refusals(decisions)] == [("huge", Refusal.TOO_LARGE)]


def test_a_request_waiting_longer_than_max_wait_is_refused_with_what_held_it() -> None:
    bench = GateBench(GateLimits(max_concurrent=1, max_wait_ms=5_000))
    bench.request("s1")
    bench.request("s2")
    assert bench.advance(4_999) == []

    decisions = bench.advance(1)

    assert len(decisions) == 1
    refusal = refusals(decisions)[0]
    assert refusal.slot_id == "s2" and refusal.code is Refusal.WAITED_TOO_LONG
    assert "waited 5000 ms" in refusal.reason and "max_concurrent: 1 calls in flight" in (
        refusal.reason
    )


def test_a_request_that_fits_at_its_wait_bound_is_granted_not_refused() -> None:
    bench = GateBench(GateLimits(requests_per_minute=1, max_wait_ms=WINDOW_MS))
    bench.request("s1")
    bench.request("s2")

    assert granted(bench.advance(WINDOW_MS)) == ["s2"]


# ---------------------------------------------------------------------- log and status


def test_the_log_replays_and_verifies_and_a_tampered_log_does_not() -> None:
    bench = GateBench(GateLimits(requests_per_minute=2, max_concurrent=1))
    for n in range(4):
        bench.request(f"s{n}", agent_id=f"agent_{n % 2}")
    bench.release("s0", "rate_limited", retry_after_ms=1_000)
    bench.advance(120_000)

    log = bench.round_tripped()
    assert fold_gate(GateState(provider="anthropic"), log) == bench.state
    assert verify_gate("anthropic", log) is None

    index = next(i for i, e in enumerate(log) if isinstance(e, SlotGranted) and i > 3)
    tampered = [*log[:index], SlotGranted(slot_id="nope", lease_deadline=0), *log[index + 1 :]]
    divergence = verify_gate("anthropic", tampered)
    assert divergence is not None and divergence.index == index


def test_an_illegal_event_raises_and_changes_nothing() -> None:
    bench = GateBench(GateLimits(max_concurrent=1))
    bench.request("s1")
    bench.request("s2")
    before = copy.deepcopy(bench.state)

    with pytest.raises(IllegalTransition, match="max_concurrent"):
        evolve_gate(bench.state, SlotGranted(slot_id="s2", lease_deadline=0))
    with pytest.raises(IllegalTransition, match="not waiting"):
        evolve_gate(bench.state, SlotGranted(slot_id="s9", lease_deadline=0))
    with pytest.raises(IllegalTransition, match="not held"):
        evolve_gate(bench.state, SlotFreed(slot_id="s9", by=FreedBy.CANCELLED, detail=""))
    assert bench.state == before


def test_status_shows_limits_usage_waiting_agents_breaker_and_next_retry() -> None:
    bench = GateBench(GateLimits(requests_per_minute=2, breaker_threshold=1))
    bench.request("s1", agent_id="agent_a", input_tokens=500, output_tokens=50)
    bench.request("s2", agent_id="agent_b")
    bench.request("s3", agent_id="agent_b")
    bench.advance(2_000)
    bench.release("s1", "overloaded", input_tokens=400, output_tokens=40, retry_after_ms=9_000)

    status = gate_status(bench.state, bench.now)

    assert bench.state.provider == "anthropic" and gate_stream("anthropic") == "provider:anthropic"
    assert (status.window_requests, status.window_input_tokens) == (2, 1_400)
    assert status.in_flight == 1 and status.waiting == 1
    assert [(a.agent_id, a.waiting, a.oldest_wait_ms) for a in status.waiting_agents] == [
        ("agent_b", 1, 2_000)
    ]
    assert status.breaker is Breaker.OPEN and status.breaker_until == bench.now + 30_000
    assert status.next_retry is not None and status.next_retry >= bench.now + 9_000
    assert gate_status(bench.state, bench.now + WINDOW_MS).window_requests == 0


# --------------------------------------------------------------- utilisation, fairness


def saturate(agents: int, rpm: int, minutes: int, call_ms: int) -> tuple[list[int], list[int]]:
    """Every agent always has one request waiting; a call takes ``call_ms``. Returns the
    grants per agent in the period, and every wait."""
    state = GateState(provider="sim")
    decide_gate(
        state,
        GateLimitsChanged(
            at=0, limits=GateLimits(requests_per_minute=rpm, max_wait_ms=10 * WINDOW_MS)
        ),
    )
    end = minutes * WINDOW_MS
    counts = [0] * agents
    waits: list[int] = []
    asked: dict[str, int] = {}
    releases: list[tuple[int, str]] = []
    seq = 0

    def handle(decisions: list[GateDecision], now: int) -> None:
        for decision in decisions:
            if isinstance(decision, SlotGranted):
                agent = int(decision.slot_id.split(":")[0])
                if now < end:
                    counts[agent] += 1
                waits.append(now - asked.pop(decision.slot_id))
                heapq.heappush(releases, (now + call_ms, decision.slot_id))
            assert not isinstance(decision, SlotRefused), decision

    def ask(agent: int, now: int) -> None:
        nonlocal seq
        seq += 1
        slot_id = f"{agent}:{seq}"
        asked[slot_id] = now
        handle(
            decide_gate(
                state, SlotRequested(at=now, slot_id=slot_id, agent_id=f"a{agent}", run_id=slot_id)
            ),
            now,
        )

    for agent in range(agents):
        ask(agent, 0)
    now = 0
    while now < end:
        due = next_gate_due(state, now)
        release_at = releases[0][0] if releases else None
        if release_at is not None and (due is None or release_at <= due):
            now, slot_id = heapq.heappop(releases)
            handle(
                decide_gate(state, SlotReleased(at=now, slot_id=slot_id, outcome=CallOutcome.OK)),
                now,
            )
            ask(int(slot_id.split(":")[0]), now)
        elif due is not None:
            now = due
            handle(decide_gate(state, GateTimer(at=now)), now)
        else:
            break
    return counts, waits


def test_a_saturated_600_rpm_limit_is_used_fully_and_shared_fairly() -> None:
    counts, waits = saturate(agents=100, rpm=600, minutes=10, call_ms=2_000)

    utilisation = sum(counts) / (600 * 10)
    jain = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))
    assert utilisation >= 0.98, utilisation
    assert utilisation <= 1.0
    assert jain >= 0.99, jain
    assert max(waits) <= WINDOW_MS  # every wait stays within one window
