"""``evolve(state, event)``: the one place an agent's state changes.

Folding an agent's events through `evolve` from an empty `AgentState` gives back exactly the
live state. An event that is not legal in the current state raises `IllegalTransition` and
leaves the state unchanged: every check comes before the first change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from lanes.config import DAY_MS, Mode
from lanes.events import (
    SUMMARY_IDS,
    AbortReason,
    BrokerReport,
    BrokerReportIgnored,
    CallUndeliverable,
    ConfigChanged,
    ControlApplied,
    Event,
    FallbackApplied,
    OperatorCommand,
    OrderAccepted,
    OrderCancelRequested,
    OrderClosed,
    OrderFilled,
    OrderRejected,
    Outcome,
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
    ScheduleChanged,
    SpendLimitHit,
    SteerabilityChanged,
    Stopping,
    Summary,
    TimerElapsed,
    WorkerLost,
    WorkerReady,
)
from lanes.handlers import IllegalTransition, Registry
from lanes.policy import PolicyOffered
from lanes.requests import AgentRequest, ControlAction, Kind
from lanes.rules import dedupe_key, fingerprint, insert_index
from lanes.schedules import firing_of
from lanes.spending import record
from lanes.state import (
    ActiveRun,
    AgentState,
    OpenOrder,
    Pending,
    TradingChange,
)
from lanes.tables import LANE_TRANSITIONS

EVOLVERS: Registry[Callable[[AgentState, Any], None]] = Registry("event")
"""Event class -> how it changes an agent's state."""

_TRADING_ACTIONS = frozenset({ControlAction.EMERGENCY_STOP, ControlAction.PAUSE,
                              ControlAction.RESUME})
"""The control actions that set the trading state (cancels leave it as it is)."""


def evolve(state: AgentState, event: Event) -> AgentState:
    """Apply one event to ``state`` in place and return it."""
    EVOLVERS.handler(event)(state, event)
    state.version += 1
    return state


def fold(state: AgentState, events: Iterable[Event]) -> AgentState:
    """Evolve ``state`` through many events (the same as calling `evolve` on each)."""
    handlers = EVOLVERS.table
    for event in events:
        handler = handlers.get(type(event))
        if handler is None:
            handler = EVOLVERS.handler(event)  # (raises)
        handler(state, event)
        state.version += 1
    return state


# ------------------------------------------------------------------------------ helpers


def _run(state: AgentState, run_id: str, event_type: str) -> ActiveRun:
    run = state.active
    if (state.lane, event_type) not in LANE_TRANSITIONS:
        raise IllegalTransition(f"{event_type} while the lane is {state.lane.value}")
    if run is None or run.run_id != run_id:
        raise IllegalTransition(f"{event_type} for {run_id}, which is not the active run")
    return run


def _take_staged(state: AgentState, request_id: str, decision: str) -> AgentRequest:
    """The request just received, now decided: remember its first decision."""
    request = state.staged
    if request is None or request.request_id != request_id:
        raise IllegalTransition(f"no received request {request_id} awaits a decision")
    state.staged = state.staged_by = None
    seen = state.seen
    seen.pop(request_id, None)  # keep the memory in time order
    seen[request_id] = (decision, state.now, fingerprint(request))
    return request


def _is_staged(state: AgentState, request_id: str) -> bool:
    return state.staged is not None and state.staged.request_id == request_id


def _remember_key(state: AgentState, request: AgentRequest) -> str | None:
    key = dedupe_key(request, state.config)
    if key is not None:
        state.recent_keys.pop(key, None)
        state.recent_keys[key] = (request.request_id, state.now)
    return key


def _forget_pending(state: AgentState, entry: Pending) -> None:
    key = entry.key
    if key is not None and state.pending_keys.get(key) == entry.request.request_id:
        del state.pending_keys[key]


def _index_of(state: AgentState, request_id: str) -> int:
    # From the back: what is dropped is mostly low priority, and low priority sits last.
    pending = state.pending
    for index in range(len(pending) - 1, -1, -1):
        if pending[index].request.request_id == request_id:
            return index
    raise IllegalTransition(f"request {request_id} is not pending")


def _prune(entries: dict[str, Any], horizon: int, limit: int) -> None:
    """Forget entries (each a tuple whose second item is its time) older than ``horizon``,
    and all but the newest ``limit``; entries are kept oldest first."""
    while entries:
        key, value = next(iter(entries.items()))
        if value[1] >= horizon and len(entries) <= limit:
            return
        del entries[key]


def _prune_seen(state: AgentState, horizon: int, limit: int) -> None:
    """`_prune` for request ids, except those still pending or running: a request is
    remembered as long as it is held, so its id can never be queued twice."""
    seen = state.seen
    if not seen:
        return
    oldest = next(iter(seen.values()))
    if oldest[1] >= horizon and len(seen) <= limit:
        return
    held = held_ids(state)
    doomed: list[str] = []
    for key, value in seen.items():
        if value[1] >= horizon and len(seen) - len(doomed) <= limit:
            break
        if key not in held:
            doomed.append(key)
    for key in doomed:
        del seen[key]


def held_ids(state: AgentState) -> set[str]:
    """Ids of the requests the agent holds: pending, and in the active run."""
    held = {p.request.request_id for p in state.pending}
    if state.active is not None:
        held.update(p.request.request_id for p in state.active.requests)
    return held


def _advance(state: AgentState, at: int) -> None:
    state.now = max(state.now, at)


# ------------------------------------------------------------------------------- inputs


PRUNE_EVERY = 32
"""Request-id and dedupe memories are trimmed every this many requests (cheap, and still
deterministic); lookups compare times themselves, so a window is never cut short."""


@EVOLVERS.on(RequestReceived)
def _received(state: AgentState, event: RequestReceived) -> None:
    if state.staged is not None:
        raise IllegalTransition(f"request {state.staged.request_id} was never decided")
    if event.at > state.now:
        state.now = event.at
    request = event.request
    state.staged = request
    state.staged_by = event.principal or request.source or request.kind.value
    counters = state.counters
    counters.received += 1
    if state.schedules:
        firing = firing_of(event.request, event.principal)
        if firing is not None:
            entry = state.schedules.get(firing[0])
            if entry is not None:
                entry.last_fire = firing[1] if entry.last_fire is None else max(
                    entry.last_fire, firing[1])
                entry.fired += 1
    if counters.received % PRUNE_EVERY == 0:
        config = state.config
        _prune_seen(state, state.now - config.idempotency_window_ms, config.idempotency_max)
        _prune(state.recent_keys, state.now - config.dedupe_window_ms, config.idempotency_max)


def _input(state: AgentState, event: Any) -> None:
    _advance(state, event.at)


@EVOLVERS.on(Quarantined)
def _quarantined(state: AgentState, event: Quarantined) -> None:
    """Nothing: the event it stands in for is set aside (only the version moves on)."""


EVOLVERS.on(
    TimerElapsed,
    RunSteerability,
    RunFinished,
    RunErrored,
    OperatorCommand,
    ConfigChanged,
    ScheduleChanged,
    BrokerReport,
    SpendLimitHit,
    CallUndeliverable,
    Stopping,
    Restarted,
    PolicyOffered,
    WorkerLost,
    WorkerReady,
)(_input)


# ---------------------------------------------------------------------------- requests


@EVOLVERS.on(RequestQueued)
def _queued(state: AgentState, event: RequestQueued) -> None:
    request = _take_staged(state, event.request_id, "accepted")
    key = _remember_key(state, request)
    entry = Pending(request, state.now, event.mode, key)
    state.pending.insert(insert_index(state.pending, request, event.mode), entry)
    if key is not None:
        state.pending_keys[key] = request.request_id
    if event.mode is Mode.COLLECT:
        config = state.config
        if state.collect_first is None:
            state.collect_first = state.now
        state.collect_due = min(
            state.now + config.debounce_ms, state.collect_first + config.collect_deadline_ms
        )
    state.counters.accepted += 1


@EVOLVERS.on(RequestDeduped)
def _deduped(state: AgentState, event: RequestDeduped) -> None:
    _take_staged(state, event.request_id, "deduped")
    state.counters.dedupes += 1


@EVOLVERS.on(RequestRepeated)
def _repeated(state: AgentState, event: RequestRepeated) -> None:
    if not _is_staged(state, event.request_id):
        raise IllegalTransition(f"no received request {event.request_id} awaits a decision")
    state.staged = state.staged_by = None
    state.counters.repeats += 1


@EVOLVERS.on(RequestRejected)
def _rejected(state: AgentState, event: RequestRejected) -> None:
    if event.transient:
        if not _is_staged(state, event.request_id):
            raise IllegalTransition(f"no received request {event.request_id} awaits a decision")
        state.staged = state.staged_by = None
    else:
        _take_staged(state, event.request_id, "rejected")
    state.counters.rejected += 1


def _remove_pending(state: AgentState, request_id: str) -> Pending:
    entry = state.pending.pop(_index_of(state, request_id))
    _forget_pending(state, entry)
    if not state.pending:
        state.collect_first = state.collect_due = None
    return entry


@EVOLVERS.on(RequestDropped)
def _dropped(state: AgentState, event: RequestDropped) -> None:
    # A dropped request was never handled: its redelivery must not count as a duplicate.
    if _is_staged(state, event.request_id):
        _take_staged(state, event.request_id, "dropped")
    else:
        key = _remove_pending(state, event.request_id).key
        if key is not None and state.recent_keys.get(key, ("",))[0] == event.request_id:
            del state.recent_keys[key]
    if state.calls.carried:
        state.calls.carried.pop(event.request_id, None)
    state.counters.drops += 1


@EVOLVERS.on(RequestSummarized)
def _summarized(state: AgentState, event: RequestSummarized) -> None:
    if _is_staged(state, event.request_id):
        _remember_key(state, _take_staged(state, event.request_id, "dropped"))
        at = state.now
    else:
        at = _remove_pending(state, event.request_id).at
    if state.calls.carried:
        state.calls.carried.pop(event.request_id, None)
    folded = Summary(count=1, request_ids=(event.request_id,), first_at=at, last_at=at)
    state.summary = merge_summaries(state.summary, folded)
    state.counters.summarized += 1


def merge_summaries(first: Summary | None, second: Summary | None) -> Summary | None:
    """One summary of what two summaries hold (either may be None)."""
    if first is None or second is None:
        return first or second
    return Summary(
        count=first.count + second.count,
        request_ids=(*first.request_ids, *second.request_ids)[:SUMMARY_IDS],
        first_at=min(first.first_at, second.first_at),
        last_at=max(first.last_at, second.last_at),
    )


@EVOLVERS.on(FallbackApplied)
def _fallback(state: AgentState, event: FallbackApplied) -> None:
    state.counters.fallbacks += 1


@EVOLVERS.on(ControlApplied)
def _control(state: AgentState, event: ControlApplied) -> None:
    if state.trading is not event.from_state:
        raise IllegalTransition(
            f"{event.action.value} from {event.from_state.value}, but the agent is "
            f"{state.trading.value}"
        )
    by = state.staged_by or "unknown"
    request = state.staged
    if request is not None and request.kind is Kind.SYSTEM_ALERT:  # the alert is the cause
        rule = request.payload.get("rule")
        by = f"alert {request.payload.get('code', '?')}{f' ({rule})' if rule else ''} from {by}"
    _take_staged(state, event.request_id, "accepted")
    if event.action in _TRADING_ACTIONS and event.to_state is not event.from_state:
        # (a control that changes nothing, a stop of a HALTED agent, leaves who and when)
        state.trading_change = TradingChange(event.action.value, by, state.now)
    if event.action is ControlAction.RESUME:
        state.failure = None  # seen to: an operator resumed the agent
    state.trading = event.to_state
    state.counters.controls += 1


# -------------------------------------------------------------------------------- runs


@EVOLVERS.on(RunStarted)
def _started(state: AgentState, event: RunStarted) -> None:
    if (state.lane, "RunStarted") not in LANE_TRANSITIONS:
        raise IllegalTransition(f"run {event.run_id} started while {state.active}")
    count = len(event.request_ids)
    batch = state.pending[:count]
    if tuple(p.request.request_id for p in batch) != event.request_ids:
        raise IllegalTransition(f"run {event.run_id} does not start with the head of the queue")
    del state.pending[:count]
    for entry in batch:
        _forget_pending(state, entry)
    if not state.pending or any(p.mode is Mode.COLLECT for p in batch):
        state.collect_first = state.collect_due = None
    state.run_seq += 1
    state.active = ActiveRun(
        run_id=event.run_id,
        requests=batch,
        started_at=state.now,
        deadline=event.deadline,
        depth=event.depth,
        summary=event.summary,
    )
    starts = state.run_starts
    starts.append(state.now)
    while starts[0] <= state.now - DAY_MS:
        starts.popleft()
    state.summary = None
    state.counters.runs += 1


@EVOLVERS.on(RunSteered)
def _steered(state: AgentState, event: RunSteered) -> None:
    run = _run(state, event.run_id, "RunSteered")
    request = _take_staged(state, event.request_id, "accepted")
    key = _remember_key(state, request)
    run.requests.append(Pending(request, state.now, state.config.mode, key))
    run.steers += 1
    state.counters.accepted += 1
    state.counters.steers += 1


@EVOLVERS.on(SteerabilityChanged)
def _steerability(state: AgentState, event: SteerabilityChanged) -> None:
    _run(state, event.run_id, "SteerabilityChanged").steerable = event.steerable


def _release_carried(state: AgentState, requests: list[Pending]) -> None:
    """The requests of a run that ended carry no call answers any more (given, or lost)."""
    carried = state.calls.carried
    if carried:
        for entry in requests:
            carried.pop(entry.request.request_id, None)


@EVOLVERS.on(RunCompleted)
def _completed(state: AgentState, event: RunCompleted) -> None:
    run = _run(state, event.run_id, "RunCompleted")
    _release_carried(state, run.requests)
    state.active = None
    state.failure = None
    cooldown = state.config.budgets.no_trade_cooldown_ms
    if event.outcome is Outcome.NO_TRADE and cooldown:
        state.cooldown_until = state.now + cooldown
    counters = state.counters
    counters.completed += 1
    counters.input_tokens += event.usage.input_tokens
    counters.output_tokens += event.usage.output_tokens
    record(state, event.usage)


@EVOLVERS.on(RunFailed)
def _failed(state: AgentState, event: RunFailed) -> None:
    run = _run(state, event.run_id, "RunFailed")
    _release_carried(state, run.requests)
    state.active = None
    state.failure = (event.run_id, state.now, event.error)
    state.counters.failed += 1


@EVOLVERS.on(RunAborted)
def _aborted(state: AgentState, event: RunAborted) -> None:
    run = _run(state, event.run_id, "RunAborted")
    state.active = None
    if event.reason is AbortReason.TIMEOUT:
        took = state.now - run.started_at
        state.failure = (event.run_id, state.now, f"timed out after {took} ms")
    if not event.requeued:
        _release_carried(state, run.requests)
    if event.requeued:
        state.pending[0:0] = run.requests
        state.summary = merge_summaries(run.summary, state.summary)
        for entry in run.requests:
            if entry.key is not None:
                state.pending_keys[entry.key] = entry.request.request_id
    state.counters.aborts += 1


@EVOLVERS.on(RunResultIgnored)
def _ignored(state: AgentState, event: RunResultIgnored) -> None:
    """Nothing changes: the result came too late."""


@EVOLVERS.on(RunsSuppressed)
def _suppressed(state: AgentState, event: RunsSuppressed) -> None:
    state.suppressed = (event.reason, event.until)
    if event.reason == "cooldown":
        state.counters.cooldowns += 1
    else:
        state.counters.suppressions += 1


@EVOLVERS.on(RunsResumed)
def _resumed(state: AgentState, event: RunsResumed) -> None:
    state.suppressed = None


@EVOLVERS.on(RunsHeld)
def _held(state: AgentState, event: RunsHeld) -> None:
    if state.trading is not event.from_state:
        raise IllegalTransition(
            f"hold from {event.from_state.value}, but the agent is {state.trading.value}"
        )
    state.trading = event.to_state
    state.trading_change = TradingChange("hold", f"provider {event.provider}", state.now)
    state.held = f"{event.provider}: {event.reason}"
    state.counters.holds += 1


@EVOLVERS.on(RunsUnheld)
def _unheld(state: AgentState, event: RunsUnheld) -> None:
    state.held = None


# ------------------------------------------------------------------------------ orders


def _order(state: AgentState, order_id: str) -> OpenOrder:
    order = state.orders.get(order_id)
    if order is None:
        raise IllegalTransition(f"order {order_id} is not open")
    return order


@EVOLVERS.on(OrderAccepted)
def _order_accepted(state: AgentState, event: OrderAccepted) -> None:
    if event.order_id in state.orders:
        raise IllegalTransition(f"order {event.order_id} is already open")
    state.orders[event.order_id] = OpenOrder(event.order_id, event.run_id, event.intent)
    state.counters.orders_accepted += 1


@EVOLVERS.on(OrderRejected)
def _order_rejected(state: AgentState, event: OrderRejected) -> None:
    state.counters.orders_rejected += 1


@EVOLVERS.on(OrderCancelRequested)
def _cancel_requested(state: AgentState, event: OrderCancelRequested) -> None:
    order = _order(state, event.order_id)
    state.orders[event.order_id] = replace(order, cancel_requested=True)


@EVOLVERS.on(OrderFilled)
def _filled(state: AgentState, event: OrderFilled) -> None:
    order = _order(state, event.order_id)
    symbol = order.intent.symbol
    signed = event.qty if order.intent.side == "buy" else -event.qty
    state.positions[symbol] = state.positions.get(symbol, 0.0) + signed
    state.orders[event.order_id] = replace(order, filled_qty=order.filled_qty + event.qty)


@EVOLVERS.on(OrderClosed)
def _closed(state: AgentState, event: OrderClosed) -> None:
    _order(state, event.order_id)
    del state.orders[event.order_id]


@EVOLVERS.on(BrokerReportIgnored)
def _report_ignored(state: AgentState, event: BrokerReportIgnored) -> None:
    """Nothing changes: the order is unknown or closed."""


# The evolvers of calls, config and operator (imported last: they register in EVOLVERS above).
import lanes.evolve_calls  # noqa: E402
import lanes.evolve_steps  # noqa: E402, F401
