"""The operator's flatten on the control lane: one closing market order per symbol held,
decided even while HALTED, marked as the operator's, and reproduced by replay and verify."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import AgentConfig, Mode, replay, verify
from lanes.blotter import Blotter
from lanes.codec import decode, encode
from lanes.events import (
    BrokerReport,
    ControlApplied,
    OrderAccepted,
    OrderCancelRequested,
    OrderIntent,
    RequestRejected,
    TradingState,
)
from lanes.flatten import FLAT, NOTHING, closing_orders
from tests.lanes.harness import Bench, types


def bench() -> Bench:
    return Bench(AgentConfig(mode=Mode.FOLLOWUP))


def trade(b: Bench, *orders: OrderIntent) -> list[str]:
    """A run places ``orders``; their ids."""
    b.send()
    decisions = b.finish(orders=orders)
    return [d.order_id for d in decisions if isinstance(d, OrderAccepted)]


def fill(b: Bench, order_id: str, qty: float, price: float = 100.0,
         status: str = "filled") -> None:
    b.feed(BrokerReport(at=b.now, order_id=order_id, status=status,  # type: ignore[arg-type]
                        filled_qty=qty, price=price))


def intent(side: str, qty: float, symbol: str = "BTCUSD") -> OrderIntent:
    return OrderIntent(symbol=symbol, side=side, qty=qty)  # type: ignore[arg-type]


def long_btc_short_eth(b: Bench) -> str:
    """Long 2 BTCUSD, short 1.5 ETHUSD, and a BTCUSD buy of 1 left open (its id)."""
    bought, sold, resting = trade(b, intent("buy", 2), intent("sell", 1.5, "ETHUSD"),
                                  intent("buy", 1))
    fill(b, bought, 2)
    fill(b, sold, 1.5)
    return resting


def test_a_halted_agent_is_flattened_with_one_closing_order_per_symbol() -> None:
    b = bench()
    long_btc_short_eth(b)
    b.control("emergency_stop")
    assert b.state.trading is TradingState.HALTED
    decisions = b.control("flatten")
    request_id = b.log[-len(decisions) - 1].event.request.request_id  # type: ignore[union-attr]
    applied, *orders = decisions
    assert applied == ControlApplied(request_id=request_id, action="flatten",  # type: ignore[arg-type]
                                     from_state=TradingState.HALTED,
                                     to_state=TradingState.HALTED)
    # The stop already asked to cancel the open order: the flatten does not ask again.
    assert types(orders) == ["OrderAccepted", "OrderAccepted"]
    assert [(o.intent.symbol, o.intent.side, o.intent.qty, o.intent.order_type, o.run_id, o.by)
            for o in orders if isinstance(o, OrderAccepted)] == [
        ("BTCUSD", "sell", 2.0, "market", "", request_id),
        ("ETHUSD", "buy", 1.5, "market", "", request_id)]
    assert b.state.trading is TradingState.HALTED


def test_a_flatten_alone_cancels_open_orders_and_keeps_the_trading_state() -> None:
    b = bench()
    resting = long_btc_short_eth(b)
    decisions = b.control("flatten")
    assert types(decisions) == ["ControlApplied", "OrderCancelRequested", "OrderAccepted",
                                "OrderAccepted"]
    cancel = decisions[1]
    assert isinstance(cancel, OrderCancelRequested) and cancel.order_id == resting
    assert b.state.trading is TradingState.ACTIVE


def test_flatten_orders_filled_close_every_position() -> None:
    b = bench()
    long_btc_short_eth(b)
    b.control("emergency_stop")
    for order in b.control("flatten"):
        if isinstance(order, OrderAccepted):
            fill(b, order.order_id, order.intent.qty)
    assert all(abs(net) <= FLAT for net in b.state.positions.values())


def test_a_flatten_with_nothing_to_do_is_refused_and_says_so() -> None:
    b = bench()
    [rejected] = b.control("flatten")
    assert isinstance(rejected, RequestRejected) and rejected.reason == NOTHING
    assert b.state.orders == {} and b.state.trading is TradingState.ACTIVE


def test_a_second_flatten_places_orders_with_new_ids() -> None:
    b = bench()
    long_btc_short_eth(b)
    b.control("emergency_stop")
    first = [d.order_id for d in b.control("flatten") if isinstance(d, OrderAccepted)]
    second = b.control("flatten")  # (the first's orders are still open: cancelled, replaced)
    assert types(second)[:3] == ["ControlApplied", "OrderCancelRequested",
                                 "OrderCancelRequested"]
    again = [d.order_id for d in second if isinstance(d, OrderAccepted)]
    assert len(again) == 2 and not set(first) & set(again)


def test_the_blotter_marks_flatten_orders_as_the_operators() -> None:
    b = bench()
    long_btc_short_eth(b)
    [applied, *_] = b.control("flatten")
    assert isinstance(applied, ControlApplied)
    blotter = Blotter().fold(entry.event for entry in b.log)
    flatten = [o for o in blotter.open.values() if o.flatten_by is not None]
    assert [(o.symbol, o.side, o.run_id) for o in flatten] == [("BTCUSD", "sell", ""),
                                                               ("ETHUSD", "buy", "")]
    # (the bench's requests have no principal: the request's id stands for it)
    assert {o.flatten_by for o in flatten} == {applied.request_id}
    assert all(o.flatten_by is None for o in blotter.open.values() if o.run_id)


def test_an_order_of_a_run_is_stored_as_before_and_a_flatten_order_reads_back() -> None:
    run_order = OrderAccepted(order_id="a-r1-o1", run_id="a-r1", intent=intent("buy", 1))
    assert '"by"' not in encode(run_order)[1]
    flatten = OrderAccepted(order_id="a-flat9-1", run_id="", intent=intent("sell", 1), by="c1")
    assert decode(*encode(flatten)) == flatten


def test_closing_orders_skip_flat_positions_and_go_in_symbol_order() -> None:
    assert closing_orders({"Z": -1.0, "A": 2.5, "M": 1e-12}) == [
        intent("sell", 2.5, "A"), intent("buy", 1.0, "Z")]


steps = st.lists(st.one_of(
    st.tuples(st.just("trade"), st.lists(st.tuples(st.sampled_from(["buy", "sell"]),
                                                   st.sampled_from([0.1, 0.5, 1.0, 3.0]),
                                                   st.sampled_from(["BTCUSD", "ETHUSD", "SOL"])),
                                         min_size=1, max_size=3)),
    st.tuples(st.just("fill"), st.tuples(st.integers(0, 5), st.sampled_from([0.1, 0.5, 1.0]))),
    st.tuples(st.just("close"), st.tuples(st.integers(0, 5),
                                          st.sampled_from(["filled", "cancelled"]))),
    st.tuples(st.just("control"), st.sampled_from(["pause", "resume", "emergency_stop",
                                                   "flatten"])),
), max_size=30)


@settings(max_examples=150, deadline=None)
@given(script=steps, stop=st.booleans())
def test_flatten_orders_exactly_close_every_position_and_replay_and_verify_reproduce_them(
        script: list[tuple[str, Any]], stop: bool) -> None:
    b = bench()
    for action, arg in script:
        b.now += 1_000
        orders = list(b.state.orders)
        if action == "trade":
            if b.state.active is None:
                b.send()
            if b.state.active is not None:
                b.finish(orders=tuple(intent(side, qty, symbol) for side, qty, symbol in arg))
        elif action == "fill" and orders:
            index, qty = arg
            open_order = b.state.orders[orders[index % len(orders)]]
            fill(b, open_order.order_id, min(qty, open_order.intent.qty - open_order.filled_qty),
                 status="partially_filled")
        elif action == "close" and orders:
            index, status = arg
            fill(b, orders[index % len(orders)], 0.0, status=status)
        elif action == "control":
            b.control(arg)
    b.now += 1_000
    if stop:
        b.control("emergency_stop")
    held = dict(b.state.positions)
    decisions = b.control("flatten")
    placed = [d for d in decisions if isinstance(d, OrderAccepted)]
    # One order per symbol not flat, on the opposite side, for the whole position.
    assert {o.intent.symbol: o.intent.qty if o.intent.side == "buy" else -o.intent.qty
            for o in placed} == {s: -net for s, net in held.items() if abs(net) > FLAT}
    assert all(o.intent.order_type == "market" and o.by is not None and o.run_id == ""
               for o in placed)
    if stop:
        assert b.state.trading is TradingState.HALTED
    # Every order the agent had open is cancelled; filled, the flatten leaves it flat.
    assert all(o.cancel_requested for o in b.state.orders.values()
               if o.order_id not in {p.order_id for p in placed})
    for order in placed:
        fill(b, order.order_id, order.intent.qty)
    for order_id in [o for o in b.state.orders if b.state.orders[o].cancel_requested]:
        fill(b, order_id, 0.0, status="cancelled")
    assert all(abs(net) <= FLAT for net in b.state.positions.values())
    assert not b.state.orders
    log = b.round_tripped()
    assert replay(log)[b.agent] == b.state
    assert verify(log) is None
