"""The operator's flatten, as the control lane decides it (split out of `lanes.decide`).

A ``flatten`` control cancels every open order of the agent that no one asked to cancel
yet, rejects every order waiting for approval, and places one closing market order per
symbol whose position is not flat: the opposite side, for the whole position
(`closing_orders`). It is the operator's, not the agent's: it is legal in every trading
state, HALTED included (it only reduces; the trading gate that holds a run's orders is not
asked), and its orders carry the request (`OrderAccepted.by`) and no run. The quantity is
the position as the log has it now, net of nothing else: an open order that fills before
its cancel lands leaves a remainder (flatten again). A flatten with nothing to do (no
position, no open order, no approval waiting) is refused, and so says so.
"""

from __future__ import annotations

from lanes.approvals import reject_all
from lanes.decide import Emit
from lanes.events import ControlApplied, OrderAccepted, OrderCancelRequested, RequestRejected
from lanes.requests import AgentRequest, ControlAction
from lanes.state import AgentState
from lanes.vocabulary import OrderIntent

FLAT = 1e-9
"""A net quantity this close to zero is flat (fills are floats): nothing to close."""
NOTHING = "nothing to flatten: no open position, no open order and no order waiting for approval"


def closing_orders(positions: dict[str, float]) -> list[OrderIntent]:
    """One market order per symbol that is not flat, in symbol order, that brings it to
    zero: sell what is long, buy back what is short."""
    return [OrderIntent(symbol=symbol, side="sell" if net > 0 else "buy", qty=abs(net))
            for symbol, net in sorted(positions.items()) if abs(net) > FLAT]


def decide_flatten(state: AgentState, request: AgentRequest, emit: Emit) -> None:
    """A ``flatten`` on the control lane (see the module's docstring)."""
    request_id = request.request_id
    closing = closing_orders(state.positions)
    cancels = [o.order_id for o in state.orders.values() if not o.cancel_requested]
    if not closing and not cancels and not state.approvals:
        emit(RequestRejected(request_id=request_id, reason=NOTHING))
        return
    version = state.version  # (the request's: unique in the stream, so are the ids)
    emit(ControlApplied(request_id=request_id, action=ControlAction.FLATTEN,
                        from_state=state.trading, to_state=state.trading))
    for order_id in cancels:
        emit(OrderCancelRequested(order_id=order_id, by=request_id))
    reject_all(state, request_id, "the agent's positions were flattened (flatten)", emit)
    for number, intent in enumerate(closing, start=1):
        emit(OrderAccepted(order_id=f"{state.agent_id}-flat{version}-{number}", run_id="",
                           intent=intent, by=request_id))
