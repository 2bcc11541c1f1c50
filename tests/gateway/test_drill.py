"""Drill-down from the log (`gateway.reads.drill`): an order's life with the input behind each
step, and a run in full (its prompt, tool steps and steers), found back through thousands of
later events; and over HTTP, what-if from a position, with its bad input refused."""

from __future__ import annotations

import pytest

from gateway.base.quarantine import PLAIN
from gateway.errors import BadFrame
from gateway.reads.drill import OrderLifeJson, RunDetailJson, order_life, run_detail
from gateway.reads.story import answer
from lanes import AgentConfig, AgentState, Entry, decide
from lanes.events import (
    BrokerReport,
    Input,
    ModelCalled,
    Outcome,
    RequestReceived,
    RunFinished,
    RunSteerability,
    ToolReturned,
    Usage,
)
from lanes.vocabulary import OrderIntent, ToolCallMade
from store import MemoryEventStore
from tests.gateway.support import control, request
from tests.gateway.test_replays import stored

T0 = 1_771_297_800_000
LATER = 2_500
"""Hook triggers after the order closed: the reads page back through them."""


def traded_log() -> tuple[list[Entry], dict[str, str]]:
    """alpha: a run that looks at the market with a tool, takes a steer, places an order that
    fills in two parts; then thousands of triggers. The ids of what a test looks for."""
    state = AgentState(agent_id="alpha")
    log: list[Entry] = []
    now = T0

    def feed(event: Input) -> None:
        decisions = decide(state, event)
        log.extend(Entry(len(log) + 1, "alpha", e) for e in (event, *decisions))

    from lanes.events import ConfigChanged
    feed(ConfigChanged(at=now, config=AgentConfig(tools=("market_snapshot", "place_order"))))
    hook = request("alpha", payload={"symbol": "BTCUSD"})
    feed(RequestReceived(at=now + 1, request=hook, principal="feeder"))
    run_id = state.active.run_id if state.active else "?"
    feed(RunSteerability(at=now + 2, run_id=run_id, steerable=True))
    steer = request("alpha", "user_control", payload={"message": "mind the spread"})
    feed(RequestReceived(at=now + 3, request=steer, principal="ops"))
    feed(ModelCalled(at=now + 4, run_id=run_id, step=1, input_tokens=500, output_tokens=40,
                     stop_reason="tool_use", text="Looking first.",
                     tool_calls=(ToolCallMade(call_id="c1", name="market_snapshot",
                                              arguments={"symbol": "BTCUSD"}),)))
    feed(ToolReturned(at=now + 5, run_id=run_id, step=1, call_id="c1", name="market_snapshot",
                      ok=True, content='{"price": 64000.5}'))
    feed(RunFinished(at=now + 6, run_id=run_id, outcome=Outcome.TRADE, usage=Usage(
        input_tokens=900, output_tokens=80), answer="Bought a quarter.",
        orders=(OrderIntent(symbol="BTCUSD", side="buy", qty=0.25),)))
    order_id = next(iter(state.orders))
    feed(BrokerReport(at=now + 7, order_id=order_id, status="partially_filled",
                      filled_qty=0.1, price=64_001.0))
    feed(RequestReceived(at=now + 8, request=control("alpha", "cancel_order", orderId=order_id),
                         principal="ops"))
    feed(BrokerReport(at=now + 9, order_id=order_id, status="filled", filled_qty=0.25,
                      price=64_002.0))
    for n in range(LATER):
        feed(RequestReceived(at=now + 10 + n, request=request("alpha", dedupeKey=f"k{n}")))
    return log, {"order": order_id, "run": run_id, "hook": hook.request_id,
                 "steer": steer.request_id}


@pytest.fixture
async def traded() -> tuple[MemoryEventStore, int, dict[str, str]]:
    log, ids = traded_log()
    return await stored(log), len(log), ids


async def test_an_orders_life_is_every_step_in_order_with_the_input_behind_it(
        traded: tuple[MemoryEventStore, int, dict[str, str]]) -> None:
    store, top, ids = traded
    life = answer(OrderLifeJson, await order_life(store, PLAIN, "alpha", ids["order"], top))
    assert life["runId"] == ids["run"] and life["status"] == "filled"
    assert life["intent"]["symbol"] == "BTCUSD" and life["placedAt"] == T0 + 6
    assert [s["stage"] for s in life["steps"]] == [
        "placed", "broker: partially filled", "filled", "cancel_order asked",
        "cancel requested", "broker: filled", "filled", "closed: filled"]
    placed, report, fill = life["steps"][:3]
    assert placed["cause"]["type"] == "RunFinished" and placed["at"] == T0 + 6
    assert report["cause"] is None and report["text"].startswith("BrokerReport ")
    assert fill["cause"]["position"] == report["position"] and fill["at"] == T0 + 7
    positions = [s["position"] for s in life["steps"]]
    assert positions == sorted(positions)


async def test_a_run_in_full_has_its_prompt_tool_steps_steers_answer_and_order(
        traded: tuple[MemoryEventStore, int, dict[str, str]]) -> None:
    store, top, ids = traded
    run = answer(RunDetailJson, await run_detail(store, PLAIN, "alpha", ids["run"], top))
    assert run["outcome"] == "trade" and run["answer"] == "Bought a quarter."
    assert run["startedAt"] == T0 + 1 and run["endedAt"] == T0 + 6
    [prompt] = run["prompt"]["requests"]
    assert prompt["requestId"] == ids["hook"] and prompt["principal"] == "feeder"
    assert '"symbol":"BTCUSD"' in run["prompt"]["text"]
    [step] = run["steps"]
    assert step["text"] == "Looking first." and step["steered"] == []
    [call] = step["toolCalls"]
    assert call["status"] == "returned" and call["result"] == '{"price": 64000.5}'
    assert call["arguments"] == {"symbol": "BTCUSD"}
    [steer] = run["steers"]
    assert steer["requestId"] == ids["steer"] and steer["payload"] == {"message": "mind the spread"}
    [order] = run["orders"]
    assert order["orderId"] == ids["order"] and order["status"] == "accepted"


async def test_what_is_not_in_the_log_is_not_found_with_the_reach_said(
        traded: tuple[MemoryEventStore, int, dict[str, str]]) -> None:
    store, top, _ = traded
    with pytest.raises(BadFrame, match="no order 'alpha-r9-o1' in the last") as refused:
        await order_life(store, PLAIN, "alpha", "alpha-r9-o1", top)
    assert refused.value.code == "not_found"
    with pytest.raises(BadFrame, match="no run 'alpha-r99'") as missing:
        await run_detail(store, PLAIN, "alpha", "alpha-r99", top)
    assert missing.value.code == "not_found"
