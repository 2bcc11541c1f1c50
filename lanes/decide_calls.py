"""Sub-agent calls, as `decide` makes them: an agent's call queue, its calls' results and
the calls it serves for other agents (split out of `lanes.decide`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from pydantic import ValidationError

from lanes.config import CallResults
from lanes.decide import Emit, _reason, _start_next
from lanes.decide_policy import make_calls_v1
from lanes.events import (
    AbortReason,
    AgentCallDispatched,
    AgentCallQueued,
    AgentCallRejected,
    CallAnswered,
    CallBatchOpened,
    CallEnded,
    CallIntent,
    CallResult,
    CallResultsReady,
    CallStatus,
    CallWithdrawn,
    Decision,
    RequestDropped,
    RequestRejected,
    RunAborted,
    RunFailed,
    RunFinished,
    ServedCall,
    TasksFinished,
    TradingState,
)
from lanes.requests import AgentRequest, Kind
from lanes.state import AgentState, CallBatch, OpenCall, Pending

# ------------------------------------------------------------------------ sub-agent calls
#
# An agent's calls wait in its call queue (high priority first) and go out at most
# `max_parallel_calls` of one run at a time. Each ends exactly once (`CallEnded`, or
# `AgentCallRejected` before it is queued); its result comes back as a ``call_result``
# request. The results of a run's calls become a request for the agent's own reasoning lane
# (`CallResultsReady`): all at once when the last one ends, or one by one. A call an agent
# serves is answered (`CallAnswered`) when the run that took it is done, or, if that run made
# calls itself, when the run that takes their last result is. A call given up on while out is
# withdrawn from its target (`CallWithdrawn` there), which drops the work still to do for it.


def _made_refusal(state: AgentState, number: int, depth: int, accepted: int
                  ) -> tuple[str, str] | None:
    config = state.config
    if number > config.max_calls_per_run:
        return "fan_out_limit", f"fan-out limit of {config.max_calls_per_run} calls per run reached"
    if depth > config.max_call_depth:
        return "depth_limit", f"call depth {depth} exceeds the limit of {config.max_call_depth}"
    if len(state.calls.open) + accepted >= config.max_open_calls:
        return "queue_full", (f"queue_full: the call queue holds {config.max_open_calls} open "
                              f"calls, its limit (max_open_calls {config.max_open_calls})")
    return None


def _make_calls(state: AgentState, run_id: str, run_depth: int, event: RunFinished,
                served: list[ServedCall], emit: Emit) -> None:
    if state.policy < 2:  # (calls of version 1 went out at once: `lanes.decide_policy`)
        make_calls_v1(state, run_id, run_depth, event, emit)
        return
    depth = run_depth + 1
    refusals: list[tuple[str, str] | None] = []
    for number, _call in enumerate(event.calls, start=1):
        refusal = _made_refusal(state, number, depth, refusals.count(None))
        refusals.append(refusal)
    if None in refusals:
        results = event.call_results or state.config.call_results
        emit(CallBatchOpened(run_id=run_id, results=results, depth=run_depth,
                             serves=tuple(served)))
    for number, (call, refusal) in enumerate(zip(event.calls, refusals, strict=True), start=1):
        call_id = f"{run_id}-c{number}"
        if refusal is not None:
            emit(AgentCallRejected(run_id=run_id, target=call.agent_id, reason=refusal[1],
                                   call_id=call_id, code=refusal[0]))
            continue
        emit(AgentCallQueued(call_id=call_id, run_id=run_id, target=call.agent_id, depth=depth,
                             priority=call.priority, payload=call.payload,
                             timeout_ms=_timeout(state, call)))
    _dispatch(state, emit)
    if None not in refusals:  # nothing to wait for: the calls it served are answered now
        for item in served:
            emit(CallAnswered(parent=item.parent, result=CallResult(
                call_id=item.call_id, target=item.target, status=CallStatus.RETURNED,
                outcome=event.outcome, answer=event.answer[:20_000], usage=event.usage)))


def _timeout(state: AgentState, call: CallIntent) -> int | None:
    return call.timeout_ms if call.timeout_ms is not None else state.config.call_timeout_ms


def _dispatch(state: AgentState, emit: Emit) -> None:
    """Send queued calls out, in queue order, while their run has a parallel slot free.

    The slots are per run (the calls one run made), not per agent: an agent serving a call
    may need to make calls of its own while calls of its other runs are out, and slots
    shared by them could all be held by calls that wait for it (a deadlock)."""
    book = state.calls
    if not book.queue or state.trading is TradingState.HALTED:
        return
    limit = state.config.max_parallel_calls
    for call_id in list(book.queue):
        call = book.open[call_id]
        batch = book.batches.get(call.run_id)
        if batch is not None and batch.out >= limit:
            continue
        emit(AgentCallDispatched(
            call_id=call.call_id, run_id=call.run_id, target=call.target, depth=call.depth,
            priority=call.priority, payload=call.payload,
            deadline=None if call.timeout_ms is None else state.now + call.timeout_ms))


def _end_call(state: AgentState, call: OpenCall, result: CallResult, request_id: str | None,
              emit: Emit) -> None:
    """End one open call; free its slot for the next; hand the results over when due. A
    call that was out and is given up on is withdrawn from its target."""
    withdraw = call.dispatched and result.status in _GIVEN_UP
    emit(CallEnded(call_id=call.call_id, result=result, request_id=request_id,
                   withdraw=withdraw))
    _dispatch(state, emit)
    batch = state.calls.batches.get(call.run_id)
    if batch is not None and batch.awaited_by is not None:
        if batch.open == 0:
            _tasks_finished(batch, emit)
        return
    if batch is not None and (batch.results is CallResults.EACH or batch.open == 0):
        request = _results_request(state, batch)
        emit(CallResultsReady(run_id=batch.run_id, request=request, last=batch.open == 0))
        _reason(state, request, emit)


def send_tasks(state: AgentState, run_id: str, step: int, emit: Emit) -> None:
    """Send the tasks the active run ``run_id`` scheduled, as the calls of one batch
    (``<run>-s<step>``) its ``execute_scheduled_tasks`` waits for; refused ones end it at
    once, under the same limits as the calls a run's answer makes (numbered on from the
    tasks the run sent before)."""
    run = state.active
    assert run is not None and run.run_id == run_id
    batch_id, tasks, first = f"{run_id}-s{step}", run.scheduled, run.sent
    emit(CallBatchOpened(run_id=batch_id, results=CallResults.ALL, depth=run.depth,
                         awaited_by=run_id))
    depth = run.depth + 1
    for number, call in enumerate(tasks, start=1):
        call_id = f"{batch_id}-c{number}"
        refusal = _made_refusal(state, first + number, depth, 0)
        if refusal is not None:
            emit(AgentCallRejected(run_id=batch_id, target=call.agent_id, reason=refusal[1],
                                   call_id=call_id, code=refusal[0]))
            continue
        emit(AgentCallQueued(call_id=call_id, run_id=batch_id, target=call.agent_id,
                             depth=depth, priority=call.priority, payload=call.payload,
                             timeout_ms=_timeout(state, call)))
    _dispatch(state, emit)
    batch = state.calls.batches[batch_id]
    if batch.open == 0:  # every one refused
        _tasks_finished(batch, emit)


def _tasks_finished(batch: CallBatch, emit: Emit) -> None:
    assert batch.awaited_by is not None
    emit(TasksFinished(run_id=batch.awaited_by, batch_id=batch.run_id,
                       results=tuple(sorted(batch.ended, key=_call_number))))


def end_tool_batches(state: AgentState, run_id: str, emit: Emit) -> None:
    """A run ended: the calls its ``execute_scheduled_tasks`` still waits for are cancelled
    (nobody reads their results; those out are withdrawn from their targets)."""
    book = state.calls
    batches = {key for key, batch in book.batches.items() if batch.awaited_by == run_id}
    if not batches:
        return
    for call_id in [c for c in [*book.queue, *book.open] if book.open[c].run_id in batches]:
        call = book.open.get(call_id)
        if call is not None:
            _end_call(state, call, CallResult(
                call_id=call.call_id, target=call.target, status=CallStatus.CANCELLED,
                code="run_ended", error=f"run {run_id}, which waited for it, ended"),
                None, emit)


def _call_number(result: CallResult) -> int:
    number = result.call_id.rpartition("-c")[2]
    return int(number) if number.isdigit() else 0


_GIVEN_UP = (CallStatus.CANCELLED, CallStatus.TIMED_OUT)


def _results_request(state: AgentState, batch: CallBatch) -> AgentRequest:
    results = sorted(batch.ended, key=_call_number)  # in the order the run made the calls
    name = f"{batch.run_id}-results" if batch.results is CallResults.ALL and batch.open == 0 \
        else f"{batch.ended[-1].call_id}-result"
    return AgentRequest(
        request_id=name,
        created_at=datetime.fromtimestamp(state.now / 1000, UTC),
        agent_id=state.agent_id,
        kind=Kind.CALL_RESULT,
        source=f"calls:{batch.run_id}",
        payload={"runId": batch.run_id, "depth": batch.depth,
                 "results": [r.model_dump(mode="json", by_alias=True, exclude_none=True)
                             for r in results]},
    )


def _cancel_calls(state: AgentState, code: str, why: str, emit: Emit) -> None:
    """End every open call of this agent ``cancelled`` (the queued ones first: no slot a
    cancelled call frees sends another out)."""
    book = state.calls
    for call_id in [*book.queue, *book.open]:
        call = book.open.get(call_id)
        if call is not None:
            _end_call(state, call, CallResult(call_id=call.call_id, target=call.target,
                                              status=CallStatus.CANCELLED, code=code, error=why),
                      None, emit)


def _call_result(state: AgentState, request: AgentRequest, emit: Emit) -> None:
    """A result of one of this agent's calls arrived."""
    try:
        result = CallResult.model_validate(request.payload)
    except ValidationError as error:
        emit(RequestRejected(request_id=request.request_id, reason="not a call result: "
                             f"{error.errors(include_url=False)[0]['msg']}"[:500]))
        return
    call = state.calls.open.get(result.call_id)
    if call is None or not call.dispatched:
        emit(RequestRejected(request_id=request.request_id, reason=f"call {result.call_id} is "
                             "not out from this agent (it ended already, or was never made)"))
        return
    if request.source != f"agent:{call.target}":
        emit(RequestRejected(request_id=request.request_id, reason=f"the result of call "
                             f"{result.call_id} comes from its target agent {call.target!r} "
                             "(source 'agent:<target>'), not from a client"))
        return
    if result.target != call.target:
        result = result.model_copy(update={"target": call.target})
    _end_call(state, call, result, request.request_id, emit)


def _served(state: AgentState, requests: Iterable[Pending]) -> list[ServedCall]:
    """The calls these requests serve for other agents (to answer when their run is done;
    under policy version 1 nothing is answered)."""
    served: list[ServedCall] = []
    if state.policy < 2:
        return served
    carried = state.calls.carried
    for entry in requests:
        request = entry.request
        if request.kind is Kind.AGENT_CALL:
            source = request.source or ""
            if source.startswith("agent:"):
                served.append(ServedCall(call_id=request.request_id, parent=source[6:],
                                         target=state.agent_id))
        elif carried and request.kind is Kind.CALL_RESULT:
            served += carried.get(request.request_id, ())
    return served


_SERVING_KINDS = (Kind.AGENT_CALL, Kind.CALL_RESULT)


def _unserved(state: AgentState, request: AgentRequest) -> list[ServedCall]:
    """The calls a request serves, read before it is dropped or refused (it never runs)."""
    if request.kind not in _SERVING_KINDS:
        return _NONE
    return _served(state, [Pending(request, state.now, state.config.mode)])


_NONE: list[ServedCall] = []  # (never changed)


def _answer(served: list[ServedCall], status: CallStatus, code: str, error: str,
            emit: Emit) -> None:
    """Answer served calls that end without a result of their own."""
    for item in served:  # (mostly none: a drop of a request that serves no call)
        emit(CallAnswered(parent=item.parent, result=CallResult(
            call_id=item.call_id, target=item.target, status=status, code=code,
            error=error[:1_000])))


def _ending(state: AgentState, decision: Decision) -> list[ServedCall] | None:
    """The calls served by the requests of a run that ends for good with ``decision``."""
    run = state.active
    if run is None or getattr(decision, "requeued", False):
        return None
    return _served(state, run.requests)


def _answer_run_end(served: list[ServedCall], ended: Decision, emit: Emit) -> None:
    if isinstance(ended, RunAborted) and ended.reason is AbortReason.WITHDRAWN:
        return  # its caller gave up on it: nobody waits for an answer
    if isinstance(ended, RunAborted):
        halted = ended.reason is AbortReason.EMERGENCY_STOP
        status = CallStatus.CANCELLED if halted else CallStatus.FAILED
        code, error = ("halted" if halted else "run_aborted",
                       f"the run serving it was aborted ({ended.reason.value})")
    else:
        assert isinstance(ended, RunFailed)
        status, code, error = CallStatus.FAILED, "run_failed", ended.error
    _answer(served, status, code, error, emit)


def _withdraw(state: AgentState, request: AgentRequest, emit: Emit) -> None:
    """A caller gave up on a call this agent serves: drop what is still to do for it (the
    request if it waits, the run if it serves only that call, the calls made for it alone,
    which are withdrawn in turn)."""
    call_id = str(request.payload["callId"])
    book = state.calls
    pending = next((p.request for p in state.pending if p.request.request_id == call_id
                    and p.request.kind is Kind.AGENT_CALL), None)
    run = state.active
    running = run is not None and any(p.request.request_id == call_id for p in run.requests)
    served = [(run_id, s) for run_id, batch in book.batches.items() for s in batch.serves
              if s.call_id == call_id]
    callers = {f"agent:{s.parent}" for _, s in served}
    if pending is not None:
        callers.add(pending.source or "")
    if running and run is not None:
        callers.update(p.request.source or "" for p in run.requests
                       if p.request.request_id == call_id)
    if callers and callers != {request.source}:
        emit(RequestRejected(request_id=request.request_id, reason=f"call {call_id} may be "
                             "withdrawn only by the agent that made it"))
        return
    alone = run is not None and running and all(
        p.request.request_id == call_id for p in run.requests)
    emptied = {run_id for run_id, _ in served
               if all(s.call_id == call_id for s in book.batches[run_id].serves)}
    done = [what for what, did in (("dropped it from the queue", pending is not None),
                                   ("aborted the run serving it", alone),
                                   (f"cancelled the calls of {len(emptied)} run(s)", emptied))
            if did]
    emit(CallWithdrawn(request_id=request.request_id, call_id=call_id,
                       detail="; ".join(done) or "nothing left to do for it"))
    if pending is not None:
        emit(RequestDropped(request_id=call_id, reason="withdrawn by the agent that made it"))
    if alone and run is not None:
        emit(RunAborted(run_id=run.run_id, reason=AbortReason.WITHDRAWN, by=request.request_id))
    if emptied:
        doomed = [c for c in [*book.queue, *book.open] if book.open[c].run_id in emptied]
        for doomed_id in doomed:
            call = book.open.get(doomed_id)
            if call is not None:
                _end_call(state, call, CallResult(
                    call_id=call.call_id, target=call.target, status=CallStatus.CANCELLED,
                    code="withdrawn", error=f"the call {call_id} it served for was withdrawn "
                    "by its caller"), None, emit)
    _start_next(state, emit)
