"""``decide(state, input) -> decisions``: what an agent makes of one input.

`decide` is deterministic: the same state and input give the same decisions, always. It
advances ``state`` by evolving it through the input and then through each decision as the
decision is made (later decisions of the same input see the earlier ones), so afterwards
``state`` equals the fold of [input, *decisions]. An input that decides nothing leaves the
state exactly as it was, and need not be recorded.

If `decide` raises (a bug, never bad input: refusals are decisions), ``state`` may be
half-advanced; the caller rebuilds it from the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lanes.config import DropPolicy, Mode
from lanes.events import (
    AbortReason,
    AgentCallRejected,
    CallResult,
    CallStatus,
    CallUndeliverable,
    ControlApplied,
    Decision,
    FallbackApplied,
    Input,
    OrderCancelRequested,
    Quarantined,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRepeated,
    RequestSummarized,
    Restarted,
    RunAborted,
    RunCompleted,
    RunErrored,
    RunFailed,
    RunFinished,
    RunResultIgnored,
    RunsHeld,
    RunsResumed,
    RunsSuppressed,
    RunStarted,
    RunSteerability,
    RunSteered,
    RunsUnheld,
    SpendLimitHit,
    SteerabilityChanged,
    Stopping,
    TimerElapsed,
    TradingState,
    WorkerLost,
    WorkerReady,
)
from lanes.evolve import evolve, held_ids
from lanes.handlers import Registry
from lanes.requests import AgentRequest, ControlAction, Kind, Priority
from lanes.rules import (
    batch_size,
    budget_block,
    cap_victim,
    dedupe_key,
    fingerprint,
)
from lanes.spending import alerts
from lanes.state import AgentState
from lanes.tables import MODES, TRADING_TRANSITIONS, refusal

Emit = Callable[[Decision], None]
_CALL_RESULT = Kind.CALL_RESULT  # (compared by identity on every request)
_CALL_CANCEL = Kind.CALL_CANCEL
DECIDERS: Registry[Callable[[AgentState, Any, Emit], None]] = Registry("input")
"""Input class -> what it decides for an agent."""


def decide(state: AgentState, event: Input) -> list[Decision]:
    """Decide what ``event`` means for this agent, advancing ``state`` as described above."""
    decider = DECIDERS.handler(event)
    now, version = state.now, state.version
    evolve(state, event)
    decisions: list[Decision] = []

    def emit(decision: Decision) -> None:
        kind = type(decision)
        ends = kind is RunFailed or kind is RunAborted
        served = _ending(state, decision) if ends else None
        evolve(state, decision)
        decisions.append(decision)
        if served:  # the calls its requests served end with the run
            _answer_run_end(served, decision, emit)
        if (ends or kind is RunCompleted) and state.calls.batches:
            assert isinstance(decision, RunFailed | RunAborted | RunCompleted)
            end_tool_batches(state, decision.run_id, emit)
    decider(state, event, emit)
    if state.policy_offered is not None:  # (a newer policy waits for the stream to rest)
        adopt_at_rest(state, emit)
    emit = decisions.append  # type: ignore[assignment]  # (emit refers to itself: cut)
    if not decisions:
        state.now, state.version = now, version
    return decisions


def next_due(state: AgentState, after: int) -> int | None:
    """The earliest time later than ``after`` at which a `TimerElapsed` input may decide
    something, if any (``after`` is the time of the last timer, or now)."""
    due = _lane_due(state, after)
    deadlines = state.calls.deadlines
    firsts = [min(deadlines.values())] if deadlines else []
    if state.approvals:
        firsts.append(min(p.expires_at for p in state.approvals.values()))
    first = min(firsts, default=None)
    if first is not None and (due is None or first < due):
        return first
    return due


def _lane_due(state: AgentState, after: int) -> int | None:
    run = state.active
    if run is not None:
        return run.deadline
    if not state.pending or state.trading is TradingState.HALTED or state.held is not None:
        return None
    due = state.collect_due
    if MODES[state.pending[0].mode].collects and due is not None and due > after:
        return due
    if state.suppressed is not None:
        return state.suppressed[1]
    return None


# ----------------------------------------------------------------------- the run engine


def _start_next(state: AgentState, emit: Emit) -> None:
    """Start the next run if the lane is idle and nothing holds it back."""
    if (state.active is not None or not state.pending or state.trading is TradingState.HALTED
            or state.held is not None):
        return
    head = state.pending[0]
    due = state.collect_due
    if MODES[head.mode].collects and due is not None and state.now < due:
        return
    block = budget_block(state)
    if block is not None:
        if state.suppressed != (block.reason, block.until):
            emit(RunsSuppressed(reason=block.reason, until=block.until, detail=block.detail))
        return
    if state.suppressed is not None:
        emit(RunsResumed())
    batch = state.pending[: batch_size(state.pending)]
    emit(
        RunStarted(
            run_id=f"{state.agent_id}-r{state.run_seq + 1}",
            request_ids=tuple(p.request.request_id for p in batch),
            depth=max(p.request.depth for p in batch),
            deadline=state.now + state.config.run_timeout_ms,
            summary=state.summary,
        )
    )


def _can_start_now(state: AgentState) -> str | None:
    """Why a new run could not start right now (ignoring the active run), or None."""
    if state.trading is TradingState.HALTED:
        return "agent is HALTED"
    if state.held is not None:
        return f"runs held until resume ({state.held})"
    block = budget_block(state)
    if block is not None:
        return f"runs suppressed until {block.until} ({block.detail})"
    return None


# ----------------------------------------------------------------------------- requests


def _control_action(request: AgentRequest, state: AgentState) -> ControlAction | None:
    if request.kind is Kind.SYSTEM_ALERT:
        halts = state.config.halt_on_alerts
        if halts and ("*" in halts or request.payload.get("code") in halts):
            return ControlAction.EMERGENCY_STOP
        return None
    return request.action


@DECIDERS.on(RequestReceived)
def _request(state: AgentState, event: RequestReceived, emit: Emit) -> None:
    request = event.request
    request_id = request.request_id
    first = state.seen.get(request_id)
    if first is not None and (state.now - first[1] <= state.config.idempotency_window_ms
                              or request_id in held_ids(state)):  # (still held: never twice)
        if first[2] != fingerprint(request):
            emit(
                RequestRejected(
                    request_id=request_id,
                    reason=f"requestId {request_id!r} was already used for a different "
                    "request; use a new requestId",
                    transient=True,
                )
            )
            return
        emit(RequestRepeated(request_id=request_id, first_decision=first[0]))
        return
    if request.agent_id != state.agent_id:
        emit(
            RequestRejected(
                request_id=request_id,
                reason=f"request is for agent {request.agent_id!r}, not {state.agent_id!r}",
            )
        )
        return
    if request.kind is _CALL_RESULT:
        _call_result(state, request, emit)
        return
    if request.kind is _CALL_CANCEL:
        _withdraw(state, request, emit)
        return
    action = _control_action(request, state)
    if action is not None:
        _control(state, request, action, emit)
        return
    config = state.config
    if request.depth > config.max_call_depth:
        reason = (f"agent_call depth {request.depth} exceeds the limit of "
                  f"{config.max_call_depth}")
        served = _unserved(state, request)
        emit(RequestRejected(request_id=request_id, reason=reason))
        _answer(served, CallStatus.REFUSED, "depth_limit", reason, emit)
        return
    key = dedupe_key(request, config)
    if key is not None:
        original = state.pending_keys.get(key)
        if original is None:
            recent = state.recent_keys.get(key)
            if recent is not None and state.now - recent[1] <= config.dedupe_window_ms:
                original = recent[0]
        if original is not None:
            served = _unserved(state, request)
            emit(RequestDeduped(request_id=request_id, duplicate_of=original, key=key))
            _answer(served, CallStatus.REFUSED, "deduped", f"a duplicate of {original} ({key})",
                    emit)
            return
    _reason(state, request, emit)


def _reason(state: AgentState, request: AgentRequest, emit: Emit) -> None:
    """The reasoning lane: what the agent's mode does with an accepted request."""
    mode = state.config.mode
    run = state.active
    if run is None:
        if _enqueue(state, request, mode, emit):
            _start_next(state, emit)
        return
    if request.if_busy is not None:  # the request's own choice while the agent is busy
        if request.if_busy == "reject":
            reason = f"the agent is busy with run {run.run_id} and the request says ifBusy reject"
            refused = _unserved(state, request)
            emit(RequestRejected(request_id=request.request_id, reason=reason, transient=True))
            _answer(refused, CallStatus.REFUSED, "busy", reason, emit)
            return
        mode = Mode(request.if_busy)
    rule = MODES[mode]
    if rule.steers and run.steerable:
        emit(RunSteered(run_id=run.run_id, request_id=request.request_id))
        return
    if rule.interrupts:
        preempt, why = request.priority is Priority.HIGH, rule.follows_up
        if preempt:
            blocked = _can_start_now(state)
            if blocked is not None:
                preempt, why = False, blocked
        if not preempt:
            said = f"ifBusy {mode.value}: " if request.if_busy is not None else ""
            emit(FallbackApplied(request_id=request.request_id, mode=mode,
                                 reason=f"{said}{why}: follows up"))
            _enqueue(state, request, Mode.FOLLOWUP, emit)
            return
        if _enqueue(state, request, mode, emit):
            emit(RunAborted(run_id=run.run_id, reason=AbortReason.INTERRUPT, by=request.request_id))
            _start_next(state, emit)
        return
    _enqueue(state, request, mode, emit)


def _enqueue(state: AgentState, request: AgentRequest, mode: Mode, emit: Emit) -> bool:
    """Queue the received request, dropping by the cap policy; True if it was queued."""
    config = state.config
    request_id = request.request_id
    while len(state.pending) >= config.cap:
        victim = cap_victim(state.pending, request, config.drop_policy)
        if victim is None:
            reason = (f"queue full: cap {config.cap} reached and every pending request is "
                      "high priority; retry later (the same requestId may be used)")
            refused = _unserved(state, request)
            emit(RequestRejected(request_id=request_id, reason=reason, transient=True))
            _answer(refused, CallStatus.REFUSED, "queue_full", reason, emit)
            return False
        reason = (
            f"cap {config.cap} reached, policy {config.drop_policy.value}: "
            f"dropped {'the incoming' if victim.index is None else 'a pending'} "
            f"{victim.priority.value}-priority request"
        )
        dropped = request if victim.index is None else state.pending[victim.index].request
        dropped_id = dropped.request_id
        served = _unserved(state, dropped) if dropped.kind in _SERVING_KINDS else None
        if config.drop_policy is DropPolicy.SUMMARIZE:
            emit(RequestSummarized(request_id=dropped_id, reason=reason))
        else:
            emit(RequestDropped(request_id=dropped_id, reason=reason))
        if served:
            _answer(served, CallStatus.REFUSED, "queue_full", reason, emit)
        if victim.index is None:
            return False
    emit(RequestQueued(request_id=request_id, mode=mode))
    return True


# ------------------------------------------------------------------------- control lane


def _control(state: AgentState, request: AgentRequest, action: ControlAction, emit: Emit) -> None:
    request_id = request.request_id
    before = state.trading
    after = TRADING_TRANSITIONS.get((before, action))
    if after is None:
        emit(RequestRejected(request_id=request_id, reason=refusal(before, action)))
        return
    if action in APPROVAL_ACTIONS:
        decide_approval(state, request, action, emit)
        return
    if action is ControlAction.FLATTEN:
        decide_flatten(state, request, emit)
        return
    if action is ControlAction.CANCEL_ORDER:
        order_id = str(request.payload["orderId"])
        if order_id not in state.orders:
            emit(
                RequestRejected(
                    request_id=request_id,
                    reason=f"order {order_id!r} is not open; nothing to cancel",
                )
            )
            return
        targets = [order_id]
    elif action in (ControlAction.CANCEL_ALL, ControlAction.EMERGENCY_STOP):
        targets = list(state.orders)
    else:
        targets = []
    emit(ControlApplied(request_id=request_id, action=action, from_state=before, to_state=after))
    run = state.active
    if action is ControlAction.EMERGENCY_STOP and run is not None:
        emit(RunAborted(run_id=run.run_id, reason=AbortReason.EMERGENCY_STOP, by=request_id))
    for order_id in targets:
        if not state.orders[order_id].cancel_requested:
            emit(OrderCancelRequested(order_id=order_id, by=request_id))
    if action in (ControlAction.EMERGENCY_STOP, ControlAction.PAUSE):
        why = "stopped" if action is ControlAction.EMERGENCY_STOP else "paused"
        reject_all(state, request_id, f"the agent was {why} ({action.value})", emit)
    if after is TradingState.HALTED and before is not TradingState.HALTED:
        _cancel_calls(state, "halted", f"the calling agent was stopped ({action.value})", emit)
    if action is ControlAction.RESUME:
        if state.held is not None:
            emit(RunsUnheld(by=request_id))
        _start_next(state, emit)


# --------------------------------------------------------------------------------- runs


@DECIDERS.on(TimerElapsed)
def _timer(state: AgentState, event: TimerElapsed, emit: Emit) -> None:
    run = state.active
    if run is not None and state.now >= run.deadline:
        emit(RunAborted(run_id=run.run_id, reason=AbortReason.TIMEOUT))
    expire(state, emit)
    book = state.calls
    if book.deadlines:
        for call_id, deadline in sorted(book.deadlines.items(), key=lambda item: item[1]):
            if deadline > state.now:
                continue
            call = book.open[call_id]
            waited = deadline - (call.timeout_ms or 0)
            _end_call(state, call, CallResult(
                call_id=call_id, target=call.target, status=CallStatus.TIMED_OUT,
                code="timeout", error=f"no result within {call.timeout_ms} ms "
                f"(dispatched at {waited})"), None, emit)
    _start_next(state, emit)


@DECIDERS.on(RunSteerability)
def _steerability(state: AgentState, event: RunSteerability, emit: Emit) -> None:
    run = state.active
    if run is not None and run.run_id == event.run_id and run.steerable != event.steerable:
        emit(SteerabilityChanged(run_id=run.run_id, steerable=event.steerable))


def _not_active(state: AgentState, run_id: str) -> str | None:
    run = state.active
    if run is not None and run.run_id == run_id:
        return None
    active = "none" if run is None else run.run_id
    return f"run {run_id} is not the active run (active: {active})"


@DECIDERS.on(RunFinished)
def _finished(state: AgentState, event: RunFinished, emit: Emit) -> None:
    stale = _not_active(state, event.run_id)
    if stale is not None:
        emit(RunResultIgnored(run_id=event.run_id, reason=stale))
        return
    run = state.active
    assert run is not None
    served = _served(state, run.requests)  # (before the run ends: its results carry some)
    emit(RunCompleted(run_id=run.run_id, outcome=event.outcome, usage=event.usage))
    alerts(state, event.usage, emit)
    for number, intent in enumerate(event.orders, start=1):
        place(state, f"{run.run_id}-o{number}", run.run_id, intent, event.prices, emit)
    _make_calls(state, run.run_id, run.depth, event, served, emit)
    _start_next(state, emit)


@DECIDERS.on(RunErrored)
def _errored(state: AgentState, event: RunErrored, emit: Emit) -> None:
    stale = _not_active(state, event.run_id)
    if stale is not None:
        emit(RunResultIgnored(run_id=event.run_id, reason=stale))
        return
    emit(RunFailed(run_id=event.run_id, error=event.error))
    _start_next(state, emit)


@DECIDERS.on(SpendLimitHit)
def _spend_limit(state: AgentState, event: SpendLimitHit, emit: Emit) -> None:
    if state.held is None:
        before = state.trading
        after = TRADING_TRANSITIONS.get((before, ControlAction.PAUSE), before)
        emit(RunsHeld(provider=event.provider, reason=event.reason, from_state=before,
                      to_state=after))
    stale = _not_active(state, event.run_id)
    if stale is None:
        emit(RunFailed(run_id=event.run_id, error=f"{event.provider}: {event.reason}"))
    else:  # the account is out of credit all the same: held, and the result is ignored
        emit(RunResultIgnored(run_id=event.run_id, reason=stale))


@DECIDERS.on(CallUndeliverable)
def _undeliverable(state: AgentState, event: CallUndeliverable, emit: Emit) -> None:
    call = state.calls.open.get(event.call_id)
    if call is None:  # a call of a log written before call results, or one that ended already
        emit(AgentCallRejected(run_id=event.run_id, target=event.target, reason=event.reason))
        return
    _end_call(state, call, CallResult(call_id=call.call_id, target=call.target,
                                      status=CallStatus.REFUSED, code="undeliverable",
                                      error=event.reason[:1_000]), None, emit)


@DECIDERS.on(Quarantined)
def _quarantined(state: AgentState, event: Quarantined, emit: Emit) -> None:  # (nothing)
    """A stand-in for an event set aside decides nothing."""


@DECIDERS.on(Stopping)
def _stopping(state: AgentState, event: Stopping, emit: Emit) -> None:
    run = state.active
    if run is not None:
        emit(RunAborted(run_id=run.run_id, reason=AbortReason.SHUTDOWN, requeued=True))


@DECIDERS.on(Restarted)
def _restarted(state: AgentState, event: Restarted, emit: Emit) -> None:
    run = state.active
    if run is not None:
        emit(RunAborted(run_id=run.run_id, reason=AbortReason.RESTART, requeued=True))
    _start_next(state, emit)


@DECIDERS.on(WorkerLost)
def _worker_lost(state: AgentState, event: WorkerLost, emit: Emit) -> None:
    run = state.active
    if run is None or run.run_id != event.run_id:
        return  # the run ended before its worker was found gone: nothing to abort
    emit(RunAborted(run_id=run.run_id, reason=AbortReason.WORKER_LOST, requeued=True))
    if event.rerun:  # (otherwise the requests wait at the head for a worker)
        _start_next(state, emit)


@DECIDERS.on(WorkerReady)
def _worker_ready(state: AgentState, event: WorkerReady, emit: Emit) -> None:
    _start_next(state, emit)


# The sub-agent calls (imported last: they use the reasoning lane and the run engine above).
import lanes.decide_operator  # noqa: E402  (registers the operator's deciders)
import lanes.decide_steps  # noqa: E402, F401  (registers the steps' deciders)
from lanes.approvals import (  # noqa: E402
    APPROVAL_ACTIONS,
    decide_approval,
    expire,
    place,
    reject_all,
)
from lanes.decide_calls import (  # noqa: E402
    _SERVING_KINDS,
    _answer,
    _answer_run_end,
    _call_result,
    _cancel_calls,
    _end_call,
    _ending,
    _make_calls,
    _served,
    _unserved,
    _withdraw,
    end_tool_batches,
)
from lanes.decide_policy import adopt_at_rest  # noqa: E402  (the policy versions)
from lanes.flatten import decide_flatten  # noqa: E402  (the operator's flatten)
