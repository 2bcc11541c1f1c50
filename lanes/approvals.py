"""Orders that wait for a human's approval, as `decide` takes them (split out of
`lanes.decide`).

An order a run places (in its final answer or with the ``place_order`` tool) meets the
trading gate first; one it lets through waits for approval (`ApprovalRequested`) when the
agent's ``approval`` rule says so: ``always``, or ``{above_notional = N}`` when its
quantity x price is above N (a price not known: it waits). The approval id is the order's
id. It ends exactly once (`ApprovalDecided`): ``approve`` or ``reject`` on the control lane,
expiry after ``approval_timeout_ms``, or an emergency stop or pause, which reject every
order waiting. An approved order meets the trading gate again, as the agent is then. The
outcome reaches the agent as an ``approval_result`` request, as call results do. Deciding
an approval that is not waiting (unknown, decided, expired) is refused and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from lanes.config import AboveNotional, AgentConfig
from lanes.decide import Emit, _reason
from lanes.events import (
    ApprovalDecided,
    ApprovalRequested,
    ControlApplied,
    OrderAccepted,
    OrderRejected,
    RequestRejected,
)
from lanes.requests import AgentRequest, ControlAction, Kind
from lanes.rules import order_refusal
from lanes.state import AgentState, PendingApproval
from lanes.vocabulary import OrderIntent

APPROVAL_ACTIONS = frozenset({ControlAction.APPROVE, ControlAction.REJECT})


def notional(intent: OrderIntent, prices: Mapping[str, float]) -> float | None:
    """An order's quantity x price: its limit price, else the latest price known."""
    price = intent.limit_price if intent.limit_price is not None else prices.get(intent.symbol)
    return None if price is None else intent.qty * price


def waits(config: AgentConfig, intent: OrderIntent, value: float | None) -> bool:
    """Whether the agent's rule makes an order of that notional wait for approval."""
    rule = config.approval
    if isinstance(rule, AboveNotional):
        if rule.symbols and intent.symbol not in rule.symbols:
            return False
        return value is None or value > rule.above_notional
    return rule == "always"


def place(state: AgentState, order_id: str, run_id: str, intent: OrderIntent,
          prices: Mapping[str, float], emit: Emit) -> None:
    """An order a run places: through the trading gate, then accepted or set waiting."""
    refused = order_refusal(state, intent)
    if refused is not None:
        emit(OrderRejected(run_id=run_id, intent=intent, reason=refused))
        return
    value = notional(intent, prices)
    if waits(state.config, intent, value):
        emit(ApprovalRequested(approval_id=order_id, run_id=run_id, order_id=order_id,
                               intent=intent, notional=value,
                               expires_at=state.now + state.config.approval_timeout_ms))
    else:
        emit(OrderAccepted(order_id=order_id, run_id=run_id, intent=intent))


def decide_approval(state: AgentState, request: AgentRequest, action: ControlAction,
                    emit: Emit) -> None:
    """An ``approve`` or ``reject`` on the control lane."""
    approval_id = str(request.payload["approvalId"])
    pending = state.approvals.get(approval_id)
    if pending is None:
        emit(RequestRejected(request_id=request.request_id, reason=(
            f"no order waits for approval {approval_id!r} (it was decided, expired, or "
            "never asked)")))
        return
    emit(ControlApplied(request_id=request.request_id, action=action,
                        from_state=state.trading, to_state=state.trading))
    reason = str(request.payload.get("reason", ""))[:500]
    end(state, pending, action is ControlAction.APPROVE, request.request_id, reason, emit)


def reject_all(state: AgentState, by: str, reason: str, emit: Emit) -> None:
    """Reject every order waiting (a stop or a pause)."""
    for pending in list(state.approvals.values()):
        end(state, pending, False, by, reason, emit)


def expire(state: AgentState, emit: Emit) -> None:
    """Reject the orders whose approval is overdue."""
    for pending in list(state.approvals.values()):
        if pending.expires_at <= state.now:
            waited = state.config.approval_timeout_ms
            end(state, pending, False, "expired", f"not approved within {waited} ms", emit)


def next_expiry(state: AgentState) -> int | None:
    """When the next approval expires, if any waits."""
    return min((p.expires_at for p in state.approvals.values()), default=None)


def end(state: AgentState, pending: PendingApproval, approved: bool, by: str, reason: str,
        emit: Emit) -> None:
    """An approval ends: decided, the order (if approved) through the gate as the agent is
    now, and the outcome queued for the agent."""
    request = _result(state, pending, approved, by, reason)
    emit(ApprovalDecided(approval_id=pending.approval_id, approved=approved, by=by,
                         reason=reason, request=request))
    if approved:
        refused = order_refusal(state, pending.intent)
        if refused is None:
            emit(OrderAccepted(order_id=pending.order_id, run_id=pending.run_id,
                               intent=pending.intent))
        else:
            emit(OrderRejected(run_id=pending.run_id, intent=pending.intent, reason=refused))
    _reason(state, request, emit)


def _result(state: AgentState, pending: PendingApproval, approved: bool, by: str,
            reason: str) -> AgentRequest:
    return AgentRequest(
        request_id=f"{pending.approval_id}-approval",
        created_at=datetime.fromtimestamp(state.now / 1000, UTC),
        agent_id=state.agent_id,
        kind=Kind.APPROVAL_RESULT,
        source=f"approvals:{pending.run_id}",
        payload={"approvalId": pending.approval_id, "orderId": pending.order_id,
                 "approved": approved, "by": by, "reason": reason,
                 "order": pending.intent.model_dump(mode="json", by_alias=True)},
    )
