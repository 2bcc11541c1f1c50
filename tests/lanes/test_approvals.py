"""Orders that wait for a human's approval: asked, approved or rejected on the control lane,
expired, rejected by a stop or a pause; each ends exactly once and the outcome reaches the
agent as a request."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import AgentConfig, verify
from lanes.config import AboveNotional, Mode
from lanes.events import (
    ApprovalDecided,
    ApprovalRequested,
    BrokerReport,
    ModelCalled,
    OrderAccepted,
    OrderRejected,
    RequestQueued,
    RequestRejected,
    ToolCallMade,
)
from lanes.requests import Kind
from lanes.vocabulary import OrderIntent
from tests.lanes.harness import Bench, types


def bench(approval: Any = "always", **config: Any) -> Bench:
    b = Bench(AgentConfig(mode=Mode.FOLLOWUP, approval=approval, tools=("place_order",),
                          **config))
    b.send()
    return b


def buy(qty: float = 1.0, limit: float | None = None) -> OrderIntent:
    return OrderIntent(symbol="BTCUSD", side="buy", qty=qty,
                       order_type="market" if limit is None else "limit", limit_price=limit)


def approval_of(decisions: list[Any]) -> ApprovalRequested:
    asked = [d for d in decisions if isinstance(d, ApprovalRequested)]
    assert len(asked) == 1, types(decisions)
    return asked[0]


def test_an_order_waits_then_an_approval_lets_it_through_and_the_agent_hears_of_it() -> None:
    b = bench()
    asked = approval_of(b.finish(orders=(buy(),)))
    assert asked.order_id == asked.approval_id == f"{asked.run_id}-o1"
    assert b.state.orders == {} and list(b.state.approvals) == [asked.approval_id]
    decisions = b.control("approve", approvalId=asked.approval_id, reason="looks fine")
    assert types(decisions)[:3] == ["ControlApplied", "ApprovalDecided", "OrderAccepted"]
    decided = decisions[1]
    assert isinstance(decided, ApprovalDecided) and decided.approved
    assert decided.request.kind is Kind.APPROVAL_RESULT
    assert decided.request.payload["approved"] is True
    assert any(isinstance(d, RequestQueued) and d.request_id == decided.request.request_id
               for d in decisions) or b.state.active is not None
    assert list(b.state.orders) == [asked.order_id] and b.state.approvals == {}
    again = b.control("approve", approvalId=asked.approval_id)
    assert types(again) == ["RequestRejected"]
    assert isinstance(again[0], RequestRejected) and "no order waits" in again[0].reason


def test_the_rule_above_a_notional_reckons_with_the_limit_or_the_price_given() -> None:
    b = bench(AboveNotional(above_notional=10_000))
    decisions = b.finish(orders=(buy(0.1, limit=60_000), buy(1.0, limit=60_000), buy(1.0)),
                         prices={"BTCUSD": 5_000.0})
    assert types(decisions)[1:4] == ["OrderAccepted", "ApprovalRequested", "OrderAccepted"]
    asked = decisions[2]
    assert isinstance(asked, ApprovalRequested) and asked.notional == 60_000
    # no price known: it waits
    b.send()
    unknown = approval_of(b.finish(orders=(buy(1.0),)))
    assert unknown.notional is None
    # other symbols pass when the rule names some
    c = bench(AboveNotional(above_notional=1, symbols=("ETHUSD",)))
    assert "OrderAccepted" in types(c.finish(orders=(buy(5.0),)))


def test_a_rejection_an_expiry_and_a_stop_each_end_an_approval_once() -> None:
    b = bench(approval_timeout_ms=60_000)
    first = approval_of(b.finish(orders=(buy(),)))
    rejected = b.control("reject", approvalId=first.approval_id, reason="too big")
    assert types(rejected)[:2] == ["ControlApplied", "ApprovalDecided"]
    assert "OrderAccepted" not in types(rejected)
    b.send()
    second = approval_of(b.finish(orders=(buy(),)))
    expired = b.advance(60_000)
    ends = [d for d in expired if isinstance(d, ApprovalDecided)]
    assert [(d.approval_id, d.approved, d.by) for d in ends] == [
        (second.approval_id, False, "expired")]
    b.send()
    third = approval_of(b.finish(orders=(buy(),)))
    stopped = b.control("emergency_stop")
    ends = [d for d in stopped if isinstance(d, ApprovalDecided)]
    assert [(d.approval_id, d.approved) for d in ends] == [(third.approval_id, False)]
    assert "stopped" in ends[0].reason
    assert b.state.approvals == {} and b.state.orders == {}


def test_an_order_approved_later_still_meets_the_trading_gate_as_the_agent_is_then() -> None:
    b = bench()
    bought = approval_of(b.finish(orders=(buy(2.0),)))
    b.control("approve", approvalId=bought.approval_id)
    b.feed(BrokerReport(at=b.now, order_id=bought.order_id, status="filled", filled_qty=2.0,
                        price=60_000.0))
    b.control("pause")  # reduce-only from now on
    waiting = []
    for _ in range(2):  # two runs each sell the whole position: each passes the gate alone
        b.send()
        waiting.append(approval_of(b.finish(orders=(sell(2.0),))))
    assert "OrderAccepted" in types(b.control("approve", approvalId=waiting[0].approval_id))
    decisions = b.control("approve", approvalId=waiting[1].approval_id)
    rejected = next(d for d in decisions if isinstance(d, OrderRejected))
    assert "reducible position" in rejected.reason


def sell(qty: float) -> OrderIntent:
    return OrderIntent(symbol="BTCUSD", side="sell", qty=qty)


def test_a_tool_order_waits_and_the_step_says_so() -> None:
    b = bench()
    decisions = b.feed(ModelCalled(at=b.now, run_id=b.run_id, step=1, tool_calls=(
        ToolCallMade(call_id="t", name="place_order",
                     arguments={"symbol": "BTCUSD", "side": "buy", "qty": 1}),),
        prices={"BTCUSD": 1.0}))
    assert types(decisions) == ["StepDecided", "ApprovalRequested"]


ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("order"), st.integers(1, 3)),
    st.tuples(st.sampled_from(["approve", "reject"]), st.integers(0, 5)),
    st.tuples(st.sampled_from(["emergency_stop", "pause", "resume"]), st.none()),
    st.tuples(st.just("wait"), st.integers(1, 90_000)),
), max_size=30)


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_every_approval_ends_exactly_once_and_the_log_verifies(
        actions: list[tuple[str, Any]]) -> None:
    b = Bench(AgentConfig(mode=Mode.FOLLOWUP, approval="always", approval_timeout_ms=60_000))
    asked: list[str] = []
    for action, argument in actions:
        b.now += 5
        if action == "order":
            if b.state.active is None:
                b.send()
            if b.state.active is not None:
                decisions = b.finish(orders=tuple(buy() for _ in range(argument)))
                asked += [d.approval_id for d in decisions if isinstance(d, ApprovalRequested)]
        elif action in ("approve", "reject"):
            target = asked[argument] if argument < len(asked) else "ghost"
            b.control(action, approvalId=target)
        elif action == "wait":
            b.advance(argument)
        else:
            b.control(action)
    ended = [e.event.approval_id for e in b.log if isinstance(e.event, ApprovalDecided)]
    assert len(ended) == len(set(ended))  # never twice
    assert sorted([*ended, *b.state.approvals]) == sorted(asked)  # each ends, or still waits
    accepted = {e.event.order_id for e in b.log if isinstance(e.event, OrderAccepted)}
    approved = {e.event.approval_id for e in b.log
                if isinstance(e.event, ApprovalDecided) and e.event.approved}
    assert accepted <= approved
    assert verify(b.round_tripped()) is None
