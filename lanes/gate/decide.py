"""`decide_gate`: what an input means for the provider gate (see `lanes.gate` for the
policy), and when time alone will decide something next."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from lanes.gate.events import (
    THROTTLED,
    WINDOW_MS,
    BackoffScheduled,
    BreakerClosed,
    BreakerHalfOpened,
    BreakerOpened,
    GateDecision,
    GateInput,
    GateLimits,
    GateLimitsApplied,
    GateLimitsChanged,
    GateTimer,
    ProviderHintsNoted,
    Refusal,
    SlotCancelled,
    SlotFreed,
    SlotGranted,
    SlotQueued,
    SlotRefused,
    SlotReleased,
    SlotReleaseIgnored,
    SlotRequested,
    SpendLimitReached,
)
from lanes.gate.evolve import EVOLVERS
from lanes.gate.holds import blocker, fair_hold, fits, next_in_line
from lanes.gate.state import (
    FAIR_GRACE_MS,
    NEVER,
    GateState,
    HotLimits,
    Lease,
    Waiting,
)
from lanes.gate.tables import (
    CANCELLED,
    CLOSED,
    HALF_OPEN,
    LEASE_EXPIRED,
    OPEN,
    OPENS_BREAKER,
    RELEASED,
    SPEND_LIMIT,
)
from lanes.handlers import Registry
from lanes.policy import PolicyAdopted, PolicyDeferred, PolicyOffered, offer

Emit = Callable[[GateDecision], None]
In = TypeVar("In")
DECIDERS: Registry[Callable[[GateState, Any, Emit], None]] = Registry("gate input")
"""Gate input class -> what it decides."""
_DECIDERS, _EVOLVERS = DECIDERS.table, EVOLVERS.table  # (the tables themselves: a hot path)


def decide_gate(state: GateState, event: GateInput) -> list[GateDecision]:
    """Decide what ``event`` means for the gate, advancing ``state`` through the input and
    each decision as it is made (afterwards ``state`` is the fold of [input, *decisions]).

    Deterministic; an input that decides nothing leaves ``state`` exactly as it was.
    """
    decider = _DECIDERS.get(type(event)) or DECIDERS.handler(event)  # (which raises)
    now, version = state.now, state.version
    if event.at > state.now:  # `evolve_gate(state, event)` inlined: see `_input`
        state.now = event.at
    state.version += 1
    decisions: list[GateDecision] = []

    evolvers = _EVOLVERS

    def emit(decision: GateDecision) -> None:
        evolvers[type(decision)](state, decision)  # `evolve_gate`, inlined: a hot path
        state.version += 1
        decisions.append(decision)

    decider(state, event, emit)
    _settle(state, emit)
    if state.policy_offered is not None and not state.waiting and not state.leases:
        emit(PolicyAdopted(version=state.policy_offered))  # (at rest: `lanes.policy`)
    if not decisions:
        state.now, state.version = now, version
    return decisions


def next_gate_due(state: GateState, after: int) -> int | None:
    """The earliest time later than ``after`` at which a `GateTimer` may decide something:
    a lease or a wait bound ends, the breaker's cooldown ends, or, while requests wait, a
    backoff or provider reset ends, or a window frees space."""
    # The fronts of the index and of the window are their earliest times; only if one is
    # not later than ``after`` (a caller ahead of the state's clock) is the rest looked at.
    index = state.index
    due = index.leases[0][0] if index.leases else NEVER
    if due <= after:
        due = _earliest_after(state.leases.values(), after)
    if state.breaker is OPEN and after < state.breaker_until < due:
        due = state.breaker_until
    if not state.waiting:
        return None if due == NEVER else due
    if after < state.not_before < due:
        due = state.not_before
    hint = state.hint
    if hint is not None and after < hint.reset_at < due:
        due = hint.reset_at
    floor = after if after >= state.now else state.now - 1  # (graces that ended are gone)
    waiting_of, leases_of = index.waiting_of, index.leases_of
    for until, agent_id in index.graced:  # in time order: the first that matters is due
        if until >= due:
            break
        if (
            until > floor
            and state.shares[agent_id].released_at == until - FAIR_GRACE_MS
            and agent_id not in waiting_of  # (else its grace ends
            and agent_id not in leases_of  # without changing anything)
        ):
            due = until
            break
    window = state.window
    if window:
        frees = window[0].at + WINDOW_MS
        if frees <= after:  # the first grant (oldest first) to leave after ``after``
            frees = next((c.at + WINDOW_MS for c in window if c.at + WINDOW_MS > after), NEVER)
        if frees < due:
            due = frees
    bound = index.deadlines[0][0]
    if bound <= after:
        bound = _earliest_after(state.waiting.values(), after)
    if bound < due:
        due = bound
    return None if due == NEVER else due


def _earliest_after(entries: Iterable[Waiting | Lease], after: int) -> int:
    """The earliest deadline later than ``after`` among ``entries``, or `NEVER`."""
    return min([e.deadline for e in entries if e.deadline > after], default=NEVER)


def _settle(state: GateState, emit: Emit) -> None:
    """What time alone decides, after every input: leases expire, the breaker half-opens,
    overdue requests are refused, and whatever fits is granted in the fair order."""
    now = state.now
    leases = state.index.leases
    if leases and leases[0][0] <= now:  # the front is the earliest deadline
        _expire_leases(state, now, emit)
    if state.breaker is OPEN and now >= state.breaker_until:
        emit(BreakerHalfOpened())
    deadlines = state.index.deadlines
    if deadlines and deadlines[0][0] < now:  # the front is the earliest wait bound
        _refuse_overdue(state, now, emit)
    _grant(state, now, emit)
    if deadlines and deadlines[0][0] <= now:
        _refuse_overdue(state, now + 1, emit)  # those the grants left at their bound...
        if state.policy >= 2:
            _grant(state, now, emit)  # ...may have held back some that fit


def _grant(state: GateState, now: int, emit: Emit) -> None:
    """Grant whatever fits, in the fair order, until the next in line does not."""
    index = state.index
    while state.waiting:  # (`_exhausted` would only say sooner what `fits` says)
        entry = index.head if index.head_known else next_in_line(state)
        assert entry is not None
        if entry is index.held and now < index.held_until and not index.held_stale:
            break  # (the fair hold `fits` would find at once: see `GateIndex.held`)
        if not fits(state, entry):
            break
        index.cleared = entry  # nothing changes before `_granted` applies it
        emit(
            SlotGranted(
                slot_id=entry.slot_id,
                lease_deadline=now + index.limits.lease_ms,
                probe=state.breaker is HALF_OPEN,
            )
        )


def _expire_leases(state: GateState, now: int, emit: Emit) -> None:
    """Free the leases that ended at ``now`` or earlier, in the order they were granted."""
    for lease in [lease for lease in state.leases.values() if lease.deadline <= now]:
        emit(
            SlotFreed(
                slot_id=lease.slot_id,
                by=LEASE_EXPIRED,
                detail=f"lease ended at {lease.deadline} without a release (granted at "
                f"{lease.granted_at} to run {lease.run_id} of {lease.agent_id})",
            )
        )


def _refuse(state: GateState, entry: Waiting, code: Refusal, reason: str, emit: Emit) -> None:
    emit(
        SlotRefused(
            slot_id=entry.slot_id,
            agent_id=entry.agent_id,
            run_id=entry.run_id,
            code=code,
            reason=reason,
        )
    )


def _refuse_overdue(state: GateState, before: int, emit: Emit) -> None:
    """Refuse the requests whose wait bound is earlier than ``before``."""
    overdue = [entry for entry in state.waiting.values() if entry.deadline < before]
    head = next_in_line(state)
    for entry in overdue:
        # (The gate's own log names the agents a fair hold kept room for; `unnamed` is the
        # reason as the refused agent is told it.)
        held = blocker(state, entry)
        if held is None:
            held = fair_hold(state, entry, named=True)
        if head is not None and entry is not head:
            ahead = blocker(state, head) or fair_hold(state, head, named=True) or held \
                or "no capacity"
            held = f"{ahead}, and requests ahead of it in the fair order"
        _refuse(
            state,
            entry,
            Refusal.WAITED_TOO_LONG,
            f"waited {state.now - entry.queued_at} ms without a slot (max_wait_ms "
            f"{entry.deadline - entry.queued_at}): {held}; retry later",
            emit,
        )


def _hopeless(state: GateState, deadline: int) -> tuple[Refusal, str] | None:
    """Why a request waiting until ``deadline`` certainly cannot be granted in time."""
    if state.breaker is OPEN and state.breaker_until > deadline:
        return Refusal.BREAKER_OPEN, (
            f"the circuit breaker is open until {state.breaker_until}, past this request's "
            f"wait bound {deadline}: the provider is failing"
        )
    if state.not_before > deadline:
        return Refusal.BACKING_OFF, (
            f"backing off until {state.not_before} (attempt {state.attempt}), past this "
            f"request's wait bound {deadline}"
        )
    return None


def _too_large(
    limits: GateLimits | HotLimits, input_tokens: int, output_tokens: int
) -> str | None:
    itpm, otpm = limits.input_tokens_per_minute, limits.output_tokens_per_minute
    if itpm is not None and input_tokens > itpm:
        return (
            f"asks for {input_tokens} input tokens but input_tokens_per_minute is {itpm}: it "
            "can never be granted; shorten the prompt or raise the limit"
        )
    if otpm is not None and output_tokens > otpm:
        return (
            f"asks for {output_tokens} output tokens but output_tokens_per_minute is {otpm}: "
            "it can never be granted; lower max_tokens or raise the limit"
        )
    return None


def _refuse_hopeless(state: GateState, emit: Emit) -> None:
    deadlines = state.index.deadlines
    if not deadlines or (state.breaker is not OPEN and state.not_before <= deadlines[0][0]):
        return  # (what `_hopeless` checks first, without the call)
    if _hopeless(state, deadlines[0][0]) is None:
        return  # if the earliest wait bound can be met, every later one can
    for entry in list(state.waiting.values()):
        hopeless = _hopeless(state, entry.deadline)
        if hopeless is not None:
            _refuse(state, entry, *hopeless, emit)


@DECIDERS.on(SlotRequested)
def _requested(state: GateState, event: SlotRequested, emit: Emit) -> None:
    slot_id = event.slot_id
    if slot_id in state.waiting or slot_id in state.leases:
        return  # a redelivered request: it already waits or holds its slot
    refused: tuple[Refusal, str] | None = None
    limits = state.index.limits
    deadline = state.now + limits.max_wait_ms
    too_large = (
        None
        if limits.input_tokens_per_minute is None and limits.output_tokens_per_minute is None
        else _too_large(limits, event.input_tokens, event.output_tokens)
    )
    attempts = state.runs.get(event.run_id) if state.runs else None
    if too_large is not None:
        refused = Refusal.TOO_LARGE, too_large
    elif attempts is not None and attempts.last is SPEND_LIMIT:
        refused = (
            Refusal.SPEND_LIMIT,
            (f"run {event.run_id} hit the provider's spend limit: it is not retried"),
        )
    elif attempts is not None and attempts.failures >= limits.max_attempts:
        refused = (
            Refusal.RETRIES_EXHAUSTED,
            (
                f"run {event.run_id} failed {attempts.failures} calls in a row (last: "
                f"{attempts.last.value}); max_attempts is {limits.max_attempts}: giving up"
            ),
        )
    elif state.breaker is OPEN or state.not_before > deadline:  # (else it is not hopeless)
        refused = _hopeless(state, deadline)
    if refused is not None:
        emit(
            SlotRefused(
                slot_id=slot_id,
                agent_id=event.agent_id,
                run_id=event.run_id,
                code=refused[0],
                reason=refused[1],
            )
        )
        return
    emit(
        SlotQueued(
            slot_id=slot_id,
            agent_id=event.agent_id,
            run_id=event.run_id,
            priority=event.priority,
            input_tokens=event.input_tokens,
            output_tokens=event.output_tokens,
            wait_deadline=deadline,
            weight=event.weight,
        )
    )


@DECIDERS.on(SlotReleased)
def _released(state: GateState, event: SlotReleased, emit: Emit) -> None:
    slot_id = event.slot_id
    lease = state.leases.get(slot_id)
    if lease is None:
        if slot_id in state.waiting:
            emit(SlotFreed(slot_id=slot_id, by=RELEASED, detail="released while waiting"))
        else:
            emit(
                SlotReleaseIgnored(
                    slot_id=slot_id,
                    reason=f"slot {slot_id} is not held: its lease expired, it was cancelled "
                    "or it was released already",
                )
            )
        return
    now, limits, outcome = state.now, state.limits, event.outcome
    was_probe = state.probe == slot_id
    emit(
        SlotFreed(
            slot_id=slot_id,
            by=RELEASED,
            detail=f"released after {now - lease.granted_at} ms: {outcome}",  # (its value)
            outcome=outcome,
            input_tokens=event.input_tokens,
            output_tokens=event.output_tokens,
        )
    )
    if event.remaining_requests is not None or event.remaining_tokens is not None:
        reset_at = now + WINDOW_MS if event.reset_at is None else event.reset_at
        if reset_at > now:
            emit(
                ProviderHintsNoted(
                    remaining_requests=event.remaining_requests,
                    remaining_tokens=event.remaining_tokens,
                    reset_at=reset_at,
                )
            )
    if outcome is SPEND_LIMIT:
        emit(SpendLimitReached(agent_id=lease.agent_id, run_id=lease.run_id))
        for entry in [e for e in state.waiting.values() if e.run_id == lease.run_id]:
            _refuse(state, entry, Refusal.SPEND_LIMIT, "the run hit the spend limit", emit)
    if was_probe:
        if outcome in OPENS_BREAKER:
            emit(
                BreakerOpened(
                    until=now + limits.breaker_cooldown_ms,
                    reason=f"the half-open probe failed: {outcome.value}",
                )
            )
        else:
            emit(BreakerClosed())
    elif state.breaker is CLOSED and state.failures >= state.index.limits.breaker_threshold:
        emit(
            BreakerOpened(
                until=now + limits.breaker_cooldown_ms,
                reason=f"{state.failures} unhealthy answers in a row (last: {outcome.value})",
            )
        )
    if outcome in THROTTLED:
        attempt = state.attempt + 1
        ceiling = backoff_ceiling(limits, attempt)
        wait = full_jitter(slot_id, attempt, ceiling)
        reason = f"{outcome.value}: attempt {attempt}, full jitter up to {ceiling} ms"
        retry_after = event.retry_after_ms
        if retry_after is not None:
            wait = max(wait, retry_after)
            reason += f", retry-after {retry_after} ms"
        emit(
            BackoffScheduled(
                until=max(state.not_before, now + wait), attempt=attempt, reason=reason
            )
        )
    deadlines = state.index.deadlines
    if deadlines and (state.breaker is OPEN or state.not_before > deadlines[0][0]):
        _refuse_hopeless(state, emit)  # (what it checks first, without the call)


@DECIDERS.on(SlotCancelled)
def _cancelled(state: GateState, event: SlotCancelled, emit: Emit) -> None:
    slot_id = event.slot_id
    if slot_id in state.waiting:
        detail = "cancelled while waiting"
    elif slot_id in state.leases:
        detail = "cancelled while granted: the run was aborted or crashed"
    else:
        return  # cancelling what is not held is a no-op (a cancel after a release, say)
    emit(SlotFreed(slot_id=slot_id, by=CANCELLED, detail=detail))


@DECIDERS.on(GateTimer)
def _timer(state: GateState, event: GateTimer, emit: Emit) -> None:
    """Everything a timer decides is what time alone decides (see `_settle`)."""


@DECIDERS.on(GateLimitsChanged)
def _limits_changed(state: GateState, event: GateLimitsChanged, emit: Emit) -> None:
    # The first event of a stream is its first limits: record them even if they are default.
    if event.limits == state.limits and state.version != 1:
        return
    emit(GateLimitsApplied(limits=event.limits))
    for entry in list(state.waiting.values()):
        too_large = _too_large(event.limits, entry.input_tokens, entry.output_tokens)
        if too_large is not None:
            _refuse(state, entry, Refusal.TOO_LARGE, too_large, emit)


@DECIDERS.on(PolicyOffered)
def _policy_offered(state: GateState, event: PolicyOffered, emit: Emit) -> None:
    if not offer(state.policy, state.policy_offered, event.version):
        return
    if not state.waiting and not state.leases:
        emit(PolicyAdopted(version=event.version))
    else:
        emit(PolicyDeferred(version=event.version, reason=f"{len(state.waiting)} waiting, "
                            f"{len(state.leases)} slot(s) out: adopted once at rest"))


def backoff_ceiling(limits: GateLimits, attempt: int) -> int:
    """The longest backoff of an ``attempt`` (1, 2, ...): base x 2^(attempt-1), capped."""
    return min(limits.backoff_cap_ms, limits.backoff_base_ms << min(attempt - 1, 40))


def full_jitter(slot_id: str, attempt: int, ceiling: int) -> int:
    """A delay in ``[0, ceiling]``, uniform over slot ids and attempts, and deterministic."""
    digest = hashlib.sha256(f"{slot_id}:{attempt}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") * (ceiling + 1)) >> 64
