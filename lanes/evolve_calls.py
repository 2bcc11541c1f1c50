"""How an agent's sub-agent calls, config, schedules, policy version and operator commands
change its state (the evolvers of `lanes.evolve` for them, split out of it)."""

from __future__ import annotations

from lanes.events import (
    AgentCallDispatched,
    AgentCallQueued,
    AgentCallRejected,
    CallAnswered,
    CallBatchOpened,
    CallEnded,
    CallResult,
    CallResultsReady,
    CallStatus,
    CallWithdrawn,
    ConfigApplied,
    OperatorApplied,
    OperatorRejected,
    ScheduleApplied,
)
from lanes.evolve import EVOLVERS, _take_staged
from lanes.handlers import IllegalTransition
from lanes.policy import PolicyAdopted, PolicyDeferred
from lanes.requests import RANK
from lanes.schedules import FILE_PRINCIPAL, ScheduleEntry
from lanes.state import (
    AgentState,
    CallBatch,
    OpenCall,
)

# ---------------------------------------------------------------- calls, config, operator


@EVOLVERS.on(CallBatchOpened)
def _batch_opened(state: AgentState, event: CallBatchOpened) -> None:
    if event.run_id in state.calls.batches:
        raise IllegalTransition(f"the calls of run {event.run_id} are already awaited")
    state.calls.batches[event.run_id] = CallBatch(event.run_id, event.results, event.depth,
                                                  list(event.serves),
                                                  awaited_by=event.awaited_by)
    run = state.active
    if event.awaited_by is not None and run is not None and run.run_id == event.awaited_by:
        run.sent, run.scheduled = run.sent + len(run.scheduled), ()  # (sent or refused now)


@EVOLVERS.on(AgentCallQueued)
def _call_queued(state: AgentState, event: AgentCallQueued) -> None:
    book = state.calls
    batch = book.batches.get(event.run_id)
    if batch is None or event.call_id in book.open:
        raise IllegalTransition(f"call {event.call_id} queued outside an open batch, or twice")
    book.open[event.call_id] = OpenCall(event.call_id, event.run_id, event.target, event.depth,
                                        event.priority, event.payload, event.timeout_ms)
    queue = book.queue
    index, rank = len(queue), RANK[event.priority]
    while index > 0 and RANK[book.open[queue[index - 1]].priority] < rank:
        index -= 1
    queue.insert(index, event.call_id)
    batch.open += 1


@EVOLVERS.on(AgentCallDispatched)
def _call_dispatched(state: AgentState, event: AgentCallDispatched) -> None:
    book = state.calls
    call = book.open.get(event.call_id)
    if call is not None:  # (a log written before call results dispatched without a queue)
        if call.dispatched:
            raise IllegalTransition(f"call {event.call_id} was dispatched already")
        book.queue.remove(event.call_id)
        call.dispatched = True
        call.deadline = event.deadline
        if event.deadline is not None:
            book.deadlines[event.call_id] = event.deadline
        book.out += 1
        batch = book.batches.get(call.run_id)
        if batch is not None:
            batch.out += 1
    state.counters.calls_dispatched += 1


@EVOLVERS.on(AgentCallRejected)
def _call_rejected(state: AgentState, event: AgentCallRejected) -> None:
    if event.call_id:  # (none: a log before call results, or a call that ended before)
        _count_end(state, CallStatus.REFUSED)
        batch = state.calls.batches.get(event.run_id)
        if batch is not None and batch.awaited_by is not None:  # (its tool reads it)
            batch.ended.append(CallResult(call_id=event.call_id, target=event.target,
                                          status=CallStatus.REFUSED, code=event.code or None,
                                          error=event.reason[:1_000]))
    state.counters.calls_rejected += 1


def _count_end(state: AgentState, status: CallStatus) -> None:
    ended = state.calls.ended
    ended[status] = ended.get(status, 0) + 1


@EVOLVERS.on(CallEnded)
def _call_ended(state: AgentState, event: CallEnded) -> None:
    book = state.calls
    call = book.open.get(event.call_id)
    if call is None:
        raise IllegalTransition(f"call {event.call_id} is not open")
    if event.request_id is not None:
        _take_staged(state, event.request_id, "accepted")
    del book.open[event.call_id]
    if call.dispatched:
        book.out -= 1
        book.deadlines.pop(event.call_id, None)
    else:
        book.queue.remove(event.call_id)
    batch = book.batches.get(call.run_id)
    if batch is not None:
        batch.open -= 1
        if call.dispatched:
            batch.out -= 1
        batch.ended.append(event.result)
    _count_end(state, event.result.status)


@EVOLVERS.on(CallResultsReady)
def _results_ready(state: AgentState, event: CallResultsReady) -> None:
    book = state.calls
    batch = book.batches.get(event.run_id)
    if batch is None or state.staged is not None:
        raise IllegalTransition(f"no results of run {event.run_id} to hand over now")
    state.staged = event.request  # decided next like a request that arrived
    state.staged_by = None
    batch.ended = []
    if event.last:
        if batch.serves:
            book.carried[event.request.request_id] = batch.serves
        del book.batches[event.run_id]


@EVOLVERS.on(CallAnswered)
def _answered(state: AgentState, event: CallAnswered) -> None:
    state.calls.answered += 1


@EVOLVERS.on(CallWithdrawn)
def _withdrawn(state: AgentState, event: CallWithdrawn) -> None:
    _take_staged(state, event.request_id, "accepted")
    book = state.calls
    call_id = event.call_id
    # Nobody waits for an answer to it any more: a batch that served it alone is closed
    # (its calls are cancelled next, and their results go nowhere).
    for run_id, batch in list(book.batches.items()):
        if any(s.call_id == call_id for s in batch.serves):
            batch.serves = [s for s in batch.serves if s.call_id != call_id]
            if not batch.serves:
                del book.batches[run_id]
    for request_id, carried in list(book.carried.items()):
        if any(s.call_id == call_id for s in carried):
            left = [s for s in carried if s.call_id != call_id]
            if left:
                book.carried[request_id] = left
            else:
                del book.carried[request_id]


@EVOLVERS.on(ConfigApplied)
def _config(state: AgentState, event: ConfigApplied) -> None:
    state.config = event.config


@EVOLVERS.on(ScheduleApplied)
def _schedule(state: AgentState, event: ScheduleApplied) -> None:
    schedule = event.schedule
    if schedule is None:
        state.schedules.pop(event.schedule_id, None)
        return
    entry = state.schedules.get(event.schedule_id)
    if entry is None:
        state.schedules[event.schedule_id] = ScheduleEntry(
            schedule, state.now, from_file=event.principal == FILE_PRINCIPAL)
    else:  # redefined, paused or resumed: it fires only after now, never a time again
        entry.schedule, entry.since = schedule, state.now
        entry.from_file = entry.from_file or event.principal == FILE_PRINCIPAL


@EVOLVERS.on(PolicyAdopted)
def _policy_adopted(state: AgentState, event: PolicyAdopted) -> None:
    state.policy, state.policy_offered = event.version, None


@EVOLVERS.on(PolicyDeferred)
def _policy_deferred(state: AgentState, event: PolicyDeferred) -> None:
    state.policy_offered = event.version


@EVOLVERS.on(OperatorApplied)
def _operator_applied(state: AgentState, event: OperatorApplied) -> None:
    """Recorded for audit; the effects are the events that follow it."""


@EVOLVERS.on(OperatorRejected)
def _operator_rejected(state: AgentState, event: OperatorRejected) -> None:
    """Recorded for audit."""
