"""Prices in the server's own words are rounded to the symbol's tick (`gateway.market.prices`),
and money to the cent: in the story (HTTP and MCP), the CLI timeline, the drill-down, the
alerts and the agents' tool answers, a fill at 101.23456789 with a tick of 0.01 reads 101.23."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.base.quarantine import PLAIN as READER
from gateway.cli import main
from gateway.market.prices import PriceWords, money_text, price_text, tick_decimals
from gateway.reads.alerts import alert_of
from gateway.reads.drill import order_life
from gateway.reads.stories import Stories
from gateway.tools.timeline import story
from lanes import AgentConfig, AgentState, Entry, decide
from lanes.codec import encode
from lanes.events import (
    ApprovalRequested,
    BrokerReport,
    ConfigChanged,
    Input,
    Outcome,
    RequestReceived,
    RunFinished,
)
from lanes.vocabulary import OrderIntent
from store import RecordedEvent, SqliteEventStore
from tests.gateway.support import request
from tests.gateway.test_replays import records_of, stored

T0 = 1_771_297_800_000
RAW = 101.23456789
"""A price as a broker may report it: more digits than the symbol's tick has."""
TICKS = PriceWords(ticks={"ACME": 0.01, "BTCUSD": 0.5})
LATER = 30
"""Inputs after the fill, so that a story read around them does not hold the order."""


# ------------------------------------------------------------------------ the one helper


@pytest.mark.parametrize(("value", "tick", "said"), [
    (RAW, 0.01, "101.23"),
    (RAW, 0.05, "101.25"),
    (64_123.456, 0.5, "64,123.5"),
    (64_123.25, 0.5, "64,123.5"),  # (halves away from zero)
    (100.25, 0.25, "100.25"),
    (1.084_25, 0.0001, "1.0843"),
    (1_234_567.5, 5, "1,234,570"),
    (0.000_000_34, 1e-7, "0.0000003"),
])
def test_a_price_is_rounded_to_whole_ticks_with_the_ticks_decimals(
        value: float, tick: float, said: str) -> None:
    assert price_text(value, tick) == said


def test_money_is_to_the_cent() -> None:
    assert money_text(12_345.675) == "12,345.68"
    assert money_text(-0.005) == "-0.01"
    assert money_text(3) == "3.00"


@given(st.floats(min_value=1e-6, max_value=1e9),
       st.sampled_from([0.5, 0.25, 0.1, 0.05, 0.01, 0.001, 0.0001, 1.0, 5.0]))
def test_a_worded_price_is_a_whole_number_of_ticks_within_half_a_tick(
        value: float, tick: float) -> None:
    said = Decimal(price_text(value, tick).replace(",", ""))
    step = Decimal(repr(tick))
    assert said % step == 0
    assert abs(said - Decimal(repr(value))) <= step / 2
    assert -said.as_tuple().exponent == tick_decimals(tick)  # type: ignore[operator]


# ----------------------------------------------------------------- a fill, in every text


def filled_log(limit: float | None = None) -> tuple[list[Entry], str]:
    """alpha: a run buys 2 ACME (at a limit, if given), filled at `RAW`; then `LATER` hook
    triggers. The order's id."""
    state = AgentState(agent_id="alpha")
    log: list[Entry] = []

    def feed(event: Input) -> None:
        log.extend(Entry(len(log) + 1, "alpha", e) for e in (event, *decide(state, event)))

    feed(ConfigChanged(at=T0, config=AgentConfig()))
    feed(RequestReceived(at=T0 + 1, request=request("alpha"), principal="feeder"))
    run_id = state.active.run_id if state.active else "?"
    intent = OrderIntent(symbol="ACME", side="buy", qty=2, order_type="market"
                         if limit is None else "limit", limit_price=limit)
    feed(RunFinished(at=T0 + 2, run_id=run_id, outcome=Outcome.TRADE, orders=(intent,)))
    order_id = next(iter(state.orders))
    feed(BrokerReport(at=T0 + 3, order_id=order_id, status="filled", filled_qty=2, price=RAW))
    for n in range(LATER):
        feed(RequestReceived(at=T0 + 10 + n, request=request("alpha", dedupeKey=f"k{n}")))
    return log, order_id


def texts(groups: list[object]) -> str:
    return "\n".join(f"{g.text}\n" + "\n".join(s.text for s in g.decisions)  # type: ignore[attr-defined]
                     for g in groups)


def test_the_story_words_a_fill_and_a_limit_to_the_symbols_tick() -> None:
    log, order_id = filled_log(limit=RAW)
    told = texts(list(story(log, TICKS)))
    assert f"OrderFilled {order_id}: 2 at 101.23\n" in told
    assert f"{order_id} filled, 2 filled at 101.23\n" in told  # the broker's report
    assert "buy 2 ACME limit at 101.23\n" in told  # (the run's order)
    assert re.findall(r"101\.\d+", told) == ["101.23"] * 3  # (placed, reported, filled)


async def test_the_servers_story_words_a_fill_whose_order_it_does_not_show() -> None:
    log, order_id = filled_log()
    store = await stored(log)
    stories = Stories()
    index = await stories.index(store, READER, "alpha")
    fill = next(e.position for e in log if type(e.event).__name__ == "OrderFilled")
    first, end, _ = index.around(fill, 0)  # (the broker's report alone: no order placed)
    words = PriceWords(ticks={"ACME": 0.05})
    told = texts(list(await stories.groups(store, index, "alpha", first, end, words)))
    assert "OrderAccepted" not in told
    assert f"OrderFilled {order_id}: 2 at 101.25\n" in told + "\n"  # ACME's tick, not 0.01's


async def test_the_drill_down_words_a_fill_to_the_symbols_tick() -> None:
    log, order_id = filled_log()
    store = await stored(log)
    life = await order_life(store, READER, "alpha", order_id, len(log), TICKS)
    said = "\n".join(step["text"] for step in life["steps"])
    assert f"OrderFilled {order_id}: 2 at 101.23\n" in said
    assert re.findall(r"101\.\d+", said) == ["101.23", "101.23"]  # (reported, filled)


def test_the_cli_timeline_words_prices_to_the_configs_ticks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, order_id = filled_log()
    db = tmp_path / "events.db"

    async def write() -> None:
        store = SqliteEventStore(db)
        await store.open()
        await store.restore(records_of(log, {}))
        await store.close()

    asyncio.run(write())
    config = tmp_path / "gateway.toml"
    config.write_text('[market]\ntick = 0.01\n[[market.symbols]]\nsymbol = "ACME"\n'
                      'tick = 0.05\n')
    assert main(["timeline", str(db), "--agent", "alpha"]) == 0
    plain = capsys.readouterr().out
    assert f"OrderFilled {order_id}: 2 at 101.23\n" in plain
    assert main(["timeline", str(db), "--agent", "alpha", "--config", str(config)]) == 0
    ticked = capsys.readouterr().out
    assert f"OrderFilled {order_id}: 2 at 101.25\n" in ticked
    assert set(re.findall(r"101\.\d+", plain + ticked)) == {"101.23", "101.25"}
    config.write_text("[market]\ntick = -1\n")
    assert main(["timeline", str(db), "--agent", "alpha", "--config", str(config)]) == 2
    assert "market.tick" in capsys.readouterr().err


def test_an_approval_alert_words_its_limit_to_the_tick_and_its_notional_to_the_cent() -> None:
    intent = OrderIntent(symbol="BTCUSD", side="buy", qty=0.3, order_type="limit",
                         limit_price=64_123.456)
    kind, data = encode(ApprovalRequested(approval_id="a1", run_id="r1", order_id="o1",
                                          intent=intent, notional=19_237.0368, expires_at=0))
    record = RecordedEvent(position=7, stream="alpha", version=3, event_id="e7", type=kind,
                           data=data, recorded_at=T0)
    alert = alert_of(record, TICKS)
    assert alert is not None
    assert alert.text == ("alpha: order buy 0.3 BTCUSD limit at 64,123.5 (notional 19,237.04) "
                          "waits for approval a1")


def test_the_symbols_of_orders_are_remembered_up_to_a_bound() -> None:
    words = PriceWords(orders=OrderedDict())
    for n in range(50_001):
        words.note(f"o{n}", "ACME")
    assert "o0" not in words.orders and words.orders["o50000"] == "ACME"
