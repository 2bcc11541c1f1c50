"""One readable line per event, for the demo, the CLI and people reading logs."""

from __future__ import annotations

from gateway.market.prices import PLAIN, PriceWords
from lanes.events import (
    AgentCallDispatched,
    AgentCallQueued,
    AgentCallRejected,
    BrokerReport,
    CallAnswered,
    CallBatchOpened,
    CallEnded,
    CallResultsReady,
    ConfigApplied,
    ConfigChanged,
    ControlApplied,
    Event,
    FallbackApplied,
    OperatorApplied,
    OperatorCommand,
    OperatorRejected,
    OrderAccepted,
    OrderRejected,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRepeated,
    RequestSummarized,
    RunAborted,
    RunCompleted,
    RunErrored,
    RunFailed,
    RunFinished,
    RunsSuppressed,
    RunStarted,
    RunSteerability,
    RunSteered,
    ScheduleApplied,
    ScheduleChanged,
    SteerabilityChanged,
)
from lanes.policy import PolicyAdopted, PolicyDeferred, PolicyOffered
from lanes.schedules import Schedule


def describe(event: Event, words: PriceWords | None = None) -> str:
    """What the event says, in a few words (prices to the tick of ``words``, by default the
    default tick)."""
    words = words or PLAIN
    match event:
        case RequestReceived(request=r):
            what = r.payload.get("action") or r.payload.get("message") or r.dedupe_key or ""
            return f"{r.request_id} {r.kind.value}/{r.priority.value} {what}".rstrip()
        case RequestQueued(request_id=rid, mode=mode):
            return f"{rid} queued ({mode.value})"
        case RequestDeduped(request_id=rid, duplicate_of=original):
            return f"{rid} is a duplicate of {original}"
        case RequestRepeated(request_id=rid, first_decision=first):
            return f"{rid} seen before: {first}"
        case RequestRejected(request_id=rid, reason=reason) | RequestDropped(
            request_id=rid, reason=reason
        ) | RequestSummarized(request_id=rid, reason=reason):
            return f"{rid}: {reason}"
        case FallbackApplied(request_id=rid, reason=reason):
            return f"{rid}: {reason}"
        case ControlApplied(action=action, from_state=before, to_state=after):
            return f"{action.value}: {before.value} -> {after.value}"
        case RunStarted(run_id=run_id, request_ids=ids, summary=summary):
            extra = f" + summary of {summary.count}" if summary else ""
            return f"{run_id} with {', '.join(ids)}{extra}"
        case RunSteered(run_id=run_id, request_id=rid):
            return f"{rid} steered into {run_id}"
        case RunFinished(run_id=run_id, outcome=outcome, orders=orders):
            return f"{run_id} returned {outcome.value}, {len(orders)} order(s)"
        case RunCompleted(run_id=run_id, outcome=outcome, usage=usage):
            return f"{run_id} {outcome.value} ({usage.input_tokens}+{usage.output_tokens} tokens)"
        case RunErrored(run_id=run_id, error=error) | RunFailed(run_id=run_id, error=error):
            return f"{run_id}: {error}"
        case RunAborted(run_id=run_id, reason=reason, requeued=requeued):
            return f"{run_id} aborted: {reason.value}{' (requeued)' if requeued else ''}"
        case RunSteerability(run_id=run_id, steerable=flag) | SteerabilityChanged(
            run_id=run_id, steerable=flag
        ):
            return f"{run_id} {'can' if flag else 'cannot'} take steers"
        case RunsSuppressed(reason=reason, detail=detail):
            return f"runs suppressed ({reason}): {detail}"
        case OrderAccepted(order_id=oid, intent=i, by=by):
            flatten = "" if by is None else f" (operator flatten, request {by})"
            return f"{oid} {words.intent(i)}{flatten}"
        case OrderRejected(intent=i, reason=reason):
            return f"{words.intent(i)}: {reason}"
        case BrokerReport(order_id=oid, status=status, filled_qty=filled, price=price,
                          reason=reason):
            at = "" if price is None else f" at {words.of_order(price, oid)}"
            why = f": {reason}" if reason else ""
            return f"{oid} {status.replace('_', ' ')}, {filled:g} filled{at}{why}"
        case AgentCallDispatched(call_id=cid, target=target, depth=depth):
            return f"{cid} -> {target} (depth {depth})"
        case AgentCallRejected(target=target, reason=reason):
            return f"call to {target}: {reason}"
        case AgentCallQueued(call_id=cid, target=target, priority=priority):
            return f"{cid} -> {target} queued ({priority.value})"
        case CallBatchOpened(run_id=run_id, results=results, serves=serves):
            serving = f", answers {len(serves)} call(s) after" if serves else ""
            return f"{run_id} awaits its calls ({results.value}){serving}"
        case CallEnded(call_id=cid, result=result):
            why = f": {result.error}" if result.error else ""
            return f"{cid} {result.status.value}{why}"
        case CallResultsReady(request=request, last=last):
            count = len(request.payload.get("results", ()))
            return f"{request.request_id}: {count} result(s){' (last)' if last else ''}"
        case CallAnswered(parent=parent, result=result):
            return f"{result.call_id} answered to {parent}: {result.status.value}"
        case ConfigChanged(principal=who) | ConfigApplied(principal=who):
            return f"by {who}"
        case ScheduleChanged(schedule_id=sid, schedule=None, principal=who) | ScheduleApplied(
            schedule_id=sid, schedule=None, principal=who
        ):
            return f"schedule {sid} removed by {who}"
        case ScheduleChanged(schedule=Schedule() as s, principal=who) | ScheduleApplied(
            schedule=Schedule() as s, principal=who
        ):
            when = s.cron if s.cron is not None else f"every {s.every_ms} ms"
            paused = ", paused" if s.paused else ""
            return f"schedule {s.id}: {when} ({s.timezone}{paused}) by {who}"
        case OperatorCommand(action=action, principal=who) | OperatorApplied(
            action=action, principal=who
        ) | OperatorRejected(action=action, principal=who):
            return f"{action.value} by {who}"
        case PolicyOffered(version=version) | PolicyAdopted(version=version):
            return f"policy version {version}"
        case PolicyDeferred(version=version, reason=reason):
            return f"policy version {version} later: {reason}"
    return ""
