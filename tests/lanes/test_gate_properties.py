"""Invariants of the provider gate over random arrivals, releases, cancels, answers, limit
changes and timers of many agents, in virtual time."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanes.gate import (
    FAIR_GRACE_MS,
    RANKS,
    Breaker,
    GateState,
    HotLimits,
    Waiting,
    blocker,
    decide_gate,
    fold_gate,
    next_gate_due,
    next_in_line,
    verify_gate,
    window_usage,
)
from lanes.gate.events import (
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
    Refusal,
    SlotFreed,
    SlotGranted,
    SlotQueued,
    SlotRefused,
    SlotReleased,
    SlotRequested,
)
from lanes.gate.holds import _between_calls, _exhausted, _held_for, fits
from lanes.handlers import IllegalTransition
from lanes.requests import RANK, Priority
from tests.lanes.test_gate import T0, GateBench, names

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


# ------------------------------------------------------------- the index vs a naive scan


def naive_next_in_line(state: GateState) -> Waiting | None:
    """`next_in_line` by scanning every waiting request (the index's reference)."""
    aging = state.limits.priority_aging_ms
    oldest: dict[int, int] = {}
    for entry in state.waiting.values():  # arrival order: the first of a class is its oldest
        oldest.setdefault(RANK[entry.priority], entry.queued_at)
    if not oldest:
        return None
    rank = min(oldest, key=lambda r: (oldest[r] - r * aging, -r))
    return min(
        (e for e in state.waiting.values() if RANK[e.priority] == rank),
        key=lambda e: (e.tag, e.seq),
    )


def naive_next_gate_due(state: GateState, after: int) -> int | None:
    """`next_gate_due` by scanning every lease, charge and waiting request."""
    times = [lease.deadline for lease in state.leases.values()]
    if state.breaker is Breaker.OPEN:
        times.append(state.breaker_until)
    if state.waiting:
        times.append(state.not_before)
        if state.hint is not None:
            times.append(state.hint.reset_at)
        times += [charge.at + WINDOW_MS for charge in state.window]
        times += [entry.deadline for entry in state.waiting.values()]
        times += grace_ends(state)
    return min((at for at in times if at > after), default=None)


def grace_ends(state: GateState) -> list[int]:
    """When the grace after its latest release ends of each agent that neither waits nor
    holds a slot (those not over at ``now``)."""
    busy = {e.agent_id for e in state.waiting.values()}
    busy |= {lease.agent_id for lease in state.leases.values()}
    ends = [
        share.released_at + FAIR_GRACE_MS
        for agent_id, share in state.shares.items()
        if share.released_at is not None and agent_id not in busy
    ]
    return [end for end in ends if end >= state.now]


def check_index(state: GateState) -> None:
    """The index holds exactly the live requests and leases, its fronts are the earliest,
    and what it answers is what a scan of the state answers."""
    index = state.index
    assert index.limits == HotLimits.of(state.limits)
    assert index.cleared is None  # consumed by the grant it was set for
    for rank in RANKS:
        members = [e for e in state.waiting.values() if RANK[e.priority] == rank]
        arrivals = index.arrivals[rank]
        assert [e for e in arrivals if not e.left] == members
        assert not arrivals or not arrivals[0].left
        fair = index.fair[rank]
        assert sorted(k for k in fair if not k[2].left) == sorted(
            (e.tag, e.seq, e) for e in members
        )
        assert not fair or fair[0] == min(fair)
        assert not fair or not fair[0][2].left
    deadlines = index.deadlines
    assert sorted(k[1] for k in deadlines if not k[2].left) == sorted(
        e.seq for e in state.waiting.values()
    )
    assert not deadlines or (deadlines[0] == min(deadlines) and not deadlines[0][2].left)
    assert all(waiting is state.waiting[waiting.slot_id] for _, _, waiting in deadlines
               if not waiting.left)
    assert index.waiting_of == dict(Counter(e.agent_id for e in state.waiting.values()))
    assert all(finish == state.shares[a].finish for a, finish in index.between.items())
    assert index.behind == sorted((finish, a) for a, finish in index.between.items())
    assert {a for a in index.between if _between_calls(state, a)} == {
        a for a in state.shares if _between_calls(state, a)
    }
    assert index.leases_of == dict(Counter(lease.agent_id for lease in state.leases.values()))
    leases = index.leases
    assert {lease.slot_id for _, _, lease in leases if not lease.ended} == set(state.leases)
    assert all(lease is state.leases[lease.slot_id] for _, _, lease in leases if not lease.ended)
    assert not leases or (leases[0] == min(leases) and not leases[0][2].ended)
    assert next_in_line(state) is naive_next_in_line(state)
    held = index.held  # a hold kept in the index is one the walk finds
    if held is not None and not held.left and state.now < index.held_until:
        assert _held_for(state, held) is not None
    head = next_in_line(state)
    if head is not None:  # the grant path's one pass answers what the reasons say
        assert fits(state, head) == (blocker(state, head) is None and
                                     _held_for(state, head) is None)
    if _exhausted(state):  # the shortcut is sound: nothing waiting could be granted
        assert all(blocker(state, entry) is not None for entry in state.waiting.values())
    times = {state.now, state.not_before, state.breaker_until}
    times |= {lease.deadline for lease in state.leases.values()}
    times |= {entry.deadline for entry in state.waiting.values()}
    times |= {charge.at + WINDOW_MS for charge in state.window}
    times |= set(grace_ends(state))
    for at in times:  # every time that matters, and either side of it
        for after in (at - 1, at, at + 1):
            assert next_gate_due(state, after) == naive_next_gate_due(state, after), after


class IndexCheckedBench(GateBench):
    """A bench that checks the index against a scan of the state after every input."""

    def feed(self, event: GateInput) -> list[GateDecision]:
        decisions = super().feed(event)
        check_index(self.state)
        return decisions


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limits=limit_sets, script=st.lists(actions, min_size=5, max_size=80))
def test_the_index_answers_what_a_scan_of_the_state_answers_at_every_step(
    limits: GateLimits, script: list[tuple[str, Any]]
) -> None:
    bench = IndexCheckedBench(limits)
    runs: dict[int, str] = {}
    for action, arg in script:
        play(bench, action, arg, runs)
    folded = fold_gate(GateState(provider=bench.state.provider), bench.round_tripped())
    check_index(folded)
    assert next_in_line(folded) == next_in_line(bench.state)


def test_the_index_drops_what_left_even_behind_a_request_that_waits_long() -> None:
    """Requests that leave behind an old one at the front stay in the index until they
    outnumber the live ones; then it is rebuilt, and still answers as a scan does."""
    bench = IndexCheckedBench(GateLimits(max_concurrent=1, max_wait_ms=600_000))
    bench.request("held")
    bench.request("old", priority="low")  # waits behind "held" all along, first in line
    for n in range(400):
        bench.request(f"s{n}", agent_id=f"agent_{n % 7}", priority=list(Priority)[n % 3])
        bench.cancel(f"s{n}")
    index = bench.state.index
    assert len(index.deadlines) <= 6 + 192  # rebuilt, not grown with every cancel
    assert names(bench.release("held")) == ["SlotFreed", "SlotGranted"]
    assert set(bench.state.leases) == {"old"}


def test_a_class_that_ties_after_aging_goes_to_the_higher_priority() -> None:
    aging = 10_000
    bench = IndexCheckedBench(GateLimits(max_concurrent=1, priority_aging_ms=aging))
    bench.request("held")
    bench.request("normal", priority="normal")
    bench.advance(aging)
    bench.request("high", priority="high")  # arrived one aging period later: a tie
    bench.release("held")
    assert set(bench.state.leases) == {"high"}


def test_new_limits_can_change_which_class_is_next() -> None:
    bench = IndexCheckedBench(GateLimits(max_concurrent=1, priority_aging_ms=1_000))
    bench.request("held")
    bench.request("low", priority="low")
    bench.advance(5_000)
    bench.request("high", priority="high")  # 5 s later: more than 2 aging periods
    assert next_in_line(bench.state) is bench.state.waiting["low"]
    bench.limits(max_concurrent=1, priority_aging_ms=30_000)
    assert next_in_line(bench.state) is bench.state.waiting["high"]


def test_a_grant_that_settle_did_not_check_is_still_checked() -> None:
    """`_settle` skips checking again only the grant it has just checked: a recorded grant
    over a limit still raises when folded."""
    bench = GateBench(GateLimits(requests_per_minute=1))
    bench.request("s1")
    bench.request("s2")
    log = [*bench.log, SlotGranted(slot_id="s2", lease_deadline=T0 + 1)]
    with pytest.raises(IllegalTransition, match="requests_per_minute"):
        fold_gate(GateState(provider="anthropic"), log)


def test_a_request_past_its_wait_bound_is_refused_even_if_its_timer_came_late() -> None:
    """The runtime's timer may fire late: an input after a wait bound refuses the request
    before anything is granted."""
    bench = IndexCheckedBench(GateLimits(max_concurrent=1, max_wait_ms=5_000))
    bench.request("held")
    bench.request("late")
    bench.now += 10_000  # no timer at the bound
    decisions = bench.release("held")
    assert names(decisions) == ["SlotFreed", "SlotRefused"]
    assert isinstance(decisions[1], SlotRefused) and decisions[1].code is Refusal.WAITED_TOO_LONG
