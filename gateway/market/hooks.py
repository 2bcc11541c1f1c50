"""Hook rules: market events in, ``hook_trigger`` (and ``system_alert``) requests out.

Deterministic, no clock and no I/O: a request's time is its event's time, and its
``requestId`` is derived from its ``dedupeKey`` and agent, so a feed event delivered twice
(a retry after ``busy``, a reconnect, a restart of the gateway) yields the very same
request, which the agent's lane recognises as a repeat. A genuinely new crossing, candle
or outage has a new key.

State stays bounded: per watched symbol the last price and a short memo of recent ticks
(to recognise redeliveries), per watched symbol and interval the last few candles, and
the status of at most `MAX_CONNECTORS` connectors.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from gateway.market.events import (
    Candle,
    ConnectorStatus,
    Interval,
    MarketEvent,
    Price,
    Symbol,
    Tick,
    iso,
)
from lanes.requests import AGENT_ID_PATTERN, AgentRequest, Kind, Priority, WireModel

REDELIVERY_WINDOW = 128
"""How many recent ticks (per symbol) and candles (per symbol and interval) are remembered
so that a redelivered one gives the same requests again instead of being dropped."""
MAX_CONNECTORS = 1_024
"""Connectors whose status is tracked at most (least recently reported forgotten first)."""

RuleName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
"""A rule's name: short, no spaces or colons (it is part of every dedupe key)."""
AgentId = Annotated[str, Field(pattern=AGENT_ID_PATTERN)]


def _unique(agents: tuple[str, ...]) -> tuple[str, ...]:
    for agent, count in _counts(agents).items():
        if count > 1:
            raise ValueError(f"agent {agent!r} is listed {count} times")
    return agents


Agents = Annotated[tuple[AgentId, ...], Field(min_length=1), AfterValidator(_unique)]


def _counts(items: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


class PriceCrossRule(WireModel):
    """Fires when consecutive ticks of ``symbol`` cross ``level`` in ``direction``.

    A price at the level counts as above it: going from below to at-or-above is an ``up``
    crossing, from at-or-above to below a ``down`` one. The first tick only sets the price.
    """

    kind: Literal["price_cross"] = "price_cross"
    name: RuleName
    symbol: Symbol
    level: Price
    direction: Literal["up", "down", "both"] = "both"
    agents: Agents
    priority: Priority = Priority.NORMAL


class GreenCandlesRule(WireModel):
    """Fires when the last ``count`` candles of ``symbol`` and ``interval`` are all green.

    A candle with the same start as the latest one is an update and replaces it.
    """

    kind: Literal["green_candles"] = "green_candles"
    name: RuleName
    symbol: Symbol
    interval: Interval
    count: int = Field(default=2, ge=1, le=100)
    agents: Agents
    priority: Priority = Priority.NORMAL


class ConnectorDownRule(WireModel):
    """Sends a ``system_alert`` (code ``connector_down``) when a connector goes down.

    ``connector = "*"`` watches every connector. It fires on the transition to ``down``
    only, not again while the connector stays down.
    """

    kind: Literal["connector_down"] = "connector_down"
    name: RuleName
    connector: str = Field(min_length=1, max_length=64)
    agents: Agents
    priority: Priority = Priority.HIGH


HookRule = Annotated[
    PriceCrossRule | GreenCandlesRule | ConnectorDownRule, Field(discriminator="kind")
]
"""Any hook rule; the ``kind`` field says which."""

HOOK_KINDS = frozenset({"price_cross", "green_candles", "connector_down"})


def request_id(agent_id: str, dedupe_key: str) -> str:
    """The deterministic requestId of a hook request for ``agent_id`` with ``dedupe_key``."""
    return "hk_" + hashlib.sha256(f"{agent_id}|{dedupe_key}".encode()).hexdigest()[:24]


@dataclass(slots=True)
class _TickTrack:
    last_price: float | None = None
    last_at: datetime | None = None
    recent: OrderedDict[tuple[datetime, float], float | None] = field(default_factory=OrderedDict)
    """(at, price) of recent ticks -> the price before each (None for the first)."""


@dataclass(slots=True)
class _ConnectorTrack:
    status: str
    last_at: datetime
    downs: deque[datetime] = field(default_factory=lambda: deque(maxlen=16))
    """When the connector recently went down (redeliveries of those fire again)."""


class HookEngine:
    """Turns market events into requests according to ``rules`` (names must be unique)."""

    def __init__(
        self, rules: Iterable[PriceCrossRule | GreenCandlesRule | ConnectorDownRule]
    ) -> None:
        self.rules = tuple(rules)
        duplicates = [name for name, n in _counts(r.name for r in self.rules).items() if n > 1]
        if duplicates:
            raise ValueError(f"hook rule names must be unique; repeated: {', '.join(duplicates)}")
        self._cross: dict[str, list[PriceCrossRule]] = {}
        self._green: dict[tuple[str, str], list[GreenCandlesRule]] = {}
        self._down: list[ConnectorDownRule] = []
        for rule in self.rules:
            if isinstance(rule, PriceCrossRule):
                self._cross.setdefault(rule.symbol, []).append(rule)
            elif isinstance(rule, GreenCandlesRule):
                self._green.setdefault((rule.symbol, rule.interval), []).append(rule)
            else:
                self._down.append(rule)
        self._ticks = {symbol: _TickTrack() for symbol in self._cross}
        self._candles: dict[tuple[str, str], deque[Candle]] = {
            key: deque(maxlen=max(r.count for r in group) + REDELIVERY_WINDOW)
            for key, group in self._green.items()
        }
        self._connectors: OrderedDict[str, _ConnectorTrack] = OrderedDict()

    def on_event(self, event: MarketEvent) -> list[AgentRequest]:
        """The requests ``event`` triggers (often none)."""
        if isinstance(event, Tick):
            return self._on_tick(event)
        if isinstance(event, Candle):
            return self._on_candle(event)
        return self._on_status(event)

    # -------------------------------------------------------------------- price cross

    def _on_tick(self, tick: Tick) -> list[AgentRequest]:
        track = self._ticks.get(tick.symbol)
        if track is None:
            return []
        key = (tick.at, tick.price)
        if key in track.recent:  # a redelivery: the same crossings again
            previous = track.recent[key]
        elif track.last_at is not None and tick.at < track.last_at:
            return []  # older than what we have seen and not remembered: out of order
        else:
            previous = track.last_price
            track.last_price, track.last_at = tick.price, tick.at
            track.recent[key] = previous
            if len(track.recent) > REDELIVERY_WINDOW:
                track.recent.popitem(last=False)
        if previous is None:
            return []
        requests: list[AgentRequest] = []
        for rule in self._cross[tick.symbol]:
            crossed = _crossing(previous, tick.price, rule.level)
            if crossed is None or rule.direction not in (crossed, "both"):
                continue
            dedupe_key = f"{rule.name}:{tick.symbol}:{rule.level!r}:{crossed}:{iso(tick.at)}"
            payload = {
                "rule": rule.name, "symbol": tick.symbol, "level": rule.level,
                "direction": crossed, "price": tick.price, "previousPrice": previous,
                "at": iso(tick.at),
            }
            requests += _requests(rule, Kind.HOOK_TRIGGER, dedupe_key, tick.at, payload)
        return requests

    # ------------------------------------------------------------------ green candles

    def _on_candle(self, candle: Candle) -> list[AgentRequest]:
        candles = self._candles.get((candle.symbol, candle.interval))
        if candles is None:
            return []
        if not candles or candle.start > candles[-1].start:
            candles.append(candle)
            end = len(candles)
        elif candle.start == candles[-1].start:
            candles[-1] = candle  # an update of the latest candle
            end = len(candles)
        else:  # an older candle: a redelivery if we still hold it unchanged, else stale
            held = [i for i, c in enumerate(candles) if c.start == candle.start]
            if not held or candles[held[0]] != candle:
                return []
            end = held[0] + 1
        requests: list[AgentRequest] = []
        for rule in self._green[(candle.symbol, candle.interval)]:
            if end < rule.count:
                continue
            run = list(itertools.islice(candles, end - rule.count, end))
            if not all(c.green for c in run):
                continue
            last = run[-1]
            dedupe_key = f"{rule.name}:{candle.symbol}:{candle.interval}:{iso(last.start)}"
            payload = {
                "rule": rule.name, "symbol": candle.symbol, "interval": candle.interval,
                "count": rule.count, "closes": [c.close for c in run],
                "opens": [c.open for c in run], "start": iso(last.start),
            }
            requests += _requests(rule, Kind.HOOK_TRIGGER, dedupe_key, last.start, payload)
        return requests

    # ----------------------------------------------------------------- connector down

    def _on_status(self, status: ConnectorStatus) -> list[AgentRequest]:
        rules = [r for r in self._down if r.connector in ("*", status.connector)]
        if not rules:
            return []
        track = self._connectors.get(status.connector)
        if track is None:
            track = _ConnectorTrack(status="unknown", last_at=status.at)
            self._connectors[status.connector] = track
            if len(self._connectors) > MAX_CONNECTORS:
                self._connectors.popitem(last=False)
        self._connectors.move_to_end(status.connector)
        if status.status == "down" and status.at in track.downs:
            pass  # a redelivered transition to down: the same alert again
        elif status.at < track.last_at:
            return []  # out of order
        else:
            went_down = status.status == "down" and track.status != "down"
            track.status, track.last_at = status.status, status.at
            if not went_down:
                return []
            track.downs.append(status.at)
        requests: list[AgentRequest] = []
        for rule in rules:
            dedupe_key = f"{rule.name}:{status.connector}:down:{iso(status.at)}"
            payload = {
                "code": "connector_down", "connector": status.connector,
                "detail": status.detail, "rule": rule.name, "at": iso(status.at),
            }
            requests += _requests(rule, Kind.SYSTEM_ALERT, dedupe_key, status.at, payload)
        return requests


def _crossing(previous: float, price: float, level: float) -> Literal["up", "down"] | None:
    if previous < level <= price:
        return "up"
    if price < level <= previous:
        return "down"
    return None


def _requests(
    rule: PriceCrossRule | GreenCandlesRule | ConnectorDownRule,
    kind: Kind,
    dedupe_key: str,
    at: datetime,
    payload: dict[str, Any],
) -> list[AgentRequest]:
    return [
        AgentRequest(
            request_id=request_id(agent, dedupe_key),
            created_at=at,
            agent_id=agent,
            kind=kind,
            priority=rule.priority,
            dedupe_key=dedupe_key,
            source=f"hook:{rule.name}",
            payload=dict(payload),
        )
        for agent in rule.agents
    ]
