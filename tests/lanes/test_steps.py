"""A run's steps in the pure core: model calls and tool calls as inputs, the agent's rules
applied to each tool call, orders through the trading gate, and logs that verify."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import AgentConfig, verify
from lanes.config import Mode
from lanes.decide_steps import order_id
from lanes.events import (
    BrokerReport,
    ControlApplied,
    ModelCalled,
    OrderAccepted,
    OrderCancelRequested,
    OrderRejected,
    RunResultIgnored,
    StepDecided,
    ToolCallMade,
    ToolReturned,
    TradingState,
)
from tests.lanes.harness import Bench, types

TOOLS = ("market_snapshot", "positions", "place_order", "cancel_order")


def busy(**config: Any) -> Bench:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, tools=TOOLS, **config))
    bench.send()
    assert bench.state.active is not None
    return bench


def call(name: str, call_id: str = "c1", **arguments: Any) -> ToolCallMade:
    return ToolCallMade(call_id=call_id, name=name, arguments=arguments)


def step(bench: Bench, number: int, *calls: ToolCallMade, run_id: str | None = None
         ) -> list[Any]:
    return bench.feed(ModelCalled(at=bench.now, run_id=run_id or bench.run_id, step=number,
                                  input_tokens=100, output_tokens=10, stop_reason="tool_use",
                                  tool_calls=calls))


def buy(qty: float = 1.0, call_id: str = "c1") -> ToolCallMade:
    return call("place_order", call_id, symbol="BTCUSD", side="buy", qty=qty)


def test_a_step_allows_the_agents_tools_and_refuses_the_rest_with_a_reason() -> None:
    bench = busy()
    decisions = step(bench, 1, call("market_snapshot", "a", symbol="BTCUSD"),
                     call("candles", "b", symbol="BTCUSD", interval="1m"),
                     call("rm_rf", "c"), call("market_snapshot", "d", ticker="BTC"),
                     ToolCallMade(call_id="e", name="positions", malformed="{oops"))
    assert types(decisions) == ["StepDecided"]
    decided = decisions[0]
    assert isinstance(decided, StepDecided) and decided.allowed == ("a",)
    errors = {r.call_id: r.error for r in decided.refused}
    assert "not one of this agent's tools" in errors["b"]
    assert "'rm_rf' does not exist" in errors["c"]
    assert "market_snapshot: " in errors["d"] and "ticker" in errors["d"]
    assert "not a JSON object" in errors["e"]
    assert bench.state.active is not None and bench.state.active.steps == 1


def test_orders_from_a_step_go_through_the_trading_gate_at_once() -> None:
    bench = busy()
    decisions = step(bench, 1, buy(2.0, "a"), buy(1.0, "b"))
    assert types(decisions) == ["StepDecided", "OrderAccepted", "OrderAccepted"]
    first = decisions[1]
    assert isinstance(first, OrderAccepted)
    assert first.order_id == order_id(bench.run_id, 1, 1) == f"{bench.run_id}-s1-1"
    bench.feed(BrokerReport(at=bench.now, order_id=first.order_id, status="filled",
                            filled_qty=2.0, price=64_000.0))
    bench.control("pause")
    decisions = step(bench, 2, buy(1.0, "c"), call("cancel_order", "d", orderId="nope"),
                     call("cancel_order", "e", orderId=f"{bench.run_id}-s1-2"))
    assert types(decisions) == ["StepDecided", "OrderRejected", "OrderCancelRequested"]
    rejected, cancel = decisions[1], decisions[2]
    assert isinstance(rejected, OrderRejected) and "REDUCING" in rejected.reason
    assert isinstance(cancel, OrderCancelRequested)
    decided = decisions[0]
    assert isinstance(decided, StepDecided) and decided.allowed == ("c", "e")
    assert "no open order 'nope'" in decided.refused[0].error


def test_no_step_of_a_stopped_run_places_anything() -> None:
    bench = busy()
    run_id = bench.run_id
    bench.control("emergency_stop")
    decisions = step(bench, 1, buy(), run_id=run_id)
    assert types(decisions) == ["RunResultIgnored"]
    result = bench.feed(ToolReturned(at=bench.now, run_id=run_id, step=1, call_id="c1",
                                     name="place_order", ok=True, content="x"))
    assert types(result) == ["RunResultIgnored"]
    assert bench.state.orders == {}


def test_steps_come_in_order_and_the_budget_is_kept() -> None:
    bench = busy(max_steps=2)
    assert types(step(bench, 2, buy())) == ["RunResultIgnored"]
    step(bench, 1)
    assert types(step(bench, 1)) == ["RunResultIgnored"]
    step(bench, 2)
    decided = step(bench, 3, buy())
    assert types(decided) == ["StepDecided"]
    assert isinstance(decided[0], StepDecided)
    assert "step budget (2 model calls) is spent" in decided[0].refused[0].error
    assert bench.state.orders == {}


def test_a_tool_result_is_taken_into_the_active_run() -> None:
    bench = busy()
    step(bench, 1, call("positions"))
    taken = bench.feed(ToolReturned(at=bench.now, run_id=bench.run_id, step=1, call_id="c1",
                                    name="positions", ok=True, content="{}", size=2))
    assert types(taken) == ["ToolResultTaken"]
    assert not any(isinstance(d, RunResultIgnored) for d in taken)


TOOL_CALLS = st.one_of(
    st.builds(lambda q, i: buy(q, f"b{i}"), st.sampled_from([0.5, 1.0, 2.0]), st.integers(0, 9)),
    st.builds(lambda i: call("positions", f"p{i}"), st.integers(0, 9)),
    st.builds(lambda i, o: call("cancel_order", f"x{i}", orderId=o), st.integers(0, 9),
              st.sampled_from(["r1-s1-1", "nope"])),
    st.builds(lambda i: call("candles", f"k{i}", symbol="B", interval="1m"), st.integers(0, 9)),
)
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("step"), st.lists(TOOL_CALLS, max_size=3)),
    st.tuples(st.just("control"), st.sampled_from(["emergency_stop", "pause", "resume"])),
    st.tuples(st.just("result"), st.booleans()),
    st.tuples(st.just("finish"), st.none()),
    st.tuples(st.just("send"), st.none()),
), max_size=25)


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_any_run_of_steps_verifies_and_nothing_is_ordered_while_halted(
        actions: list[tuple[str, Any]]) -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, tools=TOOLS, max_steps=4))
    bench.send()
    last: tuple[str, int] | None = None  # the latest run seen, and its steps
    for action, argument in actions:
        bench.now += 10
        run = bench.state.active
        if run is not None:
            last = run.run_id, run.steps
        if action == "step" and last is not None:
            # (the run's next step, or, once it ended, a late step of it)
            step(bench, last[1] + 1, *argument, run_id=last[0])
        elif action == "control":
            bench.control(argument)
        elif action == "result" and run is not None and run.steps:
            bench.feed(ToolReturned(at=bench.now, run_id=run.run_id, step=run.steps,
                                    call_id="p0", name="positions", ok=argument))
        elif action == "finish" and run is not None:
            bench.finish()
        elif action == "send":
            bench.send()
    accepted = [e.event for e in bench.log if isinstance(e.event, OrderAccepted)]
    assert len({o.order_id for o in accepted}) == len(accepted)
    halted = False
    for entry in bench.log:
        if isinstance(entry.event, ControlApplied):
            halted = entry.event.to_state is TradingState.HALTED
        assert not (halted and isinstance(entry.event, OrderAccepted)), "an order while halted"
    assert verify(bench.round_tripped()) is None
