"""Market events on the wire: strict validation with field-named errors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.market.events import (
    Candle,
    ConnectorStatus,
    Tick,
    event_time,
    from_ms,
    iso,
    parse_market_event,
    to_ms,
)
from lanes import InvalidRequest

AT = "2026-02-17T03:10:00Z"
CANDLE = {"type": "candle", "symbol": "BTCUSD", "interval": "5m", "open": 10, "high": 12,
          "low": 9, "close": 11, "volume": 3, "start": AT}


def fields(data: Any) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        parse_market_event(data)
    return {e.field: e.message for e in caught.value.errors}


def test_each_type_parses() -> None:
    tick = parse_market_event({"type": "tick", "symbol": "BTCUSD", "price": 64000.5, "at": AT})
    assert isinstance(tick, Tick) and tick.size == 0 and tick.at == datetime(
        2026, 2, 17, 3, 10, tzinfo=UTC)
    candle = parse_market_event(CANDLE)
    assert isinstance(candle, Candle) and candle.green and event_time(candle) == candle.start
    status = parse_market_event({"type": "connector_status", "connector": "binance",
                                 "status": "down", "at": AT})
    assert isinstance(status, ConnectorStatus) and status.detail is None


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"type": "tick", "symbol": "BTCUSD", "price": 0, "at": AT}, "price", "greater than 0"),
        ({"type": "tick", "symbol": "BTCUSD", "price": 1, "at": "2026-02-17T03:10:00"}, "at",
         "timezone"),
        ({"type": "tick", "symbol": "", "price": 1, "at": AT}, "symbol", "at least 1"),
        ({"type": "tick", "symbol": "X" * 33, "price": 1, "at": AT}, "symbol", "at most 32"),
        ({"type": "tick", "symbol": "BTC USD", "price": 1, "at": AT}, "symbol", "whitespace"),
        ({"type": "tick", "symbol": "B", "price": 1, "size": -1, "at": AT}, "size", "0"),
        ({"type": "tick", "symbol": "B", "price": float("inf"), "at": AT}, "price", "finite"),
        ({"type": "tick", "symbol": "B", "price": 1, "at": AT, "venue": "x"}, "venue",
         "unknown field"),
        ({"type": "trade", "symbol": "B"}, "type", "one of candle, connector_status, tick"),
        ({"symbol": "B"}, "type", "one of"),
        ([1, 2], "(event)", "JSON object"),
        ({**CANDLE, "interval": "2m"}, "interval", "'1m'"),
        ({**CANDLE, "high": 10.5}, "high", "below max(open, close)"),
        ({**CANDLE, "low": 10.5}, "low", "above min(open, close)"),
        ({**CANDLE, "volume": -1}, "volume", "0"),
        ({"type": "connector_status", "connector": "x", "status": "sideways", "at": AT},
         "status", "'up'"),
    ],
)
def test_errors_name_the_field(data: Any, field: str, words: str) -> None:
    found = fields(data)
    assert field in found, found
    assert words in found[field]


def test_time_helpers_are_exact() -> None:
    ms = 1_771_297_800_123
    assert to_ms(from_ms(ms)) == ms
    assert iso(from_ms(ms)) == "2026-02-17T03:10:00.123000Z"
    assert iso(datetime.fromisoformat("2026-02-17T04:10:00+01:00")) == AT
