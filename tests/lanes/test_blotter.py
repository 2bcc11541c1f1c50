"""The blotter fold: orders, fills, cancels, rejections and positions from an agent's log."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import AgentConfig, Mode
from lanes.blotter import HISTORY, Blotter, Position
from lanes.events import BrokerReport, OrderFilled, OrderIntent
from tests.lanes.harness import Bench


def bench() -> Bench:
    return Bench(AgentConfig(mode=Mode.FOLLOWUP))


def blotter_of(b: Bench) -> Blotter:
    return Blotter().fold(entry.event for entry in b.log)


def trade(b: Bench, *orders: OrderIntent) -> None:
    """A request arrives, its run trades ``orders``."""
    b.send()
    b.finish(orders=orders)


def buy(qty: float, symbol: str = "BTCUSD", **more: Any) -> OrderIntent:
    return OrderIntent(symbol=symbol, side="buy", qty=qty, **more)


def sell(qty: float, symbol: str = "BTCUSD") -> OrderIntent:
    return OrderIntent(symbol=symbol, side="sell", qty=qty)


def report(b: Bench, order_id: str, status: str, qty: float = 0.0,
           price: float | None = None, reason: str | None = None) -> None:
    b.feed(BrokerReport(at=b.now, order_id=order_id, status=status,  # type: ignore[arg-type]
                        filled_qty=qty, price=price, reason=reason))


def test_an_accepted_order_is_open_with_its_terms_and_the_time_its_run_finished() -> None:
    b = bench()
    b.now += 5_000
    trade(b, buy(2.0, order_type="limit", limit_price=63_000.0))
    order = blotter_of(b).open["agent_btc_5m-r1-o1"]
    assert (order.symbol, order.side, order.qty, order.filled_qty) == ("BTCUSD", "buy", 2.0, 0.0)
    assert (order.order_type, order.limit_price, order.placed_at) == ("limit", 63_000.0, b.now)


def test_fills_move_the_position_and_the_order_closes_when_filled() -> None:
    b = bench()
    trade(b, buy(2.0))
    b.now += 1_000
    report(b, "agent_btc_5m-r1-o1", "partially_filled", 0.5, 100.0)
    report(b, "agent_btc_5m-r1-o1", "filled", 1.5, 104.0)
    blotter = blotter_of(b)
    assert blotter.open == {}
    assert [(f.qty, f.price, f.at) for f in blotter.fills] == [(0.5, 100.0, b.now),
                                                              (1.5, 104.0, b.now)]
    (closed,) = blotter.closed
    assert (closed.status, closed.filled_qty, closed.avg_price) == ("filled", 2.0, 103.0)
    position = blotter.positions["BTCUSD"]
    assert (position.net_qty, position.avg_price, position.bought_qty) == (2.0, 103.0, 2.0)


def test_a_gate_rejection_keeps_its_reason_and_opens_nothing() -> None:
    b = bench()
    b.control("pause")
    trade(b, buy(1.0, symbol="ETHUSD"))
    blotter = blotter_of(b)
    (rejection,) = blotter.rejections
    assert rejection.source == "gate" and rejection.order_id is None
    assert "only orders that reduce the ETHUSD position" in rejection.reason
    assert blotter.open == {} and blotter.positions == {}


def test_a_broker_rejection_closes_the_order_with_the_brokers_reason() -> None:
    b = bench()
    trade(b, sell(1.0))
    report(b, "agent_btc_5m-r1-o1", "rejected", reason="insufficient margin")
    (rejection,) = blotter_of(b).rejections
    assert (rejection.source, rejection.order_id, rejection.reason) == (
        "broker", "agent_btc_5m-r1-o1", "insufficient margin")


def test_a_cancel_says_who_asked_with_which_control_and_how_the_order_closed() -> None:
    b = bench()
    trade(b, buy(1.0), buy(2.0))
    b.now += 2_000
    request = b.make("user_control", payload={"action": "cancel_all"})
    b.submit(request)
    asked = b.now
    b.now += 500
    report(b, "agent_btc_5m-r1-o1", "cancelled")
    report(b, "agent_btc_5m-r1-o2", "filled", 2.0, 50.0)  # filled before the cancel got there
    blotter = blotter_of(b)
    first, second = blotter.cancels
    assert (first.cancel_request, first.cancel_action, first.cancel_at) == (
        request.request_id, "cancel_all", asked)
    assert (first.status, first.closed_at) == ("cancelled", b.now)
    assert second.status == "filled"


def test_a_cancel_names_the_principal_that_sent_it_when_the_log_has_one() -> None:
    from lanes.events import RequestReceived

    b = bench()
    trade(b, buy(1.0))
    request = b.make("user_control", payload={"action": "cancel_order",
                                              "orderId": "agent_btc_5m-r1-o1"})
    b.feed(RequestReceived(at=b.now, request=request, principal="ops"))
    (cancel,) = blotter_of(b).cancels
    assert (cancel.cancel_by, cancel.cancel_action) == ("ops", "cancel_order")


def test_a_cancel_nobody_asked_for_is_the_brokers() -> None:
    b = bench()
    trade(b, buy(1.0))
    report(b, "agent_btc_5m-r1-o1", "cancelled")
    (cancel,) = blotter_of(b).cancels
    assert cancel.cancel_by == "broker" and cancel.status == "cancelled"


def test_the_average_price_follows_the_position_through_flat_and_past_it() -> None:
    position = Position("BTCUSD")

    def after(signed: float, price: float | None) -> tuple[float, float | None]:
        position.apply(signed, price)
        return position.net_qty, position.avg_price

    assert after(1.0, 100.0) == (1.0, 100.0)
    assert after(1.0, 110.0) == (2.0, 105.0)
    assert after(-1.0, 200.0) == (1.0, 105.0)  # reducing keeps what the rest cost
    assert after(-3.0, 90.0) == (-2.0, 90.0)  # past flat: short 2 at 90
    assert after(2.0, 80.0) == (0.0, None)
    assert after(1.0, None) == (1.0, None)  # no price, no average
    assert (position.bought_qty, position.sold_qty, position.fills) == (5.0, 4.0, 6)


def test_histories_keep_the_newest_entries_only() -> None:
    blotter = Blotter()
    b = bench()
    trade(b, buy(1.0))
    blotter.fold(entry.event for entry in b.log)
    for n in range(HISTORY + 5):
        blotter.add(OrderFilled(order_id="agent_btc_5m-r1-o1", qty=0.001, price=float(n)))
    assert len(blotter.fills) == HISTORY and blotter.fills[-1].price == HISTORY + 4
    assert blotter.positions["BTCUSD"].fills == HISTORY + 5  # positions stay complete


steps = st.lists(st.one_of(
    st.tuples(st.just("trade"), st.lists(st.tuples(st.sampled_from(["buy", "sell"]),
                                                   st.sampled_from([0.1, 0.5, 1.0, 3.0]),
                                                   st.sampled_from(["BTCUSD", "ETHUSD"])),
                                         min_size=1, max_size=3)),
    st.tuples(st.just("fill"), st.tuples(st.integers(0, 5), st.sampled_from([0.1, 0.5, 1.0]),
                                         st.none() | st.sampled_from([90.0, 100.0, 125.5]))),
    st.tuples(st.just("close"), st.tuples(st.integers(0, 5),
                                          st.sampled_from(["filled", "cancelled", "rejected"]))),
    st.tuples(st.just("control"), st.sampled_from(["pause", "resume", "cancel_all",
                                                   "emergency_stop", "flatten"])),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(script=steps)
def test_positions_are_the_sum_of_signed_fills_and_agree_with_the_agents_state(
        script: list[tuple[str, Any]]) -> None:
    b = bench()
    for action, arg in script:
        b.now += 1_000
        orders = list(b.state.orders)
        if action == "trade":
            if b.state.active is None:
                b.send()
            if b.state.active is not None:
                b.finish(orders=tuple(OrderIntent(symbol=symbol, side=side, qty=qty)
                                      for side, qty, symbol in arg))
        elif action == "fill" and orders:
            index, qty, price = arg
            report(b, orders[index % len(orders)], "partially_filled", qty, price)
        elif action == "close" and orders:
            index, status = arg
            report(b, orders[index % len(orders)], status)
        elif action == "control":
            b.control(arg)
    blotter = blotter_of(b)
    assert set(blotter.open) == set(b.state.orders)
    for order_id, order in b.state.orders.items():
        assert blotter.open[order_id].filled_qty == order.filled_qty
    assert {s: p.net_qty for s, p in blotter.positions.items()} == b.state.positions
    for symbol, position in blotter.positions.items():
        signed = sum(f.qty if f.side == "buy" else -f.qty for f in blotter.fills
                     if f.symbol == symbol)
        assert abs(position.net_qty - signed) < 1e-9
        assert abs(position.bought_qty - position.sold_qty - position.net_qty) < 1e-9
        assert len([f for f in blotter.fills if f.symbol == symbol]) == position.fills
