"""Hook rules: crossings, green-candle runs and connector outages become requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.market.events import Candle, ConnectorStatus, Tick, parse_market_event
from gateway.market.hooks import (
    MAX_CONNECTORS,
    REDELIVERY_WINDOW,
    ConnectorDownRule,
    GreenCandlesRule,
    HookEngine,
    PriceCrossRule,
    request_id,
)
from lanes import AgentRequest, Kind, Priority

T0 = datetime(2026, 2, 17, 3, 10, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def tick(price: float, seconds: float, symbol: str = "BTCUSD") -> Tick:
    return Tick(symbol=symbol, price=price, at=at(seconds))


def candle(o: float, c: float, minute: int, symbol: str = "BTCUSD") -> Candle:
    return Candle(symbol=symbol, interval="1m", open=o, close=c, high=max(o, c) + 1,
                  low=min(o, c) - 1, volume=1.0, start=at(60 * minute))


def status(state: Any, seconds: float, connector: str = "binance") -> ConnectorStatus:
    return ConnectorStatus(connector=connector, status=state, detail=f"{state}!", at=at(seconds))


def cross(direction: Any = "both", level: float = 100.0, **extra: Any) -> PriceCrossRule:
    return PriceCrossRule(name="cross100", symbol="BTCUSD", level=level, direction=direction,
                          agents=("a1",), **extra)


def feed(engine: HookEngine, *events: Tick | Candle | ConnectorStatus) -> list[AgentRequest]:
    out: list[AgentRequest] = []
    for event in events:
        out += engine.on_event(event)
    return out


def test_no_fire_on_the_first_tick() -> None:
    engine = HookEngine([cross()])
    assert engine.on_event(tick(101, 0)) == []
    assert engine.on_event(tick(99, 1)) != []


@pytest.mark.parametrize(
    ("direction", "prices", "fired"),
    [
        ("up", [99, 101, 99, 100], ["up", "up"]),
        ("down", [99, 101, 99, 100, 99.5], ["down", "down"]),
        ("both", [99, 101, 99, 100], ["up", "down", "up"]),
        ("both", [100, 101, 102, 100, 100.5], []),  # at the level counts as above
        ("both", [98, 99, 99.9], []),
    ],
)
def test_crossings(direction: str, prices: list[float], fired: list[str]) -> None:
    engine = HookEngine([cross(direction)])
    requests = feed(engine, *(tick(p, n) for n, p in enumerate(prices)))
    assert [r.payload["direction"] for r in requests] == fired


def test_a_crossing_request() -> None:
    engine = HookEngine([cross("up", priority=Priority.HIGH)])
    [request] = feed(engine, tick(99.5, 0), tick(100.5, 1))
    assert request.kind is Kind.HOOK_TRIGGER and request.priority is Priority.HIGH
    assert request.agent_id == "a1" and request.source == "hook:cross100"
    assert request.created_at == at(1)
    assert request.dedupe_key == "cross100:BTCUSD:100.0:up:2026-02-17T03:10:01Z"
    assert request.request_id == request_id("a1", request.dedupe_key)
    assert request.request_id.startswith("hk_") and len(request.request_id) == 27
    assert request.payload == {
        "rule": "cross100", "symbol": "BTCUSD", "level": 100.0, "direction": "up",
        "price": 100.5, "previousPrice": 99.5, "at": "2026-02-17T03:10:01Z",
    }


def test_every_agent_of_a_rule_gets_a_request_with_its_own_id() -> None:
    rule = PriceCrossRule(name="c", symbol="BTCUSD", level=100, agents=("a1", "a2"))
    requests = feed(HookEngine([rule]), tick(99, 0), tick(101, 1))
    assert [r.agent_id for r in requests] == ["a1", "a2"]
    assert requests[0].dedupe_key == requests[1].dedupe_key
    assert requests[0].request_id != requests[1].request_id


def test_other_symbols_and_unwatched_events_are_ignored() -> None:
    engine = HookEngine([cross()])
    assert feed(engine, tick(99, 0, "ETHUSD"), tick(101, 1, "ETHUSD"), candle(2, 3, 0)) == []


def test_a_redelivered_tick_gives_the_same_request() -> None:
    engine = HookEngine([cross()])
    first = feed(engine, tick(99, 0), tick(101, 1))
    assert len(first) == 1
    again = engine.on_event(tick(101, 1))  # a retry of the same frame
    assert again == first
    later = feed(engine, tick(99, 2), tick(101, 3))  # genuinely new crossings
    assert len(later) == 2
    assert {r.dedupe_key for r in later}.isdisjoint({first[0].dedupe_key})
    assert len({r.request_id for r in first + later}) == 3
    assert engine.on_event(tick(101, 1)) == first  # an older redelivery still matches


def test_a_restarted_engine_derives_the_same_ids() -> None:
    ticks = [tick(p, n) for n, p in enumerate([99, 101, 98, 102])]
    one, two = feed(HookEngine([cross()]), *ticks), feed(HookEngine([cross()]), *ticks)
    assert [r.request_id for r in one] == [r.request_id for r in two] and len(one) == 3


def test_an_out_of_order_tick_is_ignored() -> None:
    engine = HookEngine([cross()])
    feed(engine, tick(99, 0), tick(99.5, 10))
    assert engine.on_event(tick(101, 5)) == []  # older than the last, never seen
    assert len(engine.on_event(tick(101, 11))) == 1  # from 99.5, not from 101


def test_tick_memory_is_bounded() -> None:
    engine = HookEngine([cross()])
    feed(engine, *(tick(99 + n % 3, n) for n in range(REDELIVERY_WINDOW * 3)))
    assert len(engine._ticks["BTCUSD"].recent) == REDELIVERY_WINDOW
    assert len(engine._ticks) == 1
    feed(engine, *(tick(5, n, f"S{n}") for n in range(100)))  # unwatched symbols: no state
    assert len(engine._ticks) == 1


def green_rule(count: int = 3) -> GreenCandlesRule:
    return GreenCandlesRule(name="green", symbol="BTCUSD", interval="1m", count=count,
                            agents=("a1",))


def test_a_run_of_green_candles_fires() -> None:
    engine = HookEngine([green_rule(3)])
    assert feed(engine, candle(10, 11, 0), candle(11, 12, 1)) == []
    [request] = engine.on_event(candle(12, 13, 2))
    assert request.dedupe_key == "green:BTCUSD:1m:2026-02-17T03:12:00Z"
    assert request.created_at == at(120) and request.kind is Kind.HOOK_TRIGGER
    assert request.payload["closes"] == [11, 12, 13]
    assert len(engine.on_event(candle(13, 14, 3))) == 1  # still three green in a row
    assert engine.on_event(candle(14, 13, 4)) == []  # red breaks the run
    assert feed(engine, candle(13, 14, 5), candle(14, 15, 6)) == []


def test_a_candle_update_replaces_the_latest_candle() -> None:
    engine = HookEngine([green_rule(2)])
    assert engine.on_event(candle(10, 11, 0)) == []
    assert engine.on_event(candle(11, 10.5, 1)) == []  # minute 1 red so far
    [request] = engine.on_event(candle(11, 11.5, 1))  # updated: now green
    assert request.payload["closes"] == [11, 11.5]
    assert engine.on_event(candle(11, 10, 1)) == []  # updated again: red
    assert engine.on_event(candle(10, 12, 2)) == []  # only one green after the red one
    assert len(engine._candles[("BTCUSD", "1m")]) == 3  # updates did not add candles


def test_a_redelivered_candle_gives_the_same_request() -> None:
    engine = HookEngine([green_rule(2)])
    first = feed(engine, candle(10, 11, 0), candle(11, 12, 1))
    assert len(first) == 1
    assert engine.on_event(candle(11, 12, 1)) == first
    feed(engine, candle(12, 11, 2))
    assert engine.on_event(candle(11, 12, 1)) == first  # older, held unchanged
    assert engine.on_event(candle(11, 13, 1)) == []  # older and different: stale


def test_candle_memory_is_bounded() -> None:
    engine = HookEngine([green_rule(2)])
    feed(engine, *(candle(10, 11, n) for n in range(REDELIVERY_WINDOW * 2)))
    assert len(engine._candles[("BTCUSD", "1m")]) == REDELIVERY_WINDOW + 2


def down_rule(connector: str = "*") -> ConnectorDownRule:
    return ConnectorDownRule(name="down", connector=connector, agents=("a1", "a2"))


def test_connector_down_fires_once_per_outage() -> None:
    engine = HookEngine([down_rule()])
    assert engine.on_event(status("up", 0)) == []
    alerts = engine.on_event(status("down", 1))
    assert [a.agent_id for a in alerts] == ["a1", "a2"]
    alert = alerts[0]
    assert alert.kind is Kind.SYSTEM_ALERT and alert.priority is Priority.HIGH
    assert alert.payload["code"] == "connector_down"
    assert alert.payload["connector"] == "binance" and alert.payload["detail"] == "down!"
    assert alert.source == "hook:down" and alert.created_at == at(1)
    assert engine.on_event(status("down", 2)) == []  # still down
    assert engine.on_event(status("degraded", 3)) == []
    assert len(engine.on_event(status("down", 4))) == 2  # a new outage
    assert engine.on_event(status("down", 1)) == alerts  # a redelivery: the same alert


def test_a_first_report_of_down_fires_and_a_named_connector_is_matched() -> None:
    engine = HookEngine([down_rule("kraken")])
    assert engine.on_event(status("down", 0, "binance")) == []
    assert len(engine.on_event(status("down", 0, "kraken"))) == 2


def test_an_out_of_order_status_is_ignored() -> None:
    engine = HookEngine([down_rule()])
    feed(engine, status("down", 10))
    assert engine.on_event(status("up", 5)) == []
    assert engine.on_event(status("down", 11)) == []  # still down: the old "up" was ignored


def test_connector_memory_is_bounded() -> None:
    engine = HookEngine([down_rule()])
    feed(engine, *(status("up", 0, f"c{n}") for n in range(MAX_CONNECTORS + 10)))
    assert len(engine._connectors) == MAX_CONNECTORS


def test_rules_are_validated() -> None:
    with pytest.raises(ValidationError, match="agents"):
        PriceCrossRule(name="x", symbol="BTCUSD", level=1, agents=())
    with pytest.raises(ValidationError, match="listed 2 times"):
        PriceCrossRule(name="x", symbol="BTCUSD", level=1, agents=("a", "a"))
    with pytest.raises(ValidationError, match="name"):
        PriceCrossRule(name="has space", symbol="BTCUSD", level=1, agents=("a",))
    with pytest.raises(ValueError, match="unique"):
        HookEngine([cross(), cross()])


def test_events_from_the_wire_drive_the_engine() -> None:
    engine = HookEngine([cross("up")])
    for price, second in [(99, "00"), (101, "01")]:
        event = parse_market_event(
            {"type": "tick", "symbol": "BTCUSD", "price": price,
             "at": f"2026-02-17T04:10:{second}+01:00"}
        )
        requests = engine.on_event(event)
    assert [r.dedupe_key for r in requests] == ["cross100:BTCUSD:100.0:up:2026-02-17T03:10:01Z"]
