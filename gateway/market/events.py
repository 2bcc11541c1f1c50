"""Market events on the wire: ticks, candles and connector status, validated strictly.

Feed clients send these on ``/ws/feed``; hook rules (`gateway.market.hooks`) turn them into
requests and the paper broker (`gateway.market.broker`) fills orders at their prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from lanes.requests import FieldError, InvalidRequest, Timestamp, WireModel

Symbol = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^\S+$")]
"""An instrument symbol such as ``BTCUSD``: 1 to 32 characters, no whitespace."""
Price = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite price above zero."""
Quantity = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite size or volume, zero or more."""
Interval = Literal["1m", "5m", "15m", "1h"]
"""Candle intervals the gateway understands."""

INTERVAL_MS: dict[str, int] = {"1m": 60_000, "5m": 300_000, "15m": 900_000, "1h": 3_600_000}
"""The length of each candle interval in milliseconds."""


class Tick(WireModel):
    """A trade (or quote) of ``symbol`` at ``price`` at time ``at``."""

    type: Literal["tick"] = "tick"
    symbol: Symbol
    price: Price
    size: Quantity = 0.0
    at: Timestamp


class Candle(WireModel):
    """An OHLCV bar of ``symbol`` over ``interval`` starting at ``start``.

    ``high`` and ``low`` are declared after ``open`` and ``close`` so that their checks
    (``high >= max(open, close)``, ``low <= min(open, close)``) name the offending field.
    """

    type: Literal["candle"] = "candle"
    symbol: Symbol
    interval: Interval
    open: Price
    close: Price
    high: Price
    low: Price
    volume: Quantity
    start: Timestamp

    @field_validator("high")
    @classmethod
    def _high_covers_body(cls, high: float, info: ValidationInfo) -> float:
        body = [info.data[k] for k in ("open", "close") if k in info.data]
        if body and high < max(body):
            raise ValueError(f"high {high} is below max(open, close) {max(body)}")
        return high

    @field_validator("low")
    @classmethod
    def _low_covers_body(cls, low: float, info: ValidationInfo) -> float:
        body = [info.data[k] for k in ("open", "close") if k in info.data]
        if body and low > min(body):
            raise ValueError(f"low {low} is above min(open, close) {min(body)}")
        if "high" in info.data and low > info.data["high"]:
            raise ValueError(f"low {low} is above high {info.data['high']}")
        return low

    @property
    def green(self) -> bool:
        """True when the candle closed above its open."""
        return self.close > self.open


class ConnectorStatus(WireModel):
    """A market-data or broker connector reports its health."""

    type: Literal["connector_status"] = "connector_status"
    connector: str = Field(min_length=1, max_length=64)
    status: Literal["up", "degraded", "down"]
    detail: str | None = Field(default=None, max_length=1_024)
    at: Timestamp


MarketEvent = Annotated[Tick | Candle | ConnectorStatus, Field(discriminator="type")]
"""Any market event; the ``type`` field says which."""

EVENT_TYPES = frozenset({"tick", "candle", "connector_status"})
_ADAPTER: TypeAdapter[MarketEvent] = TypeAdapter(MarketEvent)


def parse_market_event(data: Mapping[str, Any] | Any) -> MarketEvent:
    """Validate one wire market event; raise `InvalidRequest` naming each bad field."""
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as error:
        raise _invalid(error) from None


def _invalid(error: ValidationError) -> InvalidRequest:
    """Field-named errors with the union's tag dropped from each path (``price``, not
    ``tick.price``); a missing or unknown ``type`` is reported on ``type``."""
    errors = []
    for item in error.errors(include_url=False):
        loc = list(item["loc"])
        if loc and loc[0] in EVENT_TYPES:
            loc = loc[1:]
        message = item["msg"]
        if item["type"] in ("union_tag_not_found", "union_tag_invalid"):
            loc = ["type"]
            message = f"'type' must be one of {', '.join(sorted(EVENT_TYPES))}"
        elif item["type"] == "model_attributes_type":
            message = "a market event must be a JSON object"
        elif item["type"] == "extra_forbidden":
            message = "unknown field; remove it"
        elif item["type"] == "string_pattern_mismatch" and loc == ["symbol"]:
            message = "a symbol has no whitespace"
        message = message.removeprefix("Value error, ")
        field = ".".join(str(part) for part in loc) or "(event)"
        errors.append(FieldError(field, message))
    return InvalidRequest(errors)


def event_time(event: MarketEvent) -> datetime:
    """The event's own time: ``at`` for ticks and status, ``start`` for candles."""
    return event.start if isinstance(event, Candle) else event.at


def to_ms(at: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime (exact, no float rounding)."""
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000 + delta.microseconds // 1_000


def from_ms(ms: int) -> datetime:
    """The aware UTC datetime of ``ms`` milliseconds since the Unix epoch."""
    return datetime.fromtimestamp(ms // 1_000, UTC).replace(microsecond=(ms % 1_000) * 1_000)


def iso(at: datetime) -> str:
    """A canonical UTC ISO 8601 form (``...Z``): equal instants give equal strings."""
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
