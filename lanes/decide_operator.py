"""Operator commands, config and schedule changes and broker reports, as `decide` takes
them (split out of `lanes.decide`)."""

from __future__ import annotations

from lanes.decide import DECIDERS, Emit, _not_active, _start_next
from lanes.decide_calls import _answer, _cancel_calls, _unserved
from lanes.events import (
    AbortReason,
    BrokerReport,
    BrokerReportIgnored,
    CallStatus,
    ConfigApplied,
    ConfigChanged,
    DeskBudgetApplied,
    DeskBudgetSpent,
    OperatorAction,
    OperatorApplied,
    OperatorCommand,
    OperatorRejected,
    OrderClosed,
    OrderFilled,
    RequestDropped,
    RunAborted,
    ScheduleApplied,
    ScheduleChanged,
)
from lanes.schedules import MAX_SCHEDULES
from lanes.state import AgentState

# ------------------------------------------------------------------- operator and config


@DECIDERS.on(OperatorCommand)
def _operator(state: AgentState, event: OperatorCommand, emit: Emit) -> None:
    run = state.active
    action, principal = event.action, event.principal
    if action is OperatorAction.ABORT_RUN:
        stale = _not_active(state, event.run_id or "(none)")
        if stale is not None:
            emit(
                OperatorRejected(
                    action=action, principal=principal, reason=stale, run_id=event.run_id
                )
            )
            return
    detail = ""
    if action is OperatorAction.CLEAR_QUEUE:
        detail = f"{len(state.pending)} pending requests dropped"
    elif run is None:
        detail = "the lane was already idle"
    emit(
        OperatorApplied(
            action=action,
            principal=principal,
            run_id=None if run is None else run.run_id,
            detail=detail,
        )
    )
    if action is OperatorAction.CLEAR_QUEUE:
        for entry in list(state.pending):
            reason = f"queue cleared by {principal}"
            served = _unserved(state, entry.request)
            emit(RequestDropped(request_id=entry.request.request_id, reason=reason))
            _answer(served, CallStatus.CANCELLED, "cleared", reason, emit)
        _cancel_calls(state, "cleared", f"the calling agent's queue was cleared by {principal}",
                      emit)
        return
    if run is not None:
        reason = AbortReason.RELEASE if action is OperatorAction.RELEASE else AbortReason.OPERATOR
        emit(RunAborted(run_id=run.run_id, reason=reason, by=principal))
    _start_next(state, emit)


@DECIDERS.on(ConfigChanged)
def _config(state: AgentState, event: ConfigChanged, emit: Emit) -> None:
    # The first event of a stream is its first config: record it even if it is the default.
    if event.config != state.config or state.version == 1:
        emit(ConfigApplied(config=event.config, principal=event.principal))
        _start_next(state, emit)


@DECIDERS.on(ScheduleChanged)
def _schedule(state: AgentState, event: ScheduleChanged, emit: Emit) -> None:
    entry = state.schedules.get(event.schedule_id)
    schedule = event.schedule
    if schedule is None:
        if entry is not None:
            emit(ScheduleApplied(schedule_id=event.schedule_id, schedule=None,
                                 principal=event.principal))
        return
    if schedule.id != event.schedule_id or (entry is not None and entry.schedule == schedule):
        return
    if entry is None and len(state.schedules) >= MAX_SCHEDULES:
        return  # (the shell refuses it before: `gateway.runtime.schedules`)
    emit(ScheduleApplied(schedule_id=event.schedule_id, schedule=schedule,
                         principal=event.principal))


@DECIDERS.on(DeskBudgetSpent)
def _desk_budget(state: AgentState, event: DeskBudgetSpent, emit: Emit) -> None:
    until = event.until if event.until > state.now else 0
    current = state.desk_block
    if (current is None and not until) or (current is not None and current == (until,
                                                                             event.detail)):
        return
    emit(DeskBudgetApplied(until=until, detail=event.detail if until else ""))
    _start_next(state, emit)


@DECIDERS.on(BrokerReport)
def _broker(state: AgentState, event: BrokerReport, emit: Emit) -> None:
    order = state.orders.get(event.order_id)
    if order is None:
        emit(
            BrokerReportIgnored(
                order_id=event.order_id, reason=f"order {event.order_id!r} is not open"
            )
        )
        return
    status = event.status
    if status == "cancelled" or status == "rejected":
        emit(OrderClosed(order_id=order.order_id, status=status, reason=event.reason))
        return
    if event.filled_qty > 0:
        emit(OrderFilled(order_id=order.order_id, qty=event.filled_qty, price=event.price))
    if status == "filled":
        emit(OrderClosed(order_id=order.order_id, status="filled"))
