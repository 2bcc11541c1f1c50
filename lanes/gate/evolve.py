"""`evolve_gate`: the one place the provider gate's state changes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from heapq import heapify, heappop, heappush
from typing import Any

from lanes.gate.events import (
    GATE_INPUT_TYPES,
    RETRYABLE,
    WINDOW_MS,
    BackoffScheduled,
    BreakerClosed,
    BreakerHalfOpened,
    BreakerOpened,
    CallOutcome,
    GateEvent,
    GateLimitsApplied,
    ProviderHintsNoted,
    SlotFreed,
    SlotGranted,
    SlotQueued,
    SlotRefused,
    SlotReleaseIgnored,
    SpendLimitReached,
)
from lanes.gate.holds import _sharing, blocker
from lanes.gate.state import (
    FAIR_GRACE_MS,
    RUN_MEMORY_MS,
    Charge,
    GateIndex,
    GateState,
    Hint,
    HotLimits,
    Lease,
    RunAttempts,
    Share,
    Waiting,
    index_waiting,
    join_between,
    leave_between,
)
from lanes.gate.tables import (
    BREAKER_TRANSITIONS,
    CANCELLED,
    CLOSED,
    HALF_OPEN,
    LEASE_EXPIRED,
    OK,
    OPENS_BREAKER,
    RELEASED,
    SPEND_LIMIT,
)
from lanes.handlers import IllegalTransition, Registry
from lanes.policy import PolicyAdopted, PolicyDeferred
from lanes.requests import RANK

EVOLVERS: Registry[Callable[[GateState, Any], None]] = Registry("gate event")
"""Gate event class -> how it changes the state."""


def evolve_gate(state: GateState, event: GateEvent) -> GateState:
    """Apply one event to ``state`` in place and return it."""
    EVOLVERS.handler(event)(state, event)
    state.version += 1
    return state


def fold_gate(state: GateState, events: Iterable[GateEvent]) -> GateState:
    """Evolve ``state`` through many events."""
    for event in events:
        evolve_gate(state, event)
    return state


@EVOLVERS.on(*GATE_INPUT_TYPES)
def _input(state: GateState, event: Any) -> None:
    if event.at > state.now:  # the clock never goes back
        state.now = event.at


@EVOLVERS.on(SlotQueued)
def _queued(state: GateState, event: SlotQueued) -> None:
    slot_id = event.slot_id
    if slot_id in state.waiting or slot_id in state.leases:
        raise IllegalTransition(f"slot {slot_id} is already held")
    state.seq += 1
    # (Conditional expressions rather than `max`, and positional arguments rather than
    # keywords, here and in the other hot paths: each costs several times less to run.)
    agent_id, tokens = event.agent_id, event.input_tokens + event.output_tokens
    share = state.shares.get(agent_id)
    if share is None:
        share = state.shares[agent_id] = Share(state.vtime)
    if share.finish < state.vtime and (state.policy < 2 or not _sharing(state, agent_id, share)):
        share.finish = state.vtime  # an agent away for a window banks no credit (version 1:
        # no agent keeps credit)
    start, weight = share.finish, event.weight
    if weight != 1:  # (a weight of 1, the usual, costs nothing here)
        tokens = -(-tokens // weight)
    share.finish = start + (tokens if tokens > 1 else 1)
    if agent_id in state.index.between:
        leave_between(state.index, agent_id, share, state.now)  # (it waits)
    if share.weight != weight:  # (after: what a hold counted for it, it counted so)
        share.weight = weight
    entry = state.waiting[slot_id] = Waiting(  # the fields in order
        slot_id,
        event.agent_id,
        event.run_id,
        event.priority,
        event.input_tokens,
        event.output_tokens,
        state.now,
        event.wait_deadline,
        start,
        state.seq,
    )
    index_waiting(state.index, entry)
    state.counters.queued += 1


def _unwait(state: GateState, slot_id: str) -> Waiting:
    """Remove a waiting request; the index drops it once it reaches a front."""
    waiting, index = state.waiting, state.index
    entry = waiting.pop(slot_id)
    entry.left = True
    index.head_known = False
    agent_id, waiting_of = entry.agent_id, index.waiting_of
    n = waiting_of[agent_id] - 1  # (`count_in`, inlined)
    if n:
        waiting_of[agent_id] = n
    else:  # it may be between calls from now on (version 1 held nothing for them)
        del waiting_of[agent_id]
        if state.policy >= 2:
            join_between(index, agent_id, state.shares[agent_id].finish)
    rank = RANK[entry.priority]
    arrivals, fair, deadlines = index.arrivals[rank], index.fair[rank], index.deadlines
    if len(arrivals) + len(fair) + len(deadlines) > 6 * len(waiting) + 192:
        # Mostly entries that left: index the live ones again, in arrival order.
        for queue in index.arrivals:
            queue.clear()
        for heap in index.fair:
            heap.clear()
        deadlines.clear()
        index.waiting_of.clear()
        for live in waiting.values():
            index_waiting(index, live)
        return entry
    while arrivals and arrivals[0].left:
        arrivals.popleft()
    while fair and fair[0][2].left:
        heappop(fair)
    while deadlines and deadlines[0][2].left:
        heappop(deadlines)
    return entry


def _unlease(state: GateState, slot_id: str) -> None:
    """Remove a lease; the index drops it once it reaches the front."""
    leases, heap = state.leases, state.index.leases
    lease = leases.pop(slot_id)
    lease.ended = True
    leases_of, agent_id = state.index.leases_of, lease.agent_id
    n = leases_of[agent_id] - 1  # (`count_in`, inlined)
    if n:
        leases_of[agent_id] = n
    else:
        del leases_of[agent_id]
    if len(heap) > 2 * len(leases) + 64:
        heap[:] = [item for item in heap if not item[2].ended]
        heapify(heap)
    while heap and heap[0][2].ended:
        heappop(heap)


def _prune_window(state: GateState) -> None:
    horizon = state.now - WINDOW_MS
    window = state.window
    while window and window[0].at <= horizon:
        charge = window.popleft()
        del state.charges[charge.slot_id]
        state.used_requests -= 1
        state.used_input -= charge.input_tokens
        state.used_output -= charge.output_tokens


@EVOLVERS.on(SlotGranted)
def _granted(state: GateState, event: SlotGranted) -> None:
    index, slot_id, now = state.index, event.slot_id, state.now
    cleared, index.cleared = index.cleared, None
    entry = state.waiting.get(slot_id)
    if entry is None:
        raise IllegalTransition(f"slot {slot_id} granted but it is not waiting")
    if event.probe != (state.breaker is HALF_OPEN):
        raise IllegalTransition(
            f"slot {slot_id} granted with probe={event.probe} while the breaker is "
            f"{state.breaker.value}"
        )
    why = None if entry is cleared else blocker(state, entry)
    if why is not None:
        raise IllegalTransition(f"slot {slot_id} granted while {why}")
    _unwait(state, slot_id)
    window = state.window
    if window and window[0].at <= now - WINDOW_MS:
        _prune_window(state)
    agent_id, input_tokens, output_tokens = entry.agent_id, entry.input_tokens, entry.output_tokens
    window.append(charge := Charge(slot_id, now, input_tokens, output_tokens))
    state.charges[slot_id] = charge
    state.used_requests += 1
    state.used_input += input_tokens
    state.used_output += output_tokens
    lease = state.leases[slot_id] = Lease(  # the fields in order
        slot_id,
        agent_id,
        entry.run_id,
        entry.priority,
        input_tokens,
        output_tokens,
        now,
        event.lease_deadline,
    )
    heappush(index.leases, (lease.deadline, entry.seq, lease))
    leases_of, shares = index.leases_of, state.shares
    leases_of[agent_id] = leases_of.get(agent_id, 0) + 1  # (`count_in`, inlined)
    share = shares[agent_id]
    share.granted_at = now
    share.input_tokens, share.output_tokens = input_tokens, output_tokens
    share.rank = RANK[entry.priority]
    behind, waiting_of = index.behind, index.waiting_of
    graced_from = now - FAIR_GRACE_MS
    while behind:  # drop those time has ended (`_between_calls`, inlined: a hot path)
        first = behind[0][1]
        if first not in waiting_of:
            if first in leases_of:
                break
            released = shares[first].released_at
            if released is not None and released > graced_from:
                break
        leave_between(index, first, shares[first], now)
    if entry.tag > state.vtime:
        state.vtime = entry.tag
    if event.probe:
        state.probe = slot_id
    hint = state.hint
    if hint is not None and now < hint.reset_at:
        hint.requests_since += 1
        hint.tokens_since += input_tokens + output_tokens
    state.counters.granted += 1


@EVOLVERS.on(SlotRefused)
def _refused(state: GateState, event: SlotRefused) -> None:
    # A request refused on arrival was never waiting: nothing to remove.
    if event.slot_id in state.leases:
        raise IllegalTransition(f"slot {event.slot_id} refused but it is granted")
    if event.slot_id in state.waiting:
        _unwait(state, event.slot_id)
    state.counters.refused += 1


@EVOLVERS.on(SlotFreed)
def _freed(state: GateState, event: SlotFreed) -> None:
    slot_id = event.slot_id
    lease = state.leases.get(slot_id)
    if lease is None and (event.by is LEASE_EXPIRED or slot_id not in state.waiting):
        raise IllegalTransition(f"slot {slot_id} freed ({event.by.value}) but it is not held")
    counters = state.counters
    if event.by is RELEASED:
        counters.released += 1
    elif event.by is CANCELLED:
        counters.cancelled += 1
    else:
        counters.expired += 1
    if lease is None:
        _unwait(state, slot_id)
        return
    _unlease(state, slot_id)
    index = state.index
    if index.held is not None:  # (see `GateIndex.held`)
        finish = index.between.get(lease.agent_id)
        if finish is not None and (finish, lease.agent_id) <= index.held_key:
            if event.by is not RELEASED:
                index.held = None  # it counted no more at once
            elif state.now + FAIR_GRACE_MS < index.held_grace:  # it counts until its grace
                index.held_grace = state.now + FAIR_GRACE_MS  # ends
                if index.held_grace < index.held_until:
                    index.held_until = index.held_grace
    if event.by is RELEASED:
        state.shares[lease.agent_id].released_at = state.now
        graced = state.index.graced
        while graced and graced[0][0] < state.now:
            graced.popleft()
        graced.append((state.now + FAIR_GRACE_MS, lease.agent_id))
    if state.probe == slot_id:
        state.probe = None
    charge = state.charges.get(slot_id)
    if charge is not None:
        if event.input_tokens is not None:
            state.used_input += event.input_tokens - charge.input_tokens
            charge.input_tokens = event.input_tokens
        if event.output_tokens is not None:
            state.used_output += event.output_tokens - charge.output_tokens
            charge.output_tokens = event.output_tokens
    counters.input_tokens += event.input_tokens or 0
    counters.output_tokens += event.output_tokens or 0
    outcome = event.outcome
    if outcome is None:
        return
    if state.runs or outcome is not OK:  # (else there is nothing to count or forget)
        _count_attempt(state, lease.run_id, outcome)
    if outcome is OK:
        state.attempt = 0
    if state.breaker is CLOSED:
        if outcome is OK:
            state.failures = 0
        elif outcome in OPENS_BREAKER:
            state.failures += 1


def _count_attempt(state: GateState, run_id: str, outcome: CallOutcome) -> None:
    runs = state.runs
    previous = runs.pop(run_id, None)  # re-inserted last: the memory stays in time order
    if outcome in RETRYABLE or outcome is SPEND_LIMIT:
        failures = 1 if previous is None else previous.failures + 1
        runs[run_id] = RunAttempts(failures, state.now, outcome)
    horizon = state.now - RUN_MEMORY_MS
    while runs:
        oldest = next(iter(runs))
        if runs[oldest].at > horizon:
            break
        del runs[oldest]


@EVOLVERS.on(PolicyAdopted)
def _policy_adopted(state: GateState, event: PolicyAdopted) -> None:
    state.policy, state.policy_offered = event.version, None
    state.index = GateIndex.of(state)  # (at rest: only who is between calls may change)


@EVOLVERS.on(PolicyDeferred)
def _policy_deferred(state: GateState, event: PolicyDeferred) -> None:
    state.policy_offered = event.version


@EVOLVERS.on(SlotReleaseIgnored)
def _release_ignored(state: GateState, event: SlotReleaseIgnored) -> None:
    state.counters.ignored += 1


@EVOLVERS.on(BackoffScheduled)
def _backoff(state: GateState, event: BackoffScheduled) -> None:
    state.not_before = max(state.not_before, event.until)
    state.attempt = event.attempt
    state.counters.backoffs += 1


@EVOLVERS.on(ProviderHintsNoted)
def _hints(state: GateState, event: ProviderHintsNoted) -> None:
    state.hint = Hint(
        remaining_requests=event.remaining_requests,
        remaining_tokens=event.remaining_tokens,
        reset_at=event.reset_at,
        observed_at=state.now,
    )


def _move_breaker(state: GateState, event: BreakerOpened | BreakerHalfOpened | BreakerClosed,
                  ) -> None:
    event_type = type(event).__name__
    to = BREAKER_TRANSITIONS.get((state.breaker, event_type))
    if to is None:
        raise IllegalTransition(f"{event_type} while the breaker is {state.breaker.value}")
    if state.probe is not None:
        raise IllegalTransition(f"{event_type} while probe {state.probe} is in flight")
    state.breaker = to


@EVOLVERS.on(BreakerOpened)
def _opened(state: GateState, event: BreakerOpened) -> None:
    _move_breaker(state, event)
    state.breaker_until = event.until
    state.failures = 0
    state.counters.breaker_opens += 1


@EVOLVERS.on(BreakerHalfOpened)
def _half_opened(state: GateState, event: BreakerHalfOpened) -> None:
    if state.now < state.breaker_until:
        raise IllegalTransition(f"BreakerHalfOpened before the cooldown's end at "
                                f"{state.breaker_until}")
    _move_breaker(state, event)


@EVOLVERS.on(BreakerClosed)
def _closed(state: GateState, event: BreakerClosed) -> None:
    _move_breaker(state, event)
    state.failures = 0


@EVOLVERS.on(SpendLimitReached)
def _spend_limit(state: GateState, event: SpendLimitReached) -> None:
    state.counters.spend_limits += 1


@EVOLVERS.on(GateLimitsApplied)
def _limits(state: GateState, event: GateLimitsApplied) -> None:
    state.limits = event.limits
    state.index.limits = HotLimits.of(event.limits)
    state.index.held = None
    state.index.head_known = False  # the aging may have changed
