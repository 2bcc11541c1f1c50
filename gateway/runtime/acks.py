"""The runtime's answer to a request: an `Ack`, made from the decisions once they are committed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.runtime.effects import ControlEffect, FlattenOrder
from lanes.events import (
    CallEnded,
    CallWithdrawn,
    ControlApplied,
    Decision,
    OrderAccepted,
    OrderCancelRequested,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestRejected,
    RequestRepeated,
    RequestSummarized,
    RunAborted,
    RunStarted,
    RunSteered,
    RunsUnheld,
)
from store.port import RecordedEvent


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to a submission, given only after its decision is committed."""

    request_id: str
    decision: str
    """``accepted``, ``deduped``, ``dropped`` or ``rejected``."""
    position: int
    """Log position of the event that holds the decision."""
    reason: str | None = None
    repeated: bool = False
    """True when the requestId was seen before: this is its first decision again."""
    effect: ControlEffect | None = None
    """What an accepted control did (`control_effect`); None for anything else."""


def ack_of(request_id: str, decisions: list[Decision], records: list[RecordedEvent]) -> Ack:
    """The ack of ``request_id`` from the decisions of its input and their ``records`` (the
    input's record first)."""
    for index, decision in enumerate(decisions):
        if getattr(decision, "request_id", None) != request_id:
            continue
        position = records[index + 1].position
        if isinstance(decision, ControlApplied):
            effect = control_effect(decision, decisions[index + 1:])
            return Ack(request_id, "accepted", position, effect=effect)
        if isinstance(decision, RequestQueued | RunSteered | CallEnded | CallWithdrawn):
            # (a call's result ends its call; a caller's withdrawal is taken)
            return Ack(request_id, "accepted", position)
        if isinstance(decision, RequestDeduped):
            reason = f"duplicate of {decision.duplicate_of} ({decision.key})"
            return Ack(request_id, "deduped", position, reason)
        if isinstance(decision, RequestDropped | RequestSummarized):
            return Ack(request_id, "dropped", position, decision.reason)
        if isinstance(decision, RequestRejected):
            return Ack(request_id, "rejected", position, decision.reason)
        if isinstance(decision, RequestRepeated):
            return Ack(request_id, decision.first_decision, position, repeated=True)
    raise AssertionError(f"no decision for request {request_id}")


def control_effect(applied: ControlApplied, after: Sequence[Decision]) -> ControlEffect:
    """What a control did: its state change and the decisions it set off (``after``: the
    decisions that followed it for the same input)."""
    aborted = next((d.run_id for d in after if isinstance(d, RunAborted)), None)
    started = next((d.run_id for d in after if isinstance(d, RunStarted)), None)
    cancels = sum(isinstance(d, OrderCancelRequested) for d in after)
    unheld = any(isinstance(d, RunsUnheld) for d in after)
    calls = sum(isinstance(d, CallEnded) for d in after)
    flatten = [FlattenOrder(order_id=d.order_id, symbol=d.intent.symbol, side=d.intent.side,
                            qty=d.intent.qty)
               for d in after if isinstance(d, OrderAccepted) and d.by == applied.request_id]
    changed = (applied.from_state is not applied.to_state or aborted is not None
               or started is not None or cancels > 0 or unheld or calls > 0 or bool(flatten))
    return ControlEffect(from_state=applied.from_state, to_state=applied.to_state,
                         changed=changed, aborted_run=aborted, cancels_requested=cancels,
                         unheld=unheld, started_run=started, calls_cancelled=calls,
                         flatten_orders=flatten)
